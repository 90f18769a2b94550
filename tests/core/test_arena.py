"""nsqshm._core.arena: in-flight messages in shared memory, and what a
recovering process finds after the owner dies (includes/arena_layout.h)."""

import os
import random
import signal
import stat
import struct
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from nsqshm._core import codec
from nsqshm._core.arena import DEFERRED, LIVE, Arena, ArenaError, process_start
from nsqshm._core.inflight import DeferredQueue, InFlight
from nsqshm.ring import Ring

TS = 1_700_000_000_000_000_000


def msg(i, body=b"body"):
    return codec.encode_message(codec.int_to_id(i), TS, 0, body)


def pack(messages):
    return b"".join(struct.pack("=I", len(m)) + m for m in messages)


@pytest.fixture
def arena_name():
    name = f"nsqshm-test-arena-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    yield name
    Arena.unlink_segment(name)


@pytest.fixture
def arena(arena_name):
    a = Arena.create(arena_name, size=1 << 24, max_queues=16, label="test")
    yield a
    a.close()


def test_segment_is_private_and_sparse(arena, arena_name):
    st_ = os.stat(f"/dev/shm/{arena_name}")
    assert stat.S_IMODE(st_.st_mode) == 0o600
    assert st_.st_size == 1 << 24
    assert st_.st_blocks * 512 < 1 << 20  # only the header's pages are used
    assert arena.owner_pid == os.getpid() and arena.owner_alive()
    assert arena.label == "test"


def test_header_bytes(arena, arena_name):
    with open(f"/dev/shm/{arena_name}", "rb") as f:
        head = f.read(96)
    magic, version, header_size, total, data_offset, max_q, n_q, pid = struct.unpack_from(
        "<QIIQQIII", head)
    assert magic.to_bytes(8, "little") == b"nsqshmAR"
    assert (version, header_size, total) == (1, 4096, 1 << 24)
    assert data_offset == 4096 + 16 * 256 and (max_q, n_q, pid) == (16, 0, os.getpid())
    (bump,) = struct.unpack_from("<Q", head, 64)
    assert bump == data_offset


def test_queue_table(arena, arena_name):
    assert arena.queue_index("t:c") == 0
    assert arena.queue_index("t:d") == 1
    assert arena.queue_index("t:c") == 0
    other = Arena.attach(arena_name)
    assert other.queue_name(1) == "t:d"
    with pytest.raises(IndexError):
        other.queue_name(2)
    for i in range(14):
        arena.queue_index(f"q{i}")
    with pytest.raises(ArenaError, match="queue table full"):
        arena.queue_index("one-too-many")
    with pytest.raises(ValueError):
        arena.queue_index("x" * 300)
    other.close()


def test_bad_names_and_segments(arena_name):
    for bad in ("", "../etc", "a/b", ".hidden", "x" * 201):
        with pytest.raises(ValueError):
            Arena.create(bad)
    ring = Ring.create(arena_name, capacity=4096)
    try:
        with pytest.raises(ArenaError, match="not an arena"):
            Arena.attach(arena_name)
    finally:
        ring.close()
        Ring.unlink_segment(arena_name)


def test_inflight_blocks_are_listed_until_finished(arena, arena_name):
    inflight = InFlight()
    inflight.use_arena(arena, "t:c")
    out = bytearray()
    assert inflight.deliver(pack([msg(i) for i in range(10)]), 10, out, 7,
                            time.monotonic_ns() + 60 * 10**9) == 10
    seen = Arena.attach(arena_name)
    blocks = seen.blocks()
    assert [b[1] for b in blocks] == ["t:c"] * 10 and {b[2] for b in blocks} == {LIVE}
    # what is recorded is the message as delivered: attempts 1
    assert blocks[3][4] == codec.encode_message(codec.int_to_id(3), TS, 1, b"body")
    assert abs(blocks[0][3] - (time.time_ns() + 60 * 10**9)) < 5 * 10**9  # deadline, wall clock
    assert inflight.finish(codec.int_to_id(3), 7) == 0
    assert len(seen.blocks()) == 9 and seen.live_blocks == 9
    # a finished block is reused for the next message of its size
    used = seen.used_bytes
    inflight.deliver(pack([msg(100)]), 1, out, 7, time.monotonic_ns() + 10**9)
    assert seen.used_bytes == used
    seen.close()


def test_handed_out_blocks_stay_until_release(arena):
    inflight = InFlight()
    inflight.use_arena(arena, "t:c")
    inflight.deliver(pack([msg(i) for i in range(5)]), 5, bytearray(), 1, 0)
    buf = bytearray(1 << 16)
    n, _ = inflight.pop_expired(time.monotonic_ns(), buf)
    assert n == 5 and len(inflight) == 0
    assert arena.live_blocks == 5 and inflight.unreleased == 5  # not stored elsewhere yet
    assert inflight.release() == 5
    assert arena.live_blocks == 0 and arena.blocks() == []
    inflight.deliver(pack([msg(9)]), 1, bytearray(), 1, 0)
    assert isinstance(inflight.requeue(codec.int_to_id(9), 1), bytes)
    assert arena.live_blocks == 1
    inflight.release()
    assert arena.live_blocks == 0


def test_deferred_blocks_keep_their_due_time(arena):
    deferred = DeferredQueue()
    deferred.use_arena(arena, "t:d")
    due = time.monotonic_ns() + 3600 * 10**9
    deferred.push(msg(1), due)
    ((off, queue, state, due_wall, body),) = arena.blocks()
    assert (queue, state, body) == ("t:d", DEFERRED, msg(1))
    assert abs(due_wall - (time.time_ns() + 3600 * 10**9)) < 10**9
    assert arena.release(off) is True and arena.release(off) is False
    with pytest.raises(ValueError):
        arena.release(5)


def test_full_arena_falls_back_to_malloc(arena_name):
    a = Arena.create(arena_name, size=4096 + 256 + 4 * 128, max_queues=1)
    inflight = InFlight()
    inflight.use_arena(a, "t:c")
    assert inflight.deliver(pack([msg(i) for i in range(6)]), 6, bytearray(), 1, 0) == 6
    assert a.live_blocks == 4 and a.fallbacks == 2
    buf = bytearray(1 << 16)
    assert inflight.drain(buf)[0] == 6
    inflight.release()
    assert a.live_blocks == 0
    a.close()


def test_use_arena_only_when_empty(arena):
    inflight = InFlight()
    inflight.add(msg(1), 1, 0)
    with pytest.raises(ValueError):
        inflight.use_arena(arena, "t:c")


def test_client_info(arena, arena_name):
    arena.set_client_info(client_id="c1", hostname="h", user_agent="ua/1", queue="t:c",
                          message_count=5, ready_count=10, connect_ts=123)
    info = Arena.attach(arena_name).client_info()
    assert info["client_id"] == "c1" and info["queue"] == "t:c"
    assert (info["message_count"], info["ready_count"], info["connect_ts"]) == (5, 10, 123)
    with pytest.raises(KeyError):
        arena.set_client_info(bogus=1)


def test_the_ordered_lanes_a_client_took_from(arena, arena_name):
    """A bit per partition 0..255, read by another process; an arena made
    before the field (its flags 0) answers None."""
    assert arena.ordered_lanes() == frozenset()
    arena.mark_ordered_lanes([0, 7, 8, 200, 255])
    arena.mark_ordered_lanes([7])  # (again: no change)
    assert Arena.attach(arena_name).ordered_lanes() == {0, 7, 8, 200, 255}
    for bad in (-1, 256):
        with pytest.raises(ValueError, match="out of range"):
            arena.mark_ordered_lanes([bad])
    assert arena.ordered_lanes() == {0, 7, 8, 200, 255}
    # bytes 44..47, flags; the bits at 752..783
    with open(f"/dev/shm/{arena_name}", "r+b") as raw:
        raw.seek(752)
        assert raw.read(32) == bytes([0x81, 0x01]) + bytes(23) + bytes([0x01]) + bytes(5) \
            + bytes([0x80])
        raw.seek(44)
        raw.write(bytes(4))
    assert Arena.attach(arena_name).ordered_lanes() is None


def test_the_ordered_lanes_a_broker_worker_attached_per_queue(arena, arena_name):
    """A broker worker's arena keeps a bitmap per queue (channel) at byte 224
    of its entry, set as a whole; an arena that does not keep them (a local
    client's, an older build's: flag 2 clear) answers None.  A forgotten
    queue's bits do not pass to the next queue in its entry."""
    orders, audit = arena.queue_index("t:orders"), arena.queue_index("t:audit")
    assert arena.queue_lanes(orders) is None  # (not kept yet)
    arena.keep_queue_lanes()
    assert arena.queue_lanes(orders) == frozenset()
    arena.set_queue_lanes(orders, [0, 9, 255])
    arena.set_queue_lanes(audit, [1])
    other = Arena.attach(arena_name)
    assert other.queue_lanes(orders) == {0, 9, 255} and other.queue_lanes(audit) == {1}
    arena.set_queue_lanes(orders, [9])  # (a whole: 0 and 255 go)
    assert other.queue_lanes(orders) == {9}
    for bad in (-1, 256):
        with pytest.raises(ValueError, match="out of range"):
            arena.set_queue_lanes(orders, [3, bad])
    assert arena.queue_lanes(orders) == {9}  # (nothing set by a refused call)
    with pytest.raises(IndexError):
        arena.queue_lanes(2)
    with pytest.raises(IndexError):
        arena.set_queue_lanes(2, [0])
    with open(f"/dev/shm/{arena_name}", "r+b") as raw:  # queue 0's entry at 4096
        raw.seek(4096 + 224)
        assert raw.read(32) == bytes([0x00, 0x02]) + bytes(30)
    with pytest.raises(ValueError, match="too long"):
        arena.queue_index("t:" + "x" * 221)  # (223 bytes: past the name's 222)
    arena.forget_queue("t:orders")
    assert arena.queue_index("t:reused") == orders
    assert arena.queue_lanes(orders) == frozenset()
    assert arena.ordered_lanes() == frozenset()  # (the header's own map is apart)


def test_owner_alive_tells_a_dead_process(arena):
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    arena.set_owner(proc.pid)
    assert not arena.owner_alive()
    assert process_start(os.getpid()) > 0


def test_deliver_from_ring_moves_messages_under_the_lock(arena, ring_name):
    ring = Ring.create(ring_name, capacity=1 << 16)
    ring.push_packed(pack([msg(i) for i in range(50)]))
    inflight = InFlight()
    inflight.use_arena(arena, "t:c")
    out = bytearray()
    taken, added = inflight.deliver_from_ring(ring, 20, bytearray(1 << 16), out, 1,
                                              time.monotonic_ns() + 10**9)
    assert (taken, added) == (20, 20) and ring.depth == 30 and arena.live_blocks == 20
    assert out[:8] == struct.pack(">II", 4 + len(msg(0)), 2)
    ring.close()


# A taker moves messages from a ring into its arena in a loop and finishes
# some; it is SIGKILLed at random moments.  Whatever it held must be in the
# ring or its arena afterwards.
TAKER = textwrap.dedent("""
    import sys, time
    from nsqshm._core.arena import Arena
    from nsqshm._core.inflight import InFlight
    from nsqshm.ring import Ring
    ring = Ring.attach(sys.argv[1])
    arena = Arena.create(sys.argv[2], size=1 << 26, max_queues=4)
    inflight = InFlight()
    inflight.use_arena(arena, "t:c")
    scratch = bytearray(ring.max_record + 4)
    done = open(sys.argv[3], "ab", buffering=0)
    print("ready", flush=True)
    while True:
        out = bytearray()
        taken, _ = inflight.deliver_from_ring(ring, 64, scratch, out, 1, 0)
        if not taken:
            time.sleep(0.001)
            continue
        # finish every other message; an ID is logged after its FIN succeeded
        pos = 0
        while pos < len(out):
            size = int.from_bytes(out[pos:pos + 4], "big")
            mid = bytes(out[pos + 18:pos + 34])
            if int(mid, 16) % 2 == 0 and inflight.finish(mid, 1) == 0:
                done.write(mid + b"\\n")
            pos += 4 + size
""")


def test_sigkill_of_a_taker_loses_nothing(tmp_path, ring_name):
    ring = Ring.create(ring_name, capacity=1 << 22)
    rng = random.Random(7)
    total = 0
    held = set()       # IDs recovered from dead takers' arenas
    finished = set()
    for round_ in range(6):
        n = 2000
        ring.push_packed(pack([msg(total + i, b"x" * rng.randrange(10, 300)) for i in range(n)]))
        total += n
        name = f"{ring_name}-a{round_}"
        done_path = tmp_path / f"done{round_}"
        proc = subprocess.Popen([sys.executable, "-c", TAKER, ring_name, name, str(done_path)],
                                stdout=subprocess.PIPE)
        assert proc.stdout.readline() == b"ready\n"
        time.sleep(rng.uniform(0.02, 0.2))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        arena = Arena.attach(name)
        assert not arena.owner_alive()
        for _off, queue, state, _due, body in arena.blocks():
            assert queue == "t:c" and state == LIVE
            held.add(int(body[10:26], 16))
        arena.close()
        Arena.unlink_segment(name)
        if done_path.exists():
            finished |= {int(x, 16) for x in done_path.read_bytes().split()}
    # what is left in the ring
    left = set()
    buf = bytearray(1 << 22)
    while True:
        n, nbytes = ring.pop_many_into(buf)
        if not n:
            break
        pos = 0
        for _ in range(n):
            size = int.from_bytes(buf[pos:pos + 4], "little")
            left.add(int(buf[pos + 14:pos + 30], 16))
            pos += 4 + size
    ring.close()
    lost = set(range(total)) - held - finished - left
    assert not lost, f"{len(lost)} messages lost"
    assert finished, "the takers finished nothing: the test did not exercise them"


def test_a_forgotten_queue_entry_is_reused_and_the_table_never_fills_with_deleted_ones(
        arena_name):
    arena = Arena.create(arena_name, size=1 << 22, max_queues=4)
    try:
        assert [arena.queue_index(f"t{i}:c") for i in range(4)] == [0, 1, 2, 3]
        with pytest.raises(ArenaError, match="queue table full"):
            arena.queue_index("t4:c")
        for round_ in range(100):  # ephemeral channels coming and going
            arena.forget_queue("t1:c")
            assert arena.queue_name(1) == ""
            assert arena.queue_index(f"e{round_}:c#ephemeral") == 1
            arena.forget_queue(f"e{round_}:c#ephemeral")
            assert arena.queue_index("t1:c") == 1
        assert arena.queue_index("t0:c") == 0  # the others keep theirs
        assert arena.queue_name(3) == "t3:c"
        arena.forget_queue("never:there")  # nothing to forget: nothing happens
    finally:
        arena.unlink()
        arena.close()
