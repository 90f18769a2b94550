"""Per-batch conversions between NSQ's wire formats and ring records, in C.

A ring record of a topic or channel is one message in NSQ's encoding:

    [ 8-byte BE timestamp ns ][ 2-byte BE attempts ][ 16-byte hex ID ][ body ]

and a batch for Ring.push_packed is such records, each behind a native u32
size.  The functions here append batches to a bytearray so that a PUB or
an MPUB of any size costs one C pass and one ring call.

An MPUB body, as the client sends it (big-endian):

    [ 4-byte message count ]( [ 4-byte size ][ size bytes of body ] )*

nsqd reads an MPUB's messages from the connection, not from the announced
body: the body size is only checked against its limits, and the count and
sizes alone say where the MPUB ends (scan_mpub finds that end).
"""

import os
import time

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from cpython.exc cimport PyErr_SetFromErrno
from libc.errno cimport EAGAIN, EINTR, errno
from libc.stdint cimport int32_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy, memmove
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec


cdef extern from "<poll.h>" nogil:
    struct pollfd:
        int fd
        short events
        short revents
    int poll(pollfd *fds, unsigned long nfds, int timeout)
    enum: POLLOUT


cdef extern from "<sys/socket.h>" nogil:
    Py_ssize_t send(int fd, const void *buf, size_t n, int flags)  # ssize_t
    Py_ssize_t recv(int fd, void *buf, size_t n, int flags)
    enum: MSG_NOSIGNAL
    enum: MSG_DONTWAIT

from nsqshm._core.codec cimport IdGenerator, MSG_HEADER_SIZE, get_u32be, put_message_header, put_u32be
from nsqshm._core.includes.pybytearray cimport Py_SET_SIZE, PyByteArrayObject
from nsqshm._core.inflight cimport InFlight
from nsqshm._core.logcursor cimport CursorSet

MPUB_OK = 0
MPUB_COUNT_UNREADABLE = 1    # "MPUB failed to read message count"
MPUB_BAD_COUNT = 2           # "MPUB invalid message count %d"
MPUB_SIZE_UNREADABLE = 3     # "MPUB failed to read message(%d) body size"
MPUB_BAD_SIZE = 4            # "MPUB invalid message(%d) body size %d"
MPUB_TOO_BIG = 5             # "MPUB message too big %d > %d"
MPUB_BODY_UNREADABLE = 6     # "MPUB failed to read message body"
# the three "unreadable" statuses: the bytes scanned end before the MPUB does
MPUB_INCOMPLETE = (MPUB_COUNT_UNREADABLE, MPUB_SIZE_UNREADABLE, MPUB_BODY_UNREADABLE)


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


def scan_mpub(data, Py_ssize_t start, Py_ssize_t pos, int32_t index,
              long long max_msg_size, long long max_body_size):
    """Follow an MPUB's count and sizes through data[start:] as far as they
    are there, as nsqd's readMPUB reads them from the connection.

    `pos` and `index` resume an earlier scan (pos 0: not begun; else the
    offset of message `index`'s size field).  Returns (status, index, value,
    pos): MPUB_OK with pos = the end of the last message; an error status
    with nsqd's numbers; or an MPUB_INCOMPLETE status with where to resume
    once more bytes are there.
    """
    cdef Py_buffer view
    cdef const char *p
    cdef Py_ssize_t n
    cdef int32_t count, size
    cdef long long max_messages = (max_body_size - 4) // 5
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        p = <const char *>view.buf
        n = view.len
        if n - start < 4:
            return MPUB_COUNT_UNREADABLE, 0, 0, 0
        count = <int32_t>get_u32be(p + start)
        if count <= 0 or count > max_messages:
            return MPUB_BAD_COUNT, 0, count, 0
        if pos == 0:
            pos = start + 4
            index = 0
        while index < count:
            if n - pos < 4:
                return MPUB_SIZE_UNREADABLE, index, 0, pos
            size = <int32_t>get_u32be(p + pos)
            if size <= 0:
                return MPUB_BAD_SIZE, index, size, pos
            if size > max_msg_size:
                return MPUB_TOO_BIG, index, size, pos
            if n - pos - 4 < size:
                return MPUB_BODY_UNREADABLE, index, size, pos
            pos += 4 + size
            index += 1
    finally:
        PyBuffer_Release(&view)
    return MPUB_OK, index, count, pos


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


# -- FIN in batches (server side) ------------------------------------------------------
#
# A consumer sends one FIN per message:  "FIN " [16-byte id] "\n"  (21 bytes).
# fin_lines finishes every such line at the front of the read buffer in one
# C loop, so a window of FINs costs one call, not a Python command each.

def fin_lines(bytearray buf, Py_ssize_t pos, InFlight inflight, uint64_t client_id,
              CursorSet cursors=None):
    """Finish consecutive complete `FIN <id>\n` lines from buf[pos:].

    Stops before the first line that is not such a FIN, is incomplete, or
    whose finish fails (the caller then handles that line and reports its
    error as usual).  Returns (new position, messages finished).

    cursors: a log topic's channel; each finished message is also marked in
    its partition's cursor (the ID says which, and where).  A line whose
    cursor is not attached here yet stops the loop (the caller's lone FIN
    attaches it).
    """
    cdef const char *p = PyByteArray_AS_STRING(buf)
    cdef Py_ssize_t end = PyByteArray_GET_SIZE(buf)
    cdef Py_ssize_t count = 0
    if inflight.lat != NULL:  # e2e latency is measured against one clock reading per batch
        inflight.lat_now = time.time_ns()
    if cursors is not None:
        cursors.batch_begin()  # (a run of one partition's FINs: one lock of its cursor)
    try:
        while end - pos >= 21:
            if not (p[pos] == 70 and p[pos + 1] == 73 and p[pos + 2] == 78 and p[pos + 3] == 32
                    and p[pos + 20] == 10):
                break
            if cursors is not None:
                # the cursor is marked before the in-flight block is freed, once the
                # client is known to hold the message (InFlight.finish_logged says why)
                if inflight.finish_logged(p + pos + 4, client_id, cursors) != 0:
                    break
            elif inflight.finish_raw(p + pos + 4, client_id) != 0:
                break
            pos += 21
            count += 1
    finally:
        if cursors is not None:
            cursors.batch_end()
    return pos, count


# -- reading deliveries (client side, for the load generator) -----------------------------
#
# Frames from nsqd: [4-byte BE size][4-byte BE type][data]; a message's data is
# [8 ts][2 attempts][16 id][body].

def scan_deliveries(data, bytearray fins):
    """Parse whole frames at the front of `data`; append `FIN <id>\n` to
    `fins` for every message and `NOP\n` for every heartbeat.  Returns
    (bytes consumed, messages, other frames)."""
    cdef Py_buffer view
    cdef const char *p
    cdef Py_ssize_t n, pos = 0, messages = 0, others = 0, start
    cdef uint32_t size, ftype
    cdef char *dst
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        p = <const char *>view.buf
        n = view.len
        start = PyByteArray_GET_SIZE(fins)
        while n - pos >= 8:
            size = get_u32be(p + pos)
            if n - pos - 4 < size:
                break
            ftype = get_u32be(p + pos + 4)
            if ftype == 2 and size >= 4 + MSG_HEADER_SIZE:
                dst = _grow(fins, 21)
                memcpy(dst, b"FIN ", 4)
                memcpy(dst + 4, p + pos + 8 + 10, 16)
                dst[20] = 10
                messages += 1
            else:
                if size == 15 and memcmp(p + pos + 8, b"_heartbeat_", 11) == 0:
                    dst = _grow(fins, 4)
                    memcpy(dst, b"NOP\n", 4)
                others += 1
            pos += 4 + size
    finally:
        PyBuffer_Release(&view)
    return pos, messages, others


# -- how clients answer (for the load generator) ---------------------------------------
#
# go-nsq, pynsq and gnsq write and flush each FIN, REQ and TOUCH as its own
# command: one send() each, which arrive a few per segment.

def mix_commands(const unsigned char[:] fins, bytearray out, Py_ssize_t touch_every,
                 Py_ssize_t req_every, Py_ssize_t counter):
    """Turn scan_deliveries' `FIN <id>\\n` lines (and `NOP\\n`) into a client's
    answers, appended to out: every req_every-th message (by the running
    `counter`) `REQ <id> 0\\n` instead, every touch_every-th `TOUCH <id>\\n`
    then its FIN (0: never).  Returns (counter, fins, reqs, touches)."""
    cdef Py_ssize_t pos = 0, n = fins.shape[0], nfin = 0, nreq = 0, ntouch = 0
    cdef const unsigned char *p
    cdef char *dst
    while pos < n:
        p = &fins[pos]
        if n - pos >= 21 and p[0] == 70 and p[20] == 10:
            counter += 1
            if req_every and counter % req_every == 0:
                dst = _grow(out, 23)
                memcpy(dst, b"REQ ", 4)
                memcpy(dst + 4, p + 4, 16)
                memcpy(dst + 20, b" 0\n", 3)
                nreq += 1
            else:
                if touch_every and counter % touch_every == 0:
                    dst = _grow(out, 23)
                    memcpy(dst, b"TOUCH ", 6)
                    memcpy(dst + 6, p + 4, 17)
                    ntouch += 1
                dst = _grow(out, 21)
                memcpy(dst, p, 21)
                nfin += 1
            pos += 21
        else:  # NOP\n
            dst = _grow(out, 4)
            memcpy(dst, p, 4)
            pos += 4
    return counter, nfin, nreq, ntouch


def send_lines(int fd, const unsigned char[:] data, long long gap_ns=0):
    """Send each '\\n'-ended line of data with its own send() (waiting with
    poll() while a non-blocking socket is full), as a client that flushes
    every command; gap_ns: at least that long between two sends (spinning),
    as a client's work per message spaces them.  Returns the number of sends."""
    cdef Py_ssize_t pos = 0, end, n = data.shape[0], sends = 0
    cdef Py_ssize_t k
    cdef long long next_at = 0
    cdef timespec ts
    cdef pollfd pfd
    pfd.fd = fd
    pfd.events = POLLOUT
    while pos < n:
        end = pos
        while end < n and data[end] != 10:
            end += 1
        if end < n:
            end += 1
        if gap_ns:
            with nogil:
                while True:
                    clock_gettime(CLOCK_MONOTONIC, &ts)
                    if ts.tv_sec * 1000000000LL + ts.tv_nsec >= next_at:
                        break
                next_at = ts.tv_sec * 1000000000LL + ts.tv_nsec + gap_ns
        while pos < end:
            with nogil:
                k = send(fd, &data[pos], end - pos, MSG_NOSIGNAL)
            if k < 0:
                if errno == EAGAIN or errno == EINTR:
                    with nogil:
                        poll(&pfd, 1, 1000)
                    continue
                PyErr_SetFromErrno(OSError)
            pos += k
        sends += 1
    return sends


# -- reading a connection (server side) ----------------------------------------------------

def recv_append(int fd, bytearray buf, Py_ssize_t most):
    """recv() of at most `most` bytes straight onto the end of buf, without
    the bytes object socket.recv makes and the copy of it into buf: the
    kernel's copy is the only one.  buf grows only when it has less than
    `most` bytes of room, and keeps its capacity after a short read (see
    _set_end).  Returns the bytes read, 0 at the end of the stream, or -1
    when none are there yet (a non-blocking socket: wait until it is
    readable).  BufferError if buf is exported (a view of it still alive)."""
    cdef PyByteArrayObject *b = <PyByteArrayObject *>buf
    cdef Py_ssize_t size = PyByteArray_GET_SIZE(buf)
    cdef Py_ssize_t k
    cdef char *dst
    cdef int err = 0
    cdef Py_ssize_t grow
    if b.ob_exports > 0:
        raise BufferError("Existing exports of data: object cannot be re-sized")
    if b.ob_alloc - (b.ob_start - b.ob_bytes) - size - 1 < most:
        if b.ob_alloc - size - 1 >= most:  # room enough once the data is at the front
            memmove(b.ob_bytes, b.ob_start, size)
            b.ob_start = b.ob_bytes
        else:  # double, so a long message read 256 KiB at a time is not copied each time
            grow = max(size + most, 2 * b.ob_alloc)
            PyByteArray_Resize(buf, grow)
    dst = b.ob_start + size
    with nogil:
        k = recv(fd, dst, most, MSG_DONTWAIT)
        if k < 0:
            err = errno
    _set_end(buf, size + (k if k > 0 else 0))
    if k < 0:
        if err == EAGAIN or err == EINTR:
            return -1
        raise OSError(err, os.strerror(err))
    return k


cdef inline void _set_end(bytearray buf, Py_ssize_t size):
    # the data's new end, within the allocation: what PyByteArray_Resize does
    # for a small downsize.  Its large downsize (below half the allocation,
    # as after every short read into room for a long one) reallocates and
    # copies, and the next read then grows the buffer again
    cdef PyByteArrayObject *b = <PyByteArrayObject *>buf
    Py_SET_SIZE(buf, size)
    if b.ob_start != NULL:
        b.ob_start[size] = 0


def drop_front(bytearray buf, Py_ssize_t n, Py_ssize_t keep):
    """del buf[:n], keeping buf's allocation for the next recv_append: the
    start of the data moves up (no copy; recv_append moves the data to the
    front when it needs the room).  CPython's del gives a buffer whose data
    falls under half its allocation a smaller one (a malloc and a copy),
    which recv_append would then grow again, on every read.  A buffer left
    empty with more than `keep` bytes allocated (after a large MPUB, with
    nothing of the next one there) is given its memory back, so an idle
    connection does not hold it.  BufferError if buf is exported."""
    cdef PyByteArrayObject *b = <PyByteArrayObject *>buf
    cdef Py_ssize_t size = PyByteArray_GET_SIZE(buf)
    cdef Py_ssize_t rest
    if n <= 0:
        return
    if b.ob_exports > 0:
        raise BufferError("Existing exports of data: object cannot be re-sized")
    if n > size:
        n = size
    rest = size - n
    if rest == 0 and b.ob_alloc > keep:
        del buf[:n]
        return
    b.ob_start = b.ob_bytes if rest == 0 else b.ob_start + n
    _set_end(buf, rest)
