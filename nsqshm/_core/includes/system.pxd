# Extern C declarations used by the _core extensions, in one place.

from libc.stdint cimport int64_t, uint8_t, uint16_t, uint32_t, uint64_t


cdef extern from "<pthread.h>" nogil:
    ctypedef struct pthread_mutex_t:
        pass
    ctypedef struct pthread_mutexattr_t:
        pass
    int PTHREAD_PROCESS_SHARED
    int PTHREAD_MUTEX_ROBUST
    int pthread_mutexattr_init(pthread_mutexattr_t *attr)
    int pthread_mutexattr_destroy(pthread_mutexattr_t *attr)
    int pthread_mutexattr_setpshared(pthread_mutexattr_t *attr, int pshared)
    int pthread_mutexattr_setrobust(pthread_mutexattr_t *attr, int robust)
    int pthread_mutex_init(pthread_mutex_t *m, const pthread_mutexattr_t *attr)
    int pthread_mutex_lock(pthread_mutex_t *m)
    int pthread_mutex_trylock(pthread_mutex_t *m)
    int pthread_mutex_unlock(pthread_mutex_t *m)
    int pthread_mutex_consistent(pthread_mutex_t *m)


cdef extern from "<errno.h>" nogil:
    int errno
    int EOWNERDEAD
    int EBUSY
    int ENOTRECOVERABLE
    int EAGAIN
    int EINTR
    int ENXIO
    int ENOENT
    int EPIPE
    int EEXIST
    int ESRCH


cdef extern from "<sys/mman.h>" nogil:
    int PROT_READ
    int PROT_WRITE
    int MAP_SHARED
    void *MAP_FAILED
    void *mmap(void *addr, size_t length, int prot, int flags, int fd, long offset)
    int munmap(void *addr, size_t length)


cdef extern from "<sys/stat.h>" nogil:
    int mkfifo(const char *path, unsigned int mode)
    int fchmod(int fd, unsigned int mode)


cdef extern from "<fcntl.h>" nogil:
    int O_RDWR
    int O_WRONLY
    int O_NONBLOCK
    int O_CLOEXEC
    int open(const char *path, int flags, ...)


cdef extern from "<unistd.h>" nogil:
    ssize_t write(int fd, const void *buf, size_t n)
    ssize_t read(int fd, void *buf, size_t n)
    int close(int fd)
    int unlink(const char *path)
    int getpid()


cdef extern from "<signal.h>" nogil:
    int kill(int pid, int sig)


cdef extern from "<poll.h>" nogil:
    struct pollfd:
        int fd
        short events
        short revents
    short POLLIN
    int poll(pollfd *fds, unsigned long nfds, int timeout)


cdef extern from "<time.h>" nogil:
    struct timespec:
        long tv_sec
        long tv_nsec
    int CLOCK_REALTIME
    int CLOCK_MONOTONIC
    int clock_gettime(int clk, timespec *ts)


cdef extern from "<stdio.h>" nogil:
    int snprintf(char *buf, size_t n, const char *fmt, ...)


cdef extern from "<string.h>" nogil:
    void *memcpy(void *dst, const void *src, size_t n)
    void *memset(void *dst, int c, size_t n)


cdef extern from "ring_layout.h" nogil:
    uint64_t NSQSHM_RING_MAGIC
    uint32_t NSQSHM_RING_VERSION
    uint32_t NSQSHM_RING_HEADER_SIZE
    int NSQSHM_RING_WAITERS
    uint32_t NSQSHM_RECORD_HEADER
    uint32_t NSQSHM_WRAP_MARKER

    ctypedef struct nsqshm_lock_line:
        pthread_mutex_t mutex

    ctypedef struct nsqshm_ring_header:
        uint64_t magic
        uint32_t version
        uint32_t header_size
        uint64_t capacity
        uint64_t total_size
        uint32_t max_record
        uint32_t mutex_size
        uint64_t created_ns
        uint32_t creator_pid
        uint32_t flags
        nsqshm_lock_line prod_lock
        uint64_t tail
        uint64_t push_records
        uint64_t push_bytes
        uint64_t j_tail
        uint64_t j_push_records
        uint64_t j_push_bytes
        uint64_t retired
        nsqshm_lock_line cons_lock
        uint64_t head
        uint64_t pop_records
        uint64_t pop_bytes
        uint64_t j_head
        uint64_t j_pop_records
        uint64_t j_pop_bytes
        uint64_t wait_data
        uint64_t wait_space
        uint64_t recoveries
        uint64_t local_msgs
        uint64_t local_body_bytes
        uint64_t subscribers
        uint64_t ttl_ns
        uint64_t local_expired
        uint64_t direct_subscribers
        uint64_t waiters[64]
        uint64_t local_requeues
        uint64_t local_timeouts
        uint64_t lanes_version

    uint64_t nsqshm_load_acquire(const uint64_t *p)
    uint32_t nsqshm_flags_load(const uint32_t *p)
    void nsqshm_flags_or(uint32_t *p, uint32_t v)
    void nsqshm_flags_and(uint32_t *p, uint32_t v)
    uint64_t nsqshm_load_relaxed(const uint64_t *p)
    void nsqshm_store_release(uint64_t *p, uint64_t v)
    void nsqshm_fence()
    uint64_t nsqshm_fetch_or(uint64_t *p, uint64_t v)
    uint64_t nsqshm_fetch_and(uint64_t *p, uint64_t v)
    uint64_t nsqshm_exchange(uint64_t *p, uint64_t v)
    uint64_t nsqshm_fetch_add(uint64_t *p, uint64_t v)
    bint nsqshm_cas(uint64_t *p, uint64_t expected, uint64_t desired)
    int nsqshm_ctz64(uint64_t v)


cdef extern from "arena_layout.h" nogil:
    uint64_t NSQSHM_ARENA_MAGIC
    uint32_t NSQSHM_ARENA_VERSION
    uint32_t NSQSHM_ARENA_HEADER_SIZE
    uint32_t NSQSHM_ARENA_QUEUE_ENTRY
    uint32_t NSQSHM_ARENA_QUEUE_NAME_MAX
    uint32_t NSQSHM_ARENA_MIN_BLOCK
    uint32_t NSQSHM_ARENA_ORDERED_LANES
    uint32_t NSQSHM_ARENA_QUEUE_LANES
    uint32_t NSQSHM_ARENA_QUEUE_LANES_AT
    uint32_t NSQSHM_BLOCK_FREE
    uint32_t NSQSHM_BLOCK_LIVE
    uint32_t NSQSHM_BLOCK_DEFERRED

    ctypedef struct nsqshm_msg_entry:
        uint64_t client_id
        uint64_t hash
        uint32_t heap_index
        uint32_t size
        int64_t first_deadline

    ctypedef struct nsqshm_arena_block:
        uint32_t capacity
        uint32_t state
        uint32_t queue
        int64_t due_ns
        nsqshm_msg_entry entry

    ctypedef struct nsqshm_arena_client:
        uint64_t connect_ts
        uint64_t message_count
        uint64_t finish_count
        uint64_t requeue_count
        uint64_t in_flight
        uint32_t ready_count
        uint32_t queue
        char client_id[64]
        char hostname[64]
        char user_agent[64]
        uint8_t ordered_lanes[32]

    ctypedef struct nsqshm_arena_header:
        uint64_t magic
        uint32_t version
        uint32_t header_size
        uint64_t total_size
        uint64_t data_offset
        uint32_t max_queues
        uint32_t n_queues
        uint32_t owner_pid
        uint32_t flags
        uint64_t owner_start
        uint64_t created_ns
        uint64_t bump
        uint64_t live_blocks
        uint64_t live_bytes
        char label[64]
        nsqshm_arena_client client

    uint32_t nsqshm_load32_acquire(const uint32_t *p)
    void nsqshm_store32_release(uint32_t *p, uint32_t v)
    int nsqshm_cas32(uint32_t *p, uint32_t expected, uint32_t desired)


cdef extern from "byteorder.h" nogil:
    uint16_t nsqshm_be16(const void *p)
    uint32_t nsqshm_be32(const void *p)
    uint64_t nsqshm_be64(const void *p)
    void nsqshm_put_be32(void *p, uint32_t v)
    void nsqshm_put_be64(void *p, uint64_t v)


cdef extern from "message_expiry.h" nogil:
    # a message's own time to live: see message_expiry.h for the layout
    enum: NSQSHM_EXPIRY_BIT
    enum: NSQSHM_EXPIRY_SIZE
    bint nsqshm_has_expiry(const char *msg, uint32_t size)
    int64_t nsqshm_expires_at(const char *msg, uint32_t size)
    void nsqshm_clear_expiry(char *msg)
    uint32_t nsqshm_attempts(const char *msg)
