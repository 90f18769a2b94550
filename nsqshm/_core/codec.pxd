from libc.stdint cimport uint16_t, uint64_t


cdef enum:
    MSG_ID_SIZE = 16
    MSG_HEADER_SIZE = 26      # timestamp 8 + attempts 2 + id 16


cdef void put_message_header(char *dst, uint64_t timestamp, uint16_t attempts,
                             const char *msg_id) noexcept nogil
cdef void put_u32be(char *dst, unsigned int v) noexcept nogil
cdef unsigned int get_u32be(const char *src) noexcept nogil
cdef void hex_id(char *dst, uint64_t v) noexcept nogil


cdef class IdGenerator:
    cdef uint64_t *counter
    cdef void *base
    cdef uint64_t next_value
    cdef uint64_t block_end
    cdef int fork_gen
    cdef readonly str name
    cdef void next_raw(self, char *dst) noexcept

