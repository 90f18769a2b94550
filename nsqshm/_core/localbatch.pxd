# Batch helpers for local clients and the Spark source, a C loop per batch (localbatch.pyx).

from libc.stdint cimport int32_t, int64_t, uint32_t


# A growing malloc'd buffer: one of the headers column's.
cdef struct GrowBuf:
    char *data
    int64_t len
    int64_t cap


cdef class CBuffer:
    cdef char *data
    cdef Py_ssize_t size
    cdef Py_ssize_t shape[1]


cdef class Columns:
    cdef char *values
    cdef int64_t vlen, vcap
    cdef int32_t *offsets
    cdef char *ids
    cdef int64_t *ts
    cdef int32_t *attempts
    cdef Py_ssize_t n, cap
    cdef public int64_t since_ns
    cdef public int64_t skipped
    cdef readonly bint ext
    cdef readonly bint headers
    # the headers column: row validity bits, row -> pair offsets, keys, values
    cdef GrowBuf hvalid, hrows, koffs, kdata, voffs, vdata
    cdef int32_t npairs
    cdef bint log_bump                # add_log's bump, for its sink (_take_log_message)
    cdef int64_t log_budget           # add_log's bytes left; its first message always fits
    cdef Py_ssize_t log_taken         # messages add_log's sink took in this call

    cdef void _forget_headers(self) noexcept
    cdef int _add_headers(self, const unsigned char *json, Py_ssize_t n) except -1
    cdef void _forget(self) noexcept
    cdef int _grow_rows(self, Py_ssize_t rows) except -1
    cdef int _grow_values(self, int64_t nbytes) except -1
    cdef int _reserve(self, int64_t body) noexcept
    cdef inline int _add(self, const char *msg, uint32_t size, bint bump,
                  bint detail=*) except -1
