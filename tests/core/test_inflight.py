"""Byte-exact tests of nsqshm._core.inflight: InFlight and DeferredQueue.

Messages are NSQ-encoded: [8-byte BE timestamp][2-byte BE attempts][16-byte
hex ID][body].  Buffers from pop_expired / drain / pop_due and the records
given to deliver are packed [u32 native size][message] records.
"""

import os
import random
import struct

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from nsqshm._core import codec
from nsqshm._core.inflight import NOT_IN_FLIGHT, NOT_OWNER, OK, DeferredQueue, InFlight
from nsqshm._core.logcursor import Cursor, CursorSet, log_message_id

TS = 1_700_000_000_123_456_789


def mid(i):
    """The 16-byte hex ID of integer i."""
    return codec.int_to_id(i)


def msg(i, attempts=0, body=b"body", ts=TS):
    return codec.encode_message(mid(i), ts, attempts, body)


def pack(messages):
    return b"".join(struct.pack("=I", len(m)) + m for m in messages)


def unpack(buf, nbytes):
    out, pos = [], 0
    while pos < nbytes:
        (size,) = struct.unpack_from("=I", buf, pos)
        out.append(bytes(buf[pos + 4:pos + 4 + size]))
        pos += 4 + size
    assert pos == nbytes
    return out


def bumped(m):
    """m with its attempts incremented, saturating at 65535."""
    (attempts,) = struct.unpack_from(">H", m, 8)
    return m[:8] + struct.pack(">H", min(attempts + 1, 65535)) + m[10:]


def frame(m):
    return struct.pack(">II", 4 + len(m), 2) + m


def drain_all(table):
    buf = bytearray(1 << 16)
    got = []
    while True:
        n, nbytes = table.drain(buf)
        if (n, nbytes) == (0, 0):
            return got
        got += unpack(buf, nbytes)


def test_constants():
    assert (OK, NOT_IN_FLIGHT, NOT_OWNER) == (0, -1, -2)


# -- add / finish / requeue / touch ---------------------------------------------

STATUS_CASES = [
    # (operation, id, client, expected); message 1 is held by client 7
    ("finish", 1, 7, OK),
    ("finish", 1, 8, NOT_OWNER),
    ("finish", 2, 7, NOT_IN_FLIGHT),
    ("finish", 2, 8, NOT_IN_FLIGHT),
    ("touch", 1, 7, OK),
    ("touch", 1, 8, NOT_OWNER),
    ("touch", 2, 7, NOT_IN_FLIGHT),
    ("requeue", 1, 7, msg(1)),
    ("requeue", 1, 8, NOT_OWNER),
    ("requeue", 2, 7, NOT_IN_FLIGHT),
]


@pytest.mark.parametrize("op,i,client,expected", STATUS_CASES)
def test_statuses(op, i, client, expected):
    t = InFlight()
    t.add(msg(1), 7, 1000)
    args = (mid(i), client) + ((5000,) if op == "touch" else ())
    assert getattr(t, op)(*args) == expected
    removed = op in ("finish", "requeue") and expected in (OK, msg(1))
    assert len(t) == (0 if removed else 1)
    assert (mid(1) in t) == (not removed)
    assert t.total_bytes == (0 if removed else len(msg(1)))
    assert t.client_count(7) == (0 if removed else 1)
    assert t.get_deadline(mid(1)) == (-1 if removed else 5000 if expected == OK else 1000)


def test_finish_twice():
    t = InFlight()
    t.add(msg(1), 7, 10)
    assert t.finish(mid(1), 7) == OK
    assert t.finish(mid(1), 7) == NOT_IN_FLIGHT


@pytest.mark.parametrize("size", [0, 1, 25])
def test_add_rejects_short_messages(size):
    t = InFlight()
    with pytest.raises(ValueError, match="shorter than its 26-byte header"):
        t.add(b"\0" * size, 1, 0)
    assert len(t) == 0 and t.total_bytes == 0


def test_add_header_only_message():
    t = InFlight()
    m = msg(3, body=b"")
    assert len(m) == 26
    t.add(m, 1, 0)
    assert t.requeue(mid(3), 1) == m


def test_add_duplicate_raises_keyerror_and_changes_nothing():
    t = InFlight()
    t.add(msg(1, body=b"first"), 1, 10)
    with pytest.raises(KeyError) as info:
        t.add(msg(1, body=b"second one"), 2, 5)
    assert info.value.args == (mid(1),)
    assert len(t) == 1
    assert t.total_bytes == len(msg(1, body=b"first"))
    assert t.client_count(2) == 0
    assert t.next_deadline() == 10
    assert t.requeue(mid(1), 1) == msg(1, body=b"first")


@pytest.mark.parametrize("source", [bytes, bytearray, memoryview])
def test_add_copies_any_buffer(source):
    t = InFlight()
    data = bytearray(msg(9))
    t.add(source(data), 1, 0)
    data[-1:] = b"!"                  # the table holds its own copy
    assert t.requeue(mid(9), 1) == msg(9)


@pytest.mark.parametrize("make_id", [bytes, bytearray, memoryview])
def test_id_arguments_accept_buffers(make_id):
    t = InFlight()
    t.add(msg(5), 1, 0)
    assert t.get_deadline(make_id(mid(5))) == 0
    assert t.touch(make_id(mid(5)), 1, 9) == OK
    assert t.finish(make_id(mid(5)), 1) == OK


@pytest.mark.parametrize("bad", [b"", b"0123456789abcde", b"0123456789abcdef0"])
def test_id_arguments_must_be_16_bytes(bad):
    t = InFlight()
    for call in (lambda: t.finish(bad, 1), lambda: t.requeue(bad, 1),
                 lambda: t.touch(bad, 1, 0), lambda: t.get_deadline(bad)):
        with pytest.raises(ValueError, match="16 bytes"):
            call()


def test_id_argument_int_is_a_type_error():
    with pytest.raises(TypeError):
        InFlight().finish(16, 1)


def test_requeue_returns_exact_bytes_and_allows_readd():
    t = InFlight()
    m = msg(0xABC, attempts=3, body=bytes(range(256)))
    t.add(m, 4, 100)
    out = t.requeue(mid(0xABC), 4)
    assert type(out) is bytes and out == m
    assert t.requeue(mid(0xABC), 4) == NOT_IN_FLIGHT
    t.add(out, 5, 200)
    assert t.client_count(4) == 0 and t.client_count(5) == 1


# -- deliver ------------------------------------------------------------------------

DELIVER_CASES = [
    # (attempts before, attempts bytes after)
    (0, b"\x00\x01"),
    (1, b"\x00\x02"),
    (255, b"\x01\x00"),
    (65534, b"\xff\xff"),
    (65535, b"\xff\xff"),
]


@pytest.mark.parametrize("before,after", DELIVER_CASES)
def test_deliver_frame_bytes(before, after):
    t = InFlight()
    m = codec.encode_message(b"06a2a7f0e5c1d000", TS, before, b"hello")
    out = bytearray(b"prefix")
    assert t.deliver(pack([m]), 1, out, 3, 777) == 1
    expected = (b"prefix"
                + b"\x00\x00\x00\x23"              # size: 4 + 31-byte message
                + b"\x00\x00\x00\x02"              # frame type 2, message
                + struct.pack(">Q", TS) + after + b"06a2a7f0e5c1d000" + b"hello")
    assert bytes(out) == expected
    assert t.get_deadline(b"06a2a7f0e5c1d000") == 777
    assert t.client_count(3) == 1
    assert t.requeue(b"06a2a7f0e5c1d000", 3) == expected[14:]


def test_deliver_batch():
    t = InFlight()
    messages = [msg(i, attempts=i, body=b"b" * i) for i in range(1, 51)]
    out = bytearray()
    assert t.deliver(pack(messages), len(messages), out, 9, 5000) == 50
    assert bytes(out) == b"".join(frame(bumped(m)) for m in messages)
    assert len(t) == 50 and t.client_count(9) == 50
    assert t.total_bytes == sum(len(m) for m in messages)
    assert drain_all(t) == [bumped(m) for m in messages]     # same deadline: FIFO
    assert t.duplicates == 0


def test_deliver_takes_only_count_records():
    t = InFlight()
    records = pack([msg(1), msg(2), msg(3)])
    out = bytearray()
    assert t.deliver(memoryview(records), 2, out, 1, 0) == 2
    assert bytes(out) == frame(bumped(msg(1))) + frame(bumped(msg(2)))
    assert mid(3) not in t
    assert t.deliver(records, 0, out, 1, 0) == 0
    assert len(out) == 2 * (8 + len(msg(1)))


def test_deliver_duplicates_are_framed_not_added():
    t = InFlight()
    t.add(msg(2, body=b"held"), 1, 10)
    out = bytearray()
    batch = [msg(1), msg(2), msg(3), msg(1)]
    assert t.deliver(pack(batch), 4, out, 2, 20) == 2
    assert t.duplicates == 2
    assert bytes(out) == b"".join(frame(bumped(m)) for m in batch)
    assert len(t) == 3
    assert t.client_count(1) == 1 and t.client_count(2) == 2
    assert t.requeue(mid(2), 1) == msg(2, body=b"held")      # the owner is unchanged
    assert t.get_deadline(mid(1)) == 20
    with pytest.raises(AttributeError):
        t.duplicates = 0


BAD_RECORDS = [
    # (records, count, error)
    (pack([msg(1)]), 2, "ends inside record 1"),
    (pack([msg(1)])[:-1], 1, "runs past the end"),
    (pack([msg(1)]) + b"\x01\x00", 2, "ends inside record 1"),
    (pack([msg(1), b"\0" * 25]), 2, "record 1 is a message of 25 bytes"),
    (struct.pack("=I", 0), 1, "record 0 is a message of 0 bytes"),
    (b"", -1, "negative"),
]


@pytest.mark.parametrize("records,count,error", BAD_RECORDS)
def test_deliver_validates_before_changing_anything(records, count, error):
    t = InFlight()
    out = bytearray(b"x")
    with pytest.raises(ValueError, match=error):
        t.deliver(records, count, out, 1, 0)
    assert out == b"x" and len(t) == 0 and t.total_bytes == 0


def test_deliver_out_must_be_bytearray():
    with pytest.raises(TypeError):
        InFlight().deliver(pack([msg(1)]), 1, None, 1, 0)


# -- deadlines: pop_expired, touch, drain ---------------------------------------

def test_pop_expired_order_and_removal():
    t = InFlight()
    deadlines = {1: 50, 2: 10, 3: 30, 4: 10, 5: 70, 6: 30}
    for i, d in deadlines.items():
        t.add(msg(i), i % 2, d)
    assert t.next_deadline() == 10
    buf = bytearray(4096)
    n, nbytes = t.pop_expired(30, buf)
    # earliest first; equal deadlines in the order added
    assert unpack(buf, nbytes) == [msg(2), msg(4), msg(3), msg(6)]
    assert (n, nbytes) == (4, 4 * (4 + len(msg(1))))
    assert bytes(buf[:4]) == struct.pack("=I", len(msg(2)))
    assert len(t) == 2 and t.next_deadline() == 50
    assert t.client_count(0) == 0 and t.client_count(1) == 2
    assert t.pop_expired(49, buf) == (0, 0)
    assert t.finish(mid(2), 0) == NOT_IN_FLIGHT
    n, nbytes = t.pop_expired(1000, buf)
    assert unpack(buf, nbytes) == [msg(1), msg(5)]
    assert t.next_deadline() == -1 and len(t) == 0 and t.total_bytes == 0


def test_pop_expired_stops_when_the_next_does_not_fit():
    t = InFlight()
    sizes = [100, 200, 50]
    for i, size in enumerate(sizes):
        t.add(msg(i, body=b"z" * (size - 26)), 1, i)
    buf = bytearray(4 + 100 + 4 + 200 + 4 + 49)
    assert t.pop_expired(10, buf) == (2, 308)
    assert len(t) == 1
    small = bytearray(4 + 49)
    with pytest.raises(ValueError, match="cannot hold the next message of 50 bytes"):
        t.pop_expired(10, small)
    assert len(t) == 1
    assert t.pop_expired(10, bytearray(54)) == (1, 54)


def test_pop_expired_needs_a_writable_buffer():
    t = InFlight()
    t.add(msg(1), 1, 0)
    with pytest.raises(BufferError):
        t.pop_expired(0, bytes(100))
    assert len(t) == 1


def test_touch_moves_a_deadline():
    t = InFlight()
    t.add(msg(1), 1, 10)
    t.add(msg(2), 1, 20)
    assert t.touch(mid(1), 1, 30) == OK
    assert t.get_deadline(mid(1)) == 30 and t.next_deadline() == 20
    buf = bytearray(1024)
    n, nbytes = t.pop_expired(25, buf)
    assert unpack(buf, nbytes) == [msg(2)]
    assert t.touch(mid(1), 1, 5) == OK                    # earlier works too
    assert t.next_deadline() == 5


def test_touch_to_an_equal_deadline_goes_behind():
    t = InFlight()
    for i in range(3):
        t.add(msg(i), 1, 100)
    t.touch(mid(0), 1, 100)
    assert drain_all(t) == [msg(1), msg(2), msg(0)]


def test_drain_everything_in_deadline_order():
    t = InFlight()
    order = list(range(200))
    random.Random(1).shuffle(order)
    for i in order:
        t.add(msg(i, body=b"q" * 300), i % 5, 1000 - i)
    buf = bytearray(10 * (4 + 326))
    got = []
    calls = 0
    while True:
        n, nbytes = t.drain(buf)
        if n == 0:
            assert nbytes == 0
            break
        assert n == 10 and nbytes == 3300
        got += unpack(buf, nbytes)
        calls += 1
    assert calls == 20
    assert got == [msg(i, body=b"q" * 300) for i in reversed(range(200))]
    assert len(t) == 0 and t.total_bytes == 0 and t.next_deadline() == -1
    assert all(t.client_count(c) == 0 for c in range(5))


def test_negative_and_extreme_deadlines():
    t = InFlight()
    t.add(msg(1), 1, 2**63 - 1)
    t.add(msg(2), 1, -(2**63))
    buf = bytearray(1024)
    n, nbytes = t.pop_expired(-(2**63), buf)
    assert unpack(buf, nbytes) == [msg(2)]
    assert t.pop_expired(2**63 - 2, buf) == (0, 0)
    assert t.drain(buf)[0] == 1


# -- accounting ----------------------------------------------------------------------

def test_total_bytes_and_client_counts():
    t = InFlight()
    expected = 0
    for i in range(30):
        m = msg(i, body=b"x" * (i * 7))
        t.add(m, i % 3, i)
        expected += len(m)
        assert t.total_bytes == expected
    assert [t.client_count(c) for c in range(4)] == [10, 10, 10, 0]
    t.finish(mid(0), 0)
    expected -= len(msg(0, body=b""))
    t.requeue(mid(1), 1)
    expected -= len(msg(1, body=b"x" * 7))
    assert t.total_bytes == expected
    assert [t.client_count(c) for c in range(3)] == [9, 9, 10]


def test_many_clients_come_and_go():
    t = InFlight()
    for round_ in range(5):
        for c in range(1000):
            t.add(msg(round_ * 10_000 + c), c + round_ * 1000, 0)
        assert t.client_count(round_ * 1000 + 999) == 1
        for c in range(1000):
            assert t.finish(mid(round_ * 10_000 + c), c + round_ * 1000) == OK
        assert t.client_count(round_ * 1000) == 0
    assert len(t) == 0


def test_growth_100k_with_random_finishes_against_a_dict():
    rng = random.Random(42)
    t = InFlight(16)
    first_slots = t.table_slots
    model = {}                         # id -> (message, client)
    for i in range(100_000):
        m = msg(rng.getrandbits(64), body=b"p" * rng.randrange(0, 64))
        key = m[10:26]
        if key in model:
            continue
        client = rng.randrange(8)
        t.add(m, client, rng.randrange(1_000_000))
        model[key] = (m, client)
        if rng.random() < 0.3:
            victim = rng.choice(list(model)) if i % 1000 == 0 else key
            vm, vc = model.pop(victim)
            assert t.finish(victim, vc + 1) == NOT_OWNER
            assert t.finish(victim, vc) == OK
    assert t.table_slots > first_slots
    assert len(t) == len(model)
    assert t.total_bytes == sum(len(m) for m, _ in model.values())
    for c in range(8):
        assert t.client_count(c) == sum(1 for _, mc in model.values() if mc == c)
    keys = list(model)
    rng.shuffle(keys)
    for key in keys[: len(keys) * 9 // 10]:
        m, c = model.pop(key)
        if rng.random() < 0.5:
            assert t.requeue(key, c) == m
        else:
            assert t.finish(key, c) == OK
        assert t.get_deadline(key) == -1
    assert len(t) == len(model)
    for key in model:
        assert key in t and t.get_deadline(key) >= 0
    assert sorted(drain_all(t)) == sorted(m for m, _ in model.values())
    assert t.table_slots < 4 * len(model)              # shrank after the burst
    assert t.total_bytes == 0


def test_dealloc_with_messages_in_flight():
    for _ in range(3):
        t = InFlight()
        for i in range(1000):
            t.add(msg(i), 1, i)
        q = DeferredQueue()
        for i in range(1000):
            q.push(msg(i), i)
        del t, q


# -- DeferredQueue -----------------------------------------------------------------

def test_deferred_queue_order_and_pop_due():
    q = DeferredQueue()
    assert q.next_due() == -1 and len(q) == 0
    dues = [(1, 300), (2, 100), (3, 200), (4, 100), (5, 50)]
    for i, due in dues:
        q.push(msg(i), due)
    assert len(q) == 5 and q.total_bytes == 5 * len(msg(1)) and q.next_due() == 50
    assert q.contains(mid(3)) and not q.contains(mid(9))
    buf = bytearray(4096)
    n, nbytes = q.pop_due(150, buf)
    assert unpack(buf, nbytes) == [msg(5), msg(2), msg(4)]
    assert n == 3 and nbytes == 3 * (4 + len(msg(1)))
    assert not q.contains(mid(2))
    assert q.next_due() == 200 and len(q) == 2
    assert q.pop_due(199, buf) == (0, 0)
    n, nbytes = q.drain(buf)
    assert unpack(buf, nbytes) == [msg(3), msg(1)]
    assert q.drain(buf) == (0, 0)
    assert q.total_bytes == 0 and q.next_due() == -1


def test_deferred_queue_buffer_fit_and_validation():
    q = DeferredQueue()
    with pytest.raises(ValueError, match="shorter than its 26-byte header"):
        q.push(b"short", 0)
    for i in range(3):
        q.push(msg(i), 0)
    one = 4 + len(msg(0))
    with pytest.raises(ValueError, match="cannot hold the next message"):
        q.pop_due(0, bytearray(one - 1))
    assert q.pop_due(0, bytearray(2 * one + 1)) == (2, 2 * one)
    assert len(q) == 1


def test_deferred_queue_copies_and_keeps_duplicates():
    q = DeferredQueue()
    data = bytearray(msg(1))
    q.push(data, 5)
    data[0] = 0xFF
    q.push(msg(1, body=b"again"), 5)
    buf = bytearray(1024)
    n, nbytes = q.pop_due(5, buf)
    assert unpack(buf, nbytes) == [msg(1), msg(1, body=b"again")]


# -- model-based: InFlight against a dict and a sorted key --------------------------

POOL = 24
CLIENTS = [1, 2, 3]


class InFlightMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.table = InFlight(4)
        self.model = {}               # id -> [message, client, deadline, seq]
        self.seq = 0

    def _next_seq(self):
        self.seq += 1
        return self.seq

    def _order(self):
        return sorted(self.model.items(), key=lambda kv: (kv[1][2], kv[1][3]))

    @rule(i=st.integers(0, POOL - 1), client=st.sampled_from(CLIENTS),
          deadline=st.integers(0, 100), body=st.binary(max_size=40),
          attempts=st.integers(0, 65535))
    def add(self, i, client, deadline, body, attempts):
        m = msg(i, attempts=attempts, body=body)
        if mid(i) in self.model:
            with pytest.raises(KeyError):
                self.table.add(m, client, deadline)
        else:
            self.table.add(m, client, deadline)
            self.model[mid(i)] = [m, client, deadline, self._next_seq()]

    @rule(ids=st.lists(st.integers(0, POOL - 1), max_size=6),
          client=st.sampled_from(CLIENTS), deadline=st.integers(0, 100))
    def deliver(self, ids, client, deadline):
        batch = [msg(i, attempts=i * 1000) for i in ids]
        out = bytearray()
        before = self.table.duplicates
        added = 0
        for m in batch:
            key = m[10:26]
            if key not in self.model:
                self.model[key] = [bumped(m), client, deadline, self._next_seq()]
                added += 1
        assert self.table.deliver(pack(batch), len(batch), out, client, deadline) == added
        assert self.table.duplicates - before == len(batch) - added
        assert bytes(out) == b"".join(frame(bumped(m)) for m in batch)

    def _status(self, i, client):
        entry = self.model.get(mid(i))
        if entry is None:
            return NOT_IN_FLIGHT, None
        if entry[1] != client:
            return NOT_OWNER, None
        return OK, entry

    @rule(i=st.integers(0, POOL - 1), client=st.sampled_from(CLIENTS))
    def finish(self, i, client):
        status, _ = self._status(i, client)
        assert self.table.finish(mid(i), client) == status
        if status == OK:
            del self.model[mid(i)]

    @rule(i=st.integers(0, POOL - 1), client=st.sampled_from(CLIENTS))
    def requeue(self, i, client):
        status, entry = self._status(i, client)
        got = self.table.requeue(mid(i), client)
        if status == OK:
            assert got == entry[0]
            del self.model[mid(i)]
        else:
            assert got == status

    @rule(i=st.integers(0, POOL - 1), client=st.sampled_from(CLIENTS),
          deadline=st.integers(0, 100))
    def touch(self, i, client, deadline):
        status, entry = self._status(i, client)
        assert self.table.touch(mid(i), client, deadline) == status
        if status == OK:
            entry[2] = deadline
            entry[3] = self._next_seq()

    @rule(now=st.integers(-1, 100), room=st.integers(0, 400))
    def pop_expired(self, now, room):
        due = [(k, e) for k, e in self._order() if e[2] <= now]
        expected, pos = [], 0
        for _, entry in due:
            if pos + 4 + len(entry[0]) > room:
                break
            expected.append(entry[0])
            pos += 4 + len(entry[0])
        buf = bytearray(room)
        if due and not expected:
            with pytest.raises(ValueError):
                self.table.pop_expired(now, buf)
            return
        assert self.table.pop_expired(now, buf) == (len(expected), pos)
        assert unpack(buf, pos) == expected
        for key, _ in due[: len(expected)]:
            del self.model[key]

    @rule()
    def drain(self):
        expected = [e[0] for _, e in self._order()]
        assert drain_all(self.table) == expected
        self.model.clear()

    @invariant()
    def agrees(self):
        t, model = self.table, self.model
        assert len(t) == len(model)
        assert t.total_bytes == sum(len(e[0]) for e in model.values())
        order = self._order()
        assert t.next_deadline() == (order[0][1][2] if order else -1)
        for c in CLIENTS:
            assert t.client_count(c) == sum(1 for e in model.values() if e[1] == c)
        for i in range(POOL):
            entry = model.get(mid(i))
            assert t.get_deadline(mid(i)) == (entry[2] if entry else -1)


InFlightMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=60,
                                             deadline=None)
TestInFlightModel = InFlightMachine.TestCase


def test_take_retries_gives_back_attempts_and_defers_what_is_not_due(tmp_path):
    name = f"nsqshm-test-retries-{os.getpid()}-{random.getrandbits(32):08x}"
    cur = Cursor.open(name, str(tmp_path / "c.cursor"), 0)
    try:
        cursors = CursorSet(1)
        cursors[0] = cur
        cur.note_retry(1, 4)                   # put back once more: due now
        cur.note_retry(2, 2, 10_500)           # deferred until 10.5 s (unix ms)
        cur.note_retry(3, 7, 9_000)            # was deferred, due already

        def record(offset):
            msg = struct.pack(">qH", 99, 0) + log_message_id(0, offset) + b"body"
            return struct.pack("<I", len(msg)) + msg
        packed = bytearray(record(0) + record(1) + record(2) + record(3))
        deferred = DeferredQueue()
        now, ndeferred, due = deferred.take_retries(cursors, packed, 10_000, 1_000_000_000,
                                                    3_600_000)
        assert ndeferred == 1 and due == 1_000_000_000 + 500 * 1_000_000
        assert now == record(0) + _with_attempts(record(1), 4) + _with_attempts(record(3), 7)
        assert len(deferred) == 1 and deferred.next_due() == due
        buf = bytearray(1024)
        n, nbytes = deferred.pop_due(due, buf)
        assert n == 1 and bytes(buf[:nbytes]) == _with_attempts(record(2), 2)
        # a message with a time to live keeps its bit (the attempts field's top one);
        # a due time past --max-req-timeout is cut to it
        cur.note_retry(4, 5, 10_000 + 10 ** 12)
        ttl = bytearray(record(4))
        ttl[12] |= 0x80
        now, ndeferred, due = deferred.take_retries(cursors, ttl, 10_000, 0, 1_000)
        assert (now, ndeferred, due) == (bytearray(), 1, 1_000 * 1_000_000)
        n, nbytes = deferred.pop_due(due, buf)
        assert buf[12:14] == bytes((0x80, 5))
    finally:
        cur.close()
        os.unlink(f"/dev/shm/{name}")


def test_take_retries_gives_what_went_out_below_the_delivered_mark_one_delivery(tmp_path):
    """A new leader's take-up (LogChannel.take_up_retries): below the cursor's
    delivered mark, an unfinished message the retry table does not have was in
    flight -- delivered once, never put back -- so it gets attempts 1 (its next
    delivery is the 2nd); one the table has keeps the table's; at or above the
    mark, nothing (never delivered)."""
    name = f"nsqshm-test-delivered-{os.getpid()}-{random.getrandbits(32):08x}"
    cur = Cursor.open(name, str(tmp_path / "c.cursor"), 0)
    try:
        cursors = CursorSet(1)
        cursors[0] = cur
        cur.set_delivered(3)
        cur.note_retry(1, 4)
        cur.finish(2)

        def record(offset):
            msg = struct.pack(">qH", 99, 0) + log_message_id(0, offset) + b"body"
            return struct.pack("<I", len(msg)) + msg
        packed = bytearray(record(0) + record(1) + record(3))
        now, ndeferred, _ = DeferredQueue().take_retries(cursors, packed, 10_000, 0, 3_600_000)
        assert ndeferred == 0
        assert now == _with_attempts(record(0), 1) + _with_attempts(record(1), 4) + record(3)
        cur.set(5)  # a reset without a hold (retention's move) only raises the mark
        assert cur.delivered == 5
        cur.set(0, hold=True)  # a seek: nothing from there on went out since
        cur.release(0)
        assert cur.delivered == 0
        now, _, _ = DeferredQueue().take_retries(cursors, bytearray(record(0)), 10_000, 0, 1)
        assert now == record(0)
    finally:
        cur.close()
        os.unlink(f"/dev/shm/{name}")


def _with_attempts(record, attempts):
    return record[:12] + struct.pack(">H", attempts) + record[14:]
