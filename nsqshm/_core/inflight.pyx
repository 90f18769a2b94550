# cython: freethreading_compatible=False
"""A channel's in-flight table and deferred queue, in C memory.

A message, as nsqd encodes it (all big-endian):

    offset  size  field
         0     8  timestamp, ns
         8     2  attempts
        10    16  ID, ASCII hex
        26     N  body

InFlight holds the messages sent to clients and not yet finished, keyed by
ID.  Each message is one block, a header and MsgEntry followed by the
message bytes (includes/arena_layout.h): in the owner's shared-memory Arena
after use_arena(), so another process can put the messages back if this one
dies, else malloc'd.  There is no Python object per message.  Three
structures point at the blocks:

* an open-addressing hash table of (hash, entry) slots with linear probing,
  grown at 0.7 load, deletions by backward shift (so there are no
  tombstones and probe chains stay short under churn);
* a binary min-heap of (deadline, seq, entry) nodes, each entry knowing its
  node's index, so a finish, requeue or touch of any entry is O(log n);
* a small hash table of per-client counts, so client_count() is O(1).

DeferredQueue is the heap alone: messages requeued with a delay, by due time.

Buffers filled by pop_expired, drain and pop_due hold packed records, the
same as Ring.pop_many_into:

    [ u32 size, native-endian ][ size bytes of message ] ...

A message that leaves through pop_expired, drain, pop_due or requeue is
copied out, but with an arena its block stays until release(): the caller
stores the copies elsewhere first, so a death in between repeats a message
and never loses one.

Neither class is thread-safe; a channel owns one of each and uses them from
one thread.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport INT64_MAX, int64_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memcmp, memmove
from posix.time cimport CLOCK_MONOTONIC, CLOCK_REALTIME, clock_gettime, timespec

from nsqshm._core.arena cimport Arena, block_alloc, block_free
from nsqshm._core.codec cimport MSG_HEADER_SIZE, MSG_ID_SIZE
from nsqshm._core.commitlog cimport LogReader
from nsqshm._core.logcursor cimport (
    Cursor,
    DeliveredRun,
    decode_log_id,
    delivered_run_add,
    delivered_run_end,
    packed_record_size,
)
from nsqshm._core.ext cimport ACCEPT_LEAVE, ACCEPT_SKIP, EXT_OFFSET, ExtView, ext_prefix
from nsqshm._core.tracelog cimport (
    DROP_EXPIRED,
    DROP_FILTERED,
    DROP_SAMPLED,
    EV_DROPPED,
    TraceWriter,
)
from nsqshm._core.includes.system cimport (
    NSQSHM_EXPIRY_BIT,
    NSQSHM_EXPIRY_SIZE,
    nsqshm_attempts,
    nsqshm_be64,
    nsqshm_clear_expiry,
    nsqshm_expires_at,
    nsqshm_has_expiry,
    NSQSHM_BLOCK_DEFERRED,
    NSQSHM_BLOCK_LIVE,
    memcpy,
    nsqshm_arena_block,
    nsqshm_load_acquire,
)
from nsqshm._core.ring cimport Ring

OK = STATUS_OK
NOT_IN_FLIGHT = STATUS_NOT_IN_FLIGHT
NOT_OWNER = STATUS_NOT_OWNER
FRAME_TYPE_MESSAGE = 2

cdef enum:
    MSG_ID_OFFSET = 10
    MSG_ATTEMPTS_OFFSET = 8
    FRAME_HEADER_SIZE = 8     # u32 size + u32 frame type
    RECORD_HEADER_SIZE = 4    # u32 native size before each packed record
    MIN_SLOTS = 16
    MIN_NODES = 16

# The largest message whose frame size (4 + len) still fits a u32.
cdef uint64_t MAX_MESSAGE_SIZE = 0xFFFFFFFF - FRAME_HEADER_SIZE
# Heap indices are u32 in each entry.
cdef size_t MAX_ENTRIES = 0xFFFFFFFE


# -- small helpers --------------------------------------------------------------

cdef inline char *_msg(MsgEntry *e) noexcept nogil:
    # the message bytes follow the 32-byte entry, 8-byte aligned
    return <char *>e + sizeof(MsgEntry)


cdef inline nsqshm_arena_block *_block_of(MsgEntry *e) noexcept nogil:
    # the entry sits at offset 32 of its block (asserted in arena_layout.h)
    return <nsqshm_arena_block *>(<char *>e - 32)


cdef enum:
    DETAIL_SIZE = 12  # Youzan's [8 BE queue offset][4 BE raw size] (SUB_ADVANCED, SUB_ORDERED)


cdef inline void _put_u32be(char *dst, uint32_t v) noexcept nogil:
    dst[0] = <char>(v >> 24)
    dst[1] = <char>(v >> 16)
    dst[2] = <char>(v >> 8)
    dst[3] = <char>v


cdef inline void _put_u64be(char *dst, uint64_t v) noexcept nogil:
    _put_u32be(dst, <uint32_t>(v >> 32))
    _put_u32be(dst + 4, <uint32_t>v)


cdef inline uint32_t _get_attempts(const char *msg) noexcept nogil:
    # (without the bit of a message's own time to live: message_expiry.h)
    return nsqshm_attempts(msg)


cdef inline void _bump_attempts(char *msg) noexcept nogil:
    # attempts: big-endian u16 at offset 8, its count saturating at 32767 so
    # that it never reaches bit 15 (a message's own time to live,
    # message_expiry.h), which it keeps
    cdef unsigned char *p = <unsigned char *>msg + MSG_ATTEMPTS_OFFSET
    cdef uint32_t attempts = (<uint32_t>p[0] << 8) | p[1]
    if (attempts & 0x7FFF) < 0x7FFF:
        attempts += 1
        p[0] = <unsigned char>(attempts >> 8)
        p[1] = <unsigned char>attempts


cdef int _append(bytearray buf, const char *p, Py_ssize_t n) except -1:
    cdef Py_ssize_t base = PyByteArray_GET_SIZE(buf)
    PyByteArray_Resize(buf, base + n)
    memcpy(PyByteArray_AS_STRING(buf) + base, p, n)
    return 0


cdef int _append_plain(bytearray buf, const char *rec, uint32_t size) except -1:
    """Append the packed record rec ([u32 native size][message of size])
    without a time to live of its own, if it has one (a dead letter is the
    message as nsqd encodes it: its dead-letter topic must not expire it)."""
    cdef Py_ssize_t base = PyByteArray_GET_SIZE(buf)
    cdef uint32_t plain = size
    cdef char *dst
    if nsqshm_has_expiry(rec + RECORD_HEADER_SIZE, size):
        plain = size - NSQSHM_EXPIRY_SIZE
    PyByteArray_Resize(buf, base + RECORD_HEADER_SIZE + plain)
    dst = PyByteArray_AS_STRING(buf) + base
    memcpy(dst, &plain, RECORD_HEADER_SIZE)
    memcpy(dst + RECORD_HEADER_SIZE, rec + RECORD_HEADER_SIZE, plain)
    if plain != size:
        nsqshm_clear_expiry(dst + RECORD_HEADER_SIZE)
    return 0


cdef inline uint64_t _mix64(uint64_t h) noexcept nogil:
    # murmur3's finaliser: every input bit reaches every output bit
    h ^= h >> 33
    h *= 0xff51afd7ed558ccdULL
    h ^= h >> 33
    h *= 0xc4ceb9fe1a85ec53ULL
    h ^= h >> 33
    return h


cdef inline uint64_t _hash_id(const char *msg_id) noexcept nogil:
    # IDs from one generator differ mostly in their last hex digits; the
    # multiply spreads the first half before the two halves are mixed
    cdef uint64_t first, last
    memcpy(&first, msg_id, 8)
    memcpy(&last, msg_id + 8, 8)
    return _mix64(last ^ (first * 0x9e3779b97f4a7c15ULL))


cdef inline size_t _pow2_at_least(size_t n) noexcept nogil:
    cdef size_t p = 1
    while p < n:
        p <<= 1
    return p


cdef inline int64_t _wall_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_REALTIME, &ts)
    return <int64_t>ts.tv_sec * 1000000000 + ts.tv_nsec


cdef inline int64_t time_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec * 1000000000 + ts.tv_nsec


cdef bytes _id_bytes(object msg_id):
    """msg_id as 16 bytes; any buffer is accepted, an int is not."""
    if type(msg_id) is not bytes:
        msg_id = bytes(memoryview(msg_id))
    if PyBytes_GET_SIZE(msg_id) != MSG_ID_SIZE:
        raise ValueError(f"message ID must be {MSG_ID_SIZE} bytes, got {len(msg_id)}")
    return <bytes>msg_id


# -- the heap: (deadline, seq) min-heap of entries -------------------------------

cdef inline bint _before(const HeapNode *a, const HeapNode *b) noexcept nogil:
    return a.deadline < b.deadline or (a.deadline == b.deadline and a.seq < b.seq)


cdef void _sift_up(HeapNode *nodes, size_t i) noexcept nogil:
    cdef HeapNode node = nodes[i]
    cdef size_t parent
    while i > 0:
        parent = (i - 1) >> 1
        if not _before(&node, &nodes[parent]):
            break
        nodes[i] = nodes[parent]
        nodes[i].entry.heap_index = <uint32_t>i
        i = parent
    nodes[i] = node
    node.entry.heap_index = <uint32_t>i


cdef void _sift_down(HeapNode *nodes, size_t length, size_t i) noexcept nogil:
    cdef HeapNode node = nodes[i]
    cdef size_t child
    while True:
        child = 2 * i + 1
        if child >= length:
            break
        if child + 1 < length and _before(&nodes[child + 1], &nodes[child]):
            child += 1
        if not _before(&nodes[child], &node):
            break
        nodes[i] = nodes[child]
        nodes[i].entry.heap_index = <uint32_t>i
        i = child
    nodes[i] = node
    node.entry.heap_index = <uint32_t>i


cdef inline void _resift(MsgHeap *h, size_t i) noexcept nogil:
    # the node at i has a new key (or is new there): move it whichever way
    if i > 0 and _before(&h.nodes[i], &h.nodes[(i - 1) >> 1]):
        _sift_up(h.nodes, i)
    else:
        _sift_down(h.nodes, h.length, i)


cdef int _heap_init(MsgHeap *h, size_t capacity) noexcept nogil:
    if capacity < MIN_NODES:
        capacity = MIN_NODES
    h.nodes = <HeapNode *>malloc(capacity * sizeof(HeapNode))
    if h.nodes == NULL:
        return -1
    h.length = 0
    h.capacity = capacity
    h.min_capacity = capacity
    h.next_seq = 0
    return 0


cdef int _heap_push(MsgHeap *h, MsgEntry *e, int64_t deadline) noexcept nogil:
    """0, or -1 when out of memory (the heap unchanged)."""
    cdef HeapNode *grown
    if h.length == h.capacity:
        grown = <HeapNode *>realloc(h.nodes, 2 * h.capacity * sizeof(HeapNode))
        if grown == NULL:
            return -1
        h.nodes = grown
        h.capacity *= 2
    h.nodes[h.length].deadline = deadline
    h.nodes[h.length].seq = h.next_seq
    h.nodes[h.length].entry = e
    h.next_seq += 1
    h.length += 1
    _sift_up(h.nodes, h.length - 1)
    return 0


cdef void _heap_remove(MsgHeap *h, size_t i) noexcept nogil:
    cdef HeapNode *shrunk
    h.length -= 1
    if i != h.length:
        h.nodes[i] = h.nodes[h.length]
        _resift(h, i)
    # give back memory after a burst, with hysteresis (grow at full, shrink at 1/4)
    if h.length * 4 < h.capacity and h.capacity > h.min_capacity:
        shrunk = <HeapNode *>realloc(h.nodes, (h.capacity // 2) * sizeof(HeapNode))
        if shrunk != NULL:
            h.nodes = shrunk
            h.capacity //= 2


cdef inline void _heap_rekey(MsgHeap *h, size_t i, int64_t deadline) noexcept nogil:
    # a new seq too: a touched message goes behind others of the same deadline
    h.nodes[i].deadline = deadline
    h.nodes[i].seq = h.next_seq
    h.next_seq += 1
    _resift(h, i)


cdef void _heap_free(MsgHeap *h) noexcept nogil:
    cdef size_t i
    if h.nodes != NULL:
        for i in range(h.length):
            # arena blocks stay: they are the owner's record of its messages
            if _block_of(h.nodes[i].entry).capacity == 0:
                free(_block_of(h.nodes[i].entry))
        free(h.nodes)
        h.nodes = NULL
    h.length = 0
    h.capacity = 0


# -- the ID table: open addressing, linear probing, backward-shift deletion ------

cdef int _ids_init(IdTable *t, size_t capacity_hint) noexcept nogil:
    cdef size_t nslots = _pow2_at_least(capacity_hint * 10 // 7 + 1)
    if nslots < MIN_SLOTS:
        nslots = MIN_SLOTS
    t.slots = <IdSlot *>calloc(nslots, sizeof(IdSlot))
    if t.slots == NULL:
        return -1
    t.mask = nslots - 1
    t.count = 0
    t.min_slots = nslots
    return 0


cdef inline size_t _ids_probe(const IdTable *t, uint64_t h, const char *msg_id) noexcept nogil:
    """The slot holding msg_id, or the empty slot where it would go."""
    cdef size_t i = h & t.mask
    cdef MsgEntry *e
    while True:
        e = t.slots[i].entry
        if e == NULL:
            return i
        if t.slots[i].hash == h and memcmp(_msg(e) + MSG_ID_OFFSET, msg_id, MSG_ID_SIZE) == 0:
            return i
        i = (i + 1) & t.mask


cdef inline size_t _ids_slot_of(const IdTable *t, const MsgEntry *e) noexcept nogil:
    """The slot of an entry known to be in the table: pointer compares only."""
    cdef size_t i = e.hash & t.mask
    while t.slots[i].entry != e:
        i = (i + 1) & t.mask
    return i


cdef int _ids_resize(IdTable *t, size_t nslots) noexcept nogil:
    cdef IdSlot *slots = <IdSlot *>calloc(nslots, sizeof(IdSlot))
    cdef size_t mask = nslots - 1, i, j
    if slots == NULL:
        return -1
    for i in range(t.mask + 1):
        if t.slots[i].entry != NULL:
            j = t.slots[i].hash & mask
            while slots[j].entry != NULL:
                j = (j + 1) & mask
            slots[j] = t.slots[i]
    free(t.slots)
    t.slots = slots
    t.mask = mask
    return 0


cdef void _ids_delete(IdTable *t, size_t hole) noexcept nogil:
    # Backward shift: walk the run after the hole; an entry whose home slot
    # is not cyclically in (hole, j] would become unreachable past the hole,
    # so it moves into the hole, and the hole moves to where it was.
    cdef size_t j = hole, home
    cdef size_t mask = t.mask
    while True:
        j = (j + 1) & mask
        if t.slots[j].entry == NULL:
            break
        home = t.slots[j].hash & mask
        if ((j - home) & mask) < ((j - hole) & mask):
            continue                    # home lies in (hole, j]: stays
        t.slots[hole] = t.slots[j]
        hole = j
    t.slots[hole].entry = NULL
    t.count -= 1
    # shrink after a burst: at 1/8 load halve, leaving 1/4
    if t.count * 8 < t.mask + 1 and t.mask + 1 > t.min_slots:
        _ids_resize(t, (t.mask + 1) // 2)   # on failure keep the larger table


# -- per-client counts: a tiny open-addressing table of client_id -> count -------

cdef int _clients_init(ClientTable *t) noexcept nogil:
    t.slots = <ClientSlot *>calloc(MIN_SLOTS, sizeof(ClientSlot))
    if t.slots == NULL:
        return -1
    t.mask = MIN_SLOTS - 1
    t.used = 0
    t.live = 0
    return 0


cdef int _clients_rehash(ClientTable *t) noexcept nogil:
    # Clients come and go for the life of a channel; a client at zero keeps
    # its slot until here, where only live clients are carried over.
    cdef size_t nslots = _pow2_at_least((t.live + 1) * 4)
    cdef size_t mask, i, j
    cdef ClientSlot *slots
    if nslots < MIN_SLOTS:
        nslots = MIN_SLOTS
    slots = <ClientSlot *>calloc(nslots, sizeof(ClientSlot))
    if slots == NULL:
        return -1
    mask = nslots - 1
    for i in range(t.mask + 1):
        if t.slots[i].used and t.slots[i].count:
            j = _mix64(t.slots[i].client_id) & mask
            while slots[j].used:
                j = (j + 1) & mask
            slots[j] = t.slots[i]
    free(t.slots)
    t.slots = slots
    t.mask = mask
    t.used = t.live
    return 0


cdef ClientSlot *_client_slot(ClientTable *t, uint64_t client_id, bint create) noexcept nogil:
    """The client's slot; with create, a new one at count 0 if it has none.
    NULL if absent (or, with create, out of memory)."""
    cdef size_t i = _mix64(client_id) & t.mask
    cdef ClientSlot *s
    while t.slots[i].used:
        if t.slots[i].client_id == client_id:
            return &t.slots[i]
        i = (i + 1) & t.mask
    if not create:
        return NULL
    if (t.used + 1) * 2 > t.mask + 1:
        if _clients_rehash(t) < 0:
            return NULL
        i = _mix64(client_id) & t.mask
        while t.slots[i].used:
            i = (i + 1) & t.mask
    s = &t.slots[i]
    s.used = 1
    s.client_id = client_id
    s.count = 0
    t.used += 1
    return s


# -- what InFlight and DeferredQueue share ---------------------------------------

cdef class MessageStore:
    """A heap of messages in blocks (see the module docstring); not used alone."""

    def __cinit__(self, *args, **kwargs):
        self.heap.nodes = NULL
        self._total_bytes = 0
        self.arena = None
        self.queue = 0
        self.block_state = NSQSHM_BLOCK_LIVE
        self.wall_offset = 0
        self.pending = NULL
        self.n_pending = self.cap_pending = 0

    def __dealloc__(self):
        _heap_free(&self.heap)
        free(self.pending)  # pending arena blocks stay LIVE: recovered if never released
        self.pending = NULL

    def use_arena(self, Arena arena not None, str queue):
        """Keep the messages in `arena`, recorded as belonging to `queue`
        ("topic:channel"); before any message is added."""
        if self.heap.length:
            raise ValueError("use_arena() must come before any message is added")
        self.queue = arena.queue_index(queue)
        self.arena = arena

    cdef MsgEntry *_new_entry(self, uint32_t size) noexcept:
        cdef nsqshm_arena_block *b = block_alloc(self.arena, size)
        if b == NULL:
            return NULL
        b.entry.size = size
        return &b.entry

    cdef void _commit(self, MsgEntry *e, int64_t mono_ns) noexcept:
        """The message is copied in: record it in the arena (its state last),
        its deadline on the wall clock (wall_offset: set once per call)."""
        cdef nsqshm_arena_block *b = _block_of(e)
        if b.capacity and self.arena is not None:
            self.arena.commit(b, self.queue, self.block_state, mono_ns + self.wall_offset)

    cdef void _clock(self) noexcept:
        if self.arena is not None:
            self.wall_offset = _wall_ns() - time_ns()

    cdef void _discard(self, MsgEntry *e) noexcept:
        block_free(self.arena, _block_of(e))

    cdef int _hand_out(self, MsgEntry *e) except -1:
        """e left the structures and was copied out: free it now, or, in an
        arena, at release() once the copy is stored."""
        cdef nsqshm_arena_block *b = _block_of(e)
        cdef nsqshm_arena_block **grown
        cdef size_t cap
        if b.capacity == 0 or self.arena is None:
            block_free(self.arena, b)
            return 0
        if self.n_pending == self.cap_pending:
            cap = self.cap_pending * 2 if self.cap_pending else 256
            grown = <nsqshm_arena_block **>realloc(self.pending, cap * sizeof(void *))
            if grown == NULL:
                raise MemoryError()
            self.pending = grown
            self.cap_pending = cap
        self.pending[self.n_pending] = b
        self.n_pending += 1
        return 0

    cdef void _unlink(self, MsgEntry *e) noexcept:
        _heap_remove(&self.heap, e.heap_index)
        self._total_bytes -= e.size

    def release(self):
        """Free the blocks of the messages handed out since the last call
        (their copies are stored now); returns how many."""
        cdef size_t i, n = self.n_pending
        for i in range(n):
            block_free(self.arena, self.pending[i])
        self.n_pending = 0
        return n

    def snapshot(self, buffer):
        """Copy the messages held, in heap order, without removing any, into
        the writable buffer as records (peek.py; not a delivery path):

            [ u32 native size ][ i64 deadline, monotonic ns ][ u64 client ID ][ message ]

        Stops at the first that would not fit; returns (records, bytes, held)."""
        cdef Py_buffer view
        cdef MsgEntry *e
        cdef char *dst
        cdef Py_ssize_t pos = 0, count = 0, need
        cdef size_t i
        PyObject_GetBuffer(buffer, &view, PyBUF_WRITABLE)
        try:
            dst = <char *>view.buf
            for i in range(self.heap.length):
                e = self.heap.nodes[i].entry
                need = RECORD_HEADER_SIZE + 16 + <Py_ssize_t>e.size
                if view.len - pos < need:
                    break
                memcpy(dst + pos, &e.size, RECORD_HEADER_SIZE)
                memcpy(dst + pos + 4, &self.heap.nodes[i].deadline, 8)
                memcpy(dst + pos + 12, &e.client_id, 8)
                memcpy(dst + pos + 20, _msg(e), e.size)
                pos += need
                count += 1
        finally:
            PyBuffer_Release(&view)
        return count, pos, self.heap.length

    @property
    def unreleased(self):
        """Messages handed out whose blocks wait for release()."""
        return self.n_pending

    cdef int _take_out(self, MsgEntry *e, Py_buffer *view, Py_ssize_t *pos,
                       Py_ssize_t count) except -1:
        """Copy e as a packed record to view at *pos and hand it out (1), or 0
        when it does not fit (an error if it is the first: count 0)."""
        if view.len - pos[0] < RECORD_HEADER_SIZE + <Py_ssize_t>e.size:
            if count == 0:
                raise ValueError(f"buffer of {view.len} bytes cannot hold the next "
                                 f"message of {e.size} bytes plus its 4-byte size")
            return 0
        memcpy(<char *>view.buf + pos[0], &e.size, RECORD_HEADER_SIZE)
        memcpy(<char *>view.buf + pos[0] + RECORD_HEADER_SIZE, _msg(e), e.size)
        pos[0] += RECORD_HEADER_SIZE + e.size
        self._unlink(e)
        self._hand_out(e)
        return 1

    cdef tuple _pop_into(self, int64_t limit, object buffer):
        cdef Py_buffer view
        cdef Py_ssize_t pos = 0, count = 0
        PyObject_GetBuffer(buffer, &view, PyBUF_WRITABLE)
        try:
            while self.heap.length and self.heap.nodes[0].deadline <= limit:
                if not self._take_out(self.heap.nodes[0].entry, &view, &pos, count):
                    break
                count += 1
        finally:
            PyBuffer_Release(&view)
        return count, pos

    def drain_stale(self, CursorSet cursors not None, buffer):
        """Take out, into buffer as packed records, the messages a cursor move
        left stale (CursorSet.stale_id: below their cursor's confirmed offset,
        or of a partition a seek holds); the others stay where they are (in
        flight: their FINs still hold).  Call until it returns (0, 0)."""
        return self._drain(cursors, -1, buffer)

    def drain_partition(self, long long partition, buffer):
        """Take out, into buffer as packed records, the messages of one log
        partition (a local consumer's copies taken before the partition moved
        into an ordered lane: the lane's feeder delivers them again, in order).
        Call until it returns (0, 0)."""
        if partition < 0:
            raise ValueError(f"partition {partition}")
        return self._drain(None, partition, buffer)

    cdef _drain(self, CursorSet cursors, long long partition, buffer):
        """drain_stale (cursors) or drain_partition (partition)."""
        cdef Py_buffer view
        cdef MsgEntry *e
        cdef MsgEntry **found
        cdef size_t i, n = 0
        cdef Py_ssize_t pos = 0, count = 0
        cdef uint64_t off = 0
        cdef bint stale
        if not self.heap.length:
            return 0, 0
        found = <MsgEntry **>malloc(self.heap.length * sizeof(MsgEntry *))
        if found == NULL:
            raise MemoryError()
        try:
            for i in range(self.heap.length):  # (collected first: unlinking reorders the heap)
                e = self.heap.nodes[i].entry
                if cursors is not None:
                    stale = cursors.stale_id(_msg(e) + MSG_ID_OFFSET)
                else:
                    stale = decode_log_id(_msg(e) + MSG_ID_OFFSET, &off) == partition
                if stale:
                    found[n] = e
                    n += 1
            PyObject_GetBuffer(buffer, &view, PyBUF_WRITABLE)
            try:
                for i in range(n):
                    if not self._take_out(found[i], &view, &pos, count):
                        break
                    count += 1
            finally:
                PyBuffer_Release(&view)
        finally:
            free(found)
        return count, pos


# -- InFlight ---------------------------------------------------------------------

cdef class InFlight(MessageStore):
    """Messages in flight on one channel: keyed by ID, ordered by deadline."""

    def __cinit__(self, size_t capacity_hint=1024):
        self.ids.slots = NULL
        self.clients.slots = NULL
        self.duplicates = 0
        self.sampled_out = 0
        self.ttl_ns = 0
        self.expired = 0
        self.expired_out = None
        self.lat = NULL
        self.lat_cap = self.lat_next = self.lat_len = 0
        self.lat_now = 0
        self._rng = _mix64(<uint64_t>time_ns() ^ <uint64_t><size_t><void *>self)
        if capacity_hint > (<size_t>1 << 32):
            raise ValueError(f"capacity_hint {capacity_hint} is over 2**32")
        if _ids_init(&self.ids, capacity_hint) < 0 or \
                _heap_init(&self.heap, capacity_hint) < 0 or \
                _clients_init(&self.clients) < 0:
            raise MemoryError()

    def __dealloc__(self):
        if self.lat != NULL:
            free(self.lat)
            self.lat = NULL
        _heap_free(&self.heap)          # frees malloc'd entries too
        free(self.ids.slots)
        free(self.clients.slots)

    # -- the core, shared by every path ------------------------------------------

    cdef int _insert(self, const char *msg, uint32_t size, uint64_t client_id,
                     int64_t deadline_ns) noexcept:
        """Copy msg in: 0; 1 if its ID is already in flight (nothing done);
        -1 when out of memory or at MAX_ENTRIES (nothing done)."""
        cdef const char *msg_id = msg + MSG_ID_OFFSET
        cdef uint64_t h = _hash_id(msg_id)
        cdef size_t slot = _ids_probe(&self.ids, h, msg_id)
        cdef ClientSlot *client
        cdef MsgEntry *e
        if self.ids.slots[slot].entry != NULL:
            return 1
        if self.ids.count >= MAX_ENTRIES:
            return -1
        if (self.ids.count + 1) * 10 > (self.ids.mask + 1) * 7:
            if _ids_resize(&self.ids, 2 * (self.ids.mask + 1)) < 0:
                return -1
            slot = _ids_probe(&self.ids, h, msg_id)
        client = _client_slot(&self.clients, client_id, True)
        if client == NULL:
            return -1
        e = self._new_entry(size)
        if e == NULL:
            return -1
        e.client_id = client_id
        e.first_deadline = deadline_ns
        e.hash = h
        e.size = size
        memcpy(_msg(e), msg, size)
        if _heap_push(&self.heap, e, deadline_ns) < 0:
            self._discard(e)
            return -1
        self._commit(e, deadline_ns)
        self.ids.slots[slot].hash = h
        self.ids.slots[slot].entry = e
        self.ids.count += 1
        client.count += 1
        if client.count == 1:
            self.clients.live += 1
        self._total_bytes += size
        return 0

    cdef void _remove(self, MsgEntry *e, size_t slot) noexcept:
        """Unlink e (at `slot` of the ID table) from everything; the caller frees it."""
        cdef ClientSlot *client = _client_slot(&self.clients, e.client_id, False)
        client.count -= 1
        if client.count == 0:
            self.clients.live -= 1
        self._total_bytes -= e.size
        _heap_remove(&self.heap, e.heap_index)
        _ids_delete(&self.ids, slot)

    cdef int add_raw(self, const char *msg, uint32_t size, uint64_t client_id,
                     int64_t deadline_ns) except -1:
        """Copy a message (size >= 26, unchecked) into the table.  KeyError
        if its ID is in flight, MemoryError if out of memory."""
        self._clock()
        cdef int r = self._insert(msg, size, client_id, deadline_ns)
        if r == 1:
            raise KeyError(PyBytes_FromStringAndSize(msg + MSG_ID_OFFSET, MSG_ID_SIZE))
        if r < 0:
            raise MemoryError()
        return 0

    cdef int finish_raw(self, const char *msg_id, uint64_t client_id) noexcept:
        """Remove and free the message msg_id (16 bytes) held by client_id:
        STATUS_OK, STATUS_NOT_IN_FLIGHT or STATUS_NOT_OWNER."""
        cdef size_t slot = _ids_probe(&self.ids, _hash_id(msg_id), msg_id)
        cdef MsgEntry *e = self.ids.slots[slot].entry
        if e == NULL:
            return STATUS_NOT_IN_FLIGHT
        if e.client_id != client_id:
            return STATUS_NOT_OWNER
        if self.lat != NULL:
            self._record_latency(_msg(e))
        self._remove(e, slot)
        self._discard(e)
        return STATUS_OK

    cdef int finish_logged(self, const char *msg_id, uint64_t client_id,
                           CursorSet cursors) except -9:
        """finish_raw for a log topic's channel, in one probe: once the
        client is known to hold the message (a stray FIN marks nothing),
        its offset is marked in its partition's cursor, then the block is
        freed.  That order: a death between the two leaves the block, which
        is delivered again (at least once; a second finish of the offset is
        ALREADY), where the other would leave an offset nothing ever
        finishes (the partition stalls once the window fills).
        STATUS_CURSOR_DETACHED: the ID's cursor is not attached here yet
        (nothing changed; the caller's Python path attaches it)."""
        cdef size_t slot = _ids_probe(&self.ids, _hash_id(msg_id), msg_id)
        cdef MsgEntry *e = self.ids.slots[slot].entry
        cdef uint64_t offset = 0
        cdef long long partition
        if e == NULL:
            return STATUS_NOT_IN_FLIGHT
        if e.client_id != client_id:
            return STATUS_NOT_OWNER
        partition = cursors.find_id(msg_id, &offset)
        if partition == -2:
            return STATUS_CURSOR_DETACHED
        if partition >= 0:
            cursors.finish_at(partition, offset)
        if self.lat != NULL:
            self._record_latency(_msg(e))
        self._remove(e, slot)
        self._discard(e)
        return STATUS_OK

    cdef void _record_latency(self, const char *msg) noexcept:
        """Keep (now, now - the message's publish timestamp) in the latency ring."""
        cdef const unsigned char *b = <const unsigned char *>msg
        cdef int64_t ts = 0
        cdef int i
        for i in range(8):
            ts = (ts << 8) | b[i]
        self.lat[2 * self.lat_next] = self.lat_now
        self.lat[2 * self.lat_next + 1] = self.lat_now - ts
        self.lat_next = (self.lat_next + 1) % self.lat_cap
        if self.lat_len < self.lat_cap:
            self.lat_len += 1

    def enable_latency(self, size_t samples=65536):
        """Record e2e processing latency at each finish, the last `samples` kept."""
        if self.lat == NULL and samples:
            self.lat = <int64_t *>malloc(2 * samples * sizeof(int64_t))
            if self.lat == NULL:
                raise MemoryError()
            self.lat_cap = samples

    cdef int _held(self, const char *msg_id, uint64_t client_id, MsgEntry **entry) noexcept:
        cdef MsgEntry *e = self.ids.slots[_ids_probe(&self.ids, _hash_id(msg_id), msg_id)].entry
        entry[0] = e
        if e == NULL:
            return STATUS_NOT_IN_FLIGHT
        return STATUS_OK if e.client_id == client_id else STATUS_NOT_OWNER

    cdef int touch_raw(self, const char *msg_id, uint64_t client_id,
                       int64_t new_deadline_ns) noexcept:
        cdef MsgEntry *e
        cdef int status = self._held(msg_id, client_id, &e)
        if status == STATUS_OK:
            _heap_rekey(&self.heap, e.heap_index, new_deadline_ns)
        return status

    cdef int64_t first_deadline_raw(self, const char *msg_id) noexcept:
        """The deadline msg_id (16 bytes) was given at delivery, or -1."""
        cdef MsgEntry *e = self.ids.slots[_ids_probe(&self.ids, _hash_id(msg_id), msg_id)].entry
        return e.first_deadline if e != NULL else -1

    cdef int requeue_raw(self, const char *msg_id, uint64_t client_id,
                         bytearray out) except -9:
        """requeue() without Python objects: take msg_id (16 bytes) held by
        client_id out of the table, appending it to `out` as a packed record
        ([u32 native size][message]); with an arena its block stays until
        release() (the caller stores the copy first).  STATUS_OK,
        STATUS_NOT_IN_FLIGHT or STATUS_NOT_OWNER (nothing changed)."""
        cdef size_t slot = _ids_probe(&self.ids, _hash_id(msg_id), msg_id)
        cdef MsgEntry *e = self.ids.slots[slot].entry
        cdef uint32_t size
        if e == NULL:
            return STATUS_NOT_IN_FLIGHT
        if e.client_id != client_id:
            return STATUS_NOT_OWNER
        size = e.size
        _append(out, <const char *>&size, RECORD_HEADER_SIZE)
        _append(out, _msg(e), size)
        self._remove(e, slot)
        self._hand_out(e)
        return STATUS_OK

    cdef MsgEntry *_find(self, bytes msg_id) noexcept:
        cdef const char *p = PyBytes_AS_STRING(msg_id)
        return self.ids.slots[_ids_probe(&self.ids, _hash_id(p), p)].entry

    cdef void _unlink(self, MsgEntry *e) noexcept:
        self._remove(e, _ids_slot_of(&self.ids, e))

    # -- Python API ----------------------------------------------------------------

    def add(self, msg, uint64_t client_id, int64_t deadline_ns):
        """Copy msg (a whole encoded message) into the table, held by client_id
        until deadline_ns.  KeyError if its ID is already in flight."""
        cdef Py_buffer view
        PyObject_GetBuffer(msg, &view, PyBUF_SIMPLE)
        try:
            if view.len < MSG_HEADER_SIZE:
                raise ValueError(f"message of {view.len} bytes is shorter than its "
                                 f"{MSG_HEADER_SIZE}-byte header")
            if <uint64_t>view.len > MAX_MESSAGE_SIZE:
                raise ValueError(f"message of {view.len} bytes is too large for a frame")
            self.add_raw(<const char *>view.buf, <uint32_t>view.len, client_id, deadline_ns)
        finally:
            PyBuffer_Release(&view)

    def finish(self, msg_id, uint64_t client_id):
        """Remove a message: OK, NOT_IN_FLIGHT or NOT_OWNER."""
        cdef bytes key = _id_bytes(msg_id)
        if self.lat != NULL:  # message timestamps are wall-clock ns, as nsqd's
            self.lat_now = _wall_ns()
        return self.finish_raw(PyBytes_AS_STRING(key), client_id)

    def requeue(self, msg_id, uint64_t client_id):
        """Remove a message and return its bytes, or NOT_IN_FLIGHT / NOT_OWNER."""
        cdef bytes key = _id_bytes(msg_id)
        cdef const char *p = PyBytes_AS_STRING(key)
        cdef size_t slot = _ids_probe(&self.ids, _hash_id(p), p)
        cdef MsgEntry *e = self.ids.slots[slot].entry
        if e == NULL:
            return STATUS_NOT_IN_FLIGHT
        if e.client_id != client_id:
            return STATUS_NOT_OWNER
        out = PyBytes_FromStringAndSize(_msg(e), e.size)
        self._remove(e, slot)
        self._hand_out(e)  # with an arena, kept until release(): the caller stores out first
        return out

    def touch(self, msg_id, uint64_t client_id, int64_t new_deadline_ns):
        """Move a message's deadline: OK, NOT_IN_FLIGHT or NOT_OWNER."""
        cdef bytes key = _id_bytes(msg_id)
        return self.touch_raw(PyBytes_AS_STRING(key), client_id, new_deadline_ns)

    def pop_expired(self, int64_t now_ns, buffer):
        """Remove messages with deadline <= now_ns, earliest first, into the
        writable buffer as packed [u32 native size][message] records.

        Stops at the first that would not fit; ValueError if that is the
        first of all (the buffer could never make progress).  Returns
        (messages, bytes written).
        """
        return self._pop_into(now_ns, buffer)

    def drain(self, buffer):
        """pop_expired for every message whatever its deadline (shutdown);
        call until it returns (0, 0)."""
        return self._pop_into(INT64_MAX, buffer)

    def trace_drops(self, TraceWriter writer=None, uint32_t stream=0):
        """A traced channel: deliver() records a DROPPED event in writer's log
        (as events of `stream`) for each message it expires, samples out or
        filters out; writer None: stop."""
        self.drop_trace = writer
        self.drop_stream = stream

    cdef void _dropped(self, const char *msg, uint64_t reason) noexcept:
        # never a failed delivery: an event the writer cannot hold is lost, as a
        # failed write's are (deliver() is half way through its output here)
        try:
            self.drop_trace.add(EV_DROPPED, msg + MSG_ID_OFFSET, self.drop_trace.now,
                                nsqshm_attempts(msg), self.drop_stream, reason, NULL)
        except MemoryError:
            pass

    cdef uint64_t _queue_offset(self, const char *msg_id) noexcept:
        # a log message's byte offset in its partition's log (detail_readers),
        # as Youzan's frames carry it; 0 where it cannot be told (no reader
        # open for the partition, the message gone to retention)
        cdef uint64_t offset = 0
        cdef long long partition = decode_log_id(msg_id, &offset)
        cdef object reader
        cdef int64_t v
        if self.detail_readers is None or partition < 0 or \
                partition >= len(self.detail_readers):
            return 0
        reader = self.detail_readers[partition]
        if reader is None:
            return 0
        v = (<LogReader>reader).virtual_of(offset)
        return <uint64_t>v if v >= 0 else 0

    def deliver_from_log(self, Cursor cursor not None, LogReader reader not None,
                         uint64_t end, Ring before, Py_ssize_t room, bytearray scratch not None,
                         bytearray out not None, uint64_t client_id, int64_t deadline_ns,
                         int detail=-1, bint detail_log=False, bint one_out=False,
                         Ring lanes=None, uint64_t lanes_seen=0):
        """A log channel's delivery of one partition to one client straight
        from the log (LogChannel._deliver_direct), as one claim under the
        cursor's lock against every other reader of the partition: the next
        run of unread, unfinished messages below `end` (at most `room`) read
        into `scratch` (LogReader.read_into), framed and put in flight
        (deliver), read_pos moved past them.  `before`: the ring the owner's
        feeder fills with the partition; while it holds records (claimed
        earlier), nothing is read past them.  one_out: an ordered lane's
        (SUB_ORDERED), one message out at a time: nothing while one is
        (read_pos past confirmed), looked at under the lock.  lanes: the
        channel's ring, whose lanes_version must still be `lanes_seen` under
        the lock (else nothing: a lane move held this cursor since the caller
        last looked for lanes, LogChannel.look_for_lanes).

        Returns (n, added, at): n > 0 went out, from msg offset `at` (added:
        put in flight); else as Cursor.claim_read's n and first (0 with at 0
        too while `before` holds records or lanes moved)."""
        cdef Py_ssize_t got, added
        cdef bint held
        cursor._lock()
        try:
            if before is not None and before.depth:
                return 0, 0, 0
            if lanes is not None and nsqshm_load_acquire(&lanes.hdr.lanes_version) != lanes_seen:
                return 0, 0, 0
            if one_out and cursor._read_at(&held) > cursor.h.confirmed:
                return 0, 0, 0
            first, got, nbytes = cursor._claim_read(reader, end, room, scratch)
            if got <= 0:
                return got, 0, first
            # (deliver reads the first `got` records; what follows them is not looked at)
            added = self.deliver(scratch, got, out, client_id, deadline_ns, 0, None, detail,
                                 detail_log)
            cursor._read_to(<uint64_t>first + <uint64_t>got)
            return got, added, first
        finally:
            cursor._unlock()

    def deliver(self, records, Py_ssize_t count, bytearray out not None,
                uint64_t client_id, int64_t deadline_ns, int sample_rate=0,
                ExtView ext=None, int detail=-1, bint detail_log=False):
        """Send `count` messages to one client.

        `records` holds packed [u32 native size][message] records, as from
        Ring.pop_many_into.  Each message's attempts is incremented (in the
        copy; saturating at 65535), an NSQ message frame

            [ u32 BE size = 4 + len ][ u32 BE frame type 2 ][ message ]

        is appended to `out`, and the message as framed goes into the table
        held by client_id until deadline_ns.  A message whose ID is already
        in flight is framed but not added, and counted in `duplicates`.
        Returns the number added.

        With a sample_rate of 1-99 (IDENTIFY's), each message is kept with
        nsqd's odds, rand.Int31n(100) <= sample_rate, as its messagePump
        draws them: a message sampled out is consumed from the channel for
        this client without being framed, put in flight or counted anywhere
        but `sampled_out` (and finished in `log_cursors`, a log
        channel's, when set).  0 keeps every message.

        With log_cursors (a log channel's CursorSet), each message put in
        flight raises its partition's delivered mark (CursorSet.raise_delivered,
        once per run of one partition): a partition's next leader gives what
        was in flight here the attempts of one delivery (rpc CURSORS).

        With ttl_ns set (a channel's or its topic's time to live), a message
        whose timestamp is ttl_ns or more in the past is consumed without
        being framed or put in flight, and counted in `expired`; with a
        bytearray in expired_out it is appended there (packed record).

        With ext (a client of an ext topic, nsqshm._core.ext): a message its
        filter refuses is consumed without being framed (confirmed for the
        channel, counted in ext.filtered); one its tag dispatch leaves for
        another consumer stops the call there (`consumed` tells how many
        records were taken); with ext.strip the frame leaves out the ext part
        while the in-flight copy keeps it.

        With trace_drops on, each message expired, sampled out or filtered
        out is a DROPPED event with its reason, written once at the end.

        With detail >= 0 (a client of SUB_ADVANCED or SUB_ORDERED) each frame
        carries Youzan's [8 BE queue offset][4 BE raw size] after the ID and
        any ext part it keeps: the raw size is the message's size plus
        `detail` (its record overhead in the queue); the queue offset is, with
        detail_log, the message's byte offset in its partition's log
        (detail_readers; 0 without a reader), else 0.

        Records are checked before anything changes; on MemoryError part
        way, `out` ends after the last message added.
        """
        cdef Py_buffer view
        cdef const char *src
        cdef char *dst
        cdef Py_ssize_t pos = 0, k, grow = 0, base, added = 0
        cdef uint32_t size, raw_size
        cdef int r
        cdef bint sampling = 0 < sample_rate < 100
        cdef int64_t expires_before = 0   # publish timestamps before this: expired
        cdef int64_t now_ns = 0           # read at the first message with its own deadline
        cdef bint own_ttl, shrunk = False  # out ends before base + grow
        cdef const char *msg
        cdef int verdict
        cdef Py_ssize_t cut
        cdef bint traced = self.drop_trace is not None
        cdef Py_ssize_t dropped = 0
        cdef DeliveredRun run  # log_cursors: the run whose delivered mark is raised
        run.id, run.hi, run.lo = NULL, 0, 0  # (hi, lo: read only after id is set)
        self.consumed = 0
        if count < 0:
            raise ValueError(f"count {count} is negative")
        self._clock()
        if not 0 <= sample_rate <= 99:
            raise ValueError(f"sample_rate {sample_rate} is not in 0-99")
        if traced:
            self.drop_trace.clock()
        PyObject_GetBuffer(records, &view, PyBUF_SIMPLE)
        try:
            src = <const char *>view.buf
            # pass 1: validate every record and size the output once
            for k in range(count):
                if view.len - pos < RECORD_HEADER_SIZE:
                    raise ValueError(f"records buffer of {view.len} bytes ends inside "
                                     f"record {k} of {count}")
                memcpy(&size, src + pos, RECORD_HEADER_SIZE)
                if size < MSG_HEADER_SIZE or size > MAX_MESSAGE_SIZE:
                    raise ValueError(f"record {k} is a message of {size} bytes, shorter than "
                                     f"its {MSG_HEADER_SIZE}-byte header or too large")
                if view.len - pos - RECORD_HEADER_SIZE < <Py_ssize_t>size:
                    raise ValueError(f"record {k} of {size} bytes runs past the end of the "
                                     f"{view.len}-byte records buffer")
                pos += RECORD_HEADER_SIZE + size
                grow += FRAME_HEADER_SIZE + size + (DETAIL_SIZE if detail >= 0 else 0)
            base = PyByteArray_GET_SIZE(out)
            PyByteArray_Resize(out, base + grow)
            if self.ttl_ns > 0:
                expires_before = _wall_ns() - self.ttl_ns
            # pass 2: frame, bump attempts in the frame, add the framed copy
            dst = PyByteArray_AS_STRING(out) + base
            pos = 0
            for k in range(count):
                memcpy(&size, src + pos, RECORD_HEADER_SIZE)
                raw_size = size
                msg = src + pos + RECORD_HEADER_SIZE
                if ext is not None:
                    verdict = ext.accept(msg, size)
                    if verdict == ACCEPT_LEAVE:
                        break  # left in the ring for a consumer of its tag
                    if verdict == ACCEPT_SKIP:
                        ext.confirm(msg + MSG_ID_OFFSET)
                        if traced:
                            self._dropped(msg, DROP_FILTERED)
                            dropped += 1
                        self.consumed = k + 1
                        pos += RECORD_HEADER_SIZE + size
                        continue
                self.consumed = k + 1  # taken from the records, whatever happens to it next
                own_ttl = nsqshm_has_expiry(msg, size)
                if own_ttl and now_ns == 0:
                    now_ns = _wall_ns()
                if (expires_before and <int64_t>nsqshm_be64(msg) <= expires_before) or \
                        (own_ttl and nsqshm_expires_at(msg, size) <= now_ns):
                    self.expired += 1  # never delivered: dropped (the ring pop commits it)
                    shrunk = True  # (out ends short of what pass 1 sized)
                    if type(self.expired_out) is bytearray:  # or kept for the dead-letter topic
                        _append_plain(<bytearray>self.expired_out, src + pos, size)
                    if traced:
                        self._dropped(msg, DROP_EXPIRED)
                        dropped += 1
                    pos += RECORD_HEADER_SIZE + size
                    continue
                if sampling and <int>self._draw100() > sample_rate:
                    self.sampled_out += 1
                    if self.log_cursors is not None:  # consumed for this client: finished
                        self.log_cursors.finish_id(msg + MSG_ID_OFFSET)
                    if traced:
                        self._dropped(msg, DROP_SAMPLED)
                        dropped += 1
                    pos += RECORD_HEADER_SIZE + size
                    continue
                _put_u32be(dst, 4 + size)
                _put_u32be(dst + 4, FRAME_TYPE_MESSAGE)
                memcpy(dst + FRAME_HEADER_SIZE, msg, size)
                _bump_attempts(dst + FRAME_HEADER_SIZE)
                # the table keeps the message whole (its deadline goes back
                # with a REQ or timeout); the client gets it without
                r = self._insert(dst + FRAME_HEADER_SIZE, size, client_id, deadline_ns)
                if r == 0:
                    added += 1
                    if self.log_cursors is not None:
                        delivered_run_add(&run, self.log_cursors, msg + MSG_ID_OFFSET)
                elif r == 1:
                    self.duplicates += 1
                else:
                    PyByteArray_Resize(out, dst - PyByteArray_AS_STRING(out))
                    raise MemoryError()
                pos += RECORD_HEADER_SIZE + size
                if own_ttl:  # (the deadline ends the message, after any ext part)
                    size -= NSQSHM_EXPIRY_SIZE
                    _put_u32be(dst, 4 + size)
                    nsqshm_clear_expiry(dst + FRAME_HEADER_SIZE)
                    shrunk = True
                if ext is not None and ext.strip:
                    # the in-flight copy (taken above) keeps the headers; the frame not
                    cut = ext_prefix(<const unsigned char *>dst + FRAME_HEADER_SIZE, size)
                    if cut:
                        memmove(dst + FRAME_HEADER_SIZE + EXT_OFFSET,
                                dst + FRAME_HEADER_SIZE + EXT_OFFSET + cut,
                                size - EXT_OFFSET - cut)
                        size -= <uint32_t>cut
                        _put_u32be(dst, 4 + size)
                if detail >= 0:
                    # after the header and the ext part the frame keeps (none: stripped,
                    # or not an ext topic)
                    cut = MSG_HEADER_SIZE
                    if ext is not None and not ext.strip:
                        cut += ext_prefix(<const unsigned char *>dst + FRAME_HEADER_SIZE, size)
                    memmove(dst + FRAME_HEADER_SIZE + cut + DETAIL_SIZE,
                            dst + FRAME_HEADER_SIZE + cut, size - cut)
                    _put_u64be(dst + FRAME_HEADER_SIZE + cut,
                               self._queue_offset(dst + FRAME_HEADER_SIZE + MSG_ID_OFFSET)
                               if detail_log else 0)
                    _put_u32be(dst + FRAME_HEADER_SIZE + cut + 8, raw_size + <uint32_t>detail)
                    size += DETAIL_SIZE
                    _put_u32be(dst, 4 + size)
                dst += FRAME_HEADER_SIZE + size
            if sampling or expires_before or shrunk or ext is not None:
                PyByteArray_Resize(out, dst - PyByteArray_AS_STRING(out))
        finally:
            if self.log_cursors is not None:
                delivered_run_end(&run, self.log_cursors)
            PyBuffer_Release(&view)
            if dropped:
                self.drop_trace.flush()  # (a failed write is counted by the writer)
        return added

    def deliver_from_ring(self, Ring ring not None, Py_ssize_t max_records, scratch,
                          bytearray out not None, uint64_t client_id, int64_t deadline_ns,
                          int sample_rate=0, ExtView ext=None, int detail=-1,
                          bint detail_log=False, CursorSet seeks=None):
        """Take up to max_records messages from `ring` and deliver() them, as one
        step under the ring's consumer lock: they leave the ring only once
        they are in this table (its arena), so a death at any instant repeats
        messages and never loses one.  `scratch` is a writable buffer that can
        hold a record of the ring's max_record.  Returns (taken, added).
        seeks: a local consumer's guarded cursors (CursorSet.guard_seeks),
        looked at under the ring's lock before anything is taken: a seek
        under way or made since the copies held were taken returns
        (-SEEK_HOLDS or -SEEKS_MOVED, 0) and takes nothing."""
        cdef Py_buffer view
        cdef uint64_t head = 0, nbytes = 0
        cdef Py_ssize_t pos = 0, count = 0
        cdef int state
        added = 0
        PyObject_GetBuffer(scratch, &view, PyBUF_WRITABLE)
        try:
            ring._check()
            ring._check_room(view.len)
            ring._lock_cons()
            try:
                if seeks is not None:
                    state = seeks.seek_state()
                    if state:
                        return -state, 0
                count = ring._gather(<char *>view.buf, view.len, max_records, &pos, &head,
                                     &nbytes)
                if count:
                    added = self.deliver(scratch, count, out, client_id, deadline_ns,
                                         sample_rate, ext, detail, detail_log)
                    if self.consumed < count:  # tag dispatch left the rest in the ring
                        count = ring._gather(<char *>view.buf, view.len, self.consumed, &pos,
                                             &head, &nbytes)
                    if count:
                        ring._commit_pop(head, count, nbytes)
            finally:
                ring._unlock_cons()
        finally:
            PyBuffer_Release(&view)
        if count:
            ring._wake(&ring.hdr.wait_space)
        return count, added

    def seed(self, uint64_t seed):
        """Seed the generator deliver() samples with (tests)."""
        self._rng = seed

    cdef inline uint32_t _draw100(self) noexcept:
        # splitmix64, then a multiply to map 32 bits onto [0, 100)
        cdef uint64_t z
        self._rng += 0x9e3779b97f4a7c15ULL
        z = _mix64(self._rng)
        return <uint32_t>(((z >> 32) * 100) >> 32)

    def next_deadline(self):
        """The earliest deadline, or -1 when empty."""
        return self.heap.nodes[0].deadline if self.heap.length else -1

    def get_deadline(self, msg_id):
        """A message's deadline, or -1 when it is not in flight."""
        cdef MsgEntry *e = self._find(_id_bytes(msg_id))
        return self.heap.nodes[e.heap_index].deadline if e != NULL else -1

    def get_first_deadline(self, msg_id):
        """The deadline a message was given when delivered (before any TOUCH),
        or -1 when it is not in flight."""
        cdef MsgEntry *e = self._find(_id_bytes(msg_id))
        return e.first_deadline if e != NULL else -1

    def client_count(self, uint64_t client_id):
        """How many messages client_id holds."""
        cdef ClientSlot *s = _client_slot(&self.clients, client_id, False)
        return s.count if s != NULL else 0

    def __contains__(self, msg_id):
        return self._find(_id_bytes(msg_id)) != NULL

    def __len__(self):
        return self.ids.count

    @property
    def total_bytes(self):
        """Sum of the sizes of the messages in flight."""
        return self._total_bytes

    @property
    def table_slots(self):
        """Slots in the ID hash table (diagnostics)."""
        return self.ids.mask + 1


# -- DeferredQueue ------------------------------------------------------------------

cdef class DeferredQueue(MessageStore):
    """Messages waiting for a due time (REQ with a delay, DPUB), earliest first."""

    def __cinit__(self, size_t capacity_hint=64):
        self.block_state = NSQSHM_BLOCK_DEFERRED
        if _heap_init(&self.heap, capacity_hint) < 0:
            raise MemoryError()

    cdef int push_raw(self, const char *msg, uint32_t size, int64_t due_ns) except -1:
        """Copy a message (size >= 26, unchecked) in, due at due_ns."""
        self._clock()
        cdef MsgEntry *e = self._new_entry(size)
        if e == NULL:
            raise MemoryError()
        e.client_id = 0
        e.first_deadline = due_ns
        e.hash = _hash_id(msg + MSG_ID_OFFSET)
        e.size = size
        memcpy(_msg(e), msg, size)
        if _heap_push(&self.heap, e, due_ns) < 0:
            self._discard(e)
            raise MemoryError()
        self._commit(e, due_ns)
        self._total_bytes += size
        return 0

    def push(self, msg, int64_t due_ns):
        """Copy msg (a whole encoded message) in, due at due_ns."""
        cdef Py_buffer view
        PyObject_GetBuffer(msg, &view, PyBUF_SIMPLE)
        try:
            if view.len < MSG_HEADER_SIZE:
                raise ValueError(f"message of {view.len} bytes is shorter than its "
                                 f"{MSG_HEADER_SIZE}-byte header")
            if <uint64_t>view.len > MAX_MESSAGE_SIZE:
                raise ValueError(f"message of {view.len} bytes is too large for a frame")
            self.push_raw(<const char *>view.buf, <uint32_t>view.len, due_ns)
        finally:
            PyBuffer_Release(&view)

    def take_retries(self, CursorSet cursors not None, packed, int64_t now_ms,
                     int64_t mono_now_ns, int64_t max_delay_ms):
        """A partition's new leader takes up what the old one had put back
        (LogChannel.take_up_retries): each message of the writable packed [u32
        native size][message] records that its cursor's retry table has
        (CursorSet.retry_of) gets its attempts back, and one deferred past
        now_ms (unix ms) is deferred here, due that much after mono_now_ns (at
        most max_delay_ms: --max-req-timeout; one the arena cannot hold goes
        now).  Returns (the records to deliver now, as packed records; how many
        were deferred; the earliest due, monotonic ns, or -1).  One C loop."""
        cdef Py_buffer view
        cdef char *p
        cdef Py_ssize_t pos = 0, deferred = 0, kept = 0
        cdef uint32_t size, attempts = 0
        cdef int64_t due_ms = 0, due_ns, earliest = -1
        cdef bytearray out
        cdef char *dst
        PyObject_GetBuffer(packed, &view, PyBUF_WRITABLE)
        try:
            out = bytearray(view.len)
            dst = PyByteArray_AS_STRING(out)
            p = <char *>view.buf
            while pos < view.len:
                size = packed_record_size(p, view.len, pos, MSG_HEADER_SIZE)
                if cursors.retry_of(p + pos + 4 + MSG_ID_OFFSET, &attempts, &due_ms):
                    if attempts > 0x7FFF:
                        attempts = 0x7FFF
                    # nsqd's encoding: [8 BE timestamp][2 BE attempts]..., the top bit
                    # the message's own (a time to live: includes/message_expiry.h)
                    p[pos + 12] = <char>((<unsigned char>p[pos + 12] & 0x80) | (attempts >> 8))
                    p[pos + 13] = <char>(attempts & 0xFF)
                    if due_ms > now_ms:
                        due_ns = mono_now_ns + min(due_ms - now_ms, max_delay_ms) * 1000000
                        try:
                            self.push_raw(p + pos + 4, size, due_ns)
                        except MemoryError:
                            pass  # (the arena is full: delivered now)
                        else:
                            if earliest < 0 or due_ns < earliest:
                                earliest = due_ns
                            deferred += 1
                            pos += 4 + size
                            continue
                memcpy(dst + kept, p + pos, 4 + size)
                kept += 4 + size
                pos += 4 + size
        finally:
            PyBuffer_Release(&view)
        PyByteArray_Resize(out, kept)
        return out, deferred, earliest

    def pop_due(self, int64_t now_ns, buffer):
        """Remove messages due by now_ns, earliest first, into the writable
        buffer as packed [u32 native size][message] records; (count, bytes).
        ValueError if the first due cannot fit the buffer."""
        return self._pop_into(now_ns, buffer)

    def drain(self, buffer):
        """pop_due for every message (shutdown); call until it returns (0, 0)."""
        return self._pop_into(INT64_MAX, buffer)

    def next_due(self):
        """The earliest due time, or -1 when empty."""
        return self.heap.nodes[0].deadline if self.heap.length else -1

    def contains(self, msg_id):
        """Whether a message with this ID is deferred (a scan: O(n))."""
        cdef bytes key = _id_bytes(msg_id)
        cdef const char *p = PyBytes_AS_STRING(key)
        cdef uint64_t h = _hash_id(p)
        cdef size_t i
        cdef MsgEntry *e
        for i in range(self.heap.length):
            e = self.heap.nodes[i].entry
            if e.hash == h and memcmp(_msg(e) + MSG_ID_OFFSET, p, MSG_ID_SIZE) == 0:
                return True
        return False

    def __len__(self):
        return self.heap.length

    @property
    def total_bytes(self):
        """Sum of the sizes of the deferred messages."""
        return self._total_bytes



cdef bint _has_id(const char *msg, const char *ids, Py_ssize_t n_ids) noexcept:
    cdef Py_ssize_t k
    for k in range(n_ids):
        if memcmp(msg + MSG_ID_OFFSET, ids + k * MSG_ID_SIZE, MSG_ID_SIZE) == 0:
            return True
    return False


cdef tuple _split_records(buffer, Py_ssize_t nbytes, uint32_t max_attempts, const char *ids,
                          Py_ssize_t n_ids, bytearray out):
    """take_dead (ids NULL: attempts at max_attempts, appended plain) and
    take_ids (those IDs, appended as they are): the records taken go to out,
    the others move up, in order, to the front of the buffer."""
    cdef Py_buffer view
    cdef char *p
    cdef Py_ssize_t pos = 0, kept = 0, n_kept = 0, n_taken = 0, base
    cdef uint32_t size
    cdef bint take
    PyObject_GetBuffer(buffer, &view, PyBUF_WRITABLE)
    try:
        if nbytes < 0 or nbytes > view.len:
            raise ValueError(f"nbytes {nbytes} is outside the {view.len}-byte buffer")
        p = <char *>view.buf
        while pos < nbytes:
            if nbytes - pos < RECORD_HEADER_SIZE:
                raise ValueError(f"a record header runs past byte {nbytes}")
            memcpy(&size, p + pos, RECORD_HEADER_SIZE)
            if size < MSG_HEADER_SIZE or nbytes - pos - RECORD_HEADER_SIZE < <Py_ssize_t>size:
                raise ValueError(f"bad record of {size} bytes at byte {pos}")
            if ids != NULL:
                take = _has_id(p + pos + RECORD_HEADER_SIZE, ids, n_ids)
            else:
                take = max_attempts and \
                    _get_attempts(p + pos + RECORD_HEADER_SIZE) >= max_attempts
            if take and ids == NULL:
                _append_plain(out, p + pos, size)
                n_taken += 1
            elif take:
                base = PyByteArray_GET_SIZE(out)
                PyByteArray_Resize(out, base + RECORD_HEADER_SIZE + size)
                memcpy(PyByteArray_AS_STRING(out) + base, p + pos, RECORD_HEADER_SIZE + size)
                n_taken += 1
            else:
                if kept != pos:
                    memmove(p + kept, p + pos, RECORD_HEADER_SIZE + size)
                kept += RECORD_HEADER_SIZE + size
                n_kept += 1
            pos += RECORD_HEADER_SIZE + size
    finally:
        PyBuffer_Release(&view)
    return n_kept, kept, n_taken


def take_dead(buffer, Py_ssize_t nbytes, uint32_t max_attempts, bytearray dead not None):
    """Max attempts, per batch (policy.py): of the packed [u32 native size]
    [message] records in buffer[:nbytes], those whose attempts reached
    max_attempts are appended to `dead` (packed the same way, without a
    deadline of their own) and the others moved up, in order, to the front
    of the buffer.  Returns (records kept, bytes kept, records taken).  No
    Python object per message."""
    return _split_records(buffer, nbytes, max_attempts, NULL, 0, dead)


def take_ids(buffer, Py_ssize_t nbytes, bytes ids not None, bytearray taken not None):
    """A redrive by ID (policy.py): of the packed [u32 native size][message]
    records in buffer[:nbytes], those whose 16-byte ID is one of `ids` (IDs
    one after another) are appended to `taken` as they are, the others moved
    up, in order, to the front of the buffer.  Returns (records kept, bytes
    kept, records taken).  No Python object per message."""
    if PyBytes_GET_SIZE(ids) % MSG_ID_SIZE:
        raise ValueError(f"ids must be {MSG_ID_SIZE}-byte IDs one after another")
    return _split_records(buffer, nbytes, 0, PyBytes_AS_STRING(ids),
                          PyBytes_GET_SIZE(ids) // MSG_ID_SIZE, taken)


def count_records(buffer, Py_ssize_t nbytes):
    """How many packed [u32 native size][message] records buffer[:nbytes]
    holds (a bounded channel's trim; the caller's records are well formed)."""
    cdef Py_buffer view
    cdef const char *p
    cdef Py_ssize_t pos = 0, n = 0
    cdef uint32_t size
    PyObject_GetBuffer(buffer, &view, PyBUF_SIMPLE)
    try:
        if nbytes < 0 or nbytes > view.len:
            raise ValueError(f"nbytes {nbytes} is outside the {view.len}-byte buffer")
        p = <const char *>view.buf
        while nbytes - pos >= RECORD_HEADER_SIZE:
            memcpy(&size, p + pos, RECORD_HEADER_SIZE)
            pos += RECORD_HEADER_SIZE + size
            n += 1
    finally:
        PyBuffer_Release(&view)
    return n


def reset_attempts(buffer, Py_ssize_t nbytes):
    """Set attempts to 0 in the packed records of buffer[:nbytes] (a redrive
    gives dead letters a fresh count); returns how many records."""
    cdef Py_buffer view
    cdef char *p
    cdef Py_ssize_t pos = 0, n = 0
    cdef uint32_t size
    PyObject_GetBuffer(buffer, &view, PyBUF_WRITABLE)
    try:
        if nbytes < 0 or nbytes > view.len:
            raise ValueError(f"nbytes {nbytes} is outside the {view.len}-byte buffer")
        p = <char *>view.buf
        while nbytes - pos >= RECORD_HEADER_SIZE:
            memcpy(&size, p + pos, RECORD_HEADER_SIZE)
            if size < MSG_HEADER_SIZE or nbytes - pos - RECORD_HEADER_SIZE < <Py_ssize_t>size:
                raise ValueError(f"bad record of {size} bytes at byte {pos}")
            # (a message's own time to live stays: message_expiry.h)
            if nsqshm_has_expiry(p + pos + RECORD_HEADER_SIZE, size):
                p[pos + RECORD_HEADER_SIZE + MSG_ATTEMPTS_OFFSET] = <char>NSQSHM_EXPIRY_BIT
            else:
                p[pos + RECORD_HEADER_SIZE + MSG_ATTEMPTS_OFFSET] = 0
            p[pos + RECORD_HEADER_SIZE + MSG_ATTEMPTS_OFFSET + 1] = 0
            pos += RECORD_HEADER_SIZE + size
            n += 1
    finally:
        PyBuffer_Release(&view)
    return n


cdef int _cmp_int64(const void *a, const void *b) noexcept nogil:
    cdef int64_t x = (<const int64_t *>a)[0], y = (<const int64_t *>b)[0]
    return (x > y) - (x < y)


cdef extern from "<stdlib.h>" nogil:
    void qsort(void *base, size_t n, size_t size, int (*cmp)(const void *, const void *))


def latency_percentiles(tables, int64_t now_ns, int64_t window_ns, quantiles, int points=0):
    """nsqd's e2e_processing_latency over the finishes of the last window in
    `tables` (InFlight objects; a topic passes all its channels', merged as
    nsqd merges their streams): {"count": n, "percentiles": [{quantile, value}]}.
    With points, also "sketch": the values at `points` evenly spaced ranks
    (all of them when fewer), so that workers' windows can be merged."""
    cdef InFlight t
    cdef size_t total = 0, k, i
    cdef int64_t *vals
    cdef int64_t since = now_ns - window_ns
    for t in tables:
        total += t.lat_len
    if total == 0:
        return {"count": 0, "percentiles": [{"quantile": float(q), "value": 0.0}
                                            for q in quantiles]}
    vals = <int64_t *>malloc(total * sizeof(int64_t))
    if vals == NULL:
        raise MemoryError()
    try:
        k = 0
        for t in tables:
            for i in range(t.lat_len):
                if t.lat[2 * i] >= since:
                    vals[k] = t.lat[2 * i + 1]
                    k += 1
        qsort(vals, k, sizeof(int64_t), _cmp_int64)
        out = []
        for q in quantiles:
            if k == 0:
                out.append({"quantile": float(q), "value": 0.0})
                continue
            i = min(k - 1, <size_t>(float(q) * k))
            out.append({"quantile": float(q), "value": float(vals[i])})
        result = {"count": int(k), "percentiles": out}
        if points > 0:
            if k <= <size_t>points:
                result["sketch"] = [float(vals[i]) for i in range(k)]
            else:
                result["sketch"] = [float(vals[min(k - 1, (2 * j + 1) * k // (2 * points))])
                                    for j in range(points)]
        return result
    finally:
        free(vals)
