/* The byte layouts of a log topic's partition (commit log, layout version 1)
 * and of a channel's cursor into it.
 *
 * A partition is a directory <data_path>/<topic>-<partition>.nsqlog/ holding
 *
 *   state                     the commit block (below), mmap'd by every reader
 *   <base offset:%020d>.log   segment: records, rolled at segment_bytes
 *   <base offset:%020d>.index      sparse: msg offset -> file position
 *   <base offset:%020d>.timeindex  sparse: timestamp -> msg offset
 *
 * Two positions name a message, as in Youzan's nsq: its msg offset (the
 * count of messages before it in the partition) and its virtual offset (the
 * byte position of its record in the partition's whole log = the segment's
 * base virtual offset + the record's position in the segment file).
 *
 * A record in a segment file (big-endian: the files may be copied to another
 * host, e.g. by replication), self-checking:
 *
 *   offset  size  field
 *   ------  ----  -----------------------------------------------------------
 *        0     4  size        bytes after the crc: 8 + message size
 *        4     4  crc         CRC-32C (Castagnoli, as Kafka's v2 records and
 *                             ext4/iSCSI) of the `size` bytes that follow
 *        8     8  msg offset
 *       16  size-8 message    nsqd's encoding, as it arrives from the rings:
 *                             [ 8 timestamp ns ][ 2 attempts ][ 16 ID ][ body ]
 *
 * An .index file: a 32-byte header, then 8-byte entries, one for the first
 * record at or past every index_interval bytes of the file (the first record
 * of a segment has none: it is at position 0):
 *
 *        0     8  magic        "NSQLIDX1"
 *        8     8  base offset  msg offset of the segment's first record (BE)
 *       16     8  base virtual its virtual offset (BE)
 *       24     4  interval     index_interval (BE)
 *       28     4  reserved
 *   entry:
 *        0     4  relative msg offset (offset - base) (BE)
 *        4     4  file position of that record (BE)
 *
 * A .timeindex file: a 32-byte header as above with magic "NSQLTIM1", then
 * 12-byte entries written at the same points as the .index ones:
 *
 *        0     8  max timestamp (ns) of every record of the partition
 *                 BEFORE this entry's record (BE); monotonic across segments
 *        8     4  relative msg offset (BE)
 *
 * so every record before the entry's one is older than or as old as the
 * timestamp: a search for "first record at or after T" starts at the last
 * entry whose timestamp is < T.  A finished segment's last entry has the
 * relative offset of the next segment's base (one past its last record) and
 * the segment's max timestamp (used by retention by age).
 *
 * Segment files are written with pwrite only, so a file's size is the end of
 * its data; a killed writer leaves at most a torn last record, truncated by
 * the next open.  Readers map every segment with a length of segment_bytes
 * (more than the file while it grows: never touched past the committed end).
 *
 * The state file (4096 bytes, mode 0600, native-endian: it is host-local
 * and rebuilt from the segments at every writer open), mmap'd shared:
 *
 *   offset  size  field
 *   ------  ----  -----------------------------------------------------------
 *        0     8  magic          "nsqshmLS" read as a little-endian u64
 *        8     4  version        NSQSHM_LOG_VERSION
 *       12     4  index_interval
 *       16     8  segment_bytes
 *       24     4  writer_pid     the process that has the log open for writing
 *       28     4  reserved
 *       32     8  generation     commits made; slot generation & 1 is current
 *       64    64  slot[0]        a commit (below)
 *      128    64  slot[1]
 *      192     8  synced_offset  msgs before it were fsynced (data and index)
 *
 * A commit: start_offset, start_virtual (the log start: retention moves it),
 * next_offset, virtual_end (the committed end), active_base_offset,
 * active_base_virtual (the segment being written), commit_ns.
 *
 * The writer writes commit g+1 into slot (g+1) & 1, then release-stores
 * generation = g+1: the commit point.  A reader loads generation g1
 * (acquire), copies slot g1 & 1, loads generation g2: the copy is whole if
 * g2 <= g1 + 1 (the writer overwrites slot g1 & 1 only for commit g1 + 2).
 * A writer killed at any instant leaves the last commit readable: readers
 * never wait for it.  Records are in the files (pwrite returned) before
 * their commit, so a record is visible once committed and not before.
 *
 * A cursor segment (POSIX shm, 0600, native-endian), one per channel and
 * partition:
 *
 *        0     8  magic          "nsqshmCU" read as a little-endian u64
 *        8     4  version
 *       12     4  window_bits    bits of the finished-set window (x 64)
 *       16     8  created_ns
 *       24     8  recoveries     locks taken over from a dead holder
 *       32     4  retry_slots    slots of the retry table (0: a segment without one)
 *       36     4  retry_used     slots taken (live or stale)
 *       40     8  retry_dropped  notes the full table could not take
 *       64    64  lock           robust process-shared pthread mutex
 *      128     8  confirmed      every msg offset below it is finished
 *      136     8  finished       offsets finished above confirmed (count)
 *      144     8  j_from         redo journal of an advance / reset
 *      152     8  j_to
 *      160     8  j_reset        1 while a reset clears the window
 *      168     8  read_pos       the broker's reader: msg offsets below it were
 *                                pushed to the channel (0 / below confirmed:
 *                                read from confirmed, skipping finished ones)
 *      176     8  seeks          seeks to a new offset (set(hold=True)), counted under
 *                                the lock: a local consumer drops what it took before
 *                                one, and its FINs of those mark nothing (0 in old
 *                                segments)
 *      184     8  delivered      one past the highest msg offset put in flight to a
 *                                client (raised by InFlight.deliver, reset by a set):
 *                                a new leader gives what is below it, unfinished and
 *                                not in the retry table, the attempts of one delivery
 *      192     8  confirmed_total, finish_total: counters
 *      208     8  direct_total   messages local consumers took straight from the log
 *                                (nsqshm.local, no broker worker in between): the
 *                                channel's message_count adds them (0 in old segments)
 *      216     8  retry_hashed   1: the retry table's entries sit at hashed homes
 *                                (below); 0 in a segment of an older build, whose
 *                                homes were msg offset & (slots - 1): the first
 *                                attach of this build puts them at their new homes
 *      256   w/8  window         bit (o % window_bits) = msg offset o in
 *                                [confirmed, confirmed + window_bits) finished
 *  256+w/8  24 x s  retry table  open addressing by msg offset, linear probing from
 *                     the home ((offset * 0x9E3779B97F4A7C15) >> 32) & (slots - 1):
 *                     consecutive offsets (a REQ storm's) land apart, where
 *                     offset & (slots - 1) made one run every miss walked
 *
 *                     0  8  key       msg offset + 1 (0: an empty slot)
 *                     8  4  attempts  deliveries so far (the record's attempts)
 *                    12  4  (zero)
 *                    16  8  due_ms    unix ms it is deferred until (0: not deferred)
 *
 * The retry table holds what a channel knows of messages handed out and put back
 * (REQ, timeout, a dead worker's): their attempts and, for a REQ with a delay, when
 * they are due.  A partition's leader sends it to its followers with the cursor, so
 * that a new leader delivers them with their attempts and when they are due.  An
 * entry whose offset is finished is stale: skipped when read, dropped when the table
 * is compacted (at three quarters full), never removed otherwise.
 *
 * An advance from confirmed c to c' (the run of finished offsets starting at
 * c) writes j_from = c, j_to = c', stores confirmed = c' (release), clears
 * the bits of [c, c'), then zeroes j_to.  A process that takes the lock from
 * a dead holder (EOWNERDEAD) clears [j_from, j_to) again when confirmed ==
 * j_to != 0, and the whole window when j_reset: a bit is never left set for
 * an offset that wraps into the window unfinished.
 */
#ifndef NSQSHM_COMMITLOG_LAYOUT_H
#define NSQSHM_COMMITLOG_LAYOUT_H

#include <pthread.h>
#include <stdint.h>
#include <stddef.h>
#include <string.h>

#include "byteorder.h"

#define NSQSHM_LOG_MAGIC 0x534c6d687371736eULL      /* "nsqshmLS" */
#define NSQSHM_CURSOR_MAGIC 0x55436d687371736eULL   /* "nsqshmCU" */
#define NSQSHM_LOG_VERSION 1u
#define NSQSHM_CURSOR_VERSION 1u
#define NSQSHM_LOG_STATE_SIZE 4096u
#define NSQSHM_LOG_RECORD_HEADER 16u   /* size, crc, msg offset */
#define NSQSHM_LOG_INDEX_HEADER 32u
#define NSQSHM_LOG_INDEX_ENTRY 8u
#define NSQSHM_LOG_TIME_ENTRY 12u
#define NSQSHM_CURSOR_HEADER 256u

typedef struct {
    uint64_t start_offset;
    uint64_t start_virtual;
    uint64_t next_offset;
    uint64_t virtual_end;
    uint64_t active_base_offset;
    uint64_t active_base_virtual;
    uint64_t commit_ns;
    uint64_t _pad;
} nsqshm_log_commit;

typedef struct {
    uint64_t magic;
    uint32_t version;
    uint32_t index_interval;
    uint64_t segment_bytes;
    uint32_t writer_pid;
    uint32_t _res0;
    uint64_t generation;
    uint64_t _pad0[3];
    nsqshm_log_commit slot[2];
    uint64_t synced_offset;
} nsqshm_log_state;

_Static_assert(sizeof(nsqshm_log_commit) == 64, "layout");
_Static_assert(offsetof(nsqshm_log_state, slot) == 64, "layout");
_Static_assert(offsetof(nsqshm_log_state, synced_offset) == 192, "layout");

typedef union {
    pthread_mutex_t mutex;
    uint8_t _line[64];
} nsqshm_cursor_lock;

typedef struct {
    uint64_t magic;
    uint32_t version;
    uint32_t window_bits;
    uint64_t created_ns;
    uint64_t recoveries;
    uint32_t retry_slots;
    uint32_t retry_used;
    uint64_t retry_dropped;
    uint64_t _pad0[2];
    nsqshm_cursor_lock lock;
    uint64_t confirmed;
    uint64_t finished;
    uint64_t j_from;
    uint64_t j_to;
    uint64_t j_reset;
    uint64_t read_pos;
    uint64_t seeks;
    uint64_t delivered;
    uint64_t confirmed_total;
    uint64_t finish_total;
    uint64_t direct_total;
    uint64_t retry_hashed;
    uint64_t _pad3[4];
    uint64_t window[];
} nsqshm_cursor_header;

typedef struct {
    uint64_t key;
    uint32_t attempts;
    uint32_t _pad;
    int64_t due_ms;
} nsqshm_retry_slot;

_Static_assert(sizeof(nsqshm_retry_slot) == 24, "layout");
_Static_assert(offsetof(nsqshm_cursor_header, retry_slots) == 32, "layout");
_Static_assert(offsetof(nsqshm_cursor_header, lock) == 64, "layout");
_Static_assert(offsetof(nsqshm_cursor_header, confirmed) == 128, "layout");
_Static_assert(offsetof(nsqshm_cursor_header, read_pos) == 168, "layout");
_Static_assert(offsetof(nsqshm_cursor_header, seeks) == 176, "layout");
_Static_assert(offsetof(nsqshm_cursor_header, delivered) == 184, "layout");
_Static_assert(offsetof(nsqshm_cursor_header, confirmed_total) == 192, "layout");
_Static_assert(offsetof(nsqshm_cursor_header, direct_total) == 208, "layout");
_Static_assert(offsetof(nsqshm_cursor_header, retry_hashed) == 216, "layout");
_Static_assert(offsetof(nsqshm_cursor_header, window) == NSQSHM_CURSOR_HEADER, "layout");

/* Commit publication (see the state block above). */
static inline void nsqshm_log_publish(nsqshm_log_state *s, const nsqshm_log_commit *c) {
    uint64_t g = __atomic_load_n(&s->generation, __ATOMIC_RELAXED) + 1;
    memcpy(&s->slot[g & 1], c, sizeof(*c));
    __atomic_store_n(&s->generation, g, __ATOMIC_RELEASE);
}

/* 0 when *out is a whole commit; -1 when the writer outran the copy (retry). */
static inline int nsqshm_log_read_commit(const nsqshm_log_state *s, nsqshm_log_commit *out) {
    uint64_t g1 = __atomic_load_n(&s->generation, __ATOMIC_ACQUIRE);
    memcpy(out, &s->slot[g1 & 1], sizeof(*out));
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    uint64_t g2 = __atomic_load_n(&s->generation, __ATOMIC_RELAXED);
    return g2 <= g1 + 1 ? 0 : -1;
}

/* CRC-32C.  With SSE4.2 (checked once at run time) the crc32 instruction
 * 8 bytes at a time, else a slicing-by-8 table. */
static uint32_t nsqshm_crc32c_table[8][256];
static int nsqshm_crc32c_mode = 0;   /* 0 unknown, 1 table, 2 sse4.2 */

#if defined(__x86_64__)
static void nsqshm_crc32c_shift_init(void);
#endif

static void nsqshm_crc32c_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        nsqshm_crc32c_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            nsqshm_crc32c_table[t][i] = (nsqshm_crc32c_table[t - 1][i] >> 8) ^
                nsqshm_crc32c_table[0][nsqshm_crc32c_table[t - 1][i] & 0xFF];
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2")) {
        nsqshm_crc32c_shift_init();
        nsqshm_crc32c_mode = 2;
    } else {
        nsqshm_crc32c_mode = 1;
    }
#else
    nsqshm_crc32c_mode = 1;
#endif
}

static uint32_t nsqshm_crc32c_sw(uint32_t crc, const uint8_t *p, size_t n) {
    crc = ~crc;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);   /* little-endian hosts: slicing-by-8 as zlib */
        w ^= crc;
        crc = nsqshm_crc32c_table[7][w & 0xFF] ^ nsqshm_crc32c_table[6][(w >> 8) & 0xFF] ^
              nsqshm_crc32c_table[5][(w >> 16) & 0xFF] ^ nsqshm_crc32c_table[4][(w >> 24) & 0xFF] ^
              nsqshm_crc32c_table[3][(w >> 32) & 0xFF] ^ nsqshm_crc32c_table[2][(w >> 40) & 0xFF] ^
              nsqshm_crc32c_table[1][(w >> 48) & 0xFF] ^ nsqshm_crc32c_table[0][w >> 56];
        p += 8;
        n -= 8;
    }
    while (n--)
        crc = (crc >> 8) ^ nsqshm_crc32c_table[0][(crc ^ *p++) & 0xFF];
    return ~crc;
}

#if defined(__x86_64__)
/* The crc32 instruction has a latency of 3 cycles and a throughput of one a
 * cycle, so three independent streams run three times as fast as one.  A
 * round takes 3 blocks of NSQSHM_CRC_BLOCK bytes, A B C, and joins them by
 * linearity: crc(r, A B C) = shift2(crc(r, A)) ^ shift1(crc(0, B)) ^ crc(0, C),
 * where shiftN(r) is r fed N blocks of zero bytes: a GF(2)-linear map, applied
 * as four byte-indexed tables made at start with the instruction itself. */
#define NSQSHM_CRC_BLOCK 64
static uint32_t nsqshm_crc32c_shift[2][4][256];

__attribute__((target("sse4.2")))
static uint32_t nsqshm_crc32c_raw(uint32_t r, const uint8_t *p, size_t n) {
    uint64_t c = r;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = __builtin_ia32_crc32di(c, w);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (n--)
        c32 = __builtin_ia32_crc32qi(c32, *p++);
    return c32;
}

static void nsqshm_crc32c_shift_init(void) {
    static const uint8_t zeros[2 * NSQSHM_CRC_BLOCK];
    for (int s = 0; s < 2; s++)
        for (int k = 0; k < 4; k++)
            for (uint32_t b = 0; b < 256; b++)
                nsqshm_crc32c_shift[s][k][b] =
                    nsqshm_crc32c_raw(b << (8 * k), zeros, (size_t)(s + 1) * NSQSHM_CRC_BLOCK);
}

static inline uint32_t nsqshm_crc32c_apply(int s, uint32_t r) {
    return nsqshm_crc32c_shift[s][0][r & 0xFF] ^ nsqshm_crc32c_shift[s][1][(r >> 8) & 0xFF] ^
           nsqshm_crc32c_shift[s][2][(r >> 16) & 0xFF] ^ nsqshm_crc32c_shift[s][3][r >> 24];
}

__attribute__((target("sse4.2")))
static uint32_t nsqshm_crc32c_hw(uint32_t crc, const uint8_t *p, size_t n) {
    uint32_t r = ~crc;
    while (n >= 3 * NSQSHM_CRC_BLOCK) {
        uint64_t a = r, b = 0, c = 0, w;
        for (int i = 0; i < NSQSHM_CRC_BLOCK; i += 8) {
            memcpy(&w, p + i, 8);
            a = __builtin_ia32_crc32di(a, w);
            memcpy(&w, p + NSQSHM_CRC_BLOCK + i, 8);
            b = __builtin_ia32_crc32di(b, w);
            memcpy(&w, p + 2 * NSQSHM_CRC_BLOCK + i, 8);
            c = __builtin_ia32_crc32di(c, w);
        }
        r = nsqshm_crc32c_apply(1, (uint32_t)a) ^ nsqshm_crc32c_apply(0, (uint32_t)b) ^
            (uint32_t)c;
        p += 3 * NSQSHM_CRC_BLOCK;
        n -= 3 * NSQSHM_CRC_BLOCK;
    }
    return ~nsqshm_crc32c_raw(r, p, n);
}
#endif

static inline uint32_t nsqshm_crc32c(uint32_t crc, const void *p, size_t n) {
    if (nsqshm_crc32c_mode == 0)
        nsqshm_crc32c_init();
#if defined(__x86_64__)
    if (nsqshm_crc32c_mode == 2)
        return nsqshm_crc32c_hw(crc, (const uint8_t *)p, n);
#endif
    return nsqshm_crc32c_sw(crc, (const uint8_t *)p, n);
}

static inline uint32_t nsqshm_crc32c_software(uint32_t crc, const void *p, size_t n) {
    if (nsqshm_crc32c_mode == 0)
        nsqshm_crc32c_init();
    return nsqshm_crc32c_sw(crc, (const uint8_t *)p, n);
}

#endif
