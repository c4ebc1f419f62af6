/* The requester: segments work requests into packets, tracks PSNs (a scoreboard per transmitted
 * PSN, SACK-4), retransmits (go-back-N in compat mode, selective repeat with path-aware loss
 * detection in MetaRoCE mode, SACK-5), runs the retransmission timer (RESP-8, RTO-1 .. RTO-3)
 * and completes WQEs in posting order. Transmission gates, in req_pump: PSN window (CC-5),
 * congestion window (CC-1), receiver credit (CC-8) and pacing (DCQCN in compat mode; cwnd/SRTT
 * or the credit rate in MetaRoCE mode, CC-6). Reference model: metaroce/engine/requester.py. */
#include <stdlib.h>
#include <string.h>

#include "mre_int.h"

static const uint32_t RNR_TIMER_USEC[32] = {
    655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920, 2560,
    3840, 5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122880, 163840,
    245760, 327680, 491520,
};

#define CREDIT_INITIAL_PKTS 2  /* CC-8: before the first SACK, without a credit manager */
#define CREDIT_LIVENESS_RTOS 4 /* CC-9: probe after 4 x RTO blocked, without a credit manager */

static inline struct wqe *sqw(struct requester *r, uint32_t abs)
{
    return &r->sq[abs & r->sq_mask];
}

static inline uint32_t wpsn(const struct wqe *w, uint32_t idx)
{
    return psn_add(w->first_psn, idx);
}

static inline uint32_t hq(const struct mre_engine *e, const struct qp *q)
{
    return (uint32_t)(q - e->qps);
}

/* The scoreboard entry of a transmitted PSN still tracked (NULL: not sent, or retired). */
static struct sb_ent *sb_lookup(struct qp *q, uint32_t psn)
{
    struct requester *r = &q->req;
    if (r->sq_head == r->sq_infl)
        return NULL;
    if (!psn_between(sqw(r, r->sq_head)->first_psn, psn, r->high))
        return NULL;
    struct sb_ent *s = &r->sb[psn & r->sb_mask];
    return s->valid && s->psn == psn ? s : NULL;
}

/* The WQE (absolute index) whose PSN range holds psn, NONE32 if none. */
static uint32_t wqe_of(struct qp *q, uint32_t psn)
{
    struct requester *r = &q->req;
    uint32_t lo = r->sq_head, hi = r->sq_infl;
    if (lo == hi)
        return NONE32;
    uint32_t base = sqw(r, lo)->first_psn, d = psn_dist(psn, base);
    if (d >= psn_dist(r->nxt, base))
        return NONE32;
    while (hi - lo > 1) {                /* last WQE with first_psn <= psn */
        uint32_t mid = lo + (hi - lo) / 2;
        if (psn_dist(sqw(r, mid)->first_psn, base) <= d)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

static uint32_t tx_wqe(struct qp *q)
{
    struct requester *r = &q->req;
    for (uint32_t c = r->tx_wqe; c - r->sq_head < r->sq_infl - r->sq_head && c - r->tx_wqe < 2; c++) {
        struct wqe *w = sqw(r, c);
        if (psn_dist(r->tx_ptr, w->first_psn) < w->npkts)
            return r->tx_wqe = c;
    }
    return r->tx_wqe = wqe_of(q, r->tx_ptr);
}

uint32_t req_una(const struct qp *q)
{
    const struct requester *r = &q->req;
    for (uint32_t c = r->sq_head; c != r->sq_infl; c++) {
        const struct wqe *w = &r->sq[c & r->sq_mask];
        if (w->una_idx < w->npkts)
            return wpsn(w, w->una_idx);
    }
    return r->nxt;
}

uint16_t req_sport0(const struct qp *q)
{
    return q->req.started ? q->req.paths.p[0].sport : 0;
}

static int64_t pkt_bytes(const struct qp *q, const struct wqe *w, uint32_t idx)
{
    if (w->needs_response)
        return 0;
    int64_t mtu = q->attr.path_mtu, left = (int64_t)w->wr.length - (int64_t)idx * mtu;
    if (left < 0)
        left = 0;
    return (left < mtu ? left : mtu) + HDR_BYTES;
}

static int in_window(const struct qp *q, uint32_t psn)
{
    const struct requester *r = &q->req;
    return r->sq_head != r->sq_infl &&
           psn_between(r->sq[r->sq_head & r->sq_mask].first_psn, psn, r->nxt);
}

static double srtt_or0(const struct requester *r)
{
    return r->rto.has_srtt ? r->rto.srtt : 0.0;
}

/* ---- allocation and start ------------------------------------------------------------------ */

static uint32_t pow2(uint32_t n)
{
    uint32_t p = 1;
    while (p < n)
        p <<= 1;
    return p;
}

int req_alloc(struct qp *q)
{
    struct requester *r = &q->req;
    uint32_t cap = pow2(q->cfg.sq_cap ? q->cfg.sq_cap : 1);
    r->sq = calloc(cap, sizeof(*r->sq));
    if (!r->sq)
        return -1;
    r->sq_mask = cap - 1;
    r->sq_cap = q->cfg.sq_cap ? q->cfg.sq_cap : 1;
    return 0;
}

static void req_free_window(struct requester *r)
{
    free(r->sb);
    free(r->rtxq);
    free(r->scratch);
    r->sb = NULL;
    r->rtxq = NULL;
    r->scratch = NULL;
}

void req_free(struct qp *q)
{
    free(q->req.sq);
    q->req.sq = NULL;
    req_free_window(&q->req);
    mre_paths_free(&q->req.paths);
}

/* Arrays sized by the window and the largest READ: every PSN a lookup can still ask for (from the
 * first PSN of the oldest WQE, at most n_max below una, up to high, below una + W + n_max since a
 * request is sent only within the window above una, SACK-9) has its own entry. Growing keeps the
 * live entries (the newest PSNs) and the retransmission queue. */
static uint32_t sb_size_for(uint32_t window, uint32_t read_max)
{
    uint32_t need = window + (window > 2 * read_max ? window : 2 * read_max);
    return pow2(need < 256 ? 256 : need);
}

static void sb_rehash(struct requester *r, struct qp *q, struct sb_ent *sb, uint32_t size)
{
    if (!r->started || r->sq_head == r->sq_infl)
        return;
    uint32_t span = psn_dist(r->high, sqw(r, r->sq_head)->first_psn);   /* [first, high) */
    for (uint32_t k = 1; k <= span && k <= size; k++) {     /* the newest PSNs */
        struct sb_ent *s = sb_lookup(q, psn_add(r->high, -(int64_t)k));
        if (s)
            sb[s->psn & (size - 1)] = *s;
    }
}

int req_reserve(struct qp *q, uint32_t window, uint32_t read_max)
{
    struct requester *r = &q->req;
    uint32_t rmax = read_max > r->read_max ? read_max : r->read_max, size = sb_size_for(window, rmax);
    if (!r->sb || size > r->sb_mask + 1) {
        struct sb_ent *sb = calloc(size, sizeof(*sb));
        uint32_t *rtxq = malloc(sizeof(*rtxq) * size * 2);
        uint32_t *scratch = malloc(sizeof(*scratch) * size);
        if (!sb || !rtxq || !scratch) {
            free(sb);
            free(rtxq);
            free(scratch);
            return -1;
        }
        uint32_t nq = 0;
        if (r->sb) {
            sb_rehash(r, q, sb, size);
            for (uint32_t i = r->rtxq_head; i != r->rtxq_tail; i++)
                rtxq[nq++] = r->rtxq[i & r->rtxq_mask];
        }
        req_free_window(r);
        r->sb = sb;
        r->rtxq = rtxq;
        r->scratch = scratch;
        r->sb_mask = size - 1;
        r->rtxq_mask = 2 * size - 1;
        r->rtxq_head = 0;
        r->rtxq_tail = nq;
    }
    r->read_max = rmax;
    return 0;
}

void req_reset(struct qp *q)
{
    struct requester *r = &q->req;
    struct wqe *sq = r->sq;
    uint32_t sq_mask = r->sq_mask, sq_cap = r->sq_cap;
    struct sb_ent *sb = r->sb;
    uint32_t *rtxq = r->rtxq, *scratch = r->scratch, sb_mask = r->sb_mask, rm = r->rtxq_mask;
    mre_paths_free(&r->paths);
    memset(r, 0, sizeof(*r));
    r->sq = sq;
    r->sq_mask = sq_mask;
    r->sq_cap = sq_cap;
    r->sb = sb;
    r->rtxq = rtxq;
    r->scratch = scratch;
    r->sb_mask = sb_mask;
    r->rtxq_mask = rm;
    if (sb)
        memset(sb, 0, sizeof(*sb) * (sb_mask + 1));
    r->timer_base = r->rnr_until = r->gbn_psn = -1;
    r->evidence = -1;
    r->high_sacked = r->sack_horizon = -1;
    r->last_rtt = -1;
    r->min_rto_ns = q->cfg.min_rto_ns;
    r->tx_wqe = 0;
    r->pacer.burst = 2;
}

static int64_t ack_timeout_ns(const struct qp *q)
{
    return q->attr.timeout == 0 ? -1 : (int64_t)4096 << q->attr.timeout;
}

void req_start(struct mre_engine *e, struct qp *q)
{
    struct requester *r = &q->req;
    const struct mre_qp_cfg *c = &q->cfg;
    if (req_reserve(q, q->attr.window, 0) < 0)
        return;
    r->nxt = r->tx_ptr = r->high = q->attr.sq_psn;
    r->ask_psn = -1;
    int64_t to = ack_timeout_ns(q), rto_max = to > 0 ? to : RTO_MAX_INFINITE_NS;
    mre_rto_init(&r->rto, rto_max, r->min_rto_ns, rto_max, RTO_G_NS);   /* RTO-1, RTO-4 */
    if (mre_paths_init(&r->paths, qp_metaroce(q) ? c->paths : 1, q->qpn, q->attr.dest_qpn,
                       c->seed) < 0)
        return;
    if (c->cc) {
        if (qp_metaroce(q)) {
            r->has_cc = 1;
            mre_wcc_init(&r->cc, c->cc_line_rate_bps, c->cc_base_rtt_ns, c->cc_target_qdelay_ns,
                         c->cc_bdp_factor, c->cc_alpha, c->cc_beta, c->cc_max_mdf,
                         c->cc_enabled, q->attr.path_mtu);
        } else if (c->dcqcn) {
            r->has_dcqcn = 1;
            mre_dcqcn_init(&r->dcqcn, c->cc_line_rate_bps, 1, c->dcqcn_g, c->dcqcn_alpha_timer_ns,
                           c->dcqcn_rate_timer_ns, c->dcqcn_byte_counter, c->dcqcn_fast_steps,
                           c->dcqcn_ai_bps, c->dcqcn_hai_bps, c->dcqcn_min_bps);
        }
    }
    if (qp_metaroce(q) && c->credits && (e->has_credit || c->credit_sack)) {
        r->has_credit = 1;      /* CC-8: a sender with the CREDIT capability starts limited */
        mre_gate_init(&r->credit, q->attr.sq_psn,
                      e->has_credit ? e->credit.initial_pkts : CREDIT_INITIAL_PKTS);
    }
    r->started = 1;
}

/* ---- posting -------------------------------------------------------------------------------- */

int req_post(struct mre_engine *e, struct qp *q, const struct mre_wqe *in)
{
    (void)e;
    struct requester *r = &q->req;
    if (r->sq_tail - r->sq_head >= r->sq_cap)
        return MRE_E_FULL;
    int atomic = in->opcode == MRE_WR_ATOMIC_CMP_AND_SWP || in->opcode == MRE_WR_ATOMIC_FETCH_AND_ADD;
    if (in->opcode > MRE_WR_ATOMIC_FETCH_AND_ADD)
        return MRE_E_INVAL;
    uint32_t n = atomic ? 1 : npackets(in->length, q->attr.path_mtu);
    if (in->opcode == MRE_WR_RDMA_READ && n > r->read_max &&   /* SACK-9: any READ length */
        req_reserve(q, q->attr.window, n) < 0)
        return MRE_E_FULL;
    struct wqe *w = sqw(r, r->sq_tail);
    memset(w, 0, sizeof(*w));
    w->wr = *in;
    if (atomic)
        w->wr.length = 8;
    w->npkts = n;
    w->ssn = r->ssn;
    w->rsn = r->rsn;
    w->status = 0xFF;
    w->is_read = in->opcode == MRE_WR_RDMA_READ;
    w->needs_response = (uint8_t)(w->is_read || atomic);
    r->ssn = (r->ssn + 1) & MSN_MASK;
    if (in->opcode == MRE_WR_SEND || in->opcode == MRE_WR_SEND_WITH_IMM ||
        in->opcode == MRE_WR_RDMA_WRITE_WITH_IMM)
        r->rsn = (r->rsn + 1) & MSN_MASK;
    r->sq_tail++;
    return 0;
}

static void assign(struct qp *q)
{
    struct requester *r = &q->req;
    struct wqe *w = sqw(r, r->sq_infl);
    w->first_psn = r->nxt;
    w->nacked = w->una_idx = w->nseen = 0;
    r->nxt = psn_add(r->nxt, w->npkts);
    r->sq_infl++;
    if (w->needs_response)
        r->rd_outstanding++;
}

/* ---- completion ------------------------------------------------------------------------------ */

static uint8_t wc_opcode(uint8_t wr)
{
    switch (wr) {
    case MRE_WR_RDMA_WRITE:
    case MRE_WR_RDMA_WRITE_WITH_IMM:
        return MRE_WC_RDMA_WRITE;
    case MRE_WR_SEND:
    case MRE_WR_SEND_WITH_IMM:
        return MRE_WC_SEND;
    case MRE_WR_RDMA_READ:
        return MRE_WC_RDMA_READ;
    case MRE_WR_ATOMIC_CMP_AND_SWP:
        return MRE_WC_COMP_SWAP;
    default:
        return MRE_WC_FETCH_ADD;
    }
}

static void complete(struct mre_engine *e, struct qp *q, const struct wqe *w, uint8_t status)
{
    if (status == MRE_WC_SUCCESS && !(w->wr.send_flags & MRE_SEND_SIGNALED))
        return;
    eng_cqe(e, q, w->wr.wr_id, status, wc_opcode(w->wr.opcode),
            status == MRE_WC_SUCCESS ? w->wr.length : 0, 0, 0);
}

static void fail(struct mre_engine *e, struct qp *q, uint32_t wabs, uint8_t status)
{
    struct requester *r = &q->req;
    if (wabs != NONE32 && wabs - r->sq_head < r->sq_infl - r->sq_head)
        sqw(r, wabs)->status = status;
    eng_qp_error(e, q);
}

/* A READ or atomic before WQE wabs still waits for its response. */
static int responses_due(struct qp *q, uint32_t wabs)
{
    struct requester *r = &q->req;
    for (uint32_t c = r->sq_head; c != wabs && c != r->sq_infl; c++) {
        const struct wqe *w = sqw(r, c);
        if (w->needs_response && w->nacked < w->npkts)
            return 1;
    }
    return 0;
}

/* A fatal NAK (RESP-5). The responder executed every request before the failing one
 * (RESP-10), but on the wire its READ responses come from its daemon and may leave after its
 * kernel sent the NAK: those complete first and only the failing WQE and later ones fail
 * (ERR-1). Nothing is sent meanwhile; one timeout (1 s if infinite) bounds the wait. */
static void fail_nak(struct mre_engine *e, struct qp *q, uint32_t wabs, uint8_t status,
                     int64_t now)
{
    struct requester *r = &q->req;
    if (wabs != NONE32 && wabs - r->sq_head < r->sq_infl - r->sq_head && responses_due(q, wabs)) {
        int64_t t = req_timeout_ns(q);
        r->fatal_wait = 1;
        r->fatal_wqe = wabs;
        r->fatal_status = status;
        r->fatal_until = now + (t > 0 ? t : 1000000000);
        return;
    }
    fail(e, q, wabs, status);
}

static void retire(struct mre_engine *e, struct qp *q)
{
    struct requester *r = &q->req;
    while (r->sq_head != r->sq_infl) {
        struct wqe *w = sqw(r, r->sq_head);
        if (w->nacked != w->npkts)
            break;
        r->sq_head++;
        if (r->gbn_psn >= 0 && !in_window(q, (uint32_t)r->gbn_psn))
            r->gbn_psn = -1;
        complete(e, q, w, MRE_WC_SUCCESS);
    }
    uint32_t una = req_una(q);
    if (psn_diff(r->tx_ptr, una) < 0)
        r->tx_ptr = una;
}

void req_flush(struct mre_engine *e, struct qp *q)
{
    struct requester *r = &q->req;
    for (uint32_t c = r->sq_head; c != r->sq_tail; c++) {
        struct wqe *w = sqw(r, c);
        complete(e, q, w, w->status != 0xFF ? w->status : MRE_WC_WR_FLUSH_ERR);
    }
    r->sq_head = r->sq_infl = r->sq_tail;
    r->rtxq_head = r->rtxq_tail = 0;
    r->inflight_bytes = 0;
    r->rd_outstanding = 0;
    r->timer_base = r->rnr_until = -1;
}

/* ---- acknowledgement bookkeeping --------------------------------------------------------------- */

static void wqe_ack(struct qp *q, struct wqe *w, struct sb_ent *s)
{
    if (s->acked)
        return;
    s->acked = 1;
    w->nacked++;
    while (w->una_idx < w->npkts) {
        struct sb_ent *x = sb_lookup(q, wpsn(w, w->una_idx));
        if (!x || !x->acked)
            break;
        w->una_idx++;
    }
    if (w->nacked == w->npkts && w->needs_response && q->req.rd_outstanding)
        q->req.rd_outstanding--;
}

static void acked(struct qp *q, struct wqe *w, struct sb_ent *s)
{
    wqe_ack(q, w, s);
    if (s->infl) {
        s->infl = 0;
        q->req.inflight_bytes -= pkt_bytes(q, w, s->idx);
    }
}

static void mark_seen(struct wqe *w, struct sb_ent *s)
{
    if (!s->seen) {
        s->seen = 1;
        w->nseen++;
    }
}

static void go_back(struct qp *q, uint32_t psn)
{
    struct requester *r = &q->req;
    if (r->gbn_psn == (int64_t)psn || !in_window(q, psn))
        return;
    if (psn_diff(psn, r->tx_ptr) < 0) {
        r->tx_ptr = psn;
        r->gbn_psn = psn;
    }
}

/* Cumulative ACK of every PSN up to psn; an unanswered READ/ATOMIC before it means its
 * response was lost (compat: an implied NAK, go back to it). */
static int ack_through(struct qp *q, uint32_t psn)
{
    struct requester *r = &q->req;
    int progress = 0;
    for (uint32_t c = r->sq_head; c != r->sq_infl; c++) {
        struct wqe *w = sqw(r, c);
        for (uint32_t i = w->una_idx; i < w->npkts; i++) {
            uint32_t p = wpsn(w, i);
            if (psn_diff(p, psn) > 0)
                return progress;
            struct sb_ent *s = sb_lookup(q, p);
            if (!s)
                return progress;          /* never sent: nothing to acknowledge */
            if (s->acked)
                continue;
            if (w->needs_response) {
                if (qp_metaroce(q)) {
                    mark_seen(w, s);
                    continue;
                }
                go_back(q, p);
                return progress;
            }
            acked(q, w, s);
            progress = 1;
        }
    }
    return progress;
}

static void rnr(struct mre_engine *e, struct qp *q, uint32_t code, int64_t now)
{
    struct requester *r = &q->req;
    r->rnr++;
    r->rnr_retries++;
    if (q->attr.rnr_retry != 7 && r->rnr_retries > (int32_t)q->attr.rnr_retry) {
        fail(e, q, r->sq_head, MRE_WC_RNR_RETRY_EXC_ERR);
        return;
    }
    r->rnr_until = now + (int64_t)RNR_TIMER_USEC[code & 31] * 1000;
}

static uint8_t nak_status(uint32_t code)
{
    switch (code) {
    case 1:
    case 4:
        return MRE_WC_REM_INV_REQ_ERR;
    case 2:
        return MRE_WC_REM_ACCESS_ERR;
    default:
        return MRE_WC_REM_OP_ERR;
    }
}

/* Karn's rule: only packets transmitted exactly once give an RTT sample. */
static void sample(struct requester *r, const struct sb_ent *s, int64_t now)
{
    if (s->retx == 0) {
        mre_rto_sample(&r->rto, now - s->sent_at);
        r->rtt_samples++;
    }
}

/* ---- transmission ---------------------------------------------------------------------------- */

static double pace_rate(const struct qp *q)
{
    const struct requester *r = &q->req;
    if (r->has_dcqcn)
        return r->dcqcn.rc < r->dcqcn.line ? r->dcqcn.rc : 0.0;
    double rate = 0.0;
    if (r->has_cc && r->cc.cwnd < 4.0 * q->attr.path_mtu) {
        double srtt = r->rto.has_srtt && r->rto.srtt != 0.0 ? r->rto.srtt : (double)r->cc.base_rtt;
        rate = r->cc.cwnd * 8e9 / (srtt >= 1.0 ? srtt : 1.0);      /* CC-6 */
    }
    if (r->has_credit && r->credit.active && r->credit.rate_mbps) {
        double cr = r->credit.rate_mbps * 1e6;
        rate = rate == 0.0 ? cr : (rate <= cr ? rate : cr);
    }
    return rate;
}

/* Why the packet cannot leave now (MRE_BLK_NONE: it can). */
static uint8_t gate(struct qp *q, const struct wqe *w, uint32_t idx, int64_t now, int is_new)
{
    struct requester *r = &q->req;
    if (r->has_cc) {
        int64_t size = pkt_bytes(q, w, idx);
        if (size && r->inflight_bytes && (double)(r->inflight_bytes + size) > r->cc.cwnd)
            return MRE_BLK_CWND;
    }
    if (is_new && r->has_credit && !(q->cfg.breaks & MRE_BREAK_IGNORE_CREDIT) &&
        !mre_gate_allows(&r->credit, wpsn(w, idx)))
        return MRE_BLK_CREDIT;
    if (r->has_dcqcn)
        mre_dcqcn_advance(&r->dcqcn, now);
    double rate = pace_rate(q);
    if (rate != 0.0 && now < r->pacer.next_ns)
        return MRE_BLK_PACE;
    return MRE_BLK_NONE;
}

static uint32_t pick_path(struct requester *r, uint32_t breaks, int avoid)
{
    if (breaks & MRE_BREAK_NO_SPRAY) {
        r->paths.p[0].sent++;
        return 0;
    }
    return mre_paths_pick(&r->paths, avoid);
}

static uint8_t seg_opcode(int send, uint32_t idx, uint32_t n, int imm)
{
    uint8_t base = send ? OP_SEND_FIRST : OP_WRITE_FIRST;   /* FIRST MIDDLE LAST LAST_IMM ONLY ONLY_IMM */
    if (n == 1)
        return (uint8_t)(base + (imm ? 5 : 4));
    if (idx == 0)
        return base;
    if (idx == n - 1)
        return (uint8_t)(base + (imm ? 3 : 2));
    return (uint8_t)(base + 1);
}

/* Emit the packet for PSN slot idx of WQE wabs (a READ from idx covers the rest of it).
 * Returns 0 when the output ring is full (nothing changed). */
static int req_send(struct mre_engine *e, struct qp *q, uint32_t wabs, uint32_t idx, int64_t now,
                    int retx)
{
    struct requester *r = &q->req;
    struct mre_pkt *p = eng_out(e);
    if (!p)
        return 0;
    struct wqe *w = sqw(r, wabs);
    uint32_t mtu = q->attr.path_mtu, psn = wpsn(w, idx);
    int mr = qp_metaroce(q);
    struct sb_ent *prev = retx ? sb_lookup(q, psn) : NULL;
    uint32_t k = pick_path(r, q->cfg.breaks, retx ? (prev ? prev->path : 0) : -1);
    struct mre_path *path = &r->paths.p[k];
    if (path->born < 0)
        path->born = r->tx_seq;
    memset(p, 0, sizeof(*p));
    p->qp = hq(e, q);
    p->dest_qp = q->attr.dest_qpn;
    p->psn = psn;
    p->path = (uint8_t)k;
    p->sport = path->sport;
    p->ts = (uint32_t)now;
    p->wr_id = w->wr.wr_id;
    p->wqe = wabs;
    if (retx)
        p->flags |= MRE_PF_RETX;
    if (mr) {
        p->has |= MRE_H_PETH;
        p->ssn = w->ssn;
        p->rsn = w->rsn;
        p->offset = idx * mtu;
    }
    uint32_t last_touched = idx;
    uint8_t op = w->wr.opcode;
    if (op == MRE_WR_RDMA_READ) {
        r->rereads += retx != 0;
        p->opcode = mode_op(q, OP_READ_REQ);
        p->flags |= MRE_PF_ACK_REQ;
        p->has |= MRE_H_RETH;
        p->reth_va = w->wr.remote_addr + (uint64_t)idx * mtu;
        p->reth_rkey = w->wr.rkey;
        int64_t left = (int64_t)w->wr.length - (int64_t)idx * mtu;
        p->reth_len = left > 0 ? (uint32_t)left : 0;
        last_touched = w->npkts - 1;
    } else if (op == MRE_WR_ATOMIC_CMP_AND_SWP || op == MRE_WR_ATOMIC_FETCH_AND_ADD) {
        int cas = op == MRE_WR_ATOMIC_CMP_AND_SWP;
        p->opcode = mode_op(q, cas ? OP_CMP_SWAP : OP_FETCH_ADD);
        p->flags |= MRE_PF_ACK_REQ;
        p->has |= MRE_H_ATOMIC;
        p->atomic_va = w->wr.remote_addr;
        p->atomic_rkey = w->wr.rkey;
        p->swap_add = cas ? w->wr.swap : w->wr.compare_add;
        p->compare = cas ? w->wr.compare_add : 0;
    } else {
        int send = op == MRE_WR_SEND || op == MRE_WR_SEND_WITH_IMM;
        int imm = op == MRE_WR_SEND_WITH_IMM || op == MRE_WR_RDMA_WRITE_WITH_IMM;
        int last = idx == w->npkts - 1;
        p->opcode = mode_op(q, seg_opcode(send, idx, w->npkts, imm));
        if (!send && (mr || idx == 0)) {
            p->has |= MRE_H_RETH;
            p->reth_va = w->wr.remote_addr;
            p->reth_rkey = w->wr.rkey;
            p->reth_len = w->wr.length;
        }
        if (last || retx || (idx + 1) % ACK_REQ_EVERY == 0)
            p->flags |= MRE_PF_ACK_REQ;
        if (last && imm) {
            p->has |= MRE_H_IMM;
            p->imm = w->wr.imm;
        }
        if (last && send && (w->wr.send_flags & MRE_SEND_SOLICITED))
            p->se = 1;
        int64_t left = (int64_t)w->wr.length - (int64_t)idx * mtu;
        p->len = left <= 0 ? 0 : (left < mtu ? (uint32_t)left : mtu);
        p->data = (const uint8_t *)(uintptr_t)w->wr.local + (uint64_t)idx * mtu;
    }
    for (uint32_t i = idx; i <= last_touched; i++) {
        uint32_t pi = wpsn(w, i);
        struct sb_ent *s = &r->sb[pi & r->sb_mask];
        if (sb_lookup(q, pi) == s) {
            s->retx++;
        } else {
            memset(s, 0, sizeof(*s));
            s->psn = pi;
            s->wqe = wabs;
            s->idx = i;
            s->valid = 1;
        }
        s->sent_at = now;
        s->sent_seq = r->tx_seq;
        s->path = (uint8_t)k;
    }
    r->last_desc = e->out_tail - 1;
    if (p->flags & MRE_PF_ACK_REQ)
        r->ask_psn = psn;
    r->tx_seq++;
    if (retx)
        r->retx++;
    else
        r->tx++;
    int64_t size = pkt_bytes(q, w, idx);
    r->tx_bytes += (uint64_t)size;
    struct sb_ent *s = &r->sb[psn & r->sb_mask];
    if (size && !s->infl && !s->acked) {
        s->infl = 1;
        r->inflight_bytes += size;
    }
    double rate = pace_rate(q);
    if (rate != 0.0)
        mre_pacer_sent(&r->pacer, now, size ? size : HDR_BYTES, rate);
    if (r->has_dcqcn)
        mre_dcqcn_on_sent(&r->dcqcn, size);
    if ((q->cfg.breaks & MRE_BREAK_COMPLETE_BEFORE_ACK) && !w->needs_response &&
        sb_lookup(q, wpsn(w, w->npkts - 1))) {
        for (uint32_t i = 0; i < w->npkts; i++) {      /* "done" once every packet was sent */
            struct sb_ent *x = sb_lookup(q, wpsn(w, i));
            if (x)
                x->acked = 1;
        }
        w->nacked = w->una_idx = w->npkts;
    }
    return 1;
}

static void arm(struct qp *q, int64_t now)
{
    struct requester *r = &q->req;
    if (psn_diff(r->high, req_una(q)) <= 0)
        r->timer_base = -1;
    else if (r->timer_base < 0)
        r->timer_base = now;
}

static void rtxq_push(struct requester *r, uint32_t psn)
{
    if (r->rtxq_tail - r->rtxq_head > r->rtxq_mask)
        return;                     /* cannot happen: each PSN is queued once (the RTO covers) */
    r->rtxq[r->rtxq_tail++ & r->rtxq_mask] = psn;
}

/* hold_overlap: a WRITE or atomic whose remote bytes overlap those of an earlier READ still
 * waiting for its responses. The wire's responder places a WRITE (and executes an atomic) on
 * arrival in its kernel but builds a READ's responses from memory later, in its daemon: sent
 * now, the WRITE could change bytes the READ must return as they were (RESP-10: a responder
 * executes in PSN order). Such a WR waits, with everything posted after it, until the READ has
 * its data (a fence for overlapping bytes only). test_control_fuzz found it: READ 124 bytes
 * from X, then WRITE 1 byte at X + 117. */
static int behind_a_read(struct qp *q, const struct wqe *nw)
{
    struct requester *r = &q->req;
    if (!r->rd_outstanding || nw->is_read)
        return 0;
    uint64_t lo = nw->wr.remote_addr, hi = lo + (nw->needs_response ? 8 : nw->wr.length);
    if (hi == lo)
        return 0;
    for (uint32_t c = r->sq_head; c != r->sq_infl; c++) {
        const struct wqe *w = sqw(r, c);
        if (w->is_read && w->nacked < w->npkts && w->wr.rkey == nw->wr.rkey &&
            w->wr.remote_addr < hi && lo < w->wr.remote_addr + w->wr.length)
            return 1;
    }
    return 0;
}

/* RESP-1: a packet sent with AckReq that the cumulative PSN has not passed yet. Its answer
 * reopens a closed window, so the edge need not ask as well: a full window whose every SACK
 * opens one PSN would otherwise make every packet an ask and every ask a SACK. */
static int ask_outstanding(const struct qp *q)
{
    const struct requester *r = &q->req;
    return r->ask_psn >= 0 && psn_diff((uint32_t)r->ask_psn, req_una(q)) >= 0;
}

void req_pump(struct mre_engine *e, struct qp *q, int64_t now)
{
    struct requester *r = &q->req;
    r->blocked = MRE_BLK_NONE;
    if (r->rnr_until >= 0 || !r->started || r->fatal_wait)
        return;
    while (r->rtxq_head != r->rtxq_tail) {
        uint32_t psn = r->rtxq[r->rtxq_head & r->rtxq_mask];
        struct sb_ent *s = sb_lookup(q, psn);
        struct wqe *w = s ? sqw(r, s->wqe) : NULL;
        if (!s || s->acked || w->status != 0xFF || s->seen) {
            r->rtxq_head++;
            if (s)
                s->queued = 0;
            continue;
        }
        uint8_t why = gate(q, w, s->idx, now, 0);
        if (!why && !eng_out_room(e))
            why = e->txq_blocked = MRE_BLK_TXQ;
        if (why) {
            r->blocked = why;
            arm(q, now);
            return;
        }
        r->rtxq_head++;
        s->queued = 0;
        req_send(e, q, s->wqe, s->idx, now, 1);
    }
    uint32_t window = q->attr.window, una = req_una(q), sent = 0;
    for (;;) {
        if (r->tx_ptr == r->nxt) {
            if (r->sq_infl == r->sq_tail || q->state != MRE_RTS)
                break;
            struct wqe *nw = sqw(r, r->sq_infl);
            if (nw->needs_response && r->rd_outstanding >= q->attr.max_rd_atomic)
                break;
            if (q->cfg.hold_overlap && behind_a_read(q, nw)) {
                r->blocked = MRE_BLK_ORDER;
                break;
            }
            assign(q);
        }
        uint32_t wabs = tx_wqe(q);
        struct wqe *w = sqw(r, wabs);
        uint32_t idx = psn_dist(r->tx_ptr, w->first_psn);
        uint32_t span = w->is_read ? w->npkts - idx : 1;
        if (psn_dist(r->tx_ptr, una) >= window) {     /* SACK-9: the request's PSN, not its */
            r->blocked = MRE_BLK_WINDOW;              /* responses', must be inside */
            break;
        }
        int retx = sb_lookup(q, r->tx_ptr) != NULL;
        uint8_t why = gate(q, w, idx, now, !retx);
        if (!why && !eng_out_room(e))
            why = e->txq_blocked = MRE_BLK_TXQ;
        if (why) {
            r->blocked = why;
            break;
        }
        sent += req_send(e, q, wabs, idx, now, retx);
        r->tx_ptr = psn_add(r->tx_ptr, span);
        if (psn_diff(r->tx_ptr, r->high) > 0)
            r->high = r->tx_ptr;
    }
    if (sent && (r->blocked == MRE_BLK_WINDOW || r->blocked == MRE_BLK_CWND ||
                 r->blocked == MRE_BLK_CREDIT) && r->last_desc - e->out_head <= e->out_mask &&
        !ask_outstanding(q)) {           /* the edge asks (RESP-1) unless an ask is on its way */
        struct mre_pkt *p = &e->out[r->last_desc & e->out_mask];
        p->flags |= MRE_PF_ACK_REQ;
        r->ask_psn = p->psn;
    }
    if (r->has_credit) {
        if (r->blocked == MRE_BLK_CREDIT) {
            r->credit_blocked++;
            if (r->credit.blocked_since < 0)
                r->credit.blocked_since = now;
        } else {
            r->credit.blocked_since = -1;
        }
    }
    arm(q, now);
}

/* ---- MetaRoCE selective repeat ------------------------------------------------------------- */

/* Every sent PSN with no evidence of arrival, one per READ (its first missing response), oldest
 * first, not those already queued for retransmission. With limit >= 0, SEND/WRITE holes stop
 * at PSN limit (READs and atomics are all listed). */
static uint32_t holes(struct qp *q, uint32_t *out, int64_t limit)
{
    struct requester *r = &q->req;
    uint32_t n = 0, cap = r->sb_mask + 1;
    for (uint32_t c = r->sq_head; c != r->sq_infl; c++) {
        struct wqe *w = sqw(r, c);
        if (w->is_read) {
            if (w->nacked < w->npkts && w->nseen == 0 && sb_lookup(q, w->first_psn) && n < cap)
                out[n++] = wpsn(w, w->una_idx);
            continue;
        }
        if (limit >= 0 && !w->needs_response && psn_diff(wpsn(w, w->una_idx),
                                                           (uint32_t)limit) > 0)
            continue;
        for (uint32_t i = w->una_idx; i < w->npkts; i++) {
            struct sb_ent *s = sb_lookup(q, wpsn(w, i));
            if (!s)
                return n;             /* first transmissions go in PSN order */
            if (limit >= 0 && !w->needs_response && psn_diff(s->psn, (uint32_t)limit) > 0)
                break;
            if (!s->acked && !s->seen && !s->queued && n < cap)
                out[n++] = s->psn;
        }
    }
    return n;
}

static void lose(struct qp *q, struct sb_ent *s, int64_t now)
{
    struct requester *r = &q->req;
    struct wqe *w = sqw(r, s->wqe);
    double srtt = srtt_or0(r);
    r->lost++;
    if (s->infl) {
        s->infl = 0;
        int64_t size = pkt_bytes(q, w, s->idx);
        r->inflight_bytes -= size;
        if (r->has_cc)
            mre_wcc_on_loss(&r->cc, now, size, srtt);
    }
    mre_paths_on_loss(&r->paths, s->path, now, srtt);
    s->queued = 1;
    rtxq_push(r, s->psn);
}

/* SACK-5: (a) a later transmission on the same path was SACKed and RTT_min/4 passed; (b) a
 * later transmission on any path was SACKed, the PSN is REORDER_THRESHOLD below the furthest
 * SACKed PSN and max(SRTT + 2 RTTVAR, 1.5 path SRTT, 1.25 latest RTT) passed. */
static void detect_losses(struct mre_engine *e, struct qp *q, int64_t now)
{
    struct requester *r = &q->req;
    if ((q->cfg.breaks & MRE_BREAK_NO_HOLE_RETRANSMIT) || r->rnr_until >= 0)
        return;
    int64_t min_rtt = r->rto.min_rtt > 0 ? r->rto.min_rtt : 0;
    int has_srtt = r->rto.has_srtt;
    int64_t recency = has_srtt ? (int64_t)(r->rto.srtt + 2 * r->rto.rttvar) : 0;
    double last_rtt = r->last_rtt > 0 ? (double)r->last_rtt : 0.0;
    /* A SEND/WRITE hole beyond the furthest SACKed PSN is lost by neither rule: (b) needs it
     * 16 below; (a) needs a never-retransmitted packet sent after it SACKed, and such a packet
     * has a higher PSN than the hole's first transmission, so it is at most the furthest. */
    uint32_t *h = r->scratch, nh = holes(q, h, r->high_sacked), nlost = 0;
    for (uint32_t j = 0; j < nh; j++) {
        struct sb_ent *s = sb_lookup(q, h[j]);
        struct wqe *w = sqw(r, s->wqe);
        int64_t seq = s->sent_seq, age = now - s->sent_at;
        if (seq >= r->evidence)
            continue;
        if (r->sack_horizon >= 0 && psn_diff(h[j], (uint32_t)r->sack_horizon) > 0)
            break;                    /* beyond every SACK bitmap so far */
        if (w->needs_response) {
            if (age >= min_rtt / 4)
                h[nlost++] = h[j];
            continue;
        }
        struct mre_path *p = &r->paths.p[s->path];
        double psrtt = p->srtt > 0 ? p->srtt : 0.0;
        if (p->born >= 0 && p->born <= seq && seq < p->evidence && age >= min_rtt / 4) {
            h[nlost++] = h[j];
            r->lost_a++;
        } else if (has_srtt && r->high_sacked >= 0 &&
                   psn_diff((uint32_t)r->high_sacked, h[j]) >= REORDER_THRESHOLD) {
            double need = (double)recency;
            if (1.5 * psrtt > need)
                need = 1.5 * psrtt;
            if (1.25 * last_rtt > need)
                need = 1.25 * last_rtt;
            if ((double)age >= need) {
                h[nlost++] = h[j];
                r->lost_b++;
            }
        }
    }
    for (uint32_t j = 0; j < nlost; j++) {
        struct sb_ent *s = sb_lookup(q, h[j]);
        if (!s)
            continue;
        if (sqw(r, s->wqe)->needs_response)
            req_send(e, q, s->wqe, s->idx, now, 1);
        else
            lose(q, s, now);
    }
}

/* RTO (or the end of an RNR wait): queue every hole, oldest first, and re-request missing
 * responses; the queue drains as the congestion window allows (one MTU after an RTO). */
static void retransmit_all(struct mre_engine *e, struct qp *q, int64_t now)
{
    struct requester *r = &q->req;
    int broken = (q->cfg.breaks & MRE_BREAK_NO_HOLE_RETRANSMIT) != 0;
    uint32_t *h = r->scratch, nh = holes(q, h, -1);
    for (uint32_t j = 0; j < nh; j++) {
        struct sb_ent *s = sb_lookup(q, h[j]);
        if (!s)
            continue;
        struct wqe *w = sqw(r, s->wqe);
        if (broken && s->sent_seq < r->evidence)
            continue;
        if (w->needs_response) {
            req_send(e, q, s->wqe, s->idx, now, 1);
            continue;
        }
        if (s->infl) {
            s->infl = 0;
            r->inflight_bytes -= pkt_bytes(q, w, s->idx);
        }
        s->queued = 1;
        rtxq_push(r, s->psn);
    }
    for (uint32_t c = r->sq_head; c != r->sq_infl; c++) {
        struct wqe *w = sqw(r, c);
        if (w->needs_response && w->nacked < w->npkts && w->nseen > 0)
            req_send(e, q, c, w->una_idx, now, 1);
    }
}

/* ---- feedback ----------------------------------------------------------------------------------- */

static int on_ack(struct mre_engine *e, struct qp *q, const struct mre_event *ev, int64_t now)
{
    struct requester *r = &q->req;
    uint32_t typ = ev->syndrome & 0x60, val = ev->syndrome & 0x1F, psn = ev->psn & PSN_MASK;
    if (typ == 0x00)
        return in_window(q, psn) ? ack_through(q, psn) : 0;
    uint32_t prev = psn_add(psn, -1);
    int progress = in_window(q, prev) ? ack_through(q, prev) : 0;
    if (!in_window(q, psn))
        return progress;
    if (typ == 0x20) {
        rnr(e, q, val, now);
        if (q->state == MRE_ERR)
            return progress;
        r->gbn_psn = -1;
        go_back(q, psn);
    } else if (typ == 0x60) {
        if (val == 0) {
            r->seq_errs++;
            go_back(q, psn);
        }
        else
            fail_nak(e, q, wqe_of(q, psn), nak_status(val), now);
    }
    return progress;
}

static void cover(struct qp *q, struct wqe *w, struct sb_ent *s, uint32_t *newly, uint32_t *n)
{
    if (w->needs_response) {
        mark_seen(w, s);
    } else if (!s->acked) {
        acked(q, w, s);
        newly[(*n)++] = s->psn;
    }
}

static int on_sack(struct mre_engine *e, struct qp *q, const struct mre_event *ev, int64_t now)
{
    struct requester *r = &q->req;
    uint32_t typ = ev->syndrome & 0x60, val = ev->syndrome & 0x1F, cum = ev->psn & PSN_MASK;
    if (typ == 0x60) {
        uint32_t prev = psn_add(cum, -1);
        int progress = in_window(q, prev) ? ack_through(q, prev) : 0;
        if (in_window(q, cum))
            fail_nak(e, q, wqe_of(q, cum), nak_status(val), now);
        return progress;
    }
    uint32_t *newly = r->scratch, n = 0;
    r->sacks++;
    for (uint32_t c = r->sq_head; c != r->sq_infl; c++) {      /* cumulative part */
        struct wqe *w = sqw(r, c);
        if (psn_diff(w->first_psn, cum) > 0)
            break;
        for (uint32_t i = w->needs_response ? 0 : w->una_idx; i < w->npkts; i++) {
            uint32_t p = wpsn(w, i);
            if (psn_diff(p, cum) > 0)
                break;
            struct sb_ent *s = sb_lookup(q, p);
            if (!s)
                break;
            cover(q, w, s, newly, &n);
        }
    }
    uint32_t far = cum;
    for (uint32_t word = 0; word < 2; word++) {                  /* bit i = PSN cum + 2 + i */
        for (uint64_t bits = ev->sack[word]; bits; bits &= bits - 1) {
            uint32_t p = psn_add(cum, 2 + word * 64 + (uint32_t)__builtin_ctzll(bits));
            struct sb_ent *s = sb_lookup(q, p);
            if (s) {
                cover(q, sqw(r, s->wqe), s, newly, &n);
                far = p;
            }
        }
    }
    if (r->high_sacked < 0 || psn_diff(far, (uint32_t)r->high_sacked) > 0)
        r->high_sacked = far;
    uint32_t horizon = psn_add(cum, 1 + SACK_BITS);   /* the last PSN this SACK can report */
    if (r->sack_horizon < 0 || psn_diff(horizon, (uint32_t)r->sack_horizon) > 0)
        r->sack_horizon = horizon;
    int64_t acked_bytes = 0;
    struct sb_ent *best = NULL;
    int64_t best_key = 0;
    for (uint32_t j = 0; j < n; j++) {
        struct sb_ent *s = &r->sb[newly[j] & r->sb_mask];
        int64_t seq = s->sent_seq;
        if (seq > r->evidence)
            r->evidence = seq;
        if (s->path < r->paths.n) {
            struct mre_path *p = &r->paths.p[s->path];
            if (seq > p->evidence && s->retx == 0)
                p->evidence = seq;      /* only never-retransmitted packets are evidence */
        }
        acked_bytes += pkt_bytes(q, sqw(r, s->wqe), s->idx);
        int64_t key = s->sent_at ? s->sent_at : -1;
        if (!best || key > best_key) {
            best = s;
            best_key = key;
        }
    }
    uint32_t d = (uint32_t)((uint64_t)now - ev->ts_echo);        /* CC-2: RTT from the echo */
    int64_t rtt = d > 0x80000000u ? -1 : (int64_t)d;
    if (n) {
        if (rtt >= 0) {
            mre_rto_sample(&r->rto, rtt);            /* RTO-1: echoes identify the copy */
            r->rtt_samples++;
        } else {
            sample(r, best, now);
        }
    }
    uint32_t dce = ev->ce_count - r->last_ce;
    int ecn = (ev->flags & MRE_PF_ECN_ECHO) || (ev->ce_count != r->last_ce && dce < 0x80000000u);
    if (dce < 0x80000000u)
        r->last_ce = ev->ce_count;
    if (rtt >= 0)
        r->last_rtt = rtt;
    mre_paths_on_ack(&r->paths, ev->path, rtt, ecn, now);
    if (ecn)
        mre_paths_congested(&r->paths, ev->path);   /* MP-3: the path's weight falls */
    if (r->has_cc)
        mre_wcc_on_ack(&r->cc, now, acked_bytes, rtt, ecn, srtt_or0(r));
    if (r->has_credit && q->cfg.credit_sack) {
        /* the wire's signalling: flag C starts or refreshes credit mode, no flag ends it */
        if (ev->flags & MRE_PF_CREDIT) {
            uint32_t lim = ev->credit_limit & PSN_MASK;
            if (!r->credit.active || psn_diff(lim, r->credit.limit) > 0) {
                r->credit.active = 1;
                r->credit.limit = lim;
                r->credit_grants++;
            }
            r->credit.last_grant = now;
        } else if (r->credit.active) {
            r->credit.active = 0;
            r->credit.last_grant = now;
        }
    } else if (r->has_credit) {
        if (ev->flags & MRE_PF_CREDIT) {
            uint32_t before = r->credit.limit;
            mre_gate_refresh(&r->credit, ev->credit_limit & PSN_MASK, now);
            r->credit_grants += r->credit.limit != before;
        } else if ((ev->flags & MRE_PF_PROBE_REPLY) && r->credit.active) {
            r->credit.active = 0;       /* CC-9: the probe's answer says credit mode is off */
            r->credit.last_grant = now;
        }
    }
    if (typ == 0x20)
        rnr(e, q, val, now);
    return n > 0;
}

/* A response to a READ/atomic: (wqe, entry) if it answers an unanswered request. Compat mode
 * takes responses in order only (an earlier missing one: go back to it). */
static struct sb_ent *on_response(struct qp *q, uint32_t psn, int want_read)
{
    struct requester *r = &q->req;
    struct sb_ent *s = sb_lookup(q, psn);
    if (!s)
        return NULL;
    struct wqe *w = sqw(r, s->wqe);
    int is_atomic = w->needs_response && !w->is_read;
    if ((want_read ? !w->is_read : !is_atomic) || s->acked)
        return NULL;
    if (!qp_metaroce(q)) {
        if (w->una_idx < s->idx) {
            go_back(q, wpsn(w, w->una_idx));
            return NULL;
        }
        ack_through(q, psn_add(w->first_psn, -1));
    }
    return s;
}

static void mark_response(struct qp *q, struct sb_ent *s, int64_t now)
{
    struct requester *r = &q->req;
    struct wqe *w = sqw(r, s->wqe);
    acked(q, w, s);
    mark_seen(w, s);
    sample(r, s, now);
    if (s->sent_seq > r->evidence)
        r->evidence = s->sent_seq;
}

static int on_read_response(struct qp *q, const struct mre_event *ev, int64_t now)
{
    struct requester *r = &q->req;
    struct sb_ent *s = on_response(q, ev->psn & PSN_MASK, 1);
    if (!s)
        return 0;
    struct wqe *w = sqw(r, s->wqe);
    int64_t mtu = q->attr.path_mtu, off = (int64_t)s->idx * mtu;
    if (qp_metaroce(q) && ev->offset != (uint64_t)off)
        return 0;                       /* PLACE-4: the offset of this PSN only */
    int64_t exp = w->wr.length ? (int64_t)w->wr.length - off : 0;
    if (exp > mtu)
        exp = mtu;
    if ((int64_t)ev->len != (exp > 0 ? exp : 0))
        return 0;
    if (ev->data && ev->len)
        memcpy((uint8_t *)(uintptr_t)w->wr.local + off, ev->data, ev->len);
    mark_response(q, s, now);
    return 1;
}

static int on_atomic_ack(struct qp *q, const struct mre_event *ev, int64_t now)
{
    struct requester *r = &q->req;
    struct sb_ent *s = on_response(q, ev->psn & PSN_MASK, 0);
    if (!s)
        return 0;
    struct wqe *w = sqw(r, s->wqe);
    if ((ev->flags & MRE_EVF_PLACE) && w->wr.local) {           /* place the original value (little endian) */
        uint8_t *dst = (uint8_t *)(uintptr_t)w->wr.local;
        for (int i = 0; i < 8; i++)
            dst[i] = (uint8_t)(ev->value >> (8 * i));
    }
    mark_response(q, s, now);
    return 1;
}

/* The wire's data path took a READ's responses in order up to psn (READ_DONE: psn arrived;
 * READ_GAP: psn is missing and later ones came): mark them; on a gap, re-read from psn at once
 * (SACK-8; RESP-4 lets the re-read start inside the response). */
static int on_read_progress(struct mre_engine *e, struct qp *q, uint32_t psn, int gap,
                            int64_t now)
{
    struct requester *r = &q->req;
    struct sb_ent *s = sb_lookup(q, psn);
    if (!s || !sqw(r, s->wqe)->is_read)
        return 0;
    uint32_t wabs = s->wqe, upto = gap ? s->idx : s->idx + 1;
    struct wqe *w = sqw(r, wabs);
    /* RESP-10: what precedes is acknowledged, in both modes — the kernel took it so (its
     * una moved past it), so later SACKs of those PSNs say nothing new and raise no event */
    if (upto > w->una_idx)
        ack_through(q, psn_add(w->first_psn, -1));
    int progress = 0;
    for (uint32_t i = w->una_idx; i < upto; i++) {
        struct sb_ent *x = sb_lookup(q, wpsn(w, i));
        if (x && !x->acked) {
            mark_response(q, x, now);
            progress = 1;
        }
    }
    if (gap && w->nacked < w->npkts && q->state != MRE_ERR) {
        r->seq_errs++;
        req_send(e, q, wabs, s->idx, now, 1);
    }
    return progress;
}

static void on_cnp(struct mre_engine *e, struct qp *q, int64_t now)
{
    struct requester *r = &q->req;
    r->cnp++;
    if (r->has_dcqcn)
        mre_dcqcn_on_cnp(&r->dcqcn, now);
    else if (r->has_cc)
        mre_wcc_on_ack(&r->cc, now, 0, r->last_rtt, 1, srtt_or0(r));   /* CC-7 */
    req_pump(e, q, now);
}

static void on_grant(struct mre_engine *e, struct qp *q, const struct mre_event *ev, int64_t now)
{
    struct requester *r = &q->req;
    if (!r->has_credit)
        return;
    if (mre_gate_on_grant(&r->credit, ev->psn & PSN_MASK, (ev->flags & MRE_PF_GRANT_ACTIVE) != 0,
                          ev->credit_limit & PSN_MASK, ev->rate, now)) {
        r->credit_grants++;
        r->credit.blocked_since = -1;
        req_pump(e, q, now);
    }
}

void req_event(struct mre_engine *e, struct qp *q, const struct mre_event *ev, int64_t now)
{
    struct requester *r = &q->req;
    if (!r->started || !qp_can_send(q))
        return;
    int progress = 0;
    switch (ev->type) {
    case MRE_EV_CNP:
        on_cnp(e, q, now);
        return;
    case MRE_EV_CREDIT:
        if (qp_metaroce(q))
            on_grant(e, q, ev, now);
        return;
    case MRE_EV_SACK:
        if (qp_metaroce(q))
            progress = on_sack(e, q, ev, now);
        break;
    case MRE_EV_ACK:
        if (!qp_metaroce(q))
            progress = on_ack(e, q, ev, now);
        break;
    case MRE_EV_READ_RESP:
        progress = on_read_response(q, ev, now);
        break;
    case MRE_EV_ATOMIC_ACK:
        progress = on_atomic_ack(q, ev, now);
        break;
    case MRE_EV_LOCAL_ERR:
        if (in_window(q, ev->psn & PSN_MASK))
            fail(e, q, wqe_of(q, ev->psn & PSN_MASK), ev->status);
        return;
    case MRE_EV_READ_DONE:
    case MRE_EV_READ_GAP:
        progress = on_read_progress(e, q, ev->psn & PSN_MASK, ev->type == MRE_EV_READ_GAP, now);
        break;
    default:
        return;
    }
    if (q->state == MRE_ERR)
        return;
    if (r->fatal_wait) {
        retire(e, q);
        if (!responses_due(q, r->fatal_wqe))
            fail(e, q, r->fatal_wqe, r->fatal_status);
        return;
    }
    if (progress) {
        r->retries = 0;
        r->rnr_retries = 0;                /* RESP-6: rnr_retry counts NAKs of the same PSN */
        r->rto.backoff = 0;
        r->timer_base = now;
    }
    retire(e, q);
    if (qp_metaroce(q))
        detect_losses(e, q, now);
    req_pump(e, q, now);
}

/* ---- timers ---------------------------------------------------------------------------------- */

int64_t req_timeout_ns(const struct qp *q)
{
    const struct requester *r = &q->req;
    if (!qp_metaroce(q))
        return ack_timeout_ns(q);
    int64_t t = mre_rto_ns(&r->rto);
    if (r->has_cc && r->rto.has_srtt && psn_dist(r->high, req_una(q)) <= TAIL_PKTS) {
        int64_t low = (int64_t)(2 * r->rto.srtt);           /* RTO-3 */
        if (low < r->rto.min)
            low = r->rto.min;
        low <<= r->rto.backoff < 16 ? r->rto.backoff : 16;
        if (low < t)
            t = low;
        if (r->rto.max < t)
            t = r->rto.max;
    }
    return t;
}

static int64_t credit_probe_at(const struct mre_engine *e, const struct qp *q)
{
    const struct requester *r = &q->req;
    if (!r->has_credit || r->blocked != MRE_BLK_CREDIT || r->credit.blocked_since < 0)
        return -1;
    int64_t since = r->credit.blocked_since, lg = r->credit.last_grant > 0 ?
                    r->credit.last_grant : r->credit.blocked_since;
    if (lg > since)
        since = lg;
    /* without a credit manager (the wire: credit by SACK flag C) the spec's 4 x RTO; its
     * liveness_rtos was 0 there, so a blocked sender probed at once, every probe let one more
     * packet go, and credits bounded nothing (16:1 incast overflowed the queue) */
    uint32_t k = e->has_credit ? e->credit.liveness_rtos : CREDIT_LIVENESS_RTOS;
    return since + (int64_t)k * mre_rto_ns(&r->rto);
}

static int64_t mind(int64_t a, int64_t b)
{
    return a < 0 ? b : (b < 0 || a < b ? a : b);
}

int64_t req_deadline(const struct mre_engine *e, struct qp *q)
{
    struct requester *r = &q->req;
    if (!r->started)
        return -1;
    if (r->fatal_wait)
        return r->fatal_until;
    int64_t d = -1;
    if (r->rnr_until >= 0)
        d = r->rnr_until;
    int64_t t = req_timeout_ns(q);
    if (r->timer_base >= 0 && t >= 0 && r->rnr_until < 0)
        d = mind(d, r->timer_base + t);
    if (r->blocked == MRE_BLK_PACE && r->rnr_until < 0)
        d = mind(d, r->pacer.next_ns);
    d = mind(d, credit_probe_at(e, q));
    return d;
}

static void credit_probe(struct mre_engine *e, struct qp *q, int64_t now)
{
    struct requester *r = &q->req;
    struct mre_credit_gate *c = &r->credit;
    c->blocked_since = now;
    c->probes++;
    c->limit = psn_add(c->limit, 1);       /* CC-9: one new packet may go with the probe */
    r->probes++;
    if (q->cfg.credit_sack)
        return;     /* the wire's XDP responder has no MR_PROBE: the packet the limit now lets
                     * go is the edge of the window and asks (RESP-1); its SACK says C or not */
    uint32_t k = pick_path(r, q->cfg.breaks, -1);
    struct mre_pkt *p = eng_out(e);
    if (!p)
        return;
    memset(p, 0, sizeof(*p));
    p->qp = hq(e, q);
    p->dest_qp = q->attr.dest_qpn;
    p->opcode = OP_MR_PROBE;
    p->psn = r->nxt;
    p->flags = MRE_PF_ACK_REQ;
    p->has = MRE_H_PETH;
    p->ts = (uint32_t)now;
    p->path = (uint8_t)k;
    p->sport = r->paths.p[k].sport;
}

void req_on_timer(struct mre_engine *e, struct qp *q, int64_t now)
{
    struct requester *r = &q->req;
    if (!r->started)
        return;
    if (r->fatal_wait) {
        if (now >= r->fatal_until)          /* they never came: flushed with the rest */
            fail(e, q, r->fatal_wqe, r->fatal_status);
        return;
    }
    if (r->rnr_until >= 0) {
        if (now < r->rnr_until)
            return;
        r->rnr_until = -1;
        r->timer_base = now;
        if (qp_metaroce(q))
            retransmit_all(e, q, now);
        req_pump(e, q, now);
        return;
    }
    int64_t probe = credit_probe_at(e, q);
    if (probe >= 0 && now >= probe) {
        credit_probe(e, q, now);
        req_pump(e, q, now);
    }
    int64_t t = req_timeout_ns(q);
    if (r->timer_base < 0 || t < 0 || now < r->timer_base + t) {
        if (r->blocked == MRE_BLK_PACE && now >= r->pacer.next_ns)
            req_pump(e, q, now);
        return;
    }
    r->timeouts++;
    if (!qp_metaroce(q) || (mre_rto_ns(&r->rto) >= r->rto.max && q->attr.timeout != 0)) {
        r->retries++;          /* RTO-2: only expiries at RTO_max count; RTO-4: none if infinite */
        r->ack_timeouts++;
    }
    if (r->retries > (int32_t)q->attr.retry_cnt) {
        fail(e, q, r->sq_head, MRE_WC_RETRY_EXC_ERR);
        return;
    }
    r->timer_base = now;
    if (qp_metaroce(q)) {
        r->rto.backoff++;
        uint32_t *h = r->scratch, nh = holes(q, h, -1);
        if (nh) {
            struct sb_ent *s = sb_lookup(q, h[0]);
            if (s)
                mre_paths_on_rto(&r->paths, s->path, now);    /* RTO-2, MP-5 */
        }
        if (r->has_cc)
            mre_wcc_on_rto(&r->cc, now);
        retransmit_all(e, q, now);
    } else {
        r->gbn_psn = -1;
        go_back(q, req_una(q));
    }
    req_pump(e, q, now);
}
