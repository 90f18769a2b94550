# Youzan's extended headers on the delivery path (ext.pyx).

from libc.stdint cimport uint32_t, uint64_t

from nsqshm._core.logcursor cimport CursorSet


cdef enum:
    EXT_OFFSET = 26           # the ext part starts after the message header
    NO_EXT_VER = 0
    TAG_EXT_VER = 2
    JSON_HEADER_EXT_VER = 4
    ACCEPT_SKIP = 0           # not for this client: confirmed for the channel (filter)
    ACCEPT_DELIVER = 1
    ACCEPT_LEAVE = 2          # not for this client: left in the ring (tag dispatch)


cdef Py_ssize_t ext_prefix(const unsigned char *msg, Py_ssize_t size) noexcept nogil
cdef Py_ssize_t json_unescape(const unsigned char *p, Py_ssize_t i, Py_ssize_t n, char *out,
                              Py_ssize_t cap, Py_ssize_t *olen) noexcept nogil
cdef Py_ssize_t json_member(const unsigned char *p, Py_ssize_t i, Py_ssize_t n,
                            Py_ssize_t *key, Py_ssize_t *value,
                            Py_ssize_t *value_end) noexcept nogil


cdef class TagSet:
    cdef bytes packed         # the tags wanted by the channel's consumers, each \0-ended
    cdef bint has(self, const unsigned char *tag, Py_ssize_t n) noexcept


cdef class ExtFilter:
    cdef int kind
    cdef bint inverse
    cdef bint any_of          # kind 4: "any" (else "all")
    cdef list keys            # bytes
    cdef list data            # bytes
    cdef void *regex          # regex_t * (kind 2)
    cdef int _equal(self, const unsigned char *json, Py_ssize_t n, bytes key, bytes data,
                    char *scratch) noexcept
    cdef int matches(self, const unsigned char *json, Py_ssize_t n, char *scratch) noexcept


cdef class ExtView:
    cdef readonly bint strip
    cdef readonly ExtFilter filter
    cdef readonly bytes tag
    cdef public TagSet tags
    cdef public CursorSet cursors
    cdef readonly uint64_t filtered
    cdef char *scratch
    cdef int accept(self, const char *msg, uint32_t size) except -1
    cdef int confirm(self, const char *msg_id) except -1
