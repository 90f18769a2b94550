from libc.stdint cimport uint32_t, uint64_t

from nsqshm._core.includes.system cimport nsqshm_ring_header


cdef class Ring:
    cdef nsqshm_ring_header *hdr
    cdef char *data
    cdef uint64_t cap
    cdef uint64_t mask
    cdef uint32_t max_rec
    cdef size_t map_size
    cdef readonly str name
    cdef readonly tuple identity  # (st_dev, st_ino) of the segment (segment.identity)
    cdef bytes _path_prefix       # b"/dev/shm/<name>", for waiter FIFOs
    # this handle as a waiter: a slot in hdr.waiters and the FIFO it reads
    cdef int slot
    cdef int slot_pid
    cdef uint64_t slot_value
    cdef int wait_fd
    # FIFOs of other waiters, opened for writing on first wake, by slot
    cdef int wake_fds[64]
    cdef uint64_t wake_vals[64]
    # called instead of writing this handle's own FIFO, in its own process
    cdef object local_waker

    cdef int _lock_prod(self) except -1
    cdef int _lock_cons(self) except -1
    cdef void _unlock_prod(self) noexcept nogil
    cdef void _unlock_cons(self) noexcept nogil
    cdef int _put(self, uint64_t *tail, uint64_t head,
                  const char *src, uint32_t n) noexcept nogil
    cdef void _commit_push(self, uint64_t tail, uint64_t records,
                           uint64_t nbytes) noexcept nogil
    cdef void _commit_pop(self, uint64_t head, uint64_t records,
                          uint64_t nbytes) noexcept nogil
    cdef int _next(self, uint64_t *head, uint64_t tail,
                   char **rec, uint32_t *size) except -2
    cdef void _wake(self, uint64_t *word) noexcept
    cdef void _wake_slot(self, int s, bint space) noexcept
    cdef int _fifo_path(self, int s, uint64_t v, char *buf, size_t n) noexcept
    cdef void _reap_slot(self, int s, uint64_t v) noexcept
    cdef int _check(self) except -1
    cdef bint _flag(self, uint32_t bit) except -1
    cdef int _set_flag(self, uint32_t bit, bint value) except -1
    cdef int _map_raw(self, int fd, size_t size) except -1
    cpdef int push(self, data) except -100
    cpdef int pop_into(self, buffer) except -100
    cdef tuple _copy_out(self, buffer, Py_ssize_t max_records, bint pop)
    cdef int _check_room(self, Py_ssize_t room) except -1
    cdef Py_ssize_t _gather(self, char *dst, Py_ssize_t room, Py_ssize_t max_records,
                            Py_ssize_t *pos_out, uint64_t *head_out,
                            uint64_t *nbytes_out) except -1
