"""A disk queue with go-diskqueue's files and semantics, written and read
through mmap (nsqd's backend for topics and non-ephemeral channels).

Files in the data path, as go-diskqueue v1.1 (nsqd 1.3) names them:

    <name>.diskqueue.%06d.dat     segments, rolled at max_bytes_per_file
    <name>.diskqueue.meta.dat     "depth\\nreadFileNum,readPos\\nwriteFileNum,writePos\\n"

A segment is a sequence of records, each

    [ 4-byte big-endian size ][ size bytes: one message in nsqd's encoding ]

with min_msg_size <= size <= max_msg_size.  A writer rolls to the next
segment before a record that would take the file past max_bytes_per_file
(unless the file is empty) and truncates the finished file to its data, so
a reader of a finished segment reads up to the file's size and a reader of
the current one up to writePos, exactly as go-diskqueue does.

Space for the current segment is reserved with posix_fallocate a chunk at a
time, so a full disk is an ENOSPC from a write call and never a SIGBUS from
a store into the mapping.  The metadata is written to a temp file, fsynced
and renamed.  A record whose size is impossible makes its segment `.bad`:
it is renamed and skipped, with an error logged.

Batches cross this boundary packed as the rings take them:
[ u32 native size ][ message ]...  Reading is peek_into then advance(n),
so a record leaves the disk queue only once the caller has put it
somewhere (a ring); a crash in between can repeat it, never lose it.
"""

import os
import random

from cpython.buffer cimport PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from libc.stdint cimport int64_t, uint32_t
from libc.string cimport memcpy

from nsqshm._core.codec cimport get_u32be, put_u32be
from nsqshm._core.includes.system cimport (
    MAP_FAILED, MAP_SHARED, PROT_READ, PROT_WRITE, close, errno, mmap, munmap,
)

cdef extern from "<fcntl.h>" nogil:
    int posix_fallocate(int fd, long offset, long length)

cdef extern from "<sys/mman.h>" nogil:
    int MS_SYNC
    int msync(void *addr, size_t length, int flags)
    int madvise(void *addr, size_t length, int advice)

cdef int MADV_POPULATE_WRITE = 23  # Linux >= 5.14; older kernels: EINVAL, ignored

cdef extern from "<unistd.h>" nogil:
    int ftruncate(int fd, long length)
    int fsync(int fd)

cdef long long RESERVE_CHUNK = 4 << 20
FAULT_ENV = "NSQSHM_FAULT_ENOSPC"   # a path: while it exists, writes fail with ENOSPC


class DiskQueueError(OSError):
    """A write failed; `written` records of the batch went in before it."""

    def __init__(self, err, msg, written=0):
        super().__init__(err, msg)
        self.written = written


cdef class _Segment:
    """One mapped segment file."""
    cdef int fd
    cdef char *base
    cdef long long mapped      # bytes mapped
    cdef long long reserved    # bytes allocated on disk (writer)
    cdef readonly str path
    cdef bint writable

    def __cinit__(self):
        self.fd = -1
        self.base = NULL
        self.mapped = 0
        self.reserved = 0

    def open(self, str path, bint writable):
        self.path = path
        self.writable = writable
        self.fd = os.open(path, (os.O_RDWR | os.O_CREAT) if writable else os.O_RDONLY, 0o600)
        self.reserved = os.fstat(self.fd).st_size
        self._map(self.reserved)

    cdef int _map(self, long long size) except -1:
        cdef void *p
        if self.base != NULL:
            munmap(self.base, self.mapped)
            self.base = NULL
            self.mapped = 0
        if size <= 0:
            return 0
        p = mmap(NULL, size, PROT_READ | PROT_WRITE if self.writable else PROT_READ,
                 MAP_SHARED, self.fd, 0)
        if p == MAP_FAILED:
            raise OSError(errno, os.strerror(errno), self.path)
        self.base = <char *>p
        self.mapped = size
        return 0

    cdef int reserve(self, long long end, long long limit) except -1:
        """Make [0, end) writable, allocating ahead up to `limit` bytes."""
        cdef long long want
        cdef int r
        if end <= self.reserved:
            if end > self.mapped:
                self._map(self.reserved)
            return 0
        want = min(max(end, self.reserved + RESERVE_CHUNK), max(limit, end))
        r = posix_fallocate(self.fd, self.reserved, want - self.reserved)
        if r != 0 and r != 95:  # EOPNOTSUPP: grow with ftruncate instead
            raise OSError(r, os.strerror(r), self.path)
        if r == 95 and ftruncate(self.fd, want) != 0:
            raise OSError(errno, os.strerror(errno), self.path)
        cdef long long old = self.reserved & ~(<long long>4095)
        self.reserved = want
        self._map(want)
        # fault the new chunk in writable in one call: on ext4 and the like a store
        # into a fresh page of a shared file mapping otherwise traps once per page
        madvise(self.base + old, want - old, MADV_POPULATE_WRITE)
        return 0

    cdef int refresh(self) except -1:
        """Map the whole file again (a reader of a file still growing)."""
        cdef long long size = os.fstat(self.fd).st_size
        if size != self.mapped:
            self._map(size)
        return 0

    def sync(self, long long length):
        if self.base != NULL and length > 0:
            msync(self.base, min(length, self.mapped), MS_SYNC)
        if self.fd >= 0 and fsync(self.fd) != 0:
            raise OSError(errno, os.strerror(errno), self.path)

    def finish(self, long long length):
        """Close a written segment, its size cut to its data."""
        self.sync(length)
        if self.writable:
            ftruncate(self.fd, length)
        self.close()

    def close(self):
        if self.base != NULL:
            munmap(self.base, self.mapped)
            self.base = NULL
            self.mapped = 0
        if self.fd >= 0:
            close(self.fd)
            self.fd = -1

    def __dealloc__(self):
        if self.base != NULL:
            munmap(self.base, self.mapped)
        if self.fd >= 0:
            close(self.fd)


cdef class DiskQueue:
    cdef readonly str name
    cdef readonly str data_path
    cdef readonly long long max_bytes_per_file
    cdef readonly int min_msg_size
    cdef readonly int max_msg_size
    cdef readonly long long sync_every
    cdef readonly long long depth
    cdef readonly long long read_file_num
    cdef readonly long long read_pos
    cdef readonly long long write_file_num
    cdef readonly long long write_pos
    cdef readonly long long writes_since_sync
    cdef readonly bint dirty
    cdef _Segment writer
    cdef _Segment reader
    cdef long long reader_num
    cdef object logf
    # where the last peek_into ended, so that advance() of exactly what was
    # peeked is O(1): (records, start file, start pos, end file, end pos)
    cdef Py_ssize_t peek_count
    cdef long long peek_from_num, peek_from_pos, peek_num, peek_pos

    def __init__(self, str name, str data_path, long long max_bytes_per_file,
                 int min_msg_size, int max_msg_size, long long sync_every=2500, logf=None):
        if "/" in name or name in ("", ".", ".."):
            raise ValueError(f"invalid disk queue name {name!r}")
        self.name = name
        self.data_path = data_path
        self.max_bytes_per_file = max_bytes_per_file
        self.min_msg_size = min_msg_size
        self.max_msg_size = max_msg_size
        self.sync_every = max(sync_every, 1)
        self.logf = logf
        self.writer = None
        self.reader = None
        self.reader_num = -1
        self.peek_count = -1
        self._retrieve_metadata()

    # -- names and metadata ------------------------------------------------------------

    def file_name(self, long long num):
        return os.path.join(self.data_path, f"{self.name}.diskqueue.{num:06d}.dat")

    def metadata_file_name(self):
        return os.path.join(self.data_path, f"{self.name}.diskqueue.meta.dat")

    def _log(self, str level, str msg):
        if self.logf is not None:
            self.logf(level, f"DISKQUEUE({self.name}): {msg}")

    def _retrieve_metadata(self):
        try:
            with open(self.metadata_file_name()) as f:
                text = f.read()
        except FileNotFoundError:
            return
        try:
            depth, read, write = text.split("\n")[:3]
            self.depth = int(depth)
            self.read_file_num, self.read_pos = (int(x) for x in read.split(","))
            self.write_file_num, self.write_pos = (int(x) for x in write.split(","))
        except ValueError:
            self._log("error", f"failed to retrieveMetaData - bad metadata {text!r}")
            self.depth = self.read_file_num = self.read_pos = 0
            self.write_file_num = self.write_pos = 0

    def _persist_metadata(self):
        name = self.metadata_file_name()
        tmp = f"{name}.{random.getrandbits(63)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, (f"{self.depth}\n{self.read_file_num},{self.read_pos}\n"
                          f"{self.write_file_num},{self.write_pos}\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, name)

    # -- writing ------------------------------------------------------------------------

    cdef int _open_writer(self) except -1:
        if self.writer is None:
            self.writer = _Segment()
            self.writer.open(self.file_name(self.write_file_num), True)
        return 0

    cdef int _roll(self) except -1:
        if self.writer is not None:
            self.writer.finish(self.write_pos)
            self.writer = None
        if self.reader is not None and self.reader_num == self.write_file_num:
            self.reader.refresh()
        self.write_file_num += 1
        self.write_pos = 0
        self.dirty = True
        return 0

    def put_packed(self, packed, Py_ssize_t max_records=-1):
        """Append records packed [u32 native size][message]...; returns
        (records, bytes of `packed` used).  A failure raises
        DiskQueueError with .written; what was written stays."""
        cdef Py_buffer view
        cdef const char *p
        cdef Py_ssize_t pos = 0, n, count = 0
        cdef uint32_t size
        cdef long long total
        fault = os.environ.get(FAULT_ENV)
        if fault and os.path.exists(fault):  # the test suite's full disk
            raise DiskQueueError(28, f"{os.strerror(28)} ({self.file_name(self.write_file_num)})")
        PyObject_GetBuffer(packed, &view, PyBUF_SIMPLE)
        try:
            p = <const char *>view.buf
            n = view.len
            while pos + 4 <= n and (max_records < 0 or count < max_records):
                size = (<const uint32_t *>(p + pos))[0]
                if pos + 4 + size > n:
                    raise ValueError(f"truncated record at byte {pos}")
                if size < <uint32_t>self.min_msg_size or size > <uint32_t>self.max_msg_size:
                    raise ValueError(f"invalid message write size ({size}) "
                                     f"maxMsgSize={self.max_msg_size}")
                total = 4 + size
                try:
                    if self.write_pos > 0 and self.write_pos + total > self.max_bytes_per_file:
                        self._roll()
                    self._open_writer()
                    self.writer.reserve(self.write_pos + total, self.max_bytes_per_file)
                except OSError as err:
                    raise DiskQueueError(err.errno, f"{err.strerror} ({err.filename})",
                                         count) from None
                put_u32be(self.writer.base + self.write_pos, size)
                memcpy(self.writer.base + self.write_pos + 4, p + pos + 4, size)
                self.write_pos += total
                self.depth += 1
                self.writes_since_sync += 1
                pos += 4 + size
                count += 1
        finally:
            PyBuffer_Release(&view)
        if self.writes_since_sync >= self.sync_every:
            self.sync()
        return count, pos

    def sync(self):
        """msync and fsync the current segment, then persist the metadata."""
        if self.writer is not None:
            self.writer.sync(self.write_pos)
        self._persist_metadata()
        self.writes_since_sync = 0
        self.dirty = False

    @property
    def needs_sync(self):
        return self.writes_since_sync > 0 or self.dirty

    # -- reading --------------------------------------------------------------------------

    cdef _Segment _reader_for(self, long long num):
        cdef _Segment seg
        if num == self.write_file_num and self.writer is not None:
            return self.writer
        if self.reader is None or self.reader_num != num:
            if self.reader is not None:
                self.reader.close()
            self.reader = None
            seg = _Segment()
            seg.open(self.file_name(num), False)
            self.reader = seg
            self.reader_num = num
        return self.reader

    cdef int _skip_bad(self, str why) except -1:
        """The read segment is corrupt: rename it .bad and go on with the next."""
        bad = self.file_name(self.read_file_num)
        self._log("error", f"reading at {self.read_pos} of {bad} - {why}")
        if self.reader is not None and self.reader_num == self.read_file_num:
            self.reader.close()
            self.reader = None
        if self.read_file_num == self.write_file_num:
            if self.writer is not None:
                self.writer.close()
                self.writer = None
            self.write_file_num += 1
            self.write_pos = 0
        try:
            os.rename(bad, bad + ".bad")
            self._log("warn", f"jump to next file and saving bad file as {bad}.bad")
        except OSError as err:
            self._log("error", f"failed to rename bad diskqueue file {bad} - {err}")
        self.read_file_num += 1
        self.read_pos = 0
        self.dirty = True
        return 0

    cdef int _walk(self, char *out, Py_ssize_t room, Py_ssize_t max_records,
                   Py_ssize_t *count_out, Py_ssize_t *bytes_out, bint commit) except -1:
        """Read records from the read position: copy them packed into `out`
        (if not NULL) and, with commit, advance past them.  0, or 1 when a
        corrupt segment was set aside and the walk must start again."""
        cdef long long num = self.read_file_num, pos = self.read_pos, end = 0
        cdef long long seg_num = -1
        cdef Py_ssize_t count = 0, written = 0
        cdef _Segment seg = None
        cdef uint32_t size
        while (max_records < 0 or count < max_records) and \
                (num < self.write_file_num or pos < self.write_pos):
            if seg_num != num:
                try:
                    seg = self._reader_for(num)
                except FileNotFoundError:
                    if commit or count == 0:
                        self.read_file_num, self.read_pos = num, pos
                        self._skip_bad("segment missing")
                        num, pos = self.read_file_num, self.read_pos
                        continue
                    break
                seg_num = num
                if num != self.write_file_num and seg.mapped == 0:
                    seg.refresh()
            end = self.write_pos if num == self.write_file_num else seg.mapped
            if pos >= end:
                if num < self.write_file_num:
                    if commit:  # a finished segment fully read: delete it
                        if seg is self.reader:
                            self.reader.close()
                            self.reader = None
                        seg_num = -1
                        try:
                            os.unlink(self.file_name(num))
                        except OSError as err:
                            self._log("error", f"failed to Remove({self.file_name(num)}) - {err}")
                        self.dirty = True
                    num += 1
                    pos = 0
                    seg_num = -1
                    if commit:
                        self.read_file_num, self.read_pos = num, pos
                    continue
                break
            size = get_u32be(seg.base + pos) if end - pos >= 4 else 0
            if end - pos < 4 or size < <uint32_t>self.min_msg_size \
                    or size > <uint32_t>self.max_msg_size or pos + 4 + size > end:
                if count:  # hand over the good records first; the next read sets it aside
                    break
                self.read_file_num, self.read_pos = num, pos
                self._skip_bad("truncated record size" if end - pos < 4
                               else f"invalid message read size ({<int>size})")
                return 1  # a segment was set aside: read again
            if out != NULL:
                if written + 4 + size > room:
                    break
                (<uint32_t *>(out + written))[0] = size
                memcpy(out + written + 4, seg.base + pos + 4, size)
                written += 4 + size
            pos += 4 + size
            count += 1
            if commit:
                self.read_pos = pos
                self.read_file_num = num
                self.depth -= 1
        count_out[0] = count
        bytes_out[0] = written
        if not commit:
            self.peek_count = count
            self.peek_from_num, self.peek_from_pos = self.read_file_num, self.read_pos
            self.peek_num, self.peek_pos = num, pos
        if commit and self.read_file_num == self.write_file_num \
                and self.read_pos == self.write_pos and self.depth != 0:
            self._log("error", f"{'positive' if self.depth > 0 else 'negative'} depth at tail "
                      f"({self.depth}), resetting 0...")
            self.depth = 0
            self.dirty = True
        return 0

    def peek_into(self, buffer, Py_ssize_t max_records=-1):
        """Copy records from the read position into `buffer`, packed
        [u32 native size][message]..., without consuming them: (records, bytes).
        A corrupt segment met on the way is set aside (.bad) and skipped."""
        cdef Py_buffer view
        cdef Py_ssize_t count = 0, nbytes = 0
        PyObject_GetBuffer(buffer, &view, PyBUF_WRITABLE)
        try:
            while self._walk(<char *>view.buf, view.len, max_records, &count, &nbytes, False) == 1:
                pass
        finally:
            PyBuffer_Release(&view)
        return count, nbytes

    def advance(self, Py_ssize_t records):
        """Consume `records` records from the read position (after peek_into)."""
        cdef Py_ssize_t count = 0, nbytes = 0
        if records <= 0:
            return 0
        if records == self.peek_count and self.peek_from_num == self.read_file_num \
                and self.peek_from_pos == self.read_pos and self.peek_num == self.read_file_num:
            # exactly what the last peek read, within one segment: no walk
            self.read_pos = self.peek_pos
            self.depth -= records
            self.peek_count = -1
            count = records
        else:
            self._walk(NULL, 0, records, &count, &nbytes, True)
            self.peek_count = -1
        self.writes_since_sync += count
        if self.writes_since_sync >= self.sync_every:
            self.sync()
        return count

    # -- empty, delete, close ------------------------------------------------------------------

    def empty(self):
        """Drop everything: delete the segments, start at the next file."""
        if self.reader is not None:
            self.reader.close()
            self.reader = None
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        for num in range(self.read_file_num, self.write_file_num + 1):
            try:
                os.unlink(self.file_name(num))
            except FileNotFoundError:
                pass
        self.write_file_num += 1
        self.write_pos = 0
        self.read_file_num = self.write_file_num
        self.read_pos = 0
        self.depth = 0
        self.sync()

    def delete(self):
        """Remove the queue's files (topic or channel deleted)."""
        self.empty()
        try:
            os.unlink(self.metadata_file_name())
        except FileNotFoundError:
            pass

    def close(self):
        """Sync, truncate the current segment to its data, and close."""
        if self.writer is not None:
            self.writer.finish(self.write_pos)
            self.writer = None
        if self.reader is not None:
            self.reader.close()
            self.reader = None
        self._persist_metadata()
        self.writes_since_sync = 0
