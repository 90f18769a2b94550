# cython: freethreading_compatible=False
"""A worker's trace log: message events written in C, a batch per write(2).

While tracing is on for a topic or channel (nsqd/tracing/trace.py), every state
change of its messages is an event; the delivery paths (publish, the
dispatcher, the C command parser, the timeout scan) hand this writer whole
batches (packed records, output frames, command lines) and it appends one
fixed-size record per message, with no Python object per message:

    [trace record: 64 bytes, native byte order]
     0  int64     ts        wall clock, ns
     8  uint8     event     PUB 1, DELIVERED 2, FIN 3, REQ 4, TOUCH 5, TIMEOUT 6,
                            DISK 7 (written to a disk queue), DROPPED 8
     9  uint8     (0)
    10  uint16    attempt   DELIVERED, TIMEOUT, DISK, DROPPED: the message's attempts
    12  uint32    stream    the worker's number for (topic, channel): trace.py's table
    16  char[16]  id        the message ID as on the wire
    32  uint64    value     PUB: trace ID (0: none); REQ: delay in ms; DROPPED: reason
    40  uint8[16] address   the client's IPv6 address (IPv4 mapped); all 0: none
    56  uint16    port      big-endian
    58  uint16    (0)
    60  uint32    magic     TRACE_MAGIC: a record, not a torn tail

The file is opened O_APPEND; a write is whole records, so a killed worker
leaves whole records (a reader drops a short tail).  Past max_bytes the file
is renamed to <path>.1 (the older .1 goes) and a new one started: a worker
keeps at most twice max_bytes.  A failed write loses that batch's events
(counted in `failed`, its errno in `last_errno`), never a message.
"""

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE
from libc.errno cimport EINTR, errno
from libc.stdint cimport int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport free, realloc
from libc.string cimport memcmp, memcpy, memset
from posix.stat cimport fstat, struct_stat
from posix.fcntl cimport O_APPEND, O_CLOEXEC, O_CREAT, O_WRONLY, open
from posix.time cimport CLOCK_REALTIME, clock_gettime, timespec
from posix.unistd cimport close, write

from nsqshm._core.codec cimport hex_id
from nsqshm._core.includes.system cimport nsqshm_be16, nsqshm_be32, nsqshm_be64

cdef extern from "stdio.h" nogil:
    int rename(const char *old, const char *new)


cdef enum:
    ID_SIZE = 16
    RECORD_HEADER = 4         # u32 native size before a packed record
    MSG_TS = 0                # in a message: int64 BE timestamp
    MSG_ATTEMPTS = 8          # uint16 BE
    MSG_ID = 10
    FRAME_HEADER = 8          # u32 BE size, u32 BE frame type
    FRAME_MESSAGE = 2

TRACE_MAGIC = 0x5452534E      # "NSRT" read as a little-endian u32
RECORD_SIZE = TRACE_RECORD
EVENTS = {EV_PUB: "PUB", EV_DELIVERED: "DELIVERED", EV_FIN: "FIN", EV_REQ: "REQ",
          EV_TOUCH: "TOUCH", EV_TIMEOUT: "TIMEOUT", EV_DISK: "DISK", EV_DROPPED: "DROPPED"}
EVENT_CODES = {name: code for code, name in EVENTS.items()}
DROP_CODES = {"ephemeral": DROP_EPHEMERAL, "expired": DROP_EXPIRED, "sampled": DROP_SAMPLED,
              "filtered": DROP_FILTERED, "bound": DROP_BOUND, "dead_letter": DROP_DEAD_LETTER}

cdef uint32_t _MAGIC = TRACE_MAGIC


cdef const unsigned char *_address(object address) except? NULL:
    """The 18 address bytes of a client (None: none)."""
    if address is None:
        return NULL
    if not isinstance(address, bytes) or len(<bytes>address) != TRACE_ADDRESS:
        raise ValueError(f"a client address is {TRACE_ADDRESS} bytes")
    return <const unsigned char *><char *>(<bytes>address)


cdef int _check_records(const unsigned char *p, Py_ssize_t end, Py_ssize_t count) except -1:
    """ValueError unless p[:end] starts with `count` whole packed records,
    each long enough for a message ID (checked before anything is added)."""
    cdef Py_ssize_t pos = 0, k
    cdef uint32_t size
    if count < 0:
        raise ValueError(f"a negative count {count}")
    for k in range(count):
        if pos + RECORD_HEADER + MSG_ID + ID_SIZE > end:
            raise ValueError(f"record {k} runs past the {end} bytes packed")
        memcpy(&size, p + pos, RECORD_HEADER)
        if size < MSG_ID + ID_SIZE or pos + RECORD_HEADER + size > end:
            raise ValueError(f"record {k} has a bad size {size}")
        pos += RECORD_HEADER + size
    return 0


cdef class TraceWriter:
    """Appends events to one file; `path` is bytes, checked by the caller
    (trace.py builds it from the data path and the worker's index)."""

    def __cinit__(self):
        self.fd = -1
        self.buf = NULL

    def __init__(self, bytes path not None, int64_t max_bytes):
        if max_bytes < TRACE_RECORD:
            raise ValueError(f"max_bytes {max_bytes} is below one record")
        self.path = path
        self.max_bytes = max_bytes

    def __dealloc__(self):
        if self.fd >= 0:
            close(self.fd)
        free(self.buf)

    def close(self):
        if self.fd >= 0:
            close(self.fd)
            self.fd = -1

    cdef int _open(self) noexcept:
        cdef struct_stat st
        self.fd = open(self.path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0o600)
        if self.fd < 0:
            return errno
        self.size = st.st_size if fstat(self.fd, &st) == 0 else 0
        return 0

    cdef int _reserve(self, Py_ssize_t n) except -1:
        cdef char *grown
        cdef Py_ssize_t want
        if self.used + n <= self.capacity:
            return 0
        want = max(self.capacity * 2, self.used + n, 64 * TRACE_RECORD)
        grown = <char *>realloc(self.buf, want)
        if grown == NULL:
            raise MemoryError()
        self.buf = grown
        self.capacity = want
        return 0

    cdef int64_t clock(self) noexcept:
        cdef timespec ts
        clock_gettime(CLOCK_REALTIME, &ts)
        self.now = <int64_t>ts.tv_sec * 1000000000 + ts.tv_nsec
        return self.now

    cdef int add(self, uint8_t event, const char *msg_id, int64_t ts, uint16_t attempt,
                 uint32_t stream, uint64_t value, const unsigned char *address) except -1:
        cdef char *r
        self._reserve(TRACE_RECORD)
        r = self.buf + self.used
        memset(r, 0, TRACE_RECORD)
        memcpy(r, &ts, 8)
        r[8] = <char>event
        memcpy(r + 10, &attempt, 2)
        memcpy(r + 12, &stream, 4)
        memcpy(r + 16, msg_id, ID_SIZE)
        memcpy(r + 32, &value, 8)
        if address != NULL:
            memcpy(r + 40, address, TRACE_ADDRESS)
        memcpy(r + 60, &_MAGIC, 4)
        self.used += TRACE_RECORD
        return 0

    cdef int flush(self) noexcept:
        """Write the pending records (one write(2) unless interrupted or
        short), rotate past max_bytes; 0 or an errno."""
        cdef Py_ssize_t done = 0
        cdef Py_ssize_t n
        cdef int err = 0
        cdef bytes old
        if self.used == 0:
            return 0
        if self.fd < 0:
            err = self._open()
        while err == 0 and done < self.used:
            n = write(self.fd, self.buf + done, self.used - done)
            if n < 0:
                if errno == EINTR:
                    continue
                err = errno
                break
            done += n
        self.size += done
        self.written += done // TRACE_RECORD
        if err:
            self.failed += (self.used - done) // TRACE_RECORD
            self.last_errno = err
        self.used = 0
        if self.size > self.max_bytes and self.fd >= 0:
            old = self.path + b".1"
            if rename(self.path, old) != 0:
                self.last_errno = errno
            close(self.fd)
            self.fd = -1
            self.size = 0
        return err

    # -- the batches of the delivery paths (each one write) -------------------------------

    def published(self, packed, Py_ssize_t count, uint32_t stream, address=None,
                  list trace_ids=None, long long partition=-1, uint64_t first=0):
        """PUB of `count` packed records ([u32 native size][message])*.  A
        record's time is its message's (taken as it was packed: another worker
        may deliver it before this runs).  With partition >= 0 the records were
        appended to that log partition from msg offset `first`: their IDs are
        rewritten in place to the log's (packed must then be a bytearray)."""
        cdef const unsigned char[:] view = packed
        cdef const unsigned char *addr = _address(address)
        cdef const unsigned char *p = &view[0] if view.shape[0] else NULL
        cdef Py_ssize_t end = view.shape[0]
        cdef Py_ssize_t pos = 0, k
        cdef uint32_t size
        cdef int64_t ts, now = self.clock()
        cdef uint64_t trace_id
        cdef char *writable = NULL
        if partition >= 0:
            if not isinstance(packed, bytearray):
                raise TypeError("log IDs are stamped into a bytearray")
            writable = PyByteArray_AS_STRING(packed)
        if trace_ids is not None and len(trace_ids) < count:
            raise ValueError(f"{len(trace_ids)} trace IDs for {count} messages")
        _check_records(p, end, count)
        for k in range(count):
            memcpy(&size, p + pos, RECORD_HEADER)
            if writable != NULL:  # the log's message ID, as the append stamped its copy
                hex_id(writable + pos + RECORD_HEADER + MSG_ID,
                       (<uint64_t>partition << 48) | (first + k))
            ts = <int64_t>nsqshm_be64(p + pos + RECORD_HEADER + MSG_TS)
            try:
                trace_id = trace_ids[k] if trace_ids is not None and trace_ids[k] else 0
            except (TypeError, OverflowError):
                self.used = 0  # nothing of a refused batch is written
                raise ValueError(f"trace ID {k} is not a 64-bit number") from None
            self.add(EV_PUB, <const char *>p + pos + RECORD_HEADER + MSG_ID,
                     ts if 0 < ts < now else now, 0, stream, trace_id, addr)
            pos += RECORD_HEADER + size
        return self.flush()

    def records(self, packed, Py_ssize_t count, int event, uint32_t stream,
                uint64_t value=0):
        """An event (TIMEOUT, DISK, DROPPED) for each of `count` packed records."""
        cdef const unsigned char[:] view = packed
        cdef const unsigned char *p = &view[0] if view.shape[0] else NULL
        cdef Py_ssize_t end = view.shape[0]
        cdef Py_ssize_t pos = 0, k
        cdef uint32_t size
        cdef int64_t now = self.clock()
        if not EV_PUB <= event <= EV_DROPPED:
            raise ValueError(f"unknown event {event}")
        _check_records(p, end, count)
        for k in range(count):
            memcpy(&size, p + pos, RECORD_HEADER)
            self.add(event, <const char *>p + pos + RECORD_HEADER + MSG_ID, now,
                     nsqshm_be16(p + pos + RECORD_HEADER + MSG_ATTEMPTS), stream, value, NULL)
            pos += RECORD_HEADER + size
        return self.flush()

    def delivered(self, out, Py_ssize_t base, uint32_t stream, address=None):
        """DELIVERED for each message frame in out[base:] (what a dispatcher
        round appended to a client's output)."""
        cdef const unsigned char[:] view = out
        cdef const unsigned char *addr = _address(address)
        cdef const unsigned char *p = &view[0] if view.shape[0] else NULL
        cdef Py_ssize_t end = view.shape[0]
        cdef Py_ssize_t pos = base
        cdef uint32_t size
        cdef int64_t now = self.clock()
        if base < 0:
            raise ValueError("a negative base")
        while pos + FRAME_HEADER <= end:
            size = nsqshm_be32(p + pos)
            if size < 4 or pos + 4 + <Py_ssize_t>size > end:
                break  # (a frame still being written is not a delivery yet)
            if nsqshm_be32(p + pos + 4) == FRAME_MESSAGE and size >= 4 + MSG_ID + ID_SIZE:
                self.add(EV_DELIVERED, <const char *>p + pos + FRAME_HEADER + MSG_ID, now,
                         nsqshm_be16(p + pos + FRAME_HEADER + MSG_ATTEMPTS), stream, 0, addr)
            pos += 4 + size
        return self.flush()

    def event(self, int event, msg_id, uint32_t stream, address=None, uint64_t value=0,
              uint16_t attempt=0):
        """One event (a FIN, REQ or TOUCH of the Python path)."""
        cdef const unsigned char[:] view = msg_id
        if not EV_PUB <= event <= EV_DROPPED:
            raise ValueError(f"unknown event {event}")
        if view.shape[0] != ID_SIZE:
            raise ValueError(f"a message ID is {ID_SIZE} bytes")
        self.add(event, <const char *>&view[0], self.clock(), attempt, stream, value,
                 _address(address))
        return self.flush()


def find(data, ids=None, uint64_t trace_id=0):
    """Offsets of the whole records of data (one file's bytes) with an ID in
    `ids` (16-byte IDs, concatenated in sorted order), or else of the PUB
    records with trace ID `trace_id`."""
    cdef const unsigned char[:] view = data
    cdef const unsigned char[:] wanted
    cdef const unsigned char *p
    cdef const unsigned char *w = NULL
    cdef Py_ssize_t n = view.shape[0] - view.shape[0] % TRACE_RECORD
    cdef Py_ssize_t count = 0, pos, lo, hi, mid
    cdef uint64_t value
    cdef uint32_t magic
    cdef int c
    cdef list found = []
    if ids is not None:
        wanted = ids
        if wanted.shape[0] % ID_SIZE:
            raise ValueError(f"IDs are {ID_SIZE} bytes each")
        count = wanted.shape[0] // ID_SIZE
        if count == 0:
            return found
        w = &wanted[0]
    if n == 0:
        return found
    p = &view[0]
    for pos in range(0, n, TRACE_RECORD):
        memcpy(&magic, p + pos + 60, 4)
        if magic != _MAGIC:
            continue
        if w != NULL:
            lo, hi = 0, count
            while lo < hi:  # a binary search of the sorted IDs
                mid = (lo + hi) // 2
                c = memcmp(w + mid * ID_SIZE, p + pos + 16, ID_SIZE)
                if c == 0:
                    found.append(pos)
                    break
                if c < 0:
                    lo = mid + 1
                else:
                    hi = mid
        elif p[pos + 8] == EV_PUB:
            memcpy(&value, p + pos + 32, 8)
            if value == trace_id:
                found.append(pos)
    return found
