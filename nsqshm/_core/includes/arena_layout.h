/* The byte layout of an in-flight arena segment (layout version 1).
 *
 * An arena holds the messages one process has taken out of the rings and
 * not yet finished: messages in flight to its clients, and messages it
 * deferred.  It lives in POSIX shared memory, so when the process dies
 * another one (the supervisor's new worker, the topic's owner) can put every
 * message back.  The segment is sparse: pages are used as blocks are.
 *
 *   offset  size  field
 *   ------  ----  -----------------------------------------------------------
 *        0     8  magic          "nsqshmAR" read as a little-endian u64
 *        8     4  version        NSQSHM_ARENA_VERSION
 *       12     4  header_size    4096
 *       16     8  total_size     size of the object
 *       24     8  data_offset    header_size + max_queues * 256
 *       32     4  max_queues
 *       36     4  n_queues       entries of the queue table in use (release)
 *       40     4  owner_pid      the process whose messages these are
 *       44     4  flags          ORDERED_LANES (1): client.ordered_lanes is kept (every
 *                                arena this build makes; 0 in an older one's);
 *                                QUEUE_LANES (2): the queue table's lanes bitmaps are
 *                                kept (a broker worker's arena, Arena.keep_queue_lanes)
 *       48     8  owner_start    its start time (/proc/<pid>/stat field 22)
 *       56     8  created_ns     CLOCK_REALTIME at creation
 *       64     8  bump           end of the blocks ever allocated (release)
 *       72     8  live_blocks    blocks LIVE or DEFERRED (owner's count)
 *       80     8  live_bytes     their message bytes
 *      128    64  label          NUL-padded text: what the owner is
 *      512   512  client         a local client's description (nsqshm.local):
 *                                counters, names, and at 752 ordered_lanes, 32 bytes:
 *                                bit p (byte p / 8, bit p % 8) set once the client
 *                                attached partition p's ordered lane (after it dropped
 *                                what it held of p from before the move into it); the
 *                                broker's recovery of a dead client's arena puts back a
 *                                copy of such a partition only if its bit is set
 *     4096  q*256 queue table    per queue, 256 bytes:
 *                                  0    2  length      of the name (0: a free entry)
 *                                  2  222  name        "topic:channel", not NUL-ended
 *                                224   32  lanes       bit p set once the owner (a
 *                                          broker worker) attached the channel's ordered
 *                                          lane of partition p after it dropped what it
 *                                          held of p from before the move into it: the
 *                                          recovery puts back a copy of such a partition
 *                                          only if its bit is set (QUEUE_LANES)
 *   data_offset   blocks
 *
 * A block, at an 8-byte aligned offset; capacity is a power of two >= 128
 * and never changes once the block exists, so a scan walks the blocks from
 * data_offset to bump by capacity:
 *
 *   offset  size  field
 *        0     4  capacity     bytes of the block, this header included
 *        4     4  state        FREE 0, LIVE 1 (in flight), DEFERRED 2
 *        8     4  queue        index in the queue table
 *       12     4  reserved
 *       16     8  due_ns       wall clock: a LIVE message's deadline, a
 *                              DEFERRED one's due time
 *       24     8  reserved
 *       32    32  entry        the owner's bookkeeping (MsgEntry); its u32 at
 *                              offset 52 is the message size
 *       64     n  message      nsqd's encoding (timestamp, attempts, ID, body)
 *
 * The message and the other fields are written first and state last
 * (store-release); a message leaves the arena by its state going back to
 * FREE only after it was stored elsewhere, so a death at any instant loses
 * nothing and may repeat a message.
 */
#ifndef NSQSHM_ARENA_LAYOUT_H
#define NSQSHM_ARENA_LAYOUT_H

#include <stdint.h>
#include <stddef.h>

/* the bytes "nsqshmAR" read as a little-endian u64 */
#define NSQSHM_ARENA_MAGIC 0x52416d687371736eULL
#define NSQSHM_ARENA_VERSION 1u
#define NSQSHM_ARENA_HEADER_SIZE 4096u
#define NSQSHM_ARENA_QUEUE_ENTRY 256u
#define NSQSHM_ARENA_QUEUE_NAME_MAX 222u
#define NSQSHM_ARENA_QUEUE_LANES_AT 224u  /* the lanes bitmap's offset in an entry */
#define NSQSHM_ARENA_MIN_BLOCK 128u
#define NSQSHM_ARENA_ORDERED_LANES 1u   /* flags: client.ordered_lanes is kept */
#define NSQSHM_ARENA_QUEUE_LANES 2u     /* flags: the queue entries' lanes are kept */

enum { NSQSHM_BLOCK_FREE = 0, NSQSHM_BLOCK_LIVE = 1, NSQSHM_BLOCK_DEFERRED = 2 };

typedef struct {
    uint64_t client_id;
    uint64_t hash;            /* of the message ID, kept so rehashing never reads the message */
    uint32_t heap_index;      /* where this entry's node is in its heap */
    uint32_t size;
    int64_t first_deadline;   /* the deadline given at delivery (TOUCH caps from it) */
} nsqshm_msg_entry;

typedef struct {
    uint32_t capacity;        /* 0: a malloc'd block outside any arena */
    uint32_t state;
    uint32_t queue;
    uint32_t reserved0;
    int64_t due_ns;
    uint64_t reserved1;
    nsqshm_msg_entry entry;
} nsqshm_arena_block;

typedef struct {
    uint64_t connect_ts;
    uint64_t message_count;
    uint64_t finish_count;
    uint64_t requeue_count;
    uint64_t in_flight;
    uint32_t ready_count;
    uint32_t queue;
    char client_id[64];
    char hostname[64];
    char user_agent[64];
    uint8_t ordered_lanes[32];  /* a bit per partition 0..255: its ordered lane attached */
} nsqshm_arena_client;

typedef struct {
    uint64_t magic;
    uint32_t version;
    uint32_t header_size;
    uint64_t total_size;
    uint64_t data_offset;
    uint32_t max_queues;
    uint32_t n_queues;
    uint32_t owner_pid;
    uint32_t flags;
    uint64_t owner_start;
    uint64_t created_ns;
    uint64_t bump;
    uint64_t live_blocks;
    uint64_t live_bytes;
    uint8_t _pad0[128 - 88];
    char label[64];
    uint8_t _pad1[512 - 192];
    nsqshm_arena_client client;
} nsqshm_arena_header;

_Static_assert(sizeof(nsqshm_msg_entry) == 32, "entry is 32 bytes");
_Static_assert(sizeof(nsqshm_arena_block) == 64, "block header is 64 bytes");
_Static_assert(offsetof(nsqshm_arena_block, entry) + offsetof(nsqshm_msg_entry, size) == 52,
               "message size at offset 52");
_Static_assert(offsetof(nsqshm_arena_header, bump) == 64, "bump at 64");
_Static_assert(offsetof(nsqshm_arena_header, label) == 128, "label at 128");
_Static_assert(offsetof(nsqshm_arena_header, client) == 512, "client at 512");
_Static_assert(offsetof(nsqshm_arena_header, client) + offsetof(nsqshm_arena_client, ordered_lanes)
               == 752, "ordered_lanes at 752");
_Static_assert(sizeof(nsqshm_arena_header) <= NSQSHM_ARENA_HEADER_SIZE, "header fits");

static inline uint32_t nsqshm_load32_acquire(const uint32_t *p) {
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
static inline void nsqshm_store32_release(uint32_t *p, uint32_t v) {
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
}
static inline int nsqshm_cas32(uint32_t *p, uint32_t expected, uint32_t desired) {
    return __atomic_compare_exchange_n(p, &expected, desired, 0,
                                       __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}

#endif
