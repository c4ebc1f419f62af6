/* The NIC program's events (struct nic_event, bpf/nic/nic_structs.h) drained from its ring in
 * batches and handed to the engine as its events (struct mre_event): the requester side's ACKs,
 * NAKs, SACKs, READ progress and gaps, atomic results, CNPs; the responder side's receive
 * completions, cumulative PSN moves and READ requests to answer; fatal errors. */
#include <bpf/bpf.h>
#include <string.h>

#include "dp_int.h"

_Static_assert(sizeof(struct mr_nic_event) == sizeof(struct nic_event), "event layout");

/* SACKETH flags (bpf/nic/nic_consts.h, metaroce/wire/consts.py) */
#define SACKF_ECE 0x80
#define SACKF_PROBE 0x20
#define SACKF_CREDIT 0x10

/* The kernel keeps a SACK bitmap in wire order (bit 63 of the first word = PSN cum + 2); the
 * engine's bit i is PSN cum + 2 + i. */
static uint64_t rev64(uint64_t v)
{
    v = ((v >> 1) & 0x5555555555555555ull) | ((v & 0x5555555555555555ull) << 1);
    v = ((v >> 2) & 0x3333333333333333ull) | ((v & 0x3333333333333333ull) << 2);
    v = ((v >> 4) & 0x0F0F0F0F0F0F0F0Full) | ((v & 0x0F0F0F0F0F0F0F0Full) << 4);
    return __builtin_bswap64(v);
}

/* a failed receive's status by the program's reason (metaroce/nic/rx.py RX_REASONS): too long
 * for its buffer, a slot of the owner's receive queue that is no receive, else its buffer was
 * not the owner's to receive into */
static uint8_t recv_err_status(uint32_t reason)
{
    switch (reason) {
    case RX_INVALID_REQUEST:
        return WC_LOC_LEN_ERR;
    case RX_BAD_RECV_WQE:
        return WC_LOC_QP_OP_ERR;
    default:
        return WC_LOC_PROT_ERR;
    }
}

static void one(struct mr_dp *d, const struct mr_nic_event *k, int64_t now)
{
    struct dp_qp *q = dp_qp_by_qpn(d, k->qpn);
    if (!q || q->eh == DP_NONE || q->err) {
        d->st.events_ignored++;
        return;
    }
    struct mre_event ev;
    memset(&ev, 0, sizeof(ev));
    ev.psn = k->psn & 0xFFFFFF;
    ev.syndrome = k->syndrome;
    ev.msn = k->msn;
    switch (k->type) {
    case EV_ACK:                       /* compat: ACK, */
    case EV_NAK:                       /* NAK (sequence, RNR, fatal) */
        if (q->mode != MRE_COMPAT)
            return;
        ev.type = MRE_EV_ACK;
        break;
    case EV_SACK: {                    /* MetaRoCE: one per SACK (nic_rx on_sack) */
        uint32_t sf = k->flags >> 16 & 0xFF;
        ev.type = MRE_EV_SACK;
        ev.sack[0] = rev64(k->wr_id);
        ev.sack[1] = rev64(k->va);
        ev.ts_echo = k->imm;
        ev.path = (uint8_t)(k->flags >> 8);
        if (sf & SACKF_ECE)
            ev.flags |= MRE_PF_ECN_ECHO;
        if (sf & SACKF_PROBE)
            ev.flags |= MRE_PF_PROBE_REPLY;
        if (k->len & CREDIT_VALID) {
            ev.flags |= MRE_PF_CREDIT;
            ev.credit_limit = k->len & 0xFFFFFF;
        }
        break;
    }
    case EV_RD_DONE: {                 /* a READ's responses or an atomic's result placed */
        q->rd_done++;
        q->rd_seen_psn = DP_NONE;
        uint8_t kind = q->rd_kind[k->flags & (RD_DEPTH - 1)];
        if (k->syndrome) {             /* the local buffer refused it */
            ev.type = MRE_EV_LOCAL_ERR;
            ev.status = WC_LOC_PROT_ERR;
        } else {
            ev.type = kind == RD_ATOMIC ? MRE_EV_ATOMIC_ACK : MRE_EV_READ_DONE;
        }
        break;
    }
    case EV_RD_GAP:
        ev.type = MRE_EV_READ_GAP;
        break;
    case EV_CNP:
        if (k->syndrome)               /* (an ECN echo of a SACK: its flag says it) */
            return;
        ev.type = MRE_EV_CNP;
        break;
    case EV_READ_REQUEST:
        ev.type = MRE_EV_READ_REQ;
        ev.va = k->va;
        ev.rkey = k->rkey;
        ev.len = k->len;
        ev.rsn = k->imm;               /* the request's SSN, echoed in the responses' PETH */
        ev.sport = (uint16_t)k->pad;
        ev.flags = k->flags & 1 ? MRE_EVF_DUPLICATE : 0;
        break;
    case EV_RECV:
    case EV_RECV_ERR:
        ev.type = MRE_EV_RECV;
        ev.wr_id = k->wr_id;
        ev.len = k->len;
        ev.imm = __builtin_bswap32(k->imm);            /* as on the wire: big-endian */
        ev.wc_opcode = k->flags & 2 ? MR_WC_RECV_RDMA_WITH_IMM : MR_WC_RECV;
        ev.wc_flags = (uint8_t)((k->flags & 1 ? MR_WC_WITH_IMM : 0) |
                                (k->flags & RECV_F_SOLICITED ? MR_WC_SOLICITED : 0));
        if (k->type == EV_RECV_ERR) {
            ev.status = recv_err_status(k->syndrome);
            ev.wc_flags = 0;
        }
        ev.rsn = (uint32_t)k->va & 0xFFFFFF;
        if (k->flags & 4)
            ev.flags = MRE_EVF_IN_ORDER;
        break;
    case EV_EPSN:
        ev.type = MRE_EV_EPSN;
        break;
    case EV_QP_ERROR:                  /* our responder sent a fatal NAK: the QP is in ERR */
        mre_qp_to_error(d->e, q->eh);
        dp_touch(d, q);
        return;
    default:
        d->st.events_ignored++;
        return;
    }
    mre_event(d->e, q->eh, &ev, now);
    dp_touch(d, q);
}

/* The kernel places a READ's responses without telling the engine until the READ ends, so at
 * a timer expiry the kernel is asked: responses that arrived in order since the last expiry (in
 * order, or before the point a reported gap waits at) are
 * progress (RESP-9: the local ACK timer covers the time to the next response, not to the last),
 * handed to the engine as READ progress up to the last one placed. */
void dp_read_progress(struct mr_dp *d, struct dp_qp *q, int64_t now)
{
    if (q->rd_next == q->rd_done || q->eh == DP_NONE)
        return;                        /* no READ or atomic outstanding */
    struct nic_qp k;
    if (bpf_map_lookup_elem(d->cfg.qps_fd, &q->qpn, &k))
        return;
    if (!k.rd_state || k.rd_psn == q->rd_seen_psn)
        return;                        /* not inside a response, or nothing new */
    if (k.rd_state == 2) {
        /* after a gap the kernel waits for the responses at rd_psn: everything before it is
         * placed (unless that is the READ's first PSN: nothing is), so the timer's
         * re-request starts there, where the kernel takes it */
        uint64_t key = (uint64_t)q->qpn << 32 | (k.rd_head & (RD_DEPTH - 1));
        struct rd_slot sl;
        if (bpf_map_lookup_elem(d->cfg.rd_slots_fd, &key, &sl) || sl.idx != k.rd_head ||
            sl.first_psn == k.rd_psn)
            return;
    }
    q->rd_seen_psn = k.rd_psn;
    struct mre_event ev;
    memset(&ev, 0, sizeof(ev));
    ev.type = MRE_EV_READ_DONE;
    ev.psn = (k.rd_psn - 1) & 0xFFFFFF;
    mre_event(d->e, q->eh, &ev, now);
}

int dp_drain_events(struct mr_dp *d, int64_t now)
{
    int total = 0;
    for (int round = 0; round < 4; round++) {       /* bounded: rings and timers get a turn */
        if (!mr_evring_pending(d->ev))
            break;
        struct mr_nic_event *evs;
        int n = mr_evring_poll(d->ev, 0, &evs);
        if (n <= 0)
            break;
        for (int i = 0; i < n; i++)
            one(d, &evs[i], now);
        d->st.events += (uint32_t)n;
        total += n;
    }
    return total;
}
