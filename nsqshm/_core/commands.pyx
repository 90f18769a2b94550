# cython: freethreading_compatible=False
"""The commands a subscribed consumer sends, parsed and applied in C.

Clients (go-nsq, pynsq, gnsq, nsqjs) write and flush each FIN, REQ and
TOUCH as its own command, so they arrive a few per segment, split anywhere,
ended by '\\n' or '\\r\\n'.  CommandParser.parse walks the read buffer from
its first unread byte and applies, against the channel's in-flight table,
every whole line of these forms:

    FIN <id>\\n                 16-byte ID: no ' ', '\\r' or '\\n' in it
    TOUCH <id>\\n
    REQ <id> <digits>\\n        1 or more ASCII digits (nsqd's ByteToBase10)
    NOP\\n
                                (each also with '\\r\\n')

It stops at the first line that is anything else, or whose command fails
(not in flight, not the client's, a delivery policy that needs Python):
the Python path (protocol_v2.py) then reads that line as before and answers
it, so every error is the Python path's, byte for byte.  It also stops
where no whole line is left (read more).  Nothing here allocates a Python
object per command; the counts are for the caller to account once per call.

REQ with a delay goes straight into the channel's deferred queue; REQ
without one is appended to `requeued_records` (packed [u32 native size]
[message] records) for the channel to store (ring or disk) in one call,
after which it releases the in-flight blocks (InFlight.release): a death in
between repeats a message, never loses one.

On a traced channel (trace_to) each command applied is also an event of
the trace log (_core/tracelog.pyx), written once per parse call.
"""

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memchr, memcmp, memcpy
from posix.time cimport CLOCK_MONOTONIC, CLOCK_REALTIME, clock_gettime, timespec

from nsqshm._core.inflight cimport STATUS_OK, DeferredQueue, InFlight
from nsqshm._core.logcursor cimport CursorSet
from nsqshm._core.tracelog cimport EV_FIN, EV_REQ, EV_TOUCH, TRACE_ADDRESS, TraceWriter

NEED_MORE = 0  # no whole line at the position: read more (or the line is too long)
HANDOFF = 1    # a whole line at the position for the Python path

cdef enum:
    MAX_LINE = 16 * 1024   # nsqd's bufio.Reader: a longer line is the Python path's
    ID_SIZE = 16
    RECORD_HEADER = 4      # u32 native size before a packed record


cdef inline int64_t _clock_ns(int clock) noexcept nogil:
    cdef timespec ts
    clock_gettime(clock, &ts)
    return <int64_t>ts.tv_sec * 1000000000 + ts.tv_nsec


cdef inline bint _id_ok(const char *p) noexcept nogil:
    """16 bytes that Python's line.split(b" ") keeps as one 16-byte field
    (no ' '), and that a '\\r' strip cannot change (no '\\r'); '\\n' cannot
    be there (the line ends at the first one)."""
    cdef int i
    for i in range(ID_SIZE):
        if p[i] == 32 or p[i] == 13:
            return False
    return True


cdef class CommandParser:
    """One subscribed connection's FIN, REQ, TOUCH and NOP, in C.

    After parse(): `pos` is where the caller's reading resumes; `finished`,
    `requeued`, `touched` count what was applied; `scan_by` is the earliest
    deadline or due time set (monotonic ns, -1 for none) for the scan loop.
    """
    def __init__(self, InFlight inflight not None, DeferredQueue deferred, CursorSet cursors,
                 uint64_t client_id, int64_t msg_timeout_ns, int64_t max_msg_timeout_ns,
                 int64_t max_req_timeout_ns):
        self.inflight = inflight
        self.deferred = deferred
        self.cursors = cursors
        self.client_id = client_id
        self.msg_timeout_ns = msg_timeout_ns
        self.max_msg_timeout_ns = max_msg_timeout_ns
        self.max_req_timeout_ns = max_req_timeout_ns
        self.requeued_records = bytearray()
        self.scan_by = -1

    def trace_to(self, TraceWriter writer, uint32_t stream=0, address=None):
        """Record what is applied in writer's log as events of `stream` by the
        client at `address` (18 bytes, or None); writer None: stop."""
        if address is not None and len(address) != TRACE_ADDRESS:
            raise ValueError(f"a client address is {TRACE_ADDRESS} bytes")
        self.trace = writer
        self.trace_stream = stream
        self.trace_address = address

    cdef inline void _traced(self, uint8_t event, const char *msg_id, uint64_t value) except *:
        cdef const unsigned char *address = NULL
        if self.trace_address is not None:
            address = <const unsigned char *><char *>self.trace_address
        self.trace.add(event, msg_id, self.trace.now, 0, self.trace_stream, value, address)

    def take_requeued(self):
        """The records REQ'd without a delay since the last call (the
        caller stores them, then calls InFlight.release())."""
        records = self.requeued_records
        self.requeued_records = bytearray()
        return records

    def parse(self, bytearray buf not None, Py_ssize_t pos, bint requeue=True):
        """Apply the commands of buf[pos:] up to the first line for Python
        or the end of the whole lines: HANDOFF or NEED_MORE.  `requeue`
        False leaves every REQ to Python (a policy that may dead-letter)."""
        cdef const char *p = PyByteArray_AS_STRING(buf)
        cdef Py_ssize_t end = PyByteArray_GET_SIZE(buf)
        cdef int status
        self.finished = self.requeued = self.touched = self.nops = 0
        self.scan_by = -1
        if pos < 0 or pos > end:
            raise ValueError(f"position {pos} is outside the buffer of {end} bytes")
        if self.inflight.lat != NULL:  # e2e latency against one clock reading per call
            self.inflight.lat_now = _clock_ns(CLOCK_REALTIME)
        if self.trace is not None:
            self.trace.clock()  # one time for the events of this call
        if self.cursors is not None:
            self.cursors.batch_begin()  # (the FINs' runs by partition: one lock a run)
        try:
            status = self._parse(p, end, pos, requeue)
        finally:
            if self.cursors is not None:
                self.cursors.batch_end()
        if self.trace is not None:
            self.trace.flush()  # (a failed write is counted in the writer: trace.py logs it)
        return status

    cdef int _parse(self, const char *p, Py_ssize_t end, Py_ssize_t pos,
                    bint requeue) except -1:
        cdef Py_ssize_t n, eol, stop, length
        cdef const char *nl
        cdef const char *line
        cdef int64_t now = 0, first, deadline
        cdef int status = NEED_MORE
        while True:
            n = end - pos
            if n <= 0:
                status = NEED_MORE
                break
            nl = <const char *>memchr(p + pos, 10, n if n < MAX_LINE else MAX_LINE)
            if nl == NULL:
                status = NEED_MORE
                break
            eol = nl - p
            stop = eol
            if stop > pos and p[stop - 1] == 13:
                stop -= 1
            line = p + pos
            length = stop - pos
            status = HANDOFF
            if length == 20 and memcmp(line, b"FIN ", 4) == 0 and _id_ok(line + 4):
                if self._finish(line + 4) != 0:
                    break
                if self.trace is not None:
                    self._traced(EV_FIN, line + 4, 0)
                self.finished += 1
            elif length == 22 and memcmp(line, b"TOUCH ", 6) == 0 and _id_ok(line + 6):
                first = self.inflight.first_deadline_raw(line + 6)
                if first < 0:
                    break
                if now == 0:
                    now = _clock_ns(CLOCK_MONOTONIC)
                # nsqd: now + msg_timeout, never past delivery + --max-msg-timeout
                deadline = now + self.msg_timeout_ns
                if first - self.msg_timeout_ns + self.max_msg_timeout_ns < deadline:
                    deadline = first - self.msg_timeout_ns + self.max_msg_timeout_ns
                if self.inflight.touch_raw(line + 6, self.client_id, deadline) != STATUS_OK:
                    break
                self._scan_by(deadline)
                if self.trace is not None:
                    self._traced(EV_TOUCH, line + 6, 0)
                self.touched += 1
            elif (length >= 22 and memcmp(line, b"REQ ", 4) == 0 and _id_ok(line + 4)
                    and line[20] == 32):
                if not requeue or self.cursors is not None:
                    break
                if now == 0:
                    now = _clock_ns(CLOCK_MONOTONIC)
                if self._requeue(line + 4, line + 21, length - 21, now) != 0:
                    break
                if self.trace is not None:
                    self._traced(EV_REQ, line + 4, self.req_ms)
                self.requeued += 1
            elif length == 3 and memcmp(line, b"NOP", 3) == 0:
                self.nops += 1
            else:
                break
            pos = eol + 1
        self.pos = pos
        return status

    cdef inline void _scan_by(self, int64_t when) noexcept:
        if self.scan_by < 0 or when < self.scan_by:
            self.scan_by = when

    cdef int _finish(self, const char *msg_id) except -1:
        """0 if finished, 1 for the Python path (which answers the error)."""
        if self.cursors is not None:
            # the cursor marked before the in-flight block is freed (InFlight.finish_logged);
            # a cursor not attached yet: the Python path attaches it
            return self.inflight.finish_logged(msg_id, self.client_id, self.cursors) != STATUS_OK
        if self.inflight.finish_raw(msg_id, self.client_id) != STATUS_OK:
            return 1
        return 0

    cdef int _requeue(self, const char *msg_id, const char *digits, Py_ssize_t n,
                      int64_t now) except -1:
        """0 if requeued, 1 for the Python path (not digits, not in flight,
        not the client's)."""
        cdef uint64_t ms = 0
        cdef int64_t timeout_ns
        cdef Py_ssize_t i, base
        cdef uint32_t size
        cdef char *record
        if n <= 0:
            return 1  # "REQ <id> " (an empty timeout is 0 to nsqd): rare, Python's
        for i in range(n):
            if not 48 <= digits[i] <= 57:
                return 1
            ms = ms * 10 + <uint64_t>(digits[i] - 48)  # uint64, wrapping: ByteToBase10
        # Go's time.Duration(ms) * time.Millisecond: int64, wrapping; clamped as nsqd >= 1.1
        timeout_ns = <int64_t>(ms * <uint64_t>1000000)
        if timeout_ns < 0:
            timeout_ns = 0
        if timeout_ns > self.max_req_timeout_ns:
            timeout_ns = self.max_req_timeout_ns
        self.req_ms = <uint64_t>(timeout_ns // 1000000)
        base = PyByteArray_GET_SIZE(self.requeued_records)
        if self.inflight.requeue_raw(msg_id, self.client_id, self.requeued_records) != STATUS_OK:
            return 1
        if timeout_ns > 0 and self.deferred is not None:
            record = PyByteArray_AS_STRING(self.requeued_records) + base
            memcpy(&size, record, RECORD_HEADER)
            try:
                self.deferred.push_raw(record + RECORD_HEADER, size, now + timeout_ns)
            except MemoryError:
                return 0  # no room to defer it: it goes back into the channel now
            PyByteArray_Resize(self.requeued_records, base)
            self._scan_by(now + timeout_ns)
        return 0
