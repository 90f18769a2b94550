# A subscribed consumer's FIN, REQ, TOUCH and NOP, parsed and applied in C (commands.pyx).

from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t

from nsqshm._core.inflight cimport DeferredQueue, InFlight
from nsqshm._core.logcursor cimport CursorSet
from nsqshm._core.tracelog cimport TraceWriter


cdef class CommandParser:
    cdef InFlight inflight
    cdef DeferredQueue deferred
    cdef CursorSet cursors
    cdef readonly uint64_t client_id
    cdef int64_t msg_timeout_ns
    cdef int64_t max_msg_timeout_ns
    cdef int64_t max_req_timeout_ns
    cdef readonly Py_ssize_t pos
    cdef readonly Py_ssize_t finished
    cdef readonly Py_ssize_t requeued
    cdef readonly Py_ssize_t touched
    cdef readonly Py_ssize_t nops
    cdef readonly int64_t scan_by
    cdef readonly bytearray requeued_records
    cdef TraceWriter trace
    cdef uint32_t trace_stream
    cdef bytes trace_address
    cdef uint64_t req_ms

    cdef inline void _traced(self, uint8_t event, const char *msg_id, uint64_t value) except *
    cdef int _parse(self, const char *p, Py_ssize_t end, Py_ssize_t pos,
                    bint requeue) except -1
    cdef inline void _scan_by(self, int64_t when) noexcept
    cdef int _finish(self, const char *msg_id) except -1
    cdef int _requeue(self, const char *msg_id, const char *digits, Py_ssize_t n,
                      int64_t now) except -1
