# cython: freethreading_compatible=False
"""A multi-producer, multi-consumer ring of variable-length records in POSIX
shared memory, usable from any process on the host.

The byte layout is drawn in includes/ring_layout.h.  In short: producers
serialise on one robust process-shared mutex and consumers on another, so a
producer and a consumer never wait for each other; each side copies a whole
batch under its lock and publishes it with one release store of tail (or
head), the commit point.  A record is visible to consumers only once that
store happened.

Death of a process at any instant:

* The mutexes are robust: if a holder dies the next process to lock gets
  EOWNERDEAD, re-applies the side's redo journal (see the header) and marks
  the lock consistent.  The ring is never left locked or corrupt.
* push: a producer killed before its commit store leaves nothing (the
  partial bytes past tail are overwritten later); killed after it, every
  record of the batch is in the ring exactly once.  The producer had no
  acknowledgement in the first case and may lack one in the second, so a
  caller that retries on no acknowledgement can produce a duplicate, never
  a loss.
* pop: a consumer killed before its commit store leaves every record in the
  ring, to be popped by another consumer; killed after it, the records of
  that batch were copied into the dead process's buffer and are gone from
  the ring.  That is the one window of loss at this level, and it is the
  caller's to close: the broker keeps popped messages in an in-flight table
  in shared memory before it sends them, so they are put back.
* A waiter killed while asleep leaves a stale slot; the next waker whose
  write finds no reader frees it.

Waiting burns no CPU: a waiter claims one of 64 slots and a FIFO under
/dev/shm, sets its bit in wait_data (or wait_space), re-checks the ring and
sleeps in poll() (or gevent's hub) on the FIFO.  A producer, after its commit
and a full fence, reads wait_data; if a bit is set it swaps the mask to zero
and writes one byte to each such FIFO.  The fence pair makes a lost wake-up
impossible.
"""

import os
import re
import stat
import struct

import posix_ipc

from nsqshm._core import segment

from cpython.buffer cimport PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport int64_t, uint32_t, uint64_t

from nsqshm._core.includes.system cimport *

OK = 0
FULL = -1
EMPTY = -2
TOO_BIG = -3

DEFAULT_CAPACITY = 1 << 24
HEADER_SIZE = NSQSHM_RING_HEADER_SIZE
RECORD_OVERHEAD = NSQSHM_RECORD_HEADER
LAYOUT_VERSION = NSQSHM_RING_VERSION
MAX_WAITERS = NSQSHM_RING_WAITERS
# added to a channel ring's subscriber count by the worker deleting the
# channel (nsqd/channel.py _delete_if_unused): a subscriber that then adds 1
# sees a count this high and does not subscribe
SUBSCRIBERS_RETIRED = 1 << 40
# a file name is at most 255 bytes and a waiter FIFO adds 21 to the ring's
# ("<prefix>.c.<topic>:<channel>" is up to 152 + the prefix with nsqd's names)
NAME_MAX_LEN = 234
# a waiter FIFO: "<ring name>.w<slot, 2 digits>-<value, 16 hex digits>"
_FIFO_NAME = re.compile(r".+\.w[0-9]{2}-[0-9a-f]{16}")  # (21 characters after the name)


def _waiter_fifos(str name, int fd):
    """The paths of ring `name`'s waiter FIFOs.

    Every FIFO is named after a waiter slot's value (_fifo_path), and a slot
    keeps its value until its FIFO is gone (close and _reap_slot unlink
    before they free the slot), so the header names them all: a broker
    removing thousands of rings reads 512 bytes each, not /dev/shm whole
    each time.  A segment that is not a ring (fd -1: not a file; too small;
    another magic) is looked for in the directory."""
    cdef bytes head = b""
    if fd >= 0:
        try:
            head = os.pread(fd, 512 + 8 * NSQSHM_RING_WAITERS, 0)
        except OSError:
            head = b""
    if len(head) == 512 + 8 * NSQSHM_RING_WAITERS and head[:8] == b"nsqshmRG":
        return [f"/dev/shm/{name}.w{s:02d}-{v:016x}"
                for s, v in enumerate(struct.unpack_from(f"<{NSQSHM_RING_WAITERS}Q", head, 512))
                if v]
    # only this ring's FIFOs (_fifo_path: "<name>.wNN-<16 hex>", and FIFOs):
    # "<name>.w" alone also starts other rings' names -- topic "a.w" beside
    # topic "a", channel "c.wx" beside "c" -- and their segments and FIFOs
    prefix = f"{name}.w"
    try:
        return [f"/dev/shm/{entry}" for entry in os.listdir("/dev/shm")
                if entry.startswith(prefix) and len(entry) == len(name) + 21
                and _FIFO_NAME.fullmatch(entry)]
    except FileNotFoundError:
        return []


cdef int _FULL = -1
cdef object _sleeper = None


def set_sleeper(fn):
    """Install how blocking calls sleep: fn(fd, timeout_or_None) returns
    when fd is readable or the time is up.  None (the default) sleeps in
    poll() with the GIL released; nsqshm.ring.use_gevent() installs gevent's
    wait_read so a blocked call yields to other greenlets."""
    global _sleeper
    _sleeper = fn


cdef bint _blocked(object r):
    if r is None or r == -1 or r == -2:
        return True
    if isinstance(r, list):
        return not r
    if isinstance(r, tuple):
        return r[0] == 0
    return False
cdef int _EMPTY = -2
cdef int _TOO_BIG = -3


class RingError(Exception):
    """A ring cannot be used: bad segment, corrupt record, no waiter slot."""


class RingLayoutError(RingError):
    """The segment is not a ring of this build: magic, size or ABI differ."""


class RingVersionError(RingLayoutError):
    """The segment is a ring of another layout version."""


class RingCorruptError(RingError):
    """A record header in the data area is impossible."""


class RingRetired(RingError):
    """push_packed: the broker drains the ring a last time and removes it (it
    stops): nothing was pushed; push into the ring the next broker makes."""


cdef inline uint64_t _align8(uint64_t n) noexcept nogil:
    return (n + 7) & ~(<uint64_t>7)


cdef inline uint32_t _bswap32(uint32_t v) noexcept nogil:
    return ((v & 0xFF) << 24) | ((v & 0xFF00) << 8) | ((v >> 8) & 0xFF00) | (v >> 24)


cdef inline uint64_t _now_ns(int clock) noexcept nogil:
    cdef timespec ts
    clock_gettime(clock, &ts)
    return <uint64_t>ts.tv_sec * 1000000000 + <uint64_t>ts.tv_nsec


# getpid() is a system call (glibc no longer caches it) and the waiter
# checks asked for it several times per message; this copy is reset in a
# forked child.
cdef int _pid = 0


cdef inline int _my_pid() noexcept:
    global _pid
    if _pid == 0:
        _pid = getpid()
    return _pid


def _forget_pid():
    global _pid
    _pid = 0


os.register_at_fork(after_in_child=_forget_pid)


cdef bint _valid_name(str name):
    if not 0 < len(name) <= NAME_MAX_LEN or name[0] in ".-":
        return False
    for ch in name:
        if not (ch.isascii() and (ch.isalnum() or ch in "_.:#-")):
            return False
    return True


def validate_name(str name):
    """Raise ValueError unless `name` is a safe segment name: 1-234 of
    [A-Za-z0-9_.:#-], not starting with '.' or '-'."""
    if not _valid_name(name):
        raise ValueError(f"invalid ring name {name!r}: 1-{NAME_MAX_LEN} characters of "
                         "[A-Za-z0-9_.:#-], not starting with '.' or '-'")


def _round_capacity(capacity):
    if capacity < 4096:
        capacity = 4096
    cap = 1
    while cap < capacity:
        cap <<= 1
    if cap > (1 << 40):
        raise ValueError(f"ring capacity {capacity} exceeds 1 TiB")
    return cap


cdef class Ring:
    """A handle on a shared-memory ring.  Use Ring.create or Ring.attach.

    close() unmaps and frees this handle's waiter slot; it never removes the
    segment.  unlink() removes the segment's name (and its waiter FIFOs);
    processes that have it mapped keep using it until they close.  The
    broker that created a ring unlinks it on graceful shutdown; clients and
    forked workers never do, so their exit cannot damage the broker.
    """

    def __cinit__(self):
        self.hdr = NULL
        self.data = NULL
        self.slot = -1
        self.slot_pid = 0
        self.wait_fd = -1
        for i in range(NSQSHM_RING_WAITERS):
            self.wake_fds[i] = -1
            self.wake_vals[i] = 0

    def __init__(self):
        raise TypeError("use Ring.create(name, capacity, max_record) or Ring.attach(name)")

    # -- creation and attachment -------------------------------------------------

    @staticmethod
    def create(str name, capacity=DEFAULT_CAPACITY, max_record=None, exist_ok=False):
        """Create the segment `name` (mode 0600) and return a handle on it.

        capacity is rounded up to a power of two (at least 4096 bytes);
        max_record defaults to, and may not exceed, capacity // 2 - 8.  With
        exist_ok a ring already there is attached instead.
        """
        validate_name(name)
        cap = _round_capacity(int(capacity))
        limit = cap // 2 - NSQSHM_RECORD_HEADER
        if max_record is None:
            max_record = limit
        if not 0 < max_record <= limit:
            raise ValueError(f"max_record {max_record} must be in 1..{limit} for capacity {cap}")
        total = NSQSHM_RING_HEADER_SIZE + cap
        cdef Ring self
        while True:
            if exist_ok:
                try:
                    return Ring.attach(name)
                except posix_ipc.ExistentialError:
                    pass
            # made unnamed and named once whole (segment.py): no process ever
            # attaches to a ring without its header
            fd = segment.create(total)
            self = Ring.__new__(Ring)
            try:
                self._map(name, fd, total)
                self._init_header(cap, max_record)
                segment.publish(fd, name)
            except posix_ipc.ExistentialError:
                self._unmap()
                if exist_ok:
                    # another process published it first -- and may have
                    # removed it again since (a delete racing the create)
                    continue
                raise
            except BaseException:
                self._unmap()
                raise
            finally:
                segment.discard(fd)
            return self

    @staticmethod
    def attach(str name):
        """Attach to an existing ring by name, from any process on the host."""
        validate_name(name)
        fd, size = segment.attach(name, RingLayoutError)
        cdef Ring self = Ring.__new__(Ring)
        try:
            if size < NSQSHM_RING_HEADER_SIZE:
                raise RingLayoutError(
                    f"segment {name!r} is {size} bytes, smaller than a ring header")
            self._map(name, fd, size)
        finally:
            os.close(fd)
        self._validate(size)
        return self

    @staticmethod
    def exists(str name):
        """Whether a segment named `name` exists (it may not be a ring)."""
        validate_name(name)
        return os.path.exists(f"/dev/shm/{name}")

    @staticmethod
    def unlink_segment(str name, of=None):
        """Remove the ring `name` and its waiter FIFOs; False if it was not
        there, or, with `of`, if the name is now another ring's (segment.unlink)."""
        validate_name(name)
        def remove_fifos(fd):
            for path in _waiter_fifos(name, fd):
                try:
                    if stat.S_ISFIFO(os.lstat(path).st_mode):
                        os.unlink(path)
                except FileNotFoundError:
                    pass

        return segment.unlink(name, of, before=remove_fifos)

    @staticmethod
    def remove_stale_fifos(str prefix):
        """Remove the waiter FIFOs under /dev/shm of rings named `prefix`.* that
        no longer exist (their waiter died after the ring was removed or made
        anew: an unlink finds FIFOs by the header's slots, _waiter_fifos).
        Returns how many went."""
        try:
            names = set(os.listdir("/dev/shm"))
        except FileNotFoundError:
            return 0
        gone = 0
        for entry in names:
            if entry.startswith(prefix + ".") and _FIFO_NAME.fullmatch(entry) \
                    and entry[:-21] not in names:
                path = f"/dev/shm/{entry}"
                try:
                    if stat.S_ISFIFO(os.lstat(path).st_mode):
                        os.unlink(path)
                        gone += 1
                except FileNotFoundError:
                    pass
        return gone

    def unlink(self):
        """Remove this ring's name, unless it names another ring by now (the
        topic or channel deleted and made again by another worker): mapped
        handles keep working until closed."""
        return Ring.unlink_segment(self.name, self.identity)

    cdef int _map_raw(self, int fd, size_t size) except -1:
        cdef void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
        if p == MAP_FAILED:
            raise OSError(errno, os.strerror(errno))
        self.hdr = <nsqshm_ring_header *>p
        self.map_size = size
        return 0

    def _map(self, str name, int fd, size_t size):
        self.name = name
        self.identity = segment.identity(fd)
        self._path_prefix = f"/dev/shm/{name}".encode()
        self._map_raw(fd, size)

    def _init_header(self, uint64_t cap, uint32_t max_record):
        cdef nsqshm_ring_header *h = self.hdr
        cdef pthread_mutexattr_t attr
        memset(<void *>h, 0, NSQSHM_RING_HEADER_SIZE)
        h.version = NSQSHM_RING_VERSION
        h.header_size = NSQSHM_RING_HEADER_SIZE
        h.capacity = cap
        h.total_size = NSQSHM_RING_HEADER_SIZE + cap
        h.max_record = max_record
        h.mutex_size = sizeof(pthread_mutex_t)
        h.created_ns = _now_ns(CLOCK_REALTIME)
        h.creator_pid = getpid()
        pthread_mutexattr_init(&attr)
        pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED)
        pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST)
        pthread_mutex_init(&h.prod_lock.mutex, &attr)
        pthread_mutex_init(&h.cons_lock.mutex, &attr)
        pthread_mutexattr_destroy(&attr)
        self._set_geometry()
        # last: an attacher that sees the magic sees everything above
        nsqshm_store_release(&h.magic, NSQSHM_RING_MAGIC)

    def _validate(self, size_t size):
        cdef nsqshm_ring_header *h = self.hdr
        # a ring is published whole (create): a magic missing now never comes
        magic = nsqshm_load_acquire(&h.magic)
        try:
            if magic != NSQSHM_RING_MAGIC:
                raise RingLayoutError(
                    f"segment {self.name!r} is not an nsqshm ring (magic {magic:#018x})")
            if h.version != NSQSHM_RING_VERSION:
                raise RingVersionError(
                    f"ring {self.name!r} has layout version {h.version}; "
                    f"this build reads version {NSQSHM_RING_VERSION}")
            cap = h.capacity
            if (h.header_size != NSQSHM_RING_HEADER_SIZE or cap < 4096 or cap & (cap - 1)
                    or h.total_size != NSQSHM_RING_HEADER_SIZE + cap or h.total_size != size):
                raise RingLayoutError(
                    f"ring {self.name!r}: header says {h.total_size} bytes "
                    f"(capacity {cap}), the segment has {size}")
            if not 0 < h.max_record <= cap // 2 - NSQSHM_RECORD_HEADER:
                raise RingLayoutError(
                    f"ring {self.name!r}: max_record {h.max_record} impossible for capacity {cap}")
            if h.mutex_size != sizeof(pthread_mutex_t):
                raise RingLayoutError(
                    f"ring {self.name!r} was made by a build with a {h.mutex_size}-byte mutex")
        except RingError:
            self._unmap()
            raise
        self._set_geometry()

    def _set_geometry(self):
        self.cap = self.hdr.capacity
        self.mask = self.cap - 1
        self.max_rec = self.hdr.max_record
        self.data = <char *>self.hdr + NSQSHM_RING_HEADER_SIZE

    def _unmap(self):
        if self.hdr != NULL:
            munmap(<void *>self.hdr, self.map_size)
            self.hdr = NULL
            self.data = NULL

    cdef int _check(self) except -1:
        if self.hdr == NULL:
            raise ValueError("ring handle is closed")
        return 0

    def close(self):
        """Unmap, release this handle's waiter slot and FIFO.  Never unlinks."""
        cdef char path[320]
        self.local_waker = None  # it usually refers to the handle's owner: no cycle left
        if self.hdr == NULL:
            return
        if self.slot >= 0 and self.slot_pid == _my_pid():
            nsqshm_fetch_and(&self.hdr.wait_data, ~(<uint64_t>1 << self.slot))
            nsqshm_fetch_and(&self.hdr.wait_space, ~(<uint64_t>1 << self.slot))
            self._fifo_path(self.slot, self.slot_value, path, sizeof(path))
            unlink(path)
            nsqshm_cas(&self.hdr.waiters[self.slot], self.slot_value, 0)
        if self.wait_fd >= 0:
            close(self.wait_fd)
            self.wait_fd = -1
        self.slot = -1
        for i in range(NSQSHM_RING_WAITERS):
            if self.wake_fds[i] >= 0:
                close(self.wake_fds[i])
                self.wake_fds[i] = -1
                self.wake_vals[i] = 0
        self._unmap()

    def __dealloc__(self):
        if self.hdr != NULL:
            try:
                self.close()
            except Exception:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __reduce__(self):
        # a handle travels to another process as its name and is re-attached
        return (Ring.attach, (self.name,))

    # -- locks and their recovery -------------------------------------------------

    cdef int _lock_prod(self) except -1:
        cdef nsqshm_ring_header *h = self.hdr
        cdef int r = pthread_mutex_lock(&h.prod_lock.mutex)
        if r == 0:
            return 0
        if r == EOWNERDEAD:
            # the holder died: its batch counts only if its tail store happened
            if h.tail == h.j_tail:
                nsqshm_store_release(&h.push_records, h.j_push_records)
                nsqshm_store_release(&h.push_bytes, h.j_push_bytes)
            else:
                h.j_tail = h.tail
                h.j_push_records = h.push_records
                h.j_push_bytes = h.push_bytes
            nsqshm_fetch_add(&h.recoveries, 1)
            pthread_mutex_consistent(&h.prod_lock.mutex)
            return 0
        raise RingError(f"ring {self.name!r}: producer lock failed ({os.strerror(r)})")

    cdef int _lock_cons(self) except -1:
        cdef nsqshm_ring_header *h = self.hdr
        cdef int r = pthread_mutex_lock(&h.cons_lock.mutex)
        if r == 0:
            return 0
        if r == EOWNERDEAD:
            if h.head == h.j_head:
                nsqshm_store_release(&h.pop_records, h.j_pop_records)
                nsqshm_store_release(&h.pop_bytes, h.j_pop_bytes)
            else:
                h.j_head = h.head
                h.j_pop_records = h.pop_records
                h.j_pop_bytes = h.pop_bytes
            nsqshm_fetch_add(&h.recoveries, 1)
            pthread_mutex_consistent(&h.cons_lock.mutex)
            return 0
        raise RingError(f"ring {self.name!r}: consumer lock failed ({os.strerror(r)})")

    cdef void _unlock_prod(self) noexcept nogil:
        pthread_mutex_unlock(&self.hdr.prod_lock.mutex)

    cdef void _unlock_cons(self) noexcept nogil:
        pthread_mutex_unlock(&self.hdr.cons_lock.mutex)

    # -- the record copy, commit and wake ------------------------------------------

    cdef int _put(self, uint64_t *tail, uint64_t head,
                  const char *src, uint32_t n) noexcept nogil:
        """Copy one record at *tail (not yet committed).  0 or _FULL."""
        cdef uint64_t need = NSQSHM_RECORD_HEADER + _align8(n)
        cdef uint64_t t = tail[0]
        cdef uint64_t off = t & self.mask
        cdef uint64_t contig = self.cap - off
        cdef uint64_t total = need if need <= contig else contig + need
        cdef uint32_t *rec
        if (t - head) + total > self.cap:
            return _FULL
        if need > contig:
            (<uint32_t *>(self.data + off))[0] = NSQSHM_WRAP_MARKER
            t += contig
            off = 0
        rec = <uint32_t *>(self.data + off)
        rec[0] = n
        rec[1] = 0
        memcpy(<char *>rec + NSQSHM_RECORD_HEADER, src, n)
        tail[0] = t + need
        return 0

    cdef void _commit_push(self, uint64_t tail, uint64_t records,
                           uint64_t nbytes) noexcept nogil:
        cdef nsqshm_ring_header *h = self.hdr
        cdef uint64_t r = h.push_records + records
        cdef uint64_t b = h.push_bytes + nbytes
        # journal first (j_tail before the counters), then the commit point
        nsqshm_store_release(&h.j_tail, tail)
        nsqshm_store_release(&h.j_push_records, r)
        nsqshm_store_release(&h.j_push_bytes, b)
        nsqshm_store_release(&h.tail, tail)
        nsqshm_store_release(&h.push_records, r)
        nsqshm_store_release(&h.push_bytes, b)

    cdef void _commit_pop(self, uint64_t head, uint64_t records,
                          uint64_t nbytes) noexcept nogil:
        cdef nsqshm_ring_header *h = self.hdr
        cdef uint64_t r = h.pop_records + records
        cdef uint64_t b = h.pop_bytes + nbytes
        nsqshm_store_release(&h.j_head, head)
        nsqshm_store_release(&h.j_pop_records, r)
        nsqshm_store_release(&h.j_pop_bytes, b)
        nsqshm_store_release(&h.head, head)
        nsqshm_store_release(&h.pop_records, r)
        nsqshm_store_release(&h.pop_bytes, b)

    cdef int _next(self, uint64_t *head, uint64_t tail,
                   char **rec, uint32_t *size) except -2:
        """Find the record at *head: 1 and its payload, or 0 when head == tail."""
        cdef uint64_t h = head[0]
        cdef uint64_t off
        cdef uint32_t n
        while h != tail:
            off = h & self.mask
            n = (<uint32_t *>(self.data + off))[0]
            if n == NSQSHM_WRAP_MARKER:
                h += self.cap - off
                continue
            if n > self.max_rec or off + NSQSHM_RECORD_HEADER + n > self.cap \
                    or h + NSQSHM_RECORD_HEADER + n > tail:
                raise RingCorruptError(
                    f"ring {self.name!r}: record of {n} bytes at position {h} "
                    f"(max_record {self.max_rec}, tail {tail})")
            head[0] = h
            rec[0] = self.data + off + NSQSHM_RECORD_HEADER
            size[0] = n
            return 1
        head[0] = h
        return 0

    cdef void _wake(self, uint64_t *word) noexcept:
        cdef uint64_t m
        nsqshm_fence()
        if nsqshm_load_relaxed(word) == 0:
            return
        m = nsqshm_exchange(word, 0)
        while m:
            self._wake_slot(nsqshm_ctz64(m), word == &self.hdr.wait_space)
            m &= m - 1

    cdef int _fifo_path(self, int s, uint64_t v, char *buf, size_t n) noexcept:
        return snprintf(buf, n, b"%s.w%02d-%016llx", PyBytes_AS_STRING(self._path_prefix),
                        s, <unsigned long long>v)

    cdef void _wake_slot(self, int s, bint space) noexcept:
        cdef uint64_t v = nsqshm_load_acquire(&self.hdr.waiters[s])
        cdef char path[320]
        cdef int fd
        cdef char one = 33
        if v == 0:
            return
        if s == self.slot and v == self.slot_value and self.local_waker is not None \
                and self.slot_pid == _my_pid():
            # the waiter is this handle, in this process: no FIFO round trip
            try:
                self.local_waker(space)
                return
            except BaseException:
                pass  # fall back to the FIFO
        if self.wake_vals[s] != v:
            if self.wake_fds[s] >= 0:
                close(self.wake_fds[s])
                self.wake_fds[s] = -1
            self.wake_vals[s] = 0
            self._fifo_path(s, v, path, sizeof(path))
            fd = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC)
            if fd < 0:
                if errno == ENXIO or errno == ENOENT:
                    self._reap_slot(s, v)
                return
            self.wake_fds[s] = fd
            self.wake_vals[s] = v
        if write(self.wake_fds[s], &one, 1) < 0 and errno == EPIPE:
            close(self.wake_fds[s])
            self.wake_fds[s] = -1
            self.wake_vals[s] = 0
            self._reap_slot(s, v)

    cdef void _reap_slot(self, int s, uint64_t v) noexcept:
        """Free slot s if the process that holds it is gone."""
        cdef char path[320]
        cdef int pid = <int>(v >> 32)
        if kill(pid, 0) == 0 or errno != ESRCH:
            return
        # the FIFO goes first: a slot's value names its FIFO while it is held
        # (_waiter_fifos); another reaper racing this one unlinks the same name
        self._fifo_path(s, v, path, sizeof(path))
        if nsqshm_load_acquire(&self.hdr.waiters[s]) == v:
            unlink(path)
            nsqshm_cas(&self.hdr.waiters[s], v, 0)

    # -- push ------------------------------------------------------------------

    cpdef int push(self, data) except -100:
        """Push one record: OK, FULL or TOO_BIG."""
        cdef Py_buffer view
        cdef uint64_t tail, head
        cdef int r
        self._check()
        PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
        try:
            if <uint64_t>view.len > self.max_rec:
                return _TOO_BIG
            self._lock_prod()
            tail = self.hdr.tail
            head = nsqshm_load_acquire(&self.hdr.head)
            r = self._put(&tail, head, <const char *>view.buf, <uint32_t>view.len)
            if r == 0:
                self._commit_push(tail, 1, view.len)
            self._unlock_prod()
        finally:
            PyBuffer_Release(&view)
        if r == 0:
            self._wake(&self.hdr.wait_data)
        return r

    def push_many(self, records):
        """Push records (a sequence of bytes-like) under one lock round.

        Returns how many were pushed, from the front, before the ring was
        full.  A record over max_record raises ValueError before anything is
        pushed.
        """
        cdef Py_ssize_t n = len(records), i, done = 0
        cdef uint64_t tail, head, nbytes = 0
        cdef Py_buffer view
        cdef object rec
        self._check()
        for i in range(n):
            rec = records[i]
            size = PyBytes_GET_SIZE(rec) if isinstance(rec, bytes) else memoryview(rec).nbytes
            if size > self.max_rec:
                raise ValueError(f"record {i} is {size} bytes, over max_record {self.max_rec}")
        self._lock_prod()
        try:
            tail = self.hdr.tail
            head = nsqshm_load_acquire(&self.hdr.head)
            for i in range(n):
                rec = records[i]
                if isinstance(rec, bytes):
                    if self._put(&tail, head, PyBytes_AS_STRING(rec),
                                 <uint32_t>PyBytes_GET_SIZE(rec)):
                        head = nsqshm_load_acquire(&self.hdr.head)
                        if self._put(&tail, head, PyBytes_AS_STRING(rec),
                                     <uint32_t>PyBytes_GET_SIZE(rec)):
                            break
                    nbytes += PyBytes_GET_SIZE(rec)
                else:
                    PyObject_GetBuffer(rec, &view, PyBUF_SIMPLE)
                    try:
                        if self._put(&tail, head, <const char *>view.buf, <uint32_t>view.len):
                            head = nsqshm_load_acquire(&self.hdr.head)
                            if self._put(&tail, head, <const char *>view.buf,
                                         <uint32_t>view.len):
                                break
                        nbytes += view.len
                    finally:
                        PyBuffer_Release(&view)
                done += 1
            if done:
                self._commit_push(tail, done, nbytes)
        finally:
            self._unlock_prod()
        if done:
            self._wake(&self.hdr.wait_data)
        return done

    def push_packed(self, buffer, Py_ssize_t max_records=-1, bint big_endian=False):
        """Push records packed as [u32 native size][payload]... under one lock
        (with big_endian, [u32 big-endian size][payload]...: a disk queue's
        segment bytes, pushed as they are).

        Returns (records pushed, bytes of `buffer` consumed).  Bad framing or
        a record over max_record raises ValueError before anything is pushed.
        """
        cdef Py_buffer view
        cdef const char *p
        cdef Py_ssize_t pos = 0, end, count = 0, done = 0
        cdef uint32_t n
        cdef uint64_t tail, head, nbytes = 0
        self._check()
        PyObject_GetBuffer(buffer, &view, PyBUF_SIMPLE)
        try:
            p = <const char *>view.buf
            end = view.len
            while pos < end and (max_records < 0 or count < max_records):
                if end - pos < 4:
                    raise ValueError(f"truncated size at byte {pos}")
                n = (<const uint32_t *>(p + pos))[0]
                if big_endian:
                    n = _bswap32(n)
                if n > self.max_rec:
                    raise ValueError(f"record at byte {pos} is {n} bytes, over max_record {self.max_rec}")
                if end - pos - 4 < n:
                    raise ValueError(f"truncated record at byte {pos}")
                pos += 4 + n
                count += 1
            pos = 0
            self._lock_prod()
            if self.hdr.retired:  # (checked under the lock the retiring broker takes)
                self._unlock_prod()
                raise RingRetired(f"ring {self.name!r} is retired: its broker stops")
            tail = self.hdr.tail
            head = nsqshm_load_acquire(&self.hdr.head)
            while done < count:
                n = (<const uint32_t *>(p + pos))[0]
                if big_endian:
                    n = _bswap32(n)
                if self._put(&tail, head, p + pos + 4, n):
                    head = nsqshm_load_acquire(&self.hdr.head)
                    if self._put(&tail, head, p + pos + 4, n):
                        break
                pos += 4 + n
                nbytes += n
                done += 1
            if done:
                self._commit_push(tail, done, nbytes)
            self._unlock_prod()
        finally:
            PyBuffer_Release(&view)
        if done:
            self._wake(&self.hdr.wait_data)
        return done, pos

    # -- pop -------------------------------------------------------------------

    def pop(self):
        """Pop one record as bytes, or None when the ring is empty."""
        cdef uint64_t head, tail
        cdef char *rec
        cdef uint32_t n
        cdef object out = None
        self._check()
        self._lock_cons()
        try:
            head = self.hdr.head
            tail = nsqshm_load_acquire(&self.hdr.tail)
            if self._next(&head, tail, &rec, &n):
                out = PyBytes_FromStringAndSize(rec, n)
                self._commit_pop(head + NSQSHM_RECORD_HEADER + _align8(n), 1, n)
        finally:
            self._unlock_cons()
        if out is not None:
            self._wake(&self.hdr.wait_space)
        return out

    cpdef int pop_into(self, buffer) except -100:
        """Pop one record into a writable buffer: its length, EMPTY, or
        TOO_BIG when the record is larger than the buffer (it stays)."""
        cdef Py_buffer view
        cdef uint64_t head, tail
        cdef char *rec
        cdef uint32_t n
        cdef int r = _EMPTY
        self._check()
        PyObject_GetBuffer(buffer, &view, PyBUF_WRITABLE)
        try:
            self._lock_cons()
            try:
                head = self.hdr.head
                tail = nsqshm_load_acquire(&self.hdr.tail)
                if self._next(&head, tail, &rec, &n):
                    if n > view.len:
                        r = _TOO_BIG
                    else:
                        memcpy(view.buf, rec, n)
                        self._commit_pop(head + NSQSHM_RECORD_HEADER + _align8(n), 1, n)
                        r = <int>n
            finally:
                self._unlock_cons()
        finally:
            PyBuffer_Release(&view)
        if r >= 0:
            self._wake(&self.hdr.wait_space)
        return r

    def pop_many(self, Py_ssize_t max_records=1024):
        """Pop up to max_records records under one lock round, as a list of bytes."""
        cdef uint64_t head, tail, nbytes = 0
        cdef char *rec
        cdef uint32_t n
        cdef list out = []
        self._check()
        self._lock_cons()
        try:
            head = self.hdr.head
            tail = nsqshm_load_acquire(&self.hdr.tail)
            while len(out) < max_records and self._next(&head, tail, &rec, &n):
                out.append(PyBytes_FromStringAndSize(rec, n))
                head += NSQSHM_RECORD_HEADER + _align8(n)
                nbytes += n
            if out:
                self._commit_pop(head, len(out), nbytes)
        finally:
            self._unlock_cons()
        if out:
            self._wake(&self.hdr.wait_space)
        return out

    def pop_many_into(self, buffer, Py_ssize_t max_records=-1):
        """Pop records into `buffer` packed as [u32 native size][payload]...

        Stops at max_records, at an empty ring, or at the first record that
        would not fit.  The buffer must hold at least one record of
        max_record bytes.  Returns (records, bytes written).
        """
        return self._copy_out(buffer, max_records, True)

    def peek_many_into(self, buffer, Py_ssize_t max_records=-1):
        """pop_many_into without popping: copy records from the head into
        `buffer` (packed the same way) and leave them in the ring.

        For a ring's single owner that must not lose a record it is moving
        elsewhere (the topic pump): peek, store the copies, then discard(n).
        A death in between leaves the records in the ring (a duplicate later,
        never a loss)."""
        return self._copy_out(buffer, max_records, False)

    cdef tuple _copy_out(self, buffer, Py_ssize_t max_records, bint pop):
        cdef Py_buffer view
        cdef uint64_t head = 0, nbytes = 0
        cdef Py_ssize_t pos = 0, count = 0
        self._check()
        PyObject_GetBuffer(buffer, &view, PyBUF_WRITABLE)
        try:
            self._check_room(view.len)
            self._lock_cons()
            try:
                count = self._gather(<char *>view.buf, view.len, max_records, &pos, &head,
                                     &nbytes)
                if count and pop:
                    self._commit_pop(head, count, nbytes)
            finally:
                self._unlock_cons()
        finally:
            PyBuffer_Release(&view)
        if count and pop:
            self._wake(&self.hdr.wait_space)
        return count, pos

    cdef int _check_room(self, Py_ssize_t room) except -1:
        if room < 4 + <Py_ssize_t>self.max_rec:
            raise ValueError(f"buffer of {room} bytes cannot hold a record of "
                             f"max_record {self.max_rec} bytes plus its 4-byte size")
        return 0

    cdef Py_ssize_t _gather(self, char *dst, Py_ssize_t room, Py_ssize_t max_records,
                            Py_ssize_t *pos_out, uint64_t *head_out,
                            uint64_t *nbytes_out) except -1:
        """Copy records from the head into dst as packed [u32 size][payload],
        the consumer lock held and nothing popped; returns the count, with the
        bytes written, the head after them and their payload bytes for
        _commit_pop."""
        cdef uint64_t head = self.hdr.head
        cdef uint64_t tail = nsqshm_load_acquire(&self.hdr.tail)
        cdef uint64_t nbytes = 0
        cdef char *rec
        cdef uint32_t n
        cdef Py_ssize_t pos = 0, count = 0
        while (max_records < 0 or count < max_records) and self._next(&head, tail, &rec, &n):
            if room - pos < 4 + <Py_ssize_t>n:
                break
            (<uint32_t *>(dst + pos))[0] = n
            memcpy(dst + pos + 4, rec, n)
            pos += 4 + n
            nbytes += n
            count += 1
            head += NSQSHM_RECORD_HEADER + _align8(n)
        pos_out[0] = pos
        head_out[0] = head
        nbytes_out[0] = nbytes
        return count

    def discard(self, Py_ssize_t records):
        """Pop `records` records without copying them (after peek_many_into);
        returns how many were there to pop."""
        cdef uint64_t head, tail, nbytes = 0
        cdef char *rec
        cdef uint32_t n
        cdef Py_ssize_t count = 0
        self._check()
        if records <= 0:
            return 0
        self._lock_cons()
        try:
            head = self.hdr.head
            tail = nsqshm_load_acquire(&self.hdr.tail)
            while count < records and self._next(&head, tail, &rec, &n):
                head += NSQSHM_RECORD_HEADER + _align8(n)
                nbytes += n
                count += 1
            if count:
                self._commit_pop(head, count, nbytes)
        finally:
            self._unlock_cons()
        if count:
            self._wake(&self.hdr.wait_space)
        return count

    # -- waiting (the blocking calls live in nsqshm.ring, over these) ------------

    def fileno(self):
        """The read end of this handle's wake FIFO, for poll() or gevent.

        Claims a waiter slot on first use (and again in a forked child,
        which must not share its parent's slot).
        """
        cdef char path[320]
        cdef int pid = _my_pid()
        cdef uint64_t v
        cdef int s, fd
        self._check()
        if self.slot >= 0 and self.slot_pid == pid:
            return self.wait_fd
        if self.slot >= 0:           # inherited across fork: the parent's
            if self.wait_fd >= 0:
                close(self.wait_fd)
            self.wait_fd = -1
            self.slot = -1
        token = (int.from_bytes(os.urandom(4), "little") | 1) & 0xFFFFFFFF
        v = (<uint64_t>pid << 32) | <uint64_t>token
        s = self._claim_slot(v)
        if s < 0:
            for i in range(NSQSHM_RING_WAITERS):
                self._reap_slot(i, nsqshm_load_acquire(&self.hdr.waiters[i]))
            s = self._claim_slot(v)
        if s < 0:
            raise RingError(f"ring {self.name!r}: all {NSQSHM_RING_WAITERS} waiter slots "
                            "are held by live processes")
        self._fifo_path(s, v, path, sizeof(path))
        unlink(path)
        if mkfifo(path, 0o600) != 0:
            e = errno
            nsqshm_cas(&self.hdr.waiters[s], v, 0)
            raise OSError(e, os.strerror(e), path.decode())
        # O_RDWR: the open never blocks and the FIFO never reports EOF
        fd = open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC)
        if fd < 0:
            e = errno
            unlink(path)
            nsqshm_cas(&self.hdr.waiters[s], v, 0)
            raise OSError(e, os.strerror(e), path.decode())
        self.slot = s
        self.slot_pid = pid
        self.slot_value = v
        self.wait_fd = fd
        return fd

    def _claim_slot(self, uint64_t v):
        for i in range(NSQSHM_RING_WAITERS):
            if nsqshm_load_relaxed(&self.hdr.waiters[i]) == 0 and \
                    nsqshm_cas(&self.hdr.waiters[i], 0, v):
                return i
        return -1

    def count_local(self, uint64_t msgs, uint64_t body_bytes):
        """A local producer published `msgs` messages of `body_bytes` body
        bytes into this (topic) ring: counted in the header, for /stats."""
        self._check()
        nsqshm_fetch_add(&self.hdr.local_msgs, msgs)
        nsqshm_fetch_add(&self.hdr.local_body_bytes, body_bytes)

    @property
    def local_published(self):
        """(messages, body bytes) local producers published into this ring."""
        self._check()
        return (nsqshm_load_acquire(&self.hdr.local_msgs),
                nsqshm_load_acquire(&self.hdr.local_body_bytes))

    def add_subscribers(self, int64_t delta):
        """Add delta (+1 or -1) to the channel's count of subscribed clients,
        of every worker, atomically; returns the new count."""
        self._check()
        return <int64_t>(nsqshm_fetch_add(&self.hdr.subscribers, <uint64_t>delta)
                         + <uint64_t>delta)

    @property
    def subscribers(self):
        self._check()
        return <int64_t>nsqshm_load_acquire(&self.hdr.subscribers)

    @subscribers.setter
    def subscribers(self, int64_t value):
        """Set at a worker's start from its peers' counts (recovery.py)."""
        self._check()
        nsqshm_store_release(&self.hdr.subscribers, <uint64_t>value)

    def add_direct_subscribers(self, int64_t delta):
        """Add delta to the count of subscribed clients (of every worker) that
        take a log channel's partitions straight from the logs; returns it."""
        self._check()
        return <int64_t>(nsqshm_fetch_add(&self.hdr.direct_subscribers, <uint64_t>delta)
                         + <uint64_t>delta)

    @property
    def direct_subscribers(self):
        self._check()
        return <int64_t>nsqshm_load_acquire(&self.hdr.direct_subscribers)

    @direct_subscribers.setter
    def direct_subscribers(self, int64_t value):
        """Set at a worker's start from its peers' counts (recovery.py)."""
        self._check()
        nsqshm_store_release(&self.hdr.direct_subscribers, <uint64_t>value)

    @property
    def ttl_ns(self):
        """The channel's time to live in ns (0: none), for local consumers."""
        self._check()
        return nsqshm_load_acquire(&self.hdr.ttl_ns)

    @ttl_ns.setter
    def ttl_ns(self, uint64_t value):
        """Set by the broker as the channel's policy changes (policy.py)."""
        self._check()
        nsqshm_store_release(&self.hdr.ttl_ns, value)

    def count_local_expired(self, uint64_t n):
        """A local consumer dropped n expired messages of this (channel) ring."""
        self._check()
        nsqshm_fetch_add(&self.hdr.local_expired, n)

    @property
    def local_expired(self):
        self._check()
        return nsqshm_load_acquire(&self.hdr.local_expired)

    def count_local_requeues(self, uint64_t n):
        """A local consumer put n messages of this (channel) ring back (REQ)."""
        self._check()
        nsqshm_fetch_add(&self.hdr.local_requeues, n)

    def count_local_timeouts(self, uint64_t n):
        """n messages a local consumer of this (channel) ring held timed out."""
        self._check()
        nsqshm_fetch_add(&self.hdr.local_timeouts, n)

    @property
    def local_requeues(self):
        self._check()
        return nsqshm_load_acquire(&self.hdr.local_requeues)

    @property
    def local_timeouts(self):
        self._check()
        return nsqshm_load_acquire(&self.hdr.local_timeouts)

    def bump_lanes_version(self):
        """A log channel's partition got a lane, or its lane turned ordered
        (LogChannel.use_lanes: once the cursors are held, before the drop)."""
        self._check()
        nsqshm_fetch_add(&self.hdr.lanes_version, 1)

    @property
    def lanes_version(self):
        self._check()
        return nsqshm_load_acquire(&self.hdr.lanes_version)

    def set_local_waker(self, waker):
        """waker(for_space) is called, instead of a write to this handle's
        FIFO, when a push (or, for_space, a pop) through this same handle
        in this process wakes it: an event loop that also watches fileno()
        learns of its own pushes without a system call.  None: the FIFO."""
        self.local_waker = waker

    def arm(self, bint for_space=False):
        """Ask to be woken by the next push (or, for_space, the next pop).

        Call, then re-try the operation, then sleep on fileno(): a commit
        after arm() always wakes this handle.
        """
        self.fileno()
        cdef uint64_t bit = <uint64_t>1 << self.slot
        if for_space:
            nsqshm_fetch_or(&self.hdr.wait_space, bit)
        else:
            nsqshm_fetch_or(&self.hdr.wait_data, bit)

    def disarm(self, bint for_space=False):
        """Withdraw a wake request made by arm()."""
        if self.slot >= 0 and self.hdr != NULL and self.slot_pid == _my_pid():
            nsqshm_fetch_and(&self.hdr.wait_space if for_space else &self.hdr.wait_data,
                             ~(<uint64_t>1 << self.slot))

    def _block(self, op, bint for_space, timeout):
        """Run op() until it stops reporting FULL/EMPTY or timeout passes,
        sleeping on the wake FIFO in between (never polling the ring)."""
        import time
        r = op()
        if not _blocked(r):
            return r
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                self.arm(for_space)
                r = op()
                if not _blocked(r):
                    return r
                if deadline is None:
                    remaining = -1.0
                else:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return r
                if _sleeper is None:
                    self.sleep(remaining)
                else:
                    _sleeper(self.wait_fd, None if remaining < 0 else remaining)
                self.drain()
        finally:
            self.disarm(for_space)

    def push_wait(self, data, timeout=None):
        """push(), waiting up to `timeout` seconds (None: forever) for room.
        OK, FULL on timeout, or TOO_BIG at once."""
        return self._block(lambda: self.push(data), True, timeout)

    def retire(self):
        """The broker, before it drains the ring a last time and removes it: from
        now on push_packed refuses (RingRetired), under the producer lock, so every
        push that succeeded is in the ring for that drain.  Producers waiting for
        room are woken (they see it)."""
        self._check()
        self._lock_prod()
        self.hdr.retired = 1
        self._unlock_prod()
        self._wake(&self.hdr.wait_space)

    def unretire(self):
        """Take pushes again (a ring kept after all: its last drain failed)."""
        self._check()
        self._lock_prod()
        self.hdr.retired = 0
        self._unlock_prod()

    @property
    def retired(self):
        self._check()
        return nsqshm_load_acquire(&self.hdr.retired) != 0

    def push_packed_wait(self, buffer, Py_ssize_t max_records=-1, timeout=None):
        """push_packed(), waiting for room for at least one record;
        (0, 0) on timeout."""
        return self._block(lambda: self.push_packed(buffer, max_records), True, timeout)

    def _lock_and_leave(self, str side):
        """Test hook: take the producer or consumer lock and do not release it
        (a test then kills this process to check robust recovery)."""
        self._check()
        if side == "prod":
            self._lock_prod()
        elif side == "cons":
            self._lock_cons()
        else:
            raise ValueError("side must be 'prod' or 'cons'")

    def pop_wait(self, timeout=None):
        """pop(), waiting up to `timeout` seconds for a record; None on timeout."""
        return self._block(self.pop, False, timeout)

    def pop_many_wait(self, Py_ssize_t max_records=1024, timeout=None):
        """pop_many(), waiting for at least one record; [] on timeout."""
        return self._block(lambda: self.pop_many(max_records), False, timeout)

    def pop_many_into_wait(self, buffer, Py_ssize_t max_records=-1, timeout=None):
        """pop_many_into(), waiting for at least one record; (0, 0) on timeout."""
        return self._block(lambda: self.pop_many_into(buffer, max_records), False, timeout)

    def drain(self):
        """Consume pending wake bytes from the FIFO; the count read."""
        cdef char buf[256]
        cdef ssize_t r, total = 0
        if self.wait_fd < 0:
            return 0
        while True:
            r = read(self.wait_fd, buf, sizeof(buf))
            if r <= 0:
                break
            total += r
        return total

    def sleep(self, double timeout):
        """Block in poll() on the wake FIFO (GIL released) for at most
        `timeout` seconds (negative: no limit).  True if woken."""
        cdef pollfd p
        cdef int ms = -1 if timeout < 0 else <int>(timeout * 1000 + 0.999)
        cdef int r
        p.fd = self.fileno()
        p.events = POLLIN
        p.revents = 0
        with nogil:
            r = poll(&p, 1, ms)
        return r > 0

    # -- counters, readable by any process ----------------------------------------

    @property
    def capacity(self):
        self._check()
        return self.cap

    @property
    def max_record(self):
        self._check()
        return self.max_rec

    @property
    def waiting_for_data(self):
        """Whether some handle (in any process) sleeps until the next push."""
        self._check()
        return nsqshm_load_acquire(&self.hdr.wait_data) != 0

    cdef bint _flag(self, uint32_t bit) except -1:
        self._check()
        return (nsqshm_flags_load(&self.hdr.flags) & bit) != 0

    cdef int _set_flag(self, uint32_t bit, bint value) except -1:
        self._check()
        if value:
            nsqshm_flags_or(&self.hdr.flags, bit)
        else:
            nsqshm_flags_and(&self.hdr.flags, ~bit)
        return 0

    @property
    def paused(self):
        """Set while the channel is paused (flags bit 1), for local consumers."""
        return self._flag(2)

    @paused.setter
    def paused(self, bint value):
        self._set_flag(2, value)

    @property
    def topic_paused(self):
        """Set while a log channel's topic is paused (flags bit 3): a local
        consumer that reads the partitions' logs itself takes nothing then."""
        return self._flag(8)

    @topic_paused.setter
    def topic_paused(self, bint value):
        self._set_flag(8, value)

    @property
    def ring_wanted(self):
        """Set by a log channel's dispatcher whose client takes from the ring
        and finds it empty (flags bit 2): the owners' feeders fill the ring
        then, whatever the subscriber counts say (logchannel.py _room)."""
        return self._flag(4)

    @ring_wanted.setter
    def ring_wanted(self, bint value):
        self._set_flag(4, value)

    def nudge(self):
        """Wake the handles waiting for space, as a pop does: a consumer that
        finds the ring empty while the owner has a disk backlog asks for a
        refill this way (from any process)."""
        self._check()
        self._wake(&self.hdr.wait_space)

    def wake_consumers(self):
        """Wake the handles waiting for data, as a push does, with nothing
        pushed: a log channel's dispatchers on other workers read the log
        straight and sleep on the channel's ring; the owner of a partition
        wakes them this way when it appends (from any process)."""
        self._check()
        self._wake(&self.hdr.wait_data)

    @property
    def disk_backlog(self):
        """Set by the queue's owner while its disk queue holds messages (the
        header's flags bit 0), so other processes know to ask for a refill."""
        return self._flag(1)

    @disk_backlog.setter
    def disk_backlog(self, bint value):
        self._set_flag(1, value)

    @property
    def popped(self):
        """Records popped from the ring since it was made, by any process:
        a dispatcher that saw this before waiting knows whether another
        consumer took from the ring meanwhile."""
        self._check()
        return nsqshm_load_acquire(&self.hdr.pop_records)

    @property
    def depth(self):
        """Records in the ring (pushed minus popped)."""
        self._check()
        cdef uint64_t pushed = nsqshm_load_acquire(&self.hdr.push_records)
        cdef uint64_t popped = nsqshm_load_acquire(&self.hdr.pop_records)
        return pushed - popped if pushed > popped else 0

    @property
    def depth_bytes(self):
        """Payload bytes in the ring."""
        self._check()
        cdef uint64_t pushed = nsqshm_load_acquire(&self.hdr.push_bytes)
        cdef uint64_t popped = nsqshm_load_acquire(&self.hdr.pop_bytes)
        return pushed - popped if pushed > popped else 0

    @property
    def used_bytes(self):
        """Bytes of the data area in use, record headers and padding included."""
        self._check()
        cdef uint64_t tail = nsqshm_load_acquire(&self.hdr.tail)
        cdef uint64_t head = nsqshm_load_acquire(&self.hdr.head)
        return tail - head if tail > head else 0

    @property
    def closed(self):
        return self.hdr == NULL

    def stats(self):
        """A snapshot of the ring's counters (not atomic across fields)."""
        self._check()
        cdef nsqshm_ring_header *h = self.hdr
        waiters = sum(1 for i in range(NSQSHM_RING_WAITERS)
                      if nsqshm_load_relaxed(&h.waiters[i]) != 0)
        return {
            "name": self.name,
            "capacity": h.capacity,
            "max_record": h.max_record,
            "depth": self.depth,
            "depth_bytes": self.depth_bytes,
            "used_bytes": self.used_bytes,
            "push_records": nsqshm_load_acquire(&h.push_records),
            "push_bytes": nsqshm_load_acquire(&h.push_bytes),
            "pop_records": nsqshm_load_acquire(&h.pop_records),
            "pop_bytes": nsqshm_load_acquire(&h.pop_bytes),
            "recoveries": nsqshm_load_acquire(&h.recoveries),
            "local_msgs": nsqshm_load_acquire(&h.local_msgs),
            "local_body_bytes": nsqshm_load_acquire(&h.local_body_bytes),
            "subscribers": <int64_t>nsqshm_load_acquire(&h.subscribers),
            "direct_subscribers": <int64_t>nsqshm_load_acquire(&h.direct_subscribers),
            "waiters": waiters,
            "creator_pid": h.creator_pid,
            "created_ns": h.created_ns,
        }

    def __repr__(self):
        if self.hdr == NULL:
            return f"<Ring {self.name!r} closed>"
        return f"<Ring {self.name!r} capacity={self.cap} depth={self.depth}>"
