/* Big-endian integers in NSQ's message encoding and the commit log's
 * records (the timestamp, sizes, offsets), read and written without
 * alignment assumptions: one copy of these for every extension. */
#ifndef NSQSHM_BYTEORDER_H
#define NSQSHM_BYTEORDER_H

#include <stdint.h>
#include <string.h>

static inline uint16_t nsqshm_be16(const void *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return __builtin_bswap16(v);
}
static inline uint32_t nsqshm_be32(const void *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return __builtin_bswap32(v);
}
static inline uint64_t nsqshm_be64(const void *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return __builtin_bswap64(v);
}
static inline void nsqshm_put_be32(void *p, uint32_t v) {
    v = __builtin_bswap32(v);
    memcpy(p, &v, 4);
}
static inline void nsqshm_put_be64(void *p, uint64_t v) {
    v = __builtin_bswap64(v);
    memcpy(p, &v, 8);
}

#endif
