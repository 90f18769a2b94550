"""nsqshm._core.snappy against the reference implementation python-snappy
(cramjam's Rust snappy): blocks both ways, the framing format as
golang/snappy writes and reads it, CRC-32C, and corrupt input."""

import os
import struct

import cramjam
import pytest
import snappy
from hypothesis import given, settings
from hypothesis import strategies as st

from nsqshm._core import snappy as s

WORDS = [b"alpha", b"beta", b"gamma", b"\x00", b"\xff\xfe", b"0123456789"]


def corpus():
    yield b""
    yield b"a"
    yield b"x" * 100_000
    yield os.urandom(70_000)
    for n in (1, 16, 17, 18, 59, 60, 61, 255, 256, 257, 4096, 65535, 65536, 65537, 200_000):
        data = b"".join(WORDS[(i * 7 + i // 3) % len(WORDS)] for i in range(n))
        yield data[:n]


def test_crc32c_vectors():
    assert s.crc32c(b"") == 0
    assert s.crc32c(b"123456789") == 0xE3069283
    assert s.crc32c(b"\x00" * 32) == 0x8A9136AA
    assert s.crc32c(b"\xff" * 32) == 0x62A8AB43
    assert s.crc32c(b"56789", s.crc32c(b"1234")) == 0xE3069283


def test_masked_crc_is_the_framing_formats():
    c = s.crc32c(b"OK")
    assert s.masked_crc(b"OK") == ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


@pytest.mark.parametrize("data", list(corpus()), ids=lambda d: str(len(d)))
def test_blocks_round_trip_with_the_reference(data):
    for i in range(0, max(len(data), 1), 65536):
        block = data[i:i + 65536]
        ours = s.compress_block(block)
        assert bytes(cramjam.snappy.decompress_raw(ours)) == block
        assert s.decompress_block(ours) == block
        assert s.decompress_block(bytes(cramjam.snappy.compress_raw(block))) == block


@pytest.mark.parametrize("data", list(corpus()), ids=lambda d: str(len(d)))
def test_frames_round_trip_with_the_reference(data):
    enc = s.FrameEncoder()
    framed = enc.encode(data) + enc.encode(b"tail")
    assert framed.startswith(s.STREAM_IDENTIFIER) and framed.count(s.STREAM_IDENTIFIER) == 1
    assert snappy.StreamDecompressor().decompress(framed) == data + b"tail"
    theirs = snappy.StreamCompressor().add_chunk(data) + snappy.StreamCompressor().add_chunk(b"!")
    dec = s.FrameDecoder()
    out = b"".join(dec.decode(theirs[i:i + 777]) for i in range(0, len(theirs), 777))
    assert out == data + b"!"
    assert dec.pending == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=3000), max_size=8), st.integers(1, 5000))
def test_frames_any_writes_any_cuts(writes, cut):
    enc = s.FrameEncoder()
    wire = b"".join(enc.encode(w) for w in writes)
    dec = s.FrameDecoder()
    out = b"".join(dec.decode(wire[i:i + cut]) for i in range(0, len(wire), cut))
    assert out == b"".join(writes)


def test_chunks_are_64k_and_incompressible_ones_stored():
    data = os.urandom(65536 + 10)
    wire = s.FrameEncoder().encode(data)
    pos, chunks = 10, []
    while pos < len(wire):
        kind, n = wire[pos], int.from_bytes(wire[pos + 1:pos + 4], "little")
        chunks.append((kind, n))
        pos += 4 + n
    assert chunks == [(0x01, 65536 + 4), (0x01, 10 + 4)]
    wire = s.FrameEncoder().encode(b"z" * 70000)
    assert wire[10] == 0x00 and len(wire) < 4000  # compressed: 3-byte copies of 64 bytes


def test_encode_into_appends():
    out = bytearray(b"head")
    enc = s.FrameEncoder()
    n = enc.encode_into(b"abc", out)
    assert out[:4] == b"head" and len(out) == 4 + n
    assert enc.encode_into(b"", out) == 0


@pytest.mark.parametrize("wire, error", [
    (b"\x00\x05\x00\x00abcde", "corrupt"),                       # no stream identifier first
    (s.STREAM_IDENTIFIER + b"\x01\x03\x00\x00abc", "corrupt"),   # shorter than a checksum
    (s.STREAM_IDENTIFIER + b"\x01\x05\x00\x00\x00\x00\x00\x00x", "corrupt"),  # bad checksum
    (s.STREAM_IDENTIFIER + b"\x02\x01\x00\x00x", "unsupported"),  # reserved unskippable
    (b"\xff\x06\x00\x00sNaPpX", "corrupt"),
    (s.STREAM_IDENTIFIER + b"\x00\x06\x00\x00\x00\x00\x00\x00\x05\x00", "corrupt"),  # bad block
])
def test_corrupt_frames(wire, error):
    with pytest.raises(s.SnappyError, match=error):
        s.FrameDecoder().decode(wire)


def test_skippable_chunks_are_skipped():
    dec = s.FrameDecoder()
    wire = s.STREAM_IDENTIFIER + b"\xfe\x03\x00\x00pad" + b"\x80\x01\x00\x00z"
    wire += s.FrameEncoder().encode(b"data")[10:]
    assert dec.decode(wire) == b"data"


@pytest.mark.parametrize("block", [b"", b"\x05", b"\x05\x00", b"\x04\x01\x00",
                                   b"\x02\x05\x02", b"\xff\xff\xff\xff\xff\x01"])
def test_corrupt_blocks(block):
    with pytest.raises(s.SnappyError):
        s.decompress_block(block)


def test_copies_that_overlap_decode_as_runs():
    # literal "ab", then a copy of length 10 at offset 2 (copy-1 form)
    block = bytes([12]) + bytes([1 << 2]) + b"ab" + bytes([((10 - 4) << 2) | 1, 2])
    assert s.decompress_block(block) == b"ab" * 6
    assert struct.unpack("<B", block[:1])[0] == 12
