from libc.stdint cimport int64_t, uint32_t, uint64_t


cdef enum:
    STATUS_OK = 0
    STATUS_NOT_IN_FLIGHT = -1
    STATUS_NOT_OWNER = -2


# One message held in C memory: this header, then `size` message bytes.
ctypedef struct MsgEntry:
    uint64_t client_id
    uint64_t hash             # of the message ID, kept so rehashing never reads the message
    uint32_t heap_index       # where this entry's node is in its heap
    uint32_t size
    int64_t first_deadline    # the deadline given at delivery (TOUCH caps from it)


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


cdef class InFlight:
    cdef IdTable ids
    cdef MsgHeap heap
    cdef ClientTable clients
    cdef uint64_t _total_bytes
    cdef readonly uint64_t duplicates
    cdef readonly uint64_t sampled_out
    cdef uint64_t _rng
    # e2e processing latency: a ring of (finish time, finish - publish) in ns,
    # filled by finish_raw when enabled; lat_now is the wall clock of the batch
    cdef int64_t *lat
    cdef size_t lat_cap
    cdef size_t lat_next
    cdef size_t lat_len
    cdef public int64_t lat_now

    cdef int _insert(self, const char *msg, uint32_t size, uint64_t client_id,
                     int64_t deadline_ns) noexcept
    cdef void _remove(self, MsgEntry *e, size_t slot) noexcept
    cdef int add_raw(self, const char *msg, uint32_t size, uint64_t client_id,
                     int64_t deadline_ns) except -1
    cdef int finish_raw(self, const char *msg_id, uint64_t client_id) noexcept
    cdef void _record_latency(self, const char *msg) noexcept
    cdef int touch_raw(self, const char *msg_id, uint64_t client_id,
                       int64_t new_deadline_ns) noexcept
    cdef MsgEntry *_find(self, bytes msg_id) noexcept
    cdef tuple _pop_into(self, int64_t limit, object buffer)
    cdef uint32_t _draw100(self) noexcept


cdef class DeferredQueue:
    cdef MsgHeap heap
    cdef uint64_t _total_bytes

    cdef int push_raw(self, const char *msg, uint32_t size, int64_t due_ns) except -1
    cdef tuple _pop_into(self, int64_t limit, object buffer)
