"""What a local client's death, fork or exit does: only its own arena is
ever touched, and its messages come back."""

import json
import os
import signal
import subprocess
import sys
import time

from nsqshm._core import codec
from nsqshm._core.arena import Arena
from nsqshm.local import BulkConsumer, Consumer, LocalError, Producer
from nsqshm.local.consumer import _close_all
from nsqshm.nsqd.local.clients import dead_arenas
from nsqshm.ring import Ring

from .conftest import shm_entries, wait_for

HOLDER = """
import sys, time
from nsqshm.local import Consumer
c = Consumer("t", "c", shm_prefix=sys.argv[1], msg_timeout=600)
got = 0
while got < int(sys.argv[2]):
    got += len(c.fetch(int(sys.argv[2]) - got, timeout=5))
print(c.arena.name, flush=True)
time.sleep(600)
"""


def start_holder(broker, n):
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, broker.prefix, str(n)],
                            stdout=subprocess.PIPE, text=True)
    name = proc.stdout.readline().strip()
    assert name, "the holder did not fetch its messages"
    return proc, name


def collect(prefix, n, timeout):
    """(bodies, attempts) of n messages fetched from t:c (finished)."""
    got, attempts = [], []
    with Consumer("t", "c", shm_prefix=prefix) as c:
        deadline = time.monotonic() + timeout
        while len(got) < n and time.monotonic() < deadline:
            batch = c.fetch(n, timeout=0.5)
            got += [bytes(b) for b in batch.bodies()]
            attempts += batch.attempts.tolist()
            batch.finish()
    return got, attempts


def test_dead_arenas_lists_an_arena_once_its_owner_died(ring_name):
    """local_clients.dead_arenas, which the broker's recovery walks (the
    messages coming back are the broker tests below), on an arena of its
    own (no broker, which would recover it first)."""
    prefix = ring_name
    ring = Ring.create(f"{prefix}.c.t:c", capacity=1 << 20)
    code = (f"from nsqshm._core.arena import Arena\n"
            f"from nsqshm._core.inflight import InFlight\n"
            f"from nsqshm.ring import Ring\n"
            f"import os, time\n"
            f"a = Arena.create('{prefix}.f.l' + str(os.getpid()) + '.0', size=1 << 22)\n"
            f"t = InFlight(); t.use_arena(a, 't:c')\n"
            f"n, _ = t.deliver_from_ring(Ring.attach('{prefix}.c.t:c'), 500, bytearray(1 << 20),\n"
            f"                           bytearray(), 1, time.monotonic_ns() + 10**12)\n"
            f"print(a.name, n, flush=True)\n"
            f"time.sleep(600)\n")
    name = None
    try:
        ring.push_many([codec.encode_message(codec.int_to_id(i + 1), 1, 0, b"k%d" % i)
                        for i in range(500)])
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        name, taken = proc.stdout.readline().split()
        assert int(taken) == 500 and ring.depth == 0
        assert dead_arenas(prefix) == []  # its owner lives
        proc.kill()
        proc.wait()
        assert dead_arenas(prefix) == [name]
        arena = Arena.attach(name)
        try:
            assert arena.live_blocks == 500  # what recovery would put back
        finally:
            arena.close()
    finally:
        ring.close()
        Ring.unlink_segment(f"{prefix}.c.t:c")
        if name:
            Arena.unlink_segment(name)


def test_sigkill_then_the_broker_redelivers(broker):
    with Producer("t", shm_prefix=broker.prefix) as p:
        p.publish_many([f"b{i}".encode() for i in range(300)])
    proc, name = start_holder(broker, 300)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    got, attempts = collect(broker.prefix, 300, 15)
    assert sorted(got) == sorted(f"b{i}".encode() for i in range(300))
    assert set(attempts) == {2}
    assert wait_for(lambda: name not in shm_entries(broker.prefix), timeout=5)


def test_forked_child_never_touches_the_parents_arena(broker):
    with Producer("t", shm_prefix=broker.prefix) as p:
        p.publish_many([f"f{i}".encode() for i in range(20)])
    c = Consumer("t", "c", shm_prefix=broker.prefix)
    parent_batch = c.fetch(10, timeout=5)
    parent_arena = c.arena.name
    assert len(parent_batch) == 10
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a Spark worker forked by its daemon, say
        out = {}
        try:
            try:
                parent_batch.finish()
                out["finish"] = "allowed"
            except LocalError:
                out["finish"] = "refused"
            batch = c.fetch(10, timeout=5)  # its own arena and table
            out["child_got"] = len(batch)
            out["child_arena"] = c.arena.name
            batch.requeue()
            _close_all()  # what atexit does in a child that exits normally
        except BaseException as err:  # noqa: BLE001
            out["error"] = repr(err)
        os.write(write, json.dumps(out).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    out = json.loads(os.read(read, 65536))
    os.close(read)
    assert out.get("finish") == "refused" and out.get("child_got") == 10, out
    assert out["child_arena"] != parent_arena
    entries = shm_entries(broker.prefix)
    assert parent_arena in entries and out["child_arena"] not in entries
    assert f"{broker.prefix}.c.t:c" in entries and f"{broker.prefix}.t.t" in entries
    assert parent_batch.finish() == 10
    rest = c.fetch(20, timeout=5)
    assert sorted(bytes(b) for b in rest.bodies()) == sorted(
        f"f{i}".encode() for i in range(10, 20))  # what the child requeued
    rest.finish()
    c.close()


def test_bulk_consumer_lots(broker):
    with Producer("t", shm_prefix=broker.prefix) as p:
        p.publish_many([f"L{i}".encode() for i in range(1000)])
    with BulkConsumer("t", "c", shm_prefix=broker.prefix) as bulk:
        assert wait_for(lambda: bulk.depth == 1000)
        rb = bulk.take(600)
        assert rb.num_rows == 600 and bulk.held == 600
        assert rb.column("attempts").to_pylist() == [1] * 600
        assert bulk.requeue() == 600 and bulk.depth == 1000
        first = bulk.take(700)
        assert first.num_rows == 700
        assert bulk.finish() == 700
        rest = bulk.take(1000)
        got = first.column("body").to_pylist() + rest.column("body").to_pylist()
        assert sorted(got) == sorted(f"L{i}".encode() for i in range(1000))
        name = bulk.arena.name
    # closed holding 300: they went back, the arena is gone
    assert name not in shm_entries(broker.prefix)
    got, attempts = collect(broker.prefix, 300, 5)
    assert len(got) == 300 and set(attempts) == {3}


def test_bulk_consumer_starting_position(broker):
    with Producer("t", shm_prefix=broker.prefix) as p:
        p.publish_many([b"old1", b"old2"])
        time.sleep(0.01)
        since = time.time_ns()
        p.publish_many([b"new"])
    with BulkConsumer("t", "c", shm_prefix=broker.prefix, since_ns=since) as bulk:
        assert wait_for(lambda: bulk.depth == 3)
        rb = bulk.take(10)
        assert rb.column("body").to_pylist() == [b"new"] and bulk.skipped == 2
        bulk.finish()
