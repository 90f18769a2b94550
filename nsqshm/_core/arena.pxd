from libc.stdint cimport int64_t, uint32_t, uint64_t

from nsqshm._core.includes.system cimport nsqshm_arena_block, nsqshm_arena_header


# Free blocks of one size class: offsets from the start of the mapping.
ctypedef struct FreeList:
    uint64_t *offsets
    size_t length
    size_t capacity


cdef class Arena:
    cdef nsqshm_arena_header *hdr
    cdef char *base
    cdef size_t map_size
    cdef readonly str name
    cdef FreeList free_lists[32]      # by log2 of the block capacity
    cdef dict _queues                 # name -> index, this handle's cache
    cdef list _free_queues            # entries of forgotten queues, for reuse
    cdef uint32_t _scanned            # table entries this handle has read into _queues
    cdef readonly uint64_t fallbacks  # blocks malloc'd because the arena was full

    cdef nsqshm_arena_block *alloc(self, uint32_t msg_size) noexcept
    cdef void commit(self, nsqshm_arena_block *b, uint32_t queue, uint32_t state,
                     int64_t due_wall_ns) noexcept
    cdef void release_block(self, nsqshm_arena_block *b) noexcept
    cdef int _check(self) except -1
    cdef int _release_at(self, uint64_t offset) except -1
    cdef int _check_block_offset(self, uint64_t offset) except -1
    cdef nsqshm_arena_block *_block(self, uint64_t off, uint64_t end) except NULL


# Allocate a block for a message of msg_size bytes: in the arena when one is
# given and has room, else malloc'd (capacity 0, not crash-safe).  NULL when
# out of memory.
cdef nsqshm_arena_block *block_alloc(Arena arena, uint32_t msg_size) noexcept
# Give a block back: FREE in its arena, or free()d.
cdef void block_free(Arena arena, nsqshm_arena_block *b) noexcept
