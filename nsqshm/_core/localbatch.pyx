# cython: freethreading_compatible=False
"""Batch helpers for local clients and the Spark source (nsqshm.local,
nsqshm.spark): the per-message loops that must not cost a Python object
per message.

* pack_bodies / mpub_body: message bodies given as one buffer plus offsets
  (an Arrow binary array's int32/int64 offsets, or numpy offsets and
  lengths) become packed ring records with fresh IDs, or an MPUB body.
* Columns: collects messages into the buffers of an Arrow record batch
  (body values and int32 offsets, 16-byte IDs, microsecond timestamps,
  attempts), from NSQ frames, from a ring straight into an arena
  (take), or from an arena's blocks.
* index_frames / finish_frames: a consumer's batch of NSQ frames indexed
  for zero-copy views, and finished in one call.
* arena_reset: finish every message of an arena at once.

A message is nsqd's encoding: [8 BE ts ns][2 BE attempts][16 hex ID][body].
"""

from cpython.buffer cimport (
    PyBUF_SIMPLE,
    PyBUF_WRITABLE,
    PyBuffer_Release,
    PyObject_GetBuffer,
)
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport int32_t, int64_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, realloc

from nsqshm._core.arena cimport Arena
from nsqshm._core.ext cimport JSON_HEADER_EXT_VER, ext_prefix, json_member, json_unescape
from nsqshm._core.codec cimport IdGenerator, MSG_HEADER_SIZE, get_u32be, put_message_header, put_u32be
from nsqshm._core.commitlog cimport LogReader
from nsqshm._core.includes.system cimport (
    NSQSHM_EXPIRY_SIZE,
    nsqshm_attempts,
    nsqshm_has_expiry,
    nsqshm_be16,
    nsqshm_be64,
    NSQSHM_BLOCK_DEFERRED,
    NSQSHM_BLOCK_LIVE,
    NSQSHM_RECORD_HEADER,
    memcpy,
    nsqshm_arena_block,
    nsqshm_load32_acquire,
    nsqshm_load_acquire,
    nsqshm_store_release,
)
from nsqshm._core.inflight cimport STATUS_CURSOR_DETACHED, InFlight
from nsqshm._core.logcursor cimport CursorSet, DeliveredRun, delivered_run_add, delivered_run_end
from nsqshm._core.tracelog cimport EV_FIN, TraceWriter
from nsqshm._core.ring cimport Ring

cdef enum:
    ID_OFFSET = 10
    ATTEMPTS_OFFSET = 8
    BLOCK_HEADER = 64
    FRAME_MESSAGE = 2
    DETAIL_SIZE = 12  # [8 BE queue offset][4 BE raw size]: SUB_ADVANCED frames

# Arrow binary arrays have int32 offsets: a batch's bodies stay under 2 GiB.
cdef int64_t MAX_VALUES = 0x7FFFFFFF
# Columns.add_log's bound on a batch's bodies (the old read buffer's 16 MiB)
LOG_BATCH_BYTES = 16 << 20
cdef const char *HEX_DIGITS = b"0123456789abcdef"


cdef inline uint64_t _align8(uint64_t n) noexcept nogil:
    return (n + 7) & ~(<uint64_t>7)


cdef inline void _bump_attempts(char *msg) noexcept nogil:
    # big-endian u16 at offset 8, saturating at 32767 and keeping bit 15, as
    # InFlight.deliver counts (message_expiry.h)
    cdef unsigned char *p = <unsigned char *>msg + ATTEMPTS_OFFSET
    cdef uint32_t a = (<uint32_t>p[0] << 8) | p[1]
    if (a & 0x7FFF) < 0x7FFF:
        a += 1
        p[0] = <unsigned char>(a >> 8)
        p[1] = <unsigned char>a


cdef inline int64_t _span(const char *offs, int width, Py_ssize_t i) noexcept nogil:
    if width == 4:
        return (<const int32_t *>offs)[i]
    return (<const int64_t *>offs)[i]


cdef class _Spans:
    """Bodies as (data, offsets[, lengths]): offsets of width 4 or 8; without
    lengths, Arrow-style (body i = data[off[i]:off[i+1]])."""
    cdef Py_buffer data
    cdef Py_buffer offs
    cdef Py_buffer lens
    cdef bint has_lens
    cdef int width
    cdef Py_ssize_t count
    cdef int held                 # how many of data, offs, lens are held

    def __cinit__(self):
        self.held = 0

    cdef int open(self, data, offsets, lengths, Py_ssize_t start, Py_ssize_t count) except -1:
        PyObject_GetBuffer(data, &self.data, PyBUF_SIMPLE)
        self.held = 1
        PyObject_GetBuffer(offsets, &self.offs, PyBUF_SIMPLE)
        self.held = 2
        self.has_lens = lengths is not None
        if self.has_lens:
            PyObject_GetBuffer(lengths, &self.lens, PyBUF_SIMPLE)
            self.held = 3
        return 0

    def __dealloc__(self):
        if self.held >= 3:
            PyBuffer_Release(&self.lens)
        if self.held >= 2:
            PyBuffer_Release(&self.offs)
        if self.held >= 1:
            PyBuffer_Release(&self.data)


cdef _Spans _open_spans(data, offsets, lengths, Py_ssize_t start, Py_ssize_t count, int width,
                        Py_ssize_t max_size):
    """Validate every body once (bounds, 1..max_size bytes) before anything is written."""
    cdef _Spans s = _Spans()
    cdef Py_ssize_t i, need
    cdef int64_t b, e
    if width != 4 and width != 8:
        raise ValueError(f"offsets must be int32 or int64, not {width}-byte items")
    if start < 0 or count < 0:
        raise ValueError("start and count must be >= 0")
    s.open(data, offsets, lengths, start, count)
    s.width = width
    s.count = count
    need = (start + count + (0 if s.has_lens else 1)) * width
    if s.offs.len < need or (s.has_lens and s.lens.len < (start + count) * width):
        raise ValueError(f"offsets hold fewer than the {count} bodies from {start}")
    for i in range(start, start + count):
        b = _span(<const char *>s.offs.buf, width, i)
        if s.has_lens:
            e = b + _span(<const char *>s.lens.buf, width, i)
        else:
            e = _span(<const char *>s.offs.buf, width, i + 1)
        if b < 0 or e > s.data.len or e < b:
            raise ValueError(f"body {i - start}: span [{b}, {e}) is outside the "
                             f"{s.data.len}-byte data")
        if e == b:
            raise ValueError(f"body {i - start} is empty (nsqd rejects empty messages)")
        if e - b > max_size:
            raise ValueError(f"body {i - start} is {e - b} bytes, over max_msg_size {max_size}")
    return s


cdef inline void _body(_Spans s, Py_ssize_t i, const char **p, int64_t *n) noexcept:
    cdef int64_t b = _span(<const char *>s.offs.buf, s.width, i)
    if s.has_lens:
        n[0] = _span(<const char *>s.lens.buf, s.width, i)
    else:
        n[0] = _span(<const char *>s.offs.buf, s.width, i + 1) - b
    p[0] = <const char *>s.data.buf + b


def pack_bodies(data, offsets, lengths, Py_ssize_t start, Py_ssize_t count, int width,
                IdGenerator ids not None, uint64_t timestamp, Py_ssize_t max_size,
                bytearray out not None):
    """Append `count` new messages (attempts 0, fresh IDs, `timestamp` ns)
    as packed [u32 native size][message] records to `out`; returns count.
    ValueError (nothing appended) if a body is empty, too big or out of bounds."""
    cdef _Spans s = _open_spans(data, offsets, lengths, start, count, width, max_size)
    cdef Py_ssize_t i, total = 0, base
    cdef const char *p
    cdef int64_t n
    cdef char *dst
    for i in range(start, start + count):
        _body(s, i, &p, &n)
        total += 4 + MSG_HEADER_SIZE + n
    base = PyByteArray_GET_SIZE(out)
    PyByteArray_Resize(out, base + total)
    dst = PyByteArray_AS_STRING(out) + base
    for i in range(start, start + count):
        _body(s, i, &p, &n)
        (<uint32_t *>dst)[0] = <uint32_t>(MSG_HEADER_SIZE + n)
        ids.next_raw(dst + 4 + ID_OFFSET)
        put_message_header(dst + 4, timestamp, 0, dst + 4 + ID_OFFSET)
        memcpy(dst + 4 + MSG_HEADER_SIZE, p, n)
        dst += 4 + MSG_HEADER_SIZE + n
    return count


def mpub_body(data, offsets, lengths, Py_ssize_t start, Py_ssize_t count, int width,
              Py_ssize_t max_size):
    """The body of an MPUB command: [u32 BE count]([u32 BE size][body])*."""
    cdef _Spans s = _open_spans(data, offsets, lengths, start, count, width, max_size)
    cdef Py_ssize_t i, total = 4
    cdef const char *p
    cdef int64_t n
    cdef char *dst
    for i in range(start, start + count):
        _body(s, i, &p, &n)
        total += 4 + n
    out = PyBytes_FromStringAndSize(NULL, total)
    dst = PyBytes_AS_STRING(out)
    put_u32be(dst, <unsigned int>count)
    dst += 4
    for i in range(start, start + count):
        _body(s, i, &p, &n)
        put_u32be(dst, <unsigned int>n)
        memcpy(dst + 4, p, n)
        dst += 4 + n
    return out


cdef Py_ssize_t _json_string(const unsigned char *p, int64_t n, char *out) noexcept nogil:
    """p[:n] as a JSON string, quotes included, into out (NULL: only counted):
    its length.  '"', '\\' and control characters escaped, other bytes as they are."""
    cdef Py_ssize_t o = 1
    cdef int64_t i
    cdef unsigned char c
    if out != NULL:
        out[0] = 34
    for i in range(n):
        c = p[i]
        if c == 34 or c == 92:
            if out != NULL:
                out[o] = 92
                out[o + 1] = c
            o += 2
        elif c < 0x20:
            if out != NULL:
                out[o] = 92
                out[o + 1] = 117  # \u00XX
                out[o + 2] = 48
                out[o + 3] = 48
                out[o + 4] = HEX_DIGITS[c >> 4]
                out[o + 5] = HEX_DIGITS[c & 15]
            o += 6
        else:
            if out != NULL:
                out[o] = c
            o += 1
    if out != NULL:
        out[o] = 34
    return o + 1


cdef Py_ssize_t _headers_json(_Spans keys, _Spans values, const int32_t *rows, Py_ssize_t row,
                              char *out) noexcept:
    """Row `row`'s pairs as a JSON object into out (NULL: counted); 0 for none."""
    cdef int32_t j, b = rows[row], e = rows[row + 1]
    cdef Py_ssize_t o = 1
    cdef const char *p
    cdef int64_t n
    if e <= b:
        return 0
    if out != NULL:
        out[0] = 123
    for j in range(b, e):
        if j > b:
            if out != NULL:
                out[o] = 44
            o += 1
        _body(keys, j, &p, &n)
        o += _json_string(<const unsigned char *>p, n, out + o if out != NULL else NULL)
        if out != NULL:
            out[o] = 58
        o += 1
        _body(values, j, &p, &n)
        o += _json_string(<const unsigned char *>p, n, out + o if out != NULL else NULL)
    if out != NULL:
        out[o] = 125
    return o + 1


def mpub_ext_body(data, offsets, Py_ssize_t start, Py_ssize_t count, int width,
                  rows, valid, keys, key_offsets, Py_ssize_t key_start, values,
                  value_offsets, Py_ssize_t value_start, Py_ssize_t pairs,
                  Py_ssize_t max_size, Py_ssize_t max_header, Py_ssize_t max_bytes):
    """The body of a MPUB_EXT command for bodies [start, start + count) and
    their headers (an Arrow list<struct<key, value>>: `rows` the list's int32
    offsets for these count rows, `valid` a byte per row, 0 for a null list;
    keys and values int32-offset binary arrays of `pairs` entries from
    key_start / value_start), each row's pairs written as one JSON object of
    strings:

        [4 BE count] ([4 BE size][2 BE n][n bytes JSON][body])*     n = 0: no headers

    As many rows as fit max_bytes (at least one): returns (body, rows).
    ValueError, before anything is written, for a body out of bounds or
    empty, a JSON object over max_header bytes, a message over max_size."""
    cdef _Spans s = _open_spans(data, offsets, None, start, count, width, max_size)
    cdef _Spans ks = _open_spans(keys, key_offsets, None, key_start, pairs, 4, 0x7FFFFFFF)
    cdef _Spans vs
    cdef Py_buffer rv, vv
    cdef const int32_t *r
    cdef const unsigned char *ok
    cdef Py_ssize_t i, k, used = 0, total = 4, h
    cdef const char *p
    cdef int64_t n
    cdef char *dst
    cdef uint16_t hn
    # the values may be empty strings (open_spans refuses empty bodies): checked here
    vs = _Spans()
    vs.open(values, value_offsets, None, value_start, pairs)
    vs.width = 4
    vs.count = pairs
    if vs.offs.len < (value_start + pairs + 1) * 4:
        raise ValueError(f"value offsets hold fewer than {pairs} entries")
    for k in range(value_start, value_start + pairs):
        if not (0 <= (<const int32_t *>vs.offs.buf)[k] <= (<const int32_t *>vs.offs.buf)[k + 1]
                <= vs.data.len):
            raise ValueError(f"header value {k - value_start} is outside its data")
    PyObject_GetBuffer(rows, &rv, PyBUF_SIMPLE)
    try:
        PyObject_GetBuffer(valid, &vv, PyBUF_SIMPLE)
        try:
            if rv.len < (count + 1) * 4 or vv.len < count:
                raise ValueError(f"headers hold fewer than {count} rows")
            r = <const int32_t *>rv.buf
            ok = <const unsigned char *>vv.buf
            for i in range(count):
                if ok[i] and (r[i] < 0 or r[i] > r[i + 1] or r[i + 1] > pairs):
                    raise ValueError(f"row {i}: headers [{r[i]}, {r[i + 1]}) outside the "
                                     f"{pairs} pairs")
            for i in range(count):
                h = _headers_json(ks, vs, r, i, NULL) if ok[i] else 0
                if h > max_header:
                    raise ValueError(f"row {i}: its headers are {h} bytes of JSON, over "
                                     f"{max_header}")
                _body(s, start + i, &p, &n)
                if 2 + h + n > max_size:
                    raise ValueError(f"row {i}: {n} bytes of body and {h} of headers, over "
                                     f"max_msg_size {max_size}")
                if used and total + 6 + h + n > max_bytes:
                    break
                total += 6 + h + n
                used += 1
            out = PyBytes_FromStringAndSize(NULL, total)
            dst = PyBytes_AS_STRING(out)
            put_u32be(dst, <unsigned int>used)
            dst += 4
            for i in range(used):
                h = _headers_json(ks, vs, r, i, dst + 6) if ok[i] else 0
                _body(s, start + i, &p, &n)
                put_u32be(dst, <unsigned int>(2 + h + n))
                hn = <uint16_t>h
                dst[4] = <char>(hn >> 8)
                dst[5] = <char>(hn & 0xFF)
                memcpy(dst + 6 + h, p, n)
                dst += 6 + h + n
        finally:
            PyBuffer_Release(&vv)
    finally:
        PyBuffer_Release(&rv)
    return out, used


# -- Arrow columns ------------------------------------------------------------------------

cdef class CBuffer:
    """malloc'd bytes handed to pyarrow (pa.py_buffer keeps this alive)."""
    def __cinit__(self):
        self.data = NULL
        self.size = 0

    def __dealloc__(self):
        free(self.data)

    def __len__(self):
        return self.size

    def __getbuffer__(self, Py_buffer *view, int flags):
        self.shape[0] = self.size
        view.buf = self.data
        view.obj = self
        view.len = self.size
        view.readonly = 1
        view.itemsize = 1
        view.format = b"B"
        view.ndim = 1
        view.shape = self.shape
        view.strides = NULL
        view.suboffsets = NULL
        view.internal = NULL

    def __releasebuffer__(self, Py_buffer *view):
        pass


cdef CBuffer _wrap(char *data, Py_ssize_t size):
    cdef CBuffer b = CBuffer()
    b.data = data
    b.size = size
    return b


cdef int _grow_bytes(char **data, int64_t *cap, int64_t need, int64_t first,
                     str what) except -1:
    """A buffer of at least `need` bytes, doubling from `first` (Arrow int32
    offsets: a batch's buffer stays under 2 GiB)."""
    cdef int64_t size = cap[0] if cap[0] else first
    cdef char *d
    if data[0] != NULL and need <= cap[0]:  # (an empty batch still gets a buffer)
        return 0
    if need > MAX_VALUES:
        raise OverflowError(f"a batch's {what} would pass 2 GiB (Arrow int32 offsets)")
    while size < need:
        size *= 2
    if size > MAX_VALUES:
        size = MAX_VALUES
    d = <char *>realloc(data[0], size)
    if d == NULL:
        raise MemoryError()
    data[0] = d
    cap[0] = size
    return 0


cdef int _gb_reserve(GrowBuf *b, int64_t extra) except -1:
    """Room for `extra` more bytes of a headers buffer."""
    return _grow_bytes(&b.data, &b.cap, b.len + extra, 4096, "headers")


cdef inline int _gb_i32(GrowBuf *b, int32_t v) except -1:
    if b.len + 4 > b.cap:
        _gb_reserve(b, 4)
    memcpy(b.data + b.len, &v, 4)
    b.len += 4
    return 0


cdef CBuffer _gb_take(GrowBuf *b):
    """The buffer handed to pyarrow; b starts empty."""
    if b.data == NULL:  # nothing yet: a real (empty) allocation for the buffer
        _gb_reserve(b, 1)
    out = _wrap(b.data, b.len)
    b.data = NULL
    b.len = b.cap = 0
    return out


cdef nsqshm_arena_block *_next_block(Arena arena, uint64_t *off, uint64_t end) except? NULL:
    """The block at *off, *off moved past it; NULL after the last (end: the bump)."""
    cdef nsqshm_arena_block *b
    if off[0] + BLOCK_HEADER > end:
        return NULL
    b = arena._block(off[0], end)  # (its capacity checked: ArenaError)
    off[0] += b.capacity
    return b


cdef uint32_t _live_size(Arena arena, nsqshm_arena_block *b) except? 0:
    """The size of a LIVE block's message, checked against the block; 0 for
    a block that is not LIVE."""
    cdef uint32_t size
    if nsqshm_load32_acquire(&b.state) != NSQSHM_BLOCK_LIVE:
        return 0
    size = b.entry.size
    if size < MSG_HEADER_SIZE or size > b.capacity - BLOCK_HEADER:
        raise ValueError(f"arena {arena.name!r}: block at {<char *>b - arena.base} holds "
                         f"{size} bytes")
    return size


cdef class Columns:
    """Messages gathered column by column for one Arrow record batch:
    body values with int32 offsets, IDs (16 bytes each), timestamps in
    microseconds (Spark's unit), attempts.  export() hands the buffers over
    and starts a new batch.  Messages with a timestamp before `since_ns`
    are skipped (still taken and finished: a starting position).

    ext: the messages carry Youzan's ext part after the header (an ext
    topic's stored form, or frames sent for extend_support), cut from the
    body.  headers: its JSON object is laid out as Kafka's headers column,
    list<struct<key: string, value: binary>>, a row's list null when the
    message has no headers (as Kafka's source); string values unescaped,
    other JSON values as their text.  All of it in the one C pass."""
    def __cinit__(self, bint ext=False, bint headers=False):
        self._forget()
        self.since_ns = 0
        self.skipped = 0
        self.ext = ext
        self.headers = headers and ext
        self.hvalid.data = self.hrows.data = self.koffs.data = NULL
        self.kdata.data = self.voffs.data = self.vdata.data = NULL
        self._forget_headers()

    def __dealloc__(self):
        free(self.values)
        free(self.offsets)
        free(self.ids)
        free(self.ts)
        free(self.attempts)
        free(self.hvalid.data)
        free(self.hrows.data)
        free(self.koffs.data)
        free(self.kdata.data)
        free(self.voffs.data)
        free(self.vdata.data)

    cdef void _forget_headers(self) noexcept:
        """Start the headers column empty (its buffers freed or handed over)."""
        self.hvalid.len = self.hvalid.cap = 0
        self.hrows.len = self.hrows.cap = 0
        self.koffs.len = self.koffs.cap = 0
        self.kdata.len = self.kdata.cap = 0
        self.voffs.len = self.voffs.cap = 0
        self.vdata.len = self.vdata.cap = 0
        self.npairs = 0

    cdef int _add_headers(self, const unsigned char *json, Py_ssize_t n) except -1:
        """Row self.n's headers from its JSON object (n = 0: none): pairs
        appended, the row's bit set when it has any."""
        cdef Py_ssize_t i = 0, k = 0, v = 0, e = 0, olen = 0
        cdef int32_t first = self.npairs
        cdef int64_t klen0 = self.kdata.len, vlen0 = self.vdata.len
        cdef int64_t koffs0 = self.koffs.len, voffs0 = self.voffs.len
        cdef Py_ssize_t row = self.n
        if self.hrows.len == 0:  # the first row: the offsets' leading zeros
            _gb_i32(&self.hrows, 0)
            _gb_i32(&self.koffs, 0)
            _gb_i32(&self.voffs, 0)
        if (row >> 3) >= self.hvalid.len:
            _gb_reserve(&self.hvalid, 1)
            self.hvalid.data[self.hvalid.len] = 0
            self.hvalid.len += 1
        if n:
            # unescaped text is never longer than its JSON: n bytes of room each
            _gb_reserve(&self.kdata, n)
            _gb_reserve(&self.vdata, n)
            while True:
                i = json_member(json, i, n, &k, &v, &e)
                if i <= 0:
                    break
                json_unescape(json, k, n, self.kdata.data + self.kdata.len, n, &olen)
                self.kdata.len += olen
                if json[v] == 34:  # a string: its text
                    json_unescape(json, v, n, self.vdata.data + self.vdata.len, n, &olen)
                else:
                    olen = e - v
                    memcpy(self.vdata.data + self.vdata.len, json + v, olen)
                self.vdata.len += olen
                _gb_i32(&self.koffs, <int32_t>self.kdata.len)
                _gb_i32(&self.voffs, <int32_t>self.vdata.len)
                self.npairs += 1
                # the room left is n bytes minus what this row took: enough
                # for the rest of its members, which come from the same n bytes
            if i < 0:  # not an object (the broker checks them): the row has none
                self.npairs = first
                self.kdata.len = klen0
                self.vdata.len = vlen0
                self.koffs.len = koffs0
                self.voffs.len = voffs0
        if self.npairs > first:
            self.hvalid.data[row >> 3] |= <char>(1 << (row & 7))
        _gb_i32(&self.hrows, self.npairs)
        return 0

    cdef void _forget(self) noexcept:
        """Start empty (the buffers were freed or handed over)."""
        self.values = NULL
        self.offsets = NULL
        self.ids = NULL
        self.ts = NULL
        self.attempts = NULL
        self.n = self.cap = 0
        self.vlen = self.vcap = 0

    def __len__(self):
        return self.n

    @property
    def nbytes(self):
        """Body bytes gathered."""
        return self.vlen

    cdef int _grow_rows(self, Py_ssize_t rows) except -1:
        cdef Py_ssize_t cap = self.cap if self.cap else 1024
        while cap < self.n + rows:
            cap *= 2
        if cap == self.cap:
            return 0
        o = <int32_t *>realloc(self.offsets, (cap + 1) * sizeof(int32_t))
        if o == NULL:
            raise MemoryError()
        self.offsets = o
        i = <char *>realloc(self.ids, cap * 16)
        if i == NULL:
            raise MemoryError()
        self.ids = i
        t = <int64_t *>realloc(self.ts, cap * sizeof(int64_t))
        if t == NULL:
            raise MemoryError()
        self.ts = t
        a = <int32_t *>realloc(self.attempts, cap * sizeof(int32_t))
        if a == NULL:
            raise MemoryError()
        self.attempts = a
        if self.cap == 0:
            self.offsets[0] = 0
        self.cap = cap
        return 0

    cdef int _grow_values(self, int64_t nbytes) except -1:
        return _grow_bytes(&self.values, &self.vcap, self.vlen + nbytes, 1 << 16, "bodies")

    cdef int _reserve(self, int64_t body) noexcept:
        """Room for one more message of `body` bytes: 0, or -1 if memory ran out."""
        try:
            if self.n == self.cap:
                self._grow_rows(1)
            if self.vlen + body > self.vcap:
                self._grow_values(body)
        except (MemoryError, OverflowError):
            return -1
        return 0

    cdef inline int _add(self, const char *msg, uint32_t size, bint bump,
                         bint detail=False) except -1:
        """One message (size >= 26, unchecked); bump: count this delivery in attempts;
        detail: a SUB_ADVANCED frame's, [8 queue offset][4 raw size] before the body."""
        cdef int64_t body = size - MSG_HEADER_SIZE
        cdef int64_t ts = <int64_t>nsqshm_be64(msg)
        cdef const unsigned char *a = <const unsigned char *>msg + ATTEMPTS_OFFSET
        cdef int32_t attempts = (<int32_t>a[0] << 8) | a[1]
        cdef Py_ssize_t pre = 0
        cdef const unsigned char *m = <const unsigned char *>msg
        if nsqshm_has_expiry(msg, size):  # the message as nsqd's (message_expiry.h)
            body -= NSQSHM_EXPIRY_SIZE
            attempts = <int32_t>nsqshm_attempts(msg)
        if ts < self.since_ns:
            self.skipped += 1
            return 0
        if self.ext:  # [1 version][2 BE n][n JSON] before the body (ext.pyx)
            pre = ext_prefix(m, MSG_HEADER_SIZE + body)
            if self.headers:
                if pre > 3 and m[MSG_HEADER_SIZE] == JSON_HEADER_EXT_VER:
                    self._add_headers(m + MSG_HEADER_SIZE + 3, pre - 3)
                else:
                    self._add_headers(NULL, 0)
            body -= pre
        if detail:  # (after the ext part: frames.py)
            if body < DETAIL_SIZE:
                raise ValueError(f"a detail frame's message of {size} bytes is too short")
            pre += DETAIL_SIZE
            body -= DETAIL_SIZE
        if self.n == self.cap:
            self._grow_rows(1)
        if self.vlen + body > self.vcap:
            self._grow_values(body)
        if bump and (attempts & 0x7FFF) < 0x7FFF:
            attempts += 1
        memcpy(self.values + self.vlen, msg + MSG_HEADER_SIZE + pre, body)
        self.vlen += body
        self.offsets[self.n + 1] = <int32_t>self.vlen
        memcpy(self.ids + 16 * self.n, msg + ID_OFFSET, 16)
        # floor to microseconds; nsqd timestamps are never negative
        self.ts[self.n] = ts // 1000
        self.attempts[self.n] = attempts
        self.n += 1
        return 0

    def add_frames(self, buf, Py_ssize_t pos=0, Py_ssize_t end=-1, bint detail=False):
        """Add the messages of whole NSQ frames ([u32 BE size][u32 BE type][data])
        in buf[pos:end]; other frames are skipped.  detail: frames of a
        SUB_ADVANCED connection (Youzan's queue offset and raw size before the
        body, left out).  Returns (position after the last whole frame,
        messages added)."""
        cdef Py_buffer view
        cdef const char *p
        cdef uint32_t size, ftype
        cdef Py_ssize_t added = 0
        PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
        try:
            p = <const char *>view.buf
            if end < 0 or end > view.len:
                end = view.len
            while end - pos >= 8:
                size = get_u32be(p + pos)
                if size < 4 or end - pos - 4 < <Py_ssize_t>size:
                    break
                ftype = get_u32be(p + pos + 4)
                if ftype == FRAME_MESSAGE and size >= 4 + MSG_HEADER_SIZE:
                    self._add(p + pos + 8, size - 4, False, detail)
                    added += 1
                pos += 4 + size
        finally:
            PyBuffer_Release(&view)
        return pos, added

    def add_log(self, LogReader reader not None, uint64_t offset, Py_ssize_t max_records,
                bint bump=False, int64_t max_bytes=LOG_BATCH_BYTES):
        """Add up to max_records messages of a partition log from msg offset
        `offset`, copied once, from the mmap'd segment into these columns
        (LogReader.records), and no more than max_bytes of messages (but
        always the first: one message past it is still a row); (count, the
        msg offset after the last).  The byte bound keeps a batch of large
        messages within Arrow's 32-bit offsets and a task's memory."""
        cdef uint64_t next_offset = offset
        cdef Py_ssize_t count
        if max_records > 0:
            self._grow_rows(max_records if max_records < 65536 else 65536)
        self.log_bump = bump
        self.log_budget = max_bytes
        self.log_taken = 0
        count = reader.records(offset, max_records, _take_log_message, self, &next_offset)
        return count, next_offset

    def add_records(self, buf, Py_ssize_t count, bint bump=False):
        """Add `count` packed [u32 native size][message] records (as from
        Ring.pop_many_into); returns the bytes they used."""
        cdef Py_buffer view
        cdef const char *p
        cdef uint32_t size
        cdef Py_ssize_t pos = 0, k
        PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
        try:
            p = <const char *>view.buf
            for k in range(count):
                if view.len - pos < 4:
                    raise ValueError(f"record {k} of {count} is truncated")
                memcpy(&size, p + pos, 4)
                if size < MSG_HEADER_SIZE or view.len - pos - 4 < <Py_ssize_t>size:
                    raise ValueError(f"record {k} of {count} is not a whole message")
                self._add(p + pos + 4, size, bump)
                pos += 4 + size
        finally:
            PyBuffer_Release(&view)
        return pos

    def take(self, Ring ring not None, Arena arena not None, uint32_t queue,
             Py_ssize_t max_records, int64_t max_bytes, int64_t due_wall_ns,
             bint collect=True, CursorSet seeks=None):
        """Move up to max_records messages (and about max_bytes of bodies) from
        `ring` into `arena`, as one step under the ring's consumer lock: each
        leaves the ring only once its block is LIVE in the arena (attempts
        counted, recorded for `queue`), so a death at any instant repeats
        messages and never loses one.  With collect, the messages are added
        here too.  Stops early when the arena is full.  Returns the count.
        seeks: a local consumer's guarded cursors, looked at under the ring's
        lock first (InFlight.deliver_from_ring): -SEEK_HOLDS or -SEEKS_MOVED,
        nothing taken, when a seek is under way or was made since; what is
        taken raises their delivered marks (DeliveredRun)."""
        cdef uint64_t head, tail, nbytes = 0, popped_head
        cdef char *rec
        cdef uint32_t n
        cdef Py_ssize_t count = 0
        cdef int64_t body_bytes = 0
        cdef nsqshm_arena_block *b
        cdef char *msg
        cdef int64_t bad = -1
        cdef int state
        cdef DeliveredRun run  # seeks: the run whose delivered mark is raised
        run.id, run.hi, run.lo = NULL, 0, 0  # (hi, lo: read only after id is set)
        ring._check()
        arena._check()
        if queue >= arena.hdr.n_queues:
            raise ValueError(f"queue {queue} is not in arena {arena.name!r}")
        if collect and max_records > 0:
            self._grow_rows(max_records if max_records < 65536 else 65536)
        ring._lock_cons()
        try:
            if seeks is not None:
                state = seeks.seek_state()
                if state:
                    return -state
            head = ring.hdr.head
            popped_head = head
            tail = nsqshm_load_acquire(&ring.hdr.tail)
            while count < max_records and body_bytes < max_bytes and \
                    ring._next(&head, tail, &rec, &n):
                if n < MSG_HEADER_SIZE:
                    bad = n
                    break
                if collect and (self.vlen + n > MAX_VALUES or
                                self._reserve(n - MSG_HEADER_SIZE) < 0):
                    break  # this batch is full: the record stays for the next
                b = arena.alloc(n)
                if b == NULL:
                    break
                msg = <char *>b + BLOCK_HEADER
                memcpy(msg, rec, n)
                _bump_attempts(msg)
                b.entry.size = n
                b.entry.client_id = 0
                b.entry.hash = 0
                b.entry.heap_index = 0
                b.entry.first_deadline = due_wall_ns
                arena.commit(b, queue, NSQSHM_BLOCK_LIVE, due_wall_ns)
                if seeks is not None:
                    delivered_run_add(&run, seeks, msg + ID_OFFSET)
                if collect:
                    self._add(msg, n, False)
                head += NSQSHM_RECORD_HEADER + _align8(n)
                popped_head = head
                nbytes += n
                body_bytes += n - MSG_HEADER_SIZE
                count += 1
            if count:
                ring._commit_pop(popped_head, count, nbytes)
        finally:
            if seeks is not None:
                delivered_run_end(&run, seeks)
            ring._unlock_cons()
        if count:
            ring._wake(&ring.hdr.wait_space)
        if bad >= 0:
            raise ValueError(f"ring {ring.name!r} holds a record of {bad} bytes, not a message")
        return count

    def add_arena(self, Arena arena not None, uint64_t offset=0, Py_ssize_t max_records=-1):
        """Add the LIVE messages of `arena` from block offset `offset` (0: the
        first), up to max_records; returns the offset to continue from, or 0
        when the arena's blocks are all read."""
        cdef uint64_t off, end
        cdef nsqshm_arena_block *b
        cdef Py_ssize_t added = 0
        cdef uint32_t size
        arena._check()
        off = offset if offset else arena.hdr.data_offset
        end = nsqshm_load_acquire(&arena.hdr.bump)
        while True:
            if max_records >= 0 and added >= max_records and off + BLOCK_HEADER <= end:
                return off
            b = _next_block(arena, &off, end)
            if b == NULL:
                return 0
            size = _live_size(arena, b)
            if size:
                self._add(<char *>b + BLOCK_HEADER, size, False)
                added += 1

    def export(self):
        """(rows, values, offsets, ids, timestamps, attempts, headers): buffers
        for pyarrow (int32 offsets, 16-byte IDs, int64 us, int32), handed
        over; this object starts empty again.  headers is None unless asked
        for, else (validity bits, row offsets, pairs, key offsets, keys,
        value offsets, values)."""
        cdef Py_ssize_t n = self.n
        if self.cap == 0:
            self._grow_rows(1)
        if self.values == NULL:  # no body yet: a real (empty) allocation for the buffer
            self._grow_values(0)
        headers = None
        if self.headers:
            if self.hrows.len == 0:  # no row yet: the offsets' one zero each
                _gb_i32(&self.hrows, 0)
                _gb_i32(&self.koffs, 0)
                _gb_i32(&self.voffs, 0)
            headers = (_gb_take(&self.hvalid), _gb_take(&self.hrows), self.npairs,
                       _gb_take(&self.koffs), _gb_take(&self.kdata),
                       _gb_take(&self.voffs), _gb_take(&self.vdata))
            self._forget_headers()
        out = (n, _wrap(self.values, self.vlen), _wrap(<char *>self.offsets, (n + 1) * 4),
               _wrap(self.ids, n * 16), _wrap(<char *>self.ts, n * 8),
               _wrap(<char *>self.attempts, n * 4), headers)
        self._forget()
        return out


# -- a consumer's batch of frames ---------------------------------------------------------

def index_frames(buf, Py_ssize_t pos, Py_ssize_t end, starts, sizes):
    """Fill int64 arrays `starts` and `sizes` with each message's offset in
    buf and its size, for the whole message frames in buf[pos:end];
    returns the count (at most len(starts))."""
    cdef Py_buffer view, sv, zv
    cdef const char *p
    cdef uint32_t size
    cdef Py_ssize_t n = 0, room
    cdef int64_t *s
    cdef int64_t *z
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    PyObject_GetBuffer(starts, &sv, PyBUF_WRITABLE)
    try:
        PyObject_GetBuffer(sizes, &zv, PyBUF_WRITABLE)
        try:
            p = <const char *>view.buf
            s = <int64_t *>sv.buf
            z = <int64_t *>zv.buf
            room = min(sv.len, zv.len) // 8
            if end < 0 or end > view.len:
                end = view.len
            while end - pos >= 8 and n < room:
                size = get_u32be(p + pos)
                if size < 4 or end - pos - 4 < <Py_ssize_t>size:
                    break
                if get_u32be(p + pos + 4) == FRAME_MESSAGE and size >= 4 + MSG_HEADER_SIZE:
                    s[n] = pos + 8
                    z[n] = size - 4
                    n += 1
                pos += 4 + size
        finally:
            PyBuffer_Release(&zv)
    finally:
        PyBuffer_Release(&sv)
        PyBuffer_Release(&view)
    return n


def finish_frames(InFlight inflight not None, buf, starts, Py_ssize_t count,
                  uint64_t client_id, CursorSet cursors=None, TraceWriter trace=None,
                  uint32_t stream=0):
    """FIN the messages at buf[starts[i]] (i < count) held by client_id in
    one C loop; returns how many were in flight and are finished now (the
    others timed out or were finished or requeued before).  With `cursors`
    (a log topic's channel) each offset is marked in its cursor first, once
    the client is known to hold the message, as the broker's FIN does
    (commands.pyx): a death in between delivers it again, never loses it.
    With `trace` (a traced channel) each message finished now is recorded,
    FIN in `stream`, one write for the batch."""
    cdef Py_buffer view, sv
    cdef const char *p
    cdef const int64_t *s
    cdef Py_ssize_t i, done = 0
    cdef int status
    cdef bint began = False
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        PyObject_GetBuffer(starts, &sv, PyBUF_SIMPLE)
        try:
            if sv.len < count * 8:
                raise ValueError(f"starts hold fewer than {count} entries")
            p = <const char *>view.buf
            s = <const int64_t *>sv.buf
            for i in range(count):
                if s[i] < 0 or s[i] + MSG_HEADER_SIZE > view.len:
                    raise ValueError(f"message {i} at {s[i]} is outside the buffer")
            if cursors is not None:
                cursors.batch_begin()  # (a run of one partition: one lock of its cursor)
                began = True
            for i in range(count):
                if cursors is not None:
                    # the cursor marked before the block is freed (InFlight.finish_logged);
                    # a cursor this consumer has not attached: freed all the same
                    status = inflight.finish_logged(p + s[i] + ID_OFFSET, client_id, cursors)
                    if status == STATUS_CURSOR_DETACHED:
                        status = inflight.finish_raw(p + s[i] + ID_OFFSET, client_id)
                else:
                    status = inflight.finish_raw(p + s[i] + ID_OFFSET, client_id)
                if status == 0:
                    done += 1
                    if trace is not None:
                        trace.add(EV_FIN, p + s[i] + ID_OFFSET, trace.clock(),
                                  nsqshm_be16(p + s[i] + 8), stream, 0, NULL)
        finally:
            if began:
                cursors.batch_end()
            PyBuffer_Release(&sv)
    finally:
        PyBuffer_Release(&view)
        if trace is not None:
            trace.flush()  # (a failed write is counted in the writer)
    return done


def arena_reset(Arena arena not None):
    """Finish every message in `arena` at once (its owner, after the batch
    they belong to was handed on): the blocks are forgotten, the pages
    reused.  The end of the blocks moves first, so a death in between
    leaves either all of them or none.  Returns how many were live."""
    arena._check()
    cdef uint64_t live = arena.hdr.live_blocks
    nsqshm_store_release(&arena.hdr.bump, arena.hdr.data_offset)
    arena.hdr.live_blocks = 0
    arena.hdr.live_bytes = 0
    for i in range(32):
        arena.free_lists[i].length = 0
    return live


def arena_finish_logged(Arena arena not None, CursorSet cursors not None):
    """Mark in their cursors every LIVE message of `arena` (a BulkConsumer of a
    log channel, before its arena_reset): the cursor first, so a death before
    the reset delivers them again, never leaves an offset nothing finishes.
    One C pass; returns how many were newly finished.  CursorError-free: a
    message of a partition whose cursor is not attached is skipped."""
    cdef uint64_t off, end
    cdef nsqshm_arena_block *b
    cdef Py_ssize_t done = 0
    arena._check()
    off = arena.hdr.data_offset
    end = nsqshm_load_acquire(&arena.hdr.bump)
    while True:
        b = _next_block(arena, &off, end)
        if b == NULL:
            return done
        if _live_size(arena, b) and cursors.finish_id(<char *>b + BLOCK_HEADER + ID_OFFSET) == 0:
            done += 1


GATHER_RING = -1   # arena_gather's destinations: the channel's ring,
GATHER_DROP = -2   # nowhere (a lane's feeder reads it from the log again), or a partition's lane


ctypedef struct _Gathered:
    uint64_t offset    # the block's, in the arena
    Py_ssize_t dest    # its group: a lane's partition, then the ring, then the drop
    uint32_t size      # its message's, as sized for its group


def arena_gather(Arena arena not None, long long queue, CursorSet cursors=None, lanes=b"",
                 int64_t deferred_after=-1, blocks=None, Py_ssize_t first=0,
                 Py_ssize_t count=-1):
    """What a local consumer puts back (nsqshm/local/arenas.put_back), in one
    C pass over its arena's LIVE and DEFERRED blocks of `queue` (an index in
    the arena's table; -1: every queue):

        -> (finished, [(destination, packed, offsets), ...])

    With `cursors` (a log channel's), a block whose message lies below its
    cursor's confirmed offset is finished (a /channel/empty moved the cursor
    past it): freed here and counted.  The others are grouped by where they
    go back: `lanes` holds a byte per partition, 0 (no lane: the channel's
    ring, GATHER_RING), 1 (its lane: the partition's index), 2 (an ordered
    lane: only the partition's head, the message at the confirmed offset,
    goes into it; the rest, GATHER_DROP, are read from the log again) or 3
    (all of it GATHER_DROP: the broker's recovery of a dead local consumer's
    copies from before their partition's move into an ordered lane).  With
    deferred_after >= 0, a DEFERRED block due after it (wall ns) is left out
    (the recovery defers those again, each with its due time).  With
    `blocks` (native u64 block offsets, as Arena.blocks_by_queue gives them),
    only the `count` (-1: all) from index `first` are looked at, not the whole
    arena: the recovery takes a queue at a time, a bounded batch at a time.
    Each group: packed [u32 native size][message] records, and the native u64
    block offsets of those records in the same order (Arena.release_many),
    in address order; none of them is freed.  Without cursors every record
    goes to the ring (lanes are for a log channel's records).  For the
    arena's owner (or the recoverer of a dead one's): nothing else may change
    its blocks meanwhile.  No object per message."""
    cdef uint64_t off, end, moff = 0, confirmed = 0
    cdef nsqshm_arena_block *b
    cdef uint32_t state, size
    cdef const char *msg
    cdef long long part
    cdef Py_ssize_t nlanes, nd, d, i, n = 0, cap = 0, finished = 0
    cdef Py_buffer kinds
    cdef const unsigned char *kind
    cdef _Gathered *taken = NULL
    cdef _Gathered *grown
    cdef Py_ssize_t *bytes_of = NULL
    cdef Py_ssize_t *count_of = NULL
    cdef char **packs = NULL
    cdef uint64_t **offs = NULL
    cdef Py_buffer given
    cdef const uint64_t *given_offs = NULL
    cdef Py_ssize_t gi = 0, gn = 0
    arena._check()
    if blocks is not None:
        PyObject_GetBuffer(blocks, &given, PyBUF_SIMPLE)
        gn = given.len // 8
        if count < 0:
            count = gn - first
        if given.len % 8 or first < 0 or first + count > gn:
            PyBuffer_Release(&given)
            raise ValueError(f"blocks [{first}, {first} + {count}) outside a buffer of "
                             f"{given.len} bytes")
        given_offs = <const uint64_t *>given.buf
        gi = first
        gn = first + count
    try:
        PyObject_GetBuffer(lanes, &kinds, PyBUF_SIMPLE)
    except BaseException:
        if given_offs != NULL:
            PyBuffer_Release(&given)
        raise
    try:
        kind = <const unsigned char *>kinds.buf
        nlanes = kinds.len if cursors is not None else 0
        nd = nlanes + 2  # lanes 0..n-1, then the ring, then the drop
        bytes_of = <Py_ssize_t *>calloc(nd, sizeof(Py_ssize_t))
        count_of = <Py_ssize_t *>calloc(nd, sizeof(Py_ssize_t))
        packs = <char **>calloc(nd, sizeof(char *))
        offs = <uint64_t **>calloc(nd, sizeof(uint64_t *))
        if not (bytes_of and count_of and packs and offs):
            raise MemoryError()
        off = arena.hdr.data_offset
        end = nsqshm_load_acquire(&arena.hdr.bump)
        while True:  # where each goes, and the size of each group
            if given_offs != NULL:
                if gi >= gn:
                    break
                arena._check_block_offset(given_offs[gi])
                b = arena._block(given_offs[gi], end)
                gi += 1
            else:
                b = _next_block(arena, &off, end)
                if b == NULL:
                    break
            state = nsqshm_load32_acquire(&b.state)
            if state != NSQSHM_BLOCK_LIVE and state != NSQSHM_BLOCK_DEFERRED:
                continue
            if queue >= 0 and b.queue != <uint64_t>queue:
                continue
            if deferred_after >= 0 and state == NSQSHM_BLOCK_DEFERRED and \
                    b.due_ns > deferred_after:
                continue
            size = b.entry.size
            if size < MSG_HEADER_SIZE or size > b.capacity - BLOCK_HEADER:
                raise ValueError(f"arena {arena.name!r}: block at "
                                 f"{<char *>b - arena.base} holds {size} bytes")
            msg = <const char *>b + BLOCK_HEADER
            part = -1
            if cursors is not None:
                part = cursors.confirmed_of(msg + ID_OFFSET, &moff, &confirmed)
                if part >= 0 and moff < confirmed:
                    finished += arena._release_at(<char *>b - arena.base)
                    continue
            if 0 <= part < nlanes and kind[part] == 1:
                d = part
            elif 0 <= part < nlanes and kind[part] == 2:
                d = part if moff == confirmed else nlanes + 1
            elif 0 <= part < nlanes and kind[part] == 3:
                d = nlanes + 1
            else:
                d = nlanes
            if n == cap:
                cap = cap * 2 if cap else 256
                grown = <_Gathered *>realloc(taken, cap * sizeof(_Gathered))
                if grown == NULL:
                    raise MemoryError()
                taken = grown
            taken[n].offset = <char *>b - arena.base
            taken[n].dest = d
            taken[n].size = size
            n += 1
            bytes_of[d] += 4 + size
            count_of[d] += 1
        out = []
        for d in range(nd):
            if count_of[d]:
                packed = bytearray(bytes_of[d])
                offsets = bytearray(8 * count_of[d])
                packs[d] = PyByteArray_AS_STRING(packed)
                offs[d] = <uint64_t *>PyByteArray_AS_STRING(offsets)
                bytes_of[d] = count_of[d] = 0
                out.append((d if d < nlanes else GATHER_RING if d == nlanes else GATHER_DROP,
                            packed, offsets))
        for i in range(n):  # each copied into its group, in address order
            d = taken[i].dest
            b = <nsqshm_arena_block *>(arena.base + taken[i].offset)
            size = taken[i].size  # (the group's buffer was sized with it)
            (<uint32_t *>(packs[d] + bytes_of[d]))[0] = size
            memcpy(packs[d] + bytes_of[d] + 4, <const char *>b + BLOCK_HEADER, size)
            bytes_of[d] += 4 + size
            offs[d][count_of[d]] = taken[i].offset
            count_of[d] += 1
        return finished, out
    finally:
        PyBuffer_Release(&kinds)
        if given_offs != NULL:
            PyBuffer_Release(&given)
        free(taken)
        free(bytes_of)
        free(count_of)
        free(packs)
        free(offs)


def arena_due(Arena arena not None):
    """(live messages, the latest due time (wall ns) among them, or 0): how
    long a dead Spark reader's batch is kept for a restarted query to adopt."""
    cdef uint64_t off, end
    cdef nsqshm_arena_block *b
    cdef int64_t latest = 0
    cdef Py_ssize_t live = 0
    arena._check()
    off = arena.hdr.data_offset
    end = nsqshm_load_acquire(&arena.hdr.bump)
    while True:
        b = _next_block(arena, &off, end)
        if b == NULL:
            return live, latest
        if nsqshm_load32_acquire(&b.state) != 0:
            live += 1
            if b.due_ns > latest:
                latest = b.due_ns


cdef int _take_log_message(object ctx, const char *msg, uint32_t size) except -1:
    # LogReader.records' sink for Columns.add_log: each message in place,
    # until the byte budget is spent (the first is taken whatever its size)
    cdef Columns cols = <Columns>ctx
    if cols.log_taken and <int64_t>size > cols.log_budget:
        return 0
    cols.log_budget -= size
    cols.log_taken += 1
    cols._add(msg, size, cols.log_bump)
    return 1
