# cython: freethreading_compatible=False
"""In-flight arenas: the messages a process holds, in POSIX shared memory.

A process that takes messages out of the rings (a broker worker delivering
to its clients, a local consumer, a Spark reader) keeps each one in a block
of its arena until it is finished, so when the process dies another can put
them all back: `blocks()` lists what was held, `release(offset)` frees a
block once its message is stored elsewhere.  The byte layout is drawn in
includes/arena_layout.h.

Only the owner allocates.  Blocks come in power-of-two sizes from 128
bytes, from a free list per size or from the never-used end (bump); a freed
block is reused for its size, never split or merged, so a scan by capacity
always lands on block headers.  The segment is sparse: it costs the pages
its blocks touch.  When it is full, blocks are malloc'd (counted in
`fallbacks`): delivery goes on, without the crash guarantee for those.
"""

import io
import os

from nsqshm._core import segment

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytearray cimport PyByteArray_AS_STRING
from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.stdint cimport int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, realloc

from nsqshm._core.includes.system cimport *

DEFAULT_SIZE = 1 << 30          # 1 GiB of address space; pages only as used
DEFAULT_MAX_QUEUES = 4096
FREE = 0
LIVE = 1
DEFERRED = 2
NAME_MAX_LEN = 200


class ArenaError(Exception):
    pass


cdef extern from "<string.h>" nogil:
    size_t strnlen(const char *s, size_t maxlen)


cdef inline uint64_t _now_wall() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_REALTIME, &ts)
    return <uint64_t>ts.tv_sec * 1000000000 + <uint64_t>ts.tv_nsec


cdef inline int _class_of(uint64_t need) noexcept nogil:
    cdef int c = 7                  # 128 bytes, NSQSHM_ARENA_MIN_BLOCK
    while (<uint64_t>1 << c) < need:
        c += 1
    return c


def validate_name(str name):
    if not 0 < len(name) <= NAME_MAX_LEN or name[0] in ".-" or not all(
            ch.isascii() and (ch.isalnum() or ch in "_.:#-") for ch in name):
        raise ValueError(f"invalid arena name {name!r}: 1-{NAME_MAX_LEN} characters of "
                         "[A-Za-z0-9_.:#-], not starting with '.' or '-'")


def process_start(int pid):
    """A process's start time in clock ticks since boot (/proc/<pid>/stat
    field 22), so a recycled pid is not taken for the owner; 0 if gone (or
    a zombie)."""
    try:
        with io.open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return 0
    # the command name (field 2) may hold spaces and parentheses: split after its last ')'
    fields = stat[stat.rindex(b")") + 2:].split()
    if fields[0] in (b"Z", b"X"):  # exited, not yet reaped: its messages are ours to recover
        return 0
    return int(fields[19])


cdef class Arena:
    """One process's in-flight arena (see the module docstring)."""

    def __cinit__(self):
        self.hdr = NULL
        self.base = NULL
        self.map_size = 0
        self._queues = {}
        self._free_queues = []
        self._scanned = 0
        self.fallbacks = 0
        for i in range(32):
            self.free_lists[i].offsets = NULL
            self.free_lists[i].length = 0
            self.free_lists[i].capacity = 0

    def __init__(self):
        raise TypeError("use Arena.create(name, ...) or Arena.attach(name)")

    @staticmethod
    def create(str name, size=DEFAULT_SIZE, max_queues=DEFAULT_MAX_QUEUES, owner_pid=None,
               str label=""):
        """Create the segment `name` (mode 0600) owned by owner_pid (this process)."""
        validate_name(name)
        data_offset = NSQSHM_ARENA_HEADER_SIZE + max_queues * NSQSHM_ARENA_QUEUE_ENTRY
        if not 0 < max_queues <= 1 << 20 or size < data_offset + NSQSHM_ARENA_MIN_BLOCK:
            raise ValueError(f"arena of {size} bytes cannot hold {max_queues} queues and a block")
        # made unnamed and named once whole (segment.py): an attacher never
        # finds a header half written
        fd = segment.create(size)
        cdef Arena self = Arena.__new__(Arena)
        try:
            self._map(name, fd, size)
            pid = os.getpid() if owner_pid is None else owner_pid
            h = self.hdr
            h.version = NSQSHM_ARENA_VERSION
            h.header_size = NSQSHM_ARENA_HEADER_SIZE
            h.total_size = size
            h.data_offset = data_offset
            h.max_queues = max_queues
            h.n_queues = 0
            h.owner_pid = pid
            h.owner_start = process_start(pid)
            h.created_ns = _now_wall()
            h.bump = data_offset
            h.flags = NSQSHM_ARENA_ORDERED_LANES
            self.label = label
            nsqshm_store_release(&h.magic, NSQSHM_ARENA_MAGIC)
            segment.publish(fd, name)
        except BaseException:
            self.close()
            raise
        finally:
            segment.discard(fd)
        return self

    @staticmethod
    def attach(str name):
        """Attach to an existing arena (to recover it, or to read its client)."""
        validate_name(name)
        fd, size = segment.attach(name, ArenaError)
        cdef Arena self = Arena.__new__(Arena)
        try:
            if size < NSQSHM_ARENA_HEADER_SIZE:
                raise ArenaError(f"segment {name!r} is {size} bytes, smaller than a header")
            self._map(name, fd, size)
        finally:
            os.close(fd)
        h = self.hdr
        if nsqshm_load_acquire(&h.magic) != NSQSHM_ARENA_MAGIC:
            self.close()
            raise ArenaError(f"segment {name!r} is not an arena")
        if h.version != NSQSHM_ARENA_VERSION or h.total_size != size or \
                h.header_size != NSQSHM_ARENA_HEADER_SIZE or \
                h.data_offset > h.total_size or h.bump > h.total_size or \
                h.data_offset < NSQSHM_ARENA_HEADER_SIZE + \
                <uint64_t>h.max_queues * NSQSHM_ARENA_QUEUE_ENTRY or h.n_queues > h.max_queues:
            self.close()
            raise ArenaError(f"arena {name!r}: version {h.version} or geometry does not match")
        return self

    @staticmethod
    def unlink_segment(str name):
        validate_name(name)
        return segment.unlink(name)

    @staticmethod
    def list(str prefix):
        """Names of the arenas in /dev/shm whose names start with prefix."""
        try:
            return sorted(n for n in os.listdir("/dev/shm") if n.startswith(prefix))
        except FileNotFoundError:
            return []

    def unlink(self):
        return Arena.unlink_segment(self.name)

    def _map(self, str name, int fd, size_t size):
        cdef void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
        if p == MAP_FAILED:
            raise OSError(errno, os.strerror(errno))
        self.name = name
        self.base = <char *>p
        self.hdr = <nsqshm_arena_header *>p
        self.map_size = size

    cdef int _check(self) except -1:
        if self.hdr == NULL:
            raise ArenaError("arena is closed")
        return 0

    def close(self):
        if self.hdr != NULL:
            munmap(<void *>self.hdr, self.map_size)
            self.hdr = NULL
            self.base = NULL
        for i in range(32):
            free(self.free_lists[i].offsets)
            self.free_lists[i].offsets = NULL
            self.free_lists[i].length = self.free_lists[i].capacity = 0

    def __dealloc__(self):
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- ownership ----------------------------------------------------------------------

    @property
    def owner_pid(self):
        self._check()
        return self.hdr.owner_pid

    def set_owner(self, int pid):
        """Hand the arena to another process (a Spark driver for its readers' batches)."""
        self._check()
        self.hdr.owner_start = process_start(pid)
        self.hdr.owner_pid = pid

    def owner_alive(self):
        """True while the process that owns the arena runs (the same process:
        a recycled pid has another start time)."""
        self._check()
        start = process_start(self.hdr.owner_pid)
        return start != 0 and (self.hdr.owner_start == 0 or start == self.hdr.owner_start)

    @property
    def label(self):
        self._check()
        return self.hdr.label[:strnlen(self.hdr.label, 64)].decode("utf-8", "replace")

    @label.setter
    def label(self, str value):
        self._check()
        raw = value.encode()[:63]
        memset(self.hdr.label, 0, 64)
        memcpy(self.hdr.label, <const char *>raw, len(raw))

    # -- the queue table ------------------------------------------------------------------

    def queue_index(self, str queue):
        """The index of `queue` ("topic:channel") in the table, added if new (owner)."""
        cdef uint32_t n, slot
        cdef char *entry
        self._check()
        idx = self._queues.get(queue)
        if idx is not None:
            return idx
        raw = queue.encode()
        if not 0 < len(raw) <= NSQSHM_ARENA_QUEUE_NAME_MAX:
            raise ValueError(f"queue name {queue!r} is empty or too long")
        n = nsqshm_load32_acquire(&self.hdr.n_queues)
        for i in range(self._scanned, n):  # entries another handle of the owner's added
            name = self.queue_name(i)
            if name:
                self._queues.setdefault(name, i)
        self._scanned = n
        idx = self._queues.get(queue)
        if idx is not None:
            return idx
        if self._free_queues:  # a forgotten queue's entry: name first, its length last
            slot = self._free_queues.pop()
            entry = self.base + NSQSHM_ARENA_HEADER_SIZE + slot * NSQSHM_ARENA_QUEUE_ENTRY
            memset(entry + NSQSHM_ARENA_QUEUE_LANES_AT, 0, 32)  # (the forgotten queue's)
            memcpy(entry + 2, <const char *>raw, len(raw))
            entry[1] = <char>(len(raw) >> 8)
            entry[0] = <char>(len(raw) & 0xFF)
            self._queues[queue] = slot
            return slot
        if n >= self.hdr.max_queues:
            raise ArenaError(f"arena {self.name!r}: queue table full ({n} queues)")
        entry = self.base + NSQSHM_ARENA_HEADER_SIZE + n * NSQSHM_ARENA_QUEUE_ENTRY
        entry[0] = <char>(len(raw) & 0xFF)
        entry[1] = <char>(len(raw) >> 8)
        memcpy(entry + 2, <const char *>raw, len(raw))
        nsqshm_store32_release(&self.hdr.n_queues, n + 1)
        self._scanned = n + 1
        self._queues[queue] = n
        return n

    def find_queue(self, str queue):
        """The index of `queue` in the table, or -1: read only (any process)."""
        cdef uint32_t i, n
        self._check()
        n = nsqshm_load32_acquire(&self.hdr.n_queues)
        for i in range(n):
            if self.queue_name(i) == queue:
                return i
        return -1

    def forget_queue(self, str queue):
        """Free the entry of `queue`, deleted and holding no block here, for a
        later queue to reuse: deleted topics and channels (ephemeral ones
        come and go) never fill the table.  Its name reads "" until reused."""
        cdef char *entry
        self._check()
        idx = self._queues.pop(queue, None)
        if idx is None:
            return
        entry = self.base + NSQSHM_ARENA_HEADER_SIZE + <uint32_t>idx * NSQSHM_ARENA_QUEUE_ENTRY
        entry[0] = 0
        entry[1] = 0
        self._free_queues.append(idx)

    def queue_name(self, uint32_t idx):
        self._check()
        if idx >= nsqshm_load32_acquire(&self.hdr.n_queues):
            raise IndexError(f"queue {idx} is not in arena {self.name!r}")
        cdef const unsigned char *entry = <const unsigned char *>(
            self.base + NSQSHM_ARENA_HEADER_SIZE + idx * NSQSHM_ARENA_QUEUE_ENTRY)
        cdef uint32_t n = entry[0] | (<uint32_t>entry[1] << 8)
        if n > NSQSHM_ARENA_QUEUE_NAME_MAX:
            raise ArenaError(f"arena {self.name!r}: queue {idx} has a bad name length")
        return (<const char *>entry + 2)[:n].decode("utf-8", "replace")

    # -- blocks (the C side, for InFlight and DeferredQueue) --------------------------------

    cdef nsqshm_arena_block *alloc(self, uint32_t msg_size) noexcept:
        cdef uint64_t need = sizeof(nsqshm_arena_block) + <uint64_t>msg_size
        cdef int c = _class_of(need)
        cdef FreeList *fl = &self.free_lists[c]
        cdef uint64_t off, cap = <uint64_t>1 << c
        cdef nsqshm_arena_block *b
        if self.hdr == NULL or c >= 32:
            return NULL
        if fl.length:
            fl.length -= 1
            return <nsqshm_arena_block *>(self.base + fl.offsets[fl.length])
        off = self.hdr.bump
        if off + cap > self.hdr.total_size:
            return NULL
        b = <nsqshm_arena_block *>(self.base + off)
        b.capacity = <uint32_t>cap
        b.state = NSQSHM_BLOCK_FREE
        nsqshm_store_release(&self.hdr.bump, off + cap)
        return b

    cdef void commit(self, nsqshm_arena_block *b, uint32_t queue, uint32_t state,
                     int64_t due_wall_ns) noexcept:
        """The block's message is written: make it count (state last)."""
        b.queue = queue
        b.due_ns = due_wall_ns
        self.hdr.live_blocks += 1
        self.hdr.live_bytes += b.entry.size
        nsqshm_store32_release(&b.state, state)

    cdef void release_block(self, nsqshm_arena_block *b) noexcept:
        cdef int c = _class_of(b.capacity)
        cdef FreeList *fl = &self.free_lists[c]
        cdef uint64_t *grown
        cdef size_t cap
        if nsqshm_load32_acquire(&b.state) != NSQSHM_BLOCK_FREE:
            self.hdr.live_blocks -= 1
            self.hdr.live_bytes -= b.entry.size
            nsqshm_store32_release(&b.state, NSQSHM_BLOCK_FREE)
        if fl.length == fl.capacity:
            cap = fl.capacity * 2 if fl.capacity else 64
            grown = <uint64_t *>realloc(fl.offsets, cap * sizeof(uint64_t))
            if grown == NULL:
                return  # the block stays FREE and unused: a leak of space, not of messages
            fl.offsets = grown
            fl.capacity = cap
        fl.offsets[fl.length] = <uint64_t>(<char *>b - self.base)
        fl.length += 1

    # -- recovery (any process) -------------------------------------------------------------

    def blocks(self, long long queue=-1, int64_t deferred_after=-1):
        """The messages held: a list of (offset, queue name, state, due_ns, message)
        for every LIVE or DEFERRED block, in address order; of one queue (its
        index; -1: every queue); with deferred_after >= 0, only the DEFERRED
        blocks due after it (wall ns)."""
        self._check()
        cdef uint64_t off = self.hdr.data_offset
        cdef uint64_t end = nsqshm_load_acquire(&self.hdr.bump)
        cdef nsqshm_arena_block *b
        cdef uint32_t state, size
        out = []
        names = {}
        while off + sizeof(nsqshm_arena_block) <= end:
            b = self._block(off, end)
            state = nsqshm_load32_acquire(&b.state)
            if (state == NSQSHM_BLOCK_LIVE and deferred_after < 0 or
                    state == NSQSHM_BLOCK_DEFERRED and
                    (deferred_after < 0 or b.due_ns > deferred_after)) and \
                    (queue < 0 or b.queue == <uint64_t>queue):
                size = b.entry.size
                if size > b.capacity - sizeof(nsqshm_arena_block):
                    raise ArenaError(f"arena {self.name!r}: block at {off} holds {size} bytes")
                q = names.get(b.queue)
                if q is None:
                    q = names[b.queue] = self.queue_name(b.queue)
                out.append((off, q, state, b.due_ns,
                            PyBytes_FromStringAndSize(<char *>b + sizeof(nsqshm_arena_block),
                                                      size)))
            off += b.capacity
        return out

    cdef nsqshm_arena_block *_block(self, uint64_t off, uint64_t end) except NULL:
        """The block at `off`, its capacity checked (a power of two >= 128 that
        ends by `end`, the bump)."""
        cdef nsqshm_arena_block *b = <nsqshm_arena_block *>(self.base + off)
        if b.capacity < NSQSHM_ARENA_MIN_BLOCK or (b.capacity & (b.capacity - 1)) or \
                off + b.capacity > end:
            raise ArenaError(f"arena {self.name!r}: bad block at offset {off}")
        return b

    def blocks_by_queue(self):
        """{queue index: native u64 offsets of its LIVE and DEFERRED blocks, in
        address order}: three C walks (the highest index, the counts, the
        offsets), an object per queue, not per message
        (the recovery takes a queue at a time: localbatch.arena_gather's
        `blocks`)."""
        self._check()
        cdef uint64_t off, end = nsqshm_load_acquire(&self.hdr.bump)
        cdef nsqshm_arena_block *b
        cdef uint32_t state, q, top = 0
        cdef Py_ssize_t *counts = NULL
        cdef Py_ssize_t *filled = NULL
        cdef uint64_t **fill = NULL
        cdef int walk
        out = {}
        try:
            for walk in range(3):  # the highest index, the counts, the offsets
                off = self.hdr.data_offset
                while off + sizeof(nsqshm_arena_block) <= end:
                    b = self._block(off, end)
                    state = nsqshm_load32_acquire(&b.state)
                    if state == NSQSHM_BLOCK_LIVE or state == NSQSHM_BLOCK_DEFERRED:
                        q = b.queue
                        if walk == 0:
                            if q >= top:
                                top = q + 1
                        elif walk == 1:
                            if q < top:
                                counts[q] += 1
                        elif q < top and filled[q] < counts[q]:
                            fill[q][filled[q]] = off
                            filled[q] += 1
                    off += b.capacity
                if walk == 0:
                    counts = <Py_ssize_t *>calloc(top + 1, sizeof(Py_ssize_t))
                    filled = <Py_ssize_t *>calloc(top + 1, sizeof(Py_ssize_t))
                    fill = <uint64_t **>calloc(top + 1, sizeof(uint64_t *))
                    if counts == NULL or filled == NULL or fill == NULL:
                        raise MemoryError()
                elif walk == 1:
                    for q in range(top):
                        if counts[q]:
                            offsets = bytearray(8 * counts[q])
                            fill[q] = <uint64_t *>PyByteArray_AS_STRING(offsets)
                            out[q] = offsets
            for q, offsets in out.items():  # (blocks freed between the walks: not there)
                del offsets[8 * filled[<uint32_t>q]:]
            return {q: offsets for q, offsets in out.items() if offsets}
        finally:
            free(counts)
            free(filled)
            free(fill)

    def release(self, uint64_t offset):
        """Free the block at `offset` once its message is stored elsewhere:
        True if this call freed it (a compare-and-swap, so two recoverers
        cannot both count it)."""
        self._check()
        return self._release_at(offset) == 1

    def release_many(self, offsets, Py_ssize_t start=0, Py_ssize_t count=-1):
        """release() the blocks at `count` (-1: all from `start`) of the native
        u64 offsets in the buffer `offsets` from index `start`, in one C loop;
        how many this call freed.  ValueError, before any is freed, for an
        offset outside the blocks or a range outside the buffer."""
        cdef Py_buffer view
        cdef const uint64_t *offs
        cdef Py_ssize_t n, i, freed = 0
        self._check()
        PyObject_GetBuffer(offsets, &view, PyBUF_SIMPLE)
        try:
            n = view.len // 8
            if count < 0:
                count = n - start
            if view.len % 8 or start < 0 or start + count > n:
                raise ValueError(f"offsets [{start}, {start} + {count}) outside a buffer of "
                                 f"{view.len} bytes")
            offs = <const uint64_t *>view.buf
            for i in range(start, start + count):
                self._check_block_offset(offs[i])
            for i in range(start, start + count):
                freed += self._release_at(offs[i])
        finally:
            PyBuffer_Release(&view)
        return freed

    cdef int _check_block_offset(self, uint64_t offset) except -1:
        """ValueError unless a block may start at `offset`: within the blocks
        (no wrap-around), on the 128-byte grid every block starts on."""
        if offset < self.hdr.data_offset or self.hdr.bump < sizeof(nsqshm_arena_block) or \
                offset > self.hdr.bump - sizeof(nsqshm_arena_block) or \
                (offset - self.hdr.data_offset) % NSQSHM_ARENA_MIN_BLOCK:
            raise ValueError(f"offset {offset} is outside arena {self.name!r}'s blocks")
        return 0

    cdef int _release_at(self, uint64_t offset) except -1:
        """release()'s step: 1 if this call freed the block, 0 if it was free."""
        self._check_block_offset(offset)
        cdef nsqshm_arena_block *b = <nsqshm_arena_block *>(self.base + offset)
        cdef uint32_t state = nsqshm_load32_acquire(&b.state)
        if state == NSQSHM_BLOCK_FREE:
            return 0
        if not nsqshm_cas32(&b.state, state, NSQSHM_BLOCK_FREE):
            return 0
        nsqshm_fetch_add(&self.hdr.live_blocks, <uint64_t>-1)
        nsqshm_fetch_add(&self.hdr.live_bytes, -<uint64_t>b.entry.size)
        return 1

    # -- figures -----------------------------------------------------------------------------

    @property
    def live_blocks(self):
        self._check()
        return self.hdr.live_blocks

    @property
    def live_bytes(self):
        self._check()
        return self.hdr.live_bytes

    @property
    def used_bytes(self):
        """Bytes of blocks ever allocated (the pages the arena touched)."""
        self._check()
        return self.hdr.bump - self.hdr.data_offset

    @property
    def size(self):
        self._check()
        return self.hdr.total_size

    # -- a local client's description (nsqshm.local; read by the broker's /stats) ---------

    _CLIENT_COUNTERS = ("connect_ts", "message_count", "finish_count", "requeue_count",
                        "in_flight")

    def client_info(self):
        self._check()
        c = &self.hdr.client
        return {
            "connect_ts": c.connect_ts, "message_count": c.message_count,
            "finish_count": c.finish_count, "requeue_count": c.requeue_count,
            "in_flight": c.in_flight, "ready_count": c.ready_count,
            "queue": self.queue_name(c.queue) if c.queue < self.hdr.n_queues else None,
            "client_id": c.client_id[:strnlen(c.client_id, 64)].decode("utf-8", "replace"),
            "hostname": c.hostname[:strnlen(c.hostname, 64)].decode("utf-8", "replace"),
            "user_agent": c.user_agent[:strnlen(c.user_agent, 64)].decode("utf-8", "replace"),
        }

    def set_client_info(self, **fields):
        """Set fields of the client description (names as client_info's)."""
        cdef char *dst
        cdef nsqshm_arena_client *c
        self._check()
        c = &self.hdr.client
        for key, value in fields.items():
            if key == "connect_ts":
                c.connect_ts = value
            elif key == "message_count":
                c.message_count = value
            elif key == "finish_count":
                c.finish_count = value
            elif key == "requeue_count":
                c.requeue_count = value
            elif key == "in_flight":
                c.in_flight = value
            elif key == "ready_count":
                c.ready_count = value
            elif key == "queue":
                c.queue = 0xFFFFFFFF if value is None else self.queue_index(value)
            elif key in ("client_id", "hostname", "user_agent"):
                raw = str(value).encode()[:63]
                if key == "client_id":
                    dst = &c.client_id[0]
                elif key == "hostname":
                    dst = &c.hostname[0]
                else:
                    dst = &c.user_agent[0]
                memset(dst, 0, 64)
                memcpy(dst, <const char *>raw, len(raw))
            else:
                raise KeyError(key)

    def mark_ordered_lanes(self, partitions):
        """Note that the client attached these partitions' ordered lanes (and
        dropped what it held of them from before their move into them):
        whatever it holds of them from now on came from those lanes.  Only
        the owner writes; the broker reads it once the owner is dead."""
        self._check()
        _set_bits(&self.hdr.client.ordered_lanes[0], partitions)

    def ordered_lanes(self):
        """The partitions whose ordered lanes the client attached
        (mark_ordered_lanes), or None for an arena made by a build that did
        not keep them."""
        self._check()
        if not self.hdr.flags & NSQSHM_ARENA_ORDERED_LANES:
            return None
        return _bits_set(&self.hdr.client.ordered_lanes[0])

    def keep_queue_lanes(self):
        """The owner (a broker worker, whose arena holds every channel's
        messages) keeps a lanes bitmap per queue from now on
        (set_queue_lanes): queue_lanes answers them, not None."""
        self._check()
        self.hdr.flags = self.hdr.flags | NSQSHM_ARENA_QUEUE_LANES

    def set_queue_lanes(self, uint32_t idx, partitions):
        """mark_ordered_lanes for one queue (a channel) of a broker worker's
        arena, as a whole: the partitions whose ordered lanes of that channel
        it has attached, each after it dropped what it held of the partition
        from before its move (the others' bits go: a lane gone and made again
        is a new move)."""
        cdef uint8_t bits[32]
        self._check()
        if idx >= nsqshm_load32_acquire(&self.hdr.n_queues):
            raise IndexError(f"queue {idx} is not in arena {self.name!r}")
        memset(bits, 0, 32)
        _set_bits(bits, partitions)
        memcpy(self.base + NSQSHM_ARENA_HEADER_SIZE + idx * NSQSHM_ARENA_QUEUE_ENTRY
               + NSQSHM_ARENA_QUEUE_LANES_AT, bits, 32)

    def queue_lanes(self, uint32_t idx):
        """The partitions of queue `idx` as set_queue_lanes set them, or None
        for an arena that does not keep them (keep_queue_lanes: a local
        client's, a Spark reader's, an older build's)."""
        self._check()
        if not self.hdr.flags & NSQSHM_ARENA_QUEUE_LANES:
            return None
        if idx >= nsqshm_load32_acquire(&self.hdr.n_queues):
            raise IndexError(f"queue {idx} is not in arena {self.name!r}")
        return _bits_set(<const uint8_t *>self.base + NSQSHM_ARENA_HEADER_SIZE
                         + idx * NSQSHM_ARENA_QUEUE_ENTRY + NSQSHM_ARENA_QUEUE_LANES_AT)


cdef _set_bits(uint8_t *bits, partitions):
    """Set bit p of a 256-bit map (byte p / 8, bit p % 8) for each partition;
    ValueError, with nothing set, for one out of range."""
    cdef int p
    partitions = list(partitions)
    for p in partitions:
        if not 0 <= p < 256:
            raise ValueError(f"partition {p} out of range 0..255")
    for p in partitions:
        bits[p >> 3] = bits[p >> 3] | <uint8_t>(1 << (p & 7))


cdef frozenset _bits_set(const uint8_t *bits):
    cdef int p
    return frozenset([p for p in range(256) if bits[p >> 3] & (1 << (p & 7))])


cdef nsqshm_arena_block *block_alloc(Arena arena, uint32_t msg_size) noexcept:
    cdef nsqshm_arena_block *b = NULL
    if arena is not None:
        b = arena.alloc(msg_size)
        if b != NULL:
            return b
        arena.fallbacks += 1
    b = <nsqshm_arena_block *>malloc(sizeof(nsqshm_arena_block) + msg_size)
    if b != NULL:
        b.capacity = 0
        b.state = NSQSHM_BLOCK_FREE
    return b


cdef void block_free(Arena arena, nsqshm_arena_block *b) noexcept:
    if b.capacity == 0:
        free(b)
    elif arena is not None:
        arena.release_block(b)
