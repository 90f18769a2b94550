"""A channel's cursor in a log partition: out-of-order finishes, the window,
checkpoints, processes killed while using it."""

import os
import random
import signal
import struct
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from nsqshm._core.commitlog import crc32c
from nsqshm._core.logcursor import (
    ALREADY,
    CHECKPOINT_MAGIC_V1,
    FINISHED,
    OUT_OF_WINDOW,
    RETRY_ENTRY,
    RETRY_SLOTS,
    SEEK_HOLDS,
    SEEKS_MOVED,
    STALE,
    Cursor,
    CursorError,
    CursorSet,
    checkpoint_path,
    decode_message_id,
    log_message_id,
    validate_name,
    window_offsets,
)


@pytest.fixture
def cursor_args(tmp_path):
    name = f"nsqshm-test-cursor-{os.getpid()}-{random.getrandbits(32):08x}"
    yield name, str(tmp_path / "ch.cursor")
    try:
        os.unlink(f"/dev/shm/{name}")
    except FileNotFoundError:
        pass


def test_segment_is_0600(cursor_args):
    name, ckpt = cursor_args
    Cursor.open(name, ckpt).close()
    assert os.stat(f"/dev/shm/{name}").st_mode & 0o777 == 0o600


@pytest.mark.parametrize("finishes,confirmed,above", [
    ([], 100, 0),
    ([100], 101, 0),
    ([101, 102], 100, 2),
    ([101, 102, 100], 103, 0),
    ([105, 103, 101, 100], 102, 2),
    ([105, 103, 101, 100, 102, 104], 106, 0),
    ([99, 100], 101, 0),                      # below confirmed: already finished
])
def test_out_of_order_finishes(cursor_args, finishes, confirmed, above):
    c = Cursor.open(*cursor_args, start_offset=100, window_bits=256)
    for o in finishes:
        assert c.finish(o) in (FINISHED, ALREADY)
    assert (c.confirmed, c.finished_above) == (confirmed, above)
    for o in range(95, 120):
        assert c.is_finished(o) == (o < confirmed or o in finishes)
    c.close()


def test_finish_results(cursor_args):
    c = Cursor.open(*cursor_args, start_offset=0, window_bits=64)
    assert c.finish(5) == FINISHED
    assert c.finish(5) == ALREADY
    assert c.finish(0) == FINISHED and c.confirmed == 1
    assert c.finish(0) == ALREADY
    assert c.finish(65) == OUT_OF_WINDOW      # confirmed 1: the window is [1, 65)
    assert c.finish(64) == FINISHED
    assert c.finish(1000) == OUT_OF_WINDOW
    c.close()


def test_window_overflow_holds_delivery_until_the_oldest_is_finished(cursor_args):
    c = Cursor.open(*cursor_args, start_offset=1000, window_bits=128)
    for o in range(1001, 1128):
        assert c.finish(o) == FINISHED
    assert c.window_end == 1128
    assert c.finish(1128) == OUT_OF_WINDOW
    assert c.next_unfinished(1001, 5000) == -1          # nothing deliverable past 1000
    assert c.next_unfinished(0, 5000) == 1000
    assert c.finish(1000) == FINISHED
    assert c.confirmed == 1128 and c.finished_above == 0
    assert c.finish(1128) == FINISHED and c.confirmed == 1129
    # the window's bits were cleared as it moved: nothing is finished by wrap-around
    assert [c.is_finished(o) for o in range(1129, 1129 + 300)] == [False] * 300
    c.close()


def test_advance_across_words_and_wrap(cursor_args):
    c = Cursor.open(*cursor_args, start_offset=50, window_bits=256)
    rnd = random.Random(3)
    done = set()
    for _ in range(20):
        base = c.confirmed
        batch = list(range(base, base + rnd.randrange(1, 255)))
        rnd.shuffle(batch)
        for o in batch:
            assert c.finish(o) == FINISHED
            done.add(o)
        assert c.confirmed == max(done) + 1 and c.finished_above == 0
    c.close()


def test_next_unfinished_and_unfinished_into(cursor_args):
    c = Cursor.open(*cursor_args, start_offset=10, window_bits=256)
    for o in [11, 12, 14] + list(range(20, 200)):
        c.finish(o)
    assert c.next_unfinished(0, 1000) == 10
    assert c.next_unfinished(11, 1000) == 13
    assert c.next_unfinished(15, 20) == 15
    assert c.next_unfinished(20, 200) == -1            # the log ends at 200
    assert c.next_unfinished(20, 1000) == 200
    out = bytearray(8 * 8)
    n = c.unfinished_into(0, 1000, out)
    got = [int.from_bytes(out[8 * k:8 * k + 8], sys.byteorder) for k in range(n)]
    assert got == [10, 13, 15, 16, 17, 18, 19, 200]
    c.close()


def test_finish_many(cursor_args):
    c = Cursor.open(*cursor_args, start_offset=0, window_bits=64)
    offsets = b"".join(o.to_bytes(8, sys.byteorder) for o in (2, 1, 1, 0, 500, 4))
    assert c.finish_many(offsets) == 4            # 1 twice, 500 out of the window
    assert c.confirmed == 3 and c.is_finished(4) and not c.is_finished(500)
    c.close()


def test_set_moves_and_clears(cursor_args):
    c = Cursor.open(*cursor_args, start_offset=0, window_bits=64)
    c.finish(3)
    c.set(500)
    assert c.confirmed == 500 and c.finished_above == 0
    assert not c.is_finished(500) and not c.is_finished(503)
    c.set(2)
    assert not c.is_finished(3)
    c.close()


def test_a_snapshot_read_back_gives_the_finished_offsets(cursor_args):
    """snapshot() (what a leader sends its followers) and window_offsets (what a
    follower finishes from it): the offsets above confirmed finished, across the
    window's wrap, below an end; another cursor takes them (finish_many)."""
    c = Cursor.open(*cursor_args, start_offset=60, window_bits=64)
    for o in (61, 62, 100, 123):  # 123: past the wrap of a 64-bit window from 60
        assert c.finish(o) == FINISHED
    confirmed, window = c.snapshot()
    assert (confirmed, len(window)) == (60, 8)
    got = window_offsets(confirmed, window, 1000)
    assert sorted(struct.unpack(f"={len(got) // 8}Q", got)) == [61, 62, 100, 123]
    got = window_offsets(confirmed, window, 101)  # an end below some: left out
    assert sorted(struct.unpack(f"={len(got) // 8}Q", got)) == [61, 62, 100]
    assert window_offsets(7, bytes(8), 100) == bytearray()
    with pytest.raises(ValueError):
        window_offsets(0, bytes(12), 100)  # 96 bits: not a power of two
    c.close()


def test_checkpoint_and_reopen(cursor_args):
    name, ckpt = cursor_args
    c = Cursor.open(name, ckpt, start_offset=7, window_bits=1024)
    for o in (7, 8, 10, 500):
        c.finish(o)
    assert c.checkpoint() == 9
    assert os.stat(ckpt).st_mode & 0o777 == 0o600
    c.finish(9)        # after the checkpoint: in shm only
    c.close()
    again = Cursor.open(name, ckpt, start_offset=0, window_bits=1024)   # the segment is there
    assert again.confirmed == 11
    again.close()
    os.unlink(f"/dev/shm/{name}")                  # as after a reboot
    again = Cursor.open(name, ckpt, start_offset=0, window_bits=1024)
    assert again.confirmed == 9 and again.is_finished(10) and again.is_finished(500)
    assert not again.is_finished(9) and again.finished_above == 2
    again.unlink()
    again.close()
    assert not os.path.exists(ckpt) and not os.path.exists(f"/dev/shm/{name}")


def test_corrupt_checkpoint_is_refused(cursor_args):
    name, ckpt = cursor_args
    c = Cursor.open(name, ckpt, start_offset=7, window_bits=64)
    c.checkpoint()
    c.close()
    os.unlink(f"/dev/shm/{name}")
    data = bytearray(open(ckpt, "rb").read())
    data[14] ^= 1
    open(ckpt, "wb").write(data)
    with pytest.raises(CursorError):
        Cursor.open(name, ckpt)


def test_a_checkpoint_keeps_the_retry_table(cursor_args):
    name, ckpt = cursor_args
    c = Cursor.open(name, ckpt, start_offset=0, window_bits=1024)
    c.note_retry(3, 2)
    c.note_retry(5, 1, 1_800_000_000_000)
    c.note_retry(6, 4)
    c.finish(6)
    c.checkpoint()
    c.close()
    os.unlink(f"/dev/shm/{name}")                  # as after a graceful stop
    again = Cursor.open(name, ckpt, window_bits=1024, hold_retries=True)
    assert again.created and again.held            # made held: its maker takes them up
    assert again.retries() == struct.pack(">QHq", 3, 2, 0) + struct.pack(
        ">QHq", 5, 1, 1_800_000_000_000)
    other = Cursor.open(name, ckpt, window_bits=1024, hold_retries=True)
    assert not other.created and other.held
    other.close()
    again.set(0)                                   # a seek: what was put back is forgotten
    assert again.retries() == b"" and again.retry_stats[1] == 0 and not again.held
    again.checkpoint()                             # nothing to keep: the first layout
    assert open(ckpt, "rb").read(8) == CHECKPOINT_MAGIC_V1
    again.close()


def test_a_checkpoint_of_the_first_layout_is_read(cursor_args):
    name, ckpt = cursor_args
    window = bytearray(128)
    window[0] = 0b100                              # offset 2 finished above confirmed 0
    body = (0).to_bytes(8, "big") + (1024).to_bytes(4, "big") + bytes(window)
    with open(ckpt, "wb") as f:
        f.write(CHECKPOINT_MAGIC_V1 + crc32c(body).to_bytes(4, "big") + body)
    c = Cursor.open(name, ckpt, window_bits=1024)
    assert c.confirmed == 0 and c.is_finished(2) and c.retries() == b""
    c.close()


@pytest.mark.parametrize("name", ["", ".x", "-x", "a/b", "a" * 201, "é"])
def test_bad_segment_names(cursor_args, name):
    with pytest.raises(ValueError):
        validate_name(name)


@pytest.mark.parametrize("channel,ok", [
    ("..", True), (".", True), ("c" * 64, True), ("c#ephemeral", True),
    ("", False), ("c" * 65, False), ("a/b", False), ("../x", False),
])
def test_checkpoint_names(tmp_path, channel, ok):
    if ok:
        path = checkpoint_path(str(tmp_path), channel)
        assert os.path.dirname(path) == str(tmp_path)
        assert os.path.basename(path) not in (".", "..")
    else:
        with pytest.raises(ValueError):
            checkpoint_path(str(tmp_path), channel)


DIES_MID_ADVANCE = textwrap.dedent("""
    import sys
    from nsqshm._core.logcursor import Cursor
    c = Cursor.open(sys.argv[1], sys.argv[2], 0, 64)
    c._finish_and_die_mid_advance(0)
""")


def test_holder_killed_mid_advance_is_repaired(cursor_args):
    """A process killed holding the lock, after storing the new confirmed
    offset and before clearing the bits it passed: the next locker clears
    them (else offsets a window later would read as finished)."""
    name, ckpt = cursor_args
    c = Cursor.open(name, ckpt, 0, 64)
    for o in range(1, 10):
        c.finish(o)
    proc = subprocess.run([sys.executable, "-c", DIES_MID_ADVANCE, name, ckpt])
    assert proc.returncode == -signal.SIGKILL
    assert c.confirmed == 10
    assert [c.is_finished(o) for o in range(64, 74)] == [False] * 10
    assert c.recoveries == 1 and c.finished_above == 0
    assert c.finish(10) == FINISHED and c.confirmed == 11
    c.close()


FINISHER = textwrap.dedent("""
    import sys
    from nsqshm._core.logcursor import Cursor
    name, ckpt, first, step = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    c = Cursor.open(name, ckpt, 0, 1 << 16)
    o = first
    while True:
        r = c.finish(o)
        if r == -1:
            continue  # out of the window: the other process is behind
        print(o, flush=True)
        o += step
""")


def _drain(proc, reported, k):
    for line in proc.stdout:
        if line.endswith("\n"):
            reported[k] = int(line)


def test_processes_killed_while_finishing(cursor_args):
    """Two processes finish the even and odd offsets; each is SIGKILLed at
    random moments (maybe holding the lock) and restarted from what it
    reported.  The cursor stays usable and consistent: every reported
    finish is finished, and confirmed never passes an unfinished offset."""
    name, ckpt = cursor_args
    Cursor.open(name, ckpt, 0, 1 << 16).close()
    reported = {0: -2, 1: -1}
    for _ in range(6):
        procs = [subprocess.Popen([sys.executable, "-c", FINISHER, name, ckpt,
                                   str(reported[k] + 2), "2"], stdout=subprocess.PIPE, text=True)
                 for k in (0, 1)]
        # both pipes are drained all the time: a finisher blocked on a full
        # pipe would hold the other one at the window's end
        threads = [threading.Thread(target=_drain, args=(p, reported, k))
                   for k, p in enumerate(procs)]
        for t in threads:
            t.start()
        time.sleep(random.uniform(0.2, 0.4))
        for p in procs:
            p.send_signal(signal.SIGKILL)
            p.wait()
        for t in threads:
            t.join()
        c = Cursor.open(name, ckpt)
        lo = min(reported.values())
        assert c.confirmed >= lo
        for o in range(max(0, lo - 100), max(reported.values()) + 1):
            if o <= reported[o % 2]:
                assert c.is_finished(o), o
        nxt = c.next_unfinished(0, 1 << 62)
        assert nxt == c.confirmed and not c.is_finished(nxt)
        recoveries = c.recoveries
        c.close()
    print(f"locks taken over from a killed holder: {recoveries}")
    # offsets the killed processes finished but had not reported are finished
    # too (or will be redelivered): a restarted finisher starts at its report


def test_read_pos_is_shared_and_never_below_confirmed(cursor_args):
    name, ckpt = cursor_args
    a = Cursor.open(name, ckpt, 10)
    b = Cursor.open(name, ckpt)
    assert a.read_pos == 10  # a new segment: from confirmed
    a.read_pos = 25
    assert b.read_pos == 25
    b.set(40)  # a seek moves the reader too
    assert a.read_pos == 40 and a.confirmed == 40
    a.read_pos = 5
    assert a.read_pos == 40
    a.checkpoint()
    a.close()
    b.close()
    os.unlink(f"/dev/shm/{name}")
    c = Cursor.open(name, ckpt)  # from the checkpoint: read from confirmed again
    assert (c.confirmed, c.read_pos) == (40, 40)
    c.close()


def test_unfinished_run_steps_over_finished_offsets(cursor_args):
    name, ckpt = cursor_args
    cur = Cursor.open(name, ckpt, 0, window_bits=128)
    assert cur.unfinished_run(0, 50) == (0, 50)
    for o in (0, 1, 5, 6, 7, 20):
        cur.finish(o)
    assert cur.confirmed == 2
    assert cur.unfinished_run(0, 50) == (2, 3)
    assert cur.unfinished_run(5, 50) == (8, 12)
    assert cur.unfinished_run(21, 50) == (21, 29)
    assert cur.unfinished_run(50, 50) == (-1, 0)
    assert cur.unfinished_run(100, 1000) == (100, 30)  # up to the window's end (2 + 128)
    for o in range(2, 5):
        cur.finish(o)
    for o in range(8, 20):
        cur.finish(o)
    assert cur.unfinished_run(0, 21) == (-1, 0)  # all finished up to the end
    cur.close()


def test_cursor_set_finishes_by_position_id(cursor_args):
    name, ckpt = cursor_args
    cur = Cursor.open(name, ckpt, 0)
    cursors = CursorSet(4)
    cursors[3] = cur
    assert decode_message_id(log_message_id(3, 12345)) == (3, 12345)
    assert decode_message_id(b"0123456789abcdeg") is None
    assert decode_message_id(b"short") is None
    assert cursors.finish(log_message_id(3, 1)) == FINISHED
    assert cursors.finish(log_message_id(3, 1)) == ALREADY
    assert cursors.finish(log_message_id(3, 0)) == FINISHED
    assert cur.confirmed == 2
    assert cursors.finish(log_message_id(2, 0)) == -1       # no cursor for partition 2
    assert cursors.finish(log_message_id(9, 0)) == -1       # no partition 9
    assert cursors.finish(b"not a hex id !!!") == -1
    assert cursors.finish(log_message_id(3, 1 << 20)) == OUT_OF_WINDOW
    with pytest.raises(TypeError):
        cursors[0] = "x"
    cur.close()


def test_fin_lines_marks_the_cursor(cursor_args):
    """wire.fin_lines: a window of FINs finishes in flight and in the cursor,
    in C; it stops at a message not in flight."""
    from nsqshm._core.inflight import InFlight
    from nsqshm._core.wire import fin_lines

    name, ckpt = cursor_args
    cur = Cursor.open(name, ckpt, 0)
    cursors = CursorSet(1)
    cursors[0] = cur
    inflight = InFlight()
    records = bytearray()
    for o in range(4):
        msg = struct.pack(">QH", 1, 1) + log_message_id(0, o) + b"body"
        records += struct.pack("=I", len(msg)) + msg
    inflight.deliver(records, 4, bytearray(), 7, time.monotonic_ns() + 10**10)
    buf = bytearray(b"".join(b"FIN " + log_message_id(0, o) + b"\n" for o in (1, 0, 3, 9)))
    pos, n = fin_lines(buf, 0, inflight, 7, cursors)
    assert (pos, n) == (63, 3)
    assert cur.confirmed == 2 and cur.is_finished(3) and not cur.is_finished(2)
    _assert_unlocked(name)  # (the batch held it across the FINs: let go at the end)
    cur.close()


def _assert_unlocked(name):
    """Another process can take the cursor's lock now (a batch of FINs held it)."""
    code = ("import sys; from nsqshm._core.logcursor import Cursor; "
            f"c = Cursor.attach({name!r}); c.lock(); c.unlock(); print('free')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=10)
    assert out.stdout.strip() == "free", out.stderr


def test_a_batch_of_fins_across_partitions_locks_one_cursor_at_a_time(tmp_path):
    """finish_frames (a local consumer's batch): runs of FINs by partition, each
    run under one lock of its cursor; every cursor free after the batch, also
    when a FIN in it fails."""
    from nsqshm._core.inflight import InFlight
    from nsqshm._core.localbatch import finish_frames

    names = [f"nsqshm-test-cursor-{os.getpid()}-{random.getrandbits(32):08x}" for _ in range(2)]
    cursors = CursorSet(2)
    try:
        for i, name in enumerate(names):
            cursors[i] = Cursor.open(name, str(tmp_path / f"c{i}.cursor"), 0)
        inflight = InFlight()
        records = bytearray()
        order = [(0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (1, 2)]
        for part, o in order:
            msg = struct.pack(">QH", 1, 1) + log_message_id(part, o) + b"body"
            records += struct.pack("=I", len(msg)) + msg
        out = bytearray()
        inflight.deliver(records, len(order), out, 7, time.monotonic_ns() + 10**10)
        starts, pos = [], 0
        while pos < len(out):  # frames: [u32 size][u32 type][message]
            starts.append(pos + 8)
            pos += 4 + struct.unpack_from(">I", out, pos)[0]
        starts = struct.pack(f"={len(starts)}q", *starts)
        assert finish_frames(inflight, out, starts, len(order), 7, cursors) == 6
        assert [cursors[i].confirmed for i in range(2)] == [3, 3]
        for name in names:
            _assert_unlocked(name)
        assert finish_frames(inflight, out, starts, len(order), 7, cursors) == 0  # not in flight
        for name in names:
            _assert_unlocked(name)
    finally:
        for i in range(2):
            if cursors[i] is not None:
                cursors[i].close()
        for name in names:
            os.unlink(f"/dev/shm/{name}")


def test_finish_records_marks_each_packed_record(cursor_args):
    """CursorSet.finish_records: packed [u32 size][message] records that left
    the channel without a FIN, finished in one C loop; a torn buffer is an
    error, not a read past its end."""
    name, ckpt = cursor_args
    cur = Cursor.open(name, ckpt, 0)
    cursors = CursorSet(1)
    cursors[0] = cur
    records = bytearray()
    for o in (2, 0, 1, 2):  # the second 2 is finished already
        msg = struct.pack(">QH", 1, 1) + log_message_id(0, o) + b"x" * o
        records += struct.pack("=I", len(msg)) + msg
    assert cursors.finish_records(records) == 3
    assert cur.confirmed == 3
    assert cursors.finish_records(b"") == 0
    with pytest.raises(ValueError, match="a record of 100 bytes at byte 0"):
        cursors.finish_records(struct.pack("=I", 100) + bytes(30))
    with pytest.raises(ValueError, match="a record of 4 bytes"):
        cursors.finish_records(struct.pack("=I", 4) + bytes(4))
    with pytest.raises(ValueError, match="cut short at byte 0"):
        cursors.finish_records(b"\x01\x00")
    cur.close()


def test_drain_stale_takes_out_only_what_a_move_left_behind(cursor_args):
    """InFlight.drain_stale with CursorSet.stale_id: a held partition's
    messages and those below a confirmed offset go; the rest stay in flight."""
    from nsqshm._core.inflight import InFlight

    name, ckpt = cursor_args
    c0 = Cursor.open(name, ckpt, 0)
    c1 = Cursor.open(name + "b", ckpt + "b", 0)
    try:
        cursors = CursorSet(2)
        cursors[0], cursors[1] = c0, c1
        inflight = InFlight()
        records = bytearray()
        for partition, offset in ((0, 0), (0, 1), (0, 2), (1, 0), (1, 1)):
            msg = struct.pack(">QH", 1, 1) + log_message_id(partition, offset) + b"body"
            records += struct.pack("=I", len(msg)) + msg
        inflight.deliver(records, 5, bytearray(), 7, time.monotonic_ns() + 10**10)
        c0.finish(0)           # confirmed 1 in partition 0: offset 0 is stale
        assert inflight.drain_stale(cursors, bytearray(1 << 16))[0] == 1
        inflight.release()
        c0.finish(1)
        c1.hold()               # partition 1 held by a seek: all of it is stale
        assert cursors.is_stale(log_message_id(1, 5)) and cursors.is_stale(log_message_id(0, 1))
        assert not cursors.is_stale(log_message_id(0, 2)) and not cursors.is_stale(b"x" * 16)
        buf = bytearray(1 << 16)
        n, nbytes = inflight.drain_stale(cursors, buf)
        assert n == 3
        got = sorted(decode_message_id(buf[pos + 14:pos + 30])
                     for pos in range(0, nbytes, nbytes // 3))
        assert got == [(0, 1), (1, 0), (1, 1)]
        inflight.release()
        assert len(inflight) == 1 and inflight.drain_stale(cursors, buf) == (0, 0)
        with pytest.raises(ValueError, match="cannot hold"):
            c0.set(5)
            inflight.drain_stale(cursors, bytearray(8))
    finally:
        c0.unlink()
        c1.unlink()
        c0.close()
        c1.close()


def test_attach_takes_the_brokers_segment_only(cursor_args):
    name, ckpt = cursor_args
    with pytest.raises(CursorError, match="does not exist"):
        Cursor.attach(name)
    owner = Cursor.open(name, ckpt, 5)
    client = Cursor.attach(name)
    assert client.finish(5) == FINISHED and owner.confirmed == 6
    with pytest.raises(CursorError, match="no checkpoint file here"):
        client.checkpoint()
    client.close()
    owner.close()


def test_unfinished_run_stops_at_max_run(cursor_args):
    c = Cursor.open(*cursor_args, start_offset=0, window_bits=256)
    c.finish(10)
    assert c.unfinished_run(0, 200) == (0, 10)
    assert c.unfinished_run(0, 200, 4) == (0, 4)
    assert c.unfinished_run(3, 200, 100) == (3, 7)
    assert c.unfinished_run(10, 200, 5) == (11, 5)
    assert c.unfinished_run(11, 200, -1) == (11, 189)


def test_hold_keeps_confirmed_and_what_was_finished_above(cursor_args):
    """A rewind (a partition moved to its own lane): read_pos held, then
    released at confirmed; unlike set(hold=True) nothing finished is lost."""
    c = Cursor.open(*cursor_args, start_offset=0, window_bits=256)
    for o in (0, 1, 5, 6):
        c.finish(o)
    c.read_pos = 9
    c.hold()
    assert c.held and (c.confirmed, c.finished_above) == (2, 2)
    c.read_pos = 12  # a feeder's store does not undo the hold
    assert c.held
    c.release(c.confirmed)
    assert not c.held and c.read_pos == 2
    assert c.unfinished_run(c.read_pos, 20) == (2, 3)
    assert c.unfinished_run(5, 20) == (7, 13)



def test_a_finish_while_a_seek_holds_the_cursor_marks_nothing(cursor_args):
    """set(hold=True) resets the window for the new offset; until release(), a
    finish is of a message delivered from the old position (a worker has not
    taken it out of flight yet): it marks nothing, else that message would be
    skipped after the seek.  A rewind's hold (hold()) keeps marking: the
    messages are the same either side of it."""
    c = Cursor.open(*cursor_args, start_offset=0, window_bits=256)
    c.read_pos = 40
    c.set(10, hold=True)
    assert c.held and c.finish(12) == ALREADY and c.finish(10) == ALREADY
    c.hold()  # (a rewind meeting the seek: still the seek's hold)
    assert c.finish(11) == ALREADY
    c.release(10)
    assert (c.confirmed, c.finished_above, c.read_pos) == (10, 0, 10)
    assert c.unfinished_run(10, 20) == (10, 10)
    assert c.finish(12) == FINISHED
    c.hold()
    assert c.finish(10) == FINISHED and c.confirmed == 11
    c.release(c.confirmed)
    assert (c.confirmed, c.finished_above) == (11, 1)


def test_a_guarded_set_marks_nothing_of_copies_taken_before_a_seek(cursor_args):
    """A local consumer's CursorSet (guard_seeks) remembers each cursor's
    seek count: after a seek -- any set(), held or not -- a FIN of its
    partition marks nothing (STALE) until seeks_moved() says which partitions
    moved (the consumer drops its copies of them); seek_state says, for a
    take from a ring, whether a seek holds a cursor or was made since.  An
    unguarded set (a worker's) marks as before.  Only a seek (set with a
    hold) counts: retention's move to the log start leaves the copies above
    it valid (found in review)."""
    c = Cursor.open(*cursor_args, start_offset=0, window_bits=256)
    other = Cursor.attach(cursor_args[0])  # (another process's view of the same segment)
    guarded, plain = CursorSet(1), CursorSet(1)
    guarded[0] = c
    plain[0] = other
    with pytest.raises(CursorError, match="partition 0: no cursor attached"):
        CursorSet(1).guard_seeks()
    guarded.guard_seeks()
    assert (c.seeks, guarded.seek_state_now(), guarded.seeks_moved()) == (0, 0, [])
    assert guarded.finish(log_message_id(0, 0)) == FINISHED and c.confirmed == 1
    other.set(0, hold=True)  # a seek back to 0 begins
    assert (c.seeks, guarded.seek_state_now()) == (1, SEEK_HOLDS)
    other.release(0)  # and ends
    assert guarded.seek_state_now() == SEEKS_MOVED
    assert guarded.finish(log_message_id(0, 0)) == STALE and c.confirmed == 0
    assert plain.finish(log_message_id(0, 1)) == FINISHED  # (a worker's: not guarded)
    assert guarded.seeks_moved() == [0] and guarded.seeks_moved() == []
    assert guarded.seek_state_now() == 0
    assert guarded.finish(log_message_id(0, 0)) == FINISHED and c.confirmed == 2
    other.set(5)  # a reset without a hold (retention's move to the start): copies stay valid
    assert guarded.seek_state_now() == 0 and guarded.seeks_moved(0) == []
    other.set(0, hold=True)
    other.release(0)
    assert guarded.seek_state_now() == SEEKS_MOVED and guarded.seeks_moved(0) == [0]
    with pytest.raises(IndexError):
        guarded.seeks_moved(1)
    assert plain.seeks_moved() == [] and plain.seek_state_now() == 0
    # a partition's move into a lane holds the cursor without a seek (Cursor.hold): no
    # take from a ring meanwhile either (the ring may hold records from before the move),
    # and nothing to drop after it (LogChannel.use_lanes: the lanes' version says that)
    other.hold()
    assert (guarded.seek_state_now(), plain.seek_state_now()) == (SEEK_HOLDS, 0)
    other.release(other.confirmed)
    assert guarded.seek_state_now() == 0 and guarded.seeks_moved(0) == []


def test_unconfirmed_and_heads_only_keep_what_may_go_back(cursor_args):
    """Of packed records put back: unconfirmed keeps those not below their cursor's
    confirmed offset (and any record that is not a log message of an attached
    cursor); heads_only those at it (an ordered lane's head)."""
    c = Cursor.open(*cursor_args, start_offset=0, window_bits=256)
    cursors = CursorSet(2)
    cursors[0] = c
    for o in range(3):
        c.finish(o)

    def record(partition, offset):
        msg = struct.pack(">qH", 1, 1) + log_message_id(partition, offset) + b"body"
        return struct.pack("=I", len(msg)) + msg
    packed = record(0, 1) + record(0, 3) + record(0, 9) + record(1, 0)
    assert cursors.unconfirmed(packed) == record(0, 3) + record(0, 9) + record(1, 0)
    assert cursors.heads_only(packed) == record(0, 3)
    assert cursors.unconfirmed(b"") == bytearray()
    with pytest.raises(ValueError, match="a record of 30 bytes at byte 102"):
        cursors.unconfirmed(packed[:-1])
    with pytest.raises(ValueError, match="a record cut short at byte 0"):
        cursors.unconfirmed(b"\x01")
    # skip_held: nothing of a cursor a seek holds (its feeder reads it again)
    assert cursors.unconfirmed(packed, skip_held=True) == cursors.unconfirmed(packed)
    c.set(5, hold=True)
    assert cursors.unconfirmed(packed, skip_held=True) == record(1, 0)
    assert cursors.unconfirmed(packed) == record(0, 9) + record(1, 0)
    c.release(5)
    assert cursors.unconfirmed(packed, skip_held=True) == record(0, 9) + record(1, 0)


def test_a_closed_cursor_raises_rather_than_reading_freed_memory(cursor_args):
    """A request that still holds a cursor its channel's deletion closed gets
    an error (CursorError, as a closed cursor's lock), not a worker's crash."""
    c = Cursor.open(*cursor_args, start_offset=0, window_bits=256)
    c.close()
    assert c.held is False
    for read in (lambda: c.confirmed, lambda: c.read_pos, lambda: c.delivered,
                 lambda: c.is_finished(0), lambda: c.snapshot(), lambda: c.hold(),
                 lambda: c.retry_stats):
        with pytest.raises(CursorError, match="closed"):
            read()


FINISH_ONE = textwrap.dedent("""
    import sys, time
    from nsqshm._core.logcursor import Cursor
    c = Cursor.attach(sys.argv[1])
    print("attached", flush=True)
    c.finish(0)
    print(time.monotonic(), flush=True)
""")


def test_lock_holds_the_cursor_against_other_processes_and_nests(cursor_args):
    """lock() (a reader's claim: LogChannel._deliver_direct, _feed_once) keeps
    every other process's operation waiting until unlock(); this handle's own
    operations in between go through (the mutex nests on one handle)."""
    name, ckpt = cursor_args
    c = Cursor.open(name, ckpt, 0, 64)
    c.lock()
    proc = subprocess.Popen([sys.executable, "-c", FINISH_ONE, name], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline() == "attached\n"
        time.sleep(0.3)
        assert c.confirmed == 0  # the other process waits for the lock
        c.read_pos = 5           # this handle: nested, no deadlock
        assert c.finish(1) == FINISHED
        released = time.monotonic()
        c.unlock()
        finished_at = float(proc.stdout.readline())
        assert proc.wait(10) == 0
    finally:
        proc.kill()
    assert finished_at >= released
    assert c.confirmed == 2 and c.read_pos == 5
    with pytest.raises(CursorError, match="not locked"):
        c.unlock()
    c.close()


# -- the retry table -------------------------------------------------------------------------

def _record(partition, offset, attempts, body=b"x" * 10):
    msg = struct.pack(">qH", 1234, attempts) + log_message_id(partition, offset) + body
    return struct.pack("<I", len(msg)) + msg


def test_retry_table_notes_attempts_and_due_and_forgets_finished(cursor_args):
    name, ckpt = cursor_args
    cur = Cursor.open(name, ckpt, 100)
    assert cur.retry_stats == (RETRY_SLOTS, 0, 0)
    assert cur.note_retry(99, 3) == 0            # finished (below confirmed): not noted
    assert cur.note_retry(105, 2, 1_700_000_000_000) == 1
    assert cur.note_retry(101, 1) == 1
    assert cur.note_retry(105, 4) == 1           # noted again: replaced
    assert cur.retry(105) == (4, 0)
    assert cur.retry(101) == (1, 0)
    assert cur.retry(102) is None
    assert cur.retry_high() == 106
    wire = cur.retries()
    assert len(wire) == 2 * RETRY_ENTRY and cur.retry_count() == 2
    assert wire == (struct.pack(">QHq", 101, 1, 0) + struct.pack(">QHq", 105, 4, 0))
    assert cur.retries(end=105) == struct.pack(">QHq", 101, 1, 0)
    cur.finish(105)
    assert cur.retry(105) is None and cur.retry_high() == 102 and cur.retry_count() == 1
    cur.finish(100)
    cur.finish(101)                              # confirmed passes 101
    assert cur.retries() == b"" and cur.retry_high() == 0 and cur.retry_count() == 0
    # a table of finished entries only is emptied by a count, as by retries()
    assert cur.note_retry(160, 1) == 1
    cur.finish(160)
    assert cur.retry_stats[1] == 1 and cur.retry_count() == 0 and cur.retry_stats[1] == 0
    cur.close()


def test_a_full_retry_table_drops_stale_entries_first_then_new_notes(cursor_args):
    name, ckpt = cursor_args
    cur = Cursor.open(name, ckpt, 0, retry_slots=64)
    for o in range(48):                          # three quarters of 64
        assert cur.note_retry(o, 1) == 1
    assert cur.note_retry(48, 1) == -1           # live entries only: dropped, counted
    assert cur.retry_stats == (64, 48, 1)
    for o in range(10):
        cur.finish(o)
    assert cur.note_retry(48, 2) == 1            # the stale ten went at the compaction
    assert cur.retry_stats == (64, 39, 1)
    assert [o for o in range(60) if cur.retry(o)] == list(range(10, 49))
    for o in range(10, 49):
        cur.finish(o)
    assert cur.retries() == b"" and cur.retry_stats[1] == 0   # nothing live: emptied
    cur.close()


def test_a_full_table_is_walked_again_only_once_an_entry_may_be_stale(cursor_args):
    """A compaction walks the whole table: one that finds nothing stale is not
    repeated for each note that finds it full (a REQ storm paid a walk per
    REQ), but once the confirmed offset passed the lowest live entry, or
    slots / 64 messages were finished since, or after slots / 4 such notes."""
    name, ckpt = cursor_args
    cur = Cursor.open(name, ckpt, 0, retry_slots=1024)
    for o in range(1, 769):                      # three quarters of 1,024; offset 0 unfinished
        assert cur.note_retry(o, 1) == 1
    assert cur.note_retry(2000, 1) == -1         # a vain compaction: the notes after it wait
    for o in range(1, 16):
        cur.finish(o)                            # 15 stale, above confirmed 0: fewer than 16
    assert cur.note_retry(2001, 1) == -1         # (not walked: dropped though 15 are stale)
    cur.finish(16)                               # the 16th finish since
    assert cur.note_retry(2002, 1) == 1          # walked: the 16 went
    assert cur.retry_stats == (1024, 753, 2)
    for o in range(3000, 3015):
        assert cur.note_retry(o, 1) == 1         # full again, 768 live
    assert cur.note_retry(2003, 1) == -1         # a vain compaction, lowest live 17
    assert [cur.note_retry(o, 1) for o in range(4000, 4255)] == [-1] * 255  # no finish
    assert cur.note_retry(4255, 1) == -1         # the 256th walks (in vain: all live)
    cur.finish(0)                                # confirmed 17: past the lowest live...
    cur.finish(17)                               # ...18: offset 17's entry is stale
    assert cur.note_retry(4256, 1) == 1          # walked at once
    cur.close()


def test_an_older_builds_table_is_rehashed_at_attach(cursor_args):
    """A segment whose retry_hashed (byte 216) is 0 keeps its entries at
    offset & (slots - 1), linear probing: the first attach moves each to its
    hashed home, and every one is found."""
    name, ckpt = cursor_args
    cur = Cursor.open(name, ckpt, 0, retry_slots=64)
    entries = {o: (o % 7 + 1, 1_700_000_000_000 + o if o % 3 == 0 else 0)
               for o in (1, 2, 3, 65, 66, 129, 40, 63, 127)}  # (collisions, a wrap)
    cur.close()
    with open(f"/dev/shm/{name}", "r+b") as raw:
        raw.seek(12)
        (window_bits,) = struct.unpack("=I", raw.read(4))
        table = 256 + window_bits // 8
        slots = [b"\0" * 24] * 64
        for o, (attempts, due) in entries.items():  # as a build before the hashing put them
            i = o & 63
            while slots[i] != b"\0" * 24:
                i = (i + 1) & 63
            slots[i] = struct.pack("=QIIq", o + 1, attempts, 0, due)
        raw.seek(table)
        raw.write(b"".join(slots))
        raw.seek(36)
        raw.write(struct.pack("=I", len(entries)))  # retry_used
        raw.seek(216)
        raw.write(bytes(8))                          # retry_hashed 0
    again = Cursor.attach(name)
    for o, (attempts, due) in entries.items():
        assert again.retry(o) == (attempts, due), o
    assert again.retry_stats == (64, len(entries), 0)
    with open(f"/dev/shm/{name}", "rb") as raw:
        raw.seek(216)
        assert raw.read(8) == struct.pack("=Q", 1)
    assert again.note_retry(4, 1) == 1 and again.retry(4) == (1, 0)
    again.close()


def test_compaction_in_place_keeps_every_live_entry_findable(cursor_args):
    """Offsets that collide (the same slot modulo the table) and wrap past its end,
    finished in a random order: the live ones stay findable after each compaction."""
    name, ckpt = cursor_args
    cur = Cursor.open(name, ckpt, 0, window_bits=1 << 16, retry_slots=64)
    rng = random.Random(7)
    live = {}
    for step in range(400):
        o = rng.choice([rng.randrange(0, 4000), 64 * rng.randrange(0, 40) + 63])
        if cur.is_finished(o):
            continue
        if rng.random() < 0.4 and live:
            done = rng.choice(sorted(live))
            cur.finish(done)
            del live[done]
        r = cur.note_retry(o, step % 50 + 1)
        if r == 1:
            live[o] = step % 50 + 1
        for k, attempts in live.items():
            assert cur.retry(k) == (attempts, 0), (step, k)
    cur.close()


def test_set_retries_takes_what_the_log_holds_and_is_unfinished(cursor_args):
    name, ckpt = cursor_args
    cur = Cursor.open(name, ckpt, 10)
    cur.note_retry(50, 9)
    cur.finish(12)
    wire = b"".join(struct.pack(">QHq", o, a, d) for o, a, d in
                    [(5, 1, 0), (11, 2, 0), (12, 3, 0), (13, 4, 7_000), (20, 5, 0)])
    assert cur.set_retries(wire, end=20) == 2    # 5 and 12 finished, 20 past the end
    assert cur.retries() == struct.pack(">QHq", 11, 2, 0) + struct.pack(">QHq", 13, 4, 7_000)
    with pytest.raises(ValueError):
        cur.set_retries(b"x" * 5, end=20)
    cur.close()


def test_a_segment_without_a_retry_table_notes_nothing(cursor_args):
    name, ckpt = cursor_args
    cur = Cursor.open(name, ckpt, 0, retry_slots=0)
    assert cur.note_retry(3, 2) == 0 and cur.retries() == b"" and cur.retry_high() == 0
    again = Cursor.attach(name)                  # (a build before the table made it so)
    assert again.retry_stats == (0, 0, 0)
    again.close()
    cur.close()


def test_cursor_set_notes_retries_from_records(cursor_args):
    name, ckpt = cursor_args
    cur = Cursor.open(name, ckpt, 0)
    cursors = CursorSet(2)
    cursors[1] = cur
    packed = _record(1, 4, 2) + _record(0, 7, 1) + _record(1, 9, 300)
    assert cursors.note_retries(packed, 5_000) == 2   # partition 0 has no cursor here
    assert cur.retry(4) == (2, 5_000) and cur.retry(9) == (300, 5_000)
    # never delivered (a ring's overflow deferred for room): nothing to keep
    assert cursors.note_retries(_record(1, 11, 0)) == 0
    assert cursors.note_retries(_record(1, 11, 0), 9_000) == 0
    assert cursors.note_retries(_record(1, 12, 0x8003)) == 1   # the time-to-live bit is not attempts
    assert cur.retry(11) is None and cur.retry(12) == (3, 0)
    with pytest.raises(ValueError):
        cursors.note_retries(packed[:-1])
    cur.close()
