/* The data path's resource tables: registered memory (mapped here, reference counted by the
 * work requests that read from it), CQs and QPs by number, the rings the thread scans, and the
 * control calls that create, connect and destroy them. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include "dp_int.h"

void dp_wake(struct mr_dp *d);

static uint32_t mix(uint32_t k, uint32_t mask)
{
    uint32_t h = k * 0x9E3779B1u;
    return (h ^ (h >> 16)) & mask;
}

static uint32_t pow2(uint32_t n)
{
    uint32_t p = 1;
    while (p < n)
        p <<= 1;
    return p;
}

/* ---- open addressing (linear probing, backward-shift deletion) ------------------------------ */

static struct dp_mr **mr_slot(struct mr_dp *d, uint32_t key)
{
    uint32_t i = mix(key, d->mrs_mask);
    while (d->mrs[i] && d->mrs[i]->key != key)
        i = (i + 1) & d->mrs_mask;
    return &d->mrs[i];
}

static void mr_unlink(struct mr_dp *d, uint32_t key)
{
    uint32_t i = mix(key, d->mrs_mask);
    while (d->mrs[i] && d->mrs[i]->key != key)
        i = (i + 1) & d->mrs_mask;
    if (!d->mrs[i])
        return;
    for (uint32_t j = (i + 1) & d->mrs_mask; d->mrs[j]; j = (j + 1) & d->mrs_mask) {
        uint32_t home = mix(d->mrs[j]->key, d->mrs_mask);
        if (((j - home) & d->mrs_mask) >= ((j - i) & d->mrs_mask)) {
            d->mrs[i] = d->mrs[j];
            i = j;
        }
    }
    d->mrs[i] = NULL;
    d->nmrs--;
}

static struct dp_cq **cq_slot(struct mr_dp *d, uint32_t h)
{
    uint32_t i = mix(h, d->cqs_mask);
    while (d->cqs[i] && d->cqs[i]->handle != h)
        i = (i + 1) & d->cqs_mask;
    return &d->cqs[i];
}

static void cq_unlink(struct mr_dp *d, uint32_t h)
{
    uint32_t i = mix(h, d->cqs_mask);
    while (d->cqs[i] && d->cqs[i]->handle != h)
        i = (i + 1) & d->cqs_mask;
    if (!d->cqs[i])
        return;
    for (uint32_t j = (i + 1) & d->cqs_mask; d->cqs[j]; j = (j + 1) & d->cqs_mask) {
        uint32_t home = mix(d->cqs[j]->handle, d->cqs_mask);
        if (((j - home) & d->cqs_mask) >= ((j - i) & d->cqs_mask)) {
            d->cqs[i] = d->cqs[j];
            i = j;
        }
    }
    d->cqs[i] = NULL;
    d->ncqs--;
}

static uint32_t *qpn_slot(struct mr_dp *d, uint32_t qpn)
{
    uint32_t i = mix(qpn, d->qpn_mask);
    while (d->qpn_idx[i] && d->qps[d->qpn_idx[i] - 1].qpn != qpn)
        i = (i + 1) & d->qpn_mask;
    return &d->qpn_idx[i];
}

static void qpn_unlink(struct mr_dp *d, uint32_t qpn)
{
    uint32_t i = mix(qpn, d->qpn_mask);
    while (d->qpn_idx[i] && d->qps[d->qpn_idx[i] - 1].qpn != qpn)
        i = (i + 1) & d->qpn_mask;
    if (!d->qpn_idx[i])
        return;
    for (uint32_t j = (i + 1) & d->qpn_mask; d->qpn_idx[j]; j = (j + 1) & d->qpn_mask) {
        uint32_t home = mix(d->qps[d->qpn_idx[j] - 1].qpn, d->qpn_mask);
        if (((j - home) & d->qpn_mask) >= ((j - i) & d->qpn_mask)) {
            d->qpn_idx[i] = d->qpn_idx[j];
            i = j;
        }
    }
    d->qpn_idx[i] = 0;
}

struct dp_qp *dp_qp_by_qpn(struct mr_dp *d, uint32_t qpn)
{
    uint32_t v = *qpn_slot(d, qpn);
    return v ? &d->qps[v - 1] : NULL;
}

struct dp_qp *dp_qp_by_eh(struct mr_dp *d, uint32_t eh)
{
    if (eh >= d->nqps || d->by_eh[eh] == DP_NONE)
        return NULL;
    return &d->qps[d->by_eh[eh]];
}

struct dp_mr *dp_mr_find(struct mr_dp *d, uint32_t key)
{
    return *mr_slot(d, key);
}

static struct dp_cq *cq_find(struct mr_dp *d, uint32_t h)
{
    return *cq_slot(d, h);
}

void dp_touch(struct mr_dp *d, struct dp_qp *q)
{
    if (q->touched)
        return;
    q->touched = 1;
    q->next_touched = d->touched;
    d->touched = (uint32_t)(q - d->qps);
}

/* The rings the thread scans: each connected QP's send queue (not a broken one), and the
 * receive queue of a QP in ERR (whatever is posted there is flushed). */
void dp_scan_rebuild(struct mr_dp *d)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < d->nqps; i++) {
        struct dp_qp *q = &d->qps[i];
        if (!q->used || !q->has_rings || q->broken)
            continue;
        if (q->connected || q->err) {
            d->scan[n] = &q->sq;
            d->scan_qi[n] = i;
            d->scan_send[n++] = 1;
        }
        if (q->err) {
            d->scan[n] = &q->rq;
            d->scan_qi[n] = i;
            d->scan_send[n++] = 0;
        }
    }
    d->nscan = n;
    d->scan_stale = 0;
}

/* ---- registered memory ------------------------------------------------------------------------ */

int mr_dp_mr_add(struct mr_dp *d, uint32_t key, uint64_t owner, uint32_t pd, uint64_t addr,
                 uint64_t len, uint32_t access, int map_fd, uint64_t map_bytes)
{
    if (!len || map_bytes < len)
        return MR_DP_E_INVAL;
    void *mem = mmap(NULL, map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, map_fd, 0);
    if (mem == MAP_FAILED)
        return -errno;
    struct dp_mr *m = calloc(1, sizeof(*m));
    if (!m) {
        munmap(mem, map_bytes);
        return MR_DP_E_FULL;
    }
    *m = (struct dp_mr){key, pd, access, 0, owner, addr, len, mem, map_bytes, 0};
    dp_lock(d);
    int rc = 0;
    struct dp_mr **s = mr_slot(d, key);
    if (*s) {
        rc = MR_DP_E_EXIST;
    } else if (d->nmrs >= (d->mrs_mask + 1) / 2) {
        rc = MR_DP_E_FULL;
    } else if (mre_mr_reg(d->e, key, addr, len, access, mem) < 0) {
        rc = MR_DP_E_FULL;
    } else {
        *s = m;
        d->nmrs++;
    }
    dp_unlock(d);
    if (rc) {
        munmap(mem, map_bytes);
        free(m);
    }
    return rc;
}

static void mr_release(struct dp_mr *m)
{
    munmap(m->mem, m->map_bytes);
    free(m);
}

void dp_mr_unref(struct dp_mr *m)
{
    if (--m->refs == 0 && m->dead)
        mr_release(m);
}

int mr_dp_mr_del(struct mr_dp *d, uint32_t key)
{
    dp_lock(d);
    struct dp_mr *m = *mr_slot(d, key);
    if (!m) {
        dp_unlock(d);
        return MR_DP_E_NOENT;
    }
    mr_unlink(d, key);
    mre_mr_dereg(d->e, key);        /* READ responses stop reading it at once */
    m->dead = 1;
    if (!m->refs)
        mr_release(m);               /* else the last work request using it unmaps it */
    dp_unlock(d);
    return 0;
}

/* ---- CQs ----------------------------------------------------------------------------------- */

int mr_dp_cq_add(struct mr_dp *d, uint32_t handle, uint64_t owner, const struct mr_vq *view,
                 uint32_t cqe)
{
    struct dp_cq *c = calloc(1, sizeof(*c));
    if (!c)
        return MR_DP_E_FULL;
    c->handle = handle;
    c->owner = owner;
    c->cqe = cqe;
    if (view) {
        c->ring = 1;
        c->q = *view;
        c->cqe = view->entries;
        c->produced = c->ci = view->head;
    } else {
        c->local = calloc(DP_LOCAL_CQES, sizeof(*c->local));
        if (!c->local) {
            free(c);
            return MR_DP_E_FULL;
        }
    }
    dp_lock(d);
    int rc = 0;
    struct dp_cq **s = cq_slot(d, handle);
    if (*s)
        rc = MR_DP_E_EXIST;
    else if (d->ncqs >= (d->cqs_mask + 1) / 2)
        rc = MR_DP_E_FULL;
    else {
        *s = c;
        d->ncqs++;
    }
    dp_unlock(d);
    if (rc) {
        free(c->local);
        free(c);
    }
    return rc;
}

int mr_dp_cq_del(struct mr_dp *d, uint32_t handle)
{
    dp_lock(d);
    struct dp_cq *c = cq_find(d, handle);
    int rc = MR_DP_E_NOENT;
    if (c) {
        rc = 0;
        for (uint32_t i = 0; i < d->nqps; i++)
            if (d->qps[i].used && (d->qps[i].scq == c || d->qps[i].rcq == c))
                rc = MR_DP_E_EXIST;      /* still used by a QP */
        for (uint32_t i = 0; i < d->ndirty; i++)
            if (d->dirty[i] == c)
                rc = MR_DP_E_EXIST;
        if (!rc) {
            cq_unlink(d, handle);
            free(c->local);
            free(c);
        }
    }
    dp_unlock(d);
    return rc;
}

int mr_dp_cq_take(struct mr_dp *d, uint32_t handle, struct mr_cqe *out, uint32_t max)
{
    dp_lock(d);
    struct dp_cq *c = cq_find(d, handle);
    int n = 0;
    if (!c || c->ring) {
        n = MR_DP_E_NOENT;
    } else {
        while ((uint32_t)n < max && c->local_head != c->local_tail)
            out[n++] = c->local[c->local_head++ % DP_LOCAL_CQES];
    }
    dp_unlock(d);
    return n;
}

int mr_dp_cq_info(struct mr_dp *d, uint32_t handle, struct mr_dp_cq_info *out)
{
    dp_lock(d);
    struct dp_cq *c = cq_find(d, handle);
    if (c) {
        out->cqe = c->cqe;
        out->produced = c->produced;
        out->consumed = c->ci;
        out->overrun = c->overrun;
        out->bad_index = c->bad_index;
        out->dropped = c->dropped;
    }
    dp_unlock(d);
    return c ? 0 : MR_DP_E_NOENT;
}

/* ---- QPs ----------------------------------------------------------------------------------- */

int mr_dp_qp_add(struct mr_dp *d, const struct mr_dp_qp *c, const struct mr_vq *sq,
                 const struct mr_vq *rq)
{
    if (!c->qpn || c->qpn > 0xFFFFFF || !c->max_send_wr || (sq && !rq))
        return MR_DP_E_INVAL;
    uint32_t cap = pow2(c->max_send_wr);
    struct dp_shadow *shadow = calloc(cap, sizeof(*shadow));
    if (!shadow)
        return MR_DP_E_FULL;
    dp_lock(d);
    int rc = 0;
    struct dp_cq *scq = cq_find(d, c->send_cq), *rcq = cq_find(d, c->recv_cq);
    uint32_t *slot = qpn_slot(d, c->qpn);
    uint32_t i = 0;
    while (i < d->nqps && d->qps[i].used)
        i++;
    if (*slot)
        rc = MR_DP_E_EXIST;
    else if (!scq || !rcq)
        rc = MR_DP_E_NOENT;
    else if (i == d->nqps)
        rc = MR_DP_E_FULL;
    if (rc) {
        dp_unlock(d);
        free(shadow);
        return rc;
    }
    struct dp_qp *q = &d->qps[i];
    uint32_t gen = q->gen + 1;
    memset(q, 0, sizeof(*q));
    q->used = 1;
    q->gen = gen;
    q->qpn = c->qpn;
    q->pd = c->pd;
    q->owner = c->owner;
    q->eh = DP_NONE;
    q->scq = scq;
    q->rcq = rcq;
    q->max_send_wr = c->max_send_wr;
    q->max_send_sge = c->max_send_sge;
    q->max_inline = c->max_inline;
    q->rq_entries = c->rq_entries;
    q->shadow = shadow;
    q->shadow_mask = cap - 1;
    q->deadline = -1;
    q->next_touched = DP_NONE;
    q->rd_seen_psn = DP_NONE;
    if (sq) {
        q->has_rings = 1;
        q->sq = *sq;
        q->rq = *rq;
        q->sq.paused = 0;
        q->rq.paused = 0;
        q->rq_done = rq->tail;
    }
    *slot = i + 1;
    dp_unlock(d);
    return 0;
}

static uint64_t seed64(void)
{
    uint64_t s = 0;
    if (getrandom(&s, sizeof(s), 0) != sizeof(s))
        s = (uint64_t)dp_now() * 0x9E3779B97F4A7C15ull;
    return s;
}

int mr_dp_qp_connect(struct mr_dp *d, uint32_t qpn, const struct mr_dp_conn *c)
{
    dp_lock(d);
    struct dp_qp *q = dp_qp_by_qpn(d, qpn);
    int rc = 0;
    if (!q) {
        rc = MR_DP_E_NOENT;
        goto out;
    }
    if (q->connected || q->err || q->eh != DP_NONE) {
        rc = MR_DP_E_EXIST;
        goto out;
    }
    if (c->sq_slot >= d->cfg.sq_psns_entries || c->paths < 1 || c->paths > 8) {
        rc = MR_DP_E_INVAL;
        goto out;
    }
    struct mre_qp_cfg qc = c->engine;    /* its congestion control, as the daemon chose it */
    qc.qpn = qpn;
    qc.mode = c->mode;
    qc.paths = c->mode == MRE_METAROCE ? c->paths : 1;
    qc.credits = c->mode == MRE_METAROCE && c->credit;
    qc.credit_sack = 1;                 /* the XDP data path signals credit by SACK flag C */
    qc.hold_overlap = 1;                /* its responder places WRITEs before READs read */
    qc.breaks = 0;
    qc.sq_cap = q->max_send_wr;
    qc.rq_cap = q->rq_entries ? q->rq_entries : 256;
    qc.min_rto_ns = d->cfg.min_rto_ns;
    qc.seed = seed64();
    int h = mre_qp_new(d->e, &qc);
    if (h < 0) {
        rc = h == MRE_E_FULL ? MR_DP_E_FULL : MR_DP_E_INVAL;
        goto out;
    }
    struct mre_qp_attr a = c->attr;
    if (mre_qp_modify(d->e, (uint32_t)h, MRE_INIT, &a) < 0 ||
        mre_qp_modify(d->e, (uint32_t)h, MRE_RTR, &a) < 0 ||
        mre_qp_modify(d->e, (uint32_t)h, MRE_RTS, &a) < 0) {
        mre_qp_free(d->e, (uint32_t)h);
        rc = MR_DP_E_INVAL;
        goto out;
    }
    q->eh = (uint32_t)h;
    d->by_eh[h] = (uint32_t)(q - d->qps);
    q->mode = c->mode;
    q->flow = c->flow;
    q->sq_slot = c->sq_slot;
    q->remote_qpn = c->remote_qpn;
    q->nxt_stored = mre_qp_next_psn(d->e, (uint32_t)h);
    __atomic_store_n(&d->sq_psns[q->sq_slot], (uint64_t)q->nxt_stored, __ATOMIC_RELEASE);
    q->connected = 1;
    dp_scan_rebuild(d);
    dp_touch(d, q);
out:
    dp_unlock(d);
    if (!rc)
        dp_wake(d);                      /* a sleeping thread scans the new ring too */
    return rc;
}

int mr_dp_qp_del(struct mr_dp *d, uint32_t qpn)
{
    dp_lock(d);
    struct dp_qp *q = dp_qp_by_qpn(d, qpn);
    if (!q) {
        dp_unlock(d);
        return MR_DP_E_NOENT;
    }
    /* destroyed: its outstanding work and posted receives are flushed into its CQs first
     * (the QP goes to ERR on its way out, as on a verbs device) */
    if (q->eh != DP_NONE) {
        mre_qp_to_error(d->e, q->eh);
        dp_deliver(d);
    }
    dp_qp_to_err(d, q, NULL);
    dp_publish(d);
    if (q->eh != DP_NONE) {
        mre_qp_free(d->e, q->eh);        /* nothing more is completed for it */
        d->by_eh[q->eh] = DP_NONE;
        q->eh = DP_NONE;
    }
    dp_release_shadow(d, q, q->posted);
    if (q->touched) {                    /* out of this round's list */
        uint32_t me = (uint32_t)(q - d->qps);
        uint32_t *link = &d->touched;
        while (*link != DP_NONE && *link != me)
            link = &d->qps[*link].next_touched;
        if (*link == me)
            *link = q->next_touched;
    }
    qpn_unlink(d, qpn);
    free(q->shadow);
    uint32_t gen = q->gen;
    memset(q, 0, sizeof(*q));
    q->gen = gen;                        /* its timers are stale from now on */
    q->eh = DP_NONE;
    q->next_touched = DP_NONE;
    dp_scan_rebuild(d);
    dp_unlock(d);
    return 0;
}

int mr_dp_qp_info(struct mr_dp *d, uint32_t qpn, struct mr_dp_qp_info *out)
{
    memset(out, 0, sizeof(*out));
    dp_lock(d);
    struct dp_qp *q = dp_qp_by_qpn(d, qpn);
    if (!q) {
        dp_unlock(d);
        return MR_DP_E_NOENT;
    }
    if (q->eh != DP_NONE)
        mre_qp_info(d->e, q->eh, &out->e);
    out->connected = q->connected;
    out->err = q->err;
    if (q->has_rings && !q->broken && !q->err) {
        uint32_t prod = __atomic_load_n(&q->sq.hdr->prod, __ATOMIC_ACQUIRE);
        uint32_t un = prod - q->sq.head;
        out->unfetched = un > q->sq.entries ? q->sq.entries : un;
    }
    out->sq_taken = q->posted - q->released;
    out->wqes = q->wqes;
    out->bad_wqes = q->bad_wqes;
    out->sent_packets = q->sent_packets;
    out->sent_bytes = q->sent_bytes;
    out->rd_slots = q->rd_slots;
    out->recv_completions = q->recv_completions;
    dp_unlock(d);
    return 0;
}

int mr_dp_path_info(struct mr_dp *d, uint32_t qpn, uint32_t k, struct mre_path_info *out)
{
    dp_lock(d);
    struct dp_qp *q = dp_qp_by_qpn(d, qpn);
    int rc = q && q->eh != DP_NONE ? mre_path_info(d->e, q->eh, k, out) : MR_DP_E_NOENT;
    dp_unlock(d);
    return rc;
}

uint32_t mr_dp_path_pkts(struct mr_dp *d, uint32_t qpn, uint32_t k)
{
    dp_lock(d);
    struct dp_qp *q = dp_qp_by_qpn(d, qpn);
    uint32_t n = q && k < 8 ? q->flow.path_pkts[k] : 0;
    dp_unlock(d);
    return n;
}
