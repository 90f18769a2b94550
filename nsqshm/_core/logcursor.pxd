# A channel's cursor in a log partition, and the set of them a channel's FIN
# path finishes by message ID (wire.fin_lines).  Layout: includes/commitlog_layout.h.

from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.string cimport memcpy

from nsqshm._core.commitlog cimport LogReader
from nsqshm._core.includes.system cimport nsqshm_be64, pthread_mutex_t


cdef extern from "commitlog_layout.h" nogil:
    uint64_t NSQSHM_CURSOR_MAGIC
    uint32_t NSQSHM_CURSOR_VERSION
    uint32_t NSQSHM_CURSOR_HEADER

    ctypedef struct nsqshm_cursor_lock:
        pthread_mutex_t mutex

    ctypedef struct nsqshm_cursor_header:
        uint64_t magic
        uint32_t version
        uint32_t window_bits
        uint64_t created_ns
        uint64_t recoveries
        uint32_t retry_slots
        uint32_t retry_used
        uint64_t retry_dropped
        nsqshm_cursor_lock lock
        uint64_t confirmed
        uint64_t finished
        uint64_t j_from
        uint64_t j_to
        uint64_t j_reset
        uint64_t read_pos
        uint64_t seeks
        uint64_t delivered
        uint64_t confirmed_total
        uint64_t finish_total
        uint64_t direct_total
        uint64_t retry_hashed
        uint64_t window[1]

    ctypedef struct nsqshm_retry_slot:
        uint64_t key
        uint32_t attempts
        int64_t due_ms

    uint32_t nsqshm_crc32c(uint32_t crc, const void *p, size_t n)


cdef class Cursor:
    cdef nsqshm_cursor_header *h
    cdef size_t size
    cdef uint64_t bits, mask
    cdef readonly str name
    cdef readonly str checkpoint_file
    cdef bint crash_test
    cdef int lock_depth               # this handle's holds of the mutex (lock() nests)
    cdef uint32_t slots               # the retry table's, as checked at attach / made
    cdef uint32_t compact_wait        # full-table notes left before compacting again
    cdef uint64_t compact_low         # the lowest live offset at the last vain compaction
    cdef uint64_t compact_finishes    # finish_total then
    cdef readonly bint created        # this handle made the segment (Cursor.open)

    cdef int _map(self, int fd, size_t size) except -1
    cdef int _open(self) except -1
    cdef int _lock(self) except -1
    cdef void _unlock(self) noexcept nogil
    cdef void _repair(self) noexcept
    cdef int _finish(self, uint64_t o) noexcept nogil
    cdef long long _next(self, uint64_t start, uint64_t end) noexcept nogil
    cdef long long _run(self, uint64_t start, uint64_t end, long long max_run,
                        uint64_t *count) noexcept nogil
    cdef tuple _claim_read(self, LogReader reader, uint64_t end, Py_ssize_t room,
                           object scratch)
    cdef void _claimed_attempts(self, uint64_t first, Py_ssize_t n, object scratch)
    cdef uint64_t _read_at(self, bint *held) noexcept nogil
    cdef void _read_to(self, uint64_t offset) noexcept nogil
    cdef nsqshm_retry_slot *_retries(self) noexcept nogil
    cdef bint _done(self, uint64_t o) noexcept nogil
    cdef nsqshm_retry_slot *_retry_find(self, uint64_t o) noexcept nogil
    cdef int _retry_put(self, uint64_t o, uint32_t attempts, int64_t due_ms) noexcept nogil
    cdef uint64_t _retry_compact(self) noexcept nogil
    cdef void _retry_delete(self, uint32_t i) noexcept nogil
    cdef void _retry_clear(self) noexcept nogil
    cdef int _retry_rehash(self) except -1
    cdef Py_ssize_t _retry_load(self, const unsigned char *p, Py_ssize_t size,
                                uint64_t end) noexcept nogil


cdef class CursorSet:
    cdef list cursors                 # by partition: Cursor, or None (not attached yet)
    cdef Py_ssize_t count             # len(cursors), fixed at __init__
    cdef public object fault_path     # tests: see FAULT_DIE_IN_FIN_ENV
    cdef long long held               # a batch of FINs (batch_begin): the partition whose
                                      # cursor stays locked, -1 none; -2 not in a batch
    cdef Cursor held_cur              # that cursor (the object: a slot may be replaced)
    cdef int batch_depth              # batch_begin calls not ended yet (nested batches)
    cdef int held_fins                # FINs since the held cursor was last locked
    cdef bint guarded                 # guard_seeks(): a local consumer's set
    cdef uint64_t *seen               # guarded: by partition, the seek count its copies are of
    cdef void batch_begin(self) noexcept
    cdef void batch_end(self) noexcept
    cdef void _let_go(self) noexcept
    cdef long long find_id(self, const char *msg_id, uint64_t *offset) noexcept
    cdef int finish_at(self, long long partition, uint64_t offset) except -2
    cdef Cursor _attached(self, long long partition)
    cdef long long confirmed_of(self, const char *msg_id, uint64_t *offset,
                                uint64_t *confirmed) noexcept
    cdef int seek_state(self) noexcept
    cdef bytearray _by_confirmed(self, packed, bint heads, bint skip_held)
    cdef void raise_delivered(self, long long partition, uint64_t end) noexcept
    cdef void raise_delivered_id(self, const char *msg_id) noexcept
    cdef int has_id(self, const char *msg_id) noexcept
    cdef int finish_id(self, const char *msg_id) except -2
    cdef int stale_id(self, const char *msg_id) noexcept
    cdef int retry_of(self, const char *msg_id, uint32_t *attempts, int64_t *due_ms) except -1


cdef inline long long decode_log_id(const char *p, uint64_t *offset) noexcept nogil:
    # the partition of a log message ID, 16 hex digits of (partition << 48) |
    # msg offset (its offset in *offset), or -1
    cdef uint64_t v = 0
    cdef int i
    cdef char ch
    for i in range(16):
        ch = p[i]
        if 48 <= ch <= 57:
            v = (v << 4) | <uint64_t>(ch - 48)
        elif 97 <= ch <= 102:
            v = (v << 4) | <uint64_t>(ch - 87)
        else:
            return -1
    offset[0] = v & ((<uint64_t>1 << 48) - 1)
    return <long long>(v >> 48)


cdef inline uint32_t packed_record_size(const char *p, Py_ssize_t n, Py_ssize_t pos,
                                        uint32_t min_size) except 0:
    # the size of the packed [u32 native size][message] record at p + pos of a
    # buffer of n bytes, checked to be whole and of at least min_size (> 0) bytes
    cdef uint32_t size
    if n - pos < 4:
        raise ValueError(f"a record cut short at byte {pos}")
    memcpy(&size, p + pos, 4)
    if size < min_size or n - pos - 4 < <Py_ssize_t>size:
        raise ValueError(f"a record of {size} bytes at byte {pos}")
    return size


# A run of deliveries of one partition (InFlight.deliver, Columns.take): the
# highest log message ID put in flight, its cursor's delivered mark raised once
# per run (CursorSet.raise_delivered_id), not once a message.  A log message ID
# is 16 lower-case hex digits of (partition << 48) | msg offset, so two IDs
# compare as their two big-endian 8-byte words do, and the partition is the
# first word's top 4 bytes: no decode per message.
ctypedef struct DeliveredRun:
    const char *id  # the run's highest ID (NULL: no run yet)
    uint64_t hi, lo


cdef inline void delivered_run_add(DeliveredRun *run, CursorSet cursors,
                                   const char *msg_id) noexcept:
    cdef uint64_t hi = nsqshm_be64(msg_id), lo = nsqshm_be64(msg_id + 8)
    if run.id == NULL or (hi >> 32) != (run.hi >> 32):
        if run.id != NULL:
            cursors.raise_delivered_id(run.id)
        run.id, run.hi, run.lo = msg_id, hi, lo
    elif hi > run.hi or (hi == run.hi and lo > run.lo):
        run.id, run.hi, run.lo = msg_id, hi, lo


cdef inline void delivered_run_end(DeliveredRun *run, CursorSet cursors) noexcept:
    if run.id != NULL:
        cursors.raise_delivered_id(run.id)
        run.id = NULL

