"""The commit log of a log topic's partition: append-only segment files
written by one process (the partition's owner), read through mmap by any
process on the host.

The byte layouts (records, indexes, the state block) are drawn in
includes/commitlog_layout.h.  In short:

* PartitionLog (the writer) appends batches packed as the rings hand them
  over ([u32 native size][message]...), giving each message the next msg
  offset.  A batch is laid out (record header, crc, message) in a staging
  buffer and written with one pwrite per segment it touches, then the
  sparse index entries it crossed, then it is committed: the state block's
  generation store publishes the new end to every reader.  pwrite, not
  stores through a shared mapping: on ext4 a store into a fresh page costs a
  page fault per 4 KiB and a full disk would be SIGBUS instead of ENOSPC
  (measured here: 1 MiB pwrites into a new file ran at 5.3 GB/s, memcpy
  into a preallocated mmap'd one at 2.7 GB/s).
* LogReader (any process) maps each segment read-only once, with a length
  of segment_bytes, so a growing segment needs no remap; it reads the
  commit, then copies whole records up to it as packed ring records
  ([u32 native size][message]), ready to be framed by the existing code.
* A writer opening a partition scans its last segment from the last index
  entry, checking each record's crc, truncates a torn tail at the last good
  record and rebuilds indexes that are missing or behind.
* apply_retention deletes whole old segments (never the active one):
  it first commits the new log start, so a reader behind it gets
  OffsetOutOfRange (a status to act on: move to start_offset), never a
  crash -- a segment it already has mapped stays readable until it lets go.

No Python object is made per message on the append and read paths.
"""

import os
import re
import shutil
import time

from cpython.buffer cimport PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc, realloc

from nsqshm._core.codec cimport hex_id
from nsqshm._core.includes.system cimport (
    MAP_FAILED, MAP_SHARED, PROT_READ, PROT_WRITE, close, errno, memcpy, memset, mmap, munmap,
)

cdef extern from "<unistd.h>" nogil:
    ssize_t pwrite(int fd, const void *buf, size_t n, long offset)
    ssize_t pread(int fd, void *buf, size_t n, long offset)
    int ftruncate(int fd, long length)
    int fsync(int fd)
    int fdatasync(int fd)

cdef extern from "<sys/file.h>" nogil:
    int flock(int fd, int op)
    int LOCK_EX
    int LOCK_NB

cdef extern from "<time.h>" nogil:
    struct timespec:
        long tv_sec
        long tv_nsec
    int clock_gettime(int clk, timespec *ts)


cdef extern from "<string.h>" nogil:
    int memcmp(const void *a, const void *b, size_t n)


RECORD_HEADER = NSQSHM_LOG_RECORD_HEADER
MESSAGE_HEADER = 26                  # nsqd's: timestamp 8, attempts 2, ID 16
DEFAULT_SEGMENT_BYTES = 100 << 20
MAX_SEGMENT_BYTES = 1 << 30          # file positions are u32 in the index
DEFAULT_INDEX_INTERVAL = 4096
DEFAULT_MAX_MSG_SIZE = 1024768       # nsqd's --max-msg-size
MAX_PARTITIONS = 1024
# a log topic's message ID holds (partition << ID_OFFSET_BITS) | msg offset, stamped in
# append_packed (logcursor finishes by it): no offset at or past MAX_OFFSETS
ID_OFFSET_BITS = 48
MAX_OFFSETS = 1 << ID_OFFSET_BITS
TOPIC_NAME_MAX = 64
STATE_FILE = "state"
DIR_SUFFIX = ".nsqlog"
cdef Py_ssize_t STAGING = 4 << 20
cdef const char *INDEX_MAGIC = b"NSQLIDX1"
cdef const char *TIME_MAGIC = b"NSQLTIM1"
_TOPIC_RE = re.compile(r"^[.a-zA-Z0-9_-]+(#ephemeral)?$")
_SEGMENT_RE = re.compile(r"^([0-9]{20})\.log$")
_LOG_FILE_RE = re.compile(r"^[0-9]{20}\.(log|index|timeindex)$")


class LogError(Exception):
    """A partition log cannot be used as asked."""


class LogNotMade(LogError):
    """The partition's log state is not made yet: no file, or its owner has not
    committed it the first time (a reader opened it between the owner's creation
    and that commit; another worker's /stats can, right after a topic's creation)."""


class LogCorruptError(LogError):
    """A committed record fails its checks (size, msg offset or crc)."""


class OffsetOutOfRange(LogError):
    """The position is before the log start (retention removed it) or past
    the committed end.  .start_offset and .end_offset say what is there."""

    def __init__(self, msg, start_offset, end_offset):
        super().__init__(msg)
        self.start_offset = start_offset
        self.end_offset = end_offset


class NotABoundary(LogError):
    """A virtual offset that is not the first byte of a record."""


class MessageNotFound(LogError):
    """No message with this ID in the partition."""


def crc32c(data, uint32_t crc=0):
    """CRC-32C of `data` (the hardware instruction where the CPU has it)."""
    cdef Py_buffer view
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        return nsqshm_crc32c(crc, view.buf, view.len)
    finally:
        PyBuffer_Release(&view)


def crc32c_software(data, uint32_t crc=0):
    """CRC-32C by the table, whatever the CPU (tests compare both)."""
    cdef Py_buffer view
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        return nsqshm_crc32c_software(crc, view.buf, view.len)
    finally:
        PyBuffer_Release(&view)


def validate_topic_name(str name):
    """nsqd's rule: 1-64 of [.a-zA-Z0-9_-], optionally ending #ephemeral."""
    if not 0 < len(name) <= TOPIC_NAME_MAX or not _TOPIC_RE.match(name) or \
            not name.isascii():
        raise ValueError(f"invalid topic name {name!r}")


def partition_dir(str data_path, str topic, int partition):
    """The directory of partition `partition` of log topic `topic`: always
    one path component under data_path (".." is "..-0.nsqlog")."""
    validate_topic_name(topic)
    if not 0 <= partition < MAX_PARTITIONS:
        raise ValueError(f"invalid partition {partition}: 0..{MAX_PARTITIONS - 1}")
    return os.path.join(data_path, f"{topic}-{partition}{DIR_SUFFIX}")


def segment_name(uint64_t base):
    return f"{base:020d}.log"


def copy_prefix(str src, str dst, uint64_t keep):
    """Make `dst` (a new directory) a log of src's messages below msg offset
    `keep`, at the same msg and virtual offsets: a replica's log cut where it
    diverged from the leader's.  The segments wholly below the one holding
    keep - 1 are hard links (no copy: never written again, by either log);
    that one is copied up to keep, with its index headers, and the new log's
    recovery (PartitionLog on dst) indexes it.  src must have no writer (its
    readers in other processes keep what they mapped).  LogError unless
    start < keep <= end."""
    reader = LogReader(src)
    try:
        if not reader.start_offset < keep <= reader.end_offset:
            raise LogError(f"{src}: cannot keep below {keep}: the log holds "
                           f"{reader.start_offset}..{reader.end_offset}")
        segs = [s for s in reader.segments() if s[0] < keep]
        keep_virtual = reader.virtual_offset_of(keep)
    finally:
        reader.close()
    os.mkdir(dst, 0o700)
    last = len(segs) - 1  # (wraparound off: no negative indices)
    for base, *_ in segs[:last]:
        for ext in (".log", ".index", ".timeindex"):
            name = f"{base:020d}{ext}"
            if os.path.exists(os.path.join(src, name)):
                os.link(os.path.join(src, name), os.path.join(dst, name))
    base, base_virtual = segs[last][0], segs[last][1]
    prefix = f"{base:020d}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    left = keep_virtual - base_virtual
    with open(os.path.join(src, prefix + ".log"), "rb") as f:
        fd = os.open(os.path.join(dst, prefix + ".log"), flags, 0o600)
        try:
            while left > 0:  # (in the kernel: no copy through this process)
                n = os.copy_file_range(f.fileno(), fd, left)
                if n <= 0:
                    raise LogCorruptError(f"{src}: segment {prefix} ends before {keep}")
                left -= n
            os.fsync(fd)
        finally:
            os.close(fd)
    for ext in (".index", ".timeindex"):  # the headers only: the base virtual offset
        try:
            with open(os.path.join(src, prefix + ext), "rb") as f:
                header = f.read(NSQSHM_LOG_INDEX_HEADER)
        except FileNotFoundError:
            continue  # (recovery sums the earlier segments' sizes)
        fd = os.open(os.path.join(dst, prefix + ext), flags, 0o600)
        try:
            os.write(fd, header)
            os.fsync(fd)
        finally:
            os.close(fd)


CUT_SUFFIX = ".cut"    # cut_log, make_log_anew: the new log, until it takes the log's place
# prepare_cut: the cut log while it is made (on a thread); never taken by _finish_cut (a
# topic deleted and made again meanwhile must not get it), removed at the next open
CUTTING_SUFFIX = ".cutting"
GONE_SUFFIX = ".gone"  # cut_log, make_log_anew: a log replaced, until removed (+ a tag)


def _others_files(str path):
    """The files in a log's directory that are not the log's (the channels'
    checkpoints): they go with the directory's name, not with the log."""
    return [e.name for e in os.scandir(path) if e.is_file(follow_symlinks=False)
            and e.name != STATE_FILE and not _LOG_FILE_RE.match(e.name)]


def _fsync_dir(str path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _swap_in(str path, str new):
    """`new`, a complete log (recovered, its state committed and synced), takes
    the place of the log at `path`, the others' files linked into it, by two
    renames; a crash between them is finished by the next PartitionLog on the
    path (_finish_cut).  Readers of the old log in other processes see its
    state file go (another inode) and open the new one.  -> the old log's
    directory, renamed: the caller removes it (in a thread: it may be large)."""
    for name in _others_files(path):
        os.link(os.path.join(path, name), os.path.join(new, name))
    _fsync_dir(new)
    gone = _gone_name(path)
    os.rename(path, gone)
    os.rename(new, path)
    _fsync_dir(os.path.dirname(path) or ".")
    return gone


def cut_log(str path, uint64_t keep, **settings):
    """Remove the messages from msg offset `keep` on from the log at `path` (no
    writer open): a replica whose log diverged from the leader's there.  The cut
    log is made beside it (prepare_cut), then swapped in (swap_in).  -> the old
    log's directory, for the caller to remove."""
    return swap_in(path, prepare_cut(path, keep, **settings))


def prepare_cut(str path, uint64_t keep, **settings):
    """The first half of cut_log, which may run on a thread while the log's
    writer is open but idle (nothing below `keep` changes: a log only grows at
    its end and loses whole segments at its start): the cut log made beside it
    as path + CUTTING_SUFFIX (copy_prefix: no copy of the whole segments below
    keep), recovered by a PartitionLog with `settings` (the log's own) and
    synced.  -> its directory, for swap_in once the writer is closed, or for
    the caller to remove if the log changed meanwhile."""
    cutting = path + CUTTING_SUFFIX
    shutil.rmtree(cutting, ignore_errors=True)
    try:
        copy_prefix(path, cutting, keep)
        PartitionLog(cutting, **settings).close()
        return cutting
    except BaseException:
        shutil.rmtree(cutting, ignore_errors=True)
        raise


def swap_in(str path, str new):
    """A complete log made beside `path` (prepare_cut) takes its place: renamed
    to path + CUT_SUFFIX first (from there an interrupted swap is finished by
    the next open: _finish_cut), then _swap_in.  If the swap fails before the
    old log left, the new one is removed; after (path gone), it is kept for
    _finish_cut.  -> the old log's directory."""
    cut = path + CUT_SUFFIX
    if new != cut:
        shutil.rmtree(cut, ignore_errors=True)
        os.rename(new, cut)
    try:
        return _swap_in(path, cut)
    except BaseException:
        if os.path.exists(path):
            shutil.rmtree(cut, ignore_errors=True)
        raise


def make_log_anew(str path, uint64_t start, uint64_t start_virtual, **settings):
    """Replace the log at `path` (no writer open) by an empty one that begins at
    msg offset `start`, virtual offset `start_virtual`, made beside it with
    `settings` and swapped in (_swap_in; the others' files kept): a replica's
    log to be copied from the leader's start.  -> the old log's directory, for
    the caller to remove."""
    if start >= MAX_OFFSETS or start_virtual >= 1 << 62:
        raise ValueError(f"invalid start offsets {start}, {start_virtual}")
    new = path + CUT_SUFFIX
    shutil.rmtree(new, ignore_errors=True)
    try:
        PartitionLog(new, start_at=(start, start_virtual), **settings).close()
        return _swap_in(path, new)
    except BaseException:
        shutil.rmtree(new, ignore_errors=True)
        raise


def _gone_name(str path):
    """A name no other set-aside log of `path` has (one may still be being removed)."""
    return f"{path}{GONE_SUFFIX}{os.getpid()}-{time.monotonic_ns()}"


def set_aside_logs(str path):
    """The logs of `path` set aside and not removed (their remover died): the
    partition's owner removes them when it opens the log."""
    parent, name = os.path.split(path)
    gone = re.compile(re.escape(name + GONE_SUFFIX) + r"[0-9]+-[0-9]+\Z")
    try:
        return [os.path.join(parent, e) for e in os.listdir(parent) if gone.match(e)]
    except FileNotFoundError:
        return []


def _finish_cut(str path):
    """A cut_log or make_log_anew interrupted: between its renames, the new log
    (complete) takes its place; before them, the new log (maybe partial) goes.
    A cut being prepared (CUTTING_SUFFIX) goes in any case: its process died, or
    its log was deleted under it."""
    shutil.rmtree(path + CUTTING_SUFFIX, ignore_errors=True)
    cut = path + CUT_SUFFIX
    if os.path.isdir(cut):
        if os.path.exists(path):
            shutil.rmtree(cut, ignore_errors=True)
        else:
            os.rename(cut, path)


def _segment_bases(str path):
    bases = []
    for entry in os.listdir(path):
        m = _SEGMENT_RE.match(entry)
        if m:
            bases.append(int(m.group(1)))
    bases.sort()
    return bases


# _scan's verification step: about this many bytes of records without the GIL
cdef uint64_t SCAN_CHUNK = 4 << 20
cdef enum:
    MESSAGE_HEADER_BYTES = 26  # MESSAGE_HEADER, for code without the GIL


cdef uint64_t _verify_run(const char *base, uint64_t pos, uint64_t offset, uint64_t size,
                          uint64_t limit, uint64_t max_n, uint64_t *count) noexcept nogil:
    """From pos (msg offset `offset`), the records that are whole, in sequence
    and whose crc matches, until one is not or pos passes `limit`: the end of
    the last good one (*count: how many)."""
    cdef uint64_t n
    count[0] = 0
    while pos + 16 <= size and pos < limit:
        n = nsqshm_be32(base + pos)
        if n < 8 + MESSAGE_HEADER_BYTES or n > max_n or pos + 8 + n > size or \
                nsqshm_be64(base + pos + 8) != offset or \
                nsqshm_crc32c(0, base + pos + 8, n) != nsqshm_be32(base + pos + 4):
            break
        pos += 8 + n
        offset += 1
        count[0] += 1
    return pos


cdef inline uint64_t _now_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(0, &ts)
    return <uint64_t>ts.tv_sec * 1000000000 + <uint64_t>ts.tv_nsec


cdef int _datasync(int fd) noexcept:
    with nogil:
        return fdatasync(fd)


cdef int _pwrite_all(int fd, const char *buf, Py_ssize_t n, long long pos) except -1:
    cdef ssize_t r
    while n > 0:
        r = pwrite(fd, buf, n, pos)
        if r < 0:
            if errno == 4:
                continue
            raise OSError(errno, os.strerror(errno))
        if r == 0:
            raise OSError(28, os.strerror(28))
        buf += r
        n -= r
        pos += r
    return 0


cdef class _Map:
    """A file mapped read-only, remapped larger when more must be seen."""

    def __cinit__(self):
        self.fd = -1
        self.base = NULL
        self.mapped = 0

    cdef int open(self, str path) except -1:
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        return 0

    cdef int ensure(self, size_t need, size_t hint) except -1:
        """Map at least `need` bytes (hint: map that much at once).  Pages
        past the file's end are mapped but never touched."""
        cdef void *p
        cdef size_t length
        if need <= self.mapped:
            return 0
        length = need if need > hint else hint
        length = (length + 4095) & ~(<size_t>4095)
        if self.base != NULL:
            munmap(self.base, self.mapped)
            self.base = NULL
            self.mapped = 0
        p = mmap(NULL, length, PROT_READ, MAP_SHARED, self.fd, 0)
        if p == MAP_FAILED:
            raise OSError(errno, os.strerror(errno), self.path)
        # no MADV_SEQUENTIAL: it lets the kernel drop pages behind the reader,
        # and the hot tail is shared by every channel of the topic (it made
        # no difference to a replay here)
        self.base = <char *>p
        self.mapped = length
        return 0

    cdef void close(self) noexcept:
        if self.base != NULL:
            munmap(self.base, self.mapped)
            self.base = NULL
            self.mapped = 0
        if self.fd >= 0:
            close(self.fd)
            self.fd = -1

    def __dealloc__(self):
        self.close()


cdef class _Segment:
    """A reader's view of one segment: data, index and time index mapped."""

    cdef int open(self, str path, uint64_t base) except -1:
        cdef char header[32]
        prefix = os.path.join(path, f"{base:020d}")
        self.base_offset = base
        self.data = _Map()
        self.idx = _Map()
        self.tidx = _Map()
        self.data.open(prefix + ".log")
        self.idx.open(prefix + ".index")
        self.tidx.open(prefix + ".timeindex")
        if pread(self.idx.fd, header, 32, 0) != 32 or memcmp(header, INDEX_MAGIC, 8) != 0 \
                or nsqshm_be64(header + 8) != base:
            raise LogCorruptError(f"{prefix}.index: bad header")
        self.base_virtual = nsqshm_be64(header + 16)
        return 0

    cdef uint64_t index_entries(self) except? 0:
        cdef uint64_t size = os.fstat(self.idx.fd).st_size
        if size < NSQSHM_LOG_INDEX_HEADER:
            return 0
        self.idx.ensure(size, 0)
        return (size - NSQSHM_LOG_INDEX_HEADER) // NSQSHM_LOG_INDEX_ENTRY

    cdef uint64_t time_entries(self) except? 0:
        cdef uint64_t size = os.fstat(self.tidx.fd).st_size
        if size < NSQSHM_LOG_INDEX_HEADER:
            return 0
        self.tidx.ensure(size, 0)
        return (size - NSQSHM_LOG_INDEX_HEADER) // NSQSHM_LOG_TIME_ENTRY

    cdef void close(self) noexcept:
        if self.data is not None:
            self.data.close()
            self.idx.close()
            self.tidx.close()


cdef class LogReader:
    """Reads a partition's committed records, from any process.

    LogReader(path) maps the partition's state block read-only; segments
    are mapped as they are first needed and kept until retention removes
    them.  Positions it takes and returns are msg offsets unless named
    virtual.
    """

    def __cinit__(self):
        self.state_fd = -1
        self.state = NULL
        self.hint_seg = -1

    def __init__(self, str path):
        cdef void *p
        self.path = path
        self.segs = []
        self.state_fd = os.open(os.path.join(path, STATE_FILE), os.O_RDONLY | os.O_CLOEXEC)
        if os.fstat(self.state_fd).st_size < NSQSHM_LOG_STATE_SIZE:
            raise LogNotMade(f"{path}: no log state (the partition was never opened "
                             f"for writing)")
        p = mmap(NULL, NSQSHM_LOG_STATE_SIZE, PROT_READ, MAP_SHARED, self.state_fd, 0)
        if p == MAP_FAILED:
            raise OSError(errno, os.strerror(errno), path)
        self.state = <nsqshm_log_state *>p
        if self.state.magic == 0 or self.state.version == 0:  # (the writer's first
            # commit sets both, one after the other: _open_state zeroes a fresh state)
            raise LogNotMade(f"{path}: no log state yet (its writer has not committed)")
        if self.state.magic != NSQSHM_LOG_MAGIC or self.state.version != NSQSHM_LOG_VERSION:
            raise LogError(f"{path}: not a partition log state of layout {NSQSHM_LOG_VERSION}")
        self.segment_bytes = self.state.segment_bytes
        self.seg_start = self.seg_active = <uint64_t>-1
        self.refresh()

    cdef int refresh(self) except -1:
        """Read the last commit; list the segments again if one was added or
        removed since."""
        cdef int tries = 0
        while nsqshm_log_read_commit(self.state, &self.commit) != 0:
            tries += 1
        if self.commit.start_offset != self.seg_start or \
                self.commit.active_base_offset != self.seg_active:
            self._relist()
        cdef _Segment act
        if self.segs:
            act = self.segs[len(self.segs) - 1]
            act.end_offset = self.commit.next_offset
            act.end_pos = self.commit.virtual_end - act.base_virtual
        return 0

    def _relist(self):
        cdef _Segment seg, nxt
        cdef Py_ssize_t i
        for attempt in range(100):
            old = {s.base_offset: s for s in self.segs}
            bases = [b for b in _segment_bases(self.path)
                     if self.commit.start_offset <= b <= self.commit.active_base_offset]
            segs = []
            try:
                for b in bases:
                    seg = old.pop(b, None)
                    if seg is None:
                        seg = _Segment()
                        seg.open(self.path, b)
                    segs.append(seg)
            except FileNotFoundError:
                # retention removed a segment while we listed: read the commit again
                for s in segs:
                    if s.base_offset not in old:
                        (<_Segment>s).close()
                while nsqshm_log_read_commit(self.state, &self.commit) != 0:
                    pass
                continue
            for s in old.values():
                (<_Segment>s).close()   # removed by retention
            break
        else:
            raise LogError(f"{self.path}: segments keep changing")
        for i in range(len(segs) - 1):
            seg, nxt = segs[i], segs[i + 1]
            seg.end_offset = nxt.base_offset
            seg.end_pos = nxt.base_virtual - seg.base_virtual
        self.segs = segs
        self.hint_seg = -1
        self.seg_start = self.commit.start_offset
        self.seg_active = self.commit.active_base_offset
        return None

    @property
    def start_offset(self):
        self.refresh()
        return self.commit.start_offset

    @property
    def end_offset(self):
        """The next msg offset: one past the last committed message."""
        self.refresh()
        return self.commit.next_offset

    @property
    def start_virtual(self):
        self.refresh()
        return self.commit.start_virtual

    @property
    def virtual_end(self):
        self.refresh()
        return self.commit.virtual_end

    @property
    def synced_offset(self):
        return self.state.synced_offset

    def segments(self):
        """[(base msg offset, base virtual offset, end msg offset, bytes)]."""
        self.refresh()
        return [(s.base_offset, s.base_virtual, s.end_offset, s.end_pos) for s in self.segs]

    cdef int _out_of_range(self, uint64_t offset) except -1:
        raise OffsetOutOfRange(
            f"offset {offset} out of range: the log holds {self.commit.start_offset}.."
            f"{self.commit.next_offset}" +
            (" (before log start: removed by retention)"
             if offset < self.commit.start_offset else ""),
            self.commit.start_offset, self.commit.next_offset)

    cdef Py_ssize_t _seg_of(self, uint64_t offset):
        """The index in segs of the segment holding msg offset `offset`."""
        cdef Py_ssize_t lo = 0, hi = len(self.segs) - 1, mid
        while lo < hi:
            mid = (lo + hi + 1) >> 1
            if (<_Segment>self.segs[mid]).base_offset <= offset:
                lo = mid
            else:
                hi = mid - 1
        return lo

    cdef int _map_data(self, _Segment seg) except -1:
        """Map the segment's committed bytes, never past the file's end (a
        state block newer than the files after a host crash)."""
        cdef uint64_t need = seg.end_pos
        if need > seg.file_size:
            seg.file_size = os.fstat(seg.data.fd).st_size
            if need > seg.file_size:
                raise LogCorruptError(f"{seg.data.path}: committed {need} bytes, "
                                      f"the file has {seg.file_size}")
        seg.data.ensure(need, self.segment_bytes if need <= self.segment_bytes else need)
        return 0

    cdef uint64_t _pos_of(self, _Segment seg, uint64_t offset) except? 0xFFFFFFFFFFFFFFFF:
        """The file position of msg offset `offset` in seg: the index entry
        at or below it, then a walk of at most an interval's records."""
        cdef uint64_t n = seg.index_entries(), lo = 0, hi, mid, rel = offset - seg.base_offset
        cdef uint64_t pos = 0, cur = seg.base_offset
        cdef const char *e
        cdef const char *base
        if n:
            hi = n
            while lo < hi:  # the first entry with rel > target
                mid = (lo + hi) >> 1
                if nsqshm_be32(seg.idx.base + NSQSHM_LOG_INDEX_HEADER + mid * 8) <= rel:
                    lo = mid + 1
                else:
                    hi = mid
            if lo:
                e = seg.idx.base + NSQSHM_LOG_INDEX_HEADER + (lo - 1) * 8
                if seg.base_offset + nsqshm_be32(e) < seg.end_offset and \
                        nsqshm_be32(e + 4) < seg.end_pos:
                    cur = seg.base_offset + nsqshm_be32(e)
                    pos = nsqshm_be32(e + 4)
        self._map_data(seg)
        base = seg.data.base
        if pos and nsqshm_be64(base + pos + 8) != cur:  # an index entry not trusted
            pos, cur = 0, seg.base_offset
        while cur < offset:
            if pos + NSQSHM_LOG_RECORD_HEADER > seg.end_pos:
                raise LogCorruptError(f"{seg.data.path}: record {cur} at {pos} past the end")
            pos += 8 + nsqshm_be32(base + pos)
            cur += 1
        return pos

    def read_into(self, uint64_t offset, buffer, Py_ssize_t max_records=-1,
                  Py_ssize_t max_bytes=-1, bint verify=False):
        """Copy whole messages from msg offset `offset` into `buffer` as
        packed ring records [u32 native size][message]...; (count, bytes,
        next_offset).  Stops at the committed end, at max_records, or when
        the next record does not fit max_bytes (or the buffer).  verify
        checks each record's crc (recovery already checked the tail)."""
        return self._read_into(offset, buffer, max_records, max_bytes, verify)

    cdef Py_ssize_t _start(self, uint64_t offset, uint64_t *pos) except -2:
        """Where a read from msg offset `offset` starts: the segment's index
        (pos: the byte in it), from where the last read stopped when it is
        there; -1 at the committed end; OffsetOutOfRange outside the log."""
        cdef Py_ssize_t si
        self.refresh()
        if offset < self.commit.start_offset or offset > self.commit.next_offset:
            self._out_of_range(offset)
        if offset == self.commit.next_offset:
            return -1
        if self.hint_seg >= 0 and self.hint_offset == offset and self.hint_seg < len(self.segs):
            pos[0] = self.hint_pos
            return self.hint_seg
        si = self._seg_of(offset)
        pos[0] = self._pos_of(self.segs[si], offset)
        return si

    cdef _Segment _segment_at(self, Py_ssize_t *si, uint64_t *pos, const char **base,
                              uint64_t *end_pos):
        """The segment with committed bytes at (si, pos), mapped (base: its
        bytes, end_pos: its committed end), stepping on to the next segment's
        start past the end of one; None past the last."""
        cdef _Segment seg = self.segs[si[0]]
        while pos[0] >= seg.end_pos:
            if si[0] + 1 >= len(self.segs):
                return None
            si[0] += 1
            pos[0] = 0
            seg = self.segs[si[0]]
        self._map_data(seg)
        base[0] = seg.data.base
        end_pos[0] = seg.end_pos
        return seg

    cdef tuple _read_into(self, uint64_t offset, object buffer, Py_ssize_t max_records,
                          Py_ssize_t max_bytes, bint verify):
        cdef Py_buffer view
        cdef _Segment seg
        cdef Py_ssize_t si, count = 0, written = 0, room
        cdef uint64_t pos, cur = offset, size, end_pos
        cdef const char *base
        cdef char *out
        cdef int bad = 0
        si = self._start(offset, &pos)
        if si < 0:
            return 0, 0, offset
        PyObject_GetBuffer(buffer, &view, PyBUF_WRITABLE)
        try:
            out = <char *>view.buf
            room = view.len if max_bytes < 0 or max_bytes > view.len else max_bytes
            while max_records < 0 or count < max_records:
                seg = self._segment_at(&si, &pos, &base, &end_pos)
                if seg is None:
                    break
                with nogil:
                    while max_records < 0 or count < max_records:
                        if pos >= end_pos:
                            break
                        size = nsqshm_be32(base + pos)
                        if size < 8 + 26 or pos + 8 + size > end_pos or \
                                nsqshm_be64(base + pos + 8) != cur:
                            bad = 1
                            break
                        if verify and nsqshm_crc32c(0, base + pos + 8, size) != \
                                nsqshm_be32(base + pos + 4):
                            bad = 2
                            break
                        if written + <Py_ssize_t>size - 4 > room:
                            break
                        (<uint32_t *>(out + written))[0] = <uint32_t>(size - 8)
                        memcpy(out + written + 4, base + pos + 16, size - 8)
                        written += size - 4
                        pos += 8 + size
                        cur += 1
                        count += 1
                if bad:
                    raise LogCorruptError(
                        f"{seg.data.path}: record {cur} at {pos}: " +
                        ("bad crc" if bad == 2 else "bad size or msg offset"))
                if pos < end_pos:
                    break  # full
        finally:
            PyBuffer_Release(&view)
        self.hint_seg = si
        self.hint_pos = pos
        self.hint_offset = cur
        return count, written, cur

    cdef Py_ssize_t records(self, uint64_t offset, Py_ssize_t max_records, RecordSink sink,
                            object ctx, uint64_t *next_offset) except -1:
        """Hand whole messages from msg offset `offset` on to sink(ctx, msg,
        size), where they lie in the mmap'd segments (valid while this reader
        is open), up to max_records (-1: no limit), the committed end, or a
        message the sink leaves; the count, and in next_offset the msg
        offset after the last taken.  As read_into, with the copy left to
        the sink (Columns.add_log: the log's bytes straight into Arrow
        columns)."""
        cdef _Segment seg
        cdef Py_ssize_t si, count = 0
        cdef uint64_t pos, cur = offset, size, end_pos
        cdef const char *base
        cdef bint left = False
        next_offset[0] = offset
        si = self._start(offset, &pos)
        if si < 0:
            return 0
        while max_records < 0 or count < max_records:
            seg = self._segment_at(&si, &pos, &base, &end_pos)
            if seg is None:
                break
            while (max_records < 0 or count < max_records) and pos < end_pos:
                #   [u32 BE size][u32 BE crc][u64 BE msg offset][message]; size
                #   counts the offset and the message (PartitionLog's records)
                size = nsqshm_be32(base + pos)
                if size < 8 + 26 or pos + 8 + size > end_pos or \
                        nsqshm_be64(base + pos + 8) != cur:
                    raise LogCorruptError(f"{seg.data.path}: record {cur} at {pos}: "
                                          "bad size or msg offset")
                if not sink(ctx, base + pos + 16, <uint32_t>(size - 8)):
                    left = True
                    break
                pos += 8 + size
                cur += 1
                count += 1
            if left:
                break
        self.hint_seg = si
        self.hint_pos = pos
        self.hint_offset = cur
        next_offset[0] = cur
        return count

    cdef uint64_t _virtual(self, uint64_t offset) except? 0xFFFFFFFFFFFFFFFF:
        """The virtual offset (byte position in the whole log) of msg offset
        `offset`, in C: the delivery path asks this per message for clients
        whose frames carry the queue offset."""
        cdef _Segment seg
        self.refresh()
        if offset < self.commit.start_offset or offset > self.commit.next_offset:
            self._out_of_range(offset)
        if offset == self.commit.next_offset:
            return self.commit.virtual_end
        seg = <_Segment>self.segs[self._seg_of(offset)]
        return seg.base_virtual + self._pos_of(seg, offset)

    cdef int64_t virtual_of(self, uint64_t offset) noexcept:
        """_virtual for the delivery's C path: -1 where it raises (the
        message gone to retention, a damaged index)."""
        try:
            return <int64_t>self._virtual(offset)
        except Exception:
            return -1

    def virtual_offset_of(self, uint64_t offset):
        """The virtual offset (byte position in the whole log) of msg offset
        `offset` (the end offset gives the virtual end)."""
        return self._virtual(offset)

    def find_by_virtual_offset(self, uint64_t virtual, bint next_record=False):
        """The msg offset of the record starting at byte `virtual` of the log;
        NotABoundary if no record starts there, OffsetOutOfRange outside.
        With next_record, Youzan's SearchLogByMsgOffset instead: the first
        record starting at or after `virtual`, the log start below it and
        the end past it (no error)."""
        cdef _Segment seg = None
        cdef Py_ssize_t lo, hi, mid
        cdef uint64_t n, target, pos = 0, cur, rel
        cdef const char *e
        self.refresh()
        if next_record and virtual <= self.commit.start_virtual:
            return self.commit.start_offset
        if next_record and virtual >= self.commit.virtual_end:
            return self.commit.next_offset
        if virtual < self.commit.start_virtual or virtual > self.commit.virtual_end:
            raise OffsetOutOfRange(
                f"virtual offset {virtual} out of range: the log holds "
                f"{self.commit.start_virtual}..{self.commit.virtual_end}",
                self.commit.start_offset, self.commit.next_offset)
        if virtual == self.commit.virtual_end:
            return self.commit.next_offset
        lo, hi = 0, len(self.segs) - 1
        while lo < hi:
            mid = (lo + hi + 1) >> 1
            if (<_Segment>self.segs[mid]).base_virtual <= virtual:
                lo = mid
            else:
                hi = mid - 1
        seg = self.segs[lo]
        target = virtual - seg.base_virtual
        cur = seg.base_offset
        n = seg.index_entries()
        lo, hi = 0, n
        while lo < hi:  # the first entry with position > target
            mid = (lo + hi) >> 1
            if nsqshm_be32(seg.idx.base + NSQSHM_LOG_INDEX_HEADER + mid * 8 + 4) <= target:
                lo = mid + 1
            else:
                hi = mid
        self._map_data(seg)
        if lo:
            e = seg.idx.base + NSQSHM_LOG_INDEX_HEADER + (lo - 1) * 8
            rel = nsqshm_be32(e)
            if seg.base_offset + rel < seg.end_offset and \
                    nsqshm_be64(seg.data.base + nsqshm_be32(e + 4) + 8) == seg.base_offset + rel:
                pos = nsqshm_be32(e + 4)
                cur = seg.base_offset + rel
        while pos < target:
            pos += 8 + nsqshm_be32(seg.data.base + pos)
            cur += 1
        if pos != target and not next_record:  # (else cur is the record after it)
            raise NotABoundary(f"virtual offset {virtual} is not the start of a record "
                               f"(the next record starts at {seg.base_virtual + pos})")
        return cur

    cdef uint64_t _ts_at(self, _Segment seg, uint64_t pos):
        return nsqshm_be64(seg.data.base + pos + 16)

    def find_offset_by_time(self, int64_t ts_ns):
        """The msg offset of the first message with a timestamp >= ts_ns
        (the end offset if there is none)."""
        cdef _Segment seg
        cdef Py_ssize_t si
        cdef uint64_t n, lo, hi, mid, rel = 0, pos, cur
        cdef const char *e
        cdef const char *t
        self.refresh()
        for si in range(len(self.segs)):
            seg = self.segs[si]
            if seg.end_offset == seg.base_offset:
                continue
            n = seg.time_entries()
            t = seg.tidx.base + NSQSHM_LOG_INDEX_HEADER
            # a finished segment's last entry holds its max timestamp
            if si + 1 < len(self.segs) and n and \
                    nsqshm_be32(t + (n - 1) * 12 + 8) == seg.end_offset - seg.base_offset and \
                    <int64_t>nsqshm_be64(t + (n - 1) * 12) < ts_ns:
                continue
            lo, hi = 0, n
            while lo < hi:  # the first entry whose max-before is >= ts
                mid = (lo + hi) >> 1
                if <int64_t>nsqshm_be64(t + mid * 12) < ts_ns:
                    lo = mid + 1
                else:
                    hi = mid
            rel = nsqshm_be32(t + (lo - 1) * 12 + 8) if lo else 0
            if seg.base_offset + rel >= seg.end_offset:
                rel = 0
            cur = seg.base_offset + rel
            pos = self._pos_of(seg, cur)
            while pos < seg.end_pos:
                if <int64_t>self._ts_at(seg, pos) >= ts_ns:
                    return cur
                pos += 8 + nsqshm_be32(seg.data.base + pos)
                cur += 1
        return self.commit.next_offset

    def find_by_id(self, msg_id):
        """The msg offset of the message with ID `msg_id` (16 hex bytes, as
        on the wire).  IDs rise within a partition: a binary search over the
        segments and their index entries, then a scan."""
        cdef bytes want = bytes(msg_id)
        cdef const char *w
        cdef _Segment seg
        cdef Py_ssize_t lo, hi, mid, si
        cdef uint64_t n, elo, ehi, emid, pos = 0, cur, rel
        cdef const char *e
        if len(want) != 16:
            raise ValueError("a message ID is 16 bytes")
        w = want
        self.refresh()
        if not self.segs or self.commit.next_offset == self.commit.start_offset:
            raise MessageNotFound(f"message {want!r} not found")
        lo, hi = 0, len(self.segs) - 1
        while lo < hi:  # the last segment whose first ID <= want
            mid = (lo + hi + 1) >> 1
            seg = self.segs[mid]
            self._map_data(seg)
            if seg.end_pos and memcmp(seg.data.base + 26, w, 16) <= 0:
                lo = mid
            else:
                hi = mid - 1
        seg = self.segs[lo]
        self._map_data(seg)
        n = seg.index_entries()
        elo, ehi = 0, n
        while elo < ehi:  # the first index entry whose record's ID > want
            emid = (elo + ehi) >> 1
            e = seg.idx.base + NSQSHM_LOG_INDEX_HEADER + emid * 8
            if nsqshm_be32(e + 4) >= seg.end_pos or \
                    memcmp(seg.data.base + nsqshm_be32(e + 4) + 26, w, 16) > 0:
                ehi = emid
            else:
                elo = emid + 1
        cur = seg.base_offset
        if elo:
            e = seg.idx.base + NSQSHM_LOG_INDEX_HEADER + (elo - 1) * 8
            rel = nsqshm_be32(e)
            if seg.base_offset + rel < seg.end_offset:
                pos = nsqshm_be32(e + 4)
                cur = seg.base_offset + rel
        while pos < seg.end_pos:
            r = memcmp(seg.data.base + pos + 26, w, 16)
            if r == 0:
                return cur
            if r > 0:
                break
            pos += 8 + nsqshm_be32(seg.data.base + pos)
            cur += 1
        raise MessageNotFound(f"message {want.decode('latin-1')} not found")

    def close(self):
        for s in self.segs:
            (<_Segment>s).close()
        self.segs = []
        if self.state != NULL:
            munmap(self.state, NSQSHM_LOG_STATE_SIZE)
            self.state = NULL
        if self.state_fd >= 0:
            close(self.state_fd)
            self.state_fd = -1

    def __dealloc__(self):
        if self.state != NULL:
            munmap(self.state, NSQSHM_LOG_STATE_SIZE)
        if self.state_fd >= 0:
            close(self.state_fd)


cdef class _Pending:
    """Index entries laid out for one pwrite."""

    def __cinit__(self):
        self.cap = 4096
        self.buf = <char *>malloc(self.cap)
        self.used = 0
        if self.buf == NULL:
            raise MemoryError()

    cdef char *reserve(self, Py_ssize_t n) except NULL:
        cdef char *p
        if self.used + n > self.cap:
            p = <char *>realloc(self.buf, (self.used + n) * 2)
            if p == NULL:
                raise MemoryError()
            self.buf = p
            self.cap = (self.used + n) * 2
        p = self.buf + self.used
        self.used += n
        return p

    def __dealloc__(self):
        free(self.buf)


cdef class PartitionLog:
    """The writer of one partition: only one process at a time (flock on
    the state file) -- the partition's owner.  Lookups go through .reader,
    a LogReader on the same directory."""

    def __cinit__(self):
        self.state_fd = self.dfd = self.ifd = self.tfd = -1
        self.state = NULL
        self.staging = NULL

    def __init__(self, str path, uint64_t segment_bytes=DEFAULT_SEGMENT_BYTES,
                 uint32_t index_interval=DEFAULT_INDEX_INTERVAL,
                 max_msg_size=None, long long sync_every=2500,
                 double sync_timeout=2.0, logf=None, start_at=None):
        """start_at: (msg offset, virtual offset) where a log made here, with no
        segment and no state yet, begins -- a replica copying a leader's log from
        the leader's start, after retention removed what was before it."""
        if not 4096 <= segment_bytes <= MAX_SEGMENT_BYTES:
            raise ValueError(f"segment_bytes {segment_bytes}: 4096..{MAX_SEGMENT_BYTES}")
        if not 64 <= index_interval <= segment_bytes:
            raise ValueError(f"index_interval {index_interval}: 64..segment_bytes")
        if max_msg_size is None:  # nsqd's default, or what a segment holds
            max_msg_size = min(DEFAULT_MAX_MSG_SIZE, segment_bytes - 16)
        if not MESSAGE_HEADER <= max_msg_size <= segment_bytes - 16 or max_msg_size > STAGING // 2:
            raise ValueError(f"max_msg_size {max_msg_size} impossible")
        self.path = path
        self.segment_bytes = segment_bytes
        self.index_interval = index_interval
        self.max_msg_size = max_msg_size
        self.sync_every = max(sync_every, 1)
        self.sync_timeout = sync_timeout
        self.logf = logf
        self.staging = <char *>malloc(STAGING)
        if self.staging == NULL:
            raise MemoryError()
        self.pidx = _Pending()
        self.ptim = _Pending()
        self.finished_fds = []
        _finish_cut(path)
        os.makedirs(path, mode=0o700, exist_ok=True)
        self._open_state()
        self._recover(start_at)
        self.last_sync = time.monotonic()
        self._reader = None

    @staticmethod
    def open(str data_path, str topic, int partition, **kw):
        """The log of partition `partition` of topic `topic` in data_path."""
        return PartitionLog(partition_dir(data_path, topic, partition), **kw)

    def _log(self, level, msg):
        if self.logf is not None:
            self.logf(level, f"COMMITLOG({self.path}): {msg}")

    # -- the state block ---------------------------------------------------------------

    def _open_state(self):
        cdef void *p
        name = os.path.join(self.path, STATE_FILE)
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            os.fchmod(fd, 0o600)
            if flock(fd, LOCK_EX | LOCK_NB) != 0:
                raise LogError(f"{self.path}: the log is open for writing by another process")
            fresh = os.fstat(fd).st_size < NSQSHM_LOG_STATE_SIZE
            if fresh:
                os.ftruncate(fd, NSQSHM_LOG_STATE_SIZE)
            p = mmap(NULL, NSQSHM_LOG_STATE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
            if p == MAP_FAILED:
                raise OSError(errno, os.strerror(errno), name)
        except BaseException:
            os.close(fd)
            raise
        self.state_fd = fd
        self.state = <nsqshm_log_state *>p
        if self.state.magic != NSQSHM_LOG_MAGIC or self.state.version != NSQSHM_LOG_VERSION:
            memset(p, 0, NSQSHM_LOG_STATE_SIZE)
        else:
            nsqshm_log_read_commit(self.state, &self.c)  # the writer is gone: stable
        self.state.index_interval = self.index_interval
        self.state.segment_bytes = self.segment_bytes
        self.state.writer_pid = os.getpid()

    cdef int _commit(self) except -1:
        self.c.commit_ns = _now_ns()
        nsqshm_log_publish(self.state, &self.c)
        if self.state.magic != NSQSHM_LOG_MAGIC:
            self.state.version = NSQSHM_LOG_VERSION
            self.state.magic = NSQSHM_LOG_MAGIC
        return 0

    # -- segments ------------------------------------------------------------------------

    def _prefix(self, uint64_t base):
        return os.path.join(self.path, f"{base:020d}")

    cdef int _close_active(self) except -1:
        for fd in (self.dfd, self.ifd, self.tfd):
            if fd >= 0:
                close(fd)
        self.dfd = self.ifd = self.tfd = -1
        return 0

    def _index_header(self, magic, uint64_t base, uint64_t base_virtual):
        return (magic + base.to_bytes(8, "big") + base_virtual.to_bytes(8, "big") +
                self.index_interval.to_bytes(4, "big") + bytes(4))

    def _new_segment(self, uint64_t base, uint64_t base_virtual):
        """Create the segment starting at msg offset base, as the active one."""
        prefix = self._prefix(base)
        flags = os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        self.dfd = os.open(prefix + ".log", flags, 0o600)
        self.ifd = os.open(prefix + ".index", flags, 0o600)
        self.tfd = os.open(prefix + ".timeindex", flags, 0o600)
        os.pwrite(self.ifd, self._index_header(b"NSQLIDX1", base, base_virtual), 0)
        os.pwrite(self.tfd, self._index_header(b"NSQLTIM1", base, base_virtual), 0)
        self.isize = self.tsize = NSQSHM_LOG_INDEX_HEADER
        self.wpos = 0
        self.last_idx_pos = 0
        self.c.active_base_offset = base
        self.c.active_base_virtual = base_virtual
        self.c.virtual_end = base_virtual
        self.c.next_offset = base

    cdef int _roll(self) except -1:
        """Finish the active segment (closing time entry, fsync) and start the next."""
        cdef char *t
        self._flush_index()
        t = self.ptim.reserve(12)
        nsqshm_put_be64(t, self.max_ts)
        nsqshm_put_be32(t + 8, <uint32_t>(self.c.next_offset - self.c.active_base_offset))
        self._flush_index()
        # fsynced by the next sync(), as the policy says, not here: an fsync
        # of 100 MiB at every roll cost the append rate half (measured)
        self.finished_fds.extend((self.dfd, self.ifd, self.tfd))
        self.dfd = self.ifd = self.tfd = -1
        self._new_segment(self.c.next_offset, self.c.virtual_end)
        self._commit()
        return 0

    cdef int _flush_index(self) except -1:
        if self.pidx.used:
            _pwrite_all(self.ifd, self.pidx.buf, self.pidx.used, self.isize)
            self.isize += self.pidx.used
            self.pidx.used = 0
        if self.ptim.used:
            _pwrite_all(self.tfd, self.ptim.buf, self.ptim.used, self.tsize)
            self.tsize += self.ptim.used
            self.ptim.used = 0
        return 0

    cdef int _account(self, uint64_t pos, uint64_t offset, uint64_t ts) except -1:
        """Index entries for a record at `pos` of the active segment."""
        cdef char *e
        if pos and pos - self.last_idx_pos >= self.index_interval:
            e = self.pidx.reserve(8)
            nsqshm_put_be32(e, <uint32_t>(offset - self.c.active_base_offset))
            nsqshm_put_be32(e + 4, <uint32_t>pos)
            e = self.ptim.reserve(12)
            nsqshm_put_be64(e, self.max_ts)
            nsqshm_put_be32(e + 8, <uint32_t>(offset - self.c.active_base_offset))
            self.last_idx_pos = pos
        if ts > self.max_ts:
            self.max_ts = ts
        return 0

    # -- appending -------------------------------------------------------------------------

    def append_packed(self, packed, int id_partition=-1):
        """Append the records packed [u32 native size][message]...; each gets
        the next msg offset.  Returns (count, first msg offset, bytes of
        `packed` used).  Committed (visible to readers) when it returns.

        id_partition >= 0 (a log topic's partition): each message's ID is
        replaced, in the log, by its position -- 16 lowercase hex digits of
        (id_partition << 48) | msg offset -- so that a FIN by ID finds the
        channel cursor's bit with no lookup (logcursor.CursorSet)."""
        cdef Py_buffer view
        cdef const char *p
        cdef Py_ssize_t n, pos = 0, staged = 0, count = 0, records = 0
        cdef uint32_t size
        cdef uint64_t first = self.c.next_offset, off = self.c.next_offset
        cdef uint64_t seg_base_pos = self.wpos
        cdef char *s
        if id_partition >= MAX_PARTITIONS:
            raise ValueError(f"invalid partition {id_partition}")
        PyObject_GetBuffer(packed, &view, PyBUF_SIMPLE)
        try:
            p = <const char *>view.buf
            n = view.len
            while pos + 4 <= n:  # validate the whole batch first: all or nothing
                size = (<const uint32_t *>(p + pos))[0]
                if size < MESSAGE_HEADER or size > self.max_msg_size:
                    raise ValueError(f"invalid message size ({size}) at byte {pos}")
                if pos + 4 + size > n:
                    raise ValueError(f"truncated record at byte {pos}")
                pos += 4 + size
                records += 1
            if pos != n:
                raise ValueError(f"truncated record at byte {pos}")
            if id_partition >= 0 and first + <uint64_t>records > <uint64_t>MAX_OFFSETS:
                raise ValueError(f"the log is full: {records} records at offset {first} "
                                 f"would pass {MAX_OFFSETS - 1}, the largest a message ID holds")
            pos = 0
            while pos < n:
                size = (<const uint32_t *>(p + pos))[0]
                if self.wpos + staged + 16 + size > self.segment_bytes and \
                        self.wpos + staged > 0:
                    self._write_staged(staged, off)
                    staged = 0
                    self._roll()
                elif staged + 16 + size > STAGING:
                    self._write_staged(staged, off)
                    staged = 0
                s = self.staging + staged
                nsqshm_put_be32(s, size + 8)
                nsqshm_put_be64(s + 8, off)
                memcpy(s + 16, p + pos + 4, size)
                if id_partition >= 0:  # the ID: [8 ts][2 attempts][16 ID]
                    hex_id(s + 16 + 10, (<uint64_t>id_partition << 48) | off)
                nsqshm_put_be32(s + 4, nsqshm_crc32c(0, s + 8, size + 8))
                self._account(self.wpos + staged, off, nsqshm_be64(s + 16))
                staged += 16 + size
                pos += 4 + size
                off += 1
                count += 1
            if staged:
                self._write_staged(staged, off)
        finally:
            PyBuffer_Release(&view)
        self.unsynced += count
        if self.unsynced >= self.sync_every or \
                (self.sync_timeout >= 0 and time.monotonic() - self.last_sync >= self.sync_timeout):
            self.sync()
        return count, first, pos

    cdef int _write_staged(self, Py_ssize_t staged, uint64_t next_off) except -1:
        """Write the staged records, then their index entries, then commit."""
        _pwrite_all(self.dfd, self.staging, staged, self.wpos)
        self.wpos += staged
        self._flush_index()
        self.c.next_offset = next_off
        self.c.virtual_end = self.c.active_base_virtual + self.wpos
        self._commit()
        return 0

    def sync(self):
        """fdatasync the active segment, then its indexes; record what is
        durable.  The system calls run without the GIL, so the broker may
        call this from a thread while its event loop appends (one sync at a
        time, and close() only after it): what is appended meanwhile is not
        counted as synced."""
        cdef uint64_t upto = self.c.next_offset
        cdef long long done = self.unsynced
        cdef int dfd = self.dfd, ifd = self.ifd, tfd = self.tfd
        fds, self.finished_fds = self.finished_fds, []
        for fd in fds:   # segments finished since the last sync
            _datasync(fd)
            close(fd)
        if fds:          # and the names of the segment files made since
            dirfd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.fsync(dirfd)
            finally:
                os.close(dirfd)
        if dfd >= 0:
            _datasync(dfd)
            _datasync(ifd)
            _datasync(tfd)
        if self.state != NULL:
            self.state.synced_offset = upto
        self.unsynced = max(0, self.unsynced - done)
        self.last_sync = time.monotonic()

    @property
    def needs_sync(self):
        return self.unsynced > 0

    # -- positions ---------------------------------------------------------------------------

    @property
    def start_offset(self):
        return self.c.start_offset

    @property
    def start_virtual(self):
        """The virtual (byte) offset of the first message held."""
        return self.c.start_virtual

    @property
    def end_offset(self):
        return self.c.next_offset

    @property
    def virtual_end(self):
        return self.c.virtual_end

    @property
    def reader(self):
        if self._reader is None:
            self._reader = LogReader(self.path)
        return self._reader

    # -- recovery ----------------------------------------------------------------------------

    def _recover(self, start_at=None):
        """Make the files and the state agree: indexes of finished segments
        exist, the active (last) segment ends at its last good record, its
        indexes cover it; then commit that.  An empty new log begins at
        start_at (msg offset, virtual offset), else at 0."""
        cdef uint64_t base_virtual
        bases = _segment_bases(self.path)
        had_state = self.state.magic == NSQSHM_LOG_MAGIC
        if not bases:
            start, startv = start_at if start_at is not None else (0, 0)
            if had_state:
                start, startv = self.c.next_offset, self.c.virtual_end
            self.c.start_offset, self.c.start_virtual = start, startv
            self._new_segment(start, startv)
            self._commit()
            return
        # base virtual offsets: from the index headers, else summed
        virtuals = []
        for i, b in enumerate(bases):
            v = self._header_virtual(b)
            if v is None:
                if i:
                    v = virtuals[i - 1] + os.path.getsize(self._prefix(bases[i - 1]) + ".log")
                elif had_state and self.c.start_offset == b:
                    v = self.c.start_virtual
                else:
                    v = 0
            virtuals.append(v)
        for b, nb, v in zip(bases, bases[1:], virtuals):
            if self._header_virtual(b) is None or not self._time_header_ok(b):
                self._log("warn", f"rebuilding the indexes of segment {b:020d}")
                self._rebuild(b, v, nb)
        last, lastv = bases[len(bases) - 1], virtuals[len(virtuals) - 1]
        self.c.start_offset, self.c.start_virtual = bases[0], virtuals[0]
        self._recover_active(last, lastv)
        self._commit()
        self.sync()

    def _header_virtual(self, uint64_t base):
        try:
            with open(self._prefix(base) + ".index", "rb") as f:
                h = f.read(32)
        except FileNotFoundError:
            return None
        if len(h) != 32 or h[:8] != b"NSQLIDX1" or int.from_bytes(h[8:16], "big") != base:
            return None
        return int.from_bytes(h[16:24], "big")

    def _time_header_ok(self, uint64_t base):
        try:
            with open(self._prefix(base) + ".timeindex", "rb") as f:
                h = f.read(32)
        except FileNotFoundError:
            return False
        return len(h) == 32 and h[:8] == b"NSQLTIM1" and int.from_bytes(h[8:16], "big") == base

    def _rebuild(self, uint64_t base, uint64_t base_virtual, next_base):
        """Write a finished segment's indexes again from its records."""
        self._close_active()
        self.dfd = os.open(self._prefix(base) + ".log", os.O_RDWR | os.O_CLOEXEC)
        flags = os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        self.ifd = os.open(self._prefix(base) + ".index", flags, 0o600)
        self.tfd = os.open(self._prefix(base) + ".timeindex", flags, 0o600)
        os.pwrite(self.ifd, self._index_header(b"NSQLIDX1", base, base_virtual), 0)
        os.pwrite(self.tfd, self._index_header(b"NSQLTIM1", base, base_virtual), 0)
        self.isize = self.tsize = NSQSHM_LOG_INDEX_HEADER
        self.c.active_base_offset = base
        self.c.active_base_virtual = base_virtual
        self.last_idx_pos = 0
        size = os.fstat(self.dfd).st_size
        good, end_off = self._scan(0, base, size)
        cdef char *t = self.ptim.reserve(12)
        nsqshm_put_be64(t, self.max_ts)
        nsqshm_put_be32(t + 8, <uint32_t>(end_off - base))
        self._flush_index()
        self._close_active()

    def _recover_active(self, uint64_t base, uint64_t base_virtual):
        """Open the last segment for appending: from its last index entry
        whose record checks out, scan with crc; truncate a torn tail; index
        what the index missed."""
        cdef uint64_t from_pos = 0, from_off = base, rel, epos
        prefix = self._prefix(base)
        self.dfd = os.open(prefix + ".log", os.O_RDWR | os.O_CLOEXEC)
        size = os.fstat(self.dfd).st_size
        self.c.active_base_offset = base
        self.c.active_base_virtual = base_virtual
        self.max_ts = 0
        ok = self._header_virtual(base) == base_virtual
        entries = []
        times = []
        if ok:
            with open(prefix + ".index", "rb") as f:
                raw = f.read()[32:]
            entries = [(int.from_bytes(raw[i:i + 4], "big"), int.from_bytes(raw[i + 4:i + 8], "big"))
                       for i in range(0, len(raw) - 7, 8)]
            try:
                with open(prefix + ".timeindex", "rb") as f:
                    rawt = f.read()
            except FileNotFoundError:
                rawt = b""
            if rawt[:8] != b"NSQLTIM1":
                ok = False
            rawt = rawt[32:]
            times = [(int.from_bytes(rawt[i:i + 8], "big"), int.from_bytes(rawt[i + 8:i + 12], "big"))
                     for i in range(0, len(rawt) - 11, 12)]
        # the last index entry whose record is whole and good, with its time entry
        keep = 0
        if ok:
            for k in range(len(entries), 0, -1):
                rel, epos = entries[k - 1]
                if k <= len(times) and times[k - 1][1] == rel and \
                        self._record_ok(epos, base + rel, size):
                    keep = k
                    break
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC
        self.ifd = os.open(prefix + ".index", flags, 0o600)
        self.tfd = os.open(prefix + ".timeindex", flags, 0o600)
        if not ok:
            self._log("warn", f"rebuilding the indexes of segment {base:020d}")
            os.ftruncate(self.ifd, 0)
            os.ftruncate(self.tfd, 0)
            os.pwrite(self.ifd, self._index_header(b"NSQLIDX1", base, base_virtual), 0)
            os.pwrite(self.tfd, self._index_header(b"NSQLTIM1", base, base_virtual), 0)
        self.isize = NSQSHM_LOG_INDEX_HEADER + keep * 8
        self.tsize = NSQSHM_LOG_INDEX_HEADER + keep * 12
        os.ftruncate(self.ifd, self.isize)
        os.ftruncate(self.tfd, self.tsize)
        if keep:
            rel, epos = entries[keep - 1]
            from_pos, from_off = epos, base + rel
            self.last_idx_pos = epos
            self.max_ts = times[keep - 1][0]
        else:
            self.last_idx_pos = 0
        good, end_off = self._scan(from_pos, from_off, size)
        self._flush_index()
        if good < size:
            self._log("warn", f"segment {base:020d}: torn tail truncated at byte {good} "
                              f"(msg offset {end_off}); {size - good} bytes after it dropped")
            os.ftruncate(self.dfd, good)
            os.fsync(self.dfd)
        self.wpos = good
        self.c.next_offset = end_off
        self.c.virtual_end = base_virtual + good

    def _record_ok(self, uint64_t pos, uint64_t offset, uint64_t size):
        h = os.pread(self.dfd, 16, pos)
        if len(h) < 16:
            return False
        n = int.from_bytes(h[:4], "big")
        if n < 8 + MESSAGE_HEADER or pos + 8 + n > size or int.from_bytes(h[8:16], "big") != offset:
            return False
        body = os.pread(self.dfd, n, pos + 8)
        return len(body) == n and crc32c(body) == int.from_bytes(h[4:8], "big")

    def _scan(self, uint64_t pos, uint64_t offset, uint64_t size):
        """Walk the records of the open segment from pos (msg offset
        `offset`) while each is whole, in sequence and its crc matches,
        indexing them; (end of the last good record, next msg offset)."""
        cdef const char *base
        cdef void *p
        cdef uint64_t n, good, count = 0, max_n
        if size == 0 or pos >= size:
            return pos, offset
        p = mmap(NULL, size, PROT_READ, MAP_SHARED, self.dfd, 0)
        if p == MAP_FAILED:
            raise OSError(errno, os.strerror(errno))
        base = <const char *>p
        max_n = 8 + <uint64_t>self.max_msg_size
        try:
            while pos + 16 <= size:
                # the crcs of a few MiB of records without the GIL (a cut's recovery
                # runs on a thread of the hub's pool: the worker's loop goes on), then
                # the same records indexed with it (a few loads each)
                with nogil:
                    good = _verify_run(base, pos, offset, size, pos + SCAN_CHUNK, max_n, &count)
                while pos < good:
                    n = nsqshm_be32(base + pos)
                    self._account(pos, offset, nsqshm_be64(base + pos + 16))
                    pos += 8 + n
                    offset += 1
                if count == 0 or pos >= size:
                    break
        finally:
            munmap(p, size)
        return pos, offset

    # -- retention -------------------------------------------------------------------------

    def apply_retention(self, double max_age_s=-1, long long max_bytes=-1, keep_from=None):
        """Delete whole finished segments, oldest first, while the oldest is
        older than max_age_s (its newest message) or the log is larger than
        max_bytes (-1: no limit), never one that holds msg offset keep_from
        or later (a replicated partition's committed end: what some in-sync
        replica may still need).  The new start is committed before the
        files go.  [(base offset, end offset, bytes)] of what was removed."""
        bases = _segment_bases(self.path)
        bases = [b for b in bases if self.c.start_offset <= b < self.c.active_base_offset]
        total = self.c.virtual_end - self.c.start_virtual
        now = time.time_ns()
        removed = []
        for i, b in enumerate(bases):
            nb = bases[i + 1] if i + 1 < len(bases) else self.c.active_base_offset
            nv = self._header_virtual(nb) if i + 1 < len(bases) else self.c.active_base_virtual
            size = nv - self.c.start_virtual
            old = max_age_s >= 0 and self._segment_max_ts(b) < now - max_age_s * 1e9
            big = max_bytes >= 0 and total > max_bytes
            if not (old or big) or (keep_from is not None and nb > keep_from):
                break
            removed.append((b, nb, size))
            total -= size
            self.c.start_offset, self.c.start_virtual = nb, nv
        if removed:
            self._commit()
            for b, _, _ in removed:
                for ext in (".log", ".index", ".timeindex"):
                    try:
                        os.unlink(self._prefix(b) + ext)
                    except FileNotFoundError:
                        pass
            self._log("info", f"retention removed {len(removed)} segments; "
                              f"the log starts at {self.c.start_offset}")
        return removed

    def _segment_max_ts(self, uint64_t base):
        """The newest message timestamp of a finished segment (its closing
        time entry), or its file's mtime."""
        prefix = self._prefix(base)
        try:
            with open(prefix + ".timeindex", "rb") as f:
                f.seek(0, 2)
                if f.tell() >= 44:
                    f.seek(-12, 2)
                    return int.from_bytes(f.read(8), "big")
        except FileNotFoundError:
            pass
        return os.stat(prefix + ".log").st_mtime_ns

    def close(self):
        """Sync and close (the files stay)."""
        if self.dfd >= 0:
            self.sync()
        self._close_active()
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        if self.state != NULL:
            self.state.writer_pid = 0
            munmap(self.state, NSQSHM_LOG_STATE_SIZE)
            self.state = NULL
        if self.state_fd >= 0:
            close(self.state_fd)   # and the flock with it
            self.state_fd = -1

    def __dealloc__(self):
        if self.staging != NULL:
            free(self.staging)
        for fd in (self.dfd, self.ifd, self.tfd, self.state_fd):
            if fd >= 0:
                close(fd)
        if self.finished_fds:
            for fd in self.finished_fds:
                close(fd)
        if self.state != NULL:
            munmap(self.state, NSQSHM_LOG_STATE_SIZE)
