/* Completions: the engine's completions (and the adapter's own: bad WQEs, flushed receives)
 * written into the CQs' rings, accounted as a verbs device does (metaroce/nic/cq.py: cqe
 * entries, the owner's consumer index read and checked at each completion; one that would leave
 * more than cqe unconsumed overruns the CQ: IBV_EVENT_CQ_ERR, its QPs to ERR, nothing written
 * beyond the ring), published once per round with the completion channel signalled when the
 * owner armed it. Also what a QP in ERR entails, and releasing ring slots of completed WQEs. */
#include <bpf/bpf.h>
#include <stdio.h>
#include <string.h>

#include "dp_int.h"

static void mark_dirty(struct mr_dp *d, struct dp_cq *c)
{
    if (c->dirty)
        return;
    c->dirty = 1;
    d->dirty[d->ndirty++] = c;
}

/* The CQ overran: it is in error and every QP that uses it goes to ERR (async events for its
 * owner: IBV_EVENT_CQ_ERR, IBV_EVENT_QP_FATAL per QP). */
static void overrun(struct mr_dp *d, struct dp_cq *c)
{
    c->overrun = 1;
    d->st.cq_overruns++;
    if (c->ring) {
        mr_vq_set_flags(&c->q, MR_VQ_ERR, 0);
        c->eligible = 1;                /* an armed waiter wakes and sees the error */
        mark_dirty(d, c);
    }
    dp_push_async(d, MR_DP_CQ_ERR, c->owner, c->handle, 0, c->cqe, c->bad_index);
    for (uint32_t i = 0; i < d->nqps; i++) {
        struct dp_qp *q = &d->qps[i];
        if (!q->used || q->err || (q->scq != c && q->rcq != c))
            continue;
        dp_push_async(d, MR_DP_QP_FATAL, q->owner, c->handle, q->qpn, 0, 0);
        if (q->eh != DP_NONE) {
            mre_qp_to_error(d->e, q->eh);   /* its flushes may overrun its other CQ in turn */
            dp_touch(d, q);
        } else {
            dp_qp_to_err(d, q, NULL);
        }
    }
}

void dp_cq_put(struct mr_dp *d, struct dp_cq *c, const struct mr_cqe *x)
{
    if (c->overrun) {
        c->dropped++;
        return;
    }
    if (!c->ring) {                     /* the daemon's own endpoint: its last completions */
        if (c->local_tail - c->local_head == DP_LOCAL_CQES)
            c->local_head++;
        c->local[c->local_tail++ % DP_LOCAL_CQES] = *x;
        c->produced++;
        d->st.cqes++;
        return;
    }
    /* the owner's consumer index: one that moved backwards or passed the producer is as fatal
     * as an overrun (it would let us overwrite what the owner has not read) */
    uint32_t lag = c->produced - mr_vq_consumer(&c->q);
    if (lag > c->produced - c->ci)
        c->bad_index = 1;
    else
        c->ci = c->produced - lag;
    if (c->bad_index || c->produced - c->ci >= c->cqe) {
        c->dropped++;
        overrun(d, c);
        return;
    }
    mr_vq_put(&c->q, (const uint8_t *)x);
    c->produced++;
    if (x->status || (x->wc_flags & MR_WC_SOLICITED))
        c->eligible = 1;
    mark_dirty(d, c);
    d->st.cqes++;
}

/* The engine's completions into the CQs; returns how many. */
int dp_deliver(struct mr_dp *d)
{
    int total = 0;
    for (;;) {
        int n = mre_take_cqes(d->e, d->cqes, DP_CQE_BATCH);
        if (n <= 0)
            return total;
        for (int i = 0; i < n; i++) {
            const struct mre_cqe *m = &d->cqes[i];
            struct dp_qp *q = dp_qp_by_eh(d, m->qp);
            if (!q)
                continue;
            int recv = m->opcode >= MR_WC_RECV;
            struct mr_cqe x;
            memset(&x, 0, sizeof(x));
            x.wr_id = m->wr_id;
            x.byte_len = m->byte_len;
            x.imm_data = m->imm;
            x.qp_num = q->qpn;
            x.src_qp = recv ? q->remote_qpn : 0;
            x.status = m->status;
            x.opcode = m->opcode;
            x.wc_flags = m->wc_flags;
            dp_cq_put(d, recv ? q->rcq : q->scq, &x);
            if (recv) {
                q->recv_completions++;
                if (q->has_rings && !q->broken) {        /* the slot is the owner's again */
                    q->rq_done++;
                    mr_vq_consume_to(&q->rq, q->rq_done);
                }
            }
            dp_touch(d, q);
        }
        total += n;
    }
}

void dp_publish(struct mr_dp *d)
{
    for (uint32_t i = 0; i < d->ndirty; i++) {
        struct dp_cq *c = d->dirty[i];
        c->dirty = 0;
        if (c->ring) {
            c->q.head = c->produced;
            mr_vq_publish(&c->q, c->eligible);
        }
        c->eligible = 0;
    }
    d->ndirty = 0;
}

/* The kernel's side of a QP in ERR: its responder drops every request (as after a fatal NAK). */
static void kernel_qp_error(struct mr_dp *d, uint32_t qpn)
{
    struct nic_qp k;
    if (bpf_map_lookup_elem(d->cfg.qps_fd, &qpn, &k))
        return;                         /* never connected: nothing in the kernel */
    k.state = QP_RX_ERROR;
    bpf_map_update_elem(d->cfg.qps_fd, &qpn, &k, BPF_EXIST);
}

/* A QP is in ERR (the engine's flushes are delivered by the caller): the owner's library
 * refuses to post, what is posted is flushed, the kernel drops its requests. why: a line for
 * the device's log (NULL: none). */
void dp_qp_to_err(struct mr_dp *d, struct dp_qp *q, const char *why)
{
    if (q->err)
        return;
    q->err = 1;
    if (why)
        fprintf(stderr, "metaroce: QP 0x%06x: %s: QP to ERR\n", q->qpn, why);
    if (q->has_rings) {
        mr_vq_set_flags(&q->sq, MR_VQ_ERR, 0);
        mr_vq_set_flags(&q->rq, MR_VQ_ERR, 0);
        mr_vq_consume_to(&q->rq, q->rq_done);
        dp_flush_recvs(d, q);
    }
    kernel_qp_error(d, q->qpn);
    d->scan_stale = 1;                  /* its receive ring is flushed from now on */
    dp_touch(d, q);
}

/* Ring slots of completed work requests go back to their owners. */
void dp_settle(struct mr_dp *d)
{
    for (uint32_t i = d->touched; i != DP_NONE; i = d->qps[i].next_touched) {
        struct dp_qp *q = &d->qps[i];
        uint32_t out = q->eh != DP_NONE ? mre_qp_outstanding(d->e, q->eh) : 0;
        dp_release_shadow(d, q, q->posted - out);
        if (q->has_rings && !q->broken)
            mr_vq_settle(&q->sq, out);
    }
}
