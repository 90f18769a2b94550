"""A channel's position in one partition of a log topic: a confirmed msg
offset (every message below it is finished) plus the set of messages
finished out of order above it.

The set is a window of window_bits bits (default 64 Ki) starting at the
confirmed offset: bit (o % window_bits) says whether msg offset o is
finished.  Finishing the confirmed offset advances it past the whole run of
finished ones.  A finish at or beyond confirmed + window_bits is refused
(OUT_OF_WINDOW): the channel must hold delivery there -- next_unfinished
never returns an offset outside the window -- until the oldest unfinished
message is finished or times out and is delivered again.

The cursor lives in a POSIX shared-memory segment (layout drawn in
includes/commitlog_layout.h), so any worker can finish a message and a
cursor survives SIGKILL of any process, and it is checkpointed to a small
file in the partition directory (written, fsynced, renamed) so it survives
the segment too (a reboot).  The segment is created unnamed (O_TMPFILE in
/dev/shm, mode 0600), initialised, and linked into place: no process ever
attaches to a half-made cursor, and of two creators one wins and the other
attaches to the winner's.  Every operation runs in C under a robust
process-shared mutex; an advance is journalled so that a holder killed
mid-way is repaired by the next one to lock (see the layout).
"""

cimport cython

import errno as errno_mod
import os
import re

from cpython.buffer cimport PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytearray cimport PyByteArray_AS_STRING
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, qsort

from nsqshm._core.commitlog cimport LogReader
from nsqshm._core.includes.system cimport (
    EBUSY, EOWNERDEAD, MAP_FAILED, MAP_SHARED, PROT_READ, PROT_WRITE, PTHREAD_MUTEX_ROBUST,
    PTHREAD_PROCESS_SHARED, errno, memcpy, memset, mmap, munmap, pthread_mutex_consistent,
    pthread_mutex_init, pthread_mutex_lock, pthread_mutex_t, pthread_mutex_trylock,
    pthread_mutex_unlock,
    pthread_mutexattr_destroy, pthread_mutexattr_init, pthread_mutexattr_setpshared,
    pthread_mutexattr_setrobust, pthread_mutexattr_t,
)

from nsqshm._core.commitlog import ID_OFFSET_BITS, MAX_PARTITIONS, OffsetOutOfRange

FINISHED = 0          # finish(): newly finished
ALREADY = 1           # finish(): it was finished before
STALE = 2             # CursorSet, guarded: taken before a seek, so marks nothing
OUT_OF_WINDOW = -1    # finish(): beyond confirmed + window_bits: hold delivery
SEEKS_MOVED = 1       # CursorSet.seek_state: a seek since the copies held were taken
SEEK_HOLDS = 2        # CursorSet.seek_state: a seek is under way
DEFAULT_WINDOW_BITS = 1 << 16
CLAIM_RETENTION = -2  # claim_read: retention removed what the cursor would read next
RETRY_SLOTS = 4096    # a new cursor's retry table (24 bytes a slot; tmpfs pages only when used)
MAX_RETRY_SLOTS = 1 << 20
cdef enum:
    RETRY_ENTRY_SIZE = 18  # retries()' wire entry: u64 BE msg offset, u16 BE attempts, i64 BE due ms
RETRY_ENTRY = RETRY_ENTRY_SIZE
SHM_DIR = "/dev/shm"
NAME_MAX_LEN = 200
CHECKPOINT_MAGIC = b"NSQLCUR2"     # with the retry table after the window
CHECKPOINT_MAGIC_V1 = b"NSQLCUR1"  # without (read still)
_NAME_RE = re.compile(r"^[A-Za-z0-9_:#][A-Za-z0-9_.:#-]{0,199}$")
_CHANNEL_RE = re.compile(r"^[.a-zA-Z0-9_-]+(#ephemeral)?$")


# nsqd's message encoding: [8 BE timestamp][2 BE attempts][16 ID][body]
cdef enum:
    RECORD_ID_OFFSET = 10
    RECORD_ID_END = 26


class CursorError(Exception):
    """A cursor segment or checkpoint cannot be used."""


def validate_name(str name):
    """A cursor segment name: 1-200 of [A-Za-z0-9_.:#-], not starting with
    '.' or '-' (a file directly in /dev/shm)."""
    if not _NAME_RE.match(name) or not name.isascii():
        raise ValueError(f"invalid cursor name {name!r}")


def segment_name(str prefix, str topic, str channel, int partition):
    """The shared-memory name of `channel`'s cursor in partition `partition`
    of log topic `topic` (the broker makes it; local consumers attach)."""
    return f"{prefix}.k.{topic}:{channel}:p{partition}"


def checkpoint_path(str partition_dir, str channel):
    """The checkpoint file of `channel`'s cursor in a partition directory
    (nsqd's channel name rule; always one path component)."""
    if not 0 < len(channel) <= 64 or not _CHANNEL_RE.match(channel) or not channel.isascii():
        raise ValueError(f"invalid channel name {channel!r}")
    return os.path.join(partition_dir, f"{channel}.cursor")


cdef extern from "<signal.h>" nogil:
    int kill(int pid, int sig)

cdef extern from "<unistd.h>" nogil:
    int getpid()


cdef extern from "<time.h>" nogil:
    struct timespec:
        long tv_sec
        long tv_nsec
    int clock_gettime(int clk, timespec *ts)


cdef inline uint64_t _now_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(0, &ts)
    return <uint64_t>ts.tv_sec * 1000000000 + <uint64_t>ts.tv_nsec


cdef extern from *:
    int __builtin_ctzll(unsigned long long v) nogil
    int __builtin_popcountll(unsigned long long v) nogil
    uint64_t __atomic_load_n(const uint64_t *p, int order) nogil
    void __atomic_store_n(uint64_t *p, uint64_t v, int order) nogil
    uint64_t __atomic_fetch_add(uint64_t *p, uint64_t v, int order) nogil
    bint __atomic_compare_exchange_n(uint64_t *p, uint64_t *expected, uint64_t desired,
                                     bint weak, int success, int failure) nogil


cdef uint64_t _popcount(const uint64_t *w, uint64_t words) noexcept nogil:
    cdef uint64_t i, n = 0
    for i in range(words):
        n += __builtin_popcountll(w[i])
    return n


cdef inline bint _bit(const uint64_t *w, uint64_t i) noexcept nogil:
    return (w[i >> 6] >> (i & 63)) & 1


cdef void _clear_range(uint64_t *w, uint64_t mask, uint64_t start, uint64_t n) noexcept nogil:
    """Clear n bits from bit index start (mod the window: mask = bits - 1)."""
    cdef uint64_t i = start & mask, k
    while n:
        if (i & 63) == 0 and n >= 64:
            w[i >> 6] = 0
            k = 64
        else:
            w[i >> 6] &= ~((<uint64_t>1) << (i & 63))
            k = 1
        n -= k
        i = (i + k) & mask


cdef uint64_t _run(const uint64_t *w, uint64_t mask, uint64_t start, uint64_t limit) noexcept nogil:
    """How many bits are set in a row from bit index start, at most limit."""
    cdef uint64_t i = start & mask, n = 0, inv, ones, avail
    while n < limit:
        avail = 64 - (i & 63)
        inv = ~(w[i >> 6] >> (i & 63))   # the shifted-in high bits read as unset
        ones = 64 if inv == 0 else <uint64_t>__builtin_ctzll(inv)
        if ones > avail:
            ones = avail
        n += ones
        if ones < avail:
            break
        i = (i + ones) & mask
    return n if n < limit else limit


cdef int _by_key(const void *a, const void *b) noexcept nogil:
    cdef uint64_t x = (<const nsqshm_retry_slot *>a).key, y = (<const nsqshm_retry_slot *>b).key
    return (x > y) - (x < y)


cdef inline void _put_be(unsigned char *q, uint64_t v, int n) noexcept nogil:
    cdef int i
    for i in range(n - 1, -1, -1):
        q[i] = v & 0xFF
        v >>= 8


cdef inline uint64_t _get_be(const unsigned char *p, int n) noexcept nogil:
    cdef uint64_t v = 0
    cdef int i
    for i in range(n):
        v = (v << 8) | p[i]
    return v


# read_pos while a seek holds the cursor: past any log's end, so a feeder
# finds nothing to read there.  Held by set(hold=True) (a seek to a new
# offset) it is _READ_SEEK: the window was reset for the new offset, and a
# FIN meanwhile is of a message delivered from the old position, which a
# worker has not taken out of flight yet (LogChannel._drop_moved): it marks
# nothing, else that message would be skipped after the seek
cdef uint64_t _READ_HELD = (<uint64_t>1) << 62
cdef uint64_t _READ_SEEK = _READ_HELD | 1
READ_HELD = _READ_HELD


cdef inline bint _is_held(uint64_t r) noexcept nogil:
    return r >= _READ_HELD


cdef inline uint32_t _retry_home(uint64_t o, uint32_t slots) noexcept nogil:
    """Where msg offset o's retry entry is looked for first (slots a power of
    two): Fibonacci hashing, so that consecutive offsets -- the many REQs or
    timeouts of one consumer -- land apart; at o & (slots - 1) they made one
    run that every note of a new offset walked to its end."""
    return <uint32_t>((o * <uint64_t>0x9E3779B97F4A7C15) >> 32) & (slots - 1)


cdef class Cursor:
    """A handle on a shared-memory cursor.  Use Cursor.open."""

    def __cinit__(self):
        self.h = NULL

    def __init__(self):
        raise TypeError("use Cursor.open(name, checkpoint_file, start_offset)")

    @staticmethod
    def open(str name, str checkpoint_file, unsigned long long start_offset=0,
             unsigned long long window_bits=DEFAULT_WINDOW_BITS,
             unsigned int retry_slots=RETRY_SLOTS, bint hold_retries=False):
        """Attach to the cursor segment `name`, or make it: from the
        checkpoint file if there is one, else at start_offset.  hold_retries:
        a cursor made from a checkpoint whose retry table holds messages is
        made held (read_pos HELD: no reader takes anything of it), for its
        maker (`created`) to take them up and release it."""
        validate_name(name)
        if window_bits < 64 or window_bits > (1 << 24) or window_bits & (window_bits - 1):
            raise ValueError(f"window_bits {window_bits}: a power of two in 64..2**24")
        if retry_slots > MAX_RETRY_SLOTS or retry_slots & (retry_slots - 1):
            raise ValueError(f"retry_slots {retry_slots}: 0 or a power of two up to "
                             f"{MAX_RETRY_SLOTS}")
        cdef Cursor self = Cursor.__new__(Cursor)
        self.name = name
        self.checkpoint_file = checkpoint_file
        for _ in range(10):
            try:
                self._attach()
                return self
            except FileNotFoundError:
                pass
            confirmed, window, retries = _read_checkpoint(checkpoint_file, window_bits)
            if confirmed is None:
                confirmed = start_offset
            if self._create(confirmed, window, window_bits, retry_slots,
                            retries, hold_retries):
                return self
        raise CursorError(f"cursor {name!r}: could not attach nor create")

    @staticmethod
    def attach(str name):
        """Attach to the cursor segment `name` that the broker made (a local
        consumer's FINs mark it); CursorError when there is none."""
        validate_name(name)
        cdef Cursor self = Cursor.__new__(Cursor)
        self.name = name
        self.checkpoint_file = ""
        try:
            self._attach()
        except FileNotFoundError:
            raise CursorError(f"cursor {name!r} does not exist") from None
        return self

    cdef int _map(self, int fd, size_t size) except -1:
        cdef void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
        if p == MAP_FAILED:
            raise OSError(errno, os.strerror(errno))
        self.h = <nsqshm_cursor_header *>p
        self.size = size
        return 0

    def _attach(self):
        cdef nsqshm_cursor_header *h
        fd = os.open(f"{SHM_DIR}/{self.name}", os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        try:
            st = os.fstat(fd)
            if st.st_size < NSQSHM_CURSOR_HEADER + 8:
                raise CursorError(f"cursor {self.name!r}: segment of {st.st_size} bytes")
            self._map(fd, st.st_size)
        finally:
            os.close(fd)
        h = self.h
        slots = h.retry_slots  # (read once: the table's code uses this handle's copy)
        if h.magic != NSQSHM_CURSOR_MAGIC or h.version != NSQSHM_CURSOR_VERSION or \
                slots > MAX_RETRY_SLOTS or slots & (slots - 1) or \
                int(NSQSHM_CURSOR_HEADER) + int(h.window_bits) // 8 + int(slots) * 24 != self.size:
            # (retry_slots 0: a segment of a build before the retry table, taken as it is)
            raise CursorError(f"cursor {self.name!r}: not a cursor of layout "
                              f"{NSQSHM_CURSOR_VERSION}")
        self.bits = h.window_bits
        self.mask = self.bits - 1
        self.slots = slots
        if slots and not __atomic_load_n(&h.retry_hashed, 2):
            self._lock()
            try:
                self._retry_rehash()
            finally:
                self._unlock()

    def _create(self, unsigned long long confirmed, window, unsigned long long window_bits,
                unsigned int retry_slots, bytes retries=b"", bint hold=False):
        """Make the segment unnamed, fill it (retries: a checkpoint's retry table,
        as retries() gives it), link it under its name.  False when another
        process linked one first (attach to it then)."""
        cdef pthread_mutexattr_t attr
        cdef nsqshm_cursor_header *h
        size = NSQSHM_CURSOR_HEADER + window_bits // 8 + retry_slots * 24
        tmp = None
        try:
            fd = os.open(SHM_DIR, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
        except OSError as err:
            if err.errno not in (errno_mod.EOPNOTSUPP, errno_mod.EISDIR, errno_mod.EINVAL):
                raise
            tmp = f"{SHM_DIR}/.nsqshm-tmp-{os.getpid()}-{os.urandom(6).hex()}"
            fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW,
                         0o600)
        try:
            os.fchmod(fd, 0o600)
            os.ftruncate(fd, size)
            self._map(fd, size)
            h = self.h
            h.version = NSQSHM_CURSOR_VERSION
            h.window_bits = window_bits
            h.retry_slots = retry_slots
            h.retry_hashed = 1
            self.slots = retry_slots
            h.created_ns = _now_ns()
            h.confirmed = confirmed
            self.bits = window_bits
            self.mask = window_bits - 1
            if window is not None:
                memcpy(<void *>h.window, PyBytes_AS_STRING(window), window_bits // 8)
                h.finished = _popcount(h.window, window_bits // 64)
            if retries and len(retries) % RETRY_ENTRY == 0:  # (not linked yet: no lock)
                if self._retry_load(<const unsigned char *>PyBytes_AS_STRING(retries),
                                    len(retries), 0xFFFFFFFFFFFFFFFF) and hold:
                    h.read_pos = _READ_HELD
            pthread_mutexattr_init(&attr)
            pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED)
            pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST)
            pthread_mutex_init(&h.lock.mutex, &attr)
            pthread_mutexattr_destroy(&attr)
            h.magic = NSQSHM_CURSOR_MAGIC
            src = tmp if tmp else f"/proc/self/fd/{fd}"
            shm_dir = os.open(SHM_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.link(src, self.name, dst_dir_fd=shm_dir, follow_symlinks=True)
            except FileExistsError:
                munmap(self.h, self.size)
                self.h = NULL
                return False
            finally:
                os.close(shm_dir)
            self.created = True
        finally:
            os.close(fd)
            if tmp:
                try:
                    os.unlink(tmp)
                except FileNotFoundError:
                    pass
        return True

    # -- the lock --------------------------------------------------------------------------

    cdef int _lock(self) except -1:
        # Nests on one handle: lock() holds the mutex across a reader's claim
        # (LogChannel: the read, the hand-off and the move of read_pos as one
        # step against the other workers), and the operations it calls in
        # between lock again.  No greenlet switch happens while it is held.
        cdef int r
        self._open()
        if self.lock_depth:
            self.lock_depth += 1
            return 0
        # uncontended (nearly always: a FIN holds it for a few bit operations)
        # without letting go of the GIL, which costs more than the lock itself
        r = pthread_mutex_trylock(&self.h.lock.mutex)
        if r == EBUSY:
            with nogil:
                r = pthread_mutex_lock(&self.h.lock.mutex)
        if r == EOWNERDEAD:
            self._repair()
            pthread_mutex_consistent(&self.h.lock.mutex)
        elif r != 0:
            raise CursorError(f"cursor {self.name!r}: lock failed ({os.strerror(r)})")
        self.lock_depth = 1
        return 0

    cdef void _unlock(self) noexcept nogil:
        self.lock_depth -= 1
        if self.lock_depth == 0:
            pthread_mutex_unlock(&self.h.lock.mutex)

    def lock(self):
        """Hold the cursor's mutex until unlock(): a claim of the next run
        (read it, hand it on, move read_pos) made as one step against every
        other process.  Nests; C calls only in between (no yield)."""
        self._lock()

    def unlock(self):
        if self.lock_depth <= 0:
            raise CursorError(f"cursor {self.name!r}: not locked")
        self._unlock()

    cdef void _repair(self) noexcept:
        """The last holder died: finish its journalled advance or reset."""
        cdef nsqshm_cursor_header *h = self.h
        h.recoveries += 1
        if h.j_reset:
            memset(<void *>h.window, 0, self.bits // 8)
            h.finished = 0
            h.j_reset = 0
        elif h.j_to and h.confirmed == h.j_to:
            _clear_range(h.window, self.mask, h.j_from, h.j_to - h.j_from)
            h.finished = _popcount(h.window, self.bits // 64)
        h.j_to = 0

    # -- operations ------------------------------------------------------------------------

    cdef int _finish(self, uint64_t o) noexcept nogil:
        cdef nsqshm_cursor_header *h = self.h
        cdef uint64_t c = h.confirmed, n
        if o < c or h.read_pos == _READ_SEEK:
            return 1
        if o - c >= self.bits:
            return -1
        if _bit(h.window, o & self.mask):
            return 1
        h.window[(o & self.mask) >> 6] |= (<uint64_t>1) << (o & 63)
        h.finished += 1
        h.finish_total += 1
        if o == c:
            n = _run(h.window, self.mask, c, self.bits)
            h.j_from = c
            h.j_to = c + n
            __atomic_store_n(&h.confirmed, c + n, 3)
            if self.crash_test:  # the test suite: die between the commit and the clear
                kill(getpid(), 9)
            _clear_range(h.window, self.mask, c, n)
            h.finished -= n
            h.confirmed_total += n
            h.j_to = 0
        return 0

    def finish(self, unsigned long long offset):
        """Mark msg offset `offset` finished: FINISHED, ALREADY, or
        OUT_OF_WINDOW (refused: at or past confirmed + window_bits)."""
        cdef int r
        self._lock()
        r = self._finish(offset)
        self._unlock()
        return r

    def finish_many(self, offsets):
        """finish() each u64 of a buffer of native u64 offsets; the number
        newly finished (out-of-window ones are skipped: see finish)."""
        cdef Py_buffer view
        cdef Py_ssize_t i, n, done = 0
        cdef const uint64_t *p
        PyObject_GetBuffer(offsets, &view, 0)
        try:
            p = <const uint64_t *>view.buf
            n = view.len // 8
            self._lock()
            for i in range(n):
                if self._finish(p[i]) == 0:
                    done += 1
            self._unlock()
        finally:
            PyBuffer_Release(&view)
        return done

    def _finish_and_die_mid_advance(self, unsigned long long offset):
        """finish(offset), SIGKILLing this process after it committed the new
        confirmed offset and before it cleared the window (tests only)."""
        self.crash_test = True
        return self.finish(offset)

    def is_finished(self, unsigned long long offset):
        cdef bint r
        self._lock()
        c = self.h.confirmed
        r = offset < c or (offset - c < self.bits and _bit(self.h.window, offset & self.mask))
        self._unlock()
        return r

    # -- the retry table (layout: includes/commitlog_layout.h) ------------------------------

    cdef nsqshm_retry_slot *_retries(self) noexcept nogil:
        return <nsqshm_retry_slot *>(<char *>self.h + NSQSHM_CURSOR_HEADER + self.bits // 8)

    cdef bint _done(self, uint64_t o) noexcept nogil:
        """Whether msg offset o is finished (the lock held)."""
        cdef uint64_t c = self.h.confirmed
        return o < c or (o - c < self.bits and _bit(self.h.window, o & self.mask))

    cdef nsqshm_retry_slot *_retry_find(self, uint64_t o) noexcept nogil:
        """o's slot, or NULL (the lock held; no table: NULL)."""
        cdef uint32_t slots = self.slots, i, n
        cdef nsqshm_retry_slot *t = self._retries()
        if slots == 0:
            return NULL
        i = _retry_home(o, slots)
        for n in range(slots):
            if t[i].key == 0:
                return NULL
            if t[i].key == o + 1:
                return &t[i]
            i = (i + 1) & (slots - 1)
        return NULL

    cdef int _retry_put(self, uint64_t o, uint32_t attempts, int64_t due_ms) noexcept nogil:
        """Note o's attempts and due time (the lock held): 1 noted, 0 not (finished,
        or no table), -1 the table is full of live entries (counted in retry_dropped)."""
        cdef nsqshm_cursor_header *h = self.h
        cdef uint32_t slots = self.slots, i
        cdef nsqshm_retry_slot *t = self._retries()
        cdef nsqshm_retry_slot *e
        cdef uint64_t low
        if slots == 0 or self._done(o):
            return 0
        e = self._retry_find(o)
        if e == NULL:
            if (h.retry_used + 1) * 4 > slots * 3:
                # a compaction walks the whole table: after one that left it full of
                # live entries, the notes that find it full do not walk it again until
                # some entry may be stale -- the confirmed offset passed the lowest live
                # one, or slots / 64 messages were finished since -- or a quarter of its
                # size in notes went by: each walk then pays for many notes, where a walk
                # per note made a REQ storm over a full table cost ~14 us a note
                if self.compact_wait and h.confirmed <= self.compact_low and \
                        h.finish_total - self.compact_finishes < (slots >> 6 or 1):
                    self.compact_wait -= 1
                else:
                    low = self._retry_compact()
                    self.compact_wait = 0
                    if (h.retry_used + 1) * 4 > slots * 3:
                        self.compact_wait = slots >> 2
                        self.compact_low = low
                        self.compact_finishes = h.finish_total
                if (h.retry_used + 1) * 4 > slots * 3:
                    h.retry_dropped += 1
                    return -1
            i = _retry_home(o, slots)
            while t[i].key != 0:
                i = (i + 1) & (slots - 1)
            e = &t[i]
            h.retry_used += 1  # (first: a holder killed in between leaves it one too many)
            e.key = o + 1
        e.attempts = attempts
        e.due_ms = due_ms
        return 1

    cdef uint64_t _retry_compact(self) noexcept nogil:
        """Drop the stale entries (finished offsets), in place: each one's slot
        is emptied and the entries after it in its probe run shifted back
        (_retry_delete), so a holder killed midway leaves every live entry
        findable (at worst one twice: a finder takes the first).  -> the
        lowest live offset (2**64 - 1: none)."""
        cdef uint32_t i = 0
        cdef uint64_t low = 0xFFFFFFFFFFFFFFFF
        cdef nsqshm_retry_slot *t
        while i < self.slots:
            t = &self._retries()[i]
            if t.key and self._done(t.key - 1):
                self._retry_delete(i)  # (slot i may hold a shifted entry now: look again)
            else:
                if t.key and t.key - 1 < low:
                    low = t.key - 1
                i += 1
        return low

    cdef void _retry_delete(self, uint32_t i) noexcept nogil:
        """Empty slot i of the linear-probing table, moving back each entry of
        the run after it that would no longer be found (backward shift)."""
        cdef nsqshm_retry_slot *t = self._retries()
        cdef uint32_t m = self.slots - 1, j = i, home
        while True:
            j = (j + 1) & m
            if t[j].key == 0:
                break
            home = _retry_home(t[j].key - 1, self.slots)
            # t[j] stays when its home lies cyclically in (i, j]
            if (i <= j and i < home <= j) or (i > j and (home > i or home <= j)):
                continue
            t[i] = t[j]
            i = j
        t[i].key = 0
        if self.h.retry_used:
            self.h.retry_used -= 1

    cdef void _retry_clear(self) noexcept nogil:
        if self.slots:
            memset(<void *>self._retries(), 0, self.slots * sizeof(nsqshm_retry_slot))
        self.h.retry_used = 0

    cdef int _retry_rehash(self) except -1:
        """A segment of an older build keeps its retry entries at homes
        msg offset & (slots - 1): put each at its hashed home (_retry_home),
        then mark the table (retry_hashed).  The lock held.  A death midway
        loses some entries (what the table holds is a best effort), never
        leaves one unfindable once marked: the mark is stored last."""
        cdef uint32_t i, j, n = 0
        cdef nsqshm_retry_slot *t = self._retries()
        cdef nsqshm_retry_slot *live
        if self.h.retry_hashed or self.slots == 0:
            return 0
        live = <nsqshm_retry_slot *>malloc(self.slots * sizeof(nsqshm_retry_slot) + 1)
        if live == NULL:
            raise MemoryError()
        for i in range(self.slots):
            if t[i].key:
                live[n] = t[i]
                n += 1
        self._retry_clear()
        for i in range(n):
            j = _retry_home(live[i].key - 1, self.slots)
            while t[j].key != 0:
                j = (j + 1) & (self.slots - 1)
            t[j] = live[i]
        self.h.retry_used = n
        free(live)
        __atomic_store_n(&self.h.retry_hashed, 1, 3)
        return 0

    def note_retry(self, unsigned long long offset, unsigned int attempts, long long due_ms=0):
        """Note a message put back (retry_of's input; tests and the lone path):
        1 noted, 0 finished, -1 the table is full."""
        cdef int r
        self._lock()
        r = self._retry_put(offset, attempts, due_ms)
        self._unlock()
        return r

    def retry(self, unsigned long long offset):
        """(attempts, due ms) noted for an unfinished offset, or None."""
        cdef nsqshm_retry_slot *e
        self._lock()
        try:
            e = NULL if self._done(offset) else self._retry_find(offset)
            return None if e == NULL else (e.attempts, e.due_ms)
        finally:
            self._unlock()

    def retry_count(self):
        """How many live entries the table holds (what retries() would give,
        counted without making it: /stats asks for every channel and
        partition)."""
        cdef uint32_t i, n = 0
        cdef nsqshm_retry_slot *t
        self._lock()
        if self.h.retry_used:
            t = self._retries()
            for i in range(self.slots):
                if t[i].key and not self._done(t[i].key - 1):
                    n += 1
            if n == 0:  # nothing live: emptied, as retries() does (the next look is one load)
                self._retry_clear()
        self._unlock()
        return n

    def retries(self, unsigned long long end=0xFFFFFFFFFFFFFFFF):
        """The live entries below msg offset `end`, in offset order, as the wire
        has them (rpc CURSORS): RETRY_ENTRY bytes each, u64 BE msg offset, u16 BE
        attempts (at most 65535), i64 BE due unix ms (0: not deferred).  A table
        found to hold nothing live is emptied (the next look is one load)."""
        cdef uint32_t i, n = 0
        cdef nsqshm_retry_slot *t
        cdef nsqshm_retry_slot *live
        cdef unsigned char *q
        self._lock()
        if self.h.retry_used == 0:  # (nearly always: sent with every cursor, every 50 ms)
            self._unlock()
            return b""
        live = <nsqshm_retry_slot *>malloc(self.h.retry_used * sizeof(nsqshm_retry_slot))
        if live == NULL:
            self._unlock()
            raise MemoryError()
        try:
            t = self._retries()
            any_live = False
            for i in range(self.slots):
                if t[i].key and not self._done(t[i].key - 1):
                    any_live = True
                    if t[i].key - 1 < end and n < self.h.retry_used:
                        live[n] = t[i]
                        n += 1
            if not any_live:
                self._retry_clear()
            self._unlock()
            qsort(live, n, sizeof(nsqshm_retry_slot), _by_key)
            out = PyBytes_FromStringAndSize(NULL, n * RETRY_ENTRY_SIZE)
            q = <unsigned char *>PyBytes_AS_STRING(out)
            for i in range(n):
                _put_be(q, live[i].key - 1, 8)
                _put_be(q + 8, live[i].attempts if live[i].attempts < 0xFFFF else 0xFFFF, 2)
                _put_be(q + 10, <uint64_t>live[i].due_ms, 8)
                q += RETRY_ENTRY_SIZE
            return out
        finally:
            free(live)

    def set_retries(self, data, unsigned long long end):
        """Take a leader's retries() as this table (a follower), those below
        msg offset `end` (what this log holds) and not finished; how many."""
        cdef Py_buffer view
        cdef Py_ssize_t n = 0
        PyObject_GetBuffer(data, &view, 0)
        try:
            if view.len % RETRY_ENTRY:
                raise ValueError(f"a retry table of {view.len} bytes")
            self._lock()
            self._retry_clear()
            n = self._retry_load(<const unsigned char *>view.buf, view.len, end)
            self._unlock()
        finally:
            PyBuffer_Release(&view)
        return n

    cdef Py_ssize_t _retry_load(self, const unsigned char *p, Py_ssize_t size,
                                uint64_t end) noexcept nogil:
        """Note each entry of a retries() table below msg offset `end` (the lock
        held, or the segment not linked yet); how many were noted."""
        cdef Py_ssize_t pos = 0, n = 0
        cdef uint64_t o
        while size - pos >= RETRY_ENTRY_SIZE:
            o = _get_be(p + pos, 8)
            if o < end and self._retry_put(o, <uint32_t>_get_be(p + pos + 8, 2),
                                           <int64_t>_get_be(p + pos + 10, 8)) == 1:
                n += 1
            pos += RETRY_ENTRY_SIZE
        return n

    def retry_high(self):
        """One past the highest unfinished offset of the table (0: none)."""
        cdef uint32_t i
        cdef uint64_t high = 0
        cdef nsqshm_retry_slot *t
        self._lock()
        t = self._retries()
        for i in range(self.slots):
            if t[i].key > high and not self._done(t[i].key - 1):
                high = t[i].key
        self._unlock()
        return high

    @property
    def retry_stats(self):
        """(slots, slots taken, notes the full table dropped)."""
        self._open()
        return self.slots, self.h.retry_used, self.h.retry_dropped

    @property
    def confirmed(self):
        """Every msg offset below it is finished."""
        self._open()
        return __atomic_load_n(&self.h.confirmed, 2)

    @property
    def window_bits(self):
        return self.bits

    @property
    def window_end(self):
        """No offset at or past it can be finished yet: hold delivery there."""
        self._open()
        return __atomic_load_n(&self.h.confirmed, 2) + self.bits

    @property
    def finished_above(self):
        """How many offsets above confirmed are finished."""
        self._open()
        return self.h.finished

    @property
    def recoveries(self):
        self._open()
        return self.h.recoveries

    @property
    def direct_total(self):
        """Messages local consumers took straight from the log (count_direct)."""
        self._open()
        return __atomic_load_n(&self.h.direct_total, 2)

    def count_direct(self, unsigned long long n):
        """A local consumer took n messages from the log itself (no worker
        pushed them into the channel, so none counted them): the channel's
        message_count adds direct_total."""
        self._open()
        __atomic_fetch_add(&self.h.direct_total, n, 3)

    def set(self, unsigned long long offset, bint hold=False):
        """Move the cursor to `offset` (seek, or a reset to the log start or
        end): nothing above it is finished.  A seek (hold) is counted
        (`seeks`).  hold: read_pos is HELD, so the
        feeder pushes nothing of this partition until release(): a seek
        first clears the rings and arenas of what was pushed before it; a
        finish meanwhile marks nothing (it is of a message delivered from the
        old position)."""
        cdef nsqshm_cursor_header *h
        self._lock()
        h = self.h
        h.j_reset = 1
        __atomic_store_n(&h.confirmed, offset, 3)
        __atomic_store_n(&h.read_pos, _READ_SEEK if hold else offset, 3)
        if hold:
            # a seek delivers from `offset` again: nothing from there on went out
            # since, and a local consumer's copies from before are stale
            # (CursorSet.seeks_moved).  Counted after the hold is stored, so that a
            # look that sees the new count sees the hold too (seek_state).  A reset
            # without a hold (retention's move to the log start, a follower taking
            # its leader's cursor) leaves the copies above it valid, and what went out.
            __atomic_store_n(&h.delivered, offset, 3)
            __atomic_store_n(&h.seeks, h.seeks + 1, 3)
        elif h.delivered < offset:
            __atomic_store_n(&h.delivered, offset, 3)
        memset(<void *>h.window, 0, self.bits // 8)
        h.finished = 0
        h.j_reset = 0
        # what was put back before the move is not of the messages from there on
        # (a seek back would otherwise give old attempts and due times again)
        self._retry_clear()
        self._unlock()

    cdef long long _next(self, uint64_t start, uint64_t end) noexcept nogil:
        cdef uint64_t c = self.h.confirmed, lim = c + self.bits, o
        if start < c:
            start = c
        if end > lim:
            end = lim
        o = start
        while o < end:
            if (o & 63) == 0 and end - o >= 64 and \
                    ~self.h.window[(o & self.mask) >> 6] == 0:
                o += 64
                continue
            if not _bit(self.h.window, o & self.mask):
                return <long long>o
            o += 1
        return -1

    @property
    def read_pos(self):
        """Where the broker's reader goes on: msg offsets below it were
        pushed into the channel.  Never below confirmed (a fresh segment,
        made from a checkpoint, has 0: read from confirmed)."""
        self._open()
        cdef uint64_t r = __atomic_load_n(&self.h.read_pos, 2)
        cdef uint64_t c = __atomic_load_n(&self.h.confirmed, 2)
        return r if r > c else c

    @read_pos.setter
    def read_pos(self, unsigned long long offset):
        # under the lock and never over HELD: a feeder (on the partition's
        # owner) that read before another worker's seek held the cursor
        # must not undo the hold when its batch ends
        self._lock()
        if not _is_held(self.h.read_pos):
            __atomic_store_n(&self.h.read_pos, offset, 3)
        self._unlock()

    @property
    def delivered(self):
        """One past the highest msg offset put in flight to a client since the
        last set() (CursorSet.raise_delivered); on a follower, the leader's as
        it last sent it (rpc CURSORS)."""
        self._open()
        return __atomic_load_n(&self.h.delivered, 2)

    def set_delivered(self, unsigned long long offset):
        """A follower takes the leader's delivered mark (ReplicaHost.adopt_cursors)."""
        self._lock()
        __atomic_store_n(&self.h.delivered, offset, 3)
        self._unlock()

    @property
    def seeks(self):
        """How many times set() moved the cursor (0 in an old segment)."""
        self._open()
        return __atomic_load_n(&self.h.seeks, 2)

    @property
    def held(self):
        """A seek holds the cursor (set(hold=True)) until release(); False
        once closed."""
        if self.h == NULL:
            return False
        return _is_held(__atomic_load_n(&self.h.read_pos, 2))

    def hold(self):
        """Hold read_pos (as set(hold=True)) but keep confirmed and the
        finished set: a rewind to the confirmed offset (a partition's
        delivery moving to another ring) then pushes again only what is
        unfinished, once release(confirmed) ends the hold."""
        self._lock()
        if self.h.read_pos != _READ_SEEK:  # (a seek's hold stays one)
            __atomic_store_n(&self.h.read_pos, _READ_HELD, 3)
        self._unlock()

    def release(self, unsigned long long offset):
        """End a seek's hold: the feeder reads on from `offset`."""
        self._lock()
        if self.h.read_pos == _READ_SEEK:
            # every worker has dropped its copies from the old position by now
            # (LogChannel._move), but one's ring take after set() may have raised
            # the mark again (found in review)
            __atomic_store_n(&self.h.delivered, offset, 3)
        __atomic_store_n(&self.h.read_pos, offset, 3)
        self._unlock()

    def unfinished_run(self, unsigned long long start, unsigned long long end,
                       long long max_run=-1):
        """(o, n): the first unfinished msg offset o in [max(start,
        confirmed), min(end, window_end)) and how many unfinished ones
        follow it without a gap (o included), at most max_run (> 0) of
        them; (-1, 0) when there is none.  The reader reads a run in one
        call and steps over what was finished before a restart; max_run
        keeps the scan to what it can take (a run is counted bit by bit:
        without it a reader taking 200 scanned up to the window's 64 Ki)."""
        cdef long long o
        cdef uint64_t n = 0
        self._lock()
        o = self._run(start, end, max_run, &n)
        self._unlock()
        if o < 0:
            return -1, 0
        return o, n

    cdef long long _run(self, uint64_t start, uint64_t end, long long max_run,
                        uint64_t *count) noexcept nogil:
        """unfinished_run's (o, n) with the lock held: o, and n in count."""
        cdef long long o = self._next(start, end)
        cdef uint64_t lim, e
        if o < 0:
            count[0] = 0
            return o
        lim = self.h.confirmed + self.bits
        if end > lim:
            end = lim
        if max_run > 0 and end > <uint64_t>o + <uint64_t>max_run:
            end = <uint64_t>o + <uint64_t>max_run
        e = o + 1
        while e < end and not _bit(self.h.window, e & self.mask):
            e += 1
        count[0] = e - <uint64_t>o
        return o

    def claim_read(self, LogReader reader not None, unsigned long long end, Py_ssize_t room,
                   scratch):
        """Every reader's claim of a partition's next run (the owner's feeder
        and each worker's dispatcher, LogChannel; a local consumer): the
        unread, unfinished messages from read_pos below `end`, at most `room`,
        read into `scratch` (LogReader.read_into).  -> (first, n, nbytes):
        n > 0 records read from msg offset `first` (the caller hands them on,
        then moves read_pos past what it took, before it lets the lock go:
        it holds the lock across, as it nests); n 0: nothing now (first: 0
        while a seek holds the cursor, else the window's end when it is full,
        or read_pos); -1: read_pos moved past finished messages, none read;
        CLAIM_RETENTION: retention removed what it would read, `first` the
        log's start (the caller moves the cursor there once it lets go)."""
        self._lock()
        try:
            return self._claim_read(reader, end, room, scratch)
        finally:
            self._unlock()

    cdef tuple _claim_read(self, LogReader reader, uint64_t end, Py_ssize_t room, object scratch):
        """claim_read with the lock held."""
        cdef bint held
        cdef uint64_t pos = self._read_at(&held), start, run = 0, lim
        cdef long long first
        cdef Py_ssize_t n
        if held:
            return 0, 0, 0
        if pos >= end:
            return pos, 0, 0
        reader.refresh()
        start = reader.commit.start_offset
        if pos < start:
            return start, CLAIM_RETENTION, 0
        first = self._run(pos, end, room, &run)
        if first < 0:  # all finished up to the window's end (or the log's)
            lim = self.h.confirmed + self.bits
            if lim > end:
                lim = end
            if lim > pos:
                self._read_to(lim)
                return pos, -1, 0
            return lim, 0, 0  # the window is full: wait for FINs
        try:
            n, nbytes, _ = reader._read_into(<uint64_t>first, scratch, <Py_ssize_t>run, -1, False)
        except OffsetOutOfRange as err:
            return err.start_offset, CLAIM_RETENTION, 0
        if n == 0:
            return pos, 0, 0
        if <uint64_t>first < self.h.delivered or \
                (self.h.retry_used and <uint64_t>first == self.h.confirmed):
            self._claimed_attempts(<uint64_t>first, n, scratch)
        return first, n, nbytes

    cdef void _claimed_attempts(self, uint64_t first, Py_ssize_t n, object scratch):
        """The attempts of a run just claimed from the log (offsets first ..
        first + n - 1, packed in scratch) that went out before:
        - the partition's head (the record at the confirmed offset) put back
          before (its retry table entry: a REQ, a timeout, here or on the
          partition's old leader, rpc CURSORS) gets the entry's, so that its
          delivery counts on from them: an ordered lane's head is read from
          the log again rather than put back whole (CursorSet.heads_only),
          whoever reads it next (the feeder, a dispatcher, a local consumer),
          on this node, after a restart or after a failover (one probe per
          claim at most; a plain channel's other put-back messages go out of
          the ring or are taken up with theirs, LogChannel.take_up_retries);
        - any other below the delivered mark went out once and was never put
          back (in flight when a rewind took it back, or when this node's
          old leader died): attempts 1, so that it comes as its 2nd
          (CursorSet.retry_of).
        nsqd's message starts [8 BE timestamp][2 BE attempts], the top bit of
        the attempts a time to live's (includes/message_expiry.h), kept.  The
        lock held."""
        cdef Py_buffer view
        cdef unsigned char *p
        cdef uint32_t size, attempts, noted
        cdef Py_ssize_t pos = 0, k
        cdef uint64_t delivered = self.h.delivered
        cdef nsqshm_retry_slot *e = NULL
        if first == self.h.confirmed and self.h.retry_used and self.slots:
            e = self._retry_find(first)
        PyObject_GetBuffer(scratch, &view, PyBUF_WRITABLE)
        try:
            p = <unsigned char *>view.buf
            for k in range(n):
                if e == NULL and first + <uint64_t>k >= delivered:
                    break
                if view.len - pos < 14:
                    return
                memcpy(&size, p + pos, 4)
                if size < 10 or size > view.len - pos - 4:
                    return
                noted = 1 if first + <uint64_t>k < delivered else 0
                if e != NULL:
                    noted = e.attempts if e.attempts < 0x7FFF else 0x7FFF
                    e = NULL
                attempts = ((<uint32_t>p[pos + 12] & 0x7F) << 8) | p[pos + 13]
                if noted > attempts:
                    p[pos + 12] = (p[pos + 12] & 0x80) | <unsigned char>(noted >> 8)
                    p[pos + 13] = <unsigned char>(noted & 0xFF)
                pos += 4 + size
        finally:
            PyBuffer_Release(&view)

    cdef uint64_t _read_at(self, bint *held) noexcept nogil:
        """read_pos as the property gives it (never below confirmed); held:
        whether a seek holds it.  The lock held."""
        cdef uint64_t r = self.h.read_pos, c = self.h.confirmed
        held[0] = _is_held(r)
        return r if r > c else c

    cdef void _read_to(self, uint64_t offset) noexcept nogil:
        """read_pos = offset unless a seek holds it (the setter's rule); the
        lock held."""
        if not _is_held(self.h.read_pos):
            __atomic_store_n(&self.h.read_pos, offset, 3)

    def next_unfinished(self, unsigned long long start, unsigned long long end):
        """The first unfinished msg offset in [max(start, confirmed),
        min(end, window_end)), or -1 (end is the log's end offset)."""
        cdef long long r
        self._lock()
        r = self._next(start, end)
        self._unlock()
        return r

    def unfinished_into(self, unsigned long long start, unsigned long long end, out):
        """Write the unfinished msg offsets of [max(start, confirmed),
        min(end, window_end)) into `out` as native u64s, as many as fit;
        how many were written."""
        cdef Py_buffer view
        cdef Py_ssize_t n = 0, room
        cdef uint64_t *p
        cdef long long o
        PyObject_GetBuffer(out, &view, PyBUF_WRITABLE)
        try:
            p = <uint64_t *>view.buf
            room = view.len // 8
            self._lock()
            o = start
            while n < room:
                o = self._next(o, end)
                if o < 0:
                    break
                p[n] = o
                n += 1
                o += 1
            self._unlock()
        finally:
            PyBuffer_Release(&view)
        return n

    # -- checkpoint ---------------------------------------------------------------------------

    def snapshot(self):
        """(confirmed, the window's bytes) taken together: a checkpoint's, and
        what a partition's leader sends its followers (ReplicaHost.cursor_states;
        window_offsets reads it back)."""
        cdef bytes window = PyBytes_FromStringAndSize(NULL, self.bits // 8)
        self._lock()
        confirmed = self.h.confirmed
        memcpy(PyBytes_AS_STRING(window), <void *>self.h.window, self.bits // 8)
        self._unlock()
        return confirmed, window

    def checkpoint(self):
        """Write confirmed, the window and the retry table to the checkpoint
        file: a temp file, fsynced, renamed over it (a crash leaves the old or
        the new).  The layout: magic, u32 BE crc32c of the rest, then

            | u64 BE confirmed | u32 BE window bits | window | retries() ... |"""
        if not self.checkpoint_file:  # Cursor.attach: a client's view, not its owner's
            raise CursorError(f"cursor {self.name!r} has no checkpoint file here")
        self._lock()
        try:  # (one lock over both: the retries are those of that window)
            confirmed, window = self.snapshot()
            retries = self.retries()
        finally:
            self._unlock()
        body = confirmed.to_bytes(8, "big") + self.bits.to_bytes(4, "big") + window + retries
        # (the first layout when there is no table to keep: a build before it reads that)
        data = (CHECKPOINT_MAGIC if retries else CHECKPOINT_MAGIC_V1) + nsqshm_crc32c(0, <const char *>body, len(body)).to_bytes(
            4, "big") + body
        tmp = f"{self.checkpoint_file}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, self.checkpoint_file)
        return confirmed

    cdef int _open(self) except -1:
        """A call on a closed cursor raises rather than dereference NULL (a
        channel deleted while a request still holds its cursor): _lock asks
        it, and each Python-facing read that takes no lock."""
        if self.h == NULL:
            raise CursorError(f"cursor {self.name} closed")
        return 0

    def close(self):
        if self.h != NULL:
            munmap(self.h, self.size)
            self.h = NULL

    def unlink(self):
        """Remove the segment and the checkpoint (the channel is deleted)."""
        for path in (f"{SHM_DIR}/{self.name}", self.checkpoint_file):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def __dealloc__(self):
        if self.h != NULL:
            munmap(self.h, self.size)


def _read_checkpoint(str path, unsigned long long window_bits):
    """(confirmed, window bytes, retry table) from a checkpoint file, (None,
    None, b"") if there is none; CursorError if it is corrupt.  (A checkpoint
    of the first layout, NSQLCUR1, has no retry table.)"""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None, None, b""
    body = data[12:]
    if data[:8] not in (CHECKPOINT_MAGIC, CHECKPOINT_MAGIC_V1) or len(body) < 12 or \
            nsqshm_crc32c(0, <const char *>body, len(body)) != int.from_bytes(data[8:12], "big"):
        raise CursorError(f"cursor checkpoint {path} is corrupt")
    bits = int.from_bytes(body[8:12], "big")
    confirmed = int.from_bytes(body[:8], "big")
    size = 12 + bits // 8
    if bits < 64 or bits & (bits - 1) or len(body) < size or \
            (data[:8] == CHECKPOINT_MAGIC_V1 and len(body) != size) or \
            (len(body) - size) % RETRY_ENTRY:
        raise CursorError(f"cursor checkpoint {path} is corrupt")
    retries = bytes(body[size:])
    if bits != window_bits:
        # another window size: keep confirmed; finishes above it are redelivered
        return confirmed, None, retries
    return confirmed, bytes(body[12:size]), retries


# -- finishing by message ID ---------------------------------------------------------------
#
# A message of a log topic carries its position in its ID: 16 lowercase hex
# digits of (partition << ID_OFFSET_BITS) | msg offset, stamped at append
# (PartitionLog.append_packed).  A FIN reaches the cursor with no lookup.

FAULT_DIE_IN_FIN_ENV = "NSQSHM_FAULT_DIE_IN_FIN"  # tests: CursorSet._fault
cdef int BATCH_HOLD_FINS = 256  # a batch of FINs lets a cursor go after this many




def log_message_id(unsigned int partition, unsigned long long offset):
    """The ID of the message at msg offset `offset` of partition `partition`."""
    return b"%016x" % ((<unsigned long long>partition << 48) | offset)


def decode_message_id(msg_id):
    """(partition, msg offset) of a log message ID, or None."""
    cdef bytes b = bytes(msg_id)
    cdef uint64_t off = 0
    cdef long long p
    if len(b) != 16:
        return None
    p = decode_log_id(b, &off)
    return None if p < 0 else (p, off)


@cython.boundscheck(False)
@cython.wraparound(False)
def split_by_partition(packed, Py_ssize_t partitions):
    """Packed [u32 native size][message] records split by the partition of
    their log message ID: a list of partitions + 1 bytearrays, the last with
    the records whose ID names no partition below `partitions`, each in the
    records' order.  Two C passes, no object per record (what goes back into
    a channel's lanes: LogChannel._put_back, a local consumer's REQs and
    timeouts).  ValueError for a record cut short."""
    cdef Py_buffer view
    cdef const char *p
    cdef char *dst
    cdef Py_ssize_t pos, total
    cdef Py_ssize_t *sizes = NULL
    cdef Py_ssize_t *fill
    cdef uint32_t size
    cdef uint64_t off = 0
    cdef long long part
    if partitions < 0 or partitions > MAX_PARTITIONS:
        raise ValueError(f"{partitions} partitions")
    PyObject_GetBuffer(packed, &view, 0)
    try:
        sizes = <Py_ssize_t *>malloc(2 * (partitions + 1) * sizeof(Py_ssize_t))
        if sizes == NULL:
            raise MemoryError()
        fill = sizes + partitions + 1
        memset(sizes, 0, 2 * (partitions + 1) * sizeof(Py_ssize_t))
        p = <const char *>view.buf
        total = view.len
        pos = 0
        while pos < total:  # the bytes of each partition's
            size = packed_record_size(p, total, pos, RECORD_ID_END)
            part = decode_log_id(p + pos + 4 + RECORD_ID_OFFSET, &off)
            if part < 0 or part >= partitions:
                part = partitions
            sizes[part] += 4 + size
            pos += 4 + size
        out = [bytearray(sizes[i]) for i in range(partitions + 1)]
        pos = 0
        while pos < total:
            # checked again: a buffer another process writes to may have changed
            size = packed_record_size(p, total, pos, RECORD_ID_END)
            part = decode_log_id(p + pos + 4 + RECORD_ID_OFFSET, &off)
            if part < 0 or part >= partitions:
                part = partitions
            if fill[part] + 4 + <Py_ssize_t>size > sizes[part]:
                raise ValueError("the records changed while they were split")
            dst = PyByteArray_AS_STRING(out[part])
            memcpy(dst + fill[part], p + pos, 4 + size)
            fill[part] += 4 + size
            pos += 4 + size
        return out
    finally:
        PyBuffer_Release(&view)
        free(sizes)


def window_offsets(unsigned long long confirmed, window, unsigned long long end):
    """The msg offsets a snapshot's window (Cursor.snapshot: native u64 words,
    a power-of-two number of bits) marks finished above `confirmed`, those
    below `end` only, as a bytearray of native u64s (Cursor.finish_many's
    input).  ValueError for a window that is not a power of two of bits."""
    cdef Py_buffer view
    cdef const uint64_t *w
    cdef uint64_t bits, mask, i, o, base
    cdef Py_ssize_t n = 0
    PyObject_GetBuffer(window, &view, 0)
    try:
        bits = <uint64_t>view.len * 8
        if view.len % 8 or bits == 0 or bits & (bits - 1):
            raise ValueError(f"a cursor window of {view.len} bytes")
        mask = bits - 1
        w = <const uint64_t *>view.buf
        out = bytearray(_popcount(w, bits >> 6) * 8)
        n = 0
        base = confirmed & mask
        for i in range(bits):
            if _bit(w, i):
                o = confirmed + ((i - base) & mask)
                if o < end:
                    (<uint64_t *>PyByteArray_AS_STRING(out))[n] = o
                    n += 1
        del out[n * 8:]
        return out
    finally:
        PyBuffer_Release(&view)


cdef class CursorSet:
    """A channel's cursors, one per partition (None until attached): FIN by
    message ID in C (wire.fin_lines), no Python object per message."""

    def __init__(self, int partitions):
        if partitions < 0:
            raise ValueError("partitions < 0")
        self.cursors = [None] * partitions
        self.count = partitions
        self.fault_path = os.environ.get(FAULT_DIE_IN_FIN_ENV) or None
        self.held = -2
        self.held_cur = None
        self.batch_depth = 0

    def __dealloc__(self):
        free(self.seen)

    def guard_seeks(self):
        """Take part in seeks as a local consumer (nsqshm.local) must: the
        broker's workers take their clients' copies of a seeked partition out
        of flight while the seek holds its cursor (LogChannel.seek), but not
        a local consumer's, which only the consumer's own process touches.
        So a guarded set remembers, per partition, the cursor's seek count
        its copies were taken at (every cursor attached first); a FIN of a
        partition whose cursor was seeked since marks nothing (STALE: the
        copy is of the old position, and the seek delivers that offset
        again), and the consumer drops such copies (seeks_moved) before it
        finishes, requeues or takes more (seek_state, under a ring's lock)."""
        cdef Py_ssize_t p
        cdef Cursor cur
        if self.seen == NULL:
            self.seen = <uint64_t *>calloc(max(self.count, 1), sizeof(uint64_t))
            if self.seen == NULL:
                raise MemoryError()
        for p in range(self.count):
            cur = self._attached(p)
            if cur is None:
                raise CursorError(f"partition {p}: no cursor attached to guard")
            self.seen[p] = __atomic_load_n(&cur.h.seeks, 2)
        self.guarded = True

    def seeks_moved(self, long long partition=-1):
        """The partitions (or the one given) whose cursor was seeked since
        their copies here were taken, each now counted as seen: the caller
        drops what it holds of them (under its cursor's lock, for a claim
        from the log to follow at the new position).  [] when not guarded."""
        cdef Py_ssize_t p, lo = 0, hi = self.count
        cdef uint64_t n
        cdef Cursor cur
        out = []
        if not self.guarded:
            return out
        if partition >= 0:
            if partition >= self.count:
                raise IndexError(f"partition {partition}")
            lo, hi = partition, partition + 1
        for p in range(lo, hi):
            cur = self._attached(p)
            if cur is None:
                continue
            n = __atomic_load_n(&cur.h.seeks, 2)
            if n != self.seen[p]:
                self.seen[p] = n
                out.append(p)
        return out

    cdef int seek_state(self) noexcept:
        """For a take from a ring (under the ring's consumer lock, which a
        seek's drain of the ring takes too): 0 when the take may go on, its
        records counted at the seen seek counts; SEEKS_MOVED when a seek was
        made since (its drain is done: the caller drops its stale copies,
        seeks_moved, and takes again); SEEK_HOLDS while a seek holds a cursor,
        or a partition's move into a lane does (Cursor.hold): the ring may
        still hold records from the old position: take nothing now.  Atomic loads, no cursor lock (a worker's sampled delivery
        takes a cursor's lock under a ring's).  0 when not guarded."""
        cdef Py_ssize_t p
        cdef Cursor cur
        cdef int state = 0
        if not self.guarded:
            return 0
        for p in range(self.count):
            cur = self._attached(p)
            if cur is None:
                continue
            if _is_held(__atomic_load_n(&cur.h.read_pos, 2)):
                return SEEK_HOLDS  # (a seek's, or a lane move's: LogChannel.use_lanes)
            if __atomic_load_n(&cur.h.seeks, 2) != self.seen[p]:
                state = SEEKS_MOVED
        return state

    def seek_state_now(self):
        """seek_state (tests)."""
        return self.seek_state()

    cdef void raise_delivered(self, long long partition, uint64_t end) noexcept:
        """Messages of a partition below msg offset `end` were put in flight
        (InFlight.deliver, once per run of one partition): its cursor's
        delivered mark goes up to `end` if below it.  Atomic, no lock: a
        CAS loop that only raises."""
        cdef Cursor cur = self._attached(partition)
        cdef uint64_t now
        if cur is None:
            return
        now = __atomic_load_n(&cur.h.delivered, 2)
        while now < end:
            if __atomic_compare_exchange_n(&cur.h.delivered, &now, end, False, 3, 2):
                return

    cdef void raise_delivered_id(self, const char *msg_id) noexcept:
        """raise_delivered past a log message ID (a DeliveredRun's highest)."""
        cdef uint64_t offset = 0
        cdef long long partition = decode_log_id(msg_id, &offset)
        if partition >= 0:
            self.raise_delivered(partition, offset + 1)

    def raise_delivered_now(self, long long partition, unsigned long long end):
        """raise_delivered (tests)."""
        self.raise_delivered(partition, end)

    cdef void batch_begin(self) noexcept:
        """A batch of FINs follows (a client's read of FIN lines, a local
        consumer's finish of a batch): a cursor locked for one stays locked
        for the next of the same partition, until one of another partition,
        BATCH_HOLD_FINS of them (others get a turn), or batch_end.  A batch's
        messages come in runs by partition, so a run costs one lock of the
        process-shared mutex, not one per message; at most one cursor is held
        at a time (no order between two locks), for no longer than the batch.
        Nests: the outermost batch_end lets go."""
        self.batch_depth += 1
        if self.held == -2:
            self.held = -1

    cdef void batch_end(self) noexcept:
        if self.batch_depth > 1:
            self.batch_depth -= 1
            return
        self.batch_depth = 0
        self._let_go()
        self.held = -2

    cdef void _let_go(self) noexcept:
        """Unlock the cursor a batch holds (the object it locked, whatever
        its slot holds now)."""
        cdef Cursor cur = self.held_cur
        self.held_cur = None
        if self.held >= 0:
            self.held = -1
        if cur is not None and cur.h != NULL and cur.lock_depth > 0:
            cur._unlock()

    def __len__(self):
        return self.count

    cdef Cursor _attached(self, long long partition):
        """The partition's cursor when one is attached and open, else None."""
        if partition < 0 or partition >= self.count:
            return None
        cur = self.cursors[partition]
        if cur is None or (<Cursor>cur).h == NULL:
            return None
        return <Cursor>cur

    cdef long long confirmed_of(self, const char *msg_id, uint64_t *offset,
                                uint64_t *confirmed) noexcept:
        """The partition of a log message ID (16 bytes at msg_id) whose cursor
        is attached, with the message's offset and the cursor's confirmed
        one; -1 for an ID that names no attached cursor's message."""
        cdef long long part = decode_log_id(msg_id, offset)
        cdef Cursor cur = self._attached(part)
        if cur is None:
            return -1
        confirmed[0] = __atomic_load_n(&cur.h.confirmed, 2)
        return part

    def __getitem__(self, int partition):
        return self.cursors[partition]

    def __setitem__(self, int partition, cursor):
        if cursor is not None and not isinstance(cursor, Cursor):
            raise TypeError("a Cursor or None")
        if self.held == partition:
            self._let_go()  # (a batch holds the one replaced)
        self.cursors[partition] = cursor
        if self.guarded and self._attached(partition) is not None:
            self.seen[partition] = __atomic_load_n(&(<Cursor>cursor).h.seeks, 2)

    @cython.boundscheck(False)
    @cython.wraparound(False)
    cdef long long find_id(self, const char *msg_id, uint64_t *offset) noexcept:
        """The partition of a log message ID whose cursor is attached here
        (its msg offset in *offset); -1: not a log message ID of this
        channel (nothing to finish); -2: its cursor is not attached yet (the
        caller attaches it first, in Python)."""
        cdef long long p = decode_log_id(msg_id, offset)
        if p < 0 or p >= self.count:
            return -1
        if self.cursors[p] is None:
            return -2
        return p

    @cython.boundscheck(False)
    @cython.wraparound(False)
    cdef int finish_at(self, long long partition, uint64_t offset) except -2:
        """Mark msg offset `offset` of a partition find_id returned finished:
        FINISHED, ALREADY, OUT_OF_WINDOW, or -1 (no cursor, or closed)."""
        cdef Cursor cur
        cdef int r
        if self.fault_path is not None:
            if self.held >= 0:
                self._let_go()  # (the test's death finds no lock held for another FIN)
            self._fault()
        if partition < 0 or partition >= self.count:
            return -1
        obj = self.cursors[partition]
        if obj is None:
            return -1
        cur = <Cursor>obj  # (__setitem__ takes a Cursor or None only)
        if cur.h == NULL:
            return -1
        if self.held == -2:
            cur._lock()
            r = STALE if self.guarded and cur.h.seeks != self.seen[partition] else \
                cur._finish(offset)
            cur._unlock()
            return r
        if self.held != partition or self.held_cur is not cur or \
                self.held_fins >= BATCH_HOLD_FINS:
            # (a batch: the last partition's lock goes first; after BATCH_HOLD_FINS of one
            # run it is let go and taken again, so that other processes get a turn)
            self._let_go()
            cur._lock()
            self.held = partition
            self.held_cur = cur
            self.held_fins = 0
        self.held_fins += 1
        if self.guarded and cur.h.seeks != self.seen[partition]:
            return STALE  # (under the lock: the seek's count cannot move meanwhile)
        return cur._finish(offset)

    cdef int has_id(self, const char *msg_id) noexcept:
        """1 when the ID's partition has its cursor here (0: the caller
        attaches it first, in Python)."""
        cdef uint64_t off
        return self.find_id(msg_id, &off) != -2

    cdef int finish_id(self, const char *msg_id) except -2:
        """Mark the message finished in its partition's cursor: FINISHED,
        ALREADY, OUT_OF_WINDOW, or -1 (not a log message ID, or no cursor)."""
        cdef uint64_t off = 0
        cdef long long p = decode_log_id(msg_id, &off)
        if p < 0 or p >= self.count:
            if self.fault_path is not None:
                self._fault()
            return -1
        return self.finish_at(p, off)

    cdef int stale_id(self, const char *msg_id) noexcept:
        """1 when what a cursor move leaves stale: a log message ID below its
        cursor's confirmed offset, or of a partition whose cursor a seek holds
        (LogChannel._drop_moved); 0 otherwise, and for an ID that is not a
        log message's or whose cursor is not attached."""
        cdef uint64_t off = 0
        cdef long long p = decode_log_id(msg_id, &off)
        cdef Cursor cur = self._attached(p)
        if cur is None:
            return 0
        if _is_held(__atomic_load_n(&cur.h.read_pos, 2)):
            return 1
        return off < __atomic_load_n(&cur.h.confirmed, 2)

    cdef int retry_of(self, const char *msg_id, uint32_t *attempts, int64_t *due_ms) except -1:
        """1 and a log message's noted attempts and due ms when its cursor's
        retry table has it (unfinished); else, unfinished below the cursor's
        delivered mark (it went out once and was in flight, on this node or
        on the partition's old leader, and was never put back), 1 with
        attempts 1 and due 0; else 0."""
        cdef uint64_t off = 0
        cdef long long p = decode_log_id(msg_id, &off)
        cdef Cursor cur
        cdef nsqshm_retry_slot *e = NULL
        cdef int found = 0
        if p < 0 or p >= self.count or self.cursors[p] is None:
            return 0
        cur = <Cursor>self.cursors[p]
        if cur.h == NULL:
            return 0
        cur._lock()
        if not cur._done(off):
            e = cur._retry_find(off) if cur.slots else NULL
            if e != NULL:
                attempts[0] = e.attempts
                due_ms[0] = e.due_ms
                found = 1
            elif off < cur.h.delivered:
                attempts[0] = 1
                due_ms[0] = 0
                found = 1
        cur._unlock()
        return found

    def heads_only(self, packed):
        """The packed [u32 native size][message] records of packed whose msg
        offset is their cursor's confirmed one, as a new bytearray: what may go
        back into an ordered lane (its partition's head, the one unfinished
        message below every other).  The others are finished (below it) or
        are read from the log again by the lane's feeder, which reads on from
        the confirmed offset one message at a time: pushed, they would be a
        second message of the partition out at once (a copy a consumer took
        before the partition's move into the lane).  One C loop."""
        return self._by_confirmed(packed, True, False)

    def unconfirmed(self, packed, bint skip_held=False):
        """The packed [u32 native size][message] records of packed that are not
        below their cursor's confirmed offset, as a new bytearray (a record
        that is not a log message of an attached cursor is kept): what may go
        back into the channel.  One below it is finished already -- a copy
        held across /channel/empty, which moves the cursors to the log's end
        without a seek's hold -- and would go out once more.  skip_held: also
        drop the records of a cursor a seek holds (its feeder reads them again
        from the new position).  One C loop."""
        return self._by_confirmed(packed, False, skip_held)

    @cython.boundscheck(False)
    @cython.wraparound(False)
    cdef bytearray _by_confirmed(self, packed, bint heads, bint skip_held):
        """heads_only (heads) or unconfirmed."""
        cdef Py_buffer view
        cdef const char *p
        cdef char *dst
        cdef Py_ssize_t pos = 0, kept = 0
        cdef uint32_t size
        cdef uint64_t off = 0, confirmed
        cdef long long part
        cdef Cursor cur
        cdef bint keep
        PyObject_GetBuffer(packed, &view, 0)
        try:
            p = <const char *>view.buf
            out = bytearray(view.len)
            dst = PyByteArray_AS_STRING(out)
            while pos < view.len:
                size = packed_record_size(p, view.len, pos, RECORD_ID_END)
                part = decode_log_id(p + pos + 4 + RECORD_ID_OFFSET, &off)
                cur = self._attached(part)
                if cur is None:
                    keep = not heads
                else:
                    confirmed = __atomic_load_n(&cur.h.confirmed, 2)
                    keep = off == confirmed if heads else off >= confirmed
                    if skip_held and _is_held(__atomic_load_n(&cur.h.read_pos, 2)):
                        keep = False
                if keep:
                    memcpy(dst + kept, p + pos, 4 + size)
                    kept += 4 + size
                pos += 4 + size
        finally:
            PyBuffer_Release(&view)
        del out[kept:]
        return out

    def note_retries(self, packed, long long due_ms=0):
        """Note in their cursors' retry tables the messages of packed [u32 native
        size][message] records put back into the channel (a REQ, a timeout, a dead
        worker's) or deferred until unix ms due_ms: their attempts (the record's),
        so that a partition's next leader delivers them as this one would.  One C
        loop; how many were noted (a finished one, or one a full table cannot
        take, is not; nor one never delivered: a ring's records taken back by a
        seek or deferred for room)."""
        cdef Py_buffer view
        cdef const unsigned char *p
        cdef Py_ssize_t pos = 0, done = 0
        cdef uint32_t size, attempts
        cdef uint64_t off = 0
        cdef long long part
        cdef Cursor cur
        PyObject_GetBuffer(packed, &view, 0)
        try:
            p = <const unsigned char *>view.buf
            while pos < view.len:
                size = packed_record_size(<const char *>p, view.len, pos, RECORD_ID_END)
                part = decode_log_id(<const char *>p + pos + 4 + RECORD_ID_OFFSET, &off)
                # attempts: [8 BE timestamp][2 BE attempts] of nsqd's encoding, the
                # top bit a message's time to live (includes/message_expiry.h)
                attempts = ((<uint32_t>p[pos + 12] & 0x7F) << 8) | p[pos + 13]
                if attempts == 0:
                    pass  # never delivered (a ring's overflow, a seek's take-back): nothing
                elif 0 <= part < self.count and self.cursors[part] is not None:
                    cur = <Cursor>self.cursors[part]
                    if cur.h != NULL and cur.slots:
                        cur._lock()
                        if cur._retry_put(off, attempts, due_ms) == 1:
                            done += 1
                        cur._unlock()
                pos += 4 + size
        finally:
            PyBuffer_Release(&view)
        return done

    def is_stale(self, msg_id):
        """stale_id for one ID (tests)."""
        cdef bytes b = bytes(msg_id)
        return len(b) == 16 and self.stale_id(b) == 1

    def _fault(self):
        """The test suite (FAULT_DIE_IN_FIN_ENV, a path): while the file
        exists, the next FIN removes it and SIGKILLs this process before
        the cursor is marked, to show what a death inside a FIN leaves."""
        try:
            os.unlink(self.fault_path)
        except FileNotFoundError:
            return
        kill(getpid(), 9)

    def finish_records(self, packed):
        """Mark finished, each in its cursor, the messages of packed
        [u32 native size][message] records: messages that left the channel
        without a FIN (a time to live, the dead-letter topic), else its
        confirmed offset would stay below them.  One C loop; returns how
        many were newly finished."""
        cdef Py_buffer view
        cdef const char *p
        cdef Py_ssize_t pos = 0
        cdef uint32_t size
        cdef Py_ssize_t done = 0
        PyObject_GetBuffer(packed, &view, 0)
        try:
            p = <const char *>view.buf
            while pos < view.len:
                size = packed_record_size(p, view.len, pos, RECORD_ID_END)
                if self.finish_id(p + pos + 4 + RECORD_ID_OFFSET) == 0:
                    done += 1
                pos += 4 + size
        finally:
            PyBuffer_Release(&view)
        return done

    def finish(self, msg_id):
        """finish_id for one ID (the lone FIN path)."""
        cdef bytes b = bytes(msg_id)
        if len(b) != 16:
            return -1
        return self.finish_id(b)
