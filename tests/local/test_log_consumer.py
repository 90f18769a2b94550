"""nsqshm.local's Consumer on a log topic's channel (docs/local.md, "Log
topics"): the partitions' owners feed the channel ring for it, its FINs mark
the channel's cursors, and what it held comes back when it dies; on real
servers of one and two workers.  BulkConsumer takes them too, its finish
marking the cursors (the Producer's side: test_log_producer.py)."""

import json
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from nsqshm._core.logcursor import decode_message_id
from nsqshm.local import BulkConsumer, Consumer, LocalError
from nsqshm.ring import Ring

from .conftest import started, wait_for
from .test_clients import gnsq

WORKER_COUNTS = (1, 2)


def create(server, topic, partitions):
    status, body = server.post(f"/topic/create?topic={topic}&partition_num={partitions}")
    assert status == 200, body


def mpub(server, topic, bodies, partition=None):
    where = "" if partition is None else f"&partition={partition}"
    status, body = server.post(f"/mpub?topic={topic}{where}", b"\n".join(bodies))
    assert status == 200, body


def partitions(server, topic, channel):
    """(log end offsets, the channel's confirmed offsets) by partition."""
    doc = json.loads(server.get(f"/stats?format=json&topic={topic}")[1])
    entry = next(t for t in doc["topics"] if t["topic_name"] == topic)
    chan = next(c for c in entry["channels"] if c["channel_name"] == channel)
    return ([p["end_offset"] for p in entry["partitions"]],
            [p["confirmed_offset"] for p in chan["partitions"]])


def message_count(server, topic, channel):
    doc = json.loads(server.get(f"/stats?format=json&topic={topic}")[1])
    entry = next(t for t in doc["topics"] if t["topic_name"] == topic)
    return next(c for c in entry["channels"] if c["channel_name"] == channel)["message_count"]


def caught_up(server, topic, channel):
    ends, confirmed = partitions(server, topic, channel)
    return ends == confirmed


def fetch_all(consumer, n, timeout=15.0, finish=True):
    """Messages (body, id, attempts) until n came, each batch finished."""
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        batch = consumer.fetch(n - len(got), timeout=0.5)
        got += [(bytes(m.body), m.id, m.attempts) for m in batch]
        if finish and batch:
            assert batch.finish() == len(batch)
    return got


def nothing_more(consumer, wait=0.5):
    batch = consumer.fetch(100, timeout=wait)
    assert not batch, [bytes(b) for b in batch.bodies()]


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "ring"])
def test_consumes_every_partition_and_moves_the_cursors(nsqd_factory, direct):
    """direct: the consumer reads the partitions' logs itself (the default on a
    standalone broker); ring: through the ring the owners fill for it."""
    server = started(nsqd_factory())
    create(server, "lt", 3)
    mpub(server, "lt", [b"before%03d" % i for i in range(90)])
    # the topic's first channel starts at the log start (nsqd keeps what came before it)
    with Consumer("lt", "c", shm_prefix=server.prefix, direct=direct) as c:
        assert c.is_log and c.direct == direct
        for partition, first in enumerate(range(0, 210, 70)):
            mpub(server, "lt", [b"after%03d" % i for i in range(first, first + 70)], partition)
        got = fetch_all(c, 300)
        assert sorted(b for b, _, _ in got) == sorted(
            [b"before%03d" % i for i in range(90)] + [b"after%03d" % i for i in range(210)])
        # the IDs are log positions: every partition, every offset once
        where = {decode_message_id(i) for _, i, _ in got}
        assert len(where) == 300 and {p for p, _ in where} == {0, 1, 2}
        assert all(a == 1 for _, _, a in got)
        assert wait_for(lambda: caught_up(server, "lt", "c"), 5), partitions(server, "lt", "c")
        nothing_more(c)
        ends, confirmed = partitions(server, "lt", "c")
        assert sum(ends) == 300 and confirmed == ends
        # each message counted once in the channel's message_count, whether the
        # consumer read it from the log itself (direct_total) or a worker pushed it
        assert message_count(server, "lt", "c") == 300


def test_a_second_channel_starts_at_the_end_and_copies_nothing_of_the_first(nsqd_factory):
    server = started(nsqd_factory())
    create(server, "lt", 2)
    with Consumer("lt", "one", shm_prefix=server.prefix) as one:
        mpub(server, "lt", [b"old%d" % i for i in range(50)])
        with Consumer("lt", "two", shm_prefix=server.prefix) as two:
            nothing_more(two)  # a new channel sees only new messages
            mpub(server, "lt", [b"new%d" % i for i in range(50)])
            assert sorted(b for b, _, _ in fetch_all(two, 50)) == sorted(
                b"new%d" % i for i in range(50))
            assert len(fetch_all(one, 100)) == 100
            assert wait_for(lambda: caught_up(server, "lt", "two") and
                            caught_up(server, "lt", "one"), 5)


def test_shares_a_channel_with_a_tcp_consumer(nsqd_factory):
    server = started(nsqd_factory())
    create(server, "lt", 2)
    with Consumer("lt", "c", shm_prefix=server.prefix, max_in_flight=50) as c:
        mpub(server, "lt", [b"s%03d" % i for i in range(400)])
        local = [b for b, _, _ in fetch_all(c, 100)]
        got = gnsq("consume", f"127.0.0.1:{server.tcp_port}", "lt", "c", "300")
        tcp = [b.encode() for b in got["bodies"]]
        assert sorted(local + tcp) == sorted(b"s%03d" % i for i in range(400))
        assert wait_for(lambda: caught_up(server, "lt", "c"), 5), partitions(server, "lt", "c")


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "ring"])
def test_out_of_order_fin_requeue_and_timeout(nsqd_factory, direct):
    server = started(nsqd_factory())
    create(server, "lt", 1)
    with Consumer("lt", "c", shm_prefix=server.prefix, msg_timeout=1.0, direct=direct) as c:
        mpub(server, "lt", [b"m%02d" % i for i in range(20)])
        msgs = []
        while len(msgs) < 20:  # (the feeder may push them in more than one go)
            more = list(c.fetch(20 - len(msgs), timeout=5))
            assert more
            msgs += more
        msgs.sort(key=lambda m: bytes(m.body))
        # FIN the last ten first: the confirmed offset stays at 0 (offsets 0..9 are out)
        for m in msgs[10:]:
            m.finish()
        assert partitions(server, "lt", "c")[1] == [0]
        msgs[0].requeue(delay=0.3)     # comes back after 0.3 s
        msgs[1].requeue()              # comes back now
        for m in msgs[2:9]:
            m.finish()
        # msgs[9] is left to time out (1 s)
        again = sorted(fetch_all(c, 3, timeout=10))  # each finished as it comes
        assert [(b, a) for b, _, a in again] == [(b"m00", 2), (b"m01", 2), (b"m09", 2)]
        assert wait_for(lambda: partitions(server, "lt", "c")[1] == [20], 5)
        nothing_more(c)


def test_a_direct_consumer_copies_nothing_into_the_ring(nsqd_factory):
    """A consumer that reads the logs itself counts among the ring's direct
    subscribers: the owners leave the ring empty for it (one that does not
    gets the partitions copied into the ring while it waits)."""
    server = started(nsqd_factory())
    create(server, "lt", 2)
    Consumer("lt", "c", shm_prefix=server.prefix).close()  # (the channel)
    ring = Ring.attach(f"{server.prefix}.c.lt:c")
    try:
        for direct in (True, False):
            with Consumer("lt", "c", shm_prefix=server.prefix, direct=direct) as c:
                assert (ring.subscribers, ring.direct_subscribers) == (1, int(direct))
                nothing_more(c, 0.2)  # (a consumer through the ring asks for it: ring_wanted)
                mpub(server, "lt", [b"d%03d" % i for i in range(100)])
                if direct:
                    time.sleep(0.5)
                    assert ring.depth == 0
                else:
                    assert wait_for(lambda: ring.depth == 100, 5), ring.depth
                assert len(fetch_all(c, 100)) == 100
                assert wait_for(lambda: caught_up(server, "lt", "c"), 5)
            assert (ring.subscribers, ring.direct_subscribers) == (0, 0)
    finally:
        ring.close()


def test_a_direct_consumer_honours_a_topic_pause(nsqd_factory):
    """Reading the logs itself, a consumer takes nothing of a paused topic (the ring's
    header says so: Ring.topic_paused).  (The lanes a TCP `SUB T C p` makes:
    test_log_consumer_lanes.py.)"""
    server = started(nsqd_factory())
    create(server, "lt", 2)
    with Consumer("lt", "c", shm_prefix=server.prefix) as c:
        assert c.direct
        assert server.post("/topic/pause?topic=lt")[0] == 200
        assert wait_for(lambda: c.ring.topic_paused, 5)
        mpub(server, "lt", [b"p%d" % i for i in range(10)])
        nothing_more(c, 0.5)
        assert server.post("/topic/unpause?topic=lt")[0] == 200
        assert sorted(b for b, _, _ in fetch_all(c, 10)) == [b"p%d" % i for i in range(10)]


def test_requeues_are_noted_in_the_cursors_retry_table(nsqd_factory):
    """A local consumer's REQs and timeouts go into the channel's cursors' retry
    tables as the broker's do (with their attempts, and a delayed one's due time):
    what a graceful restart or a new leader gives back (docs/logtopics.md, Attempts)."""
    server = started(nsqd_factory())
    create(server, "lt", 1)
    with Consumer("lt", "c", shm_prefix=server.prefix) as c:
        mpub(server, "lt", [b"m0", b"m1", b"m2"])
        msgs = []
        while len(msgs) < 3:
            more = list(c.fetch(3 - len(msgs), timeout=5))
            assert more
            msgs += more
        msgs.sort(key=lambda m: bytes(m.body))
        due = time.time() + 60
        msgs[0].requeue(delay=60)
        msgs[1].requeue()
        msgs[2].finish()
        cursor = c._cursors[0]
        assert cursor.retry(0)[0] == 1 and abs(cursor.retry(0)[1] / 1000 - due) < 2
        assert cursor.retry(1) == (1, 0)
        assert cursor.retry(2) is None
        doc = json.loads(server.get("/stats?format=json&topic=lt")[1])
        chan = doc["topics"][0]["channels"][0]
        assert [p["put_back"] for p in chan["partitions"]] == [2]


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "ring"])
@pytest.mark.parametrize("sig", ["close", "kill"])
def test_what_a_consumer_held_comes_back_and_finished_stays_finished(nsqd_factory, sig, direct):
    """A consumer process finishes 30 of 50 fetched and then closes, or is
    SIGKILLed holding 20: the next consumer gets exactly the 70 unfinished,
    and the ring's subscriber count comes back down."""
    server = started(nsqd_factory())
    create(server, "lt", 2)
    mpub(server, "lt", [b"k%03d" % i for i in range(100)])
    script = textwrap.dedent(f"""
        import os, sys
        from nsqshm.local import Consumer
        c = Consumer("lt", "c", shm_prefix={server.prefix!r}, max_in_flight=50,
                     direct={direct!r})
        held = []
        while len(held) < 50:
            held += list(c.fetch(50 - len(held), timeout=5))
        for m in held[:30]:
            m.finish()
        print(" ".join(bytes(m.body).decode() for m in held[:30]), flush=True)
        if {sig!r} == "kill":
            os.kill(os.getpid(), 9)
        c.close()
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == (-signal.SIGKILL if sig == "kill" else 0), out.stderr
    finished = set(out.stdout.split())
    assert len(finished) == 30
    ring = Ring.attach(f"{server.prefix}.c.lt:c")
    try:
        # the dead consumer's count is taken out by the broker's recovery of its arena
        assert wait_for(lambda: ring.subscribers == 0, 10), ring.subscribers
        assert ring.direct_subscribers == 0
        with Consumer("lt", "c", shm_prefix=server.prefix) as c:
            assert ring.subscribers == 1
            got = fetch_all(c, 70)
            assert sorted(b.decode() for b, _, _ in got) == sorted(
                b for b in (f"k{i:03d}" for i in range(100)) if b not in finished)
            nothing_more(c)
            assert wait_for(lambda: caught_up(server, "lt", "c"), 5)
        assert ring.subscribers == 0
    finally:
        ring.close()


@pytest.mark.parametrize("how", ["graceful", "kill"])
def test_the_cursors_survive_a_restart_of_the_broker(nsqd_factory, tmp_path, how):
    data = tmp_path / "data"
    data.mkdir()
    server = started(nsqd_factory(data_path=data))
    create(server, "lt", 2)
    mpub(server, "lt", [b"r%03d" % i for i in range(60)])
    with Consumer("lt", "c", shm_prefix=server.prefix) as c:
        batch = []
        while len(batch) < 60:
            batch += list(c.fetch(60 - len(batch), timeout=5))
        finished = set()
        for m in batch:
            if int(bytes(m.body)[1:]) % 3:  # out of order: two in three
                m.finish()
                finished.add(bytes(m.body))
        if how == "kill":  # the whole group, with 20 in flight here
            import psutil

            procs = [psutil.Process(server.proc.pid), *psutil.Process(server.proc.pid).children()]
            for proc in procs:
                proc.kill()
            server.proc.wait(10)
    if how == "graceful":
        assert server.stop() == 0
    again = started(nsqd_factory(data_path=data, prefix=server.prefix))
    with Consumer("lt", "c", shm_prefix=again.prefix) as c:
        got = fetch_all(c, 20)
        assert sorted(b for b, _, _ in got) == sorted(
            b"r%03d" % i for i in range(60) if b"r%03d" % i not in finished)
        nothing_more(c)
        assert wait_for(lambda: caught_up(again, "lt", "c"), 5)


def test_a_time_to_live_finishes_what_it_drops(nsqd_factory):
    server = started(nsqd_factory())
    create(server, "lt", 1)
    with Consumer("lt", "c", shm_prefix=server.prefix) as c:
        assert server.post("/channel/policy?topic=lt&channel=c&ttl=300")[0] == 200
        mpub(server, "lt", [b"stale%d" % i for i in range(5)])
        time.sleep(0.5)  # past the channel's 300 ms: taken, dropped
        assert wait_for(lambda: c.ring.depth == 5, 5)
        nothing_more(c, 0.3)
        assert server.post("/channel/policy?topic=lt&channel=c&ttl=0")[0] == 200
        mpub(server, "lt", [b"fresh"])
        got = fetch_all(c, 6, timeout=3)
        assert [b for b, _, _ in got] == [b"fresh"]
        # the five dropped were consumed without a FIN: finished in the cursor
        assert wait_for(lambda: partitions(server, "lt", "c")[1] == [6], 5), \
            partitions(server, "lt", "c")


def take_rows(bulk, n, timeout=15.0):
    """Rows (body, attempts) a BulkConsumer takes until n came."""
    rows = []
    deadline = time.monotonic() + timeout
    while len(rows) < n and time.monotonic() < deadline:
        batch = bulk.take(n - len(rows), timeout=0.5).to_pydict()
        rows += list(zip(batch["body"], batch["attempts"], strict=True))
    return rows


def test_a_bulk_consumer_takes_a_log_channel_and_its_finish_marks_the_cursors(nsqd_factory):
    """BulkConsumer on a log topic's channel: the owners feed the ring for it, a
    finish marks every message held in its cursor (the channel caught up), a
    requeue puts the lot back with its attempts (noted in the retry tables)."""
    server = started(nsqd_factory())
    create(server, "lt", 2)
    bulk = BulkConsumer("lt", "c", shm_prefix=server.prefix)
    ring = Ring.attach(f"{server.prefix}.c.lt:c")
    try:
        with bulk:
            assert ring.subscribers == 1
            mpub(server, "lt", [b"b%03d" % i for i in range(100)])
            rows = take_rows(bulk, 100)
            assert sorted(b for b, _ in rows) == [b"b%03d" % i for i in range(100)]
            assert partitions(server, "lt", "c")[1] == [0, 0]  # held, not finished
            assert bulk.finish() == 100
            assert wait_for(lambda: caught_up(server, "lt", "c"), 5)
            mpub(server, "lt", [b"again%d" % i for i in range(10)])
            assert len(take_rows(bulk, 10)) == 10
            assert bulk.requeue() == 10
            doc = json.loads(server.get("/stats?format=json&topic=lt")[1])
            chan = doc["topics"][0]["channels"][0]
            assert sum(p["put_back"] for p in chan["partitions"]) == 10
            rows = take_rows(bulk, 10)
            assert sorted(rows) == [(b"again%d" % i, 2) for i in range(10)]
            assert bulk.finish() == 10
            assert wait_for(lambda: caught_up(server, "lt", "c"), 5)
            assert bulk.take(10, timeout=0.3).num_rows == 0
        assert ring.subscribers == 0
    finally:
        ring.close()
    # an ordered-only topic is refused, as nsqd refuses a plain SUB
    assert server.post("/topic/create?topic=ot&partition_num=1&orderedmulti=true")[0] == 200
    with pytest.raises(LocalError, match="E_SUB_ORDER_IS_MUST"):
        BulkConsumer("ot", "c", shm_prefix=server.prefix)


def test_what_a_killed_bulk_consumer_held_comes_back(nsqd_factory):
    """A BulkConsumer process SIGKILLed holding 40 (after finishing 60): the
    broker's recovery puts the 40 back and gives its subscriber place back."""
    server = started(nsqd_factory())
    create(server, "lt", 2)
    mpub(server, "lt", [b"k%03d" % i for i in range(100)])
    script = textwrap.dedent(f"""
        import os
        from nsqshm.local import BulkConsumer
        b = BulkConsumer("lt", "c", shm_prefix={server.prefix!r})
        rows = []
        while len(rows) < 60:
            rows += b.take(60 - len(rows), timeout=5).to_pydict()["body"]
        b.finish()
        print(" ".join(r.decode() for r in rows), flush=True)
        held = 0
        while held < 40:
            held += b.take(40 - held, timeout=5).num_rows
        os.kill(os.getpid(), 9)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == -signal.SIGKILL, out.stderr
    finished = set(out.stdout.split())
    assert len(finished) == 60
    ring = Ring.attach(f"{server.prefix}.c.lt:c")
    try:
        assert wait_for(lambda: ring.subscribers == 0, 10), ring.subscribers
        with BulkConsumer("lt", "c", shm_prefix=server.prefix) as bulk:
            rows = take_rows(bulk, 40)
            assert sorted(b.decode() for b, _ in rows) == sorted(
                b for b in (f"k{i:03d}" for i in range(100)) if b not in finished)
            bulk.finish()
            assert wait_for(lambda: caught_up(server, "lt", "c"), 5)
    finally:
        ring.close()


def test_an_ordered_topic_is_refused_as_nsqd_refuses_a_plain_sub(nsqd_factory):
    """An orderedmulti topic (Youzan's) takes SUB_ORDERED only; a local Consumer,
    which does not consume in order, gets nsqd's refusal and makes no channel."""
    server = started(nsqd_factory())
    status, body = server.post("/topic/create?topic=ot&partition_num=2&orderedmulti=true")
    assert status == 200, body
    with pytest.raises(LocalError, match=r"^E_SUB_ORDER_IS_MUST this topic is configured only "
                                         r"allow ordered sub$"):
        Consumer("ot", "c", shm_prefix=server.prefix)
    doc = json.loads(server.get("/stats?format=json&topic=ot")[1])
    assert [t["channels"] for t in doc["topics"] if t["topic_name"] == "ot"] == [[]]
    create(server, "plain", 2)  # a log topic without the flag is consumed as before
    with Consumer("plain", "c", shm_prefix=server.prefix) as c:
        assert c.is_log


def test_a_seek_back_delivers_again_what_a_consumer_held(nsqd_factory):
    """/channel/setoffset back to 0 while a local consumer holds messages:
    every message from 0 comes again (as for a TCP consumer, whose held
    messages the workers take out of flight), whether the consumer finishes
    what it held before the seek afterwards or not.  (Found in review: the
    workers' _drop_moved never reaches a local consumer's in-flight table, so
    its FINs of messages 0..9 after the seek marked them finished at the new
    position, and they never came again.)"""
    server = started(nsqd_factory())
    create(server, "sk", 1)
    mpub(server, "sk", [b"m%02d" % i for i in range(20)])
    with Consumer("sk", "c", shm_prefix=server.prefix, max_in_flight=10) as c:
        held = c.fetch(10, timeout=5)
        assert len(held) == 10
        assert server.post("/channel/setoffset?topic=sk&channel=c&partition=0",
                           b"msgcount:0")[0] == 200
        held.finish()
        got = fetch_all(c, 20, timeout=5)
        assert sorted(decode_message_id(i)[1] for _, i, _ in got) == list(range(20))


def test_a_seek_back_gives_a_bulk_consumer_again_what_it_held(nsqd_factory):
    """BulkConsumer: /channel/setoffset back to 0 while it holds 10 of 20;
    its finish() after the seek marks none of the 10 (dropped, as a
    Consumer's copies are), and all 20 come again from 0."""
    server = started(nsqd_factory())
    create(server, "sb", 1)
    mpub(server, "sb", [b"m%02d" % i for i in range(20)])
    with BulkConsumer("sb", "c", shm_prefix=server.prefix) as bulk:
        assert len(take_rows(bulk, 10)) == 10
        assert delivered_offsets(server, "sb", "c") == [10]  # (what it took went out)
        assert server.post("/channel/setoffset?topic=sb&channel=c&partition=0",
                           b"msgcount:0")[0] == 200
        assert delivered_offsets(server, "sb", "c") == [0]
        assert bulk.finish() == 0  # (the 10 were dropped: nothing of them is marked)
        rows = take_rows(bulk, 20)
        assert sorted(b for b, _ in rows) == [b"m%02d" % i for i in range(20)]
        assert delivered_offsets(server, "sb", "c") == [20]
        assert bulk.finish() == 20
        assert wait_for(lambda: caught_up(server, "sb", "c"), 5)

@pytest.mark.parametrize("direct", [True, False], ids=["direct", "ring"])
def test_a_retention_move_keeps_what_a_consumer_holds_above_the_log_start(nsqd_factory,
                                                                          direct):
    """Retention removes segments under a consumer holding 45 messages; the
    channel's cursor moves to the log start (a reset without a seek's hold):
    what the consumer holds at or above the start stays its own, its FINs
    count, and every message from the start is finished or delivered again.
    (Found in review: the first version counted the move as a seek, and the
    consumer dropped copies that nothing delivers again: the partition stalled.)"""
    server = started(nsqd_factory("--max-bytes-per-file=4096"))
    assert server.post("/topic/create?topic=rt&partition_num=1&retention_bytes=8192")[0] == 200
    with Consumer("rt", "c", shm_prefix=server.prefix, max_in_flight=200, direct=direct) as c:
        mpub(server, "rt", [b"%03d" % i + b"x" * 200 for i in range(45)])
        held = []
        deadline = time.monotonic() + 10
        while len(held) < 45 and time.monotonic() < deadline:
            held += [m.id for m in c.fetch(45 - len(held), timeout=0.5)]
        assert len(held) == 45
        mpub(server, "rt", [b"%03d" % i + b"x" * 200 for i in range(45, 60)])
        assert wait_for(lambda: _channel(server, "rt", "c")["retention_moves"] >= 1, 10)
        start = _topic(server, "rt")["partitions"][0]["start_offset"]
        assert 0 < start < 45
        finished = set()
        for msg_id in held:
            try:
                c.finish(msg_id)
            except LocalError:
                continue
            finished.add(decode_message_id(msg_id)[1])
        assert finished >= set(range(start, 45))
        got = {decode_message_id(i)[1] for _, i, _ in fetch_all(c, 15, timeout=10)}
        assert got == set(range(45, 60))
        assert wait_for(lambda: caught_up(server, "rt", "c"), 5)


def delivered_offsets(server, topic, channel):
    """The channel's delivered marks by partition (one past the highest offset put
    in flight: a new leader counts what is unfinished below it as delivered once)."""
    return [p["delivered_offset"] for p in _channel(server, topic, channel)["partitions"]]


def _topic(server, topic):
    doc = json.loads(server.get(f"/stats?format=json&topic={topic}")[1])
    return next(t for t in doc["topics"] if t["topic_name"] == topic)


def _channel(server, topic, channel):
    return next(c for c in _topic(server, topic)["channels"] if c["channel_name"] == channel)

def test_what_consumers_held_across_an_empty_does_not_go_out_again(nsqd_factory):
    """/channel/empty moves the cursors to the log's end without a seek's hold, so a
    local consumer keeps its copies; they are below the confirmed offset now, i.e.
    finished: a requeue, a timeout or a close puts none of them back (before, each
    went out once more).  A Consumer's put-backs are filtered in C
    (CursorSet.unconfirmed), a BulkConsumer's requeue frees them (arenas.put_back)."""
    server = started(nsqd_factory())
    create(server, "em", 2)
    mpub(server, "em", [b"e%02d" % i for i in range(20)])
    with Consumer("em", "c", shm_prefix=server.prefix, msg_timeout=0.5) as c, \
            BulkConsumer("em", "c", shm_prefix=server.prefix) as bulk:
        held = c.fetch(8, timeout=5)
        assert len(held) == 8
        assert len(take_rows(bulk, 12)) == 12
        assert server.post("/channel/empty?topic=em&channel=c")[0] == 200
        assert wait_for(lambda: caught_up(server, "em", "c"), 5)
        ids = [m.id for m in held]
        c.requeue(ids[0])  # (a REQ of a finished copy: it goes nowhere)
        assert bulk.requeue() == 12
        time.sleep(1.0)  # the other 7 time out (0.5 s) and go nowhere
        assert c.in_flight == 0
        nothing_more(c)
        mpub(server, "em", [b"new"])
        assert [bytes(m.body) for m in c.fetch(10, timeout=5)] == [b"new"]

@pytest.mark.parametrize("direct", [True, False], ids=["direct", "ring"])
def test_finishes_crossing_a_seek_skip_nothing_after_it(nsqd_factory, direct):
    """A local consumer finishes, one by one in another thread (spread over
    some 60 ms), the 1,500 messages it holds while /channel/setoffset seeks the partition back to
    0: every message of the log comes again after the seek, whichever FINs
    reached the cursor before, during or after it (a FIN that crosses the
    seek marks nothing: the cursor counts its seeks, and the consumer's
    CursorSet the count its copies were taken at), and nothing stalls.
    direct: the consumer reads the log itself (claims under the cursor's
    lock); ring: the owner feeds the ring (takes look at the seeks under the
    ring's lock)."""
    server = started(nsqd_factory())
    create(server, "sx", 1)
    total = 2000
    mpub(server, "sx", [b"x%04d" % i for i in range(total)])
    url = "/channel/setoffset?topic=sx&channel=c&partition=0"
    missing = {}
    with Consumer("sx", "c", shm_prefix=server.prefix, max_in_flight=1500,
                  direct=direct) as c:
        assert server.post(url, b"msgcount:0")[0] == 200  # (the channel from 0)
        for rnd in range(5):
            held = []
            deadline = time.monotonic() + 10
            while len(held) < 1500 and time.monotonic() < deadline:
                held += [m.id for m in c.fetch(1500 - len(held), timeout=0.5)]
            assert len(held) == 1500
            finisher = threading.Thread(target=_finish_each, args=(c, held))
            finisher.start()
            status = server.post(url, b"msgcount:0")[0]
            finisher.join(10)
            assert status == 200 and not finisher.is_alive()
            got = {decode_message_id(i)[1] for _, i, _ in fetch_all(c, total, timeout=15)}
            if set(range(total)) - got:
                missing[rnd] = sorted(set(range(total)) - got)
            assert wait_for(lambda: caught_up(server, "sx", "c"), 5)
            assert server.post(url, b"msgcount:0")[0] == 200  # (the next round: from 0)
    assert not missing, {rnd: (len(m), m[:10]) for rnd, m in missing.items()}


def _finish_each(consumer, ids):
    """FIN each, spread over some 60 ms (the seek comes in between)."""
    for k, msg_id in enumerate(ids):
        if k % 25 == 0:
            time.sleep(0.001)
        try:
            consumer.finish(msg_id)
        except LocalError:
            pass  # (taken back by the seek: not in flight)
