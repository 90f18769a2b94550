"""NSQ's message encoding and frames, and broker-wide message IDs.

A message, as nsqd writes it to clients and to disk (all big-endian):

    [ 8-byte timestamp, ns ][ 2-byte attempts ][ 16-byte ID ][ N-byte body ]

A frame on the TCP protocol:

    [ 4-byte size ][ 4-byte frame type ][ size - 4 bytes of data ]

frame type 0 is a response, 1 an error, 2 a message.

A message ID is 16 ASCII hex digits (lowercase) of a 64-bit value, as nsqd's
guid.Hex().  IdGenerator hands out values from a 64-bit counter in a shared
memory segment, so every process of a broker (workers, local producers in
Spark executors) draws unique IDs; each process reserves a block of 4096 per
atomic add.  The counter starts at nsqd's layout for the creation time,
(ms since 2010-11-04 01:42:54.657 UTC) << 22, so IDs grow with time as nsqd's
do and a counter recreated after a restart starts past the old one's values.
"""

import os
import time

import posix_ipc

from cpython.buffer cimport PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport uint16_t, uint32_t, uint64_t

from nsqshm._core.includes.system cimport (
    MAP_FAILED, MAP_SHARED, PROT_READ, PROT_WRITE, errno, fchmod, memcpy, mmap, munmap,
    nsqshm_fetch_add, nsqshm_load_acquire, nsqshm_store_release,
)

FRAME_TYPE_RESPONSE = 0
FRAME_TYPE_ERROR = 1
FRAME_TYPE_MESSAGE = 2
MESSAGE_HEADER_SIZE = MSG_HEADER_SIZE
MESSAGE_ID_SIZE = MSG_ID_SIZE
NSQD_EPOCH_MS = 1288834974657

cdef uint64_t ID_MAGIC = 0x44496d687371736e   # "nsqshmID" little-endian
cdef uint32_t ID_VERSION = 1
cdef uint64_t ID_BLOCK = 4096
cdef size_t ID_SEGMENT_SIZE = 4096
cdef const char *HEX = b"0123456789abcdef"
cdef int _fork_generation = 0


def _after_fork_in_child():
    global _fork_generation
    _fork_generation += 1


os.register_at_fork(after_in_child=_after_fork_in_child)


cdef void put_u32be(char *dst, unsigned int v) noexcept nogil:
    dst[0] = <char>(v >> 24)
    dst[1] = <char>(v >> 16)
    dst[2] = <char>(v >> 8)
    dst[3] = <char>v


cdef unsigned int get_u32be(const char *src) noexcept nogil:
    cdef const unsigned char *s = <const unsigned char *>src
    return (<unsigned int>s[0] << 24) | (<unsigned int>s[1] << 16) | \
        (<unsigned int>s[2] << 8) | s[3]


cdef void put_message_header(char *dst, uint64_t timestamp, uint16_t attempts,
                             const char *msg_id) noexcept nogil:
    cdef int i
    for i in range(8):
        dst[i] = <char>(timestamp >> (56 - 8 * i))
    dst[8] = <char>(attempts >> 8)
    dst[9] = <char>attempts
    memcpy(dst + 10, msg_id, MSG_ID_SIZE)


cdef void hex_id(char *dst, uint64_t v) noexcept nogil:
    cdef int i
    for i in range(16):
        dst[15 - i] = HEX[v & 0xF]
        v >>= 4


def encode_message(bytes msg_id, uint64_t timestamp, uint16_t attempts, body):
    """The bytes of one message: timestamp, attempts, ID, body."""
    cdef Py_buffer view
    if len(msg_id) != MSG_ID_SIZE:
        raise ValueError(f"message ID must be {MSG_ID_SIZE} bytes, got {len(msg_id)}")
    PyObject_GetBuffer(body, &view, PyBUF_SIMPLE)
    try:
        out = PyBytes_FromStringAndSize(NULL, MSG_HEADER_SIZE + view.len)
        put_message_header(PyBytes_AS_STRING(out), timestamp, attempts, PyBytes_AS_STRING(msg_id))
        memcpy(PyBytes_AS_STRING(out) + MSG_HEADER_SIZE, view.buf, view.len)
    finally:
        PyBuffer_Release(&view)
    return out


def decode_message(data):
    """(id, timestamp, attempts, body) of an encoded message."""
    cdef Py_buffer view
    cdef const unsigned char *p
    cdef uint64_t ts = 0
    cdef int i
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        if view.len < MSG_HEADER_SIZE:
            raise ValueError(f"message of {view.len} bytes is shorter than its "
                             f"{MSG_HEADER_SIZE}-byte header")
        p = <const unsigned char *>view.buf
        for i in range(8):
            ts = (ts << 8) | p[i]
        attempts = (p[8] << 8) | p[9]
        msg_id = PyBytes_FromStringAndSize(<const char *>p + 10, MSG_ID_SIZE)
        body = PyBytes_FromStringAndSize(<const char *>p + MSG_HEADER_SIZE,
                                         view.len - MSG_HEADER_SIZE)
    finally:
        PyBuffer_Release(&view)
    return msg_id, ts, attempts, body


def encode_frame(unsigned int frame_type, data):
    """A frame: size (4 + len(data)), type, data."""
    cdef Py_buffer view
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        out = PyBytes_FromStringAndSize(NULL, 8 + view.len)
        put_u32be(PyBytes_AS_STRING(out), <unsigned int>(4 + view.len))
        put_u32be(PyBytes_AS_STRING(out) + 4, frame_type)
        memcpy(PyBytes_AS_STRING(out) + 8, view.buf, view.len)
    finally:
        PyBuffer_Release(&view)
    return out


def decode_frame(data):
    """(frame_type, payload, bytes consumed) of the first frame in `data`,
    or None when `data` does not yet hold a whole frame."""
    cdef Py_buffer view
    cdef unsigned int size
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        if view.len < 8:
            return None
        size = get_u32be(<const char *>view.buf)
        if size < 4:
            raise ValueError(f"frame size {size} is smaller than its 4-byte type")
        if view.len < 4 + <Py_ssize_t>size:
            return None
        frame_type = get_u32be(<const char *>view.buf + 4)
        payload = PyBytes_FromStringAndSize(<const char *>view.buf + 8, size - 4)
    finally:
        PyBuffer_Release(&view)
    return frame_type, payload, 4 + size


def id_to_int(bytes msg_id):
    """The 64-bit value of a hex message ID."""
    return int(msg_id, 16)


def int_to_id(uint64_t value):
    cdef char buf[16]
    hex_id(buf, value)
    return PyBytes_FromStringAndSize(buf, 16)


cdef class IdGenerator:
    """Unique message IDs for every process of one broker instance.

    The segment (4096 bytes, mode 0600):

        offset  size  field
             0     8  magic    "nsqshmID" as a little-endian u64
             8     4  version  1
            64     8  counter  next unreserved value (own cache line)
    """

    def __cinit__(self):
        self.base = NULL
        self.counter = NULL
        self.next_value = 0
        self.block_end = 0

    def __init__(self):
        raise TypeError("use IdGenerator.open(name)")

    @staticmethod
    def open(str name):
        """Create the ID segment `name`, or attach to it if it exists."""
        from nsqshm._core.ring import validate_name
        validate_name(name)
        cdef IdGenerator self = IdGenerator.__new__(IdGenerator)
        created = True
        try:
            shm = posix_ipc.SharedMemory("/" + name, posix_ipc.O_CREX, mode=0o600,
                                         size=ID_SEGMENT_SIZE)
            fchmod(shm.fd, 0o600)
        except posix_ipc.ExistentialError:
            shm = posix_ipc.SharedMemory("/" + name)
            created = False
            # another process has just created it and may not have sized it yet
            for _ in range(100):
                if shm.size != 0:
                    break
                time.sleep(0.01)
        try:
            if shm.size != ID_SEGMENT_SIZE:
                raise ValueError(f"ID segment {name!r} is {shm.size} bytes, "
                                 f"expected {ID_SEGMENT_SIZE}")
            self.base = mmap(NULL, ID_SEGMENT_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED,
                             shm.fd, 0)
            if self.base == MAP_FAILED:
                self.base = NULL
                raise OSError(errno, os.strerror(errno))
        finally:
            shm.close_fd()
        self.name = name
        self.counter = <uint64_t *>(<char *>self.base + 64)
        cdef uint64_t *magic = <uint64_t *>self.base
        if created:
            (<uint32_t *>(<char *>self.base + 8))[0] = ID_VERSION
            self.counter[0] = (<uint64_t>(time.time_ns() // 1000000 - NSQD_EPOCH_MS)) << 22
            nsqshm_store_release(magic, ID_MAGIC)
        else:
            for _ in range(100):
                if nsqshm_load_acquire(magic) != 0:
                    break
                time.sleep(0.01)
            if nsqshm_load_acquire(magic) != ID_MAGIC or \
                    (<uint32_t *>(<char *>self.base + 8))[0] != ID_VERSION:
                munmap(self.base, ID_SEGMENT_SIZE)
                self.base = NULL
                raise ValueError(f"segment {name!r} is not an nsqshm ID segment of version "
                                 f"{ID_VERSION}")
        self.fork_gen = _fork_generation
        return self

    @staticmethod
    def unlink(str name):
        try:
            posix_ipc.unlink_shared_memory("/" + name)
        except posix_ipc.ExistentialError:
            return False
        return True

    cdef void next_raw(self, char *dst) noexcept:
        """Write the next ID's 16 hex digits at dst."""
        if self.next_value >= self.block_end or self.fork_gen != _fork_generation:
            # a forked child must not reuse its parent's block
            self.fork_gen = _fork_generation
            self.next_value = nsqshm_fetch_add(self.counter, ID_BLOCK)
            self.block_end = self.next_value + ID_BLOCK
        hex_id(dst, self.next_value)
        self.next_value += 1

    def next_id(self):
        """The next message ID, 16 bytes of lowercase hex."""
        cdef char buf[16]
        if self.base == NULL:
            raise ValueError("IdGenerator is closed")
        self.next_raw(buf)
        return PyBytes_FromStringAndSize(buf, 16)

    def fill(self, buffer, Py_ssize_t count):
        """Write `count` consecutive-in-this-process IDs, 16 bytes each, into buffer."""
        cdef Py_buffer view
        cdef Py_ssize_t i
        if self.base == NULL:
            raise ValueError("IdGenerator is closed")
        PyObject_GetBuffer(buffer, &view, PyBUF_WRITABLE)
        try:
            if view.len < count * 16:
                raise ValueError(f"buffer of {view.len} bytes cannot hold {count} IDs")
            for i in range(count):
                self.next_raw(<char *>view.buf + 16 * i)
        finally:
            PyBuffer_Release(&view)

    def close(self):
        if self.base != NULL:
            munmap(self.base, ID_SEGMENT_SIZE)
            self.base = NULL
            self.counter = NULL

    def __dealloc__(self):
        if self.base != NULL:
            munmap(self.base, ID_SEGMENT_SIZE)
