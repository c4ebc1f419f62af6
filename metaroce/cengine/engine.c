/* The engine: its QPs (state machine, QP-1), registered memory, the output ring of packet
 * descriptors, the completion ring, packet and event dispatch, timers. Reference model:
 * metaroce/engine/queue_pair.py. */
#include <stdlib.h>
#include <string.h>

#include "mre_int.h"

static uint32_t pow2(uint32_t n)
{
    uint32_t p = 1;
    while (p < n)
        p <<= 1;
    return p;
}

struct mre_engine *mre_engine_new(const struct mre_engine_cfg *cfg)
{
    struct mre_engine *e = calloc(1, sizeof(*e));
    if (!e)
        return NULL;
    e->cfg = *cfg;
    e->nqps = cfg->max_qps ? cfg->max_qps : 1;
    e->qps = calloc(e->nqps, sizeof(*e->qps));
    uint32_t ms = pow2(2 * (cfg->max_mrs ? cfg->max_mrs : 1));
    e->mrs = calloc(ms, sizeof(*e->mrs));
    e->mrs_mask = ms - 1;
    uint32_t oc = pow2(cfg->out_cap ? cfg->out_cap : 4096);
    uint32_t cc = pow2(cfg->cq_cap ? cfg->cq_cap : 4096);
    e->out = calloc(oc, sizeof(*e->out));
    e->cq = calloc(cc, sizeof(*e->cq));
    e->out_mask = oc - 1;
    e->cq_mask = cc - 1;
    e->rd_first = e->rd_last = NONE32;
    if (!e->qps || !e->mrs || !e->out || !e->cq) {
        mre_engine_free(e);
        return NULL;
    }
    if (cfg->credits) {
        if (mre_credit_mgr_init(&e->credit, e->nqps, cfg->credit_link_rate_bps,
                                cfg->credit_base_rtt_ns, cfg->credit_mtu,
                                cfg->credit_min_senders, cfg->credit_idle_ns,
                                cfg->credit_initial_pkts, cfg->credit_liveness_rtos,
                                cfg->credit_pace) < 0) {
            mre_engine_free(e);
            return NULL;
        }
        e->has_credit = 1;
    }
    return e;
}

void mre_engine_free(struct mre_engine *e)
{
    if (!e)
        return;
    if (e->qps)
        for (uint32_t i = 0; i < e->nqps; i++)
            if (e->qps[i].used)
                mre_qp_free(e, i);
    if (e->has_credit)
        mre_credit_mgr_free(&e->credit);
    free(e->qps);
    free(e->mrs);
    free(e->out);
    free(e->cq);
    free(e);
}

static uint32_t mr_slot(uint32_t rkey, uint32_t mask)
{
    uint32_t h = rkey * 0x9E3779B1u;            /* rkeys are random; mix anyway */
    return (h ^ (h >> 16)) & mask;
}

int mre_mr_reg(struct mre_engine *e, uint32_t rkey, uint64_t addr, uint64_t len, uint32_t access,
               uint8_t *mem)
{
    uint32_t max = e->cfg.max_mrs ? e->cfg.max_mrs : 1;
    uint32_t i = mr_slot(rkey, e->mrs_mask);
    while (e->mrs[i].used && e->mrs[i].rkey != rkey)
        i = (i + 1) & e->mrs_mask;
    if (!e->mrs[i].used) {
        if (e->nmrs == max)
            return MRE_E_FULL;
        e->nmrs++;
    }
    e->mrs[i] = (struct mr){1, rkey, access, addr, len, mem};
    return 0;
}

int mre_mr_dereg(struct mre_engine *e, uint32_t rkey)
{
    uint32_t i = mr_slot(rkey, e->mrs_mask);
    while (e->mrs[i].used && e->mrs[i].rkey != rkey)
        i = (i + 1) & e->mrs_mask;
    if (!e->mrs[i].used)
        return MRE_E_INVAL;
    e->nmrs--;
    /* backward-shift deletion: move every later entry of the run that may sit in the hole */
    for (uint32_t j = (i + 1) & e->mrs_mask; e->mrs[j].used; j = (j + 1) & e->mrs_mask) {
        uint32_t home = mr_slot(e->mrs[j].rkey, e->mrs_mask);
        if (((j - home) & e->mrs_mask) >= ((j - i) & e->mrs_mask)) {
            e->mrs[i] = e->mrs[j];
            i = j;
        }
    }
    e->mrs[i].used = 0;
    return 0;
}

const struct mr *eng_mr(const struct mre_engine *e, uint32_t rkey)
{
    uint32_t i = mr_slot(rkey, e->mrs_mask);
    while (e->mrs[i].used) {
        if (e->mrs[i].rkey == rkey)
            return &e->mrs[i];
        i = (i + 1) & e->mrs_mask;
    }
    return NULL;
}

uint32_t mre_credit_grants(struct mre_engine *e)
{
    return e->has_credit ? e->credit.grants : 0;
}

uint32_t mre_credit_max_active(struct mre_engine *e)
{
    return e->has_credit ? e->credit.max_active : 0;
}

/* ---- output and completion rings -------------------------------------------------------- */

struct mre_pkt *eng_out(struct mre_engine *e)
{
    if (e->out_tail - e->out_head > e->out_mask)
        return NULL;
    return &e->out[e->out_tail++ & e->out_mask];
}

int eng_out_room(const struct mre_engine *e)
{
    return e->out_tail - e->out_head <= e->out_mask;
}

void eng_cqe(struct mre_engine *e, struct qp *q, uint64_t wr_id, uint8_t status, uint8_t opcode,
             uint32_t byte_len, uint8_t wc_flags, uint32_t imm)
{
    if (e->cq_tail - e->cq_head > e->cq_mask) {
        e->cq_overruns++;
        return;
    }
    struct mre_cqe *c = &e->cq[e->cq_tail++ & e->cq_mask];
    memset(c, 0, sizeof(*c));
    c->wr_id = wr_id;
    c->status = status;
    c->opcode = opcode;
    c->byte_len = byte_len;
    c->imm = imm;
    c->wc_flags = wc_flags;
    c->qpn = q->qpn;
    c->qp = (uint32_t)(q - e->qps);
}

uint64_t mre_cq_overruns(struct mre_engine *e)
{
    return e->cq_overruns;
}

void eng_rd_activate(struct mre_engine *e, struct qp *q)
{
    uint32_t h = (uint32_t)(q - e->qps);
    if (q->rd_active)
        return;
    q->rd_active = 1;
    q->rd_next_active = NONE32;
    if (e->rd_last == NONE32)
        e->rd_first = h;
    else
        e->qps[e->rd_last].rd_next_active = h;
    e->rd_last = h;
}

int mre_take_tx(struct mre_engine *e, struct mre_pkt *out, int max, int64_t now)
{
    int n = 0;
    while (n < max && e->out_head != e->out_tail)
        out[n++] = e->out[e->out_head++ & e->out_mask];
    while (n < max && e->rd_first != NONE32) {             /* READ responses, QP by QP */
        struct qp *q = &e->qps[e->rd_first];
        n += rd_take(e, q, out + n, max - n);
        if (q->resp.rd_head == q->resp.rd_tail) {
            q->rd_active = 0;
            e->rd_first = q->rd_next_active;
            if (e->rd_first == NONE32)
                e->rd_last = NONE32;
        }
    }
    if (n == 0 && e->txq_blocked) {   /* room again: QPs that stopped on a full ring go on, */
        e->txq_blocked = 0;           /* round robin from where the last scan ran out of room */
        for (uint32_t k = 0, i = e->txq_next % e->nqps; k < e->nqps; k++, i = (i + 1) % e->nqps) {
            if (!eng_out_room(e)) {   /* the ring filled before the scan ended: the QPs not */
                e->txq_blocked = MRE_BLK_TXQ;   /* reached yet wait for the next one (a QP */
                e->txq_next = i;                /* that filled it exactly has not blocked) */
                break;
            }
            struct qp *q = &e->qps[i];
            if (q->used && q->req.blocked == MRE_BLK_TXQ && qp_can_send(q))
                req_pump(e, q, now);
        }
        while (n < max && e->out_head != e->out_tail)
            out[n++] = e->out[e->out_head++ & e->out_mask];
    }
    return n;
}

int mre_take_cqes(struct mre_engine *e, struct mre_cqe *out, int max)
{
    int n = 0;
    while (n < max && e->cq_head != e->cq_tail)
        out[n++] = e->cq[e->cq_head++ & e->cq_mask];
    return n;
}

/* ---- QPs ----------------------------------------------------------------------------------- */

static struct qp *qp_of(struct mre_engine *e, uint32_t h)
{
    return h < e->nqps && e->qps[h].used ? &e->qps[h] : NULL;
}

int mre_qp_new(struct mre_engine *e, const struct mre_qp_cfg *cfg)
{
    uint32_t h = 0;
    while (h < e->nqps && e->qps[h].used)
        h++;
    if (h == e->nqps)
        return MRE_E_FULL;
    if (cfg->paths < 1 || cfg->paths > MRE_MAX_PATHS || cfg->qpn > PSN_MASK)
        return MRE_E_INVAL;
    struct qp *q = &e->qps[h];
    memset(q, 0, sizeof(*q));
    q->cfg = *cfg;
    q->qpn = cfg->qpn;
    q->mode = cfg->mode;
    q->state = MRE_RESET;
    q->attr = (struct mre_qp_attr){0, 0, 0, 1024, 14, 7, 7, 1, 16, 16, 128};
    if (req_alloc(q) < 0 || resp_alloc(q) < 0) {
        req_free(q);
        resp_free(q);
        return MRE_E_FULL;
    }
    req_reset(q);
    resp_reset(q);
    q->used = 1;
    return (int)h;
}

void mre_qp_free(struct mre_engine *e, uint32_t h)
{
    struct qp *q = qp_of(e, h);
    if (!q)
        return;
    if (q->rd_active) {                     /* out of the READ-response list */
        uint32_t *link = &e->rd_first, prev = NONE32;
        while (*link != NONE32 && *link != h) {
            prev = *link;
            link = &e->qps[*link].rd_next_active;
        }
        if (*link == h) {
            *link = q->rd_next_active;
            if (e->rd_last == h)
                e->rd_last = prev;
        }
    }
    req_free(q);
    resp_free(q);
    q->used = 0;
}

static const uint8_t LEGAL[7] = {
    /* RESET */ 1 << MRE_RESET | 1 << MRE_INIT | 1 << MRE_ERR,
    /* INIT */ 1 << MRE_RESET | 1 << MRE_INIT | 1 << MRE_RTR | 1 << MRE_ERR,
    /* RTR */ 1 << MRE_RESET | 1 << MRE_RTS | 1 << MRE_ERR,
    /* RTS */ 1 << MRE_RESET | 1 << MRE_RTS | 1 << MRE_SQD | 1 << MRE_ERR,
    /* SQD */ 1 << MRE_RESET | 1 << MRE_SQD | 1 << MRE_RTS | 1 << MRE_ERR,
    /* SQE */ 1 << MRE_RESET | 1 << MRE_RTS | 1 << MRE_ERR,
    /* ERR */ 1 << MRE_RESET | 1 << MRE_ERR,
};

static int attr_ok(const struct mre_qp_attr *a)
{
    uint32_t m = a->path_mtu;       /* an IB MTU, or a fitted one (CM-14: the caller checks
                                     * that only MetaRoCE QPs get those) */
    if (m < 256 || m > 8192 || m % 64)
        return 0;
    if (a->dest_qpn > PSN_MASK || a->sq_psn > PSN_MASK || a->rq_psn > PSN_MASK)
        return 0;
    if (a->timeout > 31 || a->min_rnr_timer > 31 || a->retry_cnt > 7 || a->rnr_retry > 7)
        return 0;
    return a->window >= 1 && a->window < (1u << 23) && a->max_rd_atomic >= 1;
}

void eng_qp_error(struct mre_engine *e, struct qp *q)
{
    if (q->state == MRE_ERR)
        return;
    q->state = MRE_ERR;
    req_flush(e, q);
    resp_flush(e, q);
}

int mre_qp_modify(struct mre_engine *e, uint32_t h, uint32_t state, const struct mre_qp_attr *a)
{
    struct qp *q = qp_of(e, h);
    if (!q)
        return MRE_E_NOQP;
    if (state > MRE_ERR || !(LEGAL[q->state] >> state & 1))
        return MRE_E_STATE;
    if (!attr_ok(a))
        return MRE_E_INVAL;
    if (q->req.started && req_reserve(q, a->window, 0) < 0)
        return MRE_E_FULL;                  /* a larger window: the scoreboard grows */
    q->attr = *a;
    uint8_t old = q->state;
    q->state = (uint8_t)state;
    if (state == MRE_RTR && old == MRE_INIT) {
        resp_start(q);
        if (!q->resp.started)
            return MRE_E_FULL;
    } else if (state == MRE_RTS && old == MRE_RTR) {
        req_start(e, q);
        if (!q->req.started)
            return MRE_E_FULL;
    } else if (state == MRE_ERR && old != MRE_ERR) {
        q->state = old;
        eng_qp_error(e, q);
    } else if (state == MRE_RESET) {
        req_reset(q);
        resp_reset(q);
    }
    return 0;
}

int mre_qp_to_error(struct mre_engine *e, uint32_t h)
{
    struct qp *q = qp_of(e, h);
    if (!q)
        return MRE_E_NOQP;
    eng_qp_error(e, q);
    return 0;
}

int mre_post_send(struct mre_engine *e, uint32_t h, const struct mre_wqe *w, int64_t now)
{
    struct qp *q = qp_of(e, h);
    if (!q)
        return MRE_E_NOQP;
    if (q->state == MRE_ERR) {
        static const uint8_t WC[7] = {MRE_WC_RDMA_WRITE, MRE_WC_RDMA_WRITE, MRE_WC_SEND,
                                      MRE_WC_SEND, MRE_WC_RDMA_READ, MRE_WC_COMP_SWAP,
                                      MRE_WC_FETCH_ADD};
        eng_cqe(e, q, w->wr_id, MRE_WC_WR_FLUSH_ERR, WC[w->opcode < 7 ? w->opcode : 0], 0, 0, 0);
        return 0;
    }
    if (!qp_can_send(q))
        return MRE_E_STATE;
    int rc = req_post(e, q, w);
    if (rc < 0)
        return rc;
    req_pump(e, q, now);
    return 0;
}

int mre_post_recv(struct mre_engine *e, uint32_t h, uint64_t wr_id, uint8_t *buf, uint32_t len)
{
    struct qp *q = qp_of(e, h);
    if (!q)
        return MRE_E_NOQP;
    if (q->state == MRE_RESET)
        return MRE_E_STATE;
    int rc = resp_post_recv(q, wr_id, buf, len);
    if (rc < 0)
        return rc;
    if (q->state == MRE_ERR)
        resp_flush(e, q);
    return 0;
}

/* ---- input --------------------------------------------------------------------------------- */

static int is_request(uint8_t op)
{
    return op <= 0x0C || op == 0x13 || op == 0x14;
}

void mre_rx(struct mre_engine *e, uint32_t h, const struct mre_pkt *p, int64_t now)
{
    struct qp *q = qp_of(e, h);
    if (!q || p->dest_qp != q->qpn || q->state == MRE_RESET || q->state == MRE_INIT ||
        q->state == MRE_ERR)
        return;
    uint8_t opc = p->opcode;
    struct mre_event ev;
    memset(&ev, 0, sizeof(ev));
    ev.psn = p->psn & PSN_MASK;
    if (opc == OP_CNP) {
        ev.type = MRE_EV_CNP;
        req_event(e, q, &ev, now);
        return;
    }
    if (opc == OP_MR_CREDIT || opc == OP_MR_PROBE) {
        if (!qp_metaroce(q))
            return;
        if (opc == OP_MR_PROBE) {
            resp_on_probe(e, q, p, now);
        } else if (p->has & MRE_H_GRANT) {
            ev.type = MRE_EV_CREDIT;
            ev.flags = p->flags & MRE_PF_GRANT_ACTIVE;
            ev.credit_limit = p->grant_limit;
            ev.rate = p->grant_rate;
            req_event(e, q, &ev, now);
        }
        return;
    }
    int mr = opc >= 0xC0;
    uint8_t op = mr ? (uint8_t)(opc & 0x3F) : opc;
    if (mr && op > 0x14)
        return;                              /* not an opcode of EXT-2 */
    if (is_request(op)) {
        resp_handle(e, q, p, now);
        return;
    }
    if (op < 0x0D || op > 0x12 || !qp_can_send(q) || mr != qp_metaroce(q))
        return;                              /* not a response, or of the other mode */
    ev.syndrome = p->syndrome;
    ev.msn = p->msn;
    if (op == OP_ACK) {
        ev.type = mr ? MRE_EV_SACK : MRE_EV_ACK;
        ev.sack[0] = p->sack[0];
        ev.sack[1] = p->sack[1];
        ev.ts_echo = p->ts_echo;
        ev.ce_count = p->ce_count;
        ev.credit_limit = p->credit_limit;
        ev.path = p->path;
        ev.flags = p->flags & (MRE_PF_ECN_ECHO | MRE_PF_PROBE_REPLY | MRE_PF_CREDIT);
    } else if (op == OP_ATOMIC_ACK) {
        ev.type = MRE_EV_ATOMIC_ACK;
        ev.value = p->atomic_ack;
        ev.flags = MRE_EVF_PLACE;            /* the simulator's NIC places the value */
    } else {
        ev.type = MRE_EV_READ_RESP;
        ev.offset = p->offset;
        ev.len = p->len;
        ev.data = p->data;
    }
    req_event(e, q, &ev, now);
}

void mre_event(struct mre_engine *e, uint32_t h, const struct mre_event *ev, int64_t now)
{
    struct qp *q = qp_of(e, h);
    if (!q || q->state == MRE_RESET || q->state == MRE_INIT || q->state == MRE_ERR)
        return;
    if (ev->type == MRE_EV_RECV || ev->type == MRE_EV_EPSN || ev->type == MRE_EV_READ_REQ)
        resp_event(e, q, ev);
    else
        req_event(e, q, ev, now);
}

/* ---- timers -------------------------------------------------------------------------------- */

static int resp_live(const struct qp *q)
{
    return q->state == MRE_RTR || q->state == MRE_RTS || q->state == MRE_SQD;
}

int64_t mre_qp_deadline(struct mre_engine *e, uint32_t h)
{
    struct qp *q = qp_of(e, h);
    if (!q)
        return -1;
    int64_t d = qp_can_send(q) ? req_deadline(e, q) : -1;
    int64_t s = resp_live(q) ? q->resp.sack_due : -1;
    if (s < 0)
        return d;
    return d < 0 || s < d ? s : d;
}

void mre_on_timer(struct mre_engine *e, uint32_t h, int64_t now)
{
    struct qp *q = qp_of(e, h);
    if (!q)
        return;
    if (q->resp.sack_due >= 0 && now >= q->resp.sack_due && resp_live(q))
        resp_on_sack_timer(e, q, now);
    if (qp_can_send(q))
        req_on_timer(e, q, now);
}

/* ---- introspection --------------------------------------------------------------------------- */

int mre_qp_state(struct mre_engine *e, uint32_t h)
{
    struct qp *q = qp_of(e, h);
    return q ? q->state : MRE_E_NOQP;
}

uint64_t mre_qp_rx_bytes(struct mre_engine *e, uint32_t h)
{
    struct qp *q = qp_of(e, h);
    return q ? q->resp.rx_bytes : 0;
}

uint32_t mre_qp_outstanding(struct mre_engine *e, uint32_t h)
{
    struct qp *q = qp_of(e, h);
    return q ? q->req.sq_tail - q->req.sq_head : 0;
}

uint32_t mre_qp_next_psn(struct mre_engine *e, uint32_t h)
{
    struct qp *q = qp_of(e, h);
    return q ? q->req.nxt : 0;
}

int mre_qp_info(struct mre_engine *e, uint32_t h, struct mre_qp_info *o)
{
    struct qp *q = qp_of(e, h);
    if (!q)
        return MRE_E_NOQP;
    const struct requester *r = &q->req;
    const struct responder *s = &q->resp;
    memset(o, 0, sizeof(*o));
    o->state = q->state;
    o->blocked = r->blocked;
    o->nxt = r->nxt;
    o->una = req_una(q);
    o->high = r->high;
    o->tx_ptr = r->tx_ptr;
    o->epsn = s->epsn;
    o->msn = s->msn;
    o->inflight_bytes = r->inflight_bytes;
    o->cwnd = r->has_cc ? r->cc.cwnd : -1;
    o->max_cwnd = r->has_cc ? r->cc.max_cwnd : -1;
    o->srtt = r->rto.has_srtt ? r->rto.srtt : -1;
    o->rttvar = r->rto.rttvar;
    o->min_rtt = r->rto.min_rtt;
    o->rto_ns = r->started ? mre_rto_ns(&r->rto) : -1;
    o->timeout_ns = r->started ? req_timeout_ns(q) : -1;
    o->rto_max = r->rto.max;
    o->rto_min = r->rto.min;
    o->last_rtt = r->last_rtt;
    o->rto_samples = r->rto.samples;
    o->backoff = r->rto.backoff;
    o->credit_on = r->has_credit;
    o->credit_active = r->credit.active;
    o->credit_limit = r->credit.limit;
    o->dcqcn_on = r->has_dcqcn;
    o->dcqcn_limited = r->has_dcqcn && r->dcqcn.rc < r->dcqcn.line;
    o->dcqcn_rc = r->dcqcn.rc;
    o->tx = r->tx;
    o->retx = r->retx;
    o->timeouts = r->timeouts;
    o->rnr = r->rnr;
    o->rtt_samples = r->rtt_samples;
    o->lost = r->lost;
    o->lost_a = r->lost_a;
    o->lost_b = r->lost_b;
    o->cnp = r->cnp;
    o->probes = r->probes;
    o->tx_bytes = r->tx_bytes;
    o->cc_md = r->cc.md;
    o->cc_loss_cuts = r->cc.loss_cuts;
    o->cc_rto_resets = r->cc.rto_resets;
    o->cc_ecn_path_only = r->cc.ecn_path_only;
    o->r_accept = s->accept;
    o->r_duplicate = s->duplicate;
    o->r_drop = s->drop;
    o->r_nak_seq = s->nak_seq;
    o->r_nak_invalid = s->nak_invalid;
    o->r_nak_access = s->nak_access;
    o->r_rnr = s->rnr;
    o->r_ce = s->ce;
    o->r_cnp = s->cnp;
    o->r_sacks = s->sacks;
    o->r_grants = s->grants;
    o->r_probes = s->probes;
    o->r_rx_bytes = s->rx_bytes;
    o->read_go_backs = s->read_go_backs;
    o->read_pending = s->read_pending;
    o->paths = r->started ? r->paths.n : 0;
    o->path_evictions = r->paths.evictions;
    o->credit_grants = r->credit_grants;
    o->credit_blocked = r->credit_blocked;
    o->read_responses = s->read_responses;
    o->outstanding = r->sq_tail - r->sq_head;
    o->ack_timeouts = r->ack_timeouts;
    o->seq_errs = r->seq_errs;
    o->sacks = r->sacks;
    o->rereads = r->rereads;
    return 0;
}

int mre_path_info(struct mre_engine *e, uint32_t h, uint32_t k, struct mre_path_info *o)
{
    struct qp *q = qp_of(e, h);
    if (!q || !q->req.started || k >= q->req.paths.n || !q->req.paths.p)
        return MRE_E_INVAL;
    const struct mre_path *p = &q->req.paths.p[k];
    o->sport = p->sport;
    o->weight = p->weight;
    o->sent = p->sent;
    o->acked = p->acked;
    o->lost = p->lost;
    o->rtos = p->rtos;
    o->ecn = p->ecn;
    o->srtt = p->srtt;
    o->evictions = p->evictions;
    return 0;
}
