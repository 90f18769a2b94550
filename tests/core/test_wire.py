"""wire.scan_mpub: an MPUB's extent in a stream, as nsqd's readMPUB reads it
(count and sizes from the stream; the first error with nsqd's numbers;
incomplete ones resumable where they stopped).  wire.recv_append and
wire.drop_front: a read buffer that keeps its memory between reads holds
exactly the bytes received and not dropped, whatever the sizes."""

import os
import random
import socket
import struct

import pytest

from nsqshm._core import wire

MSG, BODY = 100, 1000


def mpub(*bodies, count=None):
    n = len(bodies) if count is None else count
    return struct.pack(">i", n) + b"".join(struct.pack(">i", len(b)) + b for b in bodies)


def scan(data, start=0, pos=0, index=0):
    return wire.scan_mpub(data, start, pos, index, MSG, BODY)


def test_the_end_is_where_the_count_and_sizes_say_whatever_follows():
    data = mpub(b"a", b"bc") + b"NOP\n"
    status, index, count, end = scan(data)
    assert (status, index, count) == (wire.MPUB_OK, 2, 2)
    assert data[end:] == b"NOP\n"
    # from an offset in a buffer
    status, _, _, end2 = scan(b"xyz" + data, start=3)
    assert (status, end2) == (wire.MPUB_OK, end + 3)


@pytest.mark.parametrize("data, expected", [
    (b"\x00\x00", (wire.MPUB_COUNT_UNREADABLE, 0, 0)),
    (mpub(count=0), (wire.MPUB_BAD_COUNT, 0, 0)),
    (mpub(count=-1), (wire.MPUB_BAD_COUNT, 0, -1)),
    (mpub(count=(BODY - 4) // 5 + 1), (wire.MPUB_BAD_COUNT, 0, (BODY - 4) // 5 + 1)),
    (mpub(b"a", count=2), (wire.MPUB_SIZE_UNREADABLE, 1, 0)),
    (mpub(b"a", count=2) + struct.pack(">i", 0), (wire.MPUB_BAD_SIZE, 1, 0)),
    (mpub(b"a", count=2) + struct.pack(">i", MSG + 1), (wire.MPUB_TOO_BIG, 1, MSG + 1)),
    (mpub(b"a", count=2) + struct.pack(">i", 5) + b"ab", (wire.MPUB_BODY_UNREADABLE, 1, 5)),
])
def test_the_first_error_with_nsqds_numbers(data, expected):
    assert scan(data)[:3] == expected


def test_an_incomplete_scan_resumes_where_it_stopped():
    data = mpub(*[bytes([65 + i]) * (i + 1) for i in range(20)])
    pos = index = 0
    for cut in range(5, len(data) + 1):  # one more byte at a time
        status, index, _, pos = scan(data[:cut], 0, pos, index)
        if cut < len(data):
            assert status in wire.MPUB_INCOMPLETE
        else:
            assert (status, index, pos) == (wire.MPUB_OK, 20, len(data))


def test_reads_and_drops_keep_exactly_the_bytes_not_dropped():
    a, b = socket.socketpair()
    buf, ref, sent = bytearray(), bytearray(), bytearray()
    rng = random.Random(7)
    with a, b:
        for _ in range(2000):
            chunk = os.urandom(rng.randint(1, 6000))
            a.sendall(chunk)
            sent += chunk
            n = wire.recv_append(b.fileno(), buf, rng.choice([16, 1000, 1 << 16]))
            if n > 0:
                ref += sent[:n]
                del sent[:n]
            assert buf == ref
            k = rng.randint(0, len(buf))
            wire.drop_front(buf, k, rng.choice([1 << 10, 1 << 20]))
            del ref[:k]
            assert buf == ref
            buf += b"x"  # still an ordinary bytearray
            ref += b"x"
        assert wire.recv_append(b.fileno(), buf, 100) == -1  # nothing there: not a block
        a.close()
        assert wire.recv_append(b.fileno(), buf, 100) == 0  # the end of the stream
        assert buf == ref


def test_a_buffer_with_a_live_view_is_neither_read_into_nor_dropped():
    a, b = socket.socketpair()
    with a, b:
        buf = bytearray(b"abc")
        view = memoryview(buf)
        a.sendall(b"d")
        with pytest.raises(BufferError):
            wire.recv_append(b.fileno(), buf, 10)
        with pytest.raises(BufferError):
            wire.drop_front(buf, 1, 1 << 20)
        view.release()
        assert wire.recv_append(b.fileno(), buf, 10) == 1
        wire.drop_front(buf, 2, 1 << 20)
        assert buf == b"cd"
