"""snappy and deflate negotiated through IDENTIFY: the upgrade sequence on
the wire, golang/snappy's framing byte for byte, deflate levels, the flags
that turn them off, large and compressible traffic both ways, a corrupt
stream, and pynsq and gnsq with each."""

import os
import struct
import zlib

import pytest

from nsqshm import protocol as p
from nsqshm._core import snappy as nsnappy
from tests.nsqd.conftest import wait_for
from tests.nsqd.transport import Conn, frame_bytes, mpublish, run_client, tcp_clients

WORKER_COUNTS = (1, 2)  # every test on one worker and on two (conftest.py)

OK = frame_bytes(0, b"OK")


def snappy_reply_bytes(data):
    """What golang/snappy's Writer sends for one short write: the stream
    identifier, then the data stored (compression would not save 1/8)."""
    crc = nsnappy.masked_crc(data)
    return (b"\xff\x06\x00\x00sNaPpY" + b"\x01" + (len(data) + 4).to_bytes(3, "little")
            + crc.to_bytes(4, "little") + data)


def test_identify_snappy_sequence_bytes(nsqd):
    c = Conn(nsqd)
    c.send(p.identify({"feature_negotiation": True, "snappy": True}))
    ftype, payload = c.raw_frame()
    assert ftype == 0
    assert b'"deflate":false,"deflate_level":6,"max_deflate_level":6,"snappy":true,' in payload
    wire = b""
    while len(wire) < len(snappy_reply_bytes(OK)):
        wire += c.raw.recv(100)
    assert wire == snappy_reply_bytes(OK)
    assert c.dec.frames() == []  # nothing else came in the clear
    c.start_snappy()
    c.send(p.pub("s", b"snappy body")).ok()
    c.send(p.sub("s", "c")).ok()
    c.send(p.rdy(1))
    assert c.messages(1)[0].body == b"snappy body"
    client = tcp_clients(nsqd)[0]
    assert client["snappy"] is True and client["deflate"] is False


@pytest.mark.parametrize("asked, got", [(0, 6), (1, 1), (3, 3), (6, 6), (9, 6)])
def test_identify_deflate_sequence_and_level(nsqd, asked, got):
    c = Conn(nsqd)
    reply = c.identify(deflate=True, deflate_level=asked)
    assert (reply["deflate"], reply["deflate_level"], reply["snappy"]) == (True, got, False)
    wire = decoded = b""
    d = zlib.decompressobj(-zlib.MAX_WBITS)
    while decoded != OK:  # one sync-flushed raw deflate block
        chunk = c.raw.recv(100)
        wire += chunk
        decoded += d.decompress(chunk)
    assert wire.endswith(b"\x00\x00\xff\xff")
    c.start_deflate()
    c.decompressor = d.decompress  # the stream goes on from the OK
    c.send(p.pub("d", b"deflated body")).ok()
    client = tcp_clients(nsqd)[0]
    assert client["deflate"] is True and client["snappy"] is False


def test_max_deflate_level_bounds_the_level(nsqd_factory):
    server = nsqd_factory("--max-deflate-level=2")
    c = Conn(server)
    reply = c.identify(deflate=True, deflate_level=9)
    assert (reply["deflate_level"], reply["max_deflate_level"]) == (2, 2)
    c.start_deflate().ok()
    assert wait_for(lambda: "upgrading connection to deflate (level 2)" in "".join(server.lines))


def test_deflate_level_reported_without_deflate(nsqd_factory):
    server = nsqd_factory("--max-deflate-level=3")
    reply = Conn(server).identify(deflate_level=1)
    assert (reply["deflate"], reply["deflate_level"]) == (False, 3)  # 6 bounded by the max


def test_snappy_and_deflate_together_is_an_error(nsqd):
    c = Conn(nsqd)
    c.send(p.identify({"feature_negotiation": True, "snappy": True, "deflate": True}))
    assert c.frame() == (1, b"E_IDENTIFY_FAILED cannot enable both deflate and snappy compression")
    assert c.closed()


@pytest.mark.parametrize("flag, feature", [("--snappy=false", "snappy"),
                                           ("--deflate=false", "deflate")])
def test_flags_turn_compression_off(nsqd_factory, flag, feature):
    server = nsqd_factory(flag)
    c = Conn(server)
    reply = c.identify(**{feature: True})
    assert reply[feature] is False
    c.send(p.pub("plain", b"x")).ok()  # still plain
    # and without both flags, they may not both be asked for either way
    other = "deflate" if feature == "snappy" else "snappy"
    c2 = Conn(server)
    assert c2.identify(snappy=True, deflate=True)[other] is True


def test_without_feature_negotiation_nothing_is_upgraded(nsqd):
    c = Conn(nsqd)
    c.send(p.identify({"snappy": True}))
    assert c.frame() == (0, b"OK")
    c.send(p.pub("plain", b"x")).ok()


@pytest.mark.parametrize("codec", ["snappy", "deflate"])
def test_large_and_many_messages_both_ways(nsqd, codec):
    """Bodies over snappy's 64 KiB block and batches of small ones, compressed
    in both directions; compressible data takes less on the wire."""
    c = Conn(nsqd)
    c.identify(**{codec: True})
    getattr(c, f"start_{codec}")().ok()
    big = (b"0123456789abcdef" * 20000) + os.urandom(70000)  # 390 KB, over several blocks
    c.send(p.pub("big", big)).ok()
    small = [b"message %d " % i * 10 for i in range(500)]
    c.send(p.mpub("big", small)).ok()
    c.send(p.sub("big", "c")).ok()
    before = c.wire_in
    c.send(p.rdy(600))
    msgs = c.messages(501)
    assert msgs[0].body == big
    assert [m.body for m in msgs[1:]] == small
    payload = sum(len(m.body) + 34 for m in msgs)
    assert c.wire_in - before < payload * 0.8
    c.send(b"".join(p.fin(m.id) for m in msgs))
    c.send(p.nop())
    assert c.closed(0.3) is False


@pytest.mark.parametrize("codec", ["snappy", "deflate"])
def test_corrupt_stream_ends_the_connection(nsqd, codec):
    c = Conn(nsqd)
    c.identify(**{codec: True})
    getattr(c, f"start_{codec}")().ok()
    if codec == "snappy":
        c.raw.sendall(b"\x00\x08\x00\x00" + b"\x01\x02\x03\x04" + b"\xff\xff\xff\xff")  # bad CRC
    else:
        c.raw.sendall(b"\xff" * 64)  # not deflate
    assert c.closed()
    assert c.dec.frames() == []  # no error frame, as nsqd's read loop just ends


def test_snappy_first_chunk_must_be_the_stream_identifier(nsqd):
    c = Conn(nsqd)
    c.identify(snappy=True)
    c.start_snappy().ok()
    data = p.nop()
    crc = nsnappy.masked_crc(data)
    c.raw.sendall(b"\x01" + (len(data) + 4).to_bytes(3, "little")
                  + struct.pack("<I", crc) + data)
    assert c.closed()


def test_repeated_stream_identifiers_and_padding_are_accepted(nsqd):
    """pynsq sends a new stream (identifier first) with every write."""
    c = Conn(nsqd)
    c.identify(snappy=True)
    c.start_snappy().ok()
    c.send(p.pub("x", b"1"))
    c.compressor = lambda data: nsnappy.FrameEncoder().encode(data) + b"\xfe\x02\x00\x00ab"
    c.send(p.pub("x", b"2"))
    assert c.frames(2) == [(0, b"OK")] * 2


# -- real clients ----------------------------------------------------------------------


@pytest.mark.parametrize("library", ["pynsq", "gnsq"])
@pytest.mark.parametrize("opts", [{"snappy": True}, {"deflate": True},
                                  {"deflate": True, "deflate_level": 9}],
                         ids=["snappy", "deflate", "deflate9"])
@pytest.mark.parametrize("scenario", ["basic", "mpub"])
def test_clients_with_compression(nsqd, library, opts, scenario):
    r = run_client(library, scenario, nsqd, f"{library}-{scenario}", opts=opts)
    assert r["errors"] == [] and r["published"] == 20
    assert sorted(b for _, b, _ in r["received"]) == sorted(f"m{i}" for i in range(20))
    log = "".join(nsqd.lines)
    feature = "snappy" if "snappy" in opts else "deflate (level 6)"
    assert f"upgrading connection to {feature}" in log


def test_a_backlog_over_snappy(nsqd):
    """Many deliveries per flushed chunk: snappy blocks carry many frames."""
    n = 2000
    mpublish(nsqd, "backlog", [b"m%d" % i for i in range(n)])
    c = Conn(nsqd)
    c.identify(snappy=True, output_buffer_size=65536)
    c.start_snappy().ok()
    c.send(p.sub("backlog", "c")).ok()
    c.send(p.rdy(2500))
    msgs = c.messages(n)
    assert sorted(m.body for m in msgs) == sorted(b"m%d" % i for i in range(n))
