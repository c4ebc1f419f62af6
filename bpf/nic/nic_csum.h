/* The negotiated integrity check of MetaRoCE mode (spec 5.7, INT-3): instead of the ICRC, the
 * IPv4 header checksum and the UDP checksum (pseudo-header, UDP header, BTH through ICRC), the
 * 16-bit ones' complement sum of RFC 1071. It catches every single-bit error and every burst of
 * 15 bits or fewer in what the ICRC covers (IPv6's traffic class, flow label and hop limit
 * change in flight: neither check covers them), at about a fifth of the ICRC's cost per KiB
 * (tools/bench/nic_rx_cost.py): the kernel's csum_partial (bpf_csum_diff) over 512-byte chunks
 * copied out with bpf_xdp_load_bytes, which works alike on linear and multi-buffer frames.
 * Every check has a fixed trip count. */
#ifndef __NIC_CSUM_H
#define __NIC_CSUM_H

#include "nic_parse.h"

#define CSUM_CHUNK 512            /* bpf_csum_diff takes at most 512 bytes a call */
#define CSUM_MAX_CHUNKS ((8 + MAX_PAYLOAD + 64 + CSUM_CHUNK - 1) / CSUM_CHUNK)

struct csum_scratch {
    __u8 b[CSUM_CHUNK];
};

/* A 32-bit ones' complement sum folded to 16 bits and complemented: the checksum to write,
 * or 0 when the sum covered a checksum that holds. */
static __always_inline __u16 csum_fold(__u32 sum)
{
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    return ~sum & 0xffff;
}

/* Sum of n (a multiple of 4, at most CSUM_CHUNK) bytes at buf, added to seed. */
static __always_inline __u32 csum_add(__u32 seed, __u8 *buf, __u32 n)
{
    return (__u32)bpf_csum_diff(0, 0, (__be32 *)buf, n, seed);
}

/* 1 when the frame passes INT-3: an IPv4 header whose checksum holds and whose total length
 * is the UDP datagram's (IPv6: payload length), a non-zero UDP checksum, and the ones'
 * complement sum over pseudo-header and datagram folding to 0xFFFF. l4 = UDP length - 8 (BTH
 * through ICRC), already checked to lie inside the frame and to be a multiple of 4. */
static __always_inline int csum_check(struct xdp_md *ctx, const struct roce_pkt *rp, __u32 l4,
                                      struct csum_scratch *s)
{
    const __u32 l3 = sizeof(struct ethhdr);
    __u32 ulen = l4 + 8, sum;
    if (rp->ipver == 4) {
        if (bpf_xdp_load_bytes(ctx, l3, s->b, 20))
            return 0;
        if (csum_fold(csum_add(0, s->b, 20)))                     /* IPv4 header checksum */
            return 0;
        if (((__u32)s->b[2] << 8 | s->b[3]) != 20 + ulen)
            return 0;
        s->b[20] = 0;                                             /* zero, protocol, length */
        s->b[21] = IPPROTO_UDP;
        s->b[22] = ulen >> 8;
        s->b[23] = ulen & 0xff;
        sum = csum_add(0, s->b + 12, 12);                         /* addresses + the above */
    } else {
        if (bpf_xdp_load_bytes(ctx, l3, s->b, 40))
            return 0;
        if ((s->b[0] >> 4) != 6 || ((__u32)s->b[4] << 8 | s->b[5]) != ulen)
            return 0;                 /* the version is no checksum's: checked here */
        s->b[40] = 0;
        s->b[41] = IPPROTO_UDP;
        s->b[42] = ulen >> 8;
        s->b[43] = ulen & 0xff;
        sum = csum_add(0, s->b + 8, 36);
    }
    __u32 off = rp->bth_off - 8, end = rp->bth_off + l4;
    __u16 wire;
    if (bpf_xdp_load_bytes(ctx, off + 6, &wire, 2) || wire == 0)  /* a checksum was sent */
        return 0;
#pragma clang loop unroll(disable)
    for (__u32 c = 0; c < CSUM_MAX_CHUNKS; c++) {
        if (off + CSUM_CHUNK > end)
            break;
        if (bpf_xdp_load_bytes(ctx, off, s->b, CSUM_CHUNK))
            return 0;
        sum = csum_add(sum, s->b, CSUM_CHUNK);
        off += CSUM_CHUNK;
    }
    if (off < end) {
        __u32 rest = end - off;                     /* 4 .. 508: ulen is a multiple of 4 */
        if (rest >= CSUM_CHUNK || (rest & 3))
            return 0;
        __u32 n = ((rest - 1) & (CSUM_CHUNK - 1)) + 1;   /* = rest, seen as 1 .. 512 */
        asm volatile("" : "+r"(n));   /* keep clang from handing the helper rest instead */
        if (bpf_xdp_load_bytes(ctx, off, s->b, n))
            return 0;
        sum = csum_add(sum, s->b, n);
    }
    return csum_fold(sum) == 0;
}

#endif
