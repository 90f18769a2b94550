/* Snappy blocks and CRC-32C, as github.com/golang/snappy writes and reads them.
 *
 * A block (the snappy format; all multi-byte values little-endian):
 *
 *   uvarint decoded length, then elements, each starting with a tag byte
 *   whose low two bits say what it is:
 *     00 literal   length-1 in the upper six bits when < 60; 60..63 mean
 *                  the length-1 follows in 1..4 bytes; then the bytes
 *     01 copy      length 4..11 in bits 2-4, offset bits 8-10 in bits 5-7,
 *                  then one byte of offset (offsets < 2048)
 *     10 copy      length-1 in the upper six bits, then a 2-byte offset
 *     11 copy      length-1 in the upper six bits, then a 4-byte offset
 *
 * snappy_encode_block is golang/snappy's encodeBlock (a 16K-entry hash table
 * of 4-byte sequences, skipping faster through incompressible input), for
 * blocks of at most 65536 bytes, as the framing format cuts them.
 * snappy_decode_block accepts any valid block of any encoder.
 *
 * CRC-32C (Castagnoli), used masked by the framing format, runs on the
 * SSE4.2 crc32 instruction when the CPU has it, else slice-by-8 tables.
 */

#ifndef NSQSHM_SNAPPY_CODEC_H
#define NSQSHM_SNAPPY_CODEC_H

#include <stdint.h>
#include <string.h>

#define SNAPPY_MAX_BLOCK 65536
/* golang/snappy MaxEncodedLen(65536): 32 + n + n/6 */
#define SNAPPY_MAX_ENCODED_BLOCK (32 + SNAPPY_MAX_BLOCK + SNAPPY_MAX_BLOCK / 6)

static inline uint32_t snappy_load32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static inline uint64_t snappy_load64(const uint8_t *p) {
    return (uint64_t)snappy_load32(p) | ((uint64_t)snappy_load32(p + 4) << 32);
}

static inline uint32_t snappy_hash(uint32_t u, uint32_t shift) {
    return (u * 0x1e35a7bdu) >> shift;
}

/* -- encoding ------------------------------------------------------------------ */

static inline size_t snappy_put_uvarint(uint8_t *dst, uint64_t v) {
    size_t i = 0;
    while (v >= 0x80) {
        dst[i++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    dst[i++] = (uint8_t)v;
    return i;
}

static size_t snappy_emit_literal(uint8_t *dst, const uint8_t *lit, size_t len) {
    size_t i = 0, n = len - 1;
    if (n < 60) {
        dst[0] = (uint8_t)(n << 2);
        i = 1;
    } else if (n < (1u << 8)) {
        dst[0] = 60 << 2;
        dst[1] = (uint8_t)n;
        i = 2;
    } else {  /* blocks are at most 65536 bytes: two bytes of length suffice */
        dst[0] = 61 << 2;
        dst[1] = (uint8_t)n;
        dst[2] = (uint8_t)(n >> 8);
        i = 3;
    }
    memcpy(dst + i, lit, len);
    return i + len;
}

static size_t snappy_emit_copy(uint8_t *dst, size_t offset, size_t length) {
    size_t i = 0;
    /* the copy-2 form holds at most 64 bytes: emit 64s, leaving at least 4 */
    while (length >= 68) {
        dst[i] = (63 << 2) | 2;
        dst[i + 1] = (uint8_t)offset;
        dst[i + 2] = (uint8_t)(offset >> 8);
        i += 3;
        length -= 64;
    }
    if (length > 64) {
        dst[i] = (59 << 2) | 2;
        dst[i + 1] = (uint8_t)offset;
        dst[i + 2] = (uint8_t)(offset >> 8);
        i += 3;
        length -= 60;
    }
    if (length >= 12 || offset >= 2048) {
        dst[i] = (uint8_t)(((length - 1) << 2) | 2);
        dst[i + 1] = (uint8_t)offset;
        dst[i + 2] = (uint8_t)(offset >> 8);
        return i + 3;
    }
    dst[i] = (uint8_t)(((offset >> 8) << 5) | ((length - 4) << 2) | 1);
    dst[i + 1] = (uint8_t)offset;
    return i + 2;
}

/* Encode src (len <= SNAPPY_MAX_BLOCK) into dst, which has room for
 * SNAPPY_MAX_ENCODED_BLOCK bytes; returns the encoded length. */
static size_t snappy_encode_block(uint8_t *dst, const uint8_t *src, size_t len) {
    enum { INPUT_MARGIN = 16 - 1, MIN_NON_LITERAL = 1 + 1 + INPUT_MARGIN, MAX_TABLE = 1 << 14 };
    uint16_t table[MAX_TABLE];
    size_t d = snappy_put_uvarint(dst, len);
    size_t table_size = 1 << 8, s, next_emit, s_limit, candidate, next_s, base, i;
    uint32_t shift = 32 - 8, next_hash, table_mask, skip, step, prev_hash, curr_hash;
    uint64_t x;

    if (len == 0)
        return d;
    if (len < MIN_NON_LITERAL)
        return d + snappy_emit_literal(dst + d, src, len);
    while (table_size < MAX_TABLE && table_size < len) {
        table_size <<= 1;
        shift--;
    }
    table_mask = (uint32_t)table_size - 1;
    memset(table, 0, table_size * sizeof(uint16_t));
    s_limit = len - INPUT_MARGIN;
    next_emit = 0;
    s = 1;
    next_hash = snappy_hash(snappy_load32(src + s), shift);
    for (;;) {
        skip = 32;
        next_s = s;
        for (;;) {
            s = next_s;
            step = skip >> 5;
            next_s = s + step;
            skip += step;
            if (next_s > s_limit)
                goto remainder;
            candidate = table[next_hash & table_mask];
            table[next_hash & table_mask] = (uint16_t)s;
            next_hash = snappy_hash(snappy_load32(src + next_s), shift);
            if (snappy_load32(src + s) == snappy_load32(src + candidate))
                break;
        }
        d += snappy_emit_literal(dst + d, src + next_emit, s - next_emit);
        for (;;) {
            base = s;
            s += 4;
            i = candidate + 4;
            /* extend the match 8 bytes at a time: the first differing byte
             * is the lowest set byte of the XOR (little-endian loads) */
            while (s + 8 <= len) {
                uint64_t diff = snappy_load64(src + i) ^ snappy_load64(src + s);
                if (diff) {
                    s += (size_t)__builtin_ctzll(diff) >> 3;
                    goto extended;
                }
                i += 8;
                s += 8;
            }
            for (; s < len && src[i] == src[s]; i++, s++)
                ;
extended:
            d += snappy_emit_copy(dst + d, base - candidate, s - base);
            next_emit = s;
            if (s >= s_limit)
                goto remainder;
            x = snappy_load64(src + s - 1);
            prev_hash = snappy_hash((uint32_t)x, shift);
            table[prev_hash & table_mask] = (uint16_t)(s - 1);
            curr_hash = snappy_hash((uint32_t)(x >> 8), shift);
            candidate = table[curr_hash & table_mask];
            table[curr_hash & table_mask] = (uint16_t)s;
            if ((uint32_t)(x >> 8) != snappy_load32(src + candidate)) {
                next_hash = snappy_hash((uint32_t)(x >> 16), shift);
                s++;
                break;
            }
        }
    }
remainder:
    if (next_emit < len)
        d += snappy_emit_literal(dst + d, src + next_emit, len - next_emit);
    return d;
}

/* -- decoding ------------------------------------------------------------------ */

/* The decoded length a block declares, or -1 if its header is corrupt;
 * *header gets the header's size. */
static int64_t snappy_decoded_len(const uint8_t *src, size_t len, size_t *header) {
    uint64_t v = 0;
    size_t i;
    for (i = 0; i < len && i < 10; i++) {
        v |= (uint64_t)(src[i] & 0x7f) << (7 * i);
        if (src[i] < 0x80) {
            if (i == 9 && src[i] > 1)
                return -1;
            if (v > 0xffffffffu)
                return -1;
            *header = i + 1;
            return (int64_t)v;
        }
    }
    return -1;
}

/* Decode the elements of a block (after its header) into dst of exactly
 * dlen bytes: 0, or -1 if the block is corrupt. */
static int snappy_decode_block(uint8_t *dst, size_t dlen, const uint8_t *src, size_t len) {
    size_t s = 0, d = 0, length, offset, x;
    while (s < len) {
        switch (src[s] & 3) {
        case 0:
            x = src[s] >> 2;
            if (x < 60) {
                s += 1;
            } else {
                size_t extra = x - 59;  /* 1..4 bytes of length */
                if (s + 1 + extra > len)
                    return -1;
                x = 0;
                for (size_t k = 0; k < extra; k++)
                    x |= (size_t)src[s + 1 + k] << (8 * k);
                s += 1 + extra;
            }
            length = x + 1;
            if (length > dlen - d || length > len - s)
                return -1;
            memcpy(dst + d, src + s, length);
            d += length;
            s += length;
            continue;
        case 1:
            if (s + 2 > len)
                return -1;
            length = 4 + ((src[s] >> 2) & 7);
            offset = ((size_t)(src[s] & 0xe0) << 3) | src[s + 1];
            s += 2;
            break;
        case 2:
            if (s + 3 > len)
                return -1;
            length = 1 + (src[s] >> 2);
            offset = (size_t)src[s + 1] | ((size_t)src[s + 2] << 8);
            s += 3;
            break;
        default:
            if (s + 5 > len)
                return -1;
            length = 1 + (src[s] >> 2);
            offset = snappy_load32(src + s + 1);
            s += 5;
            break;
        }
        if (offset == 0 || d < offset || length > dlen - d)
            return -1;
        if (offset >= length) {
            memcpy(dst + d, dst + d - offset, length);
            d += length;
        } else {  /* overlapping: a run, byte by byte forward */
            for (size_t k = 0; k < length; k++, d++)
                dst[d] = dst[d - offset];
        }
    }
    return d == dlen ? 0 : -1;
}

/* -- CRC-32C ------------------------------------------------------------------- */

static uint32_t snappy_crc_table[8][256];
static int snappy_crc_hw = 0;

static void snappy_crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1)));
        snappy_crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            snappy_crc_table[t][i] = (snappy_crc_table[t - 1][i] >> 8)
                                     ^ snappy_crc_table[0][snappy_crc_table[t - 1][i] & 0xff];
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    snappy_crc_hw = __builtin_cpu_supports("sse4.2");
#endif
}

static uint32_t snappy_crc_sw(uint32_t crc, const uint8_t *p, size_t n) {
    crc = ~crc;
    while (n >= 8) {
        uint32_t one = snappy_load32(p) ^ crc, two = snappy_load32(p + 4);
        crc = snappy_crc_table[7][one & 0xff] ^ snappy_crc_table[6][(one >> 8) & 0xff]
            ^ snappy_crc_table[5][(one >> 16) & 0xff] ^ snappy_crc_table[4][one >> 24]
            ^ snappy_crc_table[3][two & 0xff] ^ snappy_crc_table[2][(two >> 8) & 0xff]
            ^ snappy_crc_table[1][(two >> 16) & 0xff] ^ snappy_crc_table[0][two >> 24];
        p += 8;
        n -= 8;
    }
    while (n--)
        crc = snappy_crc_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("sse4.2")))
static uint32_t snappy_crc_sse42(uint32_t crc, const uint8_t *p, size_t n) {
    uint64_t c = ~crc;
    while (n >= 8) {
        c = __builtin_ia32_crc32di(c, snappy_load64(p));
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (n--)
        c32 = __builtin_ia32_crc32qi(c32, *p++);
    return ~c32;
}
#endif

static inline uint32_t snappy_crc32c(uint32_t crc, const uint8_t *p, size_t n) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (snappy_crc_hw)
        return snappy_crc_sse42(crc, p, n);
#endif
    return snappy_crc_sw(crc, p, n);
}

/* The framing format's checksum of uncompressed data. */
static inline uint32_t snappy_masked_crc(const uint8_t *p, size_t n) {
    uint32_t c = snappy_crc32c(0, p, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

#endif
