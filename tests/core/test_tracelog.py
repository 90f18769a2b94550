"""TraceWriter and find (_core/tracelog.pyx): the 64-byte records byte for
byte, from packed records, output frames, single events and the command
parser; rotation past max_bytes; a torn tail; the search by ID and by trace
ID; and the bad input each refuses."""

import os
import struct

import pytest

from nsqshm._core import codec, tracelog
from nsqshm._core.commands import CommandParser
from nsqshm._core.inflight import DeferredQueue, InFlight
from nsqshm._core.tracelog import RECORD_SIZE, TRACE_MAGIC, TraceWriter
from nsqshm.nsqd.tracing import trace

# [trace record]: ts, event, (0), attempt, stream, id, value, address, port, (0), magic
LAYOUT = struct.Struct("=qBBHI16sQ16s2sHI")
ADDRESS = trace.address_bytes("127.0.0.1:4150")
PORT = (4150).to_bytes(2, "big")
IDS = [b"%016x" % (0xB0 + i) for i in range(3)]


def packed(ids, attempts=1, ts=1_700_000_000_000_000_000):
    """[u32 native size][message] records, as wire.pack_mpub makes them."""
    out = bytearray()
    for msg_id in ids:
        msg = codec.encode_message(msg_id, ts, attempts, b"body")
        out += struct.pack("=I", len(msg)) + msg
    return out


def frames(ids, attempts=2):
    out = bytearray(b"\0\0\0\x0a\0\0\0\0_heart")  # a response frame: not a delivery
    for msg_id in ids:
        msg = codec.encode_message(msg_id, 5, attempts, b"x")
        out += struct.pack(">II", len(msg) + 4, 2) + msg
    return out


def records(path):
    with open(path, "rb") as f:
        data = f.read()
    assert len(data) % RECORD_SIZE == 0
    return [LAYOUT.unpack_from(data, pos) for pos in range(0, len(data), RECORD_SIZE)]


@pytest.fixture
def writer(tmp_path):
    w = TraceWriter(os.fsencode(tmp_path / "w0.events"), 1 << 20)
    yield w
    w.close()


def test_the_record_layout_is_64_bytes_with_a_magic():
    assert RECORD_SIZE == LAYOUT.size == trace.RECORD.size == 64
    assert struct.pack("<I", TRACE_MAGIC) == b"NSRT"


def test_published_records_each_message_at_its_own_time(writer, tmp_path):
    assert writer.published(packed(IDS), 3, 9, ADDRESS, [0, 77, 0]) == 0
    got = records(tmp_path / "w0.events")
    assert [(r[1], r[4], r[5], r[6]) for r in got] == [(1, 9, IDS[0], 0), (1, 9, IDS[1], 77),
                                                     (1, 9, IDS[2], 0)]
    assert {r[0] for r in got} == {1_700_000_000_000_000_000}
    assert {(r[7], r[8]) for r in got} == {(ADDRESS[:16], (4150).to_bytes(2, "big"))}
    assert {r[2] for r in got} == {0} and {r[9] for r in got} == {0}
    assert {r[10] for r in got} == {TRACE_MAGIC}
    assert writer.written == 3 and writer.size == 3 * RECORD_SIZE


def test_published_stamps_a_log_partitions_ids_in_place(writer, tmp_path):
    data = packed(IDS)
    writer.published(data, 3, 1, None, None, 2, 40)
    want = [b"%016x" % ((2 << 48) | (40 + k)) for k in range(3)]
    assert [r[5] for r in records(tmp_path / "w0.events")] == want
    assert [bytes(data[4 + 10 + k * 34:4 + 26 + k * 34]) for k in range(3)] == want
    with pytest.raises(TypeError):
        writer.published(bytes(data), 3, 1, None, None, 2, 40)


def test_delivered_records_each_message_frame_from_base(writer, tmp_path):
    out = frames(IDS, attempts=4)
    base = 14  # the response frame before is not a delivery
    writer.delivered(out, base, 3, ADDRESS)
    got = records(tmp_path / "w0.events")
    assert [(r[1], r[3], r[5]) for r in got] == [(2, 4, i) for i in IDS]
    writer.delivered(out + b"\0\0\0\x30\0\0\0\x02", len(out), 3)  # a frame not whole yet
    assert len(records(tmp_path / "w0.events")) == 3


def test_records_and_single_events(writer, tmp_path):
    writer.records(packed(IDS[:2], attempts=3), 2, tracelog.EVENT_CODES["TIMEOUT"], 5)
    writer.event(tracelog.EVENT_CODES["REQ"], IDS[0], 5, ADDRESS, 250)
    got = records(tmp_path / "w0.events")
    assert [(r[1], r[3], r[5], r[6]) for r in got] == [(6, 3, IDS[0], 0), (6, 3, IDS[1], 0),
                                                     (4, 0, IDS[0], 250)]


@pytest.mark.parametrize("call", [
    lambda w: w.event(99, IDS[0], 1),
    lambda w: w.event(3, b"short", 1),
    lambda w: w.event(3, IDS[0], 1, b"\0" * 5),
    lambda w: w.records(packed(IDS[:1]), 2, 6, 1),           # more records than packed
    lambda w: w.records(b"\xff\xff\0\0" + bytes(30), 1, 6, 1),  # a size past the end
    lambda w: w.published(packed(IDS), 3, 1, None, [1]),      # fewer trace IDs than messages
    lambda w: w.published(packed(IDS), 3, 1, None, [1, "x", 2]),
    lambda w: w.published(packed(IDS), 3, 1, None, [1, -1, 2]),
    lambda w: w.delivered(b"", -1, 1),
])
def test_bad_input_is_refused_and_writes_nothing(writer, tmp_path, call):
    with pytest.raises((ValueError, TypeError)):
        call(writer)
    writer.event(3, IDS[0], 1)  # a good one after: the refused batch left nothing behind
    assert writer.written == 1


def test_a_log_past_max_bytes_becomes_dot_1(tmp_path):
    w = TraceWriter(os.fsencode(tmp_path / "w0.events"), 4 * RECORD_SIZE)
    w.published(packed(IDS), 3, 1)
    w.published(packed(IDS[:2]), 2, 1)  # 5 records: past 4, rotated
    assert len(records(tmp_path / "w0.events.1")) == 5
    assert w.size == 0
    w.published(packed(IDS[:1]), 1, 1)
    assert len(records(tmp_path / "w0.events")) == 1
    assert oct(os.stat(tmp_path / "w0.events").st_mode & 0o777) == "0o600"
    with pytest.raises(ValueError):
        TraceWriter(b"/tmp/x", 10)


def test_a_failed_write_is_counted_not_raised(tmp_path):
    w = TraceWriter(os.fsencode(tmp_path / "missing" / "w0.events"), 1 << 20)
    assert w.published(packed(IDS), 3, 1) != 0
    assert (w.failed, w.written) == (3, 0) and w.last_errno


def test_find_by_sorted_ids_and_by_trace_id_skipping_torn_records(writer, tmp_path):
    writer.published(packed(IDS), 3, 1, None, [5, 6, 5])
    writer.delivered(frames(IDS), 0, 2)
    with open(tmp_path / "w0.events", "rb") as f:
        data = f.read()
    assert tracelog.find(data, b"".join(sorted([IDS[2], IDS[0]]))) == [0, 128, 192, 320]
    assert tracelog.find(data, None, 5) == [0, 128]
    torn = bytearray(data[:RECORD_SIZE]) + data[RECORD_SIZE:RECORD_SIZE * 2 - 4] + b"junk"
    assert tracelog.find(torn + data[:10], IDS[0]) == [0]  # a bad magic, a short tail
    with pytest.raises(ValueError):
        tracelog.find(data, b"123")


def test_the_command_parser_records_what_it_applies(writer, tmp_path):
    inflight = InFlight()
    for msg_id in IDS:
        inflight.add(codec.encode_message(msg_id, 1, 1, b"body"), 7, 10**18)
    parser = CommandParser(inflight, DeferredQueue(), None, 7, 60 * 10**9, 900 * 10**9,
                           3600 * 10**9)
    parser.trace_to(writer, 4, ADDRESS)
    buf = bytearray(b"TOUCH %s\nFIN %s\r\nREQ %s 1500\nFIN %s\nNOP\n"
                    % (IDS[0], IDS[0], IDS[1], b"0" * 16))  # the last FIN is not in flight
    parser.parse(buf, 0)
    got = records(tmp_path / "w0.events")
    assert [(r[1], r[4], r[5], r[6], r[8]) for r in got] == [
        (5, 4, IDS[0], 0, PORT), (3, 4, IDS[0], 0, PORT), (4, 4, IDS[1], 1500, PORT)]
    parser.trace_to(None)
    parser.parse(bytearray(b"FIN %s\n" % IDS[2]), 0)
    assert len(records(tmp_path / "w0.events")) == 3
    with pytest.raises(ValueError):
        parser.trace_to(writer, 4, b"short")


@pytest.mark.parametrize("remote, text", [
    ("127.0.0.1:4150", "127.0.0.1:4150"),
    ("[::1]:80", "[::1]:80"),
    ("[2001:db8::7]:65535", "[2001:db8::7]:65535"),
])
def test_client_addresses_round_trip(remote, text):
    raw = trace.address_bytes(remote)
    assert len(raw) == 18
    assert trace._address_text(raw[:16], int.from_bytes(raw[16:], "big")) == text


@pytest.mark.parametrize("remote", ["", None, "host:1", "1.2.3.4:99999", "1.2.3.4:x", "@sock"])
def test_what_is_not_an_ip_address_is_none(remote):
    assert trace.address_bytes(remote) is None
