# A worker's trace log, written in C on the delivery paths (tracelog.pyx).

from libc.stdint cimport int64_t, uint8_t, uint16_t, uint32_t, uint64_t


cdef enum:
    TRACE_RECORD = 64         # bytes of one event (the layout: tracelog.pyx)
    TRACE_ADDRESS = 18        # a client's IPv6 (or v4-mapped) address and big-endian port
    EV_PUB = 1
    EV_DELIVERED = 2
    EV_FIN = 3
    EV_REQ = 4
    EV_TOUCH = 5
    EV_TIMEOUT = 6
    EV_DISK = 7
    EV_DROPPED = 8
    # DROPPED's value: why (nsqshm.nsqd.tracing.trace.DROP_REASONS has the texts)
    DROP_EPHEMERAL = 1        # an ephemeral channel past --mem-queue-size
    DROP_EXPIRED = 2          # its time to live passed before delivery
    DROP_SAMPLED = 3          # sampled out for a consumer with a sample_rate
    DROP_FILTERED = 4         # refused by a consumer's ext_filter (confirmed)
    DROP_BOUND = 5            # drop-oldest: max_depth or max_bytes
    DROP_DEAD_LETTER = 6      # at max_attempts: to the dead-letter topic


cdef class TraceWriter:
    cdef int fd
    cdef bytes path
    cdef readonly int64_t size          # bytes in the current file
    cdef readonly int64_t max_bytes     # past this the file becomes <path>.1
    cdef readonly uint64_t written      # events written since start
    cdef readonly int last_errno        # of the last failed write (0: none)
    cdef readonly uint64_t failed       # events lost to failed writes
    cdef char *buf
    cdef Py_ssize_t used
    cdef Py_ssize_t capacity
    cdef int64_t now
    cdef int _open(self) noexcept
    cdef int _reserve(self, Py_ssize_t n) except -1
    cdef int add(self, uint8_t event, const char *msg_id, int64_t ts, uint16_t attempt,
                 uint32_t stream, uint64_t value, const unsigned char *address) except -1
    cdef int64_t clock(self) noexcept
    cdef int flush(self) noexcept
