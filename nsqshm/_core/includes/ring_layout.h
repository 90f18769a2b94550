/* The byte layout of a shared-memory ring segment (layout version 1).
 *
 * A segment is one POSIX shared memory object: a 4096-byte header, then
 * `capacity` bytes of record data (capacity a power of two).  Every field
 * is native-endian (the segment never leaves the host).  Each group that one
 * side writes sits on its own 64-byte cache line, so producers and consumers
 * do not false-share.
 *
 *   offset  size  field
 *   ------  ----  -----------------------------------------------------------
 *        0     8  magic          "nsqshmRG" read as a little-endian u64
 *        8     4  version        NSQSHM_RING_VERSION
 *       12     4  header_size    4096: offset of the data area
 *       16     8  capacity       data bytes, a power of two
 *       24     8  total_size     header_size + capacity == size of the object
 *       32     4  max_record     largest payload accepted, <= capacity/2 - 8
 *       36     4  mutex_size     sizeof(pthread_mutex_t): an ABI check
 *       40     8  created_ns     CLOCK_REALTIME at creation
 *       48     4  creator_pid
 *       52     4  flags          bit 0: the owner's disk queue holds messages;
 *                                bit 1: the channel is paused;
 *                                bit 2: a log channel's client waits on the empty
 *                                ring (the owners' feeders fill it);
 *                                bit 3: a log channel's topic is paused (local
 *                                consumers reading its logs take nothing)
 *       64    64  prod_lock      robust process-shared pthread mutex
 *      128    64  producer line  tail, push_records, push_bytes,
 *                                j_tail, j_push_records, j_push_bytes,
 *                                retired (at 176): nonzero once the broker drains the
 *                                ring a last time before it removes it (a graceful
 *                                stop): push_packed refuses to push (RingRetired), so
 *                                nothing lands in a ring nobody will read again
 *      192    64  cons_lock      robust process-shared pthread mutex
 *      256    64  consumer line  head, pop_records, pop_bytes,
 *                                j_head, j_pop_records, j_pop_bytes
 *      320    64  wait_data      bitmask of waiter slots sleeping for data
 *      384    64  wait_space     bitmask of waiter slots sleeping for space
 *      448     8  recoveries     locks taken over from a dead holder
 *      456     8  local_msgs     messages local producers published (a topic ring)
 *      464     8  local_body_bytes  their body bytes (the owner's /stats adds both)
 *      472     8  subscribers    clients of every worker subscribed to the channel
 *                                (a channel ring; --max-channel-consumers), added to
 *                                atomically; a new worker sets it from its peers'
 *                                counts (a dead worker's clients are gone)
 *      480     8  ttl_ns         the channel's time to live (the smaller of its topic's
 *                                and its own, 0 for none; nsqd/policies/policy.py), written by
 *                                the broker for local consumers (a channel ring)
 *      488     8  local_expired  messages local consumers dropped as expired (their own
 *                                deadline or ttl_ns), added to atomically; the topic's
 *                                owner adds them to the channel's expired_count
 *      496     8  direct_subscribers  of those subscribers, the clients that take every
 *                                partition straight from a log topic's logs (a log
 *                                channel's ring): while all are, the owners' feeders
 *                                push nothing into the ring; set with subscribers
 *      512   512  waiters[64]    u64 each: pid << 32 | token, 0 when free
 *     1024     8  local_requeues  messages local consumers put back (REQ), added to
 *     1032     8  local_timeouts  and timed out, atomically; the topic's owner adds
 *                                them to the channel's requeue_count and timeout_count
 *                                (0 in a segment made before them: the bytes were zero)
 *     1040     8  lanes_version  a log channel's ring: bumped whenever a partition gets a
 *                                lane or its lane turns ordered (LogChannel.use_lanes),
 *                                once the cursors are held, before the drop; local
 *                                consumers look for lanes again
 *                                only when it changed (nsqshm/local/lanes.py)
 *     4096   cap  data           records
 *
 * A record in the data area, at an 8-byte aligned offset:
 *
 *   [ u32 size ][ u32 flags (0) ][ size bytes of payload ][ pad to 8 ]
 *
 * size == 0xFFFFFFFF is a wrap marker: the rest of the data area up to its
 * end is unused and the next record starts at offset 0.
 *
 * tail and head are byte positions that only grow; the offset of a position
 * is pos & (capacity - 1).  Free space is capacity - (tail - head).
 *
 * The j_* fields are a redo journal.  The side that holds a lock writes the
 * new values into j_* first, then stores tail (or head) -- the commit point --
 * then the counters.  A process that takes a lock whose holder died
 * (EOWNERDEAD) re-applies j_* counters when tail == j_tail (head == j_head), so
 * counters always agree with the committed position.
 */
#ifndef NSQSHM_RING_LAYOUT_H
#define NSQSHM_RING_LAYOUT_H

#include <pthread.h>
#include <stdint.h>
#include <stddef.h>

/* the bytes "nsqshmRG" read as a little-endian u64 */
#define NSQSHM_RING_MAGIC 0x47526d687371736eULL
#define NSQSHM_RING_VERSION 1u
#define NSQSHM_RING_HEADER_SIZE 4096u
#define NSQSHM_RING_WAITERS 64
#define NSQSHM_RECORD_HEADER 8u
#define NSQSHM_WRAP_MARKER 0xFFFFFFFFu

typedef union {
    pthread_mutex_t mutex;
    uint8_t _line[64];
} nsqshm_lock_line;

typedef struct {
    /* line 0: identity, written once; magic is stored last */
    uint64_t magic;
    uint32_t version;
    uint32_t header_size;
    uint64_t capacity;
    uint64_t total_size;
    uint32_t max_record;
    uint32_t mutex_size;
    uint64_t created_ns;
    uint32_t creator_pid;
    uint32_t flags;
    uint64_t _pad0;
    /* line 1 */
    nsqshm_lock_line prod_lock;
    /* line 2: written by the producer holding prod_lock */
    uint64_t tail;
    uint64_t push_records;
    uint64_t push_bytes;
    uint64_t j_tail;
    uint64_t j_push_records;
    uint64_t j_push_bytes;
    uint64_t retired;
    uint64_t _pad2[1];
    /* line 3 */
    nsqshm_lock_line cons_lock;
    /* line 4: written by the consumer holding cons_lock */
    uint64_t head;
    uint64_t pop_records;
    uint64_t pop_bytes;
    uint64_t j_head;
    uint64_t j_pop_records;
    uint64_t j_pop_bytes;
    uint64_t _pad4[2];
    /* lines 5, 6: who sleeps on what */
    uint64_t wait_data;
    uint64_t _pad5[7];
    uint64_t wait_space;
    uint64_t _pad6[7];
    /* line 7: how often a dead lock holder was recovered; and the messages
       (with their body bytes) local producers published into the ring, which
       a topic's owner adds to the topic's message_count (nsqshm.local) */
    uint64_t recoveries;
    uint64_t local_msgs;
    uint64_t local_body_bytes;
    uint64_t subscribers;
    uint64_t ttl_ns;
    uint64_t local_expired;
    uint64_t direct_subscribers;
    uint64_t _pad7[1];
    /* 512: waiter slots */
    uint64_t waiters[NSQSHM_RING_WAITERS];
    /* 1024: what local consumers of a channel ring put back and let time out
       (nsqshm.local), which the topic's owner adds to the channel's counts */
    uint64_t local_requeues;
    uint64_t local_timeouts;
    /* 1040: a log channel's lanes changed (LogChannel.use_lanes) */
    uint64_t lanes_version;
} nsqshm_ring_header;

_Static_assert(sizeof(pthread_mutex_t) <= 64, "pthread_mutex_t must fit a cache line");
_Static_assert(offsetof(nsqshm_ring_header, prod_lock) == 64, "layout");
_Static_assert(offsetof(nsqshm_ring_header, tail) == 128, "layout");
_Static_assert(offsetof(nsqshm_ring_header, retired) == 176, "layout");
_Static_assert(offsetof(nsqshm_ring_header, cons_lock) == 192, "layout");
_Static_assert(offsetof(nsqshm_ring_header, head) == 256, "layout");
_Static_assert(offsetof(nsqshm_ring_header, wait_data) == 320, "layout");
_Static_assert(offsetof(nsqshm_ring_header, wait_space) == 384, "layout");
_Static_assert(offsetof(nsqshm_ring_header, subscribers) == 472, "layout");
_Static_assert(offsetof(nsqshm_ring_header, direct_subscribers) == 496, "layout");
_Static_assert(offsetof(nsqshm_ring_header, waiters) == 512, "layout");
_Static_assert(offsetof(nsqshm_ring_header, local_requeues) == 1024, "layout");
_Static_assert(offsetof(nsqshm_ring_header, lanes_version) == 1040, "layout");
_Static_assert(sizeof(nsqshm_ring_header) <= NSQSHM_RING_HEADER_SIZE, "header fits");

/* Atomics.  Release stores keep program order for the crash journal too: a
 * process killed mid-operation has executed a prefix of its stores. */
static inline uint64_t nsqshm_load_acquire(const uint64_t *p) {
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
static inline uint64_t nsqshm_load_relaxed(const uint64_t *p) {
    return __atomic_load_n(p, __ATOMIC_RELAXED);
}
static inline void nsqshm_store_release(uint64_t *p, uint64_t v) {
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
}
static inline void nsqshm_fence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline uint64_t nsqshm_fetch_or(uint64_t *p, uint64_t v) {
    return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST);
}
static inline uint64_t nsqshm_fetch_and(uint64_t *p, uint64_t v) {
    return __atomic_fetch_and(p, v, __ATOMIC_SEQ_CST);
}
static inline uint64_t nsqshm_exchange(uint64_t *p, uint64_t v) {
    return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST);
}
static inline uint64_t nsqshm_fetch_add(uint64_t *p, uint64_t v) {
    return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
static inline int nsqshm_cas(uint64_t *p, uint64_t expected, uint64_t desired) {
    return __atomic_compare_exchange_n(p, &expected, desired, 0,
                                       __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}
static inline int nsqshm_ctz64(uint64_t v) { return __builtin_ctzll(v); }
/* flags: bit 0 = the queue's owner has messages on disk (a refill may be asked),
 * bit 1 = the channel is paused, bit 2 = a log channel's client waits on the
 * empty ring (ring_wanted), bit 3 = a log channel's topic is paused */
static inline uint32_t nsqshm_flags_load(const uint32_t *p) {
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
static inline void nsqshm_flags_or(uint32_t *p, uint32_t v) {
    __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST);
}
static inline void nsqshm_flags_and(uint32_t *p, uint32_t v) {
    __atomic_fetch_and(p, v, __ATOMIC_SEQ_CST);
}

#endif
