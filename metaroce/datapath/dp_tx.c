/* Transmit: the engine's packet descriptors become frames in the AF_XDP socket's UMEM
 * (metaroce/fastpath/roce_tx.c mr_send_pkts: headers from the QP's flow and the descriptor,
 * payload from registered memory or the adapter's copy, ICRC), one kick per batch. Before a
 * request leaves, the kernel learns what it needs to take its answer: the QP's next PSN
 * (ACKs beyond it are forged, RESP-12) and, for a READ or atomic sent the first time, the slot
 * its response is placed by. */
#include <bpf/bpf.h>
#include <string.h>

#include "dp_int.h"

static int needs_slot(const struct mre_pkt *p)
{
    uint8_t op = p->opcode & 0x3F;
    return !(p->flags & MRE_PF_RETX) && (p->opcode < 0x80 || p->opcode >= 0xC0) &&
           (op == 0x0C || op == 0x13 || op == 0x14);
}

/* The response slot of a READ/atomic request about to leave for the first time. */
static void rd_slot(struct mr_dp *d, struct dp_qp *q, const struct mre_pkt *p)
{
    const struct dp_shadow *sh = &q->shadow[p->wqe & q->shadow_mask];
    uint32_t idx = q->rd_next++;
    struct rd_slot s;
    memset(&s, 0, sizeof(s));
    s.wr_id = p->wr_id;
    s.addr = sh->addr;
    s.length = sh->len;
    s.lkey = sh->lkey;
    s.first_psn = p->psn;
    s.kind = sh->kind ? sh->kind : RD_READ;
    s.idx = idx;
    q->rd_kind[idx & (RD_DEPTH - 1)] = (uint8_t)s.kind;
    uint64_t key = (uint64_t)q->qpn << 32 | (idx & (RD_DEPTH - 1));
    if (bpf_map_update_elem(d->cfg.rd_slots_fd, &key, &s, BPF_ANY))
        d->st.rd_slot_errors++;
    q->rd_slots++;
}

int dp_transmit(struct mr_dp *d, int64_t now)
{
    int total = 0;
    for (;;) {
        uint32_t room = mr_xsk_tx_room(d->xsk);
        if (!room) {
            d->st.tx_full++;
            break;
        }
        int n = mre_take_tx(d->e, d->pkts, (int)(room < DP_TX_BATCH ? room : DP_TX_BATCH), now);
        if (n <= 0)
            break;
        uint32_t keep = 0;
        for (int i = 0; i < n; i++) {
            struct mre_pkt *p = &d->pkts[i];
            struct dp_qp *q = dp_qp_by_eh(d, p->qp);
            if (!q || !q->connected)
                continue;                               /* destroyed meanwhile */
            uint32_t nxt = mre_qp_next_psn(d->e, q->eh);
            if (nxt != q->nxt_stored) {                 /* before the packets that use it */
                q->nxt_stored = nxt;
                __atomic_store_n(&d->sq_psns[q->sq_slot], (uint64_t)nxt, __ATOMIC_RELEASE);
            }
            if (needs_slot(p))
                rd_slot(d, q, p);
            q->sent_packets++;
            if (!(p->flags & MRE_PF_RETX))
                q->sent_bytes += p->len;
            d->flows[keep] = &q->flow;
            if ((uint32_t)i != keep)
                d->pkts[keep] = *p;
            keep++;
            dp_touch(d, q);
        }
        uint32_t bad = 0;
        uint32_t sent = keep ? mr_send_pkts(d->xsk, d->flows, d->pkts, keep, &bad) : 0;
        d->st.tx_packets += sent - bad;
        d->st.tx_bad += bad;
        total += n;
        if (sent < keep) {             /* cannot happen: room was checked (the rest is lost, */
            d->st.tx_full++;           /* and retransmitted by the engine's timers) */
            break;
        }
    }
    return total;
}
