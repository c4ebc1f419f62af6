/* Parsing Ethernet / IPv4 or IPv6 / UDP 4791 / BTH with direct packet access: every pointer is
 * checked against data_end where it is formed. */
#ifndef __NIC_PARSE_H
#define __NIC_PARSE_H

#include <uapi/linux/if_ether.h>
#include <uapi/linux/in.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/ipv6.h>
#include <uapi/linux/udp.h>
#include "nic_consts.h"

struct bth {
    __u8 opcode;
    __u8 flags;       /* SE, M, PadCnt (2 bits), TVer (4 bits) */
    __be16 pkey;
    __be32 dqpn;      /* resv8 | DestQP (24) */
    __be32 psn;       /* AckReq | resv7 | PSN (24) */
};

struct reth {
    __be32 va_hi;
    __be32 va_lo;
    __be32 rkey;
    __be32 dmalen;
};

struct roce_pkt {
    __u32 ipver;
    __u32 bth_off;    /* offset of the BTH from the start of the frame */
    __u32 udp_len;    /* UDP length field: BTH .. ICRC */
    __u32 ecn;        /* the IP ECN field (3 = CE) */
    __u32 sport;      /* UDP source port (host order): the requester's path */
    __u8 saddr[16];   /* source address; IPv4 in the first 4 bytes, the rest zero */
};

struct aeth {
    __be32 w;         /* syndrome (8) | MSN (24) */
};

struct atomic_eth {
    __be32 va_hi;
    __be32 va_lo;
    __be32 rkey;
    __be32 swap_hi;   /* swap (CMP_SWAP) or add (FETCH_ADD) */
    __be32 swap_lo;
    __be32 cmp_hi;
    __be32 cmp_lo;
};

struct peth {
    __u8 path;
    __u8 flags;       /* RETX, ACK_NOW */
    __be16 resv;
    __be32 ssn;       /* resv8 | SSN (24) */
    __be32 rsn;       /* resv8 | RSN (24) */
    __be32 offset;
    __be32 ts;
};

/* What the receive path reads from the BTH of a frame parse_roce took. */
struct rx_bth {
    struct bth bth;
    __u32 l4;         /* the UDP payload: BTH .. ICRC */
    __u32 qpn;
    __u32 psn;
    __u32 pad;        /* PadCnt */
    int ackreq;
    __u8 op;
};

#define PARSE_NOT_ROCE 1
#define PARSE_MALFORMED 2

/* 0 and *rp filled when the frame is RoCEv2; else PARSE_NOT_ROCE or PARSE_MALFORMED. */
static __always_inline int parse_roce(void *data, void *data_end, struct roce_pkt *rp)
{
    struct ethhdr *eth = data;
    if ((void *)(eth + 1) > data_end)
        return PARSE_NOT_ROCE;
    struct udphdr *udp;
    if (eth->h_proto == bpf_htons(ETH_P_IP)) {
        struct iphdr *ip = (void *)(eth + 1);
        if ((void *)(ip + 1) > data_end)
            return PARSE_NOT_ROCE;
        if (ip->protocol != IPPROTO_UDP)
            return PARSE_NOT_ROCE;
        if (ip->version != 4 || ip->ihl != 5 || (ip->frag_off & bpf_htons(0x3fff)))
            return PARSE_NOT_ROCE;    /* not IPv4 (the stack drops it), options or fragments:
                                       * not ours to parse */
        udp = (void *)(ip + 1);
        rp->ipver = 4;
        rp->ecn = ip->tos & 3;
        __builtin_memset(rp->saddr, 0, 16);
        __builtin_memcpy(rp->saddr, &ip->saddr, 4);
    } else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
        struct ipv6hdr *ip6 = (void *)(eth + 1);
        if ((void *)(ip6 + 1) > data_end)
            return PARSE_NOT_ROCE;
        if (ip6->version != 6 || ip6->nexthdr != IPPROTO_UDP)
            return PARSE_NOT_ROCE;
        udp = (void *)(ip6 + 1);
        rp->ipver = 6;
        rp->ecn = (ip6->flow_lbl[0] >> 4) & 3;
        __builtin_memcpy(rp->saddr, &ip6->saddr, 16);
    } else {
        return PARSE_NOT_ROCE;
    }
    if ((void *)(udp + 1) > data_end)
        return PARSE_NOT_ROCE;
    if (udp->dest != bpf_htons(ROCE_UDP_PORT))
        return PARSE_NOT_ROCE;
    rp->bth_off = (void *)(udp + 1) - data;
    rp->udp_len = bpf_ntohs(udp->len);
    rp->sport = bpf_ntohs(udp->source);
    if (rp->udp_len < sizeof(struct udphdr) + BTH_LEN + ICRC_LEN)
        return PARSE_MALFORMED;
    if ((void *)(udp + 1) + BTH_LEN > data_end)
        return PARSE_MALFORMED;
    return 0;
}

/* The BTH of a frame parse_roce took, decoded into *h: 0, or -1 when it, or the datagram its
 * UDP length claims, does not fit the frame (malformed). */
static __always_inline int read_bth(struct xdp_md *ctx, const struct roce_pkt *rp,
                                    struct rx_bth *h)
{
    if (bpf_xdp_load_bytes(ctx, rp->bth_off, &h->bth, sizeof(h->bth)))
        return -1;
    h->l4 = rp->udp_len - sizeof(struct udphdr);
    if (rp->bth_off + h->l4 > bpf_xdp_get_buff_len(ctx))
        return -1;
    h->qpn = bpf_ntohl(h->bth.dqpn) & 0xFFFFFF;
    h->psn = bpf_ntohl(h->bth.psn) & PSN_MASK;
    h->ackreq = !!(bpf_ntohl(h->bth.psn) & BTH_ACKREQ);
    h->op = h->bth.opcode;
    h->pad = (h->bth.flags >> 4) & 3;
    return 0;
}

#endif
