/* A message's own time to live (issue 18: /pub?ttl=, /mpub?ttl=).  A message
 * published with one carries its deadline after its body, and says so with
 * the top bit of its attempts field:
 *
 *     0            8                10         26          26+n              34+n
 *     [ts, BE      ][attempts, BE    ][ID       ][body (n)  ][expires_at, BE   ]
 *                   ^ bit 15 set                             ns since the epoch
 *
 * Every other message is nsqd's encoding, unchanged: records written before
 * (ring, disk queue, arena) have the bit clear, since nsqshm counts attempts
 * up to 32767 at most before one reaches it only after 32768 deliveries.
 * The deadline and the bit stay with the message through the ring, disk
 * queue, in-flight table, REQ, timeouts and restarts; a client never sees
 * them (InFlight.deliver sends the message without them), nor does a
 * dead-letter topic (take_dead and the expired buffer strip them). */
#ifndef NSQSHM_MESSAGE_EXPIRY_H
#define NSQSHM_MESSAGE_EXPIRY_H

#include <stdint.h>
#include "byteorder.h"

#define NSQSHM_EXPIRY_BIT 0x80u       /* of byte 8, the attempts field's high byte */
#define NSQSHM_EXPIRY_SIZE 8
#define NSQSHM_EXPIRY_MSG_HEADER 26   /* timestamp 8, attempts 2, ID 16 */

static inline int nsqshm_has_expiry(const char *msg, uint32_t size) {
    return size >= NSQSHM_EXPIRY_MSG_HEADER + NSQSHM_EXPIRY_SIZE
        && (((const unsigned char *)msg)[8] & NSQSHM_EXPIRY_BIT);
}
static inline int64_t nsqshm_expires_at(const char *msg, uint32_t size) {
    return (int64_t)nsqshm_be64(msg + size - NSQSHM_EXPIRY_SIZE);
}
/* The message as nsqd encodes it: the bit cleared (its size is then 8 less). */
static inline void nsqshm_clear_expiry(char *msg) {
    ((unsigned char *)msg)[8] &= (unsigned char)~NSQSHM_EXPIRY_BIT;
}
/* The attempts count, without the bit. */
static inline uint32_t nsqshm_attempts(const char *msg) {
    const unsigned char *p = (const unsigned char *)msg + 8;
    return ((uint32_t)(p[0] & ~NSQSHM_EXPIRY_BIT) << 8) | p[1];
}

#endif
