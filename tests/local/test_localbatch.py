"""nsqshm._core.localbatch: the C loops of the local clients, against rings
and arenas of their own (no broker)."""

import struct
import uuid

import numpy as np
import pyarrow as pa
import pytest

from nsqshm._core import codec
from nsqshm._core.arena import LIVE, Arena
from nsqshm._core.ext import ext_body
from nsqshm._core.inflight import InFlight
from nsqshm._core.localbatch import (
    Columns,
    arena_due,
    arena_reset,
    finish_frames,
    index_frames,
    mpub_body,
    mpub_ext_body,
    pack_bodies,
)
from nsqshm.local.arrow import (
    HEADERS_TYPE,
    SCHEMA,
    body_spans,
    header_spans,
    headers_array,
    record_batch,
    with_headers,
)
from nsqshm.ring import Ring

TS = 1_700_000_000_123_456_789


@pytest.fixture
def ids():
    name = f"nsqshm-test-ids-{uuid.uuid4().hex[:8]}"
    gen = codec.IdGenerator.open(name)
    yield gen
    gen.close()
    codec.IdGenerator.unlink(name)


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


def ext_messages(parts):
    """Messages of an ext topic: (JSON headers or None, body) each."""
    return [codec.encode_message(codec.int_to_id(i + 1), TS + i, 1, ext_body(h, b))
            for i, (h, b) in enumerate(parts)]


EXT_ROWS = [  # (stored JSON headers, body, the headers column's row)
    (b'{"k":"v","n":3}', b"b0", [("k", b"v"), ("n", b"3")]),
    (None, b"b1", None),                                  # version 0: no headers
    (b"{}", b"b2", None),                                 # none either (Kafka: null)
    (b'{"q\\"":"\\u00e9\\t","o":{"a":[1]}}', b"", [('q"', "é\t".encode()),
                                                    ("o", b'{"a":[1]}')]),
    (b'{"bad', b"b4", None),                              # not an object: none
]


@pytest.mark.parametrize("headers", [False, True])
def test_columns_cut_the_ext_part_and_lay_out_headers(headers):
    msgs = ext_messages([(h, b) for h, b, _ in EXT_ROWS])
    cols = Columns(ext=True, headers=headers)
    cols.add_frames(frames_of(msgs[:2]))
    cols.add_records(b"".join(struct.pack("=I", len(m)) + m for m in msgs[2:]), 3)
    exported = cols.export()
    rb = with_headers(exported, "t", "c", headers)
    assert rb.column("body").to_pylist() == [b for _, b, _ in EXT_ROWS]
    assert rb.column("attempts").to_pylist() == [1] * 5
    if not headers:
        assert exported[6] is None and rb.schema.equals(SCHEMA)
        return
    column = headers_array(exported)
    column.validate(full=True)
    assert column.type == HEADERS_TYPE
    assert [None if r is None else [(p["key"], p["value"]) for p in r]
            for r in column.to_pylist()] == [want for _, _, want in EXT_ROWS]
    # the next batch starts empty, its own buffers
    cols.add_frames(frames_of(msgs[:1]))
    again = headers_array(cols.export())
    assert again.to_pylist() == [[{"key": "k", "value": b"v"}, {"key": "n", "value": b"3"}]]


def test_columns_without_ext_keep_the_bytes_and_have_null_headers():
    """A topic without ext: bodies as stored, the headers column all null."""
    msgs = ext_messages([(b'{"k":"v"}', b"x")])
    cols = Columns(headers=True)   # headers need ext: nothing laid out
    cols.add_frames(frames_of(msgs))
    rb = with_headers(cols.export(), "t", "c", True)
    assert rb.column("body").to_pylist() == [ext_body(b'{"k":"v"}', b"x")]
    assert rb.column("headers").to_pylist() == [None]
    empty = Columns(ext=True, headers=True).export()
    assert headers_array(empty).to_pylist() == []
    assert with_headers(empty, "t", "c", True).schema.names[-1] == "headers"


def _ext_body(bodies, headers, max_size=1 << 20, max_header=16384, max_bytes=1 << 22):
    data, offsets, width, start, count = body_spans(bodies)
    rows, valid, keys, values, pairs = header_spans(headers)
    return mpub_ext_body(data, offsets, start, count, width, rows, valid, *keys, *values,
                         pairs, max_size, max_header, max_bytes)


def test_mpub_ext_body_layout():
    """MPUB_EXT: [4 count] ([4 size][2 n][n JSON][body])*, each row's pairs one
    JSON object of strings; a null or empty list: n = 0."""
    headers = pa.array([[{"key": "a", "value": b'x"\\\n'}], None, [],
                        [{"key": "k1", "value": b"1"}, {"key": "é", "value": b""}]],
                       type=HEADERS_TYPE)
    bodies = pa.array([b"b0", b"b1", b"b2", b"b3"])
    j0 = rb'{"a":"x\"\\\u000a"}'
    j3 = '{"k1":"1","é":""}'.encode()
    want = struct.pack(">I", 4) + b"".join(
        struct.pack(">IH", 2 + len(j) + 2, len(j)) + j + b
        for j, b in ((j0, b"b0"), (b"", b"b1"), (b"", b"b2"), (j3, b"b3")))
    assert _ext_body(bodies, headers) == (want, 4)
    # a slice of both (Spark's batches are slices), large types, chunks
    assert _ext_body(bodies[3:], headers[3:])[0] == \
        struct.pack(">II", 1, 2 + len(j3) + 2) + struct.pack(">H", len(j3)) + j3 + b"b3"
    large = headers.cast(pa.large_list(pa.struct([("key", pa.large_string()),
                                                  ("value", pa.large_binary())])))
    assert _ext_body(bodies[1:], large[1:])[0] == _ext_body(bodies[1:], headers[1:])[0]
    assert _ext_body(bodies, pa.chunked_array([headers[:2], headers[2:]])) == (want, 4)
    # as many rows as fit max_bytes, at least one
    body, n = _ext_body(bodies, headers, max_bytes=30)
    assert n == 1 and body == struct.pack(">I", 1) + want[4:4 + 4 + 2 + len(j0) + 2]
    assert _ext_body(bodies, headers, max_bytes=1)[1] == 1


@pytest.mark.parametrize("kwargs, error", [
    ({"max_header": 10}, "row 0: its headers are 11 bytes of JSON, over 10"),
    ({"max_size": 12}, "row 0: 2 bytes of body and 11 of headers, over max_msg_size 12"),
])
def test_mpub_ext_body_limits(kwargs, error):
    headers = pa.array([[{"key": "a", "value": b"xyz"}]] * 2, type=HEADERS_TYPE)
    with pytest.raises(ValueError, match=error):
        _ext_body(pa.array([b"b0", b"b1"]), headers, **kwargs)


@pytest.mark.parametrize("headers, error", [
    (pa.array([[{"key": None, "value": b"v"}]], type=HEADERS_TYPE), "null key or value"),
    (pa.array([[{"key": "", "value": b"v"}]], type=HEADERS_TYPE), "empty key"),
    (pa.array([["a"]]), "must be array<struct<key, value>>"),
])
def test_header_spans_refuses(headers, error):
    with pytest.raises((TypeError, ValueError), match=error):
        header_spans(headers)


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
