/* Duplication (clone-redirect) and reordering (hold one frame per slot, send it after
 * reorder_depth later frames) on tc hooks. */
#ifndef __FABRIC_REORDER_H
#define __FABRIC_REORDER_H

#include <uapi/linux/pkt_cls.h>
#include "fabric_helpers.h"

/* Copy len (<= STASH_MAX) bytes between the frame and buf, in chunks the verifier can bound:
 * into buf when to_skb is 0, into the frame when it is 1 (a constant at every call site). */
static __always_inline int copy_frame(struct __sk_buff *skb, __u8 *buf, __u32 len, int to_skb)
{
#pragma unroll
    for (int i = 0; i < STASH_CHUNKS; i++) {
        __u32 off = i * STASH_CHUNK;
        if (off >= len)
            break;
        __u32 n = len - off;
        if (n > STASH_CHUNK)
            n = STASH_CHUNK;
        n = ((n - 1) & (STASH_CHUNK - 1)) + 1;
        if (to_skb ? bpf_skb_store_bytes(skb, off, buf + off, n, 0)
                   : bpf_skb_load_bytes(skb, off, buf + off, n))
            return -1;
    }
    return 0;
}

static __always_inline int save_frame(struct __sk_buff *skb, __u8 *dst, __u32 len)
{
    return copy_frame(skb, dst, len, 0);
}

/* Make the skb carry exactly the len bytes at src. */
static __always_inline int restore_frame(struct __sk_buff *skb, __u8 *src, __u32 len)
{
    if (len == 0 || len > STASH_MAX || bpf_skb_change_tail(skb, len, 0))
        return -1;
    return copy_frame(skb, src, len, 1);
}

/* A frame can be held or carry a release when it is small enough and not a GSO aggregate. */
static __always_inline int stashable(struct __sk_buff *skb)
{
    return skb->len >= ETH_HLEN && skb->len <= STASH_MAX && skb->gso_segs <= 1;
}

/* If this slot holds a frame whose countdown ends with this frame, send this frame and then
 * the held one; returns 1 when it did (the skb now carries the held frame), else 0.
 * The carrier must have the held frame's shape (IP version, L4 protocol): the skb keeps its
 * metadata (protocol, checksum offload state), which must fit the bytes it is given. */
static __always_inline int maybe_release(struct __sk_buff *skb, int dir, struct stash *s,
                                         struct scratch *sc, const struct pkt_info *pi)
{
    if (s->state != STASH_HELD || !stashable(skb) || pi->ipver != s->ipver ||
        pi->l4proto != s->l4proto)
        return 0;
    __u64 left = __sync_fetch_and_add(&s->countdown, -1);
    if (left != 1)
        return 0;
    if (__sync_val_compare_and_swap(&s->state, STASH_HELD, STASH_BUSY) != STASH_HELD)
        return 0;
    __u32 held_len = s->len;
    int ok = 0;
    if (dir == DIR_OUT) {
        /* egress clones leave synchronously: send the current frame first, then become the held one */
        skb->mark = MARK_OWN_CLONE;
        bpf_clone_redirect(skb, skb->ifindex, 0);
        skb->mark = 0;
        ok = restore_frame(skb, s->data, held_len) == 0;
    } else {
        /* ingress clones are queued for later: clone the held frame, then restore the current one */
        __u32 cur_len = skb->len;
        if (sc && save_frame(skb, sc->data, cur_len) == 0 &&
            restore_frame(skb, s->data, held_len) == 0) {
            skb->mark = MARK_OWN_CLONE;
            bpf_clone_redirect(skb, skb->ifindex, BPF_F_INGRESS);
            skb->mark = 0;
            ok = restore_frame(skb, sc->data, cur_len) == 0;
        }
    }
    s->state = STASH_EMPTY;
    return ok ? 1 : -1;
}

/* Hold this frame back; returns 1 when held (caller drops the skb), 0 if the stash was busy. */
static __always_inline int hold(struct __sk_buff *skb, struct stash *s, struct impair_cfg *cfg,
                                const struct pkt_info *pi)
{
    if (!stashable(skb))
        return 0;
    if (__sync_val_compare_and_swap(&s->state, STASH_EMPTY, STASH_BUSY) != STASH_EMPTY)
        return 0;
    __u32 len = skb->len;
    if (save_frame(skb, s->data, len)) {
        s->state = STASH_EMPTY;
        return 0;
    }
    s->len = len;
    s->ipver = pi->ipver;
    s->l4proto = pi->l4proto;
    s->countdown = cfg->reorder_depth ? cfg->reorder_depth : 1;
    s->state = STASH_HELD;
    return 1;
}

/* Duplicate and/or hold a frame the impairment applies to. Returns a TC action. */
static __always_inline int dup_or_hold(struct __sk_buff *skb, int dir,
                                       struct impair_cfg *cfg, struct stash *s, __u64 roll,
                                       struct impair_stats *st, const struct pkt_info *pi)
{
    if (cfg->reorder && (__u32)mix64(roll) < cfg->reorder) {
        if (hold(skb, s, cfg, pi)) {
            st->reordered++;
            return TC_ACT_SHOT;
        }
        st->stash_busy++;
    }
    if (cfg->dup && (__u32)(roll >> 32) < cfg->dup) {
        skb->mark = MARK_OWN_CLONE;
        if (bpf_clone_redirect(skb, skb->ifindex, dir == DIR_IN ? BPF_F_INGRESS : 0) == 0)
            st->duplicated++;
        skb->mark = 0;
    }
    return TC_ACT_OK;
}

#endif
