# The snappy framing format as nsqd speaks it, encoded and decoded in C (snappy.pyx).


cdef enum:
    CHUNK_COMPRESSED = 0x00
    CHUNK_UNCOMPRESSED = 0x01
    CHUNK_PADDING = 0xfe
    CHUNK_STREAM_ID = 0xff
    CHUNK_HEADER = 4
    CHECKSUM_SIZE = 4


cdef class FrameEncoder:
    cdef bint _wrote_header


cdef class FrameDecoder:
    cdef bytearray _in
    cdef Py_ssize_t _pos
    cdef bint _read_header
