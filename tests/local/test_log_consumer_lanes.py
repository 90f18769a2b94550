"""nsqshm.local's Consumer on one partition (partition=, as `SUB T C p`) and in
order (ordered=, as `SUB_ORDERED`), through the channel's lanes
(nsqd/logtopics/loglane.py, docs/local.md); and a plain consumer taking the lanes
others made, as a plain SUB does; on real servers of one and two workers."""

import contextlib
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from nsqshm._core.logcursor import decode_message_id
from nsqshm.local import BulkConsumer, Consumer, LocalError
from nsqshm.protocol import FRAME_TYPE_MESSAGE, MAGIC_V2, FrameDecoder, fin, rdy
from nsqshm.ring import Ring

from .conftest import shm_entries, started, wait_for
from .test_log_consumer import caught_up, create, fetch_all, mpub, nothing_more, partitions

WORKER_COUNTS = (1, 2)

def fetch_some(consumer, n, timeout=10.0):
    """Messages (unfinished) until n came."""
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        got += list(consumer.fetch(n - len(got), timeout=0.5))
    return got


@contextlib.contextmanager
def tcp_lane_and_ten(server):
    """A TCP consumer's `SUB lt c 0` (RDY 0) moves partition 0 into a lane;
    then 5 messages to each partition: yields their bodies, sorted."""
    with socket.create_connection(("127.0.0.1", server.tcp_port), timeout=5) as tcp:
        tcp.sendall(MAGIC_V2 + b"SUB lt c 0\n")
        assert tcp.recv(64).endswith(b"OK")
        mpub(server, "lt", [b"zero%d" % i for i in range(5)], partition=0)
        mpub(server, "lt", [b"one%d" % i for i in range(5)], partition=1)
        yield sorted([b"zero%d" % i for i in range(5)] + [b"one%d" % i for i in range(5)])


def take_bodies(bulk, n, timeout=10.0):
    bodies = []
    deadline = time.monotonic() + timeout
    while len(bodies) < n and time.monotonic() < deadline:
        batch = bulk.take(100, timeout=0.5)
        bodies += [bytes(b) for b in batch.column("body").to_pylist()]
    return bodies


def where(msg):
    return decode_message_id(msg.id)


def test_a_partition_consumer_takes_that_partition_alone(nsqd_factory):
    server = started(nsqd_factory())
    create(server, "lt", 3)
    Consumer("lt", "c", shm_prefix=server.prefix).close()  # (the channel)
    with Consumer("lt", "c", shm_prefix=server.prefix, partition=1, msg_timeout=3.0) as c:
        assert c.partition == 1 and not c.ordered
        for p in range(3):
            mpub(server, "lt", [b"p%d-%02d" % (p, i) for i in range(20)], partition=p)
        msgs = fetch_some(c, 20)
        assert sorted(bytes(m.body) for m in msgs) == [b"p1-%02d" % i for i in range(20)]
        assert {where(m)[0] for m in msgs} == {1}
        nothing_more(c, 0.3)  # nothing of partitions 0 and 2
        msgs.sort(key=lambda m: bytes(m.body))
        msgs[0].requeue()           # back into the partition's lane: to this consumer
        msgs[1].requeue(delay=0.3)  # the same, once due
        for m in msgs[3:]:
            m.finish()
        # msgs[2] times out (3 s) and comes back here too
        again = sorted(fetch_all(c, 3, timeout=10))
        assert [(b, a) for b, _, a in again] == [(b"p1-00", 2), (b"p1-01", 2), (b"p1-02", 2)]
        nothing_more(c, 0.3)
        assert wait_for(lambda: partitions(server, "lt", "c")[1][1] == 20, 5)
    # the other partitions wait for the channel's plain consumers
    assert partitions(server, "lt", "c")[1] == [0, 20, 0]
    with Consumer("lt", "c", shm_prefix=server.prefix) as plain:
        got = fetch_all(plain, 40)
        assert sorted(b for b, _, _ in got) == sorted(
            b"p%d-%02d" % (p, i) for p in (0, 2) for i in range(20))
        assert wait_for(lambda: caught_up(server, "lt", "c"), 5)


def test_a_partition_consumer_shares_its_partition_with_a_plain_one(nsqd_factory):
    """A plain consumer takes every partition, the lanes too (as a plain SUB
    does); the partition consumer only its own; each message once."""
    server = started(nsqd_factory())
    create(server, "lt", 2)
    with Consumer("lt", "c", shm_prefix=server.prefix, partition=0, max_in_flight=40) as part, \
            Consumer("lt", "c", shm_prefix=server.prefix, max_in_flight=1000) as plain:
        for p in range(2):
            mpub(server, "lt", [b"s%d-%03d" % (p, i) for i in range(100)], partition=p)
        got_part = fetch_all(part, 40)
        got_plain = fetch_all(plain, 160)
        assert {decode_message_id(i)[0] for _, i, _ in got_part} == {0}
        assert sorted(b for b, _, _ in got_part + got_plain) == sorted(
            b"s%d-%03d" % (p, i) for p in range(2) for i in range(100))
        assert wait_for(lambda: caught_up(server, "lt", "c"), 5), partitions(server, "lt", "c")


def test_a_plain_consumer_takes_the_lane_a_tcp_consumer_made(nsqd_factory):
    """`SUB T C 0` moves partition 0 into a lane: a local plain consumer takes
    from it as a plain SUB does (it used to be left to the TCP consumer)."""
    server = started(nsqd_factory())
    create(server, "lt", 2)
    with Consumer("lt", "c", shm_prefix=server.prefix) as c, tcp_lane_and_ten(server) as ten:
        got = fetch_all(c, 10)
        assert sorted(b for b, _, _ in got) == ten
        assert wait_for(lambda: caught_up(server, "lt", "c"), 5)


def test_a_bulk_consumer_takes_the_lanes_and_puts_back_into_them(nsqd_factory):
    """A BulkConsumer takes every partition, the lanes too, as a plain SUB
    does; its requeue puts a lane's messages back into that lane."""
    server = started(nsqd_factory())
    create(server, "lt", 2)
    with BulkConsumer("lt", "c", shm_prefix=server.prefix) as bulk, \
            tcp_lane_and_ten(server) as ten:
        lane = Ring.attach(f"{server.prefix}.c.lt:c:p0")
        try:
            assert sorted(take_bodies(bulk, 10)) == ten
            assert lane.depth == 0
            assert bulk.requeue() == 10
            assert lane.depth == 5  # partition 0's, back into its lane
        finally:
            lane.close()
        assert sorted(take_bodies(bulk, 10)) == ten
        assert bulk.finish() == 10
        assert wait_for(lambda: caught_up(server, "lt", "c"), 5)


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "lane"])
def test_an_ordered_consumer_gets_each_partition_in_log_order(nsqd_factory, direct):
    """One message of each partition at a time, the next only after its FIN;
    a REQ (with a delay too) and a timeout deliver the same message again
    before anything later; every message once FIN'd, in log order."""
    server = started(nsqd_factory())
    create(server, "lt", 2)
    Consumer("lt", "c", shm_prefix=server.prefix).close()  # (the channel)
    with Consumer("lt", "c", shm_prefix=server.prefix, ordered=True, max_in_flight=10,
                  msg_timeout=3.0, direct=direct) as c:
        # direct: each head claimed from the log here; lane: pushed by the owner's feeder
        assert c.ordered and c.direct == direct
        for p in range(2):
            mpub(server, "lt", [b"o%d-%02d" % (p, i) for i in range(30)], partition=p)
        first = fetch_some(c, 2)
        assert sorted(bytes(m.body) for m in first) == [b"o0-00", b"o1-00"]
        nothing_more(c, 0.3)  # nothing more until a FIN
        by_part = {where(m)[0]: m for m in first}
        by_part[0].requeue()            # the same message comes back first
        by_part[1].requeue(delay=0.3)   # the same, once due
        again = fetch_some(c, 2)
        assert sorted((bytes(m.body), m.attempts) for m in again) == [
            (b"o0-00", 2), (b"o1-00", 2)]
        held = {where(m)[0]: m for m in again}
        # partition 1's head times out (3 s) and comes back; partition 0 goes on
        held[0].finish()
        order = {0: [b"o0-00"], 1: []}
        timed_out = []
        deadline = time.monotonic() + 10
        while not timed_out and time.monotonic() < deadline:
            for m in c.fetch(10, timeout=0.5):
                if where(m)[0] == 1:
                    timed_out.append(m)
                else:
                    order[0].append(bytes(m.body))
                    m.finish()
        assert [(bytes(m.body), m.attempts) for m in timed_out] == [(b"o1-00", 3)], timed_out
        assert len(order[0]) > 1  # (partition 0 went on while partition 1's head was out)
        timed_out[0].finish()
        order[1].append(b"o1-00")
        deadline = time.monotonic() + 20
        while sum(map(len, order.values())) < 60 and time.monotonic() < deadline:
            batch = c.fetch(10, timeout=0.5)
            parts = [where(m)[0] for m in batch]
            assert len(parts) == len(set(parts)), parts  # one of a partition at a time
            for m in batch:
                order[where(m)[0]].append(bytes(m.body))
            batch.finish()
        for p in range(2):
            assert order[p] == [b"o%d-%02d" % (p, i) for i in range(30)]
        nothing_more(c, 0.3)
        assert wait_for(lambda: caught_up(server, "lt", "c"), 5)


def ordered_run(consumer, n, timeout=20.0):
    """Bodies of n messages of a 1-partition topic taken by an ordered
    consumer, each finished; never two out at once."""
    seen = []
    deadline = time.monotonic() + timeout
    while len(seen) < n and time.monotonic() < deadline:
        batch = consumer.fetch(10, timeout=0.5)
        assert len(batch) <= 1, [bytes(b) for b in batch.bodies()]
        seen += [bytes(m.body) for m in batch]
        batch.finish()
    return seen


def test_copies_taken_before_a_move_into_an_ordered_lane_are_dropped(nsqd_factory):
    """A plain consumer holds messages of a partition when an ordered consumer
    moves it into an ordered lane: its copies are dropped when it next looks
    (as the broker's workers drop theirs), so its FIN, REQ or close puts none
    of them into the lane, where they would be a second message out at once;
    the ordered consumer gets each message once, in order."""
    server = started(nsqd_factory())
    create(server, "lt", 1)
    plain = Consumer("lt", "c", shm_prefix=server.prefix)
    try:
        mpub(server, "lt", [b"m%02d" % i for i in range(10)])
        held = fetch_some(plain, 10)
        assert len(held) == 10
        with Consumer("lt", "c", shm_prefix=server.prefix, ordered=True) as ordered:
            first = fetch_some(ordered, 1)
            assert [bytes(m.body) for m in first] == [b"m00"]
            # its FIN of its copy of the head the ordered consumer holds: refused, or
            # the next message would go out beside it
            stale = next(m for m in held if bytes(m.body) == b"m00")
            with pytest.raises(LocalError, match="E_FIN_FAILED"):
                stale.finish()
            assert plain.in_flight == 0
            nothing_more(ordered, 0.3)
            nothing_more(plain, 0.3)  # (the ordered lane's head is out)
            plain.close()  # puts back nothing
            first[0].finish()
            assert [b"m00"] + ordered_run(ordered, 9) == [b"m%02d" % i for i in range(10)]
            nothing_more(ordered, 0.3)
            assert wait_for(lambda: caught_up(server, "lt", "c"), 5)
    finally:
        plain.close()


def tcp_messages(sock, dec, wait):
    """(body, attempts, ID) of the message frames that come within `wait` s."""
    got = []
    sock.settimeout(wait)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                break
            dec.feed(data)
            for kind, frame in dec.frames():
                if kind == FRAME_TYPE_MESSAGE:  # (SUB_ORDERED: offset and raw size, 12 B)
                    got.append((frame[38:], frame[8] << 8 | frame[9], frame[10:26]))
    except TimeoutError:
        pass
    return got


def tcp_ordered_run(sock, dec, n, timeout=20.0):
    """Bodies of the next n messages an ordered TCP client gets, each FIN'd
    as it comes; never two out at once."""
    seen = []
    deadline = time.monotonic() + timeout
    while len(seen) < n and time.monotonic() < deadline:
        more = tcp_messages(sock, dec, 0.5)
        assert len(more) <= 1, more  # one at a time
        for body, _, msg_id in more:
            seen.append(body)
            sock.sendall(fin(msg_id))
    return seen


def test_a_dead_consumers_copies_from_before_a_move_into_an_ordered_lane_stay_out(nsqd_factory):
    """A plain local consumer holds messages of a partition when a TCP client's
    SUB_ORDERED moves it into an ordered lane, and is SIGKILLed before it
    looks again: the broker's recovery of its arena puts none of them back,
    not its copy of the head either (the lane pushed the head itself after the
    move, and the TCP client holds it), so the ordered client gets each
    message once, in order.  (Its arena names the ordered lanes it took from:
    a head taken from the lane does go back,
    test_an_ordered_consumer_that_goes_leaves_its_head_first.)"""
    server = started(nsqd_factory())
    create(server, "lt", 1)
    Consumer("lt", "c", shm_prefix=server.prefix).close()  # (the channel)
    mpub(server, "lt", [b"m%02d" % i for i in range(10)])
    script = textwrap.dedent(f"""
        import sys, time
        from nsqshm.local import Consumer
        c = Consumer("lt", "c", shm_prefix={server.prefix!r})
        held = []
        deadline = time.monotonic() + 10
        while len(held) < 10 and time.monotonic() < deadline:
            held += list(c.fetch(10 - len(held), timeout=0.5))
        print(len(held), flush=True)
        sys.stdin.readline()  # (killed meanwhile)
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().split() == ["10"]
        with socket.create_connection(("127.0.0.1", server.tcp_port), timeout=5) as sock:
            dec = FrameDecoder()
            sock.sendall(MAGIC_V2 + b"SUB_ORDERED lt c 0\n" + rdy(1))
            got = []
            deadline = time.monotonic() + 10
            while not got and time.monotonic() < deadline:
                got = tcp_messages(sock, dec, 0.5)
            # (its 2nd delivery: the move took back what the consumer had out)
            assert [(b, a) for b, a, _ in got] == [(b"m00", 2)]
            child.kill()
            child.wait(10)
            # the broker recovers the dead consumer's arena
            assert wait_for(lambda: not [n for n in shm_entries(server.prefix)
                                         if f".f.l{child.pid}." in n], 10)
            sock.sendall(fin(got[0][2]))
            assert tcp_ordered_run(sock, dec, 9) == [b"m%02d" % i for i in range(1, 10)]
            assert tcp_messages(sock, dec, 1.0) == []  # m00 not a second time
            assert wait_for(lambda: caught_up(server, "lt", "c"), 5)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
    with Consumer("lt", "c", shm_prefix=server.prefix, direct=False) as plain:
        nothing_more(plain, 1.0)  # nothing left in the channel's ring either


def test_a_dead_bulk_consumers_head_from_an_ordered_lane_goes_back(nsqd_factory):
    """A BulkConsumer takes a partition's head from the ordered lane a TCP
    client's SUB_ORDERED made, and is SIGKILLed holding it: its arena names
    that lane, so the broker's recovery puts the head back into it, and the
    ordered client gets every message once, in order, the head first."""
    server = started(nsqd_factory())
    create(server, "lt", 1)
    Consumer("lt", "c", shm_prefix=server.prefix).close()  # (the channel)
    with socket.create_connection(("127.0.0.1", server.tcp_port), timeout=5) as sock:
        dec = FrameDecoder()
        sock.sendall(MAGIC_V2 + b"SUB_ORDERED lt c 0\n")  # (RDY 0: takes nothing yet)
        assert tcp_messages(sock, dec, 0.3) == []
        mpub(server, "lt", [b"m%02d" % i for i in range(10)])
        script = textwrap.dedent(f"""
            import sys, time
            from nsqshm.local import BulkConsumer
            bulk = BulkConsumer("lt", "c", shm_prefix={server.prefix!r})
            bodies = []
            deadline = time.monotonic() + 10
            while not bodies and time.monotonic() < deadline:
                bodies = bulk.take(100, timeout=0.5).column("body").to_pylist()
            time.sleep(0.3)
            bodies += bulk.take(100, timeout=0.3).column("body").to_pylist()
            print(" ".join(b.decode() for b in bodies), flush=True)
            sys.stdin.readline()  # (killed meanwhile)
        """)
        child = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout.readline().split() == ["m00"]  # the lane's head alone
            child.kill()
            child.wait(10)
            assert wait_for(lambda: not [n for n in shm_entries(server.prefix)
                                         if f".f.l{child.pid}." in n], 10)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(10)
        sock.sendall(rdy(1))
        assert tcp_ordered_run(sock, dec, 10) == [b"m%02d" % i for i in range(10)]
        assert tcp_messages(sock, dec, 0.5) == []
        assert wait_for(lambda: caught_up(server, "lt", "c"), 5)


def test_a_bulk_consumer_drops_its_copies_when_a_partition_turns_ordered(nsqd_factory):
    """A BulkConsumer holds a lot of a partition when an ordered consumer moves it
    into an ordered lane: its finish marks none of them (they are dropped: the
    lane delivers them again), so the head stays the ordered consumer's alone."""
    server = started(nsqd_factory())
    create(server, "lt", 1)
    with BulkConsumer("lt", "c", shm_prefix=server.prefix) as bulk:
        mpub(server, "lt", [b"m%02d" % i for i in range(10)])
        assert len(take_bodies(bulk, 10)) == 10
        with Consumer("lt", "c", shm_prefix=server.prefix, ordered=True) as ordered:
            first = fetch_some(ordered, 1)
            assert [bytes(m.body) for m in first] == [b"m00"]
            assert bulk.finish() == 0  # (all ten dropped, none marked finished)
            nothing_more(ordered, 0.3)  # the head is still out
            first[0].finish()
            assert ordered_run(ordered, 9) == [b"m%02d" % i for i in range(1, 10)]
            assert wait_for(lambda: caught_up(server, "lt", "c"), 5)


def test_a_waiting_consumer_follows_its_lane_turned_ordered(nsqd_factory):
    """A partition consumer waits in fetch() while another consumer turns its
    partition's lane ordered: the wait goes on over the new lane (the lane it
    armed was let go) and takes from it."""
    server = started(nsqd_factory())
    create(server, "lt", 2)
    Consumer("lt", "c", shm_prefix=server.prefix).close()  # (the channel)
    with Consumer("lt", "c", shm_prefix=server.prefix, partition=0) as waiting:
        nothing_more(waiting, 0.2)
        result = {}

        def wait():
            try:
                result["batch"] = [bytes(m.body) for m in waiting.fetch(10, timeout=8)]
            except Exception as err:  # (the test's failure, reported below)
                result["error"] = err

        thread = threading.Thread(target=wait)
        thread.start()
        time.sleep(0.3)
        other = Consumer("lt", "c", shm_prefix=server.prefix, ordered=True, partition=0,
                         max_in_flight=1)
        try:
            time.sleep(1.5)  # (the waiter looks for lanes at least once a second)
            mpub(server, "lt", [b"late0", b"late1"], partition=0)
            thread.join(10)
            assert "error" not in result, result
            assert result["batch"] == [b"late0"]  # (one at a time: the lane's head)
            nothing_more(other, 0.3)
        finally:
            other.close()


def test_a_local_and_a_tcp_ordered_consumer_share_a_partition_one_at_a_time(nsqd_factory):
    """The local consumer claims each head from the log itself; the TCP
    one's FIN has its worker claim the next for it (LogChannel.next_ordered)
    unless it is not ready (here: RDY 0 before every 25th FIN), when the
    owner's feeder pushes it into the lane (LogChannel._claim, one_out):
    whoever takes it, one message is out at a time, each once, in log
    order."""
    server = started(nsqd_factory())
    create(server, "lt", 1)
    Consumer("lt", "c", shm_prefix=server.prefix).close()  # (the channel)
    n = 600
    mpub(server, "lt", [b"s%03d" % i for i in range(n)])
    lock = threading.Lock()
    state = {"out": None, "seen": [], "overlaps": []}

    def took(who, body):
        with lock:
            if state["out"] is not None:
                state["overlaps"].append((state["out"], (who, body)))
            state["out"] = (who, body)
            state["seen"].append((who, body))

    def done():
        with lock:
            state["out"] = None

    def tcp_consumer(stop):
        sock = socket.create_connection(("127.0.0.1", server.tcp_port), timeout=5)
        dec = FrameDecoder()
        sock.sendall(MAGIC_V2 + b"SUB_ORDERED lt c\n" + rdy(10))
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                data = sock.recv(1 << 16)
            except TimeoutError:
                continue
            dec.feed(data)
            for kind, frame in dec.frames():
                if kind == FRAME_TYPE_MESSAGE:
                    took("tcp", frame[38:])  # (after the offset and raw size: 12 B)
                    time.sleep(0.001)
                    done()
                    state["tcp"] = state.get("tcp", 0) + 1
                    if state["tcp"] % 25:
                        sock.sendall(fin(frame[10:26]))
                    else:  # a turn for the local consumer
                        sock.sendall(rdy(0) + fin(frame[10:26]))
                        time.sleep(0.02)
                        sock.sendall(rdy(10))
        sock.close()

    stop = threading.Event()
    thread = threading.Thread(target=tcp_consumer, args=(stop,))
    thread.start()
    try:
        with Consumer("lt", "c", shm_prefix=server.prefix, ordered=True) as c:
            assert c.direct
            deadline = time.monotonic() + 30
            while len(state["seen"]) < n and time.monotonic() < deadline:
                for m in c.fetch(10, timeout=0.05):
                    took("local", bytes(m.body))
                    time.sleep(0.001)
                    done()
                    m.finish()
    finally:
        stop.set()
        thread.join(10)
    assert not state["overlaps"], state["overlaps"][:5]
    assert [body for _, body in state["seen"]] == [b"s%03d" % i for i in range(n)]
    whom = {who for who, _ in state["seen"]}
    assert whom == {"local", "tcp"}, whom  # (both took some: the race was run)
    assert wait_for(lambda: caught_up(server, "lt", "c"), 5)


def test_a_tcp_consumer_that_comes_later_gets_the_next_head(nsqd_factory):
    """A local ordered consumer alone on the channel claims each head itself
    and nudges no feeder; a TCP SUB_ORDERED consumer that comes later is fed
    at its SUB: it gets the next message while the local one sits idle."""
    server = started(nsqd_factory())
    create(server, "lt", 1)
    Consumer("lt", "c", shm_prefix=server.prefix).close()  # (the channel)
    mpub(server, "lt", [b"h%02d" % i for i in range(10)])
    with Consumer("lt", "c", shm_prefix=server.prefix, ordered=True) as c:
        assert ordered_run(c, 5) == [b"h%02d" % i for i in range(5)]
        with socket.create_connection(("127.0.0.1", server.tcp_port), timeout=5) as tcp:
            tcp.sendall(MAGIC_V2 + b"SUB_ORDERED lt c\n" + rdy(10))
            dec = FrameDecoder()
            got = []
            deadline = time.monotonic() + 5
            while not got and time.monotonic() < deadline:
                dec.feed(tcp.recv(1 << 16))
                got += [frame[38:] for kind, frame in dec.frames() if kind == FRAME_TYPE_MESSAGE]
            assert got == [b"h05"]


def test_an_ordered_consumer_of_an_ordered_topic_and_one_partition(nsqd_factory):
    """Youzan's orderedmulti topic, which refuses plain consumers, takes an
    ordered one; ordered= with partition= takes that partition alone."""
    server = started(nsqd_factory())
    status, body = server.post("/topic/create?topic=ot&partition_num=2&orderedmulti=true")
    assert status == 200, body
    with Consumer("ot", "c", shm_prefix=server.prefix, ordered=True, partition=1) as c:
        for p in range(2):
            mpub(server, "ot", [b"t%d-%d" % (p, i) for i in range(5)], partition=p)
        seen = []
        deadline = time.monotonic() + 10
        while len(seen) < 5 and time.monotonic() < deadline:
            batch = c.fetch(10, timeout=0.5)
            assert len(batch) <= 1
            seen += [bytes(m.body) for m in batch]
            batch.finish()
        assert seen == [b"t1-%d" % i for i in range(5)]
        nothing_more(c, 0.3)
        assert partitions(server, "ot", "c")[1] == [0, 5]


@pytest.mark.parametrize("sig", ["close", "kill"])
def test_an_ordered_consumer_that_goes_leaves_its_head_first(nsqd_factory, sig):
    """An ordered consumer closes, or is SIGKILLed, holding a partition's head:
    the next ordered consumer gets that message first, then the rest in order."""
    server = started(nsqd_factory())
    create(server, "lt", 1)
    Consumer("lt", "c", shm_prefix=server.prefix).close()  # (the channel)
    mpub(server, "lt", [b"h%02d" % i for i in range(10)])
    script = textwrap.dedent(f"""
        import os
        from nsqshm.local import Consumer
        c = Consumer("lt", "c", shm_prefix={server.prefix!r}, ordered=True)
        done = []
        while len(done) < 4:
            batch = c.fetch(10, timeout=5)
            done += [bytes(m.body).decode() for m in batch]
            if len(done) < 4:
                batch.finish()
        print(" ".join(done), flush=True)
        if {sig!r} == "kill":
            os.kill(os.getpid(), 9)
        c.close()
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == (-signal.SIGKILL if sig == "kill" else 0), out.stderr
    assert out.stdout.split() == ["h00", "h01", "h02", "h03"]  # h03 held, unfinished
    with Consumer("lt", "c", shm_prefix=server.prefix, ordered=True) as c:
        seen = []
        deadline = time.monotonic() + 15
        while len(seen) < 7 and time.monotonic() < deadline:
            batch = c.fetch(10, timeout=0.5)
            seen += [(bytes(m.body), m.attempts) for m in batch]
            batch.finish()
        assert [b for b, _ in seen] == [b"h%02d" % i for i in range(3, 10)]
        assert seen[0][1] == 2  # h03's second delivery
        assert wait_for(lambda: caught_up(server, "lt", "c"), 5)


def test_bad_lane_arguments_are_refused(nsqd_factory):
    server = started(nsqd_factory())
    create(server, "lt", 2)
    with pytest.raises(LocalError, match=r"^lt: no partition 2 \(it has 2\)$"):
        Consumer("lt", "c", shm_prefix=server.prefix, partition=2)
    with pytest.raises(LocalError, match=r"^lt: no partition True"):
        Consumer("lt", "c", shm_prefix=server.prefix, partition=True)
    assert server.post("/topic/create?topic=classic")[0] == 200
    for kwargs in ({"partition": 0}, {"ordered": True}):
        with pytest.raises(LocalError, match=r"^classic: partition= and ordered= are for a "
                                             r"log topic's channel$"):
            Consumer("classic", "c", shm_prefix=server.prefix, **kwargs)
