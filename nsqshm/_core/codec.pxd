from libc.stdint cimport uint16_t, uint32_t, uint64_t


cdef enum:
    MSG_ID_SIZE = 16
    MSG_HEADER_SIZE = 26      # timestamp 8 + attempts 2 + id 16


cdef void put_message_header(char *dst, uint64_t timestamp, uint16_t attempts,
                             const char *msg_id) noexcept nogil
cdef void put_u32be(char *dst, unsigned int v) noexcept nogil
cdef unsigned int get_u32be(const char *src) noexcept nogil
cdef void hex_id(char *dst, uint64_t v) noexcept nogil


cdef class IdGenerator:
    cdef uint64_t *clock
    cdef void *base
    cdef uint64_t next_value
    cdef uint64_t block_end
    cdef uint32_t node
    cdef int fork_gen
    cdef readonly str name
    cdef void next_raw(self, char *dst) noexcept
    cdef int _map(self, int fd) except -1
    cdef int _check_header(self) except -1
    cdef bint _retire_v1(self, uint64_t *floor) except -1
    cdef int _lease_floor(self, bytes path, uint64_t floor) except -1
    cdef bint _create(self, str name, int node_id, bytes path, uint64_t floor) except -1
    cdef int _adopt(self, int node_id, bytes path) except -1
    cdef int _extend_lease(self, uint64_t need) noexcept
    cdef void _reserve(self) noexcept
    cdef int _check(self) except -1

