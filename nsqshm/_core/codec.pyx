"""NSQ's message encoding and frames, and broker-wide message IDs.

A message, as nsqd writes it to clients and to disk (all big-endian):

    [ 8-byte timestamp, ns ][ 2-byte attempts ][ 16-byte ID ][ N-byte body ]

A frame on the TCP protocol:

    [ 4-byte size ][ 4-byte frame type ][ size - 4 bytes of data ]

frame type 0 is a response, 1 an error, 2 a message.

A message published with a time to live of its own carries its deadline
after its body (includes/message_expiry.h; with_expiry() adds it).

A message ID is 16 ASCII hex digits (lowercase) of a 64-bit value, as nsqd's
guid.Hex(): milliseconds since nsqd's epoch, the node ID (--node-id) and a
sequence number.  IdGenerator hands them out from a clock in a shared memory
segment, so every process of a broker (workers, local producers in Spark
executors) draws unique IDs; see its docstring for the layout and for how a
restarted broker never repeats one.
"""

import os
import time

import posix_ipc

from cpython.buffer cimport PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport int64_t, uint16_t, uint32_t, uint64_t

from nsqshm._core.includes.system cimport (
    CLOCK_REALTIME, MAP_FAILED, MAP_SHARED, O_CLOEXEC, O_RDWR, PROT_READ, PROT_WRITE,
    clock_gettime, close, errno, memcpy, mmap, munmap, nsqshm_cas, nsqshm_cas32,
    nsqshm_fetch_add, nsqshm_load32_acquire, nsqshm_load_acquire, nsqshm_store32_release,
    nsqshm_store_release, snprintf, timespec,
)
from nsqshm._core.includes.system cimport open as c_open
from nsqshm._core.includes.system cimport (
    NSQSHM_EXPIRY_BIT, NSQSHM_EXPIRY_SIZE, nsqshm_put_be64,
)

from nsqshm._core import segment


cdef extern from "<fcntl.h>" nogil:
    int O_CREAT


cdef extern from "<sys/file.h>" nogil:
    int flock(int fd, int operation)
    int LOCK_EX
    int LOCK_UN


cdef extern from "<unistd.h>" nogil:
    ssize_t pread(int fd, void *buf, size_t n, long offset)
    ssize_t pwrite(int fd, const void *buf, size_t n, long offset)
    int fsync(int fd)

FRAME_TYPE_RESPONSE = 0
FRAME_TYPE_ERROR = 1
FRAME_TYPE_MESSAGE = 2
MESSAGE_HEADER_SIZE = MSG_HEADER_SIZE
MESSAGE_ID_SIZE = MSG_ID_SIZE
NSQD_EPOCH_MS = 1288834974657

cdef uint64_t ID_MAGIC = 0x44496d687371736e   # "nsqshmID" little-endian
cdef uint32_t ID_VERSION = 2
cdef uint64_t ID_BLOCK = 1024                # clock values a process reserves at once
cdef size_t ID_SEGMENT_SIZE = 4096
cdef enum:
    ID_PATH_MAX = 3900
cdef uint64_t ID_NO_LEASE = 0xFFFFFFFFFFFFFFFF
cdef uint64_t ID_RETIRED = 0x54526d687371736e  # "nsqshmRT": an older build's segment being replaced
cdef uint64_t ID_LEASE_AHEAD = 60000 << 12  # a minute of ID clock
LEASE_FILE = "nsqshm.ids.dat"  # the lease's name in a broker's data path
cdef const char *HEX = b"0123456789abcdef"
cdef int _fork_generation = 0


def _after_fork_in_child():
    global _fork_generation
    _fork_generation += 1


os.register_at_fork(after_in_child=_after_fork_in_child)


cdef void put_u32be(char *dst, unsigned int v) noexcept nogil:
    dst[0] = <char>(v >> 24)
    dst[1] = <char>(v >> 16)
    dst[2] = <char>(v >> 8)
    dst[3] = <char>v


cdef unsigned int get_u32be(const char *src) noexcept nogil:
    cdef const unsigned char *s = <const unsigned char *>src
    return (<unsigned int>s[0] << 24) | (<unsigned int>s[1] << 16) | \
        (<unsigned int>s[2] << 8) | s[3]


cdef void put_message_header(char *dst, uint64_t timestamp, uint16_t attempts,
                             const char *msg_id) noexcept nogil:
    cdef int i
    for i in range(8):
        dst[i] = <char>(timestamp >> (56 - 8 * i))
    dst[8] = <char>(attempts >> 8)
    dst[9] = <char>attempts
    memcpy(dst + 10, msg_id, MSG_ID_SIZE)


cdef void hex_id(char *dst, uint64_t v) noexcept nogil:
    cdef int i
    for i in range(16):
        dst[15 - i] = HEX[v & 0xF]
        v >>= 4


def encode_message(bytes msg_id, uint64_t timestamp, uint16_t attempts, body):
    """The bytes of one message: timestamp, attempts, ID, body."""
    cdef Py_buffer view
    if len(msg_id) != MSG_ID_SIZE:
        raise ValueError(f"message ID must be {MSG_ID_SIZE} bytes, got {len(msg_id)}")
    PyObject_GetBuffer(body, &view, PyBUF_SIMPLE)
    try:
        out = PyBytes_FromStringAndSize(NULL, MSG_HEADER_SIZE + view.len)
        put_message_header(PyBytes_AS_STRING(out), timestamp, attempts, PyBytes_AS_STRING(msg_id))
        memcpy(PyBytes_AS_STRING(out) + MSG_HEADER_SIZE, view.buf, view.len)
    finally:
        PyBuffer_Release(&view)
    return out


def with_expiry(records, Py_ssize_t nbytes, int64_t expires_at, bytearray out not None):
    """Append the packed records ([u32 native size][message]) of
    records[:nbytes] to out, each message with `expires_at` (ns since the
    epoch) as its own deadline (includes/message_expiry.h: the bit in its
    attempts field, 8 bytes after its body).  Returns how many records."""
    cdef Py_buffer view
    cdef const char *src
    cdef char *dst
    cdef Py_ssize_t pos = 0, n = 0, base, grow = 0
    cdef uint32_t size, longer
    PyObject_GetBuffer(records, &view, PyBUF_SIMPLE)
    try:
        if nbytes < 0 or nbytes > view.len:
            raise ValueError(f"nbytes {nbytes} is outside the {view.len}-byte buffer")
        src = <const char *>view.buf
        while pos < nbytes:  # check and size first
            if nbytes - pos < 4:
                raise ValueError(f"a record header runs past byte {nbytes}")
            memcpy(&size, src + pos, 4)
            if size < MSG_HEADER_SIZE or nbytes - pos - 4 < <Py_ssize_t>size:
                raise ValueError(f"bad record of {size} bytes at byte {pos}")
            if (<const unsigned char *>src)[pos + 4 + 8] & NSQSHM_EXPIRY_BIT:
                raise ValueError(f"the record at byte {pos} has a deadline already")
            pos += 4 + size
            grow += 4 + size + NSQSHM_EXPIRY_SIZE
        base = PyByteArray_GET_SIZE(out)
        PyByteArray_Resize(out, base + grow)
        dst = PyByteArray_AS_STRING(out) + base
        pos = 0
        while pos < nbytes:
            memcpy(&size, src + pos, 4)
            longer = size + NSQSHM_EXPIRY_SIZE
            memcpy(dst, &longer, 4)
            memcpy(dst + 4, src + pos + 4, size)
            dst[4 + 8] = <char>((<unsigned char>dst[4 + 8]) | NSQSHM_EXPIRY_BIT)
            nsqshm_put_be64(dst + 4 + size, <uint64_t>expires_at)
            dst += 4 + longer
            pos += 4 + size
            n += 1
    finally:
        PyBuffer_Release(&view)
    return n


def decode_message(data):
    """(id, timestamp, attempts, body) of an encoded message."""
    cdef Py_buffer view
    cdef const unsigned char *p
    cdef uint64_t ts = 0
    cdef int i
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        if view.len < MSG_HEADER_SIZE:
            raise ValueError(f"message of {view.len} bytes is shorter than its "
                             f"{MSG_HEADER_SIZE}-byte header")
        p = <const unsigned char *>view.buf
        for i in range(8):
            ts = (ts << 8) | p[i]
        attempts = (p[8] << 8) | p[9]
        msg_id = PyBytes_FromStringAndSize(<const char *>p + 10, MSG_ID_SIZE)
        body = PyBytes_FromStringAndSize(<const char *>p + MSG_HEADER_SIZE,
                                         view.len - MSG_HEADER_SIZE)
    finally:
        PyBuffer_Release(&view)
    return msg_id, ts, attempts, body


def encode_frame(unsigned int frame_type, data):
    """A frame: size (4 + len(data)), type, data."""
    cdef Py_buffer view
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        out = PyBytes_FromStringAndSize(NULL, 8 + view.len)
        put_u32be(PyBytes_AS_STRING(out), <unsigned int>(4 + view.len))
        put_u32be(PyBytes_AS_STRING(out) + 4, frame_type)
        memcpy(PyBytes_AS_STRING(out) + 8, view.buf, view.len)
    finally:
        PyBuffer_Release(&view)
    return out


def decode_frame(data):
    """(frame_type, payload, bytes consumed) of the first frame in `data`,
    or None when `data` does not yet hold a whole frame."""
    cdef Py_buffer view
    cdef unsigned int size
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        if view.len < 8:
            return None
        size = get_u32be(<const char *>view.buf)
        if size < 4:
            raise ValueError(f"frame size {size} is smaller than its 4-byte type")
        if view.len < 4 + <Py_ssize_t>size:
            return None
        frame_type = get_u32be(<const char *>view.buf + 4)
        payload = PyBytes_FromStringAndSize(<const char *>view.buf + 8, size - 4)
    finally:
        PyBuffer_Release(&view)
    return frame_type, payload, 4 + size


def id_to_int(bytes msg_id):
    """The 64-bit value of a hex message ID."""
    return int(msg_id, 16)


def int_to_id(uint64_t value):
    cdef char buf[16]
    hex_id(buf, value)
    return PyBytes_FromStringAndSize(buf, 16)


cdef class IdGenerator:
    """Unique message IDs for every process of one broker, with nsqd's layout.

    An ID is nsqd's guid (nsqd/guid.go), 16 lowercase hex digits of

        63          22 21        12 11         0
        [ ms since     ][ node ID   ][ sequence  ]
        [ 2010-11-04.. ][ 10 bits   ][ 12 bits   ]

    so two brokers with different --node-id never issue the same ID.  The
    (ms, sequence) pair is one 54-bit clock in the segment, shared by every
    process of the broker (workers, local producers); a process reserves a
    block of it with one compare-and-swap, starting at max(clock, now): the
    clock never goes back, not even when the wall clock does.  nsqd sleeps a
    millisecond when that millisecond's 4096 sequence numbers are used up;
    here the clock borrows from the next milliseconds instead (local
    producers publish over 4 M messages a second), and the lease covers it.

    The lease: when a reserved block comes within half a minute of clock of
    `lease`, the process moves it to 1.5 minutes past the block and writes it,
    fsynced, to the lease file in the data path (<data-path>/nsqshm.ids.dat,
    20 decimal digits and a newline): a write per minute of clock.  A
    broker that finds no segment at start (a reboot) starts its clock at
    max(now, lease), so it never repeats an ID issued before, whatever the
    wall clock did.  A segment that is still there carries on from its clock;
    one of an older build (version 1, a plain counter) is replaced by the
    broker, its clock started past every ID the old counter issued.

    The segment (4096 bytes, mode 0600, published whole: segment.py):

        offset  size  field
             0     8  magic       "nsqshmID" as a little-endian u64, stored last
             8     4  version     2
            12     4  node_id     0-1023, read at each block reservation
            64     8  clock       next unreserved (ms << 12 | sequence) (own line)
           128     8  lease       clock values below it are in the lease file
                                  (all ones: no lease file)
           136     8  lease_errors  failed lease writes (the clock went on)
           192     4  path_len    bytes of the lease file's path, 0: none
           196  3900  path        the lease file's absolute path
    """

    def __cinit__(self):
        self.base = NULL
        self.clock = NULL
        self.next_value = 0
        self.block_end = 0
        self.node = 0

    def __init__(self):
        raise TypeError("use IdGenerator.open(name)")

    @staticmethod
    def open(str name, int node_id=-1, str lease_path=None):
        """Attach to the ID segment `name`, creating it if there is none.

        node_id (0-1023) is written into the segment for every process of
        the broker (-1: keep the segment's; 0 for a new one).  lease_path,
        the broker's lease file: a new segment's clock starts past the lease
        it holds; without one (a test, a local client starting before its
        broker) nothing is persisted until a process that has it opens the
        segment."""
        from nsqshm._core.ring import validate_name
        validate_name(name)
        if not -1 <= node_id < 1024:
            raise ValueError(f"node ID {node_id} is not in [0,1024)")
        path = b""
        if lease_path is not None:
            path = os.path.abspath(lease_path).encode()
            if not 0 < len(path) <= ID_PATH_MAX or b"\0" in path:
                raise ValueError(f"lease file path {lease_path!r} is empty or too long")
        cdef IdGenerator self = IdGenerator.__new__(IdGenerator)
        cdef uint64_t floor = 0
        self.name = name
        deadline = time.monotonic() + 2
        while True:
            try:
                fd, size = segment.attach(name, ValueError)
            except posix_ipc.ExistentialError:
                if self._create(name, node_id, path, floor):
                    break
                continue  # another process published it first: attach to that
            try:
                if size != ID_SEGMENT_SIZE:
                    raise ValueError(f"ID segment {name!r} is {size} bytes, "
                                     f"expected {ID_SEGMENT_SIZE}")
                self._map(fd)
                mine = segment.identity(fd)
            finally:
                os.close(fd)
            if path and self._retire_v1(&floor):
                # an older build's segment, ours now to replace: its name goes
                # (unless another process has replaced it already)
                self._lease_floor(path, floor)
                segment.unlink(name, of=mine)
                continue
            if nsqshm_load_acquire(<uint64_t *>self.base) == ID_RETIRED and \
                    time.monotonic() < deadline:
                self.close()  # another broker process is replacing it
                time.sleep(0.001)
                continue
            self._check_header()
            self._adopt(node_id, path)
            break
        self.fork_gen = _fork_generation
        return self

    cdef int _map(self, int fd) except -1:
        cdef void *p = mmap(NULL, ID_SEGMENT_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
        if p == MAP_FAILED:
            raise OSError(errno, os.strerror(errno))
        self.base = p
        self.clock = <uint64_t *>(<char *>p + 64)
        return 0

    cdef int _check_header(self) except -1:
        cdef char *b = <char *>self.base
        magic = nsqshm_load_acquire(<uint64_t *>b)
        version = (<uint32_t *>(b + 8))[0]
        node = (<uint32_t *>(b + 12))[0]
        plen = (<uint32_t *>(b + 192))[0]
        if magic != ID_MAGIC or version != ID_VERSION or node >= 1024 or plen > ID_PATH_MAX:
            self.close()
            raise ValueError(f"segment {self.name!r} is not an nsqshm ID segment of version "
                             f"{ID_VERSION} (magic {magic:#018x}, version {version}); stop "
                             f"every process of the broker and remove /dev/shm/{self.name}")
        return 0

    cdef bint _retire_v1(self, uint64_t *floor) except -1:
        """If the mapped segment is an older build's (version 1: a plain
        counter of (ms << 22) + n at offset 64), mark it retired -- one
        process wins -- and set floor past every ID it can have issued."""
        cdef char *b = <char *>self.base
        cdef uint64_t v1_clock
        if (<uint32_t *>(b + 8))[0] != 1 or \
                not nsqshm_cas(<uint64_t *>b, ID_MAGIC, ID_RETIRED):
            return False
        v1_clock = nsqshm_load_acquire(self.clock)
        floor[0] = max(floor[0], ((v1_clock >> 22) + 1) << 12)
        self.close()
        return True

    cdef int _lease_floor(self, bytes path, uint64_t floor) except -1:
        """Put `floor` in the lease file before the old segment's name goes:
        whichever process then creates the new one starts past it."""
        cdef uint64_t target = 0
        cdef int e = _raise_lease_file(path, floor, &target)
        if e:
            raise OSError(e, f"cannot write the ID lease file: {os.strerror(e)}",
                          path.decode())
        return 0

    cdef bint _create(self, str name, int node_id, bytes path, uint64_t floor) except -1:
        """Make and publish a new segment, its clock at or past `floor`;
        False if another process won."""
        cdef char *b
        cdef uint64_t now = _clock_now(), start = max(now, floor)
        if path:
            start = max(start, _read_lease(path))
        fd = segment.create(ID_SEGMENT_SIZE)
        try:
            self._map(fd)
            b = <char *>self.base
            (<uint32_t *>(b + 8))[0] = ID_VERSION
            (<uint32_t *>(b + 12))[0] = max(node_id, 0)
            self.clock[0] = start
            (<uint64_t *>(b + 128))[0] = start if path else ID_NO_LEASE
            memcpy(b + 196, <const char *>path, len(path))
            (<uint32_t *>(b + 192))[0] = len(path)
            nsqshm_store_release(<uint64_t *>b, ID_MAGIC)
            e = self._extend_lease(start + ID_BLOCK) if path else 0
            if e:
                raise OSError(e, f"cannot write the ID lease file: {os.strerror(e)}",
                              path.decode())
            segment.publish(fd, name)
        except posix_ipc.ExistentialError:
            self.close()
            return False
        except BaseException:
            self.close()
            raise
        finally:
            segment.discard(fd)
        return True

    cdef int _adopt(self, int node_id, bytes path) except -1:
        """An existing segment: set the node ID; give it our lease file if it
        has none (a local client made it), its clock moved past that lease."""
        cdef char *b = <char *>self.base
        cdef uint64_t cur, floor
        if node_id >= 0:
            nsqshm_store32_release(<uint32_t *>(b + 12), node_id)
        if not path or nsqshm_load32_acquire(<uint32_t *>(b + 192)) != 0:
            return 0
        floor = _read_lease(path)
        while True:
            cur = nsqshm_load_acquire(self.clock)
            if cur >= floor or nsqshm_cas(self.clock, cur, floor):
                break
        memcpy(b + 196, <const char *>path, len(path))
        if nsqshm_cas32(<uint32_t *>(b + 192), 0, len(path)):
            nsqshm_store_release(<uint64_t *>(b + 128), 0)  # the next reservation writes it
        return 0

    cdef int _extend_lease(self, uint64_t need) noexcept:
        """Make the lease file and the segment's lease cover clock values below
        `need` (a minute of clock more).  0, or the errno of the failure."""
        cdef char *b = <char *>self.base
        cdef char path[ID_PATH_MAX + 1]
        cdef uint32_t plen = nsqshm_load32_acquire(<uint32_t *>(b + 192))
        cdef uint64_t target = 0, cur
        cdef int e
        if plen == 0 or plen > ID_PATH_MAX:
            return 0
        memcpy(path, b + 196, plen)
        path[plen] = 0
        e = _raise_lease_file(path, need, &target)
        if e:
            return e
        while True:  # raise the segment's lease to what the file now says
            cur = nsqshm_load_acquire(<uint64_t *>(b + 128))
            if cur >= target or nsqshm_cas(<uint64_t *>(b + 128), cur, target):
                break
        return 0

    cdef void _reserve(self) noexcept:
        """Reserve the next block of the clock for this process."""
        cdef char *b = <char *>self.base
        cdef uint64_t cur, start, end, lease
        while True:
            cur = nsqshm_load_acquire(self.clock)
            start = _clock_now()
            if cur > start:
                start = cur
            end = start + ID_BLOCK
            lease = nsqshm_load_acquire(<uint64_t *>(b + 128))
            if lease != ID_NO_LEASE and end + ID_LEASE_AHEAD // 2 > lease:
                # half a minute of clock left: the lease moves to 1.5 minutes
                # past end, so this is once a minute of clock, not every block
                if self._extend_lease(end + ID_LEASE_AHEAD // 2) != 0 and end > lease:
                    # the disk refuses: IDs go on (delivery must), counted
                    nsqshm_fetch_add(<uint64_t *>(b + 136), 1)
            if nsqshm_cas(self.clock, cur, end):
                break
        self.node = nsqshm_load32_acquire(<uint32_t *>(b + 12)) & 0x3FF
        self.next_value = start
        self.block_end = end

    @staticmethod
    def unlink(str name):
        from nsqshm._core.ring import validate_name
        validate_name(name)
        return segment.unlink(name)

    cdef void next_raw(self, char *dst) noexcept:
        """Write the next ID's 16 hex digits at dst."""
        cdef uint64_t v
        if self.next_value >= self.block_end or self.fork_gen != _fork_generation:
            # a forked child must not reuse its parent's block
            self.fork_gen = _fork_generation
            self._reserve()
        v = self.next_value
        self.next_value += 1
        hex_id(dst, ((v >> 12) << 22) | (<uint64_t>self.node << 12) | (v & 0xFFF))

    def next_id(self):
        """The next message ID, 16 bytes of lowercase hex."""
        cdef char buf[16]
        if self.base == NULL:
            raise ValueError("IdGenerator is closed")
        self.next_raw(buf)
        return PyBytes_FromStringAndSize(buf, 16)

    def fill(self, buffer, Py_ssize_t count):
        """Write `count` consecutive-in-this-process IDs, 16 bytes each, into buffer."""
        cdef Py_buffer view
        cdef Py_ssize_t i
        if self.base == NULL:
            raise ValueError("IdGenerator is closed")
        PyObject_GetBuffer(buffer, &view, PyBUF_WRITABLE)
        try:
            if view.len < count * 16:
                raise ValueError(f"buffer of {view.len} bytes cannot hold {count} IDs")
            for i in range(count):
                self.next_raw(<char *>view.buf + 16 * i)
        finally:
            PyBuffer_Release(&view)

    @property
    def node_id(self):
        """The segment's node ID (what the next reserved block carries)."""
        self._check()
        return nsqshm_load32_acquire(<uint32_t *>(<char *>self.base + 12))

    @property
    def lease(self):
        """The clock value the lease file covers up to (None: no lease file)."""
        self._check()
        cdef uint64_t v = nsqshm_load_acquire(<uint64_t *>(<char *>self.base + 128))
        return None if v == ID_NO_LEASE else v

    @property
    def lease_errors(self):
        """Lease writes that failed (the clock went on without them)."""
        self._check()
        return nsqshm_load_acquire(<uint64_t *>(<char *>self.base + 136))

    cdef int _check(self) except -1:
        if self.base == NULL:
            raise ValueError("IdGenerator is closed")
        return 0

    def close(self):
        if self.base != NULL:
            munmap(self.base, ID_SEGMENT_SIZE)
            self.base = NULL
            self.clock = NULL

    def __dealloc__(self):
        if self.base != NULL:
            munmap(self.base, ID_SEGMENT_SIZE)


cdef uint64_t _clock_now() noexcept:
    """Now on the ID clock: (ms since nsqd's epoch) << 12."""
    cdef timespec ts
    cdef int64_t ms
    clock_gettime(CLOCK_REALTIME, &ts)
    ms = <int64_t>ts.tv_sec * 1000 + ts.tv_nsec // 1000000 - NSQD_EPOCH_MS
    return <uint64_t>(ms if ms > 0 else 0) << 12


cdef int _raise_lease_file(const char *path, uint64_t need, uint64_t *target) noexcept:
    """Make the lease file at `path` cover clock values below `need`, writing
    need + a minute of clock if it does not, under flock so that concurrent
    writers never move it back; target: what it now holds.  0, or errno."""
    cdef char text[32]
    cdef uint64_t have
    cdef int fd, n, saved
    fd = c_open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
    if fd < 0:
        return errno
    if flock(fd, LOCK_EX) != 0:
        saved = errno
        close(fd)
        return saved
    n = pread(fd, text, 31, 0)
    have = _parse_lease(text, n if n > 0 else 0)
    target[0] = have
    if have < need:
        target[0] = need + ID_LEASE_AHEAD
        n = snprintf(text, sizeof(text), b"%020llu\n", <unsigned long long>target[0])
        if pwrite(fd, text, n, 0) != n or fsync(fd) != 0:
            saved = errno if errno else 5  # EIO: a short write
            flock(fd, LOCK_UN)
            close(fd)
            return saved
    flock(fd, LOCK_UN)
    close(fd)
    return 0


cdef uint64_t _parse_lease(const char *text, int n) noexcept:
    """The decimal number at the start of the lease file (0: none)."""
    cdef uint64_t v = 0
    cdef int i = 0
    while i < n and 48 <= text[i] <= 57 and i < 20:
        v = v * 10 + <uint64_t>(text[i] - 48)
        i += 1
    return v


def _read_lease(bytes path):
    """The lease file's value, 0 when there is none yet; a file that does not
    hold one is an error (it may be all that stands between a restart and a
    repeated ID)."""
    try:
        with open(path, "rb") as f:
            text = f.read(64)
    except FileNotFoundError:
        return 0
    digits = text.split(b"\n", 1)[0]
    if not text:
        return 0  # created, never written: nothing was issued under it
    if not digits.isdigit() or len(digits) > 20 or int(digits) >= ID_NO_LEASE:
        raise ValueError(f"ID lease file {path.decode()!r} holds {text[:40]!r}, not a lease; "
                         "remove it only if no broker ever issued IDs from this data path")
    return int(digits)
