"""Local Producer and Consumer against a real broker: NSQ's semantics
through shared memory, and interplay with TCP clients (gnsq)."""

import json
import os
import signal
import stat
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pytest

from nsqshm.local import Consumer, LocalError, NoBroker, Producer, PublishTimeout

from .conftest import shm_entries, started, wait_for

PEER = os.path.join(os.path.dirname(__file__), "gnsq_peer.py")


def broker_processes(server):
    """The broker's processes (a supervisor may run workers as children)."""
    import psutil

    parent = psutil.Process(server.proc.pid)
    return [parent, *parent.children(recursive=True)]


def gnsq(*args, timeout=60):
    out = subprocess.run([sys.executable, PEER, *args], capture_output=True, text=True,
                         timeout=timeout)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def drain(consumer, n, timeout=10.0):
    """Fetch until n messages arrived; returns the batches (not finished)."""
    batches, got = [], 0
    deadline = time.monotonic() + timeout
    while got < n and time.monotonic() < deadline:
        batch = consumer.fetch(n - got, timeout=0.5)
        if batch:
            batches.append(batch)
            got += len(batch)
    return batches


def bodies(batches):
    return [bytes(b) for batch in batches for b in batch.bodies()]


def test_publish_and_consume_every_batch_form(broker):
    with Producer("t", shm_prefix=broker.prefix) as p, \
            Consumer("t", "c", shm_prefix=broker.prefix) as c:
        p.publish(b"one")
        p.publish("two")
        p.publish_many([b"three", bytearray(b"four")])
        data = b"fivesixseven"
        p.publish_buffer(data, np.array([0, 4, 7], dtype=np.int64),
                         np.array([4, 3, 5], dtype=np.int64))
        p.publish_buffer(data, np.array([0, 4, 7, 12], dtype=np.int32))
        p.publish_arrow(pa.chunked_array([pa.array(["x", "y"]), pa.array(["z"])]))
        p.publish_arrow(pa.array([b"big"], type=pa.large_binary()))
        expected = [b"one", b"two", b"three", b"four", b"five", b"six", b"seven", b"five",
                    b"six", b"seven", b"x", b"y", b"z", b"big"]
        batches = drain(c, len(expected))
        assert bodies(batches) == expected
        ids = np.concatenate([b.ids for b in batches])
        assert len(set(ids.tolist())) == len(expected)
        assert all((b.attempts == 1).all() for b in batches)
        rb = batches[0].to_arrow()
        assert rb.column("body").to_pylist() == bodies(batches[:1])
        assert rb.column("channel").to_pylist() == ["c"] * rb.num_rows
        assert sum(b.finish() for b in batches) == len(expected)
        assert c.in_flight == 0 and p.published == len(expected)


def test_batch_views_are_zero_copy(broker):
    with Producer("t", shm_prefix=broker.prefix) as p, \
            Consumer("t", "c", shm_prefix=broker.prefix) as c:
        p.publish_many([b"alpha", b"beta"])
        (batch,) = drain(c, 2)
        buf = batch.buffer
        assert [bytes(buf[o:o + n]) for o, n in zip(batch.offsets, batch.lengths, strict=True)] == \
            [b"alpha", b"beta"]
        assert batch[1].body.obj is batch.buffer.obj  # a view of the delivery buffer
        assert abs(int(batch.timestamps[0]) - time.time_ns()) < 60e9
        batch.finish()


def test_shm_publish_tcp_consume(broker):
    with Producer("t", shm_prefix=broker.prefix) as p:
        broker.post("/channel/create?topic=t&channel=tcp")
        p.publish_many([f"m{i}".encode() for i in range(200)])
    got = gnsq("consume", f"127.0.0.1:{broker.tcp_port}", "t", "tcp", "200")
    assert sorted(got["bodies"]) == sorted(f"m{i}" for i in range(200))
    assert set(got["attempts"]) == {1}


def test_tcp_publish_shm_consume(broker):
    with Consumer("t", "c", shm_prefix=broker.prefix) as c:
        gnsq("publish", f"127.0.0.1:{broker.tcp_port}", "t", "300", "g")
        batches = drain(c, 300)
        assert sorted(bodies(batches)) == sorted(f"g{i}".encode() for i in range(300))
        for b in batches:
            b.finish()


def test_local_and_tcp_consumers_share_a_channel(broker):
    with Producer("t", shm_prefix=broker.prefix) as p, \
            Consumer("t", "c", shm_prefix=broker.prefix, max_in_flight=50) as c:
        p.publish_many([f"s{i}".encode() for i in range(400)])
        local = []
        while len(local) < 100:
            batch = c.fetch(min(50, 100 - len(local)), timeout=1)
            local += [bytes(b) for b in batch.bodies()]
            batch.finish()
        got = gnsq("consume", f"127.0.0.1:{broker.tcp_port}", "t", "c", "300")
        assert sorted(local + [b.encode() for b in got["bodies"]]) == \
            sorted(f"s{i}".encode() for i in range(400))


@pytest.mark.parametrize("workers", [1, 2])
def test_time_to_live_applies_to_local_consumers(nsqd_factory, workers):
    """The channel's time to live (set after the consumer attached) and a
    message's own (/pub?ttl=): expired messages are never handed out, and the
    broker's /stats counts them (once, whichever worker answers)."""
    broker = started(nsqd_factory(f"--workers={workers}"))
    with Consumer("t", "c", shm_prefix=broker.prefix) as c:
        assert broker.post("/channel/policy?topic=t&channel=c&ttl=300")[0] == 200
        assert broker.post("/pub?topic=t", b"old")[0] == 200
        assert broker.post("/pub?topic=t&ttl=600000", b"own-long")[0] == 200
        assert wait_for(lambda: c.ring.depth == 2, 5)
        time.sleep(0.4)  # both past the channel's 300 ms
        assert list(c.fetch(10, timeout=0.3).bodies()) == []
        assert c.ring.depth == 0  # taken from the ring, dropped
        assert broker.post("/channel/policy?topic=t&channel=c&ttl=0")[0] == 200
        assert broker.post("/pub?topic=t&ttl=200", b"own-short")[0] == 200
        assert broker.post("/pub?topic=t", b"fresh")[0] == 200
        assert wait_for(lambda: c.ring.depth == 2, 5)
        time.sleep(0.3)  # own-short past its own deadline
        batch = c.fetch(10, timeout=1)
        assert [bytes(b) for b in batch.bodies()] == [b"fresh"]
        batch.finish()

        def expired():
            doc = json.loads(broker.get("/stats?format=json&topic=t")[1])
            channel = doc["topics"][0]["channels"][0]
            return channel.get("expired_count")
        assert wait_for(lambda: expired() == 3, 5), expired()


def test_requeue_and_timeout_redeliver_with_attempts(broker):
    with Producer("t", shm_prefix=broker.prefix) as p, \
            Consumer("t", "c", shm_prefix=broker.prefix, msg_timeout=0.5) as c:
        p.publish_many([b"a", b"b", b"c"])
        (batch,) = drain(c, 3)
        batch[0].finish()
        batch[1].requeue()
        time.sleep(0.8)  # "c" times out: the consumer's timer puts it back
        assert c.timeout_count == 1 and c.in_flight == 0
        with pytest.raises(LocalError, match="E_FIN_FAILED"):
            batch[2].finish()
        again = drain(c, 2)
        got = {bytes(m.body): m.attempts for b in again for m in b}
        assert got == {b"b": 2, b"c": 2}
        msg = next(m for b in again for m in b if bytes(m.body) == b"b")
        msg.requeue(delay=0.4)
        t0 = time.monotonic()
        late = drain(c, 1, timeout=5)
        assert time.monotonic() - t0 >= 0.35
        assert [(bytes(m.body), m.attempts) for m in late[0]] == [(b"b", 3)]
        assert c.requeue_count == 2
        assert late[0].finish() == 1
        assert c.finish_count == 2


def test_touch_extends_the_timeout(broker):
    with Producer("t", shm_prefix=broker.prefix) as p, \
            Consumer("t", "c", shm_prefix=broker.prefix, msg_timeout=0.6) as c:
        p.publish(b"slow")
        (batch,) = drain(c, 1)
        for _ in range(4):
            time.sleep(0.3)
            batch.touch()
        assert c.in_flight == 1 and not c.fetch(1, timeout=0.1)
        assert batch.finish() == 1


def test_max_in_flight_is_the_window(broker):
    with Producer("t", shm_prefix=broker.prefix) as p, \
            Consumer("t", "c", shm_prefix=broker.prefix, max_in_flight=10) as c:
        p.publish_many([b"x"] * 25)
        first = drain(c, 10)
        assert len(bodies(first)) == 10
        assert len(c.fetch(10, timeout=0.2)) == 0  # the window is full
        first[0].finish()
        assert len(drain(c, 10)[0]) == 10


def test_close_puts_messages_back_and_removes_the_arena(broker):
    with Producer("t", shm_prefix=broker.prefix) as p:
        p.publish_many([b"kept1", b"kept2"])
    c = Consumer("t", "c", shm_prefix=broker.prefix)
    name = c.arena.name
    assert stat.S_IMODE(os.stat(f"/dev/shm/{name}").st_mode) == 0o600
    batches = drain(c, 2)
    batches[0][0].requeue(delay=30)  # deferred messages go back too
    c.close()
    assert name not in shm_entries(broker.prefix)
    with Consumer("t", "c", shm_prefix=broker.prefix) as again:
        back = drain(again, 2)
        assert sorted(bodies(back)) == [b"kept1", b"kept2"]
        assert all((b.attempts == 2).all() for b in back)


def test_full_topic_ring_waits_then_times_out(nsqd_factory):
    server = started(nsqd_factory("--mem-queue-size=1", "--max-msg-size=1000"))
    with Producer("t", shm_prefix=server.prefix, timeout=0.3) as p:
        p.publish(b"made")  # topic and ring exist
        procs = broker_processes(server)
        for proc in procs:  # nothing drains the topic's ring now
            proc.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(PublishTimeout) as err:
                p.publish_many([b"x" * 900] * 50)  # the ring holds 8 KiB
            assert 0 < err.value.published < 50
        finally:
            for proc in procs:
                proc.send_signal(signal.SIGCONT)
        p.timeout = 10
        p.publish_many([b"x" * 900] * 50)  # the pump makes room: the producer waits for it
        with pytest.raises(ValueError, match="max_msg_size"):
            p.publish(b"y" * 1001)


def test_names_and_missing_broker(broker, tmp_path):
    with pytest.raises(ValueError):
        Producer("bad name", shm_prefix=broker.prefix)
    with pytest.raises(ValueError):
        Consumer("t", "bad/channel", shm_prefix=broker.prefix)
    with pytest.raises(NoBroker):
        Consumer("t", "c", data_path=str(tmp_path / "nowhere"))


def test_found_by_data_path(nsqd_factory, tmp_path):
    from nsqshm.nsqd.local.instance import prefix_for

    data = tmp_path / "data"
    data.mkdir()
    # the prefix a broker derives from its data path when --shm-prefix is not given
    started(nsqd_factory(data_path=data, prefix=prefix_for(str(data))))
    with Producer("t", data_path=str(data)) as p, Consumer("t", "c", data_path=str(data)) as c:
        p.publish(b"by path")
        assert bodies(drain(c, 1)) == [b"by path"]


def test_no_consumer_process_leaves_segments_but_its_arena(broker):
    before = shm_entries(broker.prefix)
    code = (f"from nsqshm.local import Consumer, Producer\n"
            f"p = Producer('t', shm_prefix={broker.prefix!r}); p.publish(b'z')\n"
            f"c = Consumer('t', 'c', shm_prefix={broker.prefix!r})\n"
            f"assert len(c.fetch(1, timeout=5)) == 1\n")  # exits holding it: atexit puts it back
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    after = shm_entries(broker.prefix)
    assert not [n for n in after if ".f.l" in n]
    assert set(before) <= set(after)  # nothing of the broker's removed
    with Consumer("t", "c", shm_prefix=broker.prefix) as c:
        assert bodies(drain(c, 1)) == [b"z"]
    assert wait_for(lambda: broker.proc.poll() is None)
