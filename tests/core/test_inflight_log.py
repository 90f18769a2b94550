"""InFlight.deliver_from_log: a log channel's claim of a partition's next run,
read from the log, delivered and read_pos moved, in one call under the cursor's
lock (LogChannel._deliver_direct), on a real log and a real cursor segment."""

import os
import random
import struct

import pytest

from nsqshm._core.commitlog import PartitionLog, partition_dir
from nsqshm._core.inflight import InFlight
from nsqshm._core.logcursor import CLAIM_RETENTION, Cursor, CursorSet
from nsqshm._core.ring import Ring

T0 = 1_700_000_000_000_000_000
DEADLINE = 1 << 62


def message(i):
    return struct.pack(">QH", T0 + i, 0) + f"{i:016x}".encode() + b"b%05d" % i + b"." * 90


def frames(out):
    """The message bodies' numbers in out's frames, in order."""
    got, pos = [], 0
    while pos < len(out):
        (size,) = struct.unpack_from(">I", out, pos)
        got.append(int(bytes(out[pos + 8 + 26 + 1:pos + 8 + 26 + 6])))
        pos += 4 + size
    return got


@pytest.fixture
def log_and_cursor(tmp_path):
    log = PartitionLog(partition_dir(str(tmp_path), "t", 0), segment_bytes=4096)
    log.append_packed(b"".join(struct.pack("=I", len(m)) + m
                               for m in map(message, range(100))))
    name = f"nsqshm-test-dfl-{os.getpid()}-{random.getrandbits(32):08x}"
    cursor = Cursor.open(name, str(tmp_path / "ch.cursor"), 0, window_bits=64)
    yield log, cursor
    cursor.close()
    log.close()
    try:
        os.unlink(f"/dev/shm/{name}")
    except FileNotFoundError:
        pass


def test_a_run_goes_out_and_read_pos_moves_past_it(log_and_cursor):
    log, cursor = log_and_cursor
    flight, out, scratch = InFlight(), bytearray(), bytearray(1 << 16)
    end = log.reader.end_offset
    assert flight.deliver_from_log(cursor, log.reader, end, None, 10, scratch, out, 7,
                                   DEADLINE) == (10, 10, 0)
    assert frames(out) == list(range(10)) and cursor.read_pos == 10 and len(flight) == 10
    # finished ones are stepped over: 10-11 finished (say, by a consumer before a
    # restart that moved read_pos back), so the next run starts at 12
    cursor.finish(10)
    cursor.finish(11)
    del out[:]
    assert flight.deliver_from_log(cursor, log.reader, end, None, 5, scratch, out, 7,
                                   DEADLINE) == (5, 5, 12)
    assert frames(out) == [12, 13, 14, 15, 16] and cursor.read_pos == 17


def attempts_by_offset(out):
    """{body number: attempts} of out's frames."""
    got, pos = {}, 0
    while pos < len(out):
        (size,) = struct.unpack_from(">I", out, pos)
        got[int(bytes(out[pos + 8 + 26 + 1:pos + 8 + 26 + 6]))] = \
            struct.unpack_from(">H", out, pos + 8 + 8)[0]
        pos += 4 + size
    return got


def test_what_goes_out_raises_the_delivered_mark_and_a_rewind_counts_what_went_out(
        log_and_cursor):
    """With log_cursors set (a log channel's), each message put in flight raises
    its partition's delivered mark (one past the highest offset); a run claimed
    again below the mark (a lane move's rewind took it back, or a new leader
    reads what its old leader had in flight) comes as its 2nd delivery, every
    message of it, and what lies above the mark as its 1st.  (Found in review:
    only the head was counted.)"""
    log, cursor = log_and_cursor
    flight, out, scratch = InFlight(), bytearray(), bytearray(1 << 16)
    cursors = CursorSet(1)
    cursors[0] = cursor
    flight.log_cursors = cursors
    end = log.reader.end_offset
    assert flight.deliver_from_log(cursor, log.reader, end, None, 5, scratch, out, 7,
                                   DEADLINE)[0] == 5
    assert cursor.delivered == 5
    cursors.raise_delivered_now(0, 3)  # (only raises)
    assert cursor.delivered == 5
    cursor.finish(2)
    cursor.hold()  # a rewind to the confirmed offset: what is unfinished is read again
    cursor.release(cursor.confirmed)
    again = InFlight()  # (another client's table: the first one's copies were taken back)
    out2 = bytearray()
    assert again.deliver_from_log(cursor, log.reader, end, None, 2, scratch, out2, 8,
                                  DEADLINE)[0] == 2
    out3 = bytearray()
    assert again.deliver_from_log(cursor, log.reader, end, None, 4, scratch, out3, 8,
                                  DEADLINE)[0] == 4
    assert attempts_by_offset(out2) == {0: 2, 1: 2}
    assert attempts_by_offset(out3) == {3: 2, 4: 2, 5: 1, 6: 1}
    assert cursor.delivered == 5  # (a table without log_cursors raises nothing)


def test_the_mark_a_seek_resets_stays_reset_whatever_a_ring_took_meanwhile(log_and_cursor):
    """A seek resets the delivered mark; another worker's dispatcher may take
    records from the old position out of the channel ring (raising the mark)
    until it applies the seek's broadcast, so the hold's end resets it again:
    after the seek, its offset comes as its 1st delivery.  (Found in review.)"""
    log, cursor = log_and_cursor
    cursors = CursorSet(1)
    cursors[0] = cursor
    name = f"nsqshm-test-dfl-ring-{os.getpid()}-{random.getrandbits(32):08x}"
    ring = Ring.create(name, 1 << 16)
    try:
        ring.push_packed(b"".join(struct.pack("=I", len(m)) + m
                                  for m in map(message, range(30, 40))))
        cursor.set(30)
        cursor.read_pos = 40
        cursor.set(10, hold=True)  # worker A's seek
        assert cursor.delivered == 10
        worker_b = InFlight()
        worker_b.log_cursors = cursors
        assert worker_b.deliver_from_ring(ring, 10, bytearray(1 << 16), bytearray(), 7,
                                          DEADLINE)[0] == 10
        assert cursor.delivered == 40
        cursor.release(10)
        assert cursor.delivered == 10
        out = bytearray()
        InFlight().deliver_from_log(cursor, log.reader, 100, None, 3, bytearray(1 << 16), out,
                                    8, DEADLINE)
        assert attempts_by_offset(out) == {10: 1, 11: 1, 12: 1}
    finally:
        ring.close()
        ring.unlink()


def test_delivered_marks_follow_each_partition_of_a_mixed_batch():
    """One deliver() of records of two partitions, out of order: each partition's
    mark is one past its highest offset (runs compared as the IDs' two
    big-endian words, decoded once per run)."""
    names = [f"nsqshm-test-dm-{os.getpid()}-{random.getrandbits(32):08x}-{k}" for k in (0, 1)]
    cursors = CursorSet(2)
    try:
        for k, name in enumerate(names):
            cursors[k] = Cursor.open(name, f"/tmp/{name}.cursor", 0)
        flight = InFlight()
        flight.log_cursors = cursors
        ids = [(0, 5), (0, 3), (0, 0x1FF), (0, 2), (1, 7), (1, 4), (1, 0x100), (0, 6)]
        records = b"".join(struct.pack("=I", 26 + 4) + struct.pack(">QH", T0, 0) +
                           f"{(p << 48) | o:016x}".encode() + b"body" for p, o in ids)
        assert flight.deliver(records, len(ids), bytearray(), 7, DEADLINE) == len(ids)
        assert [cursors[k].delivered for k in (0, 1)] == [0x200, 0x101]
    finally:
        for k, name in enumerate(names):
            if cursors[k] is not None:
                cursors[k].close()
            for path in (f"/dev/shm/{name}", f"/tmp/{name}.cursor"):
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass


def test_a_held_cursor_or_a_ring_of_older_records_takes_nothing(log_and_cursor):
    log, cursor = log_and_cursor
    flight, out, scratch = InFlight(), bytearray(), bytearray(1 << 16)
    end = log.reader.end_offset
    cursor.hold()
    assert flight.deliver_from_log(cursor, log.reader, end, None, 10, scratch, out, 7,
                                   DEADLINE) == (0, 0, 0)   # (at 0: nothing to wake)
    cursor.release(0)
    # the owner's feeder pushed records of the partition into the ring (claimed
    # earlier, so older): nothing is read past them until they are taken
    ring = Ring.create(f"nsqshm-test-dfl-ring-{os.getpid()}-{random.getrandbits(32):08x}", 8192)
    try:
        ring.push(b"x" * 30)
        assert flight.deliver_from_log(cursor, log.reader, end, ring, 10, scratch, out, 7,
                                       DEADLINE) == (0, 0, 0)
        ring.pop()
        # nothing past the end it is given (the committed end, in cluster mode)
        assert flight.deliver_from_log(cursor, log.reader, 3, ring, 10, scratch, out, 7,
                                       DEADLINE) == (3, 3, 0)
    finally:
        ring.unlink()
        ring.close()
    assert flight.deliver_from_log(cursor, log.reader, 3, None, 10, scratch, out, 7,
                                   DEADLINE) == (0, 0, 3)
    assert frames(out) == [0, 1, 2] and cursor.read_pos == 3


def test_a_full_window_waits_and_a_run_stops_at_a_finished_message(log_and_cursor):
    log, cursor = log_and_cursor
    flight, out, scratch = InFlight(), bytearray(), bytearray(1 << 16)
    end = log.reader.end_offset
    assert flight.deliver_from_log(cursor, log.reader, end, None, 100, scratch, out, 7,
                                   DEADLINE) == (64, 64, 0)   # the window's 64
    assert flight.deliver_from_log(cursor, log.reader, end, None, 100, scratch, out, 7,
                                   DEADLINE) == (0, 0, 64)    # full: at its end
    for o in range(64):
        cursor.finish(o)
    cursor.finish(70)  # (finished before it was read: a rewind, or a replica's cursor)
    del out[:]
    assert flight.deliver_from_log(cursor, log.reader, end, None, 100, scratch, out, 7,
                                   DEADLINE) == (6, 6, 64)    # 64-69: the run ends at 70
    assert flight.deliver_from_log(cursor, log.reader, end, None, 100, scratch, out, 7,
                                   DEADLINE) == (29, 29, 71)
    assert frames(out) == list(range(64, 70)) + list(range(71, 100))


def test_every_message_finished_up_to_the_end_moves_read_pos_without_a_delivery(
        log_and_cursor):
    log, cursor = log_and_cursor
    flight, out, scratch = InFlight(), bytearray(), bytearray(1 << 16)
    cursor.set(20)
    cursor.finish(21)
    cursor.finish(22)
    assert flight.deliver_from_log(cursor, log.reader, 23, None, 10, scratch, out, 7,
                                   DEADLINE) == (1, 1, 20)
    assert flight.deliver_from_log(cursor, log.reader, 23, None, 10, scratch, out, 7,
                                   DEADLINE) == (-1, 0, 21)   # 21-22 finished: moved on
    assert cursor.read_pos == 23 and frames(out) == [20]


def test_retention_past_the_cursor_says_where_the_log_starts(log_and_cursor):
    log, cursor = log_and_cursor
    flight, out, scratch = InFlight(), bytearray(), bytearray(1 << 16)
    log.apply_retention(max_bytes=8192)  # whole old segments go
    start = log.reader.start_offset
    assert start > 0
    assert flight.deliver_from_log(cursor, log.reader, log.reader.end_offset, None, 10,
                                   scratch, out, 7, DEADLINE) == (CLAIM_RETENTION, 0, start)
    assert not out and cursor.read_pos == 0   # (the caller moves the cursor)


def test_nothing_is_claimed_once_the_channels_lanes_moved_since_the_callers_look(
        log_and_cursor):
    """lanes: the channel ring, whose lanes_version a lane move bumps once it
    holds the cursor; a claim made with an older look takes nothing, under the
    cursor's lock, so a worker late for the move reads nothing of the
    partition before it attached the lane (LogChannel.look_for_lanes)."""
    log, cursor = log_and_cursor
    flight, out, scratch = InFlight(), bytearray(), bytearray(1 << 16)
    end = log.reader.end_offset
    ring = Ring.create(f"nsqshm-test-dfl-lanes-{os.getpid()}-{random.getrandbits(32):08x}", 8192)
    try:
        seen = ring.lanes_version
        assert flight.deliver_from_log(cursor, log.reader, end, None, 2, scratch, out, 7,
                                       DEADLINE, lanes=ring, lanes_seen=seen) == (2, 2, 0)
        ring.bump_lanes_version()
        assert flight.deliver_from_log(cursor, log.reader, end, None, 2, scratch, out, 7,
                                       DEADLINE, lanes=ring, lanes_seen=seen) == (0, 0, 0)
        assert cursor.read_pos == 2 and frames(out) == [0, 1]
        assert flight.deliver_from_log(cursor, log.reader, end, None, 2, scratch, out, 7,
                                       DEADLINE, lanes=ring,
                                       lanes_seen=ring.lanes_version) == (2, 2, 2)
    finally:
        ring.unlink()
        ring.close()
    assert frames(out) == [0, 1, 2, 3] and cursor.read_pos == 4
