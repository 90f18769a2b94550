"""The C side of issue 18's delivery policies in nsqshm._core.inflight: the
time to live deliver() checks, take_dead (max attempts, per batch),
reset_attempts (redrive) and snapshot (peek)."""

import struct
import time

import pytest

from nsqshm._core.codec import with_expiry
from nsqshm._core.inflight import DeferredQueue, InFlight, reset_attempts, take_dead, take_ids

from .test_inflight import bumped, frame, mid, msg, pack, unpack


def now_ns():
    return time.time_ns()


def test_deliver_drops_expired_messages_and_counts_them():
    t = InFlight(16)
    t.ttl_ns = 1_000_000_000  # 1 s
    fresh, old = msg(1, ts=now_ns()), msg(2, ts=now_ns() - 2_000_000_000)
    fresh2 = msg(3, ts=now_ns())
    out = bytearray()
    added = t.deliver(pack([fresh, old, fresh2]), 3, out, 7, 10**18)
    assert added == 2 and t.expired == 1
    framed = frame(fresh[:8] + b"\x00\x01" + fresh[10:]) + frame(fresh2[:8] + b"\x00\x01"
                                                                  + fresh2[10:])
    assert bytes(out) == framed  # the expired one was neither framed nor put in flight
    assert len(t) == 2


def test_no_ttl_delivers_everything_however_old():
    t = InFlight(16)
    out = bytearray()
    assert t.deliver(pack([msg(1, ts=1)]), 1, out, 7, 10**18) == 1
    assert t.expired == 0


def test_take_dead_splits_at_max_attempts_keeping_order():
    msgs = [msg(1, attempts=1), msg(2, attempts=3), msg(3, attempts=2), msg(4, attempts=5),
            msg(5, attempts=0)]
    buf = bytearray(pack(msgs)) + bytearray(64)  # trailing room is not records
    dead = bytearray(b"prefix")
    kept_n, kept_bytes, n_dead = take_dead(buf, len(pack(msgs)), 3, dead)
    assert (kept_n, n_dead) == (3, 2)
    assert unpack(buf, kept_bytes) == [msgs[0], msgs[2], msgs[4]]
    assert dead[:6] == b"prefix" and unpack(dead[6:], len(dead) - 6) == [msgs[1], msgs[3]]


def test_take_dead_with_no_limit_keeps_all():
    msgs = [msg(1, attempts=9)]
    buf = bytearray(pack(msgs))
    dead = bytearray()
    assert take_dead(buf, len(buf), 0, dead) == (1, len(buf), 0) and dead == b""


def test_take_dead_rejects_bad_records():
    buf = bytearray(struct.pack("=I", 100) + b"x" * 30)
    with pytest.raises(ValueError):
        take_dead(buf, len(buf), 1, bytearray())
    with pytest.raises(ValueError):
        take_dead(bytearray(10), 11, 1, bytearray())


def test_take_ids_takes_those_and_keeps_the_rest_in_order():
    msgs = [msg(i, attempts=i) for i in range(1, 7)]
    buf = bytearray(pack(msgs)) + bytearray(64)
    taken = bytearray(b"prefix")
    wanted = mid(5) + mid(2) + mid(99)  # one not there
    n_kept, kept_bytes, n_taken = take_ids(buf, len(pack(msgs)), wanted, taken)
    assert (n_kept, n_taken) == (4, 2)
    assert unpack(buf, kept_bytes) == [msgs[0], msgs[2], msgs[3], msgs[5]]
    assert unpack(taken[6:], len(taken) - 6) == [msgs[1], msgs[4]]  # as they were
    assert take_ids(bytearray(pack(msgs)), len(pack(msgs)), b"", bytearray())[2] == 0
    with pytest.raises(ValueError):
        take_ids(bytearray(pack(msgs)), len(pack(msgs)), b"short", bytearray())


def test_reset_attempts():
    msgs = [msg(1, attempts=4), msg(2, attempts=65535)]
    buf = bytearray(pack(msgs))
    assert reset_attempts(buf, len(buf)) == 2
    assert unpack(buf, len(buf)) == [msg(1), msg(2)]


def test_snapshot_copies_held_messages_without_taking_them():
    t = InFlight(16)
    t.add(msg(1), 5, 300)
    t.add(msg(2), 6, 100)
    buf = bytearray(1 << 12)
    count, nbytes, held = t.snapshot(buf)
    assert (count, held) == (2, 2) and len(t) == 2
    seen, pos = {}, 0
    for _ in range(count):
        size, deadline, client = struct.unpack_from("=Iqq", buf, pos)
        seen[bytes(buf[pos + 20:pos + 20 + size])] = (deadline, client)
        pos += 20 + size
    assert pos == nbytes
    assert seen == {msg(1): (300, 5), msg(2): (100, 6)}


def test_snapshot_stops_when_the_buffer_is_full():
    d = DeferredQueue(16)
    for i in range(3):
        d.push(msg(i), 10 + i)
    room = 20 + len(msg(0))
    assert d.snapshot(bytearray(room + 5))[::2] == (1, 3) and len(d) == 3


def test_expired_messages_are_kept_for_a_dead_letter_topic_when_asked():
    t = InFlight(16)
    t.ttl_ns = 1_000_000_000
    t.expired_out = bytearray()
    old, fresh = msg(1, ts=now_ns() - 5_000_000_000), msg(2, ts=now_ns())
    out = bytearray()
    assert t.deliver(pack([old, fresh]), 2, out, 7, 10**18) == 1
    assert unpack(t.expired_out, len(t.expired_out)) == [old]  # as it was, attempts untouched
    assert t.expired == 1 and len(t) == 1


# -- a message's own time to live (includes/message_expiry.h) -------------------------


def with_deadline(m, expires_at):
    """m as codec.with_expiry stores it: bit 15 of attempts, deadline after the body."""
    out = bytearray()
    assert with_expiry(pack([m]), len(pack([m])), expires_at, out) == 1
    (got,) = unpack(out, len(out))
    return got


def test_with_expiry_layout_and_checks():
    m = msg(1, attempts=3, body=b"hello")
    stored = with_deadline(m, 0x0102030405060708)
    assert stored == m[:8] + b"\x80\x03" + m[10:] + bytes(range(1, 9))
    with pytest.raises(ValueError):  # one deadline per message
        with_expiry(pack([stored]), len(pack([stored])), 5, bytearray())
    with pytest.raises(ValueError):
        with_expiry(pack([m]), len(pack([m])) + 1, 5, bytearray())


def test_deliver_sends_the_plain_message_and_keeps_the_deadline_in_flight():
    t = InFlight(16)
    m = msg(1, attempts=2, body=b"hello")
    stored = with_deadline(m, now_ns() + 60_000_000_000)
    plain = msg(2, body=b"other")
    out = bytearray()
    assert t.deliver(pack([stored, plain]), 2, out, 7, 10**18) == 2
    assert bytes(out) == frame(bumped(m)) + frame(bumped(plain))  # clients never see it
    kept = t.requeue(mid(1), 7)
    assert kept == stored[:8] + b"\x80\x03" + stored[10:]  # the deadline goes back with REQ


def test_deliver_drops_messages_past_their_own_deadline():
    t = InFlight(16)
    t.expired_out = bytearray()
    old = with_deadline(msg(1, body=b"late"), now_ns() - 1)
    fresh = with_deadline(msg(2, body=b"fine"), now_ns() + 60_000_000_000)
    out = bytearray()
    assert t.deliver(pack([old, fresh]), 2, out, 7, 10**18) == 1
    assert t.expired == 1 and len(t) == 1
    assert bytes(out) == frame(bumped(msg(2, body=b"fine")))  # nothing more: out is trimmed
    # the expired one as the dead-letter topic gets it: plain
    assert unpack(t.expired_out, len(t.expired_out)) == [msg(1, body=b"late")]


def test_take_dead_strips_the_deadline_and_reset_keeps_it():
    stored = with_deadline(msg(1, attempts=5, body=b"hello"), now_ns() + 10**12)
    keep = with_deadline(msg(2, attempts=1, body=b"hello"), now_ns() + 10**12)
    buf = bytearray(pack([stored, keep]))
    dead = bytearray()
    assert take_dead(buf, len(buf), 5, dead)[::2] == (1, 1)  # attempts without the bit
    assert unpack(dead, len(dead)) == [msg(1, attempts=5, body=b"hello")]
    buf = bytearray(pack([keep]))
    reset_attempts(buf, len(buf))
    assert unpack(buf, len(buf)) == [keep[:8] + b"\x80\x00" + keep[10:]]


def test_attempts_saturate_below_the_bit():
    t = InFlight(16)
    out = bytearray()
    m = msg(1, attempts=32767, body=b"long enough body")
    assert t.deliver(pack([m]), 1, out, 7, 10**18) == 1
    assert bytes(out)[8 + 8:8 + 10] == b"\x7f\xff"
