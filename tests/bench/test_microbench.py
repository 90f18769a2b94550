"""pytest-benchmark micro-benchmarks of the Cython primitives on the
per-message path: `make microbench` (they are out of the default run).

Each benchmark moves a batch the size the broker uses, so the figures read
as per-batch costs; divide by the batch for per message."""

import os
import struct
import time
import uuid

import pytest

from nsqshm._core import codec, wire
from nsqshm._core.commands import CommandParser
from nsqshm._core.inflight import InFlight
from nsqshm.ring import Ring

pytestmark = pytest.mark.microbench

BODY = b"x" * 200
BATCH = 200       # messages per MPUB, as the tcp suite
WINDOW = 2500     # RDY: deliveries and FINs per window


@pytest.fixture(scope="module")
def ids():
    name = f"nsqshm-mb-{os.getpid()}-{uuid.uuid4().hex[:8]}.ids"
    gen = codec.IdGenerator.open(name)
    yield gen
    gen.close()
    codec.IdGenerator.unlink(name)


def records(ids, n, body=BODY):
    """n packed [u32 size][message] records, as a ring or pack_mpub holds them."""
    out = bytearray()
    for _ in range(n):
        wire.pack_message(body, ids, time.time_ns(), out)
    return bytes(out)


def test_codec_encode_message(benchmark):
    msg_id = b"0123456789abcdef"
    benchmark(codec.encode_message, msg_id, time.time_ns(), 1, BODY)


def test_codec_decode_message(benchmark):
    msg = codec.encode_message(b"0123456789abcdef", time.time_ns(), 1, BODY)
    benchmark(codec.decode_message, msg)


def test_wire_pack_mpub_200(benchmark, ids):
    body = struct.pack(">I", BATCH) + (struct.pack(">I", len(BODY)) + BODY) * BATCH

    def pack():
        out = bytearray()
        status, _, count = wire.pack_mpub(body, ids, time.time_ns(), 1 << 20, 5 << 20, out)
        assert status == wire.MPUB_OK and count == BATCH

    benchmark(pack)


def test_wire_scan_deliveries_2500(benchmark, ids):
    flight, frames = InFlight(), bytearray()
    flight.deliver(records(ids, WINDOW), WINDOW, frames, 1, time.monotonic_ns() + 10**12)
    frames = bytes(frames)

    def scan():
        fins = bytearray()
        used, messages, _ = wire.scan_deliveries(frames, fins)
        assert messages == WINDOW

    benchmark(scan)


def test_ring_push_pop_batched_256(benchmark, ring_name):
    ring = Ring.create(ring_name, 8 << 20, max_record=4096)
    packed = memoryview(b"".join(struct.pack("=I", 100) + b"r" * 100 for _ in range(256)))
    buf = bytearray(1 << 20)

    def round_trip():
        ring.push_packed(packed)
        n, _ = ring.pop_many_into(buf)
        assert n == 256

    benchmark(round_trip)
    ring.close()


def test_inflight_deliver_then_fin_2500(benchmark, ids):
    """A window: frame 2500 messages into the output buffer and put them in
    flight, then finish them all from the client's FIN lines (fin_lines)."""
    batch = records(ids, WINDOW)
    flight = InFlight(WINDOW)
    deadline = time.monotonic_ns() + 10**12

    def window():
        out, fins = bytearray(), bytearray()
        assert flight.deliver(batch, WINDOW, out, 7, deadline) == WINDOW
        wire.scan_deliveries(out, fins)
        pos, done = wire.fin_lines(fins, 0, flight, 7)
        assert done == WINDOW and len(flight) == 0

    benchmark(window)


def test_inflight_fin_lines_2500(benchmark, ids):
    batch = records(ids, WINDOW)
    flight = InFlight(WINDOW)
    deadline = time.monotonic_ns() + 10**12

    def setup():
        out, fins = bytearray(), bytearray()
        flight.deliver(batch, WINDOW, out, 7, deadline)
        wire.scan_deliveries(out, fins)
        return (fins, 0, flight, 7), {}

    result = benchmark.pedantic(wire.fin_lines, setup=setup, rounds=200)
    assert result[1] == WINDOW


def test_command_parser_2500_crlf(benchmark, ids):
    """The consumer's command parser (commands.CommandParser) on a window of
    2500 FINs ended by '\\r\\n' (the lines fin_lines left to Python)."""
    batch = records(ids, WINDOW)
    flight = InFlight(WINDOW)
    deadline = time.monotonic_ns() + 10**12
    parser = CommandParser(flight, None, None, 7, 60 * 10**9, 900 * 10**9, 3600 * 10**9)

    def setup():
        out, fins = bytearray(), bytearray()
        flight.deliver(batch, WINDOW, out, 7, deadline)
        wire.scan_deliveries(out, fins)
        return (bytearray(fins.replace(b"\n", b"\r\n")), 0), {}

    benchmark.pedantic(parser.parse, setup=setup, rounds=200)
    assert parser.finished == WINDOW
