"""A hypothesis state machine: the ring against a pure-Python model.

The model keeps a deque of records and the two byte positions, with the
layout's arithmetic (8-byte record header, 8-byte alignment, wrap marker),
so every FULL the ring reports is checked, not just tolerated.
"""

import collections
import os
import uuid

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from nsqshm.ring import EMPTY, FULL, OK, TOO_BIG, Ring

CAPACITY = 4096
MAX_RECORD = 700


class Model:
    def __init__(self):
        self.records = collections.deque()  # (bytes, start position, end position)
        self.head = 0
        self.tail = 0

    def push(self, rec):
        if len(rec) > MAX_RECORD:
            return TOO_BIG
        need = 8 + (len(rec) + 7) // 8 * 8
        off = self.tail % CAPACITY
        contig = CAPACITY - off
        total = need if need <= contig else contig + need
        if self.tail - self.head + total > CAPACITY:
            return FULL
        start = self.tail if need <= contig else self.tail + contig
        self.tail = start + need
        self.records.append((rec, self.tail))
        return OK

    def pop(self):
        if not self.records:
            return None
        rec, end = self.records.popleft()
        self.head = end
        return rec


records = st.binary(min_size=0, max_size=MAX_RECORD + 40)


class RingMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.name = f"nsqshm-test-model-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.ring = Ring.create(self.name, CAPACITY, max_record=MAX_RECORD)
        self.peer = Ring.attach(self.name)  # a second handle, as another process
        self.model = Model()

    def teardown(self):
        self.peer.close()
        self.ring.close()
        Ring.unlink_segment(self.name)

    @rule(rec=records, via_peer=st.booleans())
    def push(self, rec, via_peer):
        ring = self.peer if via_peer else self.ring
        assert ring.push(rec) == self.model.push(rec)

    @rule(recs=st.lists(st.binary(max_size=MAX_RECORD), max_size=12))
    def push_many(self, recs):
        expected = 0
        for rec in recs:
            if self.model.push(rec) != OK:
                break
            expected += 1
        assert self.ring.push_many(recs) == expected

    @rule(recs=st.lists(st.binary(max_size=MAX_RECORD), max_size=12))
    def push_packed(self, recs):
        packed = b"".join(len(r).to_bytes(4, "little") + r for r in recs)
        expected, consumed = 0, 0
        for rec in recs:
            if self.model.push(rec) != OK:
                break
            expected += 1
            consumed += 4 + len(rec)
        assert self.peer.push_packed(packed) == (expected, consumed)

    @rule(via_peer=st.booleans())
    def pop(self, via_peer):
        ring = self.peer if via_peer else self.ring
        assert ring.pop() == self.model.pop()

    @rule(k=st.integers(min_value=1, max_value=20))
    def pop_many(self, k):
        expected = []
        while len(expected) < k and self.model.records:
            expected.append(self.model.pop())
        assert self.ring.pop_many(k) == expected

    @rule(size=st.integers(min_value=0, max_value=MAX_RECORD + 8))
    def pop_into(self, size):
        buf = bytearray(size)
        got = self.peer.pop_into(buf)
        if not self.model.records:
            assert got == EMPTY
        elif len(self.model.records[0][0]) > size:
            assert got == TOO_BIG
        else:
            rec = self.model.pop()
            assert got == len(rec) and bytes(buf[:got]) == rec

    @precondition(lambda self: self.model.records)
    @rule(room=st.integers(min_value=MAX_RECORD + 4, max_value=3 * MAX_RECORD))
    def pop_many_into(self, room):
        buf = bytearray(room)
        expected, pos = [], 0
        while self.model.records and pos + 4 + len(self.model.records[0][0]) <= room:
            rec = self.model.pop()
            expected.append(rec)
            pos += 4 + len(rec)
        n, nbytes = self.ring.pop_many_into(buf)
        assert (n, nbytes) == (len(expected), pos)
        assert bytes(buf[:nbytes]) == b"".join(len(r).to_bytes(4, "little") + r for r in expected)

    @invariant()
    def counters_agree(self):
        assert self.ring.depth == len(self.model.records)
        assert self.peer.depth_bytes == sum(len(r) for r, _ in self.model.records)
        assert self.ring.used_bytes == self.model.tail - self.model.head


RingMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)
TestRingModel = RingMachine.TestCase
