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


def test_what_goes_out_raises_the_delivered_mark_and_a_claimed_head_gets_its_attempts(
        log_and_cursor):
    """With log_cursors set (a log channel's), each message put in flight raises
    its partition's delivered mark (one past the highest offset); a head claimed
    again below the mark (a rewind, a new leader reading its old leader's
    in-flight head from the log) comes as its 2nd delivery."""
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
    cursor.hold()  # a rewind to the confirmed offset: 0..4 read again
    cursor.release(cursor.confirmed)
    out2 = bytearray()
    assert flight.deliver_from_log(cursor, log.reader, end, None, 1, scratch, out2, 8,
                                   DEADLINE)[0] == 1
    assert struct.unpack_from(">H", out2, 8 + 8)[0] == 2  # (0 was out once: its 2nd)
    assert InFlight().deliver_from_log(cursor, log.reader, end, None, 1, scratch,
                                       bytearray(), 9, DEADLINE)[0] == 1
    assert cursor.delivered == 5  # (an InFlight without log_cursors raises nothing)


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
