/* Work requests: copied out of the applications' send rings in batches (before anything looks
 * at them: the application may rewrite its ring at any moment), checked by the rules of
 * metaroce/nic/wqe.py (the library applies the same ones before it posts; this check is the one
 * that counts), translated into the engine's work requests and posted. A WQE the rules refuse
 * completes with its error status and moves its QP to ERR, as on a verbs device; nothing of
 * another QP, application or the daemon is touched. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp_int.h"

struct bad {
    uint8_t status;
    char why[120];
};

/* The region an SGE lies in (the QP's owner's, in its PD, with the access it needs), or NULL
 * with the reason. */
static struct dp_mr *sge_mr(struct mr_dp *d, const struct dp_qp *q, const struct mr_sge *s,
                            uint32_t need, struct bad *b)
{
    struct dp_mr *m = dp_mr_find(d, s->lkey);
    b->status = WC_LOC_PROT_ERR;
    if (!m || m->owner != q->owner || m->pd != q->pd) {
        snprintf(b->why, sizeof(b->why), "lkey 0x%08x is not a region of this QP's PD", s->lkey);
        return NULL;
    }
    if (need && !(m->access & need)) {
        snprintf(b->why, sizeof(b->why), "lkey 0x%08x lacks local write access", s->lkey);
        return NULL;
    }
    if (s->addr < m->addr || s->length > m->len || s->addr - m->addr > m->len - s->length) {
        snprintf(b->why, sizeof(b->why), "SGE [0x%llx, %u] is outside lkey 0x%08x",
                 (unsigned long long)s->addr, s->length, s->lkey);
        return NULL;
    }
    return m;
}

/* Check one WQE (slot: the adapter's copy) and fill the engine's work request and the shadow;
 * 0, or -1 with the reason. */
static int translate(struct mr_dp *d, struct dp_qp *q, const uint8_t *slot, uint32_t stride,
                     struct mre_wqe *w, struct dp_shadow *sh, struct bad *b)
{
    const struct mr_send_wqe *h = (const void *)slot;
    const struct mr_sge *sges = (const void *)(slot + MR_WQE_DATA);
    uint32_t room = (stride - MR_WQE_DATA) / sizeof(struct mr_sge);
    memset(w, 0, sizeof(*w));
    memset(sh, 0, sizeof(*sh));
    w->wr_id = h->wr_id;
    w->opcode = h->opcode;
    w->send_flags = h->send_flags;
    w->remote_addr = h->remote_addr;
    w->rkey = h->rkey;
    w->imm = h->imm_data;
    w->compare_add = h->compare_add;
    w->swap = h->swap;
    if (h->opcode > MR_WR_ATOMIC_FETCH_AND_ADD) {
        b->status = WC_LOC_QP_OP_ERR;
        snprintf(b->why, sizeof(b->why), "unknown work request opcode %u", h->opcode);
        return -1;
    }
    uint64_t length = 0;
    if (h->opcode <= MR_WR_SEND_WITH_IMM) {                 /* WRITE, SEND (with imm) */
        if (h->send_flags & MR_SEND_INLINE) {
            if (h->inline_len > q->max_inline || h->inline_len > stride - MR_WQE_DATA) {
                b->status = WC_LOC_LEN_ERR;
                snprintf(b->why, sizeof(b->why),
                         "inline data is at most %u bytes (max_inline_data)", q->max_inline);
                return -1;
            }
            length = h->inline_len;
            if (length) {
                sh->bounce = malloc(length);
                if (!sh->bounce)
                    goto nomem;
                memcpy(sh->bounce, slot + MR_WQE_DATA, length);
            }
        } else {
            if (h->num_sge > q->max_send_sge || h->num_sge > room) {
                b->status = WC_LOC_QP_OP_ERR;
                snprintf(b->why, sizeof(b->why), "%u SGEs: this QP takes at most %u "
                         "(max_send_sge)", h->num_sge, q->max_send_sge);
                return -1;
            }
            struct dp_mr *ms[MR_MAX_SGE];
            for (uint32_t i = 0; i < h->num_sge; i++) {
                ms[i] = sge_mr(d, q, &sges[i], 0, b);
                if (!ms[i])
                    return -1;
                length += sges[i].length;
            }
            if (length > DP_MAX_MSG)
                goto too_long;
            if (h->num_sge == 1 && length) {            /* sent from the region itself */
                sh->mr = ms[0];
                ms[0]->refs++;
            } else if (length) {                        /* several: gathered once, now */
                sh->bounce = malloc(length);
                if (!sh->bounce)
                    goto nomem;
                uint64_t off = 0;
                for (uint32_t i = 0; i < h->num_sge; i++) {
                    memcpy(sh->bounce + off, ms[i]->mem + (sges[i].addr - ms[i]->addr),
                           sges[i].length);
                    off += sges[i].length;
                }
            }
        }
        if (sh->mr)
            w->local = (uint64_t)(uintptr_t)(sh->mr->mem + (sges[0].addr - sh->mr->addr));
        else
            w->local = (uint64_t)(uintptr_t)sh->bounce;
    } else {                                                /* READ, atomics */
        if (h->num_sge != 1) {
            b->status = WC_LOC_QP_OP_ERR;
            snprintf(b->why, sizeof(b->why), "READ and atomics take exactly one SGE");
            return -1;
        }
        struct dp_mr *m = sge_mr(d, q, &sges[0], MRE_ACCESS_LOCAL_WRITE, b);
        if (!m)
            return -1;
        length = sges[0].length;
        if (h->opcode != MR_WR_RDMA_READ) {
            if (length != 8) {
                b->status = WC_LOC_LEN_ERR;
                snprintf(b->why, sizeof(b->why), "an atomic's SGE is 8 bytes");
                return -1;
            }
            if (h->remote_addr & 7) {
                b->status = WC_LOC_QP_OP_ERR;
                snprintf(b->why, sizeof(b->why), "an atomic's remote_addr must be 8-byte aligned");
                return -1;
            }
        }
        if (length > DP_MAX_MSG)
            goto too_long;
        sh->kind = h->opcode == MR_WR_RDMA_READ ? RD_READ : RD_ATOMIC;
        sh->addr = sges[0].addr;
        sh->lkey = sges[0].lkey;
        sh->len = (uint32_t)length;
        w->local = (uint64_t)(uintptr_t)(m->mem + (sges[0].addr - m->addr));
    }
    w->length = (uint32_t)length;
    return 0;
too_long:
    b->status = WC_LOC_LEN_ERR;
    snprintf(b->why, sizeof(b->why), "message longer than max_msg_sz %llu",
             (unsigned long long)DP_MAX_MSG);
    return -1;
nomem:
    b->status = WC_LOC_QP_OP_ERR;
    snprintf(b->why, sizeof(b->why), "the daemon is out of memory");
    return -1;
}

static void shadow_free(struct dp_shadow *sh)
{
    free(sh->bounce);
    if (sh->mr)
        dp_mr_unref(sh->mr);
    memset(sh, 0, sizeof(*sh));
}

/* Release what the WQEs before posting number upto kept (they completed). */
void dp_release_shadow(struct mr_dp *d, struct dp_qp *q, uint32_t upto)
{
    (void)d;
    while (q->released != upto) {
        shadow_free(&q->shadow[q->released & q->shadow_mask]);
        q->released++;
    }
}

static uint8_t wc_opcode_of(uint8_t wr)
{
    switch (wr) {
    case MR_WR_RDMA_WRITE:
    case MR_WR_RDMA_WRITE_WITH_IMM:
        return MR_WC_RDMA_WRITE;
    case MR_WR_RDMA_READ:
        return MR_WC_RDMA_READ;
    case MR_WR_ATOMIC_CMP_AND_SWP:
        return MR_WC_COMP_SWAP;
    case MR_WR_ATOMIC_FETCH_AND_ADD:
        return MR_WC_FETCH_ADD;
    default:
        return MR_WC_SEND;
    }
}

static void error_cqe(struct mr_dp *d, struct dp_cq *c, struct dp_qp *q, uint64_t wr_id,
                      uint8_t status, uint8_t opcode)
{
    struct mr_cqe x;
    memset(&x, 0, sizeof(x));
    x.wr_id = wr_id;
    x.status = status;
    x.opcode = opcode;
    x.qp_num = q->qpn;
    dp_cq_put(d, c, &x);
}

/* The owner wrote a producer index no ring can have: an error completion and ERR (the rings
 * are not read again). */
static void ring_broken(struct mr_dp *d, struct dp_qp *q, int send)
{
    q->broken = 1;
    d->scan_stale = 1;
    if (q->err)
        return;
    if (q->eh != DP_NONE)
        mre_qp_to_error(d->e, q->eh);
    dp_deliver(d);                      /* the flushes of what it had, before its error */
    error_cqe(d, send ? q->scq : q->rcq, q, 0, WC_LOC_QP_OP_ERR,
              send ? MR_WC_SEND : MR_WC_RECV);
    dp_qp_to_err(d, q, send ? "impossible send queue producer index"
                            : "impossible receive queue producer index");
}

/* Take up to a batch of one send ring's WQEs and act on them. */
static int drain_send(struct mr_dp *d, struct dp_qp *q, int64_t now)
{
    uint32_t stride = q->sq.stride;
    if (stride > d->fetch_stride)
        return 0;                        /* cannot happen: the daemon made the ring */
    int n = mr_vq_fetch(&q->sq, d->fetch_buf, DP_FETCH);
    if (n < 0) {
        ring_broken(d, q, 1);
        return 1;
    }
    if (!n)
        return 0;
    dp_touch(d, q);
    q->wqes += (uint32_t)n;
    d->st.wqes += (uint32_t)n;
    for (int i = 0; i < n; i++) {
        const uint8_t *slot = d->fetch_buf + (size_t)i * stride;
        const struct mr_send_wqe *h = (const void *)slot;
        if (q->err || q->eh == DP_NONE) {          /* posted to a QP in ERR: flushed */
            error_cqe(d, q->scq, q, h->wr_id, MRE_WC_WR_FLUSH_ERR, wc_opcode_of(h->opcode));
            continue;
        }
        struct mre_wqe w;
        struct dp_shadow *sh = &q->shadow[q->posted & q->shadow_mask];
        struct bad b;
        if (translate(d, q, slot, stride, &w, sh, &b) < 0) {
            shadow_free(sh);
            q->bad_wqes++;
            d->st.bad_wqes++;
            /* as a verbs device: the QP to ERR (what it had is flushed), this WQE gets its
             * status, the rest of the batch is flushed */
            mre_qp_to_error(d->e, q->eh);
            dp_deliver(d);
            error_cqe(d, q->scq, q, h->wr_id, b.status, wc_opcode_of(h->opcode));
            char why[200];
            snprintf(why, sizeof(why), "bad work request %llu: %s",
                     (unsigned long long)h->wr_id, b.why);
            dp_qp_to_err(d, q, why);
            continue;
        }
        int rc = mre_post_send(d->e, q->eh, &w, now);
        if (rc < 0) {                                /* cannot happen: sq_cap is max_wr */
            shadow_free(sh);
            error_cqe(d, q->scq, q, h->wr_id, WC_LOC_QP_OP_ERR, wc_opcode_of(h->opcode));
            continue;
        }
        if (mre_qp_state(d->e, q->eh) == MRE_ERR) { /* it flushed the WQE at once */
            shadow_free(sh);
            continue;
        }
        q->posted++;
    }
    return n;
}

/* A QP in ERR: every receive posted beyond the completed ones completes flushed (the NIC's
 * program takes none any more). Returns how many. */
int dp_flush_recvs(struct mr_dp *d, struct dp_qp *q)
{
    if (!q->has_rings || q->broken)
        return 0;
    int total = 0;
    for (;;) {
        int n = mr_vq_fetch(&q->rq, d->fetch_buf, DP_FETCH);
        if (n < 0) {                    /* an impossible index: nothing more to flush */
            q->broken = 1;
            d->scan_stale = 1;
            return total;
        }
        if (!n)
            return total;
        for (int i = 0; i < n; i++) {
            const struct mr_recv_wqe *r = (const void *)(d->fetch_buf + (size_t)i * q->rq.stride);
            error_cqe(d, q->rcq, q, r->wr_id, MRE_WC_WR_FLUSH_ERR, MR_WC_RECV);
        }
        q->rq_done += (uint32_t)n;
        mr_vq_consume_to(&q->rq, q->rq_done);
        total += n;
    }
}

int dp_drain_rings(struct mr_dp *d, int64_t now)
{
    if (!d->nscan)
        return 0;
    uint32_t idx[256], work = 0;
    for (uint32_t base = 0; base < d->nscan; base += 256) {
        uint32_t len = d->nscan - base < 256 ? d->nscan - base : 256;
        uint32_t k = mr_vqs_pending(d->scan + base, len, idx, 256);
        for (uint32_t j = 0; j < k; j++) {
            uint32_t s = base + idx[j];
            struct dp_qp *q = &d->qps[d->scan_qi[s]];
            if (!q->used || q->broken)
                continue;
            if (d->scan_send[s])
                work += (uint32_t)drain_send(d, q, now);
            else
                work += (uint32_t)dp_flush_recvs(d, q);
        }
    }
    return (int)work;
}
