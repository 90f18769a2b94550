"""A message key's partition, for the Spark sink on log topics: CRC-32C of
the key's bytes modulo the partition count.  Stable (the same key goes to
the same partition in every process, run and release, as long as the
partition count stays), so one key's messages stay in order in one log.
One C pass over an Arrow binary/string array's buffers, no Python object
per key."""

from cpython.buffer cimport PyBUF_SIMPLE, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from libc.stdint cimport int32_t, int64_t, uint32_t


cdef extern from "commitlog_layout.h" nogil:
    uint32_t nsqshm_crc32c(uint32_t crc, const void *p, size_t n)


def key_partitions(data, offsets, int width, Py_ssize_t start, Py_ssize_t count,
                   int partitions, out):
    """Write into `out` (count int32s) the partition of each key
    data[offsets[start + i]:offsets[start + i + 1]] (width: 4 or 8 byte
    offsets, as Arrow's binary and large_binary)."""
    cdef Py_buffer d, o, w
    cdef Py_ssize_t i
    cdef int64_t b, e
    cdef const char *base
    cdef int32_t *res
    if width not in (4, 8) or partitions < 1 or start < 0 or count < 0:
        raise ValueError("bad key spans")
    PyObject_GetBuffer(data, &d, PyBUF_SIMPLE)
    try:
        PyObject_GetBuffer(offsets, &o, PyBUF_SIMPLE)
        try:
            PyObject_GetBuffer(out, &w, PyBUF_WRITABLE)
            try:
                if o.len < (start + count + 1) * width or w.len < count * 4:
                    raise ValueError("offsets or out too short")
                base = <const char *>d.buf
                res = <int32_t *>w.buf
                for i in range(count):
                    if width == 4:
                        b = (<const int32_t *>o.buf)[start + i]
                        e = (<const int32_t *>o.buf)[start + i + 1]
                    else:
                        b = (<const int64_t *>o.buf)[start + i]
                        e = (<const int64_t *>o.buf)[start + i + 1]
                    if b < 0 or e < b or e > d.len:
                        raise ValueError(f"key {i}: span {b}..{e} outside the data")
                    res[i] = <int32_t>(nsqshm_crc32c(0, base + b, e - b) % <uint32_t>partitions)
            finally:
                PyBuffer_Release(&w)
        finally:
            PyBuffer_Release(&o)
    finally:
        PyBuffer_Release(&d)
