/* Small routines shared by the fabric programs: header classification and deterministic draws.
 * Headers never touch maps by name: BCC rewrites map syntax only in the main source file, so
 * the program looks values up and passes pointers in. */
#ifndef __FABRIC_HELPERS_H
#define __FABRIC_HELPERS_H

#include <uapi/linux/if_ether.h>
#include <uapi/linux/in.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/ipv6.h>
#include <uapi/linux/udp.h>
#include "fabric_structs.h"

struct pkt_info {
    __u8 ipver;            /* 0 = not IP */
    __u8 l4proto;
    __u8 is_roce;          /* UDP to ROCE_UDP_PORT */
    __u8 is_nd;            /* ICMPv6 neighbour discovery: never impaired */
    __u16 l3off;
    __u16 pad;
};

/* classify_xdp() / classify_skb(): fill *pi; return 0, or -1 when the frame is shorter than its
 * headers claim. One body, two loaders (a shared function taking the loader as a value would
 * make clang emit an indirect call, which BPF does not have). */
#define DEFINE_CLASSIFY(NAME, CTX_T, LOAD)                                                   \
static __always_inline int NAME(CTX_T *ctx, struct pkt_info *pi)                             \
{                                                                                            \
    struct ethhdr eth;                                                                       \
    __builtin_memset(pi, 0, sizeof(*pi));                                                    \
    if (LOAD(ctx, 0, &eth, sizeof(eth)))                                                     \
        return -1;                                                                           \
    pi->l3off = sizeof(eth);                                                                 \
    if (eth.h_proto == bpf_htons(ETH_P_IP)) {                                                \
        struct iphdr ip;                                                                     \
        if (LOAD(ctx, sizeof(eth), &ip, sizeof(ip)))                                         \
            return -1;                                                                       \
        pi->ipver = 4;                                                                       \
        pi->l4proto = ip.protocol;                                                           \
        if (ip.protocol == IPPROTO_UDP && !(ip.frag_off & bpf_htons(0x1fff))) {              \
            struct udphdr udp;                                                               \
            if (LOAD(ctx, sizeof(eth) + ip.ihl * 4, &udp, sizeof(udp)) == 0)                 \
                pi->is_roce = udp.dest == bpf_htons(ROCE_UDP_PORT);                          \
        }                                                                                    \
    } else if (eth.h_proto == bpf_htons(ETH_P_IPV6)) {                                       \
        struct ipv6hdr ip6;                                                                  \
        if (LOAD(ctx, sizeof(eth), &ip6, sizeof(ip6)))                                       \
            return -1;                                                                       \
        pi->ipver = 6;                                                                       \
        pi->l4proto = ip6.nexthdr;                                                           \
        if (ip6.nexthdr == IPPROTO_UDP) {                                                    \
            struct udphdr udp;                                                               \
            if (LOAD(ctx, sizeof(eth) + sizeof(ip6), &udp, sizeof(udp)) == 0)                \
                pi->is_roce = udp.dest == bpf_htons(ROCE_UDP_PORT);                          \
        } else if (ip6.nexthdr == IPPROTO_ICMPV6) {                                          \
            __u8 type = 0;                                                                   \
            LOAD(ctx, sizeof(eth) + sizeof(ip6), &type, 1);                                  \
            pi->is_nd = type >= 133 && type <= 137;                                          \
        }                                                                                    \
    }                                                                                        \
    return 0;                                                                                \
}

DEFINE_CLASSIFY(classify_xdp, struct xdp_md, bpf_xdp_load_bytes)
DEFINE_CLASSIFY(classify_skb, struct __sk_buff, bpf_skb_load_bytes)

/* splitmix64: a well-mixed 64-bit function of (seed, n): draws are reproducible per seed. */
static __always_inline __u64 mix64(__u64 z)
{
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static __always_inline __u64 draw(struct impair_seq *sq, __u64 seed)
{
    __u64 n = __sync_fetch_and_add(&sq->n, 1);
    return mix64(seed ^ mix64(n));
}

/* Whether an impairment configuration applies to this frame. */
static __always_inline int impair_applies(const struct impair_cfg *cfg, const struct pkt_info *pi)
{
    if (!(cfg->flags & IMPAIR_ENABLED) || !pi->ipver || pi->is_nd)
        return 0;
    return pi->is_roce || (cfg->flags & IMPAIR_ALL_TRAFFIC);
}

#endif
