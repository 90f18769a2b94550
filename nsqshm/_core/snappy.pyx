# cython: freethreading_compatible=False
"""The snappy framing format as nsqd speaks it (github.com/golang/snappy's
Writer and Reader), in C: a connection upgraded to snappy carries a stream
of chunks in both directions,

    [ 1-byte type ][ 3-byte LE length ][ length bytes ]

    0xff  stream identifier, "sNaPpY"; first in every stream
    0x00  compressed data:   [ 4-byte LE masked CRC-32C of the uncompressed ][ snappy block ]
    0x01  uncompressed data: [ 4-byte LE masked CRC-32C ][ the bytes ]
    0x80-0xfe  skippable (0xfe padding); 0x02-0x7f reserved: an error

FrameEncoder is golang/snappy's unbuffered Writer: the stream identifier
before the first chunk, then for each write, chunks of at most 64 KiB of
input, each compressed unless that saves less than 1/8.  nsqd's writer
hands it whatever its output buffer holds at each flush, so compression
runs per flushed chunk, never per message.

FrameDecoder is the Reader: it takes bytes as they arrive and returns what
they complete, checking every checksum; corrupt input raises SnappyError.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport int64_t, uint8_t, uint32_t
from libc.string cimport memcmp, memcpy


cdef extern from "snappy_codec.h" nogil:
    enum:
        SNAPPY_MAX_BLOCK
        SNAPPY_MAX_ENCODED_BLOCK
    size_t snappy_encode_block(uint8_t *dst, const uint8_t *src, size_t len)
    int64_t snappy_decoded_len(const uint8_t *src, size_t len, size_t *header)
    int snappy_decode_block(uint8_t *dst, size_t dlen, const uint8_t *src, size_t len)
    void snappy_crc_init()
    uint32_t snappy_crc32c(uint32_t crc, const uint8_t *p, size_t n)
    uint32_t snappy_masked_crc(const uint8_t *p, size_t n)


snappy_crc_init()

STREAM_IDENTIFIER = b"\xff\x06\x00\x00sNaPpY"
MAX_BLOCK = SNAPPY_MAX_BLOCK

# compressed blocks go here first (the GIL is held throughout: one user at a time)
cdef uint8_t _scratch[SNAPPY_MAX_ENCODED_BLOCK]


class SnappyError(ValueError):
    """Corrupt or unsupported snappy input (golang/snappy's ErrCorrupt,
    ErrUnsupported)."""


cdef inline void _put_u32le(uint8_t *p, uint32_t v) noexcept nogil:
    p[0] = <uint8_t>v
    p[1] = <uint8_t>(v >> 8)
    p[2] = <uint8_t>(v >> 16)
    p[3] = <uint8_t>(v >> 24)


cdef inline uint32_t _get_u32le(const uint8_t *p) noexcept nogil:
    return p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16) | (<uint32_t>p[3] << 24)


def crc32c(data, uint32_t crc=0):
    """CRC-32C (Castagnoli) of data, continuing from crc."""
    cdef Py_buffer view
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        return snappy_crc32c(crc, <const uint8_t *>view.buf, view.len)
    finally:
        PyBuffer_Release(&view)


def masked_crc(data):
    """The framing format's checksum: CRC-32C rotated and offset."""
    cdef Py_buffer view
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        return snappy_masked_crc(<const uint8_t *>view.buf, view.len)
    finally:
        PyBuffer_Release(&view)


def compress_block(data):
    """One snappy block (no framing) of at most 65536 bytes."""
    cdef Py_buffer view
    cdef uint8_t dst[SNAPPY_MAX_ENCODED_BLOCK]
    cdef size_t n
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        if view.len > SNAPPY_MAX_BLOCK:
            raise ValueError(f"block of {view.len} bytes is over {SNAPPY_MAX_BLOCK}")
        n = snappy_encode_block(dst, <const uint8_t *>view.buf, view.len)
    finally:
        PyBuffer_Release(&view)
    return PyBytes_FromStringAndSize(<char *>dst, n)


def decompress_block(data):
    """Decode one snappy block (any encoder's) of at most 65536 bytes."""
    cdef Py_buffer view
    cdef size_t header = 0
    cdef int64_t n
    cdef bytes out
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        n = snappy_decoded_len(<const uint8_t *>view.buf, view.len, &header)
        if n < 0 or n > SNAPPY_MAX_BLOCK:
            raise SnappyError("snappy: corrupt input")
        out = PyBytes_FromStringAndSize(NULL, n)
        if snappy_decode_block(<uint8_t *>PyBytes_AS_STRING(out), n,
                               <const uint8_t *>view.buf + header, view.len - header) < 0:
            raise SnappyError("snappy: corrupt input")
    finally:
        PyBuffer_Release(&view)
    return out


cdef class FrameEncoder:
    """golang/snappy's (unbuffered) Writer."""

    def __cinit__(self):
        self._wrote_header = False

    def encode_into(self, data, bytearray out not None):
        """Append the chunks for data to out; returns how many bytes were appended."""
        cdef Py_buffer view
        cdef const uint8_t *src
        cdef Py_ssize_t left, n, start = PyByteArray_GET_SIZE(out), pos
        cdef size_t clen
        cdef uint32_t crc
        cdef uint8_t *dst
        PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
        try:
            src = <const uint8_t *>view.buf
            left = view.len
            if not left:
                return 0
            # room for the worst case: every chunk stored with its header
            pos = start
            PyByteArray_Resize(out, start + 10 + left + (left // SNAPPY_MAX_BLOCK + 1)
                               * (CHUNK_HEADER + CHECKSUM_SIZE))
            dst = <uint8_t *>PyByteArray_AS_STRING(out)
            if not self._wrote_header:
                memcpy(dst + pos, <const char *>STREAM_IDENTIFIER, 10)
                pos += 10
                self._wrote_header = True
            while left:
                n = left if left < SNAPPY_MAX_BLOCK else SNAPPY_MAX_BLOCK
                crc = snappy_masked_crc(src, n)
                clen = snappy_encode_block(_scratch, src, n)
                if <Py_ssize_t>clen >= n - n // 8:
                    dst[pos] = CHUNK_UNCOMPRESSED
                    _put_u32le(dst + pos + 1, <uint32_t>(n + CHECKSUM_SIZE))  # 3 bytes used
                    _put_u32le(dst + pos + CHUNK_HEADER, crc)
                    memcpy(dst + pos + CHUNK_HEADER + CHECKSUM_SIZE, src, n)
                    pos += CHUNK_HEADER + CHECKSUM_SIZE + n
                else:
                    dst[pos] = CHUNK_COMPRESSED
                    _put_u32le(dst + pos + 1, <uint32_t>(clen + CHECKSUM_SIZE))
                    _put_u32le(dst + pos + CHUNK_HEADER, crc)
                    memcpy(dst + pos + CHUNK_HEADER + CHECKSUM_SIZE, _scratch, clen)
                    pos += CHUNK_HEADER + CHECKSUM_SIZE + clen
                src += n
                left -= n
            PyByteArray_Resize(out, pos)
            return pos - start
        finally:
            PyBuffer_Release(&view)

    def encode(self, data):
        """The chunks for data, as bytes."""
        out = bytearray()
        self.encode_into(data, out)
        return bytes(out)


cdef class FrameDecoder:
    """golang/snappy's Reader, fed incrementally."""

    def __cinit__(self):
        self._in = bytearray()
        self._pos = 0
        self._read_header = False

    @property
    def pending(self):
        """Bytes received that do not make a whole chunk yet."""
        return PyByteArray_GET_SIZE(self._in) - self._pos

    def decode(self, data):
        """Feed received bytes; returns the data of every chunk they complete
        (possibly b"").  Raises SnappyError on corrupt or unsupported input."""
        cdef bytearray out = bytearray()
        cdef const uint8_t *p
        cdef Py_ssize_t avail, clen, n, base
        cdef size_t header = 0
        cdef int64_t dlen
        cdef uint8_t ctype
        cdef uint32_t checksum
        cdef uint8_t *dst
        self._in += data
        while True:
            p = <const uint8_t *>PyByteArray_AS_STRING(self._in) + self._pos
            avail = PyByteArray_GET_SIZE(self._in) - self._pos
            if avail < CHUNK_HEADER:
                break
            ctype = p[0]
            clen = p[1] | (<Py_ssize_t>p[2] << 8) | (<Py_ssize_t>p[3] << 16)
            if avail < CHUNK_HEADER + clen:
                break
            if not self._read_header:
                if ctype != CHUNK_STREAM_ID:
                    raise SnappyError("snappy: corrupt input")
                self._read_header = True
            p += CHUNK_HEADER
            if ctype == CHUNK_COMPRESSED or ctype == CHUNK_UNCOMPRESSED:
                if clen < CHECKSUM_SIZE:
                    raise SnappyError("snappy: corrupt input")
                checksum = _get_u32le(p)
                base = PyByteArray_GET_SIZE(out)
                if ctype == CHUNK_COMPRESSED:
                    dlen = snappy_decoded_len(p + CHECKSUM_SIZE, clen - CHECKSUM_SIZE, &header)
                    if dlen < 0 or dlen > SNAPPY_MAX_BLOCK:
                        raise SnappyError("snappy: corrupt input")
                    PyByteArray_Resize(out, base + dlen)
                    # the input buffer may not move: out is another object
                    p = <const uint8_t *>PyByteArray_AS_STRING(self._in) + self._pos + CHUNK_HEADER
                    dst = <uint8_t *>PyByteArray_AS_STRING(out) + base
                    if snappy_decode_block(dst, dlen, p + CHECKSUM_SIZE + header,
                                           clen - CHECKSUM_SIZE - header) < 0:
                        raise SnappyError("snappy: corrupt input")
                    n = dlen
                else:
                    n = clen - CHECKSUM_SIZE
                    if n > SNAPPY_MAX_BLOCK:
                        raise SnappyError("snappy: corrupt input")
                    PyByteArray_Resize(out, base + n)
                    p = <const uint8_t *>PyByteArray_AS_STRING(self._in) + self._pos + CHUNK_HEADER
                    dst = <uint8_t *>PyByteArray_AS_STRING(out) + base
                    memcpy(dst, p + CHECKSUM_SIZE, n)
                if snappy_masked_crc(dst, n) != checksum:
                    raise SnappyError("snappy: corrupt input")
            elif ctype == CHUNK_STREAM_ID:
                if clen != 6 or memcmp(p, b"sNaPpY", 6) != 0:
                    raise SnappyError("snappy: corrupt input")
            elif ctype < 0x80:
                raise SnappyError("snappy: unsupported input")
            # 0x80-0xfe: skippable, padding included
            self._pos += CHUNK_HEADER + clen
        if self._pos:
            if self._pos == PyByteArray_GET_SIZE(self._in):
                self._in = bytearray()
            elif self._pos > 65536:
                del self._in[:self._pos]
            else:
                return bytes(out)
            self._pos = 0
        return bytes(out)
