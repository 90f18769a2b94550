"""Unit tests of the shared-memory ring (nsqshm._core.ring)."""

import mmap
import multiprocessing
import os
import stat
import struct
import threading
import time

import psutil
import pytest

from nsqshm.ring import (
    EMPTY,
    FULL,
    OK,
    TOO_BIG,
    Ring,
    RingCorruptError,
    RingLayoutError,
    RingRetired,
    RingVersionError,
    validate_name,
)

HEADER = 4096
# header field offsets, as drawn in includes/ring_layout.h
OFF = {
    "magic": 0, "version": 8, "header_size": 12, "capacity": 16, "total_size": 24,
    "max_record": 32, "tail": 128, "push_records": 136, "push_bytes": 144, "j_tail": 152,
    "retired": 176, "head": 256, "pop_records": 264, "recoveries": 448, "waiters": 512,
}


def raw_map(name):
    fd = os.open(f"/dev/shm/{name}", os.O_RDWR)
    try:
        return mmap.mmap(fd, 0)
    finally:
        os.close(fd)


def u64(m, field):
    return struct.unpack_from("<Q", m, OFF[field])[0]


# -- creation, layout, permissions ------------------------------------------------

def test_segment_is_mode_0600(ring_name):
    old = os.umask(0)
    try:
        r = Ring.create(ring_name, 8192)
    finally:
        os.umask(old)
    mode = stat.S_IMODE(os.stat(f"/dev/shm/{ring_name}").st_mode)
    assert mode == 0o600
    r.arm()  # creates the waiter FIFO
    fifos = [e for e in os.listdir("/dev/shm") if e.startswith(ring_name + ".w")]
    assert len(fifos) == 1
    assert stat.S_IMODE(os.stat(f"/dev/shm/{fifos[0]}").st_mode) == 0o600
    r.close()
    assert not [e for e in os.listdir("/dev/shm") if e.startswith(ring_name + ".w")]


@pytest.mark.parametrize("asked,capacity", [(1, 4096), (4096, 4096), (5000, 8192), (1 << 20, 1 << 20)])
def test_capacity_rounds_up_to_power_of_two(ring_name, asked, capacity):
    r = Ring.create(ring_name, asked)
    assert r.capacity == capacity
    assert r.max_record == capacity // 2 - 8
    m = raw_map(ring_name)
    assert m[:8] == b"nsqshmRG"
    assert struct.unpack_from("<I", m, OFF["version"])[0] == 1
    assert struct.unpack_from("<I", m, OFF["header_size"])[0] == HEADER
    assert u64(m, "capacity") == capacity
    assert u64(m, "total_size") == HEADER + capacity == os.path.getsize(f"/dev/shm/{ring_name}")
    m.close()
    r.close()


@pytest.mark.parametrize("max_record", [0, 2049 * 2, 10**9])
def test_bad_max_record_is_rejected(ring_name, max_record):
    with pytest.raises(ValueError, match="max_record"):
        Ring.create(ring_name, 8192, max_record=max_record)


@pytest.mark.parametrize("name", ["", ".hidden", "-x", "a/b", "a b", "x" * 235, "é", "a\x00b", "../etc"])
def test_bad_names_are_rejected(name):
    with pytest.raises(ValueError, match="invalid ring name"):
        validate_name(name)
    with pytest.raises(ValueError):
        Ring.create(name, 8192)


@pytest.mark.parametrize("name", ["a", "topic.chan", "t:c", "t#ephemeral", "A-b_9"])
def test_good_names(name):
    validate_name(name)


def test_create_twice_fails_unless_exist_ok(ring, ring_name):
    import posix_ipc

    with pytest.raises(posix_ipc.ExistentialError):
        Ring.create(ring_name, 8192)
    again = Ring.create(ring_name, 8192, exist_ok=True)
    assert again.capacity == ring.capacity  # attached, not re-made
    again.close()


def test_attach_missing_segment(ring_name):
    import posix_ipc

    with pytest.raises(posix_ipc.ExistentialError):
        Ring.attach(ring_name)


def test_wrong_version_is_a_clear_error(ring, ring_name):
    m = raw_map(ring_name)
    struct.pack_into("<I", m, OFF["version"], 99)
    m.close()
    with pytest.raises(RingVersionError, match="layout version 99; this build reads version 1"):
        Ring.attach(ring_name)


def test_wrong_magic_is_a_clear_error(ring, ring_name):
    m = raw_map(ring_name)
    m[0:8] = b"garbage!"
    m.close()
    with pytest.raises(RingLayoutError, match="is not an nsqshm ring"):
        Ring.attach(ring_name)


def test_wrong_size_is_a_clear_error(ring, ring_name):
    os.truncate(f"/dev/shm/{ring_name}", HEADER + 4096)
    with pytest.raises(RingLayoutError, match="the segment has 8192"):
        Ring.attach(ring_name)


def test_tiny_segment_is_a_clear_error(ring_name):
    import posix_ipc

    shm = posix_ipc.SharedMemory("/" + ring_name, posix_ipc.O_CREX, mode=0o600, size=100)
    shm.close_fd()
    with pytest.raises(RingLayoutError, match="smaller than a ring header"):
        Ring.attach(ring_name)


def test_closed_handle_raises(ring):
    ring.close()
    with pytest.raises(ValueError, match="closed"):
        ring.push(b"x")
    ring.close()  # idempotent


def test_unlink_keeps_mapping_until_close(ring, ring_name):
    other = Ring.attach(ring_name)
    assert ring.unlink() is True
    assert not os.path.exists(f"/dev/shm/{ring_name}")
    assert ring.push(b"still") == OK
    assert other.pop() == b"still"
    assert Ring.unlink_segment(ring_name) is False
    other.close()


# -- records: table-driven --------------------------------------------------------

RECORDS = [b"", b"a", b"1234567", b"12345678", b"123456789", bytes(range(256)) * 10]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: f"{len(r)}B")
def test_push_pop_round_trip(ring, record):
    assert ring.push(record) == OK
    assert ring.depth == 1
    assert ring.depth_bytes == len(record)
    assert ring.used_bytes == 8 + (len(record) + 7) // 8 * 8
    assert ring.pop() == record
    assert ring.pop() is None
    assert ring.depth == 0 and ring.used_bytes == 0


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_any_buffer_can_be_pushed(ring, kind):
    assert ring.push(kind(b"payload")) == OK
    assert ring.push_many([kind(b"a"), kind(b"bc")]) == 2
    assert ring.pop_many() == [b"payload", b"a", b"bc"]


def test_record_bytes_in_the_data_area(ring, ring_name):
    ring.push(b"abc")
    ring.push(b"")
    m = raw_map(ring_name)
    assert m[HEADER:HEADER + 24] == struct.pack("<II", 3, 0) + b"abc\0\0\0\0\0" + struct.pack("<II", 0, 0)
    assert u64(m, "tail") == 24 and u64(m, "head") == 0
    assert u64(m, "push_records") == 2 and u64(m, "push_bytes") == 3
    m.close()


def test_statuses(ring_name):
    r = Ring.create(ring_name, 4096, max_record=100)
    assert r.push(b"x" * 101) == TOO_BIG
    assert r.pop() is None
    assert r.pop_into(bytearray(10)) == EMPTY
    n = 0
    while r.push(b"y" * 100) == OK:
        n += 1
    assert n == 4096 // 112
    assert r.push(b"y" * 100) == FULL
    assert r.push(b"y" * 8) == OK  # a smaller record still fits the tail gap
    assert r.pop_into(bytearray(10)) == TOO_BIG  # too big for the buffer: it stays
    assert r.depth == n + 1
    buf = bytearray(200)
    assert r.pop_into(buf) == 100 and buf[:100] == b"y" * 100
    r.close()


def test_wrap_marker(ring_name):
    r = Ring.create(ring_name, 4096, max_record=2000)
    assert r.push(b"a" * 1500) == OK       # 0..1512
    assert r.push(b"b" * 1500) == OK       # 1512..3024
    assert r.pop() == b"a" * 1500          # head 1512
    assert r.push(b"c" * 1500) == OK       # 1072 left at the end: wrap, lands at 0
    m = raw_map(ring_name)
    assert struct.unpack_from("<I", m, HEADER + 3024)[0] == 0xFFFFFFFF
    assert struct.unpack_from("<I", m, HEADER)[0] == 1500
    assert u64(m, "tail") == 4096 + 1512
    m.close()
    assert r.pop_many() == [b"b" * 1500, b"c" * 1500]
    assert r.used_bytes == 0
    r.close()


def test_fifo_order_over_many_wraps(ring_name):
    r = Ring.create(ring_name, 4096, max_record=300)
    sent, got = [], []
    for i in range(5000):
        rec = struct.pack("<I", i) * (i % 70)
        while r.push(rec) == FULL:
            got.extend(r.pop_many(7))
        sent.append(rec)
    got.extend(r.pop_many(10**6))
    assert got == sent
    s = r.stats()
    assert s["push_records"] == s["pop_records"] == 5000
    r.close()


def test_push_many_stops_when_full_and_reports_count(ring_name):
    r = Ring.create(ring_name, 4096, max_record=1000)
    assert r.push_many([b"z" * 1000] * 10) == 4
    assert r.depth == 4
    with pytest.raises(ValueError, match="record 1 is 1001 bytes, over max_record 1000"):
        r.push_many([b"ok", b"q" * 1001])
    assert r.depth == 4  # nothing of the bad batch went in
    r.close()


def test_push_packed_and_pop_many_into(ring):
    recs = [b"one", b"", b"three!", b"x" * 300]
    packed = b"".join(struct.pack("=I", len(x)) + x for x in recs)
    assert ring.push_packed(packed) == (4, len(packed))
    buf = bytearray(ring.max_record + 4)
    n, nbytes = ring.pop_many_into(buf)
    assert (n, nbytes) == (4, len(packed))
    assert bytes(buf[:nbytes]) == packed
    assert ring.pop_many_into(buf) == (0, 0)


def test_push_packed_limits_and_errors(ring):
    packed = b"".join(struct.pack("=I", 2) + b"ab" for _ in range(5))
    assert ring.push_packed(packed, max_records=2) == (2, 12)
    for bad, msg in [(b"\x01\x00", "truncated size"), (struct.pack("=I", 9) + b"abc", "truncated record"),
                     (struct.pack("=I", 1 << 30), "over max_record")]:
        with pytest.raises(ValueError, match=msg):
            ring.push_packed(bad)
    assert ring.depth == 2


def test_a_retired_ring_refuses_a_push_packed_whole_and_wakes_a_waiting_producer(ring):
    """A broker's graceful stop retires a ring before its last drain: every push
    that succeeded is in the ring for that drain, a later one pushes nothing."""
    rec = struct.pack("=I", 3) + b"abc"
    assert ring.push_packed(rec) == (1, 7)
    other = Ring.attach(ring.name)  # (another process's handle: the header is shared)
    try:
        while ring.push_packed(rec * 64)[0]:
            pass  # full
        depth = ring.depth
        woke = []
        waiter = threading.Thread(target=lambda: woke.append(
            _raises(lambda: other.push_packed_wait(rec, timeout=10))))
        waiter.start()
        time.sleep(0.2)
        ring.retire()
        waiter.join(5)
        assert woke == [RingRetired] and other.retired
        assert u64(raw_map(ring.name), "retired") == 1  # at 176, as ring_layout.h draws it
        with pytest.raises(RingRetired, match="is retired: its broker stops"):
            other.push_packed(rec)
        assert ring.depth == depth  # nothing went in
        ring.unretire()
        ring.pop_many_into(bytearray(1 << 20))
        assert other.push_packed(rec) == (1, 7) and not other.retired
    finally:
        other.close()


def _raises(fn):
    try:
        fn()
    except Exception as err:  # noqa: BLE001 (the class is what the test looks at)
        return type(err)
    return None


def test_pop_many_into_needs_room_for_one_record(ring):
    with pytest.raises(ValueError, match="cannot hold a record"):
        ring.pop_many_into(bytearray(16))


def test_pop_many_into_stops_at_buffer_end(ring_name):
    r = Ring.create(ring_name, 8192, max_record=100)
    r.push_many([b"k" * 100] * 5)
    buf = bytearray(250)
    assert r.pop_many_into(buf) == (2, 208)
    assert r.depth == 3
    assert r.pop_many_into(buf, max_records=1) == (1, 104)
    r.close()


def test_corrupt_record_header_raises_not_crashes(ring, ring_name):
    ring.push(b"abc")
    m = raw_map(ring_name)
    struct.pack_into("<I", m, HEADER, 0x7FFFFFF0)
    m.close()
    with pytest.raises(RingCorruptError, match="record of 2147483632 bytes"):
        ring.pop()


# -- waiting ---------------------------------------------------------------------

def test_pop_wait_times_out(ring):
    t = time.monotonic()
    assert ring.pop_wait(timeout=0.2) is None
    assert ring.pop_many_wait(timeout=0.05) == []
    assert ring.pop_many_into_wait(bytearray(1 << 16), timeout=0.05) == (0, 0)
    assert time.monotonic() - t >= 0.29


def test_push_wait_times_out_when_full(ring_name):
    r = Ring.create(ring_name, 4096, max_record=2000)
    assert r.push_wait(b"a" * 2000, timeout=0.1) == OK
    assert r.push_wait(b"a" * 2000, timeout=0.1) == OK
    assert r.push_wait(b"a" * 2000, timeout=0.1) == FULL
    assert r.push_wait(b"a" * 2001, timeout=5) == TOO_BIG  # at once, no wait
    r.close()


def _pop_one_blocking(name, q):
    r = Ring.attach(name)
    t = time.monotonic()
    rec = r.pop_wait(timeout=20)
    q.put((rec, time.monotonic() - t))
    r.close()


def test_push_wakes_a_consumer_in_another_process(ring, ring_name):
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_pop_one_blocking, args=(ring_name, q))
    p.start()
    time.sleep(1.0)  # let it block
    ring.push(b"wake up")
    rec, waited = q.get(timeout=20)
    p.join(10)
    assert rec == b"wake up"
    assert waited < 15  # woken by the push, not by its 20 s timeout


def _push_when_room(name, q):
    r = Ring.attach(name)
    q.put(r.push_wait(b"late" * 500, timeout=20))
    r.close()


def test_pop_wakes_a_producer_waiting_for_room(ring_name):
    r = Ring.create(ring_name, 4096, max_record=2000)
    assert r.push_many([b"f" * 2000] * 2) == 2
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_push_when_room, args=(ring_name, q))
    p.start()
    time.sleep(1.0)
    assert r.pop() == b"f" * 2000
    assert q.get(timeout=20) == OK
    p.join(10)
    assert r.pop_many() == [b"f" * 2000, b"late" * 500]
    r.close()


def _idle_consumer(name):
    r = Ring.attach(name)
    r.pop_wait(timeout=30)


def test_blocked_consumer_uses_no_cpu(ring, ring_name):
    ctx = multiprocessing.get_context("spawn")
    p = ctx.Process(target=_idle_consumer, args=(ring_name,))
    p.start()
    proc = psutil.Process(p.pid)
    time.sleep(1.5)  # interpreter start-up is over; it now sleeps in poll()
    before = proc.cpu_times()
    time.sleep(2.0)
    after = proc.cpu_times()
    used = (after.user - before.user) + (after.system - before.system)
    ring.push(b"done")
    p.join(10)
    assert p.exitcode == 0
    assert used < 0.02, f"blocked consumer used {used:.3f} s of CPU in 2 s"


def _spawned_worker(name, out_name):
    r = Ring.attach(name)
    out = Ring.attach(out_name)
    recs = r.pop_many_wait(timeout=10)
    out.push_many([b"echo:" + x for x in recs])


def test_attach_from_a_spawned_process(ring, ring_name):
    out_name = ring_name + ".out"
    out = Ring.create(out_name, 8192)
    try:
        ring.push_many([b"a", b"b"])
        ctx = multiprocessing.get_context("spawn")
        p = ctx.Process(target=_spawned_worker, args=(ring_name, out_name))
        p.start()
        p.join(30)
        assert p.exitcode == 0
        assert out.pop_many() == [b"echo:a", b"echo:b"]
    finally:
        out.close()
        Ring.unlink_segment(out_name)


def test_handle_pickles_as_attach(ring):
    import pickle

    other = pickle.loads(pickle.dumps(ring))
    other.push(b"via pickle")
    assert ring.pop() == b"via pickle"
    other.close()


def test_forked_child_gets_its_own_waiter_slot(ring, ring_name):
    fd_parent = ring.fileno()
    pid = os.fork()
    if pid == 0:  # child: the inherited handle must claim a new slot
        code = 0
        try:
            if ring.fileno() == fd_parent and ring.stats()["waiters"] != 2:
                code = 1
            elif ring.stats()["waiters"] != 2:
                code = 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_stale_waiter_slot_of_dead_process_is_reaped(ring, ring_name):
    pid = os.fork()
    if pid == 0:
        ring.arm()  # claims a slot and sets its bit, then dies without cleanup
        os.kill(os.getpid(), 9)
    os.waitpid(pid, 0)
    assert ring.stats()["waiters"] == 1
    assert ring.push(b"x") == OK  # the wake finds no reader and frees the slot
    assert ring.stats()["waiters"] == 0
    assert not [e for e in os.listdir("/dev/shm") if e.startswith(ring_name + ".w")]


# -- death of a lock holder ---------------------------------------------------------

def _die_holding(ring, side, mutate=None):
    pid = os.fork()
    if pid == 0:
        ring._lock_and_leave(side)
        if mutate:
            mutate()
        os.kill(os.getpid(), 9)
    os.waitpid(pid, 0)


def test_producer_dying_with_the_lock_does_not_wedge(ring):
    ring.push(b"before")
    _die_holding(ring, "prod")
    assert ring.push(b"after") == OK
    assert ring.pop_many() == [b"before", b"after"]
    assert ring.stats()["recoveries"] == 1


def test_consumer_dying_with_the_lock_does_not_wedge(ring):
    ring.push_many([b"1", b"2"])
    _die_holding(ring, "cons")
    assert ring.pop_many() == [b"1", b"2"]
    assert ring.stats()["recoveries"] == 1


def test_producer_dying_before_its_commit_leaves_nothing(ring, ring_name):
    ring.push(b"kept")
    m = raw_map(ring_name)

    def half_done():  # record bytes and journal written, tail not stored
        struct.pack_into("<II3s", m, HEADER + 16, 3, 0, b"bad")
        struct.pack_into("<Q", m, OFF["j_tail"], 32)
        struct.pack_into("<Q", m, OFF["j_tail"] + 8, 2)

    _die_holding(ring, "prod", half_done)
    assert ring.push(b"next") == OK
    assert ring.pop_many() == [b"kept", b"next"]
    s = ring.stats()
    assert s["push_records"] == 2 and s["depth"] == 0
    m.close()


def test_producer_dying_after_its_commit_keeps_the_record(ring, ring_name):
    ring.push(b"kept")
    m = raw_map(ring_name)

    def committed_no_counters():  # tail stored, counters not yet
        struct.pack_into("<II3s", m, HEADER + 16, 3, 0, b"new")
        struct.pack_into("<QQQ", m, OFF["j_tail"], 32, 2, 7)
        struct.pack_into("<Q", m, OFF["tail"], 32)

    _die_holding(ring, "prod", committed_no_counters)
    assert ring.depth == 0 + 1  # counters lag until the next lock holder repairs them
    assert ring.push(b"next") == OK
    s = ring.stats()
    assert s["push_records"] == 3 and s["push_bytes"] == 11
    assert ring.pop_many() == [b"kept", b"new", b"next"]
    m.close()


def test_peek_then_discard(ring):
    ring.push_many([b"a", b"bb", b"ccc"])
    buf = bytearray(ring.max_record + 4)
    assert ring.peek_many_into(buf, 2) == (2, 4 + 1 + 4 + 2)
    assert ring.depth == 3  # still there
    assert ring.peek_many_into(buf) == (3, 18)
    assert ring.discard(2) == 2
    assert ring.pop_many() == [b"ccc"]
    assert ring.discard(5) == 0
    s = ring.stats()
    assert s["pop_records"] == 3 and s["depth"] == 0


def test_unlink_removes_only_its_own_fifos_never_a_ring_whose_name_extends_it(ring_name):
    """Ring 'x' beside rings 'x.w' and 'x.w00-0123456789abcdef' (topics 'a'
    and 'a.w' are both valid): unlinking x must leave the others whole."""
    ring = Ring.create(ring_name, 4096)
    others = [Ring.create(ring_name + suffix, 4096)
              for suffix in (".w", ".w00-0123456789abcdef", ".wx")]
    for r in [ring, *others]:
        r.fileno()  # each makes its waiter FIFO
    fifos = [n for n in os.listdir("/dev/shm") if n.startswith(ring_name)]
    assert len(fifos) == 8
    ring.close()
    assert Ring.unlink_segment(ring_name)
    left = sorted(n for n in os.listdir("/dev/shm") if n.startswith(ring_name))
    assert len(left) == 6
    for r in others:
        assert r.name in left
        r.close()
        assert Ring.unlink_segment(r.name)
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(ring_name)]


def test_unlink_removes_the_fifos_of_live_and_dead_waiters(ring_name):
    """The waiters' FIFOs are found from the header's slots: a handle still
    armed here, and one whose process was killed while armed."""
    ring = Ring.create(ring_name, 4096)
    pid = os.fork()
    if pid == 0:
        waiter = Ring.attach(ring_name)
        waiter.arm()
        os.kill(os.getpid(), 9)
    os.waitpid(pid, 0)
    live = Ring.attach(ring_name)
    live.arm()
    assert len([n for n in os.listdir("/dev/shm") if n.startswith(ring_name + ".w")]) == 2
    assert Ring.unlink_segment(ring_name)
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(ring_name)]
    live.close()
    ring.close()


def test_unlink_of_a_segment_that_is_not_a_ring_still_takes_its_fifos(ring_name):
    """A name whose segment is not a ring (no magic) has no slots to read:
    its FIFOs are looked for in /dev/shm, and only its own."""
    with open(f"/dev/shm/{ring_name}", "wb") as f:
        f.write(b"\0" * 4096)
    fifo = f"/dev/shm/{ring_name}.w03-00000001deadbeef"
    os.mkfifo(fifo, 0o600)
    other = Ring.create(ring_name + ".wx", 4096)
    other.arm()
    assert Ring.unlink_segment(ring_name)
    assert not os.path.exists(fifo)
    assert len([n for n in os.listdir("/dev/shm") if n.startswith(ring_name + ".wx")]) == 2
    other.close()
    assert Ring.unlink_segment(other.name)


def test_stale_fifos_of_rings_that_are_gone_are_removed(ring_name):
    """A FIFO whose ring is gone (its waiter died after the ring was unlinked)
    goes; a live ring's waiter keeps its FIFO; other prefixes are not looked at."""
    ring = Ring.create(ring_name + ".t.kept", 4096)
    ring.arm()
    stale = f"/dev/shm/{ring_name}.t.gone.w05-00000001deadbeef"
    os.mkfifo(stale, 0o600)
    other = f"/dev/shm/{ring_name}x.t.gone.w05-00000001deadbeef"  # another broker's prefix
    os.mkfifo(other, 0o600)
    try:
        assert Ring.remove_stale_fifos(ring_name) == 1
        assert not os.path.exists(stale) and os.path.exists(other)
        assert len([n for n in os.listdir("/dev/shm") if n.startswith(ring_name + ".t.kept.w")]) == 1
    finally:
        os.unlink(other)
        ring.close()
        Ring.unlink_segment(ring.name)


def test_the_longest_name_fits_with_its_waiter_fifo(ring_name):
    """nsqd's longest names (64 + #ephemeral each) on a long --shm-prefix."""
    from nsqshm._core.ring import NAME_MAX_LEN

    name = (ring_name + ".c." + "t" * 300)[:NAME_MAX_LEN]
    ring = Ring.create(name, 4096)
    ring.fileno()  # its FIFO: the name plus 21 characters, within 255
    ring.push(b"x")
    assert ring.pop() == b"x"
    ring.close()
    assert Ring.unlink_segment(name)
    with pytest.raises(ValueError):
        Ring.create(name + "t", 4096)


def test_subscriber_count_is_shared_by_every_handle(ring, ring_name):
    other = Ring.attach(ring_name)
    try:
        assert ring.subscribers == 0
        assert ring.add_subscribers(1) == 1
        assert other.add_subscribers(1) == 2
        assert ring.add_subscribers(-1) == 1
        assert other.subscribers == 1
        other.subscribers = 0  # a starting worker's recount
        assert ring.subscribers == 0
    finally:
        other.close()
