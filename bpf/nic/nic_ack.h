/* Turning a received request into its ACK or NAK in place (for XDP_TX): swap addresses, write
 * BTH + AETH, fix lengths and checksums, compute the ICRC, trim the frame. */
#ifndef __NIC_ACK_H
#define __NIC_ACK_H

#include "nic_icrc.h"
#include "nic_parse.h"

#define ACK_L4 (8 + BTH_LEN + AETH_LEN + ICRC_LEN)   /* UDP length of an ACK */

static __always_inline __u16 csum_fold(__u32 sum)
{
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    return ~sum & 0xffff;
}

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

/* Rewrite the frame at data into an ACK/NAK of the given syndrome, PSN and MSN for dqpn.
 * HLEN is the IP header length (20 or 40): a constant per call site so every offset is fixed.
 * Fills the ICRC using T and s; returns the new frame length, or 0 if the frame is too short. */
static __always_inline __u32 build_ack(void *data, void *data_end, int ipv6, __u32 dqpn,
                                       __u32 psn, __u8 syndrome, __u32 msn,
                                       const struct crc_tables *T, struct icrc_scratch *s)
{
    const __u32 hlen = ipv6 ? 40 : 20;
    const __u32 l3 = sizeof(struct ethhdr), l4 = l3 + hlen, bth = l4 + 8, aeth = bth + BTH_LEN;
    const __u32 icrc = aeth + AETH_LEN, total = icrc + ICRC_LEN;
    __u8 *p = data;
    if ((void *)(p + total) > data_end)
        return 0;
    swap_bytes(p, p + 6, 6);
    if (ipv6) {
        swap_bytes(p + l3 + 8, p + l3 + 24, 16);
        p[l3 + 4] = 0;
        p[l3 + 5] = ACK_L4;                   /* payload length */
        p[l3 + 7] = ACK_TTL;                  /* hop limit */
        p[l3 + 1] = (p[l3 + 1] & ~0x30) | 0x20;   /* ECN: ECT(0), never an echoed CE */
    } else {
        swap_bytes(p + l3 + 12, p + l3 + 16, 4);
        p[l3 + 1] = (p[l3 + 1] & ~0x03) | 0x02;   /* ECN: ECT(0), never an echoed CE */
        p[l3 + 2] = 0;
        p[l3 + 3] = 20 + ACK_L4;              /* total length */
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
    p[l4 + 5] = ACK_L4;
    p[l4 + 6] = p[l4 + 7] = 0;
    /* BTH: opcode, no SE/M/pad, TVer 0; P_Key kept; DestQP; AckReq 0 */
    p[bth] = RC_ACKNOWLEDGE;
    p[bth + 1] = 0;
    p[bth + 4] = 0;
    p[bth + 5] = dqpn >> 16;
    p[bth + 6] = dqpn >> 8;
    p[bth + 7] = dqpn;
    p[bth + 8] = 0;
    p[bth + 9] = psn >> 16;
    p[bth + 10] = psn >> 8;
    p[bth + 11] = psn;
    p[aeth] = syndrome;
    p[aeth + 1] = msn >> 16;
    p[aeth + 2] = msn >> 8;
    p[aeth + 3] = msn;
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
    if (ipv6) {    /* IPv6 requires the UDP checksum */
        __u32 sum = sum16(p + l3 + 8, 16) + ACK_L4 + IPPROTO_UDP + sum16(p + l4, ACK_L4 / 2);
        __u16 c = csum_fold(sum);
        if (c == 0)
            c = 0xffff;
        p[l4 + 6] = c >> 8;
        p[l4 + 7] = c & 0xff;
    }
    return total;
}

#endif
