/* Turning a received packet into its reply in place (for XDP_TX): swap addresses, write BTH and
 * the reply's headers (ACK/NAK: AETH; atomic ACK: AETH + AtomicAckETH; CNP: 16 reserved
 * bytes), fix lengths and checksums, compute the ICRC. The caller sizes the frame first. */
#ifndef __NIC_REPLY_H
#define __NIC_REPLY_H

#include "nic_csum.h"
#include "nic_icrc.h"
#include "nic_parse.h"

#define REPLY_ACK 1          /* ACKNOWLEDGE: AETH */
#define REPLY_ATOMIC_ACK 2   /* ATOMIC_ACKNOWLEDGE: AETH + AtomicAckETH */
#define REPLY_CNP 3          /* CNP: 16 reserved bytes */
#define REPLY_SACK 4         /* MR_SACK: AETH + SACKETH */
#define REPLY_MR_ATOMIC_ACK 5    /* MR_ATOMIC_ACKNOWLEDGE: PETH + AETH + AtomicAckETH */

/* What a MetaRoCE reply carries beyond PSN, syndrome and MSN. */
struct reply_ext {
    __u8 path;        /* PathID of the triggering packet */
    __u8 flags;       /* SACKETH flags */
    __u16 pad;
    __u32 ts;         /* the triggering packet's PETH timestamp (echoed) */
    __u32 ce_count;
    __u32 ssn;        /* MR_ATOMIC_ACKNOWLEDGE: the request's SSN */
    __u32 limit;      /* SACK with flag C: the Credit Limit PSN (CC-8) */
    __u32 pad2;
    __u64 bm_hi;      /* SACK bitmap, wire order */
    __u64 bm_lo;
};

/* Bytes after the BTH of each reply kind, and the UDP length of the reply. */
#define REPLY_TAIL(kind) ((kind) == REPLY_ACK ? AETH_LEN : \
                          (kind) == REPLY_ATOMIC_ACK ? AETH_LEN + ATOMICACKETH_LEN : \
                          (kind) == REPLY_SACK ? AETH_LEN + SACKETH_LEN : \
                          (kind) == REPLY_MR_ATOMIC_ACK ? PETH_LEN + AETH_LEN + ATOMICACKETH_LEN : \
                          CNP_PAD_LEN)
#define REPLY_L4(kind) (8 + BTH_LEN + REPLY_TAIL(kind) + ICRC_LEN)
#define REPLY_LEN(ipv6, kind) (sizeof(struct ethhdr) + ((ipv6) ? 40 : 20) + REPLY_L4(kind))
/* The longest reply (an IPv6 MR_SACK, 114 bytes): a reply is built in the frame's linear part,
 * so a multi-buffer frame whose linear part is shorter is refused before it changes anything. */
#define REPLY_MAX_LEN REPLY_LEN(1, REPLY_SACK)

/* Sum of n 16-bit big-endian words at p (n constant). */
static __always_inline __u32 sum16(const __u8 *p, int n)
{
    __u32 s = 0;
#pragma unroll
    for (int i = 0; i < n; i++)
        s += ((__u32)p[2 * i] << 8) | p[2 * i + 1];
    return s;
}

static __always_inline void swap_bytes(__u8 *a, __u8 *b, int n)
{
#pragma unroll
    for (int i = 0; i < n; i++) {
        __u8 t = a[i];
        a[i] = b[i];
        b[i] = t;
    }
}

/* Rewrite the frame at data into a reply of `kind` (a constant per call site, like ipv6, so every
 * offset is fixed) for dqpn: PSN, AETH syndrome and MSN, and for an atomic ACK the original
 * value. Fills the ICRC using T and s, and the UDP checksum over IPv6 or when csum is set (the
 * QP negotiated CSUM, INT-2); returns the new frame length, 0 if the frame is short. */
static __always_inline __u32 build_reply(void *data, void *data_end, int ipv6, int kind,
                                         __u32 dqpn, __u32 psn, __u8 syndrome, __u32 msn,
                                         __u64 orig, const struct reply_ext *x,
                                         const struct crc_tables *T, struct icrc_scratch *s,
                                         int csum)
{
    const __u32 hlen = ipv6 ? 40 : 20, L4 = REPLY_L4(kind);
    const __u32 l3 = sizeof(struct ethhdr), l4 = l3 + hlen, bth = l4 + 8;
    const __u32 aeth = bth + BTH_LEN + (kind == REPLY_MR_ATOMIC_ACK ? PETH_LEN : 0);
    const __u32 icrc = bth + BTH_LEN + REPLY_TAIL(kind), total = icrc + ICRC_LEN;
    __u8 *p = data;
    if ((void *)(p + total) > data_end)
        return 0;
    swap_bytes(p, p + 6, 6);
    if (ipv6) {
        swap_bytes(p + l3 + 8, p + l3 + 24, 16);
        p[l3 + 4] = 0;
        p[l3 + 5] = L4;                   /* payload length */
        p[l3 + 7] = ACK_TTL;                  /* hop limit */
        if (kind == REPLY_CNP) {              /* traffic class CNP_TOS */
            p[l3] = 0x60 | (CNP_TOS >> 4);
            p[l3 + 1] = (p[l3 + 1] & 0x0f) | ((CNP_TOS & 0x0f) << 4);
        } else {
            p[l3 + 1] = (p[l3 + 1] & ~0x30) | 0x20;   /* ECN: ECT(0), never an echoed CE */
        }
    } else {
        swap_bytes(p + l3 + 12, p + l3 + 16, 4);
        if (kind == REPLY_CNP)
            p[l3 + 1] = CNP_TOS;
        else
            p[l3 + 1] = (p[l3 + 1] & ~0x03) | 0x02;   /* ECN: ECT(0), never an echoed CE */
        p[l3 + 2] = 0;
        p[l3 + 3] = 20 + L4;              /* total length */
        p[l3 + 4] = p[l3 + 5] = 0;            /* identification */
        p[l3 + 6] = 0x40;                     /* DF */
        p[l3 + 7] = 0;
        p[l3 + 8] = ACK_TTL;
        p[l3 + 10] = p[l3 + 11] = 0;
        __u16 c = csum_fold(sum16(p + l3, 10));
        p[l3 + 10] = c >> 8;
        p[l3 + 11] = c & 0xff;
    }
    /* UDP: keep the requester's source port as this flow's entropy, reply to 4791 */
    p[l4 + 2] = ROCE_UDP_PORT >> 8;
    p[l4 + 3] = ROCE_UDP_PORT & 0xff;
    p[l4 + 4] = 0;
    p[l4 + 5] = L4;
    p[l4 + 6] = p[l4 + 7] = 0;
    /* BTH: opcode, no SE/M/pad, TVer 0; P_Key kept (a CNP's is 0xFFFF); DestQP; AckReq 0 */
    p[bth] = kind == REPLY_ACK ? RC_ACKNOWLEDGE
           : kind == REPLY_ATOMIC_ACK ? RC_ATOMIC_ACKNOWLEDGE
           : kind == REPLY_SACK ? MR_SACK
           : kind == REPLY_MR_ATOMIC_ACK ? MR_ATOMIC_ACKNOWLEDGE : CNP_OPCODE;
    p[bth + 1] = 0;
    p[bth + 4] = kind == REPLY_CNP ? 0x40 : 0;    /* BECN in a CNP */
    if (kind == REPLY_CNP)
        p[bth + 2] = p[bth + 3] = 0xff;
    if (kind == REPLY_CNP)
        psn = 0;
    p[bth + 5] = dqpn >> 16;
    p[bth + 6] = dqpn >> 8;
    p[bth + 7] = dqpn;
    p[bth + 8] = 0;
    p[bth + 9] = psn >> 16;
    p[bth + 10] = psn >> 8;
    p[bth + 11] = psn;
    if (kind == REPLY_CNP) {
#pragma unroll
        for (int i = 0; i < CNP_PAD_LEN; i++)
            p[bth + BTH_LEN + i] = 0;
    } else {
        p[aeth] = syndrome;
        p[aeth + 1] = msn >> 16;
        p[aeth + 2] = msn >> 8;
        p[aeth + 3] = msn;
    }
    if (kind == REPLY_ATOMIC_ACK || kind == REPLY_MR_ATOMIC_ACK) {
#pragma unroll
        for (int i = 0; i < 8; i++)
            p[aeth + AETH_LEN + i] = orig >> (56 - 8 * i);
    }
    if (kind == REPLY_MR_ATOMIC_ACK) {         /* PETH: path, SSN echoed, timestamp echoed */
        __u8 *q = p + bth + BTH_LEN;
#pragma unroll
        for (int i = 0; i < PETH_LEN; i++)
            q[i] = 0;
        q[0] = x->path;
        q[5] = x->ssn >> 16;
        q[6] = x->ssn >> 8;
        q[7] = x->ssn;
        q[16] = x->ts >> 24;
        q[17] = x->ts >> 16;
        q[18] = x->ts >> 8;
        q[19] = x->ts;
    }
    if (kind == REPLY_SACK) {                  /* SACKETH after the AETH */
        __u8 *q = p + aeth + AETH_LEN;
        q[0] = x->path;
        q[1] = x->flags;
        q[2] = q[3] = 0;
        q[4] = 0;                              /* Credit Limit PSN (valid with flag C) */
        q[5] = x->limit >> 16;
        q[6] = x->limit >> 8;
        q[7] = x->limit;
        q[8] = x->ts >> 24;
        q[9] = x->ts >> 16;
        q[10] = x->ts >> 8;
        q[11] = x->ts;
        q[12] = x->ce_count >> 24;
        q[13] = x->ce_count >> 16;
        q[14] = x->ce_count >> 8;
        q[15] = x->ce_count;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            q[16 + i] = x->bm_hi >> (56 - 8 * i);
            q[24 + i] = x->bm_lo >> (56 - 8 * i);
        }
    }
    /* ICRC over 8 x 0xFF and the masked headers */
    __builtin_memset(s->b, 0xff, 8);
#pragma unroll
    for (int i = 0; i < (int)(icrc - l3); i++)
        s->b[8 + i] = p[l3 + i];
    __u8 *h = s->b + 8;
    if (ipv6) {
        h[0] |= 0x0f;
        h[1] = h[2] = h[3] = 0xff;
        h[7] = 0xff;
    } else {
        h[1] = 0xff;
        h[8] = 0xff;
        h[10] = h[11] = 0xff;
    }
    h[hlen + 6] = h[hlen + 7] = 0xff;
    h[hlen + 8 + 4] = 0xff;
    __u32 crc = ~crc_tail(0xffffffff, s->b, 8 + icrc - l3, T);
    p[icrc] = crc;
    p[icrc + 1] = crc >> 8;
    p[icrc + 2] = crc >> 16;
    p[icrc + 3] = crc >> 24;
    if (ipv6 || csum) {    /* IPv6 requires the UDP checksum; a CSUM QP's peer checks it */
        __u32 sum = (ipv6 ? sum16(p + l3 + 8, 16) : sum16(p + l3 + 12, 4)) + L4 + IPPROTO_UDP +
                    sum16(p + l4, L4 / 2);
        __u16 c = csum_fold(sum);
        if (c == 0)
            c = 0xffff;
        p[l4 + 6] = c >> 8;
        p[l4 + 7] = c & 0xff;
    }
    return total;
}

#endif
