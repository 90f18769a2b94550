"""Per-partition consumption of log topics (logchannel.py lanes, loglane.py)
on real servers of one and two workers: `SUB T C p` gets partition p only,
SUB_ORDERED gets one message of a partition at a time, in log order (Youzan's
wire)."""

import json
import os
import signal
import threading
import time

import psutil
import pytest

from nsqshm import protocol as p
from nsqshm._core.logcursor import decode_message_id
from tests.nsqd.conftest import http_on_worker, wait_for
from tests.nsqd.logtopics.test_log_topics import (
    _answers,
    channel_stats,
    confirmed,
    create,
    detail,
    nothing_more,
    pub,
    stats,
    take,
)
from tests.nsqd.workers.test_workers import Client, _stats_entries, worker_of_pid

WORKER_COUNTS = (1, 2)


def _sub(server, line, rdy=100, identify=None):
    c = Client(server)
    if identify is not None:
        c.send(p.identify(identify))
        assert c.response()[0] == p.FRAME_TYPE_RESPONSE
    c.send(line)
    assert c.response() == (p.FRAME_TYPE_RESPONSE, b"OK")
    if rdy:
        c.send(p.rdy(rdy))
    return c


def _publish(server, topic, partition, n, tag=b"m"):
    pc = Client(server)
    for i in range(n):
        assert pub(pc, topic, b"%s%d-%d" % (tag, partition, i), partition=partition) == \
            (p.FRAME_TYPE_RESPONSE, b"OK")
    pc.close()


def _where(messages):
    return [decode_message_id(m.id) for m in messages]


# -- SUB T C p ----------------------------------------------------------------------------


def test_a_partition_moving_to_its_lane_leaves_the_others_in_flight(nsqd_factory):
    """A Youzan consumer opens one connection per partition: the second SUB
    moves its partition into a lane, taking back only that partition's
    messages; what the first connection holds of its own partition stays in
    flight, so its FINs hold and nothing comes twice (youzan/go-nsq saw
    E_FIN_FAILED and attempts 2 here)."""
    server = nsqd_factory()
    create(server, "lt", 2)
    for partition in range(2):
        _publish(server, "lt", partition, 10)
    c1 = _sub(server, b"SUB lt ch 1\n")
    held = take(c1, 10, fin=False)
    assert sorted(_where(held)) == [(1, o) for o in range(10)]
    c0 = _sub(server, b"SUB lt ch 0\n")
    assert sorted(_where(take(c0, 10))) == [(0, o) for o in range(10)]
    for m in held:
        c1.send(p.fin(m.id))
    assert _frames_for(c1, 0.5) == []  # no E_FIN_FAILED, nothing delivered again
    assert nothing_more(c0)
    assert wait_for(lambda: confirmed(server, "lt", "ch") == [10, 10])


def _frames_for(client, wait):
    """Every frame but heartbeats that comes within `wait` seconds."""
    frames = []
    client.sock.settimeout(wait)
    try:
        while True:
            kind, data = client.frame()
            if data != b"_heartbeat_":
                frames.append((kind, bytes(data[:60])))
    except (TimeoutError, OSError):
        return frames
    finally:
        client.sock.settimeout(5)



def test_sub_with_a_partition_gets_only_that_partition(nsqd_factory):
    server = nsqd_factory()
    create(server, "lt", 3)
    c0 = _sub(server, b"SUB lt ch 0\n")
    c1 = _sub(server, b"SUB lt ch 1\n")
    for partition in range(3):
        _publish(server, "lt", partition, 10)
    # (sorted: the first SUB naming a partition moves it to its lane, which pushes again
    # what the owner had read before the lane was ready -- those come after what it
    # reads next; docs/logtopics.md, "Partitions on the wire")
    assert sorted(_where(take(c0, 10))) == [(0, o) for o in range(10)]
    assert sorted(_where(take(c1, 10))) == [(1, o) for o in range(10)]
    assert nothing_more(c0) and nothing_more(c1)
    # a plain SUB takes every partition: here what nobody took, partition 2
    everything = _sub(server, b"SUB lt ch\n")
    assert sorted(_where(take(everything, 10))) == [(2, o) for o in range(10)]
    assert nothing_more(everything)
    _publish(server, "lt", 0, 3, tag=b"late")  # the plain client shares partition 0's lane
    late = []
    for c in (c0, everything):
        c.sock.settimeout(0.5)
        try:
            while True:
                late.append(c.message())
                c.send(p.fin(late[-1].id))
        except (TimeoutError, OSError):
            pass
        c.sock.settimeout(5)
    assert sorted(_where(late)) == [(0, o) for o in range(10, 13)]


def test_a_partition_sub_takes_its_partition_from_the_shared_ring(nsqd_factory):
    """Partition 0's messages already pushed into the channel's ring for a
    plain consumer (which holds RDY 0) move to the lane of the first
    consumer that names partition 0: it gets them all, once, in order."""
    server = nsqd_factory()
    create(server, "lt", 2)
    plain = _sub(server, b"SUB lt ch\n", rdy=0)
    _publish(server, "lt", 0, 20)
    _publish(server, "lt", 1, 20)
    c0 = _sub(server, b"SUB lt ch 0\n")
    assert _where(take(c0, 20)) == [(0, o) for o in range(20)]
    assert nothing_more(c0)
    plain.send(p.rdy(100))
    assert sorted(_where(take(plain, 20))) == [(1, o) for o in range(20)]
    assert nothing_more(plain) and nothing_more(c0, wait=0.1)


def test_sub_errors(nsqd_factory):
    server = nsqd_factory()
    create(server, "lt", 2)
    for line, answer in [(b"SUB lt ch 2\n", b"E_TOPIC_NOT_EXIST "),
                         (b"SUB lt ch 99\n", b"E_TOPIC_NOT_EXIST "),
                         (b"SUB_ADVANCED lt ch 5\n", b"E_TOPIC_NOT_EXIST "),
                         (b"SUB lt ch -7\n", b"E_TOPIC_NOT_EXIST ")]:
        c = Client(server)
        c.send(line)
        assert c.response() == (p.FRAME_TYPE_ERROR, answer), line
        c.close()
    # SUB_ORDERED: not with a sample rate; not on a classic topic (no order kept)
    c = Client(server)
    c.send(p.identify({"sample_rate": 50}))
    assert c.response()[0] == p.FRAME_TYPE_RESPONSE
    c.send(b"SUB_ORDERED lt ch 0\n")
    assert c.response() == (p.FRAME_TYPE_ERROR,
                            b"E_INVALID order consume is not allowed while sample rate is not 0")
    classic = Client(server)
    assert pub(classic, "classic", b"x") == (p.FRAME_TYPE_RESPONSE, b"OK")
    classic.send(b"SUB_ORDERED classic ch 0\n")
    assert classic.response() == (p.FRAME_TYPE_ERROR, b"E_TOPIC_NOT_EXIST ")


def test_channel_lane_over_http_on_each_worker(nsqd_factory):
    """nsqshm's POST /channel/lane does what `SUB T C p` and `SUB_ORDERED` do
    to the channel (for nsqshm.local's partition= and ordered= consumers),
    whichever worker answers; bad arguments get Youzan's answers."""
    server = nsqd_factory()
    create(server, "lt", 2)
    assert server.post("/channel/create?topic=lt&channel=ch")[0] == 200
    lanes = [(0, ""), (1, "&ordered=true")]
    for index in range(server.workers):
        partition, flag = lanes[index]
        conn = http_on_worker(server, index)
        conn.request("POST", f"/channel/lane?topic=lt&channel=ch&partition={partition}{flag}")
        resp = conn.getresponse()
        assert (resp.status, resp.read()) == (200, b"")
        conn.close()
    expected = {1: [("partition", 0), (None, 0)], 2: [("partition", 0), ("ordered", 0)]}
    got = [(x["lane"], x["lane_depth"]) for x in channel_stats(server, "lt", "ch")["partitions"]]
    assert got == expected[server.workers]
    # ordered=true without a partition: every partition
    assert server.post("/channel/lane?topic=lt&channel=ch&ordered=true")[0] == 200
    assert [x["lane"] for x in channel_stats(server, "lt", "ch")["partitions"]] == \
        ["ordered", "ordered"]
    _publish(server, "lt", 0, 3)
    c = _sub(server, b"SUB lt ch\n")  # a plain SUB takes the lanes: one at a time of each
    assert _where(take(c, 1, fin=False)) == [(0, 0)]
    assert nothing_more(c)
    assert server.post("/topic/create?topic=ot&partition_num=1&orderedmulti=true")[0] == 200
    assert server.post("/channel/create?topic=ot&channel=ch")[0] == 200
    for query, answer in [
            ("topic=lt&channel=ch", (400, b'{"message":"MISSING_ARG_PARTITION"}')),
            ("topic=lt&channel=ch&partition=0&ordered=yes",
             (400, b'{"message":"INVALID_ARG_ORDERED"}')),
            ("topic=lt&channel=ch&partition=2", (404, b'{"message":"Topic partition not exist"}')),
            ("topic=lt&channel=nope&partition=0", (404, b'{"message":"CHANNEL_NOT_FOUND"}')),
            ("topic=nope&channel=ch&partition=0", (404, b'{"message":"E_TOPIC_NOT_EXIST"}')),
            ("topic=lt&partition=0", (400, b'{"message":"MISSING_ARG_CHANNEL"}')),
            ("topic=ot&channel=ch&partition=0", (400, b'{"message":"E_SUB_ORDER_IS_MUST"}'))]:
        assert server.post(f"/channel/lane?{query}") == answer, query
    assert server.post("/topic/create?topic=classic")[0] == 200
    assert server.post("/channel/create?topic=classic&channel=ch")[0] == 200
    assert server.post("/channel/lane?topic=classic&channel=ch&partition=0") == \
        (404, b'{"message":"E_TOPIC_NOT_EXIST"}')


# -- SUB_ORDERED ---------------------------------------------------------------------------


def _one_of(clients, wait=5.0):
    """The next message any of the clients gets: (client, message)."""
    deadline = time.monotonic() + wait
    try:
        while time.monotonic() < deadline:
            for c in clients:
                c.sock.settimeout(0.05)
                try:
                    return c, c.message()
                except TimeoutError:
                    continue
    finally:
        for c in clients:
            c.sock.settimeout(5)
    raise AssertionError("no message")


def test_sub_ordered_one_in_flight_in_order(nsqd_factory):
    """Two ordered consumers of partition 0: one message in flight at a
    time, in log order; REQ redelivers the same message first; a REQ with a
    delay is ignored (Youzan's) and the message comes back at its timeout;
    a consumer closed holding one: the other gets that one next."""
    server = nsqd_factory()
    create(server, "lt", 2)
    _publish(server, "lt", 0, 8)
    _publish(server, "lt", 1, 4)
    # (a timeout long enough for each step's checks on a loaded machine: a
    # message timing out meanwhile is delivered again, rightly)
    a = _sub(server, b"SUB_ORDERED lt ch 0\n", identify={"msg_timeout": 2000})
    b = _sub(server, b"SUB_ORDERED lt ch 0\n", identify={"msg_timeout": 2000})
    seen = []

    def next_one():
        c, m = _one_of([a, b])
        for other in (a, b):  # nothing else of the partition goes out meanwhile
            assert nothing_more(other, wait=0.15)
        seen.append((decode_message_id(m.id), m.attempts))
        return c, m

    c, m = next_one()
    c.send(p.fin(m.id))
    c, m = next_one()
    c.send(p.req(m.id, 0))               # back first
    c, m = next_one()
    c.send(p.req(m.id, 60_000))          # ignored: stays in flight, times out (2 s)
    c, m = next_one()
    c.send(p.fin(m.id))
    c, m = next_one()
    c.close()                            # closed holding offset 2
    rest = [x for x in (a, b) if x is not c]
    for _ in range(6):
        c2, m = _one_of(rest)
        seen.append((decode_message_id(m.id), m.attempts))
        c2.send(p.fin(m.id))
    assert [where for where, _ in seen] == [(0, 0), (0, 1), (0, 1), (0, 1), (0, 2),
                                            (0, 2), (0, 3), (0, 4), (0, 5), (0, 6), (0, 7)]
    assert [attempts for _, attempts in seen[:5]] == [1, 1, 2, 3, 1]
    assert nothing_more(rest[0])
    lanes = channel_stats(server, "lt", "ch")["partitions"]
    assert [(x["lane"], x["lane_depth"], x["confirmed_offset"]) for x in lanes] == \
        [("ordered", 0, 8), (None, 0, 0)]
    # partition 1 was not touched: a plain SUB still gets it
    plain = _sub(server, b"SUB lt ch 1\n")
    assert _where(take(plain, 4)) == [(1, o) for o in range(4)]


def test_an_ordered_message_is_sent_at_once_not_held_in_the_output_buffer(nsqd_factory):
    """The next message of an ordered partition waits for this one's FIN, so
    it is sent at once, as Youzan's messagePump flushes every message of an
    ordered channel: held for the output buffer's tick (nsqd's default 250
    ms) an ordered consumer got 4 messages a second.  Here the tick is 10 s;
    each of 5 messages must come within 2 s (before: the drain of the log
    topic loss audit, test_log_audit.py, stalled at 8 messages a second)."""
    server = nsqd_factory()
    create(server, "lt", 1)
    c = _sub(server, b"SUB_ORDERED lt ch 0\n", identify={"output_buffer_timeout": 10_000})
    _publish(server, "lt", 0, 5)
    c.sock.settimeout(2)
    got = []
    for _ in range(5):
        m = c.message()
        got.append(decode_message_id(m.id))
        c.send(p.fin(m.id))
    assert got == [(0, o) for o in range(5)]


def test_sub_ordered_without_a_partition_orders_each_partition(nsqd_factory):
    server = nsqd_factory()
    create(server, "lt", 2)
    c = _sub(server, b"SUB_ORDERED lt ch\n")
    _publish(server, "lt", 0, 5)
    _publish(server, "lt", 1, 5)
    got = []
    for _ in range(10):
        held = [c.message()]
        try:  # at most one more: the other partition's
            c.sock.settimeout(0.3)
            held.append(c.message())
        except TimeoutError:
            pass
        c.sock.settimeout(5)
        assert len({decode_message_id(m.id)[0] for m in held}) == len(held)
        for m in held:
            got.append(decode_message_id(m.id))
            c.send(p.fin(m.id))
        if len(got) >= 10:
            break
    assert [o for part, o in got if part == 0] == list(range(5))
    assert [o for part, o in got if part == 1] == list(range(5))


@pytest.mark.workers(2)
def test_a_sub_ordered_consumer_is_fed_by_its_own_worker(nsqd_factory):
    """After an ordered consumer's FIN, the worker it is connected to claims
    the partition's next message from the log and sends it
    (LogChannel.next_ordered), whichever worker owns the partition: with the
    other worker stopped (SIGSTOP), both partitions go on, each in log
    order.  (Before, the owner's feeder pushed each next message into the
    lane: a wake of the other worker per message, and here a stall.)"""
    server = nsqd_factory()
    create(server, "lt", 2)
    _publish(server, "lt", 0, 20)
    _publish(server, "lt", 1, 20)
    for _ in range(100):
        c = _sub(server, b"SUB_ORDERED lt ch\n", rdy=0)
        mine = _stats_entries(server, c.sock.getsockname()[1])
        if mine and mine[0]["nsqshm_worker"] == 0:
            break
        c.close()
    else:
        raise AssertionError("no connection landed on worker 0")
    c.send(p.rdy(10))
    held = [c.message(), c.message()]  # each partition's first, before the stop
    assert sorted(_where(held)) == [(0, 0), (1, 0)]
    other = worker_of_pid(server, 1)
    os.kill(other, signal.SIGSTOP)
    try:
        got = list(_where(held))
        for m in held:
            c.send(p.fin(m.id))
        c.sock.settimeout(5)
        while len(got) < 40:
            m = c.message()
            got.append(decode_message_id(m.id))
            c.send(p.fin(m.id))
    finally:
        os.kill(other, signal.SIGCONT)
    assert [o for part, o in got if part == 0] == list(range(20))
    assert [o for part, o in got if part == 1] == list(range(20))
    assert nothing_more(c)


def _fin_each(c, n, wait=3.0):
    """(partition, offset) of up to n messages, each FIN'd as it comes."""
    got = []
    c.sock.settimeout(wait)
    try:
        for _ in range(n):
            m = c.message()
            got.append(decode_message_id(m.id))
            c.send(p.fin(m.id))
    except TimeoutError:
        pass
    c.sock.settimeout(5)
    return got


def test_an_ordered_consumer_at_rdy_1_gets_every_partition(nsqd_factory):
    """At RDY 1, each FIN's next message goes to the finisher from its
    reader, and the other partition's head waits in its lane: the
    dispatcher, asleep with no client ready, must still get its round after
    the FIN that leaves the consumer ready (found in review: without it the
    second partition never came)."""
    server = nsqd_factory()
    create(server, "lt", 2)
    c = _sub(server, b"SUB_ORDERED lt ch\n", rdy=0)
    _publish(server, "lt", 0, 5)
    _publish(server, "lt", 1, 5)
    time.sleep(0.3)  # (the feeders push each head into its lane)
    c.send(p.rdy(1))
    assert sorted(_fin_each(c, 10)) == [(part, o) for part in (0, 1) for o in range(5)]


def test_a_head_waiting_in_its_lane_goes_before_the_next_of_a_busy_partition(nsqd_factory):
    """At RDY 1 on every partition, partition 1's head waits in its lane
    while partition 0 has 60 more: a FIN of partition 0 must give the
    waiting head first, not claim partition 0's next from the log (found in
    review: it came 61st of 61)."""
    server = nsqd_factory()
    create(server, "lt", 2)
    c = _sub(server, b"SUB_ORDERED lt ch\n", rdy=0)
    _publish(server, "lt", 1, 1)
    _publish(server, "lt", 0, 60)
    time.sleep(0.3)  # (the feeders push each head into its lane)
    c.send(p.rdy(1))
    got = _fin_each(c, 61)
    assert sorted(got) == [(0, o) for o in range(60)] + [(1, 0)]
    assert got.index((1, 0)) <= 2, got.index((1, 0))


@pytest.mark.workers(1)
def test_a_waiting_head_is_not_starved_by_a_partition_that_keeps_coming(nsqd_factory):
    """As above, with partition 0 published to all along (found in review: in
    4 s and 751 deliveries partition 1's message never came)."""
    server = nsqd_factory()
    create(server, "lt", 2)
    c = _sub(server, b"SUB_ORDERED lt ch\n", rdy=0)
    _publish(server, "lt", 1, 1)
    _publish(server, "lt", 0, 5)
    time.sleep(0.3)
    stop = threading.Event()

    def keep_publishing():
        pc = Client(server)
        i = 0
        while not stop.is_set():
            pub(pc, "lt", b"k%d" % i, partition=0)
            i += 1
            time.sleep(0.002)
        pc.close()

    publisher = threading.Thread(target=keep_publishing)
    publisher.start()
    try:
        c.send(p.rdy(1))
        got = []
        c.sock.settimeout(5)
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline and (1, 0) not in got:
            m = c.message()
            got.append(decode_message_id(m.id))
            time.sleep(0.005)
            c.send(p.fin(m.id))
    finally:
        stop.set()
        publisher.join(10)
    assert (1, 0) in got and got.index((1, 0)) <= 2, got[:10]


@pytest.mark.workers(2)
def test_an_ordered_consumer_at_rdy_1_gets_what_comes_after_the_log_end(nsqd_factory):
    """A consumer at RDY 1 that read the partition to its end: the next
    message published is pushed into the lane by the owner's feeder, on
    either worker, and must wake the consumer's dispatcher (found in
    review)."""
    server = nsqd_factory()
    create(server, "lt", 2)
    for worker in (0, 1):
        channel = b"ch%d" % worker
        for _ in range(100):
            c = _sub(server, b"SUB_ORDERED lt %s 0\n" % channel, rdy=0)
            mine = _stats_entries(server, c.sock.getsockname()[1])
            if mine and mine[0]["nsqshm_worker"] == worker:
                break
            c.close()
        else:
            raise AssertionError(f"no connection landed on worker {worker}")
        c.send(p.rdy(1))
        start = sum(x["end_offset"] for x in stats(server, "lt")["partitions"][:1])
        _publish(server, "lt", 0, 3)
        assert _fin_each(c, 3) == [(0, start + o) for o in range(3)]
        time.sleep(0.3)
        _publish(server, "lt", 0, 2, tag=b"late")
        assert _fin_each(c, 2) == [(0, start + 3), (0, start + 4)]
        c.close()


@pytest.mark.parametrize("rdy", [1, 10])
def test_an_ordered_consumer_of_an_ext_topic_goes_on(nsqd_factory, rdy):
    """An ext topic's consumers take the ring's path (their filters and
    tags), never the finisher's: every FIN falls back to the owner's feeder
    and the dispatcher's round (found in review: it stalled after the first
    message)."""
    server = nsqd_factory()
    create(server, "lt", 1, "&ext=true")
    c = _sub(server, b"SUB_ORDERED lt ch 0\n", rdy=0)
    _publish(server, "lt", 0, 3)
    time.sleep(0.3)
    c.send(p.rdy(rdy))
    assert _fin_each(c, 3) == [(0, o) for o in range(3)]


def test_an_ordered_head_put_back_keeps_its_attempts_across_a_graceful_restart(
        nsqd_factory, tmp_path):
    """An ordered lane's head that was put back (REQ) is read from the log
    again after a graceful stop (which drops the lane); the cursor's retry
    table, kept in its checkpoint, gives it its attempts back
    (Cursor._claimed_attempts), as for a plain channel.  (After
    SUB_ORDERED a body comes after its offset and raw size: 12 B.)"""
    data = tmp_path / "data"
    data.mkdir()
    server = nsqd_factory(data_path=data)
    create(server, "lt", 1)
    _publish(server, "lt", 0, 3)
    c = _sub(server, b"SUB_ORDERED lt ch 0\n", rdy=1)
    m = c.message()
    assert (m.body[12:], m.attempts) == (b"m0-0", 1)
    c.send(p.req(m.id, 0))
    m = c.message()
    assert (m.body[12:], m.attempts) == (b"m0-0", 2)
    c.send(p.rdy(0))  # what is put back now stays in the lane
    c.send(p.req(m.id, 0))
    assert wait_for(lambda: channel_stats(server, "lt", "ch")["partitions"][0]["put_back"] == 1)
    c.close()
    assert server.stop() == 0
    restarted = nsqd_factory(data_path=data, prefix=server.prefix)
    c = _sub(restarted, b"SUB_ORDERED lt ch 0\n", rdy=1)
    got = []
    for _ in range(3):
        m = c.message()
        got.append((m.body[12:], m.attempts))
        c.send(p.fin(m.id))
    assert got == [(b"m0-0", 3), (b"m0-1", 1), (b"m0-2", 1)]
    assert nothing_more(c)


@pytest.mark.workers(2)
def test_sub_ordered_resumes_in_order_after_the_owner_is_killed(nsqd_factory):
    """SIGKILL of partition 0's owner with a message in flight to an ordered
    consumer: the lane (shared memory) and the cursor survive; the consumer
    (reconnected if its connection died) gets that message again, then the
    rest, in log order, each once."""
    server = nsqd_factory()
    create(server, "lt", 2)
    _publish(server, "lt", 0, 10)
    c = _sub(server, b"SUB_ORDERED lt ch 0\n", identify={"msg_timeout": 2000})
    m = c.message()
    assert decode_message_id(m.id) == (0, 0)
    c.send(p.fin(m.id))
    m = c.message()
    assert decode_message_id(m.id) == (0, 1)
    owner = stats(server, "lt")["partitions"][0]["owner"]
    conn = http_on_worker(server, owner)
    conn.request("GET", "/debug/nsqshm/worker")
    victim = json.loads(conn.getresponse().read())["pid"]
    conn.close()
    before = {proc.pid for proc in psutil.Process(server.proc.pid).children()}
    os.kill(victim, signal.SIGKILL)
    assert wait_for(lambda: len({proc.pid for proc in psutil.Process(server.proc.pid).children()}
                                - before) == 1, timeout=15)
    assert wait_for(lambda: _answers(server), timeout=15)
    try:
        m = c.message()  # the connection survived: m1 times out (2 s) and comes back
    except (OSError, ConnectionError):
        c = _sub(server, b"SUB_ORDERED lt ch 0\n", identify={"msg_timeout": 2000})
        m = c.message()
    got = [(decode_message_id(m.id), m.attempts)]
    c.send(p.fin(m.id))
    for _ in range(8):
        m = c.message()
        got.append((decode_message_id(m.id), m.attempts))
        c.send(p.fin(m.id))
    assert [where for where, _ in got] == [(0, o) for o in range(1, 10)], (got, server.lines[-30:])
    assert nothing_more(c)
    assert wait_for(lambda: confirmed(server, "lt", "ch")[0] == 10)


def test_a_paused_topic_and_a_sample_rate(nsqd_factory):
    """A paused log topic passes nothing on (as nsqd's topic pause), also not
    straight from the log, until unpaused.  A client with a sample rate skips
    messages (nsqd's messagePump); the log channel marks them finished, so the
    cursor reaches the end once the delivered ones are finished (it stayed at
    the first one skipped)."""
    server = nsqd_factory()
    create(server, "lt", 2)
    c = _sub(server, b"SUB lt ch\n")
    assert server.post("/topic/pause?topic=lt")[0] == 200
    _publish(server, "lt", 0, 3)
    _publish(server, "lt", 1, 3)
    assert nothing_more(c)
    assert server.post("/topic/unpause?topic=lt")[0] == 200
    assert sorted(_where(take(c, 6))) == [(0, o) for o in range(3)] + [(1, o) for o in range(3)]
    assert nothing_more(c)

    create(server, "ls", 1)
    c = _sub(server, b"SUB ls ch\n", identify={"sample_rate": 10})
    _publish(server, "ls", 0, 50)
    c.sock.settimeout(1)
    got = []
    try:
        while True:
            got.append(c.message())
            c.send(p.fin(got[-1].id))
    except TimeoutError:
        pass
    assert len(got) < 50
    assert wait_for(lambda: confirmed(server, "ls", "ch") == [50])


@pytest.mark.soak
def test_lanes_go_at_a_graceful_stop_and_consumption_goes_on(nsqd_factory, tmp_path):
    """A graceful stop leaves no lane in shared memory; after the restart
    the partition consumers go on from the cursors, in order for the ordered
    one (what was in flight at the stop is delivered again)."""
    data = tmp_path / "data"
    data.mkdir()
    server = nsqd_factory(data_path=data)
    create(server, "lt", 2)
    c = _sub(server, b"SUB_ORDERED lt ch 0\n")
    c1 = _sub(server, b"SUB lt ch 1\n")
    _publish(server, "lt", 0, 5)
    _publish(server, "lt", 1, 5)
    m = c.message()
    c.send(p.fin(m.id))
    c.message()  # m0-1: in flight at the stop
    take(c1, 2)
    c.close()
    c1.close()
    assert server.stop() == 0
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(server.prefix + ".")
                and not n.endswith(".ids")]
    again = nsqd_factory(data_path=data, prefix=server.prefix)
    c = _sub(again, b"SUB_ORDERED lt ch 0\n")
    got = []
    for _ in range(4):
        m = c.message()
        got.append(detail(m)[2])
        c.send(p.fin(m.id))
    assert got == [b"m0-%d" % i for i in range(1, 5)]
    c1 = _sub(again, b"SUB lt ch 1\n")
    assert sorted(m.body for m in take(c1, 3)) == [b"m1-%d" % i for i in range(2, 5)]
    assert nothing_more(c1)


# -- ordered topics (Youzan's orderedmulti) --------------------------------------------------


def test_an_ordered_topic_takes_sub_ordered_and_pubs_to_a_partition_only(nsqd_factory, tmp_path):
    """POST /topic/create?...&orderedmulti=true: a plain SUB or SUB_ADVANCED is
    refused with Youzan's E_SUB_ORDER_IS_MUST (fatal), a PUB or MPUB without a
    partition with E_BAD_PARTITION (HTTP: 400 INVALID_PARTITION): the publisher
    keeps its order by naming the partition.  SUB_ORDERED consumes it, in order.
    The flag is kept across a restart, and shows in /stats."""
    data = tmp_path / "data"
    data.mkdir()
    server = nsqd_factory(data_path=data)
    create(server, "ot", 2, "&orderedmulti=true")
    create(server, "plain", 2)
    for line, answer in [
            (b"SUB ot ch\n", b"E_SUB_ORDER_IS_MUST this topic is configured only allow ordered sub"),
            (b"SUB ot ch 0\n", b"E_SUB_ORDER_IS_MUST this topic is configured only allow ordered sub"),
            (b"SUB_ADVANCED ot ch 0 special:-1\n",
             b"E_SUB_ORDER_IS_MUST this topic is configured only allow ordered sub"),
            (p.pub("ot", b"x"),
             b"E_BAD_PARTITION topic partition is not valid for multi partition: -1"),
            (p.mpub("ot", [b"x", b"y"]),
             b"E_BAD_PARTITION topic partition is not valid for multi partition: -1")]:
        c = Client(server)
        c.send(line)
        assert c.response() == (p.FRAME_TYPE_ERROR, answer), line
        c.sock.settimeout(5)
        assert c.sock.recv(1) == b"", line  # fatal: closed
        c.close()
    status, body = server.post("/pub?topic=ot", b"x")
    assert status == 400 and b"INVALID_PARTITION" in body, (status, body)
    assert server.post("/pub?topic=plain", b"x")[0] == 200  # (not ordered: any partition)
    _publish(server, "ot", 1, 5)
    assert server.post("/pub?topic=ot&partition=1", b"m1-5")[0] == 200
    c = _sub(server, b"SUB_ORDERED ot ch 1\n", identify={"msg_timeout": 5000})
    got = []
    for _ in range(6):
        m = c.message()
        got.append(m.body[12:])  # (a SUB_ORDERED frame: offset and raw size first)
        c.send(p.fin(m.id))
    assert got == [b"m1-%d" % i for i in range(6)]
    c.close()
    topics = {t["topic_name"]: t for t in stats(server)["topics"]}
    assert topics["ot"]["ordered"] is True and topics["plain"]["ordered"] is False
    assert server.stop() == 0
    again = nsqd_factory(data_path=data, prefix=server.prefix)
    c = Client(again)
    c.send(p.sub("ot", "ch"))
    assert c.response() == (p.FRAME_TYPE_ERROR,
                            b"E_SUB_ORDER_IS_MUST this topic is configured only allow ordered sub")
    c.close()
    assert {t["topic_name"]: t["ordered"] for t in stats(again)["topics"]}["ot"] is True


def test_a_refused_sub_leaves_the_channel_as_it_was(nsqd_factory):
    """Youzan's internalSUB checks the client against the topic (ext,
    E_SUB_EXTEND_FORBIDDON) before it gets the channel or makes it ordered:
    a SUB_ORDERED refused so changes nothing.  (Found in review: the
    channel's partitions were moved to ordered lanes first, so its plain
    consumers got one message of a partition at a time from then on, and a
    refused `SUB T C#ephemeral p` left an ephemeral channel no client ever
    leaves.)"""
    server = nsqd_factory()
    create(server, "rf", 2)
    plain = _sub(server, p.sub("rf", "ch"), rdy=0)
    for line in (b"SUB_ORDERED rf ch\n", b"SUB_ORDERED rf ch 1\n", b"SUB rf ch 0\n",
                 b"SUB rf eph#ephemeral 0\n"):
        c = Client(server)
        c.send(p.identify({"extend_support": True}))
        assert c.response()[0] == p.FRAME_TYPE_RESPONSE
        c.send(line)
        assert c.response() == (p.FRAME_TYPE_ERROR, b"E_SUB_EXTEND_FORBIDDON this topic is "
                                                    b"not extended and should not identify "
                                                    b"as extend support."), line
        c.close()
    assert [pp["lane"] for pp in channel_stats(server, "rf", "ch")["partitions"]] == \
        [None, None]
    assert [c["channel_name"] for c in stats(server, "rf")["channels"]] == ["ch"]
    pc = Client(server)
    for i in range(4):
        assert pub(pc, "rf", b"m%d" % i, partition=0) == (p.FRAME_TYPE_RESPONSE, b"OK")
    plain.send(p.rdy(10))
    got = [plain.message() for _ in range(4)]  # all at once: not one at a time
    assert sorted(decode_message_id(m.id) for m in got) == [(0, o) for o in range(4)]
