"""nsqshm._core.localbatch: the C loops of the local clients, against rings
and arenas of their own (no broker)."""

import os
import struct
import uuid

import numpy as np
import pyarrow as pa
import pytest

from nsqshm._core import codec
from nsqshm._core.arena import LIVE, Arena
from nsqshm._core.inflight import InFlight
from nsqshm._core.localbatch import (
    Columns,
    arena_due,
    arena_reset,
    finish_frames,
    index_frames,
    mpub_body,
    pack_bodies,
)
from nsqshm.local.arrow import SCHEMA, record_batch
from nsqshm.ring import Ring

TS = 1_700_000_000_123_456_789


@pytest.fixture
def ids():
    name = f"nsqshm-test-ids-{uuid.uuid4().hex[:8]}"
    gen = codec.IdGenerator.open(name)
    yield gen
    gen.close()
    codec.IdGenerator.unlink(name)


@pytest.fixture
def arena():
    name = f"nsqshm-test-lb-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    a = Arena.create(name, size=1 << 22, max_queues=4, label="test")
    yield a
    a.close()
    Arena.unlink_segment(name)


def unpack(packed):
    out, pos = [], 0
    while pos < len(packed):
        (n,) = struct.unpack_from("=I", packed, pos)
        out.append(codec.decode_message(bytes(packed[pos + 4:pos + 4 + n])))
        pos += 4 + n
    return out


def test_pack_bodies_from_arrow_offsets(ids):
    arr = pa.array([b"a", b"bb", b"ccc"], type=pa.binary())
    _, offsets, data = arr.buffers()
    out = bytearray()
    assert pack_bodies(data, offsets, None, 0, 3, 4, ids, TS, 100, out) == 3
    msgs = unpack(out)
    assert [m[3] for m in msgs] == [b"a", b"bb", b"ccc"]
    assert all(m[1] == TS and m[2] == 0 for m in msgs)
    assert len({m[0] for m in msgs}) == 3


def test_pack_bodies_numpy_offsets_lengths_and_slices(ids):
    data = b"xxhelloyyworld"
    offsets = np.array([2, 9], dtype=np.int64)
    lengths = np.array([5, 5], dtype=np.int64)
    out = bytearray()
    pack_bodies(data, offsets, lengths, 1, 1, 8, ids, TS, 100, out)
    assert [m[3] for m in unpack(out)] == [b"world"]


@pytest.mark.parametrize("bodies,limit,error", [
    ([b"ok", b""], 100, "empty"),
    ([b"ok", b"x" * 11], 10, "over max_msg_size"),
])
def test_pack_bodies_rejects_and_appends_nothing(ids, bodies, limit, error):
    arr = pa.array(bodies, type=pa.binary())
    _, offsets, data = arr.buffers()
    out = bytearray(b"keep")
    with pytest.raises(ValueError, match=error):
        pack_bodies(data, offsets, None, 0, len(bodies), 4, ids, TS, limit, out)
    assert out == b"keep"


def test_pack_bodies_bounds(ids):
    with pytest.raises(ValueError, match="outside"):
        pack_bodies(b"abc", np.array([0, 9], dtype=np.int64), None, 0, 1, 8, ids, TS, 100,
                    bytearray())
    with pytest.raises(ValueError, match="fewer"):
        pack_bodies(b"abc", np.array([0], dtype=np.int64), None, 0, 1, 8, ids, TS, 100,
                    bytearray())


def test_mpub_body_layout():
    arr = pa.array(["é", "zz"], type=pa.string())
    _, offsets, data = arr.buffers()
    body = mpub_body(data, offsets, None, 0, 2, 4, 100)
    assert body == struct.pack(">I", 2) + struct.pack(">I", 2) + "é".encode() + \
        struct.pack(">I", 2) + b"zz"


def frames_of(messages):
    return b"".join(struct.pack(">II", 4 + len(m), 2) + m for m in messages)


def messages(n, attempts=0, ts=TS):
    return [codec.encode_message(codec.int_to_id(i + 1), ts + i, attempts, b"body%d" % i)
            for i in range(n)]


def test_columns_from_frames_is_the_spark_schema():
    msgs = messages(3, attempts=2)
    buf = frames_of(msgs) + struct.pack(">II", 15, 0) + b"_heartbeat_" + b"\x00\x00"
    cols = Columns()
    pos, added = cols.add_frames(buf)
    assert added == 3 and pos == len(buf) - 2  # the two bytes of a partial frame stay
    rb = record_batch(cols.export(), "t", "c")
    assert rb.schema.equals(SCHEMA)
    assert rb.column("body").to_pylist() == [b"body0", b"body1", b"body2"]
    assert rb.column("id").to_pylist() == [codec.int_to_id(i + 1).decode() for i in range(3)]
    assert rb.column("attempts").to_pylist() == [2, 2, 2]
    assert rb.column("timestamp").cast(pa.int64()).to_pylist() == \
        [(TS + i) // 1000 for i in range(3)]
    assert rb.column("topic").to_pylist() == ["t"] * 3
    assert len(cols) == 0  # export hands the buffers over


def test_columns_since_skips_older_messages():
    cols = Columns()
    cols.since_ns = TS + 1
    cols.add_frames(frames_of(messages(3)))
    assert len(cols) == 2 and cols.skipped == 1


def test_empty_export_is_a_valid_batch():
    rb = record_batch(Columns().export(), "t", "c")
    assert rb.num_rows == 0 and rb.schema.equals(SCHEMA)


def test_take_moves_ring_records_into_the_arena(ring, arena):
    msgs = messages(50)
    assert ring.push_many(msgs) == 50
    q = arena.queue_index("t:c")
    cols = Columns()
    assert cols.take(ring, arena, q, 20, 1 << 40, 123) == 20
    assert ring.depth == 30
    blocks = arena.blocks()
    assert len(blocks) == 20 and all(b[1] == "t:c" and b[2] == LIVE and b[3] == 123
                                     for b in blocks)
    assert [codec.decode_message(b[4])[2] for b in blocks] == [1] * 20  # attempts counted
    rb = record_batch(cols.export(), "t", "c")
    assert rb.column("attempts").to_pylist() == [1] * 20
    assert rb.column("body").to_pylist() == [b"body%d" % i for i in range(20)]
    # collect=False: only the arena
    assert cols.take(ring, arena, q, 100, 1 << 40, 0, False) == 30 and len(cols) == 0
    assert arena.live_blocks == 50 and ring.depth == 0
    assert arena_due(arena) == (50, 123)
    again = Columns()
    offset = again.add_arena(arena, 0, 10)
    assert offset > 0 and len(again) == 10
    assert again.add_arena(arena, offset) == 0 and len(again) == 50
    assert arena_reset(arena) == 50
    assert arena.blocks() == [] and arena.live_blocks == 0
    assert arena_due(arena) == (0, 0)


def test_take_stops_when_the_arena_is_full(ring, arena):
    small = Arena.create(f"{arena.name}-small", size=4096 + 256 + 128 * 3, max_queues=1)
    try:
        ring.push_many(messages(10))
        assert Columns().take(ring, small, small.queue_index("t:c"), 10, 1 << 40, 0) == 3
        assert ring.depth == 7  # the rest stays in the ring
    finally:
        small.close()
        small.unlink()


def test_take_respects_max_bytes(ring, arena):
    ring.push_many(messages(10))
    n = Columns().take(ring, arena, arena.queue_index("t:c"), 10, 5, 0)
    assert n == 1  # stops once the bodies reach max_bytes


def test_index_and_finish_frames(ring):
    ring.push_many(messages(5))
    inflight = InFlight()
    out = bytearray()
    taken, added = inflight.deliver_from_ring(ring, 5, bytearray(1 << 20), out, 7, 1 << 62)
    assert (taken, added) == (5, 5)
    starts = np.empty(8, dtype=np.int64)
    sizes = np.empty(8, dtype=np.int64)
    assert index_frames(out, 0, len(out), starts, sizes) == 5
    assert bytes(out[starts[0] + 26:starts[0] + sizes[0]]) == b"body0"
    assert finish_frames(inflight, out, starts[:2], 2, 99) == 0  # not the owner
    assert finish_frames(inflight, out, starts, 5, 7) == 5
    assert len(inflight) == 0
    assert finish_frames(inflight, out, starts, 5, 7) == 0


@pytest.fixture
def ring(ring_name):
    r = Ring.create(ring_name, capacity=1 << 20)
    yield r
    r.close()
