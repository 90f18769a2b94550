"""wire.scan_mpub: an MPUB's extent in a stream, as nsqd's readMPUB reads it
(count and sizes from the stream; the first error with nsqd's numbers;
incomplete ones resumable where they stopped)."""

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
