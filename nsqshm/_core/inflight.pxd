from cpython.buffer cimport Py_buffer
from libc.stdint cimport int64_t, uint32_t, uint64_t

from nsqshm._core.arena cimport Arena
from nsqshm._core.commitlog cimport LogReader
from nsqshm._core.logcursor cimport CursorSet
from nsqshm._core.tracelog cimport TraceWriter
from nsqshm._core.includes.system cimport nsqshm_arena_block, nsqshm_msg_entry


cdef enum:
    STATUS_OK = 0
    STATUS_NOT_IN_FLIGHT = -1
    STATUS_NOT_OWNER = -2
    STATUS_CURSOR_DETACHED = -3  # finish_logged: the caller attaches the cursor first


# One message: an arena block's header, this entry, then `size` message bytes
# (includes/arena_layout.h).
ctypedef nsqshm_msg_entry MsgEntry


# A heap node carries the ordering key itself, so sifting compares without
# touching the entries.  seq breaks ties between equal deadlines: first in,
# first out.
ctypedef struct HeapNode:
    int64_t deadline
    uint64_t seq
    MsgEntry *entry


ctypedef struct MsgHeap:
    HeapNode *nodes
    size_t length
    size_t capacity
    size_t min_capacity       # never shrink below what the caller hinted
    uint64_t next_seq


ctypedef struct IdSlot:
    uint64_t hash
    MsgEntry *entry           # NULL: empty slot


ctypedef struct IdTable:
    IdSlot *slots
    size_t mask               # slots - 1, slots a power of two
    size_t count
    size_t min_slots          # never shrink below what the caller hinted


ctypedef struct ClientSlot:
    uint64_t client_id
    uint32_t count
    uint32_t used


ctypedef struct ClientTable:
    ClientSlot *slots
    size_t mask
    size_t used               # slots taken, including clients now at zero
    size_t live               # clients with count > 0


# What InFlight and DeferredQueue share: a heap of entries in blocks of an
# arena (or malloc'd), and the blocks handed out but not yet released.
cdef class MessageStore:
    cdef MsgHeap heap
    cdef uint64_t _total_bytes
    cdef Arena arena
    cdef uint32_t queue
    cdef uint32_t block_state
    cdef int64_t wall_offset            # wall clock minus monotonic, for arena deadlines
    cdef nsqshm_arena_block **pending
    cdef size_t n_pending
    cdef size_t cap_pending

    cdef MsgEntry *_new_entry(self, uint32_t size) noexcept
    cdef void _commit(self, MsgEntry *e, int64_t mono_ns) noexcept
    cdef void _clock(self) noexcept
    cdef void _discard(self, MsgEntry *e) noexcept
    cdef int _hand_out(self, MsgEntry *e) except -1
    cdef void _unlink(self, MsgEntry *e) noexcept
    cdef _drain(self, CursorSet cursors, long long partition, buffer)
    cdef int _take_out(self, MsgEntry *e, Py_buffer *view, Py_ssize_t *pos,
                       Py_ssize_t count) except -1
    cdef tuple _pop_into(self, int64_t limit, object buffer)


cdef class InFlight(MessageStore):
    cdef IdTable ids
    cdef ClientTable clients
    cdef readonly uint64_t duplicates
    cdef readonly uint64_t sampled_out
    # a channel's time to live (policy.py), 0 for none: deliver() drops a
    # message published ttl_ns or more ago, counted in `expired`
    cdef public int64_t ttl_ns
    cdef readonly uint64_t expired
    # None, or a bytearray deliver() appends expired messages to (packed
    # records), for the channel to dead-letter them
    cdef public object expired_out
    cdef uint64_t _rng
    # e2e processing latency: a ring of (finish time, finish - publish) in ns,
    # filled by finish_raw when enabled; lat_now is the wall clock of the batch
    cdef int64_t *lat
    cdef size_t lat_cap
    cdef size_t lat_next
    cdef size_t lat_len
    cdef public int64_t lat_now
    # records deliver() took (ext tag dispatch may stop it before the count)
    cdef readonly Py_ssize_t consumed
    # a traced channel: deliver() records what it drops (trace_drops)
    cdef TraceWriter drop_trace
    cdef uint32_t drop_stream
    # a log channel's cursors: deliver() marks a message it samples out
    # finished there, or the confirmed offset would wait for it forever
    cdef public CursorSet log_cursors  # a log channel's (deliver: sampled out, delivered marks)
    # a log channel's LogReader per partition (None: not open yet): a detail
    # frame's queue offset is then the message's byte (virtual) offset, as Youzan's
    cdef public list detail_readers

    cdef int _insert(self, const char *msg, uint32_t size, uint64_t client_id,
                     int64_t deadline_ns) noexcept
    cdef void _remove(self, MsgEntry *e, size_t slot) noexcept
    cdef int add_raw(self, const char *msg, uint32_t size, uint64_t client_id,
                     int64_t deadline_ns) except -1
    cdef int finish_raw(self, const char *msg_id, uint64_t client_id) noexcept
    cdef int finish_logged(self, const char *msg_id, uint64_t client_id,
                           CursorSet cursors) except -9
    cdef void _record_latency(self, const char *msg) noexcept
    cdef int _held(self, const char *msg_id, uint64_t client_id, MsgEntry **entry) noexcept
    cdef int touch_raw(self, const char *msg_id, uint64_t client_id,
                       int64_t new_deadline_ns) noexcept
    cdef int64_t first_deadline_raw(self, const char *msg_id) noexcept
    cdef int requeue_raw(self, const char *msg_id, uint64_t client_id,
                         bytearray out) except -9
    cdef MsgEntry *_find(self, bytes msg_id) noexcept
    cdef uint32_t _draw100(self) noexcept
    cdef void _dropped(self, const char *msg, uint64_t reason) noexcept
    cdef uint64_t _queue_offset(self, const char *msg_id) noexcept


cdef class DeferredQueue(MessageStore):
    cdef int push_raw(self, const char *msg, uint32_t size, int64_t due_ns) except -1
