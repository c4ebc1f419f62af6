/* ECN marking from a virtual queue that drains at the link rate (there is no RED/CoDel here):
 * when the bytes offered exceed what the rate drains by more than the threshold, ECT frames
 * leave with CE set. */
#ifndef __FABRIC_ECN_H
#define __FABRIC_ECN_H

#include "fabric_helpers.h"

#define ECN_MASK 0x3
#define ECN_CE 0x3

/* Account len bytes on a port's virtual queue; returns 1 when the queue is over threshold. */
static __always_inline int vq_over(struct ecn_cfg *cfg, struct vqueue *vq, __u32 len)
{
    if (!cfg->rate_Bps)
        return 0;
    __u64 now = bpf_ktime_get_ns();
    __u64 rate = cfg->rate_Bps, threshold = cfg->threshold;
    int over;
    bpf_spin_lock(&vq->lock);
    __u64 idle = now - vq->last_ns;
    if (idle > VQ_MAX_IDLE_NS)
        idle = VQ_MAX_IDLE_NS;
    __u64 drained = idle * rate / 1000000000ULL;
    vq->bytes = vq->bytes > drained ? vq->bytes - drained : 0;
    vq->bytes += len;
    if (vq->bytes > 2 * threshold)       /* a phantom queue has a finite buffer too */
        vq->bytes = 2 * threshold;
    vq->last_ns = now;
    over = vq->bytes > threshold;
    bpf_spin_unlock(&vq->lock);
    return over;
}

/* Set CE on an ECT frame; returns 1 if marked, 0 if the frame is not ECN-capable. */
static __always_inline int mark_ce(struct __sk_buff *skb, const struct pkt_info *pi)
{
    if (pi->ipver == 4) {
        __u16 word;   /* version/ihl + tos, as the header checksum sees them */
        if (bpf_skb_load_bytes(skb, pi->l3off, &word, 2))
            return 0;
        __u8 tos = bpf_ntohs(word) & 0xff;
        if (!(tos & ECN_MASK))
            return 0;
        if ((tos & ECN_MASK) == ECN_CE)
            return 1;
        __u16 nword = bpf_htons((bpf_ntohs(word) & 0xff00) | tos | ECN_CE);
        bpf_l3_csum_replace(skb, pi->l3off + offsetof(struct iphdr, check), word, nword, 2);
        bpf_skb_store_bytes(skb, pi->l3off, &nword, 2, 0);
        return 1;
    }
    if (pi->ipver == 6) {
        __u8 b1;      /* traffic class low nibble sits in the high nibble of byte 1 */
        if (bpf_skb_load_bytes(skb, pi->l3off + 1, &b1, 1))
            return 0;
        if (!((b1 >> 4) & ECN_MASK))
            return 0;
        b1 |= ECN_CE << 4;
        bpf_skb_store_bytes(skb, pi->l3off + 1, &b1, 1, 0);
        return 1;
    }
    return 0;
}

#endif
