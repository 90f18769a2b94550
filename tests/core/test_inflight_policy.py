"""The C side of issue 18's delivery policies in nsqshm._core.inflight: the
time to live deliver() checks, take_dead (max attempts, per batch),
reset_attempts (redrive) and snapshot (peek)."""

import struct
import time

import pytest

from nsqshm._core.inflight import DeferredQueue, InFlight, reset_attempts, take_dead

from .test_inflight import frame, msg, pack, unpack


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
