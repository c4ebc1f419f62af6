/* The RoCEv2 ICRC in XDP: CRC-32 (the Ethernet polynomial, reflected) over 8 bytes of 0xFF,
 * the IP/UDP/BTH headers with their variant fields masked to ones, and everything after the BTH
 * up to the ICRC. Slice-by-8 with tables in a map (BCC cannot load a global const table). */
#ifndef __NIC_ICRC_H
#define __NIC_ICRC_H

#include "nic_structs.h"

#define ICRC_CHUNK 256
#define ICRC_MAX_CHUNKS ((MAX_PAYLOAD + 64 + ICRC_CHUNK - 1) / ICRC_CHUNK)

struct crc_tables {
    __u32 t[8][256];
};

struct icrc_scratch {
    __u8 b[ICRC_CHUNK];
};

static __always_inline __u32 crc_word(__u32 crc, const __u8 *p, const struct crc_tables *T)
{
    __u32 lo = crc ^ (p[0] | (p[1] << 8) | (p[2] << 16) | ((__u32)p[3] << 24));
    __u32 hi = p[4] | (p[5] << 8) | (p[6] << 16) | ((__u32)p[7] << 24);
    return T->t[7][lo & 0xff] ^ T->t[6][(lo >> 8) & 0xff] ^ T->t[5][(lo >> 16) & 0xff] ^
           T->t[4][lo >> 24] ^ T->t[3][hi & 0xff] ^ T->t[2][(hi >> 8) & 0xff] ^
           T->t[1][(hi >> 16) & 0xff] ^ T->t[0][hi >> 24];
}

/* crc over a whole ICRC_CHUNK of buf: a fixed trip count, so the verifier walks it once. */
static __always_inline __u32 crc_chunk(__u32 crc, const __u8 *buf, const struct crc_tables *T)
{
#pragma clang loop unroll(disable)
    for (__u32 k = 0; k < ICRC_CHUNK / 8; k++) {
        __u32 off = k * 8;
        asm volatile("" : "+r"(off));   /* keep clang from turning this into a pointer walk */
        off &= ICRC_CHUNK - 8;
        crc = crc_word(crc, buf + off, T);
    }
    return crc;
}

/* crc over len (< ICRC_CHUNK) bytes of buf. Fixed trip counts and no early exit: the two arms
 * of each `if` leave the verifier with equivalent states (only crc differs, and it is unknown
 * anyway), so it prunes instead of following every possible length. */
static __always_inline __u32 crc_tail(__u32 crc, const __u8 *buf, __u32 len,
                                      const struct crc_tables *T)
{
    __u32 words = len / 8;
#pragma clang loop unroll(disable)
    for (__u32 k = 0; k < ICRC_CHUNK / 8; k++) {
        __u32 off = k * 8;
        asm volatile("" : "+r"(off));
        if (off / 8 < words) {
            off &= ICRC_CHUNK - 8;
            crc = crc_word(crc, buf + off, T);
        }
    }
    __u32 i = words * 8;
#pragma clang loop unroll(disable)
    for (__u32 t = 0; t < 8; t++) {
        __u32 j = i + t;
        asm volatile("" : "+r"(j));
        if (j < len)
            crc = T->t[0][(crc ^ buf[j & (ICRC_CHUNK - 1)]) & 0xff] ^ (crc >> 8);
    }
    return crc;
}

#endif
