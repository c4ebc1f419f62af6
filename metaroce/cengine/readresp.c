/* The READ responder: per QP a queue of response streams the transmit path takes packets from
 * (mre_take_tx), and the go-back rule for a re-read (RESP-4), the one the wire uses today
 * (metaroce/nic/device.py _go_back_responses):
 *   - a request at PSN p that a queued stream has not sent yet: nothing to do, the stream
 *     delivers p in order anyway;
 *   - otherwise the response from p goes ahead of the QP's queued streams (the later READs'
 *     responses then arrive in order after it) and the rest of the stream that contained p is
 *     dropped (the new one covers it).
 * Queuing every re-read behind all queued responses instead made the requester discard them
 * and ask again, each time adding a copy (1.4 million response packets for 262,144 needed). */
#include <string.h>

#include "mre_int.h"

static void fill(struct qp *q, struct rd_resp *r, const struct pending *req, uint32_t msn)
{
    memset(r, 0, sizeof(*r));
    r->psn0 = req->psn;
    r->npkts = npackets(req->len, q->attr.path_mtu);
    r->msn = msn;
    r->ssn = req->ssn;
    r->base_off = req->has_place ? req->offset : 0;
    r->va = req->va;
    r->rkey = req->rkey;
    r->len = req->len;
    r->sport = req->sport;
    r->has_place = qp_metaroce(q);
}

static void served(struct responder *s, const struct rd_resp *r)
{
    uint32_t end = psn_add(r->psn0, r->npkts - 1);
    if (s->rd_served < 0 || psn_diff(end, (uint32_t)s->rd_served) > 0)
        s->rd_served = end;
}

void rd_queue(struct mre_engine *e, struct qp *q, const struct pending *req, uint32_t msn)
{
    struct responder *s = &q->resp;
    if (s->rd_tail - s->rd_head > s->rd_mask)
        return;                          /* full: the requester's retry asks again */
    struct rd_resp *r = &s->rd[s->rd_tail++ & s->rd_mask];
    fill(q, r, req, msn);
    served(s, r);
    eng_rd_activate(e, q);
}

void rd_go_back(struct mre_engine *e, struct qp *q, const struct pending *req, uint32_t msn)
{
    struct responder *s = &q->resp;
    uint32_t p = req->psn;
    for (uint32_t c = s->rd_head; c != s->rd_tail; c++) {
        struct rd_resp *r = &s->rd[c & s->rd_mask];
        uint32_t nxt = psn_add(r->psn0, r->next), end = psn_add(r->psn0, r->npkts);
        if (psn_diff(nxt, p) <= 0 && psn_diff(end, p) > 0) {
            s->read_pending++;           /* queued, not sent yet */
            return;
        }
    }
    uint32_t keep = s->rd_head;          /* drop the stream that contained p */
    for (uint32_t c = s->rd_head; c != s->rd_tail; c++) {
        struct rd_resp *r = &s->rd[c & s->rd_mask];
        uint32_t end = psn_add(r->psn0, r->npkts);
        if (psn_diff(r->psn0, p) <= 0 && psn_diff(end, p) > 0)
            continue;
        s->rd[keep++ & s->rd_mask] = *r;
    }
    s->rd_tail = keep;
    if (s->rd_tail - s->rd_head > s->rd_mask)
        return;
    struct rd_resp *r = &s->rd[--s->rd_head & s->rd_mask];    /* ahead of the queued ones */
    fill(q, r, req, msn);
    served(s, r);
    s->read_go_backs++;
    eng_rd_activate(e, q);
}

static uint8_t resp_opcode(uint32_t i, uint32_t n)
{
    if (n == 1)
        return OP_READ_RESP_ONLY;
    if (i == 0)
        return OP_READ_RESP_FIRST;
    return i == n - 1 ? OP_READ_RESP_LAST : OP_READ_RESP_MIDDLE;
}

/* Up to max response packets of QP q's streams, in order. */
int rd_take(struct mre_engine *e, struct qp *q, struct mre_pkt *out, int max)
{
    struct responder *s = &q->resp;
    uint32_t mtu = q->attr.path_mtu;
    int n = 0;
    while (n < max && s->rd_head != s->rd_tail) {
        struct rd_resp *r = &s->rd[s->rd_head & s->rd_mask];
        const struct mr *m = r->len ? eng_mr(e, r->rkey) : NULL;
        uint32_t i = r->next;
        uint8_t op = resp_opcode(i, r->npkts);
        struct mre_pkt *p = &out[n++];
        memset(p, 0, sizeof(*p));
        p->qp = (uint32_t)(q - e->qps);
        p->dest_qp = q->attr.dest_qpn;
        p->opcode = mode_op(q, op);
        p->psn = psn_add(r->psn0, i);
        if (op != OP_READ_RESP_MIDDLE) {
            p->has |= MRE_H_AETH;
            p->syndrome = ACK_SYNDROME;
            p->msn = r->msn;
        }
        if (r->has_place) {
            p->has |= MRE_H_PETH;
            p->ssn = r->ssn;
            p->offset = r->base_off + i * mtu;
        }
        uint64_t off = (uint64_t)i * mtu;
        p->reth_va = r->va + off;       /* the source in registered memory (not a RETH) */
        p->reth_rkey = r->rkey;
        if (r->len > off) {
            uint64_t left = r->len - off;
            p->len = left < mtu ? (uint32_t)left : mtu;
            if (m && m->mem)
                p->data = m->mem + (r->va - m->addr) + off;
        }
        p->sport = r->sport ? r->sport : req_sport0(q);
        s->read_responses++;
        if (++r->next == r->npkts)
            s->rd_head++;
    }
    return n;
}
