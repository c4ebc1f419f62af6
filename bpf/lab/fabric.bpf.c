/* The lab fabric: programs on every link end of a MetaRoCE lab.
 *   fabric_host_xdp    host ends until MetaRoCE attaches its own: count, pass
 *   fabric_port_xdp    switch-side ends, XDP: count, loss for traffic arriving (a -> b),
 *                      forwarding to another port of the same switch when neither side
 *                      duplicates, reorders or shapes (devmap redirect; the bridge and tc are
 *                      skipped), with the leaving port's loss (b -> a) drawn here for it
 *   fabric_cpu_xdp     a switch's frames handed over to another CPU (cpumap): sent on to the
 *                      port forward() chose, from that CPU
 *   fabric_port_tc_in  switch-side ends, tc ingress: duplication, reordering (a -> b)
 *   fabric_port_tc_out switch-side ends, tc egress: ECN virtual queue, loss, duplication,
 *                      reordering (b -> a) of the frames the stack sends, count
 * Rate limiting itself is an htb qdisc on the switch-side egress, set up by the loader.
 * The XDP programs are frags-aware (loaded with BPF_F_XDP_HAS_FRAGS): a frame larger than a page
 * (MTU 9000) arrives in several buffers, the headers in the first; they read it with
 * bpf_xdp_load_bytes and size it with bpf_xdp_get_buff_len, never through data_end.
 * All map lookups happen here (BCC rewrites map syntax only in the main file). */
#include "fabric_maps.h"
#include "fabric_helpers.h"
#include "fabric_reorder.h"
#include "fabric_ecn.h"
#include "fabric_fwd.h"

int fabric_host_xdp(struct xdp_md *ctx)
{
    __u32 port = ctx->ingress_ifindex;
    struct port_stats *ps = port_stats.lookup(&port);
    if (ps) {
        ps->rx_packets++;
        ps->rx_bytes += bpf_xdp_get_buff_len(ctx);
    }
    return XDP_PASS;
}

/* One more in this CPU's steer_stats[k]. */
static __always_inline void steer_count(__u32 k)
{
    __u64 *n = steer_stats.lookup(&k);
    if (n)
        (*n)++;
}

/* The port the frame's destination MAC is behind on the switch of `in`, or NULL. */
static __always_inline __u32 *station_port(struct xdp_md *ctx, const struct port_cfg *in)
{
    struct fdb_key key = {.domain = in->domain};
    if (bpf_xdp_load_bytes(ctx, 0, key.mac, sizeof(key.mac)))
        return NULL;
    return fdb.lookup(&key);
}

/* Redirect the frame to the port its destination MAC is behind, on the same switch, when
 * neither this port's arrival side nor that port's departure side needs the stack; else
 * XDP_PASS (the bridge, tc and htb). A redirected frame never passes the leaving port's tc
 * egress, so that direction's loss is drawn here, from the same sequence and counters, once the
 * redirect is certain (a frame the devmap refuses goes to the stack and is drawn there). The
 * egress port's transmit counters count the frames that leave. */
static __always_inline int forward(struct xdp_md *ctx, __u32 port, __u32 len,
                                   const struct pkt_info *pi)
{
    __u32 in_slot = port * 2 + DIR_IN;
    struct port_cfg *in = port_cfg.lookup(&port);
    if (!in || !in->domain || needs_tc(impair_cfg.lookup(&in_slot), stash.lookup(&in_slot)))
        return XDP_PASS;
    __u32 *found = station_port(ctx, in);
    if (!found)
        return XDP_PASS;
    __u32 out_port = *found, out_slot = out_port * 2 + DIR_OUT;
    struct impair_cfg *cfg = impair_cfg.lookup(&out_slot);
    if (out_port == port || !fast_egress(port_cfg.lookup(&out_port), in->domain) ||
        needs_tc(cfg, stash.lookup(&out_slot)))
        return XDP_PASS;
    struct port_stats *out = port_stats.lookup(&out_port);
    struct impair_stats *st = impair_stats.lookup(&out_slot);
    struct impair_seq *sq = impair_seq.lookup(&out_slot);
    if (!out || !st || !sq)
        return XDP_PASS;
    int action = XDP_PASS, steered = 0;
    struct steer_state *ss = NULL;
    if ((in->flags & PORT_STEER) && in->cpus > 1 && in->cpus <= MAX_CPUS &&
        (ss = steer_state.lookup(&port))) {
        /* the next CPU sends it on (fabric_cpu_xdp): on veth, XDP runs on the CPU that
         * transmitted, so without this the sender's CPU also ran the switch and the receiving
         * host for every frame it sent. The choice holds while the port is busy (order). */
        __u64 now = bpf_ktime_get_ns();
        __u32 cpu = ss->cpu;
        if (now - ss->last_ns > STEER_IDLE_NS || cpu >= in->cpus) {
            cpu = (bpf_get_smp_processor_id() + 1) % in->cpus;
            ss->cpu = cpu;
        }
        ss->last_ns = now;
        action = cpus.redirect_map(cpu, 0);
        steered = action == XDP_REDIRECT;
    }
    if (!steered)
        action = tx_ports.redirect_map(out_port, XDP_PASS);
    if (action != XDP_REDIRECT)
        return action;
    /* as fabric_port_tc_out does: every frame the impairment applies to takes one draw */
    if (impair_applies(cfg, pi)) {
        st->matched++;
        __u64 roll = draw(sq, cfg->seed);
        if (cfg->loss && (__u32)roll < cfg->loss) {
            st->lost++;
            return XDP_DROP;   /* the redirect target the helper noted is only read on XDP_REDIRECT */
        }
    }
    out->tx_packets++;
    out->tx_bytes += len;
    if (steered)
        steer_count(STEER_HANDED);
    return XDP_REDIRECT;
}

/* A frame forward() handed to this CPU: to the port its destination is behind (the same
 * lookup; ingress_ifindex is still the port it arrived on). Impairment and counters were
 * applied when it was handed over; if that port has gone meanwhile the frame is dropped. */
int fabric_cpu_xdp(struct xdp_md *ctx)
{
    __u32 port = ctx->ingress_ifindex;
    struct port_cfg *in = port_cfg.lookup(&port);
    if (!in || !in->domain)
        return XDP_DROP;
    __u32 *found = station_port(ctx, in);
    if (!found)
        return XDP_DROP;
    int action = tx_ports.redirect_map(*found, XDP_DROP);
    if (action == XDP_REDIRECT)
        steer_count(STEER_FORWARDED);
    return action;
}

int fabric_port_xdp(struct xdp_md *ctx)
{
    __u32 port = ctx->ingress_ifindex;
    struct port_stats *ps = port_stats.lookup(&port);
    struct pkt_info pi;
    if (!ps)
        return XDP_PASS;
    __u32 len = bpf_xdp_get_buff_len(ctx);
    ps->rx_packets++;
    ps->rx_bytes += len;
    if (classify_xdp(ctx, &pi))
        return XDP_PASS;
    __u32 slot = port * 2 + DIR_IN;
    struct impair_cfg *cfg = impair_cfg.lookup(&slot);
    struct impair_stats *st = impair_stats.lookup(&slot);
    struct impair_seq *sq = impair_seq.lookup(&slot);
    if (!cfg || !st || !sq)
        return XDP_PASS;
    if (impair_applies(cfg, &pi)) {
        st->matched++;
        if (cfg->loss && (__u32)draw(sq, cfg->seed) < cfg->loss) {
            st->lost++;
            return XDP_DROP;
        }
    }
    /* duplication and reordering of this direction need tc: forward() passes such frames on */
    return forward(ctx, port, len, &pi);
}

int fabric_port_tc_in(struct __sk_buff *skb)
{
    if (skb->mark == MARK_OWN_CLONE) {
        skb->mark = 0;
        return TC_ACT_OK;
    }
    __u32 port = skb->ifindex, zero = 0;
    __u32 slot = port * 2 + DIR_IN;
    struct stash *s = stash.lookup(&slot);
    struct scratch *sc = scratch.lookup(&zero);
    struct pkt_info pi;
    if (port >= MAX_PORTS || !s || !sc || classify_skb(skb, &pi))
        return TC_ACT_OK;
    if (maybe_release(skb, DIR_IN, s, sc, &pi))
        return TC_ACT_OK;
    struct impair_cfg *cfg = impair_cfg.lookup(&slot);
    struct impair_stats *st = impair_stats.lookup(&slot);
    struct impair_seq *sq = impair_seq.lookup(&slot);
    if (!cfg || !st || !sq || !impair_applies(cfg, &pi) || !(cfg->dup | cfg->reorder))
        return TC_ACT_OK;
    return dup_or_hold(skb, DIR_IN, cfg, s, draw(sq, cfg->seed), st, &pi);
}

static __always_inline int count_tx(struct port_stats *ps, struct __sk_buff *skb, int action)
{
    if (action == TC_ACT_OK) {
        ps->tx_packets++;
        ps->tx_bytes += skb->len;
    }
    return action;
}

int fabric_port_tc_out(struct __sk_buff *skb)
{
    __u32 port = skb->ifindex, zero = 0;
    struct port_stats *ps = port_stats.lookup(&port);
    if (!ps)
        return TC_ACT_OK;
    if (skb->mark == MARK_OWN_CLONE) {
        skb->mark = 0;
        return count_tx(ps, skb, TC_ACT_OK);
    }
    __u32 slot = port * 2 + DIR_OUT;
    struct stash *s = stash.lookup(&slot);
    struct scratch *sc = scratch.lookup(&zero);
    struct ecn_cfg *ecfg = ecn_cfg.lookup(&port);
    struct vqueue *vq = vqueue.lookup(&port);
    struct pkt_info pi;
    if (!s || !sc || !ecfg || !vq || classify_skb(skb, &pi))
        return count_tx(ps, skb, TC_ACT_OK);
    if (pi.ipver && vq_over(ecfg, vq, skb->len)) {
        if (mark_ce(skb, &pi))
            ps->ecn_marked++;
        else
            ps->ecn_not_ect++;
    }
    struct impair_cfg *cfg = impair_cfg.lookup(&slot);
    struct impair_stats *st = impair_stats.lookup(&slot);
    struct impair_seq *sq = impair_seq.lookup(&slot);
    int applies = cfg && st && sq && impair_applies(cfg, &pi);
    __u64 roll = 0;
    /* Every frame the impairment applies to takes its draw first, also one that would carry a
     * held frame out: a lost frame never reaches the wire, so it neither leaves nor lets the
     * held one go (as on arrival, where XDP drops it before tc_in sees it). */
    if (applies) {
        st->matched++;
        roll = draw(sq, cfg->seed);
        if (cfg->loss && (__u32)roll < cfg->loss) {
            st->lost++;
            return TC_ACT_SHOT;
        }
    }
    if (maybe_release(skb, DIR_OUT, s, sc, &pi))
        return count_tx(ps, skb, TC_ACT_OK);
    if (!applies)
        return count_tx(ps, skb, TC_ACT_OK);
    return count_tx(ps, skb, dup_or_hold(skb, DIR_OUT, cfg, s, roll, st, &pi));
}
