"""Per-batch conversions between NSQ's wire formats and ring records, in C.

A ring record of a topic or channel is one message in NSQ's encoding:

    [ 8-byte BE timestamp ns ][ 2-byte BE attempts ][ 16-byte hex ID ][ body ]

and a batch for Ring.push_packed is such records, each behind a native u32
size.  The functions here append batches to a bytearray so that a PUB or
an MPUB of any size costs one C pass and one ring call.

An MPUB body, as the client sends it (big-endian):

    [ 4-byte message count ]( [ 4-byte size ][ size bytes of body ] )*
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from libc.stdint cimport int32_t, uint32_t, uint64_t
from libc.string cimport memcpy

from nsqshm._core.codec cimport IdGenerator, MSG_HEADER_SIZE, get_u32be, put_message_header

MPUB_OK = 0
MPUB_COUNT_UNREADABLE = 1    # "MPUB failed to read message count"
MPUB_BAD_COUNT = 2           # "MPUB invalid message count %d"
MPUB_SIZE_UNREADABLE = 3     # "MPUB failed to read message(%d) body size"
MPUB_BAD_SIZE = 4            # "MPUB invalid message(%d) body size %d"
MPUB_TOO_BIG = 5             # "MPUB message too big %d > %d"
MPUB_BODY_UNREADABLE = 6     # "MPUB failed to read message body"


cdef inline char *_grow(bytearray out, Py_ssize_t extra) except NULL:
    cdef Py_ssize_t old = PyByteArray_GET_SIZE(out)
    PyByteArray_Resize(out, old + extra)
    return PyByteArray_AS_STRING(out) + old


def pack_message(body, IdGenerator ids, uint64_t timestamp, bytearray out):
    """Append one new message (attempts 0, a fresh ID) as a packed record;
    returns its ID."""
    cdef Py_buffer view
    cdef char *dst
    cdef char msg_id[16]
    PyObject_GetBuffer(body, &view, PyBUF_SIMPLE)
    try:
        ids.next_raw(msg_id)
        dst = _grow(out, 4 + MSG_HEADER_SIZE + view.len)
        (<uint32_t *>dst)[0] = <uint32_t>(MSG_HEADER_SIZE + view.len)
        put_message_header(dst + 4, timestamp, 0, msg_id)
        memcpy(dst + 4 + MSG_HEADER_SIZE, view.buf, view.len)
    finally:
        PyBuffer_Release(&view)
    return msg_id[:16]


def pack_mpub(body, IdGenerator ids, uint64_t timestamp, long long max_msg_size,
              long long max_body_size, bytearray out):
    """Validate an MPUB body and append its messages as packed records.

    Returns (status, index, value): (MPUB_OK, 0, count) or the first error
    with the message index and the offending number, for nsqd's error texts.
    Nothing is appended unless every message is valid.
    """
    cdef Py_buffer view
    cdef const char *p
    cdef Py_ssize_t n, pos = 4, total = 0
    cdef int32_t count, size
    cdef int32_t i
    cdef long long max_messages = (max_body_size - 4) // 5
    cdef char *dst
    PyObject_GetBuffer(body, &view, PyBUF_SIMPLE)
    try:
        p = <const char *>view.buf
        n = view.len
        if n < 4:
            return MPUB_COUNT_UNREADABLE, 0, 0
        count = <int32_t>get_u32be(p)
        if count <= 0 or count > max_messages:
            return MPUB_BAD_COUNT, 0, count
        for i in range(count):
            if n - pos < 4:
                return MPUB_SIZE_UNREADABLE, i, 0
            size = <int32_t>get_u32be(p + pos)
            if size <= 0:
                return MPUB_BAD_SIZE, i, size
            if size > max_msg_size:
                return MPUB_TOO_BIG, i, size
            if n - pos - 4 < size:
                return MPUB_BODY_UNREADABLE, i, size
            pos += 4 + size
            total += 4 + MSG_HEADER_SIZE + size
        dst = _grow(out, total)
        pos = 4
        for i in range(count):
            size = <int32_t>get_u32be(p + pos)
            (<uint32_t *>dst)[0] = <uint32_t>(MSG_HEADER_SIZE + size)
            ids.next_raw(dst + 4 + 10)
            put_message_header(dst + 4, timestamp, 0, dst + 4 + 10)
            memcpy(dst + 4 + MSG_HEADER_SIZE, p + pos + 4, size)
            dst += 4 + MSG_HEADER_SIZE + size
            pos += 4 + size
    finally:
        PyBuffer_Release(&view)
    return MPUB_OK, 0, count


def pack_lines(body, IdGenerator ids, uint64_t timestamp, long long max_msg_size, bytearray out):
    """HTTP /mpub's text form: one message per '\\n'-separated line (empty
    lines skipped).  Returns (count, -1) or (0, size of the first line over
    max_msg_size); nothing is appended on error."""
    cdef Py_buffer view
    cdef const char *p
    cdef Py_ssize_t n, start = 0, end, total = 0, count = 0
    cdef char *dst
    PyObject_GetBuffer(body, &view, PyBUF_SIMPLE)
    try:
        p = <const char *>view.buf
        n = view.len
        while start < n:
            end = start
            while end < n and p[end] != 10:
                end += 1
            if end > start:
                if end - start > max_msg_size:
                    return 0, end - start
                total += 4 + MSG_HEADER_SIZE + (end - start)
                count += 1
            start = end + 1
        dst = _grow(out, total)
        start = 0
        while start < n:
            end = start
            while end < n and p[end] != 10:
                end += 1
            if end > start:
                (<uint32_t *>dst)[0] = <uint32_t>(MSG_HEADER_SIZE + end - start)
                ids.next_raw(dst + 4 + 10)
                put_message_header(dst + 4, timestamp, 0, dst + 4 + 10)
                memcpy(dst + 4 + MSG_HEADER_SIZE, p + start, end - start)
                dst += 4 + MSG_HEADER_SIZE + end - start
            start = end + 1
    finally:
        PyBuffer_Release(&view)
    return count, -1
