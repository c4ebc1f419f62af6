/* The MetaRoCE NIC data path (compat mode: RoCEv2 RC, go-back-N), all in XDP:
 *  - responder: WRITE (with immediate), SEND (with immediate) into posted receive buffers, atomics
 *    executed on registered memory (saved result for duplicates), READ requests checked and
 *    handed to user space (ring buffer) to answer; ACK / NAK / RNR NAK / atomic ACK / CNP made
 *    by turning the packet into its reply (XDP_TX);
 *  - requester: ACK / NAK / CNP consumed (the QP's send state in its map, an event for user
 *    space), READ responses and atomic ACKs placed into the local buffer of their request.
 * Everything is checked first: QP, source, ICRC, PSN, opcode sequence, key, PD, access, bounds.
 * Packets that are not RoCE pass untouched. Map syntax is rewritten by BCC only in this file,
 * so every map access lives here. */
#include "nic_maps.h"
#include "nic_parse.h"

/* What to send back (a constant kind per call site of build_reply), decided by a handler. */
struct plan {
    __u32 kind;       /* REPLY_* or 0: consume the packet */
    __u32 psn;
    __u32 syndrome;
    __u32 msn;
    __u32 txc;        /* tx counter to bump */
    __u32 se;         /* RECV_F_SOLICITED if the request's BTH has SE set (its completion is
                       * a solicited event) */
    __u64 orig;
    struct reply_ext x;   /* MetaRoCE: SACK / MR atomic ACK fields */
};

static __always_inline int verdict(u32 reason, int action)
{
    u64 *c = rx_counters.lookup(&reason);
    if (c)
        (*c)++;
    return action;
}

/* One frame of len bytes on the port: which = PORT_RCV_PACKETS or PORT_XMIT_PACKETS. (Written
 * out rather than through port_count_one: that shape made the verifier's walk of nic_rx
 * exceed its instruction budget.) */
static __always_inline void port_count(u32 which, u64 len)
{
    u64 *c = port_counters.lookup(&which);
    if (c)
        (*c)++;
    which++;
    c = port_counters.lookup(&which);
    if (c)
        *c += len;
}

static __always_inline void port_count_one(u32 which)
{
    u64 *c = port_counters.lookup(&which);
    if (c)
        (*c)++;
}

/* An event to the data path thread. A wakeup is a self-IPI (irq_work), a VM exit on a virtual
 * machine: the ring's own rule (wake when the reader has caught up) paid one for nearly every
 * event while the thread polls. So an event wakes the thread only when its ev_sleep says it
 * sleeps. The thread sets ev_sleep, then looks at the ring once more before it sleeps; the
 * record is published (its commit is an xchg, a full barrier) before ev_sleep is read again
 * here: either the thread sees the record, or this sees ev_sleep set and wakes it (with an
 * empty record, discarded, when the event itself went out without a wakeup). */
static __always_inline void emit(struct nic_event *ev)
{
    u32 zero = 0;
    u32 *sleeping = ev_sleep.lookup(&zero);
    u64 flags = sleeping && *(volatile u32 *)sleeping ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP;
    u32 k = events.ringbuf_output(ev, sizeof(*ev), flags) ? 1 : 0;
    if (flags == BPF_RB_NO_WAKEUP && sleeping && *(volatile u32 *)sleeping) {
        void *w = events.ringbuf_reserve(8);
        if (w)
            events.ringbuf_discard(w, BPF_RB_FORCE_WAKEUP);
    }
    u64 *c = ev_counters.lookup(&k);
    if (c)
        (*c)++;
}

/* One event; va carries what an event names beyond wr_id (an RSN, half a SACK bitmap). */
static __always_inline void event_va(u32 type, u32 qpn, u32 psn, u32 syndrome, u64 wr_id, u64 va,
                                     u32 len, u32 imm, u32 flags, u32 msn)
{
    struct nic_event ev = {};
    ev.type = type;
    ev.qpn = qpn;
    ev.psn = psn;
    ev.syndrome = syndrome;
    ev.wr_id = wr_id;
    ev.va = va;
    ev.len = len;
    ev.imm = imm;
    ev.flags = flags;
    ev.msn = msn;
    emit(&ev);
}

static __always_inline void event(u32 type, u32 qpn, u32 psn, u32 syndrome, u64 wr_id, u32 len,
                                  u32 imm, u32 flags, u32 msn)
{
    event_va(type, qpn, psn, syndrome, wr_id, 0, len, imm, flags, msn);
}

static __always_inline void set_reply(struct plan *pl, u32 kind, u32 psn, u32 syndrome, u32 msn,
                                      u32 txc)
{
    pl->kind = kind;
    pl->psn = psn;
    pl->syndrome = syndrome;
    pl->msn = msn;
    pl->txc = txc;
}

/* A fatal NAK (RESP-5): sent with the offending PSN; the QP moves to ERR; user space is told. */
static __always_inline u32 fatal(struct plan *pl, struct nic_qp *qp, u32 qpn, u32 psn, u32 syn,
                                 u32 txc, u32 reason)
{
    /* MetaRoCE: an MR_SACK with the NAK syndrome, the offending PSN and no bitmap (SACK-7) */
    set_reply(pl, qp->metaroce ? REPLY_SACK : REPLY_ACK, psn, syn, qp->msn, txc);
    pl->x.bm_hi = pl->x.bm_lo = 0;
    pl->x.flags = 0;
    qp->state = QP_RX_ERROR;
    event(EV_QP_ERROR, qpn, psn, syn, 0, 0, 0, reason, qp->msn);
    return reason;
}

/* 0 and *off (offset of va in the region) if key names a region of pd with this access that
 * holds [va, va + len); else the reason it does not. */
static __always_inline u32 mr_check(u32 key, u32 pd, u32 access, u64 va, u64 len, u64 *off)
{
    struct mr_info *mr = mr_infos.lookup(&key);
    if (!mr)
        return RX_BAD_RKEY;
#ifdef MUTANT_NO_ACCESS_CHECK          /* conformance self-test only: access flags ignored */
    access = mr->access;
#endif
    if (mr->pd != pd || !(mr->access & access))
        return RX_MR_ACCESS;
    if (va < mr->va || va - mr->va > mr->length || len > mr->length - (va - mr->va))
        return RX_MR_BOUNDS;
    *off = va - mr->va;
    return 0;
}

/* Copy len payload bytes at pkt_off into region `key` at byte offset off. The destination
 * offset is checked at run time (a dynptr over the chunk), so any alignment works and a payload
 * may straddle two chunks. Returns 0 on success. */
static __always_inline int place(struct xdp_md *ctx, u32 key, u64 off, u32 pkt_off, u32 len)
{
    if (len == 0)
        return 0;
    if (len > MAX_PAYLOAD)
        return -1;
    u32 zero = 0;
    struct scratch *s = scratch.lookup(&zero);
    void *mem = mrs.lookup(&key);
    if (!s || !mem)
        return -1;
    len = ((len - 1) & (MAX_PAYLOAD - 1)) + 1;
    u32 idx = off / MR_CHUNK, o = off % MR_CHUNK;
    u32 first = MR_CHUNK - o;
    if (first > len)
        first = len;
    first = ((first - 1) & (MAX_PAYLOAD - 1)) + 1;
    struct mr_chunk *c = bpf_map_lookup_elem(mem, &idx);
    if (!c || bpf_xdp_load_bytes(ctx, pkt_off, s->b, first))
        return -1;
    struct bpf_dynptr d;
    bpf_dynptr_from_mem(c, sizeof(*c), 0, &d);
    if (bpf_dynptr_write(&d, o, s->b, first, 0))
        return -1;
    if (first == len)
        return 0;
    u32 rest = len - first;
    if (rest == 0 || rest > MAX_PAYLOAD)
        return -1;
    rest = ((rest - 1) & (MAX_PAYLOAD - 1)) + 1;
    idx++;
    c = bpf_map_lookup_elem(mem, &idx);
    if (!c || bpf_xdp_load_bytes(ctx, pkt_off + first, s->b, rest))
        return -1;
    struct bpf_dynptr d2;
    bpf_dynptr_from_mem(c, sizeof(*c), 0, &d2);
    return bpf_dynptr_write(&d2, 0, s->b, rest, 0) ? -1 : 0;
}

/* The 8-byte word at offset off (8-aligned) of region key, or NULL. */
static __always_inline u64 *word_at(u32 key, u64 off)
{
    void *mem = mrs.lookup(&key);
    if (!mem || (off & 7))
        return NULL;
    u32 idx = off / MR_CHUNK, o = off % MR_CHUNK;
    struct mr_chunk *c = bpf_map_lookup_elem(mem, &idx);
    if (!c)
        return NULL;
    return (u64 *)(c->b + (o & (MR_CHUNK - 8)));
}

/* Store the 8-byte value v (host order, as the application reads it) at byte offset off of
 * region key, at any alignment: an atomic's original value into the requester's local buffer,
 * which verbs do not require to be aligned (only the remote address is, HDR-10). An aligned
 * word is one store; otherwise the bytes go through a dynptr, split where the offset crosses
 * into the next chunk. Returns 0 on success. */
static __always_inline int put_u64(u32 key, u64 off, u64 v)
{
    u64 *p = word_at(key, off);
    if (p) {
        *p = v;
        return 0;
    }
    void *mem = mrs.lookup(&key);
    if (!mem)
        return -1;
    u32 idx = off / MR_CHUNK, o = off % MR_CHUNK;
    u32 first = MR_CHUNK - o;
    if (first > 8)
        first = 8;
    first = ((first - 1) & 7) + 1;
    struct mr_chunk *c = bpf_map_lookup_elem(mem, &idx);
    if (!c)
        return -1;
    u64 lo = v;
    struct bpf_dynptr d;
    bpf_dynptr_from_mem(c, sizeof(*c), 0, &d);
    if (bpf_dynptr_write(&d, o, &lo, first, 0))
        return -1;
    if (first == 8)
        return 0;
    u64 hi = v >> ((first & 7) * 8);          /* the bytes after the first `first` */
    u32 rest = ((8 - first - 1) & 7) + 1;
    idx++;
    c = bpf_map_lookup_elem(mem, &idx);
    if (!c)
        return -1;
    struct bpf_dynptr d2;
    bpf_dynptr_from_mem(c, sizeof(*c), 0, &d2);
    return bpf_dynptr_write(&d2, 0, &hi, rest, 0) ? -1 : 0;
}

/* Verify the ICRC: 8 x 0xFF, masked IP/UDP/BTH, then everything after the BTH but the ICRC. */
static __always_inline int icrc_ok(struct xdp_md *ctx, const struct roce_pkt *rp, u32 l4)
{
    u32 zero = 0;
    struct crc_tables *T = crc_tab.lookup(&zero);
    struct icrc_scratch *s = icrc_scratch.lookup(&zero);
    if (!T || !s)
        return 0;
    u32 l3 = sizeof(struct ethhdr);
    u32 hlen = rp->ipver == 4 ? 20 + 8 + BTH_LEN : 40 + 8 + BTH_LEN;
    __builtin_memset(s->b, 0xff, 8);
    if (bpf_xdp_load_bytes(ctx, l3, s->b + 8, hlen))
        return 0;
    __u8 *h = s->b + 8;
    if (rp->ipver == 4) {
        h[1] = 0xff;                       /* TOS */
        h[8] = 0xff;                       /* TTL */
        h[10] = h[11] = 0xff;              /* header checksum */
        h[20 + 6] = h[20 + 7] = 0xff;      /* UDP checksum */
        h[28 + 4] = 0xff;                  /* BTH resv8a */
    } else {
        h[0] |= 0x0f;                      /* traffic class, flow label */
        h[1] = h[2] = h[3] = 0xff;
        h[7] = 0xff;                       /* hop limit */
        h[40 + 6] = h[40 + 7] = 0xff;
        h[48 + 4] = 0xff;
    }
    u32 crc = crc_tail(0xffffffff, s->b, 8 + hlen, T);
    u32 off = rp->bth_off + BTH_LEN, end = rp->bth_off + l4 - ICRC_LEN;
#pragma clang loop unroll(disable)
    for (u32 c = 0; c < ICRC_MAX_CHUNKS; c++) {
        if (off + ICRC_CHUNK > end)
            break;
        if (bpf_xdp_load_bytes(ctx, off, s->b, ICRC_CHUNK))
            return 0;
        crc = crc_chunk(crc, s->b, T);
        off += ICRC_CHUNK;
    }
    if (off < end) {
        u32 n = end - off;                 /* 1 .. ICRC_CHUNK - 1 */
        if (n >= ICRC_CHUNK)
            return 0;
        n = ((n - 1) & (ICRC_CHUNK - 1)) + 1;
        if (bpf_xdp_load_bytes(ctx, off, s->b, n))
            return 0;
        crc = crc_tail(crc, s->b, n, T);
    }
    __u32 wire;
    if (bpf_xdp_load_bytes(ctx, end, &wire, 4))
        return 0;
    return wire == ~crc;                   /* the ICRC travels least significant byte first */
}

/* INT-3 (nic_csum.h) with this CPU's scratch. */
static __always_inline int csum_ok(struct xdp_md *ctx, const struct roce_pkt *rp, u32 l4)
{
    u32 zero = 0;
    struct csum_scratch *s = csum_scratch.lookup(&zero);
    return s ? csum_check(ctx, rp, l4, s) : 0;
}

/* Turn the packet into the planned reply and send it back out of its port (XDP_TX; nic_rx_cpu
 * turns that into a redirect to the device). */
static __always_inline int reply(struct xdp_md *ctx, const struct roce_pkt *rp,
                                 const struct plan *pl, const struct nic_qp *qp, u32 reason)
{
    u32 zero = 0;
    struct crc_tables *T = crc_tab.lookup(&zero);
    struct icrc_scratch *s = icrc_scratch.lookup(&zero);
    if (!T || !s)
        return verdict(reason, XDP_DROP);
    int v6 = rp->ipver == 6;
    int csum = qp->integrity == INT_CSUM;   /* INT-2: the reply carries a UDP checksum too */
    u32 dqpn = qp->dqpn;
    u32 k = pl->kind;
    u32 want = k == REPLY_ACK ? REPLY_LEN(v6, REPLY_ACK)
             : k == REPLY_ATOMIC_ACK ? REPLY_LEN(v6, REPLY_ATOMIC_ACK)
             : k == REPLY_SACK ? REPLY_LEN(v6, REPLY_SACK)
             : k == REPLY_MR_ATOMIC_ACK ? REPLY_LEN(v6, REPLY_MR_ATOMIC_ACK)
             : REPLY_LEN(v6, REPLY_CNP);
    int delta = (int)want - (int)bpf_xdp_get_buff_len(ctx);
    if (delta && bpf_xdp_adjust_tail(ctx, delta))
        return verdict(RX_MALFORMED, XDP_DROP);
    void *data = (void *)(long)ctx->data, *data_end = (void *)(long)ctx->data_end;
    u32 len;
    u8 syn = pl->syndrome;
    const struct reply_ext *x = &pl->x;
    /* kind and IP version are constants at each call so every offset is fixed */
    if (v6) {
        if (k == REPLY_ACK)
            len = build_reply(data, data_end, 1, REPLY_ACK, dqpn, pl->psn, syn, pl->msn, 0, x, T, s, csum);
        else if (k == REPLY_ATOMIC_ACK)
            len = build_reply(data, data_end, 1, REPLY_ATOMIC_ACK, dqpn, pl->psn, syn, pl->msn,
                              pl->orig, x, T, s, csum);
        else if (k == REPLY_SACK)
            len = build_reply(data, data_end, 1, REPLY_SACK, dqpn, pl->psn, syn, pl->msn, 0, x, T, s, csum);
        else if (k == REPLY_MR_ATOMIC_ACK)
            len = build_reply(data, data_end, 1, REPLY_MR_ATOMIC_ACK, dqpn, pl->psn, syn, pl->msn,
                              pl->orig, x, T, s, csum);
        else
            len = build_reply(data, data_end, 1, REPLY_CNP, dqpn, 0, 0, 0, 0, x, T, s, csum);
    } else {
        if (k == REPLY_ACK)
            len = build_reply(data, data_end, 0, REPLY_ACK, dqpn, pl->psn, syn, pl->msn, 0, x, T, s, csum);
        else if (k == REPLY_ATOMIC_ACK)
            len = build_reply(data, data_end, 0, REPLY_ATOMIC_ACK, dqpn, pl->psn, syn, pl->msn,
                              pl->orig, x, T, s, csum);
        else if (k == REPLY_SACK)
            len = build_reply(data, data_end, 0, REPLY_SACK, dqpn, pl->psn, syn, pl->msn, 0, x, T, s, csum);
        else if (k == REPLY_MR_ATOMIC_ACK)
            len = build_reply(data, data_end, 0, REPLY_MR_ATOMIC_ACK, dqpn, pl->psn, syn, pl->msn,
                              pl->orig, x, T, s, csum);
        else
            len = build_reply(data, data_end, 0, REPLY_CNP, dqpn, 0, 0, 0, 0, x, T, s, csum);
    }
    if (!len)
        return verdict(RX_MALFORMED, XDP_DROP);
    u32 txc = pl->txc;
    u64 *c = tx_counters.lookup(&txc);
    if (c)
        (*c)++;
    port_count(PORT_XMIT_PACKETS, len);
    return verdict(reason, XDP_TX);
}

/* The receive WQE at the head of the QP's receive queue, or NULL when none is posted. */
/* The word of the QP's receive queue ring header that starts slot `slot` (prod or cons). */
static __always_inline u32 rq_word(void *ring, u32 slot)
{
    u32 *w = bpf_map_lookup_elem(ring, &slot);
    return w ? *(volatile u32 *)w : 0;
}

/* Copy receive WQE number n out of the ring (the owner may rewrite it at any moment) and check
 * its shape: 0, or -1 for a slot that holds no one-SGE receive. */
static __always_inline int rq_copy(void *ring, struct nic_qp *qp, u32 n, struct recv_wqe *w)
{
    u32 k = MR_VQ_HDR_SLOTS + (n & (qp->rq_entries - 1));
    struct mr_rq_slot *s = bpf_map_lookup_elem(ring, &k);
    if (!s)
        return -1;
    u32 nsge = *(volatile u32 *)&s->wqe.num_sge;
    w->wr_id = *(volatile u64 *)&s->wqe.wr_id;
    w->addr = *(volatile u64 *)&s->sge.addr;
    w->length = *(volatile u32 *)&s->sge.length;
    w->lkey = *(volatile u32 *)&s->sge.lkey;
    w->seq = n;
    return nsge == 1 ? 0 : -1;
}

/* The head receive WQE (in order, compat mode) into *w: 1; none posted: 0; a bad WQE or an
 * impossible producer index in the owner's ring: -1. */
static __always_inline int rq_head(u32 qpn, struct nic_qp *qp, struct recv_wqe *w)
{
    void *ring = rqs.lookup(&qpn);
    if (!ring || !qp->rq_entries)
        return 0;
    u32 head = (u32)qp->rq_head;
    u32 posted = rq_word(ring, MR_VQ_PROD_SLOT) - head;
    if (posted == 0)
        return 0;
    if (posted > qp->rq_entries)
        return -1;
    return rq_copy(ring, qp, head, w) ? -1 : 1;
}

/* MetaRoCE: receive WQE number rsn (24 bits; PLACE-3) into *w if it is posted and not yet
 * completed (at or past the ring's consumer index, before its producer index): 1; not posted:
 * 0; a bad WQE or impossible indices: -1. */
static __always_inline int rq_rsn(u32 qpn, struct nic_qp *qp, u32 rsn, struct recv_wqe *w)
{
    void *ring = rqs.lookup(&qpn);
    if (!ring || !qp->rq_entries)
        return 0;
    u32 cons = rq_word(ring, MR_VQ_CONS_SLOT);
    u32 posted = rq_word(ring, MR_VQ_PROD_SLOT) - cons;
    if (posted > qp->rq_entries)
        return -1;
    u32 d = (rsn - cons) & 0xFFFFFF;
    if (d >= posted)
        return 0;
    return rq_copy(ring, qp, cons + d, w) ? -1 : 1;
}

static __always_inline void rq_complete(u32 qpn, struct nic_qp *qp, struct recv_wqe *w,
                                        u32 type, u32 status, u32 byte_len, u32 imm, u32 flags)
{
    event(type, qpn, 0, status, w->wr_id, byte_len, imm, flags, qp->msn);
    qp->rq_head++;
}

/* A receive queue the program cannot take a WQE from: the owner wrote something no receive
 * can be. Fatal for the QP (remote operational error to the requester), and user space gets
 * the error completion. */
static __always_inline u32 bad_rq(struct plan *pl, struct nic_qp *qp, u32 qpn, u32 psn)
{
    event(EV_RECV_ERR, qpn, psn, RX_BAD_RECV_WQE, 0, 0, 0, 0, qp->msn);
    return fatal(pl, qp, qpn, psn, AETH_NAK_REM_OP, TX_NAK_REM_OP, RX_BAD_RECV_WQE);
}

/* The 32-bit big-endian word at off as it was on the wire (immediate data stays big-endian). */
static __always_inline int load32(struct xdp_md *ctx, u32 off, u32 *v)
{
    return bpf_xdp_load_bytes(ctx, off, v, 4);
}

/* RDMA WRITE FIRST/MIDDLE/LAST/ONLY (with immediate), in order. */
static __always_inline u32 on_write(struct xdp_md *ctx, const struct roce_pkt *rp, u32 qpn,
                                    struct nic_qp *qp, u8 op, u32 psn, int ackreq, u32 l4,
                                    u32 pad, struct plan *pl)
{
    int has_reth = op == RC_RDMA_WRITE_FIRST || op == RC_RDMA_WRITE_ONLY ||
                   op == RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE;
    int has_imm = op == RC_RDMA_WRITE_LAST_WITH_IMMEDIATE || op == RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE;
    int ends = op != RC_RDMA_WRITE_FIRST && op != RC_RDMA_WRITE_MIDDLE;
    u32 hdrs = BTH_LEN + (has_reth ? RETH_LEN : 0) + (has_imm ? IMMDT_LEN : 0);
    if (l4 < hdrs + pad + ICRC_LEN)
        return RX_MALFORMED;
    u32 len = l4 - hdrs - pad - ICRC_LEN;
    u64 va, left;
    u32 rkey;
    if (has_reth) {
        struct reth reth;
        if (qp->state != QP_RX_IDLE)
            return fatal(pl, qp, qpn, psn, AETH_NAK_INV_REQ, TX_NAK_INV_REQ, RX_BAD_OPCODE_SEQ);
        if (bpf_xdp_load_bytes(ctx, rp->bth_off + BTH_LEN, &reth, sizeof(reth)))
            return RX_MALFORMED;
        va = ((u64)bpf_ntohl(reth.va_hi) << 32) | bpf_ntohl(reth.va_lo);
        rkey = bpf_ntohl(reth.rkey);
        left = bpf_ntohl(reth.dmalen);
        qp->wr_len = left;
    } else {
        if (qp->state != QP_RX_IN_WRITE)
            return fatal(pl, qp, qpn, psn, AETH_NAK_INV_REQ, TX_NAK_INV_REQ, RX_BAD_OPCODE_SEQ);
        va = qp->wr_va;
        rkey = qp->wr_rkey;
        left = qp->wr_left;
    }
    u32 pmtu = qp->pmtu ? qp->pmtu : 1024;
    /* payload and DMA length disagree, or the segmentation is not the MTU's (RESP-15): FIRST
     * and MIDDLE carry exactly the MTU and leave more to come, nothing carries more */
    if (len > left || (ends && len != left) || len > pmtu || (!ends && (len != pmtu || left <= pmtu)))
        return fatal(pl, qp, qpn, psn, AETH_NAK_INV_REQ, TX_NAK_INV_REQ, RX_INVALID_REQUEST);
    struct recv_wqe wqe = {};
    int have = 0;
    if (has_imm) {                     /* the immediate consumes a receive WQE (RESP-6) */
        have = rq_head(qpn, qp, &wqe);
        if (have < 0)
            return bad_rq(pl, qp, qpn, psn);
        if (!have) {
            set_reply(pl, REPLY_ACK, psn, AETH_RNR_NAK | (qp->rnr_timer & 0x1f), qp->msn,
                      TX_NAK_RNR);
            qp->nak_sent = 1;        /* as for SEND (RESP-6) */
            return RX_RNR;
        }
    }
    if (has_reth && left == 0) {
        /* a zero-length WRITE touches no memory and needs no valid R_Key */
    } else {
        u64 off;
        /* the first packet validates the whole DMA range (RESP-5), later ones their bytes */
        u32 why = mr_check(rkey, qp->pd, ACCESS_REMOTE_WRITE, va, has_reth ? left : len, &off);
        if (why)
            return fatal(pl, qp, qpn, psn, AETH_NAK_REM_ACCESS, TX_NAK_REM_ACCESS, why);
#ifdef MUTANT_ACK_BEFORE_PLACE         /* conformance self-test only: acked, never placed */
        if (!ackreq)
#endif
        if (place(ctx, rkey, off, rp->bth_off + hdrs, len))
            return fatal(pl, qp, qpn, psn, AETH_NAK_REM_ACCESS, TX_NAK_REM_ACCESS, RX_MR_BOUNDS);
    }
    qp->rx_bytes += len;
    qp->wr_va = va + len;
    qp->wr_rkey = rkey;
    qp->wr_left = left - len;
    qp->state = ends ? QP_RX_IDLE : QP_RX_IN_WRITE;
    qp->epsn = (psn + 1) & PSN_MASK;
    qp->nak_sent = 0;
    if (ends)
        qp->msn = (qp->msn + 1) & 0xFFFFFF;
    if (have) {
        u32 imm = 0;
        load32(ctx, rp->bth_off + hdrs - IMMDT_LEN, &imm);
        rq_complete(qpn, qp, &wqe, EV_RECV, 0, qp->wr_len, imm, 3 | pl->se);
    }
    if (ackreq)
        set_reply(pl, REPLY_ACK, psn, AETH_ACK_UNLIMITED, qp->msn, TX_ACK);
    return RX_PLACED;
}

/* SEND FIRST/MIDDLE/LAST/ONLY (with immediate), in order, into the head receive WQE. */
static __always_inline u32 on_send(struct xdp_md *ctx, const struct roce_pkt *rp, u32 qpn,
                                   struct nic_qp *qp, u8 op, u32 psn, int ackreq, u32 l4,
                                   u32 pad, struct plan *pl)
{
    int first = op == RC_SEND_FIRST || op == RC_SEND_ONLY || op == RC_SEND_ONLY_WITH_IMMEDIATE;
    int ends = op != RC_SEND_FIRST && op != RC_SEND_MIDDLE;
    int has_imm = op == RC_SEND_LAST_WITH_IMMEDIATE || op == RC_SEND_ONLY_WITH_IMMEDIATE;
    u32 hdrs = BTH_LEN + (has_imm ? IMMDT_LEN : 0);
    if (l4 < hdrs + pad + ICRC_LEN)
        return RX_MALFORMED;
    u32 len = l4 - hdrs - pad - ICRC_LEN;
    if (qp->state != (first ? QP_RX_IDLE : QP_RX_IN_SEND))
        return fatal(pl, qp, qpn, psn, AETH_NAK_INV_REQ, TX_NAK_INV_REQ, RX_BAD_OPCODE_SEQ);
    struct recv_wqe wqe = {};
    struct recv_wqe *w = &wqe;
    int have = rq_head(qpn, qp, w);
    if (have < 0)
        return bad_rq(pl, qp, qpn, psn);
    if (!have) {
        if (!first)
            return fatal(pl, qp, qpn, psn, AETH_NAK_INV_REQ, TX_NAK_INV_REQ, RX_BAD_OPCODE_SEQ);
        set_reply(pl, REPLY_ACK, psn, AETH_RNR_NAK | (qp->rnr_timer & 0x1f), qp->msn, TX_NAK_RNR);
        qp->nak_sent = 1;            /* the gap behind an RNR NAK is not NAKed again (RESP-6) */
        return RX_RNR;
    }
    u32 pmtu = qp->pmtu ? qp->pmtu : 1024;
    if (len > pmtu || (!ends && len != pmtu) || (ends && !first && !len))   /* RESP-15 */
        return fatal(pl, qp, qpn, psn, AETH_NAK_INV_REQ, TX_NAK_INV_REQ, RX_INVALID_REQUEST);
    if (first)
        qp->send_off = 0;
    if (qp->send_off + len > w->length) {        /* longer than the receive buffer */
        rq_complete(qpn, qp, w, EV_RECV_ERR, RX_INVALID_REQUEST, qp->send_off + len, 0, 0);
        return fatal(pl, qp, qpn, psn, AETH_NAK_INV_REQ, TX_NAK_INV_REQ, RX_INVALID_REQUEST);
    }
    if (len) {
        u64 off;
        u32 why = mr_check(w->lkey, qp->pd, ACCESS_LOCAL_WRITE, w->addr + qp->send_off, len, &off);
        if (!why && place(ctx, w->lkey, off, rp->bth_off + hdrs, len))
            why = RX_MR_BOUNDS;
        if (why) {                   /* our own receive buffer is bad: a local protection error */
            rq_complete(qpn, qp, w, EV_RECV_ERR, why, 0, 0, 0);
            return fatal(pl, qp, qpn, psn, AETH_NAK_REM_OP, TX_NAK_REM_OP, why);
        }
    }
    qp->rx_bytes += len;
    qp->send_off += len;
    qp->state = ends ? QP_RX_IDLE : QP_RX_IN_SEND;
    qp->epsn = (psn + 1) & PSN_MASK;
    qp->nak_sent = 0;
    if (ends) {
        qp->msn = (qp->msn + 1) & 0xFFFFFF;
        u32 imm = 0;
        if (has_imm)
            load32(ctx, rp->bth_off + BTH_LEN, &imm);
        rq_complete(qpn, qp, w, EV_RECV, 0, qp->send_off, imm, (has_imm ? 1 : 0) | pl->se);
    }
    if (ackreq)
        set_reply(pl, REPLY_ACK, psn, AETH_ACK_UNLIMITED, qp->msn, TX_ACK);
    return RX_PLACED;
}

/* READ request: checked here, answered by user space (the responses come from the region).
 * A duplicate is answered again (READs are idempotent, RESP-4). */
static __always_inline u32 on_read(struct xdp_md *ctx, const struct roce_pkt *rp, u32 qpn,
                                   struct nic_qp *qp, u32 psn, int dup, u32 l4, struct plan *pl,
                                   u32 ext, u32 ssn)
{
    struct reth reth;
    if (l4 != BTH_LEN + ext + RETH_LEN + ICRC_LEN ||
        bpf_xdp_load_bytes(ctx, rp->bth_off + BTH_LEN + ext, &reth, sizeof(reth)))
        return RX_MALFORMED;
    u64 va = ((u64)bpf_ntohl(reth.va_hi) << 32) | bpf_ntohl(reth.va_lo);
    u32 rkey = bpf_ntohl(reth.rkey), len = bpf_ntohl(reth.dmalen);
    if (!dup && qp->state != QP_RX_IDLE)
        return fatal(pl, qp, qpn, psn, AETH_NAK_INV_REQ, TX_NAK_INV_REQ, RX_BAD_OPCODE_SEQ);
    if (len) {
        u64 off;
        u32 why = mr_check(rkey, qp->pd, ACCESS_REMOTE_READ, va, len, &off);
        if (why)
            return dup ? why : fatal(pl, qp, qpn, psn, AETH_NAK_REM_ACCESS, TX_NAK_REM_ACCESS, why);
    }
    u32 pmtu = qp->pmtu ? qp->pmtu : 1024;
    if (!dup && !ext) {              /* MetaRoCE: the caller advances ePSN and the MSN */
        qp->epsn = (psn + (len ? (len + pmtu - 1) / pmtu : 1)) & PSN_MASK;
        qp->msn = (qp->msn + 1) & 0xFFFFFF;
        qp->nak_sent = 0;
    }
    struct nic_event ev = {};
    ev.type = EV_READ_REQUEST;
    ev.qpn = qpn;
    ev.psn = psn;
    ev.va = va;
    ev.rkey = rkey;
    ev.len = len;
    ev.flags = dup;
    ev.imm = ssn;                    /* MetaRoCE: echoed in the responses' PETH */
    ev.pad = rp->sport;              /* answered on the request's own path (its UDP port) */
    ev.msn = ext ? (qp->msn + !dup) & 0xFFFFFF : qp->msn;
    emit(&ev);
    return dup ? RX_DUPLICATE : RX_READ_REQUEST;
}

/* COMPARE_SWAP / FETCH_ADD on an 8-byte aligned word of registered memory, in order; the
 * original value is saved for a duplicate (RESP-4) and returned in an atomic ACK. */
static __always_inline u32 on_atomic(struct xdp_md *ctx, const struct roce_pkt *rp, u32 qpn,
                                     struct nic_qp *qp, u8 op, u32 psn, int dup, u32 l4,
                                     struct plan *pl, u32 ext)
{
    struct atomic_eth a;
    u32 kind = ext ? REPLY_MR_ATOMIC_ACK : REPLY_ATOMIC_ACK;
    if (l4 != BTH_LEN + ext + ATOMICETH_LEN + ICRC_LEN ||
        bpf_xdp_load_bytes(ctx, rp->bth_off + BTH_LEN + ext, &a, sizeof(a)))
        return RX_MALFORMED;
#ifdef MUTANT_ATOMIC_TWICE             /* conformance self-test only: duplicates execute again */
    dup = 0;
#endif
    u64 skey = (u64)qpn << 32 | (psn & (RD_DEPTH - 1));
    if (dup) {                       /* the saved result of one of the last RD_DEPTH (RESP-4) */
        struct atomic_saved *sv = atomic_results.lookup(&skey);
        if (!sv || !sv->valid || sv->psn != psn)
            return RX_DUPLICATE;       /* older than the saved results: dropped */
        set_reply(pl, kind, psn, AETH_ACK_UNLIMITED, qp->msn, TX_ATOMIC_ACK);
        pl->orig = sv->orig;
        return RX_DUPLICATE;
    }
    if (qp->state != QP_RX_IDLE)
        return fatal(pl, qp, qpn, psn, AETH_NAK_INV_REQ, TX_NAK_INV_REQ, RX_BAD_OPCODE_SEQ);
    u64 va = ((u64)bpf_ntohl(a.va_hi) << 32) | bpf_ntohl(a.va_lo);
    u32 rkey = bpf_ntohl(a.rkey);
    u64 swap = ((u64)bpf_ntohl(a.swap_hi) << 32) | bpf_ntohl(a.swap_lo);
    u64 cmp = ((u64)bpf_ntohl(a.cmp_hi) << 32) | bpf_ntohl(a.cmp_lo);
    if (va & 7)
        return fatal(pl, qp, qpn, psn, AETH_NAK_INV_REQ, TX_NAK_INV_REQ, RX_INVALID_REQUEST);
    u64 off;
    u32 why = mr_check(rkey, qp->pd, ACCESS_REMOTE_ATOMIC, va, 8, &off);
    if (why)
        return fatal(pl, qp, qpn, psn, AETH_NAK_REM_ACCESS, TX_NAK_REM_ACCESS, why);
    u64 *p = word_at(rkey, off);
    if (!p)
        return fatal(pl, qp, qpn, psn, AETH_NAK_INV_REQ, TX_NAK_INV_REQ, RX_INVALID_REQUEST);
    u64 orig;
    if (op == RC_FETCH_ADD)
        orig = __sync_fetch_and_add(p, swap);
    else
        orig = __sync_val_compare_and_swap(p, cmp, swap);
    qp->atomic_orig = orig;
    qp->atomic_psn = psn;
    qp->atomic_valid = 1;
    struct atomic_saved sv = {.psn = psn, .valid = 1, .orig = orig};
    atomic_results.update(&skey, &sv);
    if (!ext) {                      /* MetaRoCE: the caller advances ePSN and the MSN */
        qp->epsn = (psn + 1) & PSN_MASK;
        qp->msn = (qp->msn + 1) & 0xFFFFFF;
        qp->nak_sent = 0;
    }
    set_reply(pl, kind, psn, AETH_ACK_UNLIMITED, ext ? (qp->msn + 1) & 0xFFFFFF : qp->msn,
              TX_ATOMIC_ACK);
    pl->orig = orig;
    return RX_ATOMIC;
}

/* Requester: an ACK or NAK. Only PSNs in [una, next to send) count (RESP-12). */
static __always_inline u32 on_ack(struct xdp_md *ctx, const struct roce_pkt *rp, u32 qpn,
                                  struct nic_qp *qp, u32 psn, u32 l4)
{
    struct aeth ae;
    if (l4 != BTH_LEN + AETH_LEN + ICRC_LEN ||
        bpf_xdp_load_bytes(ctx, rp->bth_off + BTH_LEN, &ae, sizeof(ae)))
        return RX_MALFORMED;
    u32 w = bpf_ntohl(ae.w), syn = w >> 24, msn = w & 0xFFFFFF;
    u32 slot = qp->sq_slot;
    u64 *nxt = sq_psns.lookup(&slot);
    if (!nxt || !qp->sq_open)
        return RX_UNEXPECTED_RESPONSE;
    u32 outstanding = ((u32)*(volatile u64 *)nxt - qp->una) & PSN_MASK;
    u32 d = (psn - qp->una) & PSN_MASK;
    u32 type = syn >> 5;
    if (type == 0) {                            /* ACK: everything up to psn */
        if (d >= PSN_HALF) {                    /* older than what is acknowledged */
            /* the latest ACK repeated (a responder answering retransmitted duplicates):
             * user space hears it, its requester may have gone back behind a READ whose
             * responses were missing when the first copy came */
            if (((qp->una - psn) & PSN_MASK) == 1)
                event(EV_ACK, qpn, psn, syn, 0, 0, 0, 0, msn);
            return RX_DUPLICATE;
        }
        if (d >= outstanding)
            return RX_UNEXPECTED_RESPONSE;      /* beyond what was sent */
        qp->una = (psn + 1) & PSN_MASK;
        qp->acks_received++;
        event(EV_ACK, qpn, psn, syn, 0, 0, 0, 0, msn);
        return RX_ACK;
    }
    if (type == 2)
        return RX_MALFORMED;
    if (d >= outstanding)                       /* a NAK names the first PSN not executed */
        return RX_UNEXPECTED_RESPONSE;
    qp->una = psn;
    if (syn == AETH_NAK_PSN_SEQ)
        qp->packet_seq_err++;
    if (type == 1)
        qp->rnr_nak_received++;
    event(EV_NAK, qpn, psn, syn, 0, 0, 0, 0, msn);
    return RX_ACK;
}

static __always_inline void rd_done(u32 qpn, struct nic_qp *qp, struct rd_slot *sl, u32 psn,
                                    u32 status)
{
    event(EV_RD_DONE, qpn, psn, status, sl->wr_id, sl->length, 0, qp->rd_head, 0);
    qp->rd_head++;
    qp->rd_state = 0;
    qp->rd_off = 0;
    if (((psn - qp->una) & PSN_MASK) < PSN_HALF)
        qp->una = (psn + 1) & PSN_MASK;         /* implicit acknowledgement (RESP-10) */
    /* atomics whose ACKs overtook this READ's responses are already done: step past them */
#pragma unroll
    for (int i = 0; i < RD_DEPTH - 1; i++) {
        u64 k = (u64)qpn << 32 | (qp->rd_head & (RD_DEPTH - 1));
        struct rd_slot *nx = rd_slots.lookup(&k);
        if (!nx || nx->idx != qp->rd_head || nx->kind != RD_DONE)
            break;
        if (((nx->first_psn - qp->una) & PSN_MASK) < PSN_HALF)
            qp->una = (nx->first_psn + 1) & PSN_MASK;
        qp->rd_head++;
    }
}

/* An atomic ACK for a later slot than the head: our responder answers READs from user space
 * and atomics in the kernel, so an atomic's ACK can overtake an earlier READ's responses. Its
 * result is placed and reported now; rd_done steps past the slot when the head gets there. */
static __always_inline u32 atomic_ack_ahead(struct xdp_md *ctx, const struct roce_pkt *rp,
                                            u32 qpn, struct nic_qp *qp, u32 psn, u32 off_v)
{
#pragma unroll
    for (int i = 1; i < RD_DEPTH; i++) {
        u32 idx = qp->rd_head + i;
        u64 k = (u64)qpn << 32 | (idx & (RD_DEPTH - 1));
        struct rd_slot *sl = rd_slots.lookup(&k);
        if (!sl || sl->idx != idx)
            break;
        if (sl->kind != RD_ATOMIC || sl->first_psn != psn)
            continue;
        __be32 v[3];
        if (bpf_xdp_load_bytes(ctx, off_v, v, sizeof(v)))
            return RX_MALFORMED;
        u64 orig = ((u64)bpf_ntohl(v[1]) << 32) | bpf_ntohl(v[2]);
        u64 off;
        u32 why = mr_check(sl->lkey, qp->pd, ACCESS_LOCAL_WRITE, sl->addr, 8, &off);
        int ok = !why && put_u64(sl->lkey, off, orig) == 0;
        u32 status = ok ? 0 : (why ? why : RX_INVALID_REQUEST);
        event(EV_RD_DONE, qpn, psn, status, sl->wr_id, sl->length, 0, idx, 0);
        sl->kind = RD_DONE;
        return ok ? RX_PLACED : status;
    }
    return RX_UNEXPECTED_RESPONSE;
}

/* Requester: READ response packets and atomic ACKs, placed into the local buffer of the
 * outstanding request they answer (in order; a gap asks user space to re-request). */
static __always_inline u32 on_response(struct xdp_md *ctx, const struct roce_pkt *rp, u32 qpn,
                                       struct nic_qp *qp, u8 mop, u32 psn, u32 l4, u32 pad)
{
    /* MetaRoCE responses (0xCD-0xD0, 0xD2) mean what their RC opcode means, with a PETH first
     * (responses are taken in order here; a gap re-requests, as in compat mode) */
    u32 ext = mop >= MR_OPCODE_MIN ? PETH_LEN : 0;
    u8 op = mop & 0x3F;
    u64 k = (u64)qpn << 32 | (qp->rd_head & (RD_DEPTH - 1));
    struct rd_slot *sl = rd_slots.lookup(&k);
    if (!sl || sl->idx != qp->rd_head)
        return RX_UNEXPECTED_RESPONSE;
    if (op == RC_ATOMIC_ACKNOWLEDGE) {
        if (l4 != BTH_LEN + ext + AETH_LEN + ATOMICACKETH_LEN + ICRC_LEN)
            return RX_MALFORMED;
        if (sl->kind != RD_ATOMIC || psn != sl->first_psn)
            return atomic_ack_ahead(ctx, rp, qpn, qp, psn, rp->bth_off + BTH_LEN + ext);
        __be32 v[3];
        if (l4 != BTH_LEN + ext + AETH_LEN + ATOMICACKETH_LEN + ICRC_LEN ||
            bpf_xdp_load_bytes(ctx, rp->bth_off + BTH_LEN + ext, v, sizeof(v)))
            return RX_MALFORMED;
        u64 orig = ((u64)bpf_ntohl(v[1]) << 32) | bpf_ntohl(v[2]);
        u64 off;
        u32 why = mr_check(sl->lkey, qp->pd, ACCESS_LOCAL_WRITE, sl->addr, 8, &off);
        int ok = !why && put_u64(sl->lkey, off, orig) == 0;
        rd_done(qpn, qp, sl, psn, ok ? 0 : (why ? why : RX_INVALID_REQUEST));
        return ok ? RX_PLACED : (why ? why : RX_INVALID_REQUEST);
    }
    if (sl->kind != RD_READ)
        return RX_UNEXPECTED_RESPONSE;
    int first = op == RC_RDMA_READ_RESPONSE_FIRST || op == RC_RDMA_READ_RESPONSE_ONLY;
    int ends = op == RC_RDMA_READ_RESPONSE_LAST || op == RC_RDMA_READ_RESPONSE_ONLY;
    u32 hdrs = BTH_LEN + (ext ? PETH_LEN : op == RC_RDMA_READ_RESPONSE_MIDDLE ? 0 : AETH_LEN);
    if (l4 < hdrs + pad + ICRC_LEN)
        return RX_MALFORMED;
    u32 len = l4 - hdrs - pad - ICRC_LEN;
    /* a READ re-requested from its first missing response (RESP-4 allows a duplicate READ to
     * start inside the original response) restarts there with a FIRST/ONLY: keep what came.
     * A responder may also continue the original response instead (MIDDLE/LAST from there, as
     * Linux rxe does, SEQ-4): after a reported gap that is taken at rd_psn too */
    int resume = first && qp->rd_state && psn == qp->rd_psn && psn != sl->first_psn;
    int cont = !first && (qp->rd_state == 1 || (qp->rd_state == 2 && psn == qp->rd_psn));
    /* a stream from the READ's first PSN again (an older re-request answered late) while
     * responses are placed: what is placed stays (the requester's engine counts it acknowledged
     * and re-requests only after it); that stream is taken again where it reaches rd_psn */
    if (first && !resume && qp->rd_state && qp->rd_psn != sl->first_psn && psn == sl->first_psn)
        return RX_DUPLICATE;
    u32 expect = first && !resume ? sl->first_psn : qp->rd_psn;
    if (psn != expect || (!first && !cont)) {
        u32 npk = (sl->length + (qp->pmtu ? qp->pmtu : 1024) - 1) / (qp->pmtu ? qp->pmtu : 1024);
        u32 ahead = (psn - sl->first_psn) & PSN_MASK;
        if (ahead < npk && qp->rd_state != 2) {   /* a response inside this READ was lost */
            u32 from = qp->rd_state == 1 ? qp->rd_psn : sl->first_psn;
            qp->rd_state = 2;
            qp->rd_psn = from;                    /* where the re-requested responses start */
            event(EV_RD_GAP, qpn, from, 0, sl->wr_id, 0, 0, qp->rd_head, 0);
        }
        return RX_PSN_OUT_OF_ORDER;
    }
    if (first && !resume)
        qp->rd_off = 0;
    if (qp->rd_off + len > sl->length || (ends && qp->rd_off + len != sl->length))
        return RX_MALFORMED;
    if (len) {
        u64 off;
        u32 why = mr_check(sl->lkey, qp->pd, ACCESS_LOCAL_WRITE, sl->addr + qp->rd_off, len, &off);
        if (!why && place(ctx, sl->lkey, off, rp->bth_off + hdrs, len))
            why = RX_MR_BOUNDS;
        if (why) {
            rd_done(qpn, qp, sl, psn, why);
            return why;
        }
    }
    qp->rx_bytes += len;
    qp->rd_off += len;
    qp->rd_psn = (psn + 1) & PSN_MASK;
    qp->rd_state = 1;
    if (ends)
        rd_done(qpn, qp, sl, psn, 0);
    return RX_PLACED;
}

/* ---- MetaRoCE mode (spec 5.2, 5.3): selective repeat, placement on arrival, SACK ---------- */

/* Bit of PSN ePSN + d (1 <= d < MR_WINDOW) in a wire-order 128-bit bitmap: d = 1 is bit 63 of
 * hi, so the bitmap goes on the wire as it is (SACKETH: bit i reports cumulative + 2 + i). */
static __always_inline int bm_test(u64 hi, u64 lo, u32 d)
{
    return d <= 64 ? (hi >> ((64 - d) & 63)) & 1 : (lo >> ((128 - d) & 63)) & 1;
}

static __always_inline void bm_set(u64 *hi, u64 *lo, u32 d)
{
    if (d <= 64)
        *hi |= 1ULL << ((64 - d) & 63);
    else
        *lo |= 1ULL << ((128 - d) & 63);
}

static __always_inline void shl128(u64 *hi, u64 *lo, u32 k)
{
    if (k >= 128) {
        *hi = *lo = 0;
    } else if (k >= 64) {
        *hi = *lo << ((k - 64) & 63);
        *lo = 0;
    } else if (k) {
        *hi = *hi << (k & 63) | *lo >> ((64 - k) & 63);
        *lo <<= (k & 63);
    }
}

/* PSNs ePSN .. ePSN + k - 1 arrived (k = 1, or a READ's response PSNs) and ended a message:
 * move ePSN past them and past every PSN recorded after them; the MSN counts the messages
 * that ended on the way (ends: whether the arriving packet ended one). Returns how many
 * recorded PSNs were passed. */
static __always_inline u32 mr_advance(struct nic_qp *qp, u32 k, u32 ends)
{
    u64 hi = qp->rbm_hi, lo = qp->rbm_lo, ehi = qp->rend_hi, elo = qp->rend_lo;
    u32 epsn = (qp->epsn + k) & PSN_MASK, msn = qp->msn + ends, passed = 0;
    shl128(&hi, &lo, k - 1);
    shl128(&ehi, &elo, k - 1);
#pragma clang loop unroll(disable)
    for (int i = 0; i < MR_WINDOW; i++) {
        u64 c = hi >> 63, e = ehi >> 63;
        hi = hi << 1 | lo >> 63;
        lo <<= 1;
        ehi = ehi << 1 | elo >> 63;
        elo <<= 1;
        if (!c)
            break;
        epsn = (epsn + 1) & PSN_MASK;
        msn += e;
        passed++;
    }
    qp->rbm_hi = hi;
    qp->rbm_lo = lo;
    qp->rend_hi = ehi;
    qp->rend_lo = elo;
    qp->epsn = epsn;
    qp->msn = msn & 0xFFFFFF;
    return passed;
}

/* A SACK for the current receive state (SACK-2), built by turning this packet around. */
static __always_inline void sack(struct plan *pl, struct nic_qp *qp, u32 syn, u8 flags)
{
    set_reply(pl, REPLY_SACK, (qp->epsn - 1) & PSN_MASK, syn, qp->msn, TX_SACK);
    pl->x.flags = flags;
    pl->x.ce_count = qp->ce_count;
    pl->x.bm_hi = qp->rbm_hi;
    pl->x.bm_lo = qp->rbm_lo;
    qp->since_sack = 0;
    qp->sacks_sent++;
}

/* MR_RDMA_WRITE_*: every packet carries PETH and RETH; placed at RETH.VA + PETH.Offset after
 * the whole range is checked (PLACE-2). */
static __always_inline u32 on_mr_write(struct xdp_md *ctx, const struct roce_pkt *rp, u32 qpn,
                                       struct nic_qp *qp, u8 op, u32 psn, u32 l4, u32 pad,
                                       const struct peth *pe, int *ends, struct plan *pl, u32 d)
{
    int has_imm = op == RC_RDMA_WRITE_LAST_WITH_IMMEDIATE || op == RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE;
    int first = op == RC_RDMA_WRITE_FIRST || op == RC_RDMA_WRITE_ONLY ||
                op == RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE;
    *ends = op != RC_RDMA_WRITE_FIRST && op != RC_RDMA_WRITE_MIDDLE;
    u32 hdrs = BTH_LEN + PETH_LEN + RETH_LEN + (has_imm ? IMMDT_LEN : 0);
    if (l4 < hdrs + pad + ICRC_LEN)
        return RX_MALFORMED;
    u32 len = l4 - hdrs - pad - ICRC_LEN;
    struct reth reth;
    if (bpf_xdp_load_bytes(ctx, rp->bth_off + BTH_LEN + PETH_LEN, &reth, sizeof(reth)))
        return RX_MALFORMED;
    u64 va = ((u64)bpf_ntohl(reth.va_hi) << 32) | bpf_ntohl(reth.va_lo);
    u32 rkey = bpf_ntohl(reth.rkey);
    u64 dmalen = bpf_ntohl(reth.dmalen), offset = bpf_ntohl(pe->offset);
    u32 pmtu = qp->pmtu ? qp->pmtu : 1024;
    if (offset + len > dmalen || (*ends && offset + len != dmalen) ||
        (!*ends && len != pmtu) || len > pmtu || (first && offset))
        return fatal(pl, qp, qpn, psn, AETH_NAK_INV_REQ, TX_NAK_INV_REQ, RX_INVALID_REQUEST);
    u32 rsn = bpf_ntohl(pe->rsn) & 0xFFFFFF;
    struct recv_wqe wqe = {};
    int have = 0;
    if (has_imm) {                     /* the immediate consumes receive WQE number RSN */
        have = rq_rsn(qpn, qp, rsn, &wqe);
        if (have < 0)
            return bad_rq(pl, qp, qpn, psn);
        if (!have) {
            sack(pl, qp, AETH_RNR_NAK | (qp->rnr_timer & 0x1f), 0);
            pl->txc = TX_NAK_RNR;
            return RX_RNR;
        }
    }
    if (dmalen) {
        u64 off;
        u32 why = mr_check(rkey, qp->pd, ACCESS_REMOTE_WRITE, va, dmalen, &off);
        if (why)
            return fatal(pl, qp, qpn, psn, AETH_NAK_REM_ACCESS, TX_NAK_REM_ACCESS, why);
        if (place(ctx, rkey, off + offset, rp->bth_off + hdrs, len))
            return fatal(pl, qp, qpn, psn, AETH_NAK_REM_ACCESS, TX_NAK_REM_ACCESS, RX_MR_BOUNDS);
    }
    qp->rx_bytes += len;
    if (have) {                        /* completed by user space once ePSN passes it */
        u32 imm = 0;
        load32(ctx, rp->bth_off + hdrs - IMMDT_LEN, &imm);
        event_va(EV_RECV, qpn, psn, 0, wqe.wr_id, rsn, dmalen, imm,
                 3 | (d == 0 ? 4 : 0) | pl->se, 0);     /* 4: in order, so complete now */
    }
    return RX_PLACED;
}

/* MR_SEND_*: PETH.RSN names the receive WQE, PETH.Offset the place in it (PLACE-3). */
static __always_inline u32 on_mr_send(struct xdp_md *ctx, const struct roce_pkt *rp, u32 qpn,
                                      struct nic_qp *qp, u8 op, u32 psn, u32 l4, u32 pad,
                                      const struct peth *pe, int *ends, struct plan *pl, u32 d)
{
    int has_imm = op == RC_SEND_LAST_WITH_IMMEDIATE || op == RC_SEND_ONLY_WITH_IMMEDIATE;
    int first = op == RC_SEND_FIRST || op == RC_SEND_ONLY || op == RC_SEND_ONLY_WITH_IMMEDIATE;
    *ends = op != RC_SEND_FIRST && op != RC_SEND_MIDDLE;
    u32 hdrs = BTH_LEN + PETH_LEN + (has_imm ? IMMDT_LEN : 0);
    if (l4 < hdrs + pad + ICRC_LEN)
        return RX_MALFORMED;
    u32 len = l4 - hdrs - pad - ICRC_LEN;
    u64 offset = bpf_ntohl(pe->offset);
    u32 pmtu = qp->pmtu ? qp->pmtu : 1024;
    if ((!*ends && len != pmtu) || (first && offset) || len > pmtu)
        return fatal(pl, qp, qpn, psn, AETH_NAK_INV_REQ, TX_NAK_INV_REQ, RX_INVALID_REQUEST);
    u32 rsn = bpf_ntohl(pe->rsn) & 0xFFFFFF;
    struct recv_wqe wqe = {};
    struct recv_wqe *w = &wqe;
    int have = rq_rsn(qpn, qp, rsn, w);
    if (have < 0)
        return bad_rq(pl, qp, qpn, psn);
    if (!have) {                              /* not posted: not recorded, RNR SACK (SACK-6) */
        sack(pl, qp, AETH_RNR_NAK | (qp->rnr_timer & 0x1f), 0);
        pl->txc = TX_NAK_RNR;
        return RX_RNR;
    }
    if (offset + len > w->length) {           /* longer than the receive buffer */
        event(EV_RECV_ERR, qpn, psn, RX_INVALID_REQUEST, w->wr_id, offset + len, 0, 0, qp->msn);
        return fatal(pl, qp, qpn, psn, AETH_NAK_INV_REQ, TX_NAK_INV_REQ, RX_INVALID_REQUEST);
    }
    if (len) {
        u64 off;
        u32 why = mr_check(w->lkey, qp->pd, ACCESS_LOCAL_WRITE, w->addr + offset, len, &off);
        if (!why && place(ctx, w->lkey, off, rp->bth_off + hdrs, len))
            why = RX_MR_BOUNDS;
        if (why) {                   /* our own receive buffer is bad: a local protection error */
            event(EV_RECV_ERR, qpn, psn, why, w->wr_id, 0, 0, 0, qp->msn);
            return fatal(pl, qp, qpn, psn, AETH_NAK_REM_OP, TX_NAK_REM_OP, why);
        }
    }
    qp->rx_bytes += len;
    if (*ends) {                     /* completed by user space once ePSN passes it */
        u32 imm = 0;
        if (has_imm)
            load32(ctx, rp->bth_off + BTH_LEN + PETH_LEN, &imm);
        event_va(EV_RECV, qpn, psn, 0, w->wr_id, rsn, offset + len, imm,
                 (has_imm ? 1 : 0) | (d == 0 ? 4 : 0) | pl->se, 0);   /* 4: in order */
    }
    return RX_PLACED;
}

/* A MetaRoCE request: window and bitmap (SACK-1, SACK-3), placement on arrival (PLACE-1..3),
 * READ and ATOMIC only at the cumulative PSN (PLACE-5), SACK when SACK-2 says so. */
static __always_inline u32 on_mr_request(struct xdp_md *ctx, const struct roce_pkt *rp, u32 qpn,
                                         struct nic_qp *qp, u8 mop, u32 psn, int ackreq, u32 l4,
                                         u32 pad, struct plan *pl)
{
    struct peth pe;
    if (l4 < BTH_LEN + PETH_LEN + ICRC_LEN ||
        bpf_xdp_load_bytes(ctx, rp->bth_off + BTH_LEN, &pe, sizeof(pe)))
        return RX_MALFORMED;
    if ((pe.flags & ~(PETH_F_RETX | PETH_F_ACK_NOW)) || pe.resv ||
        (bpf_ntohl(pe.ssn) >> 24) || (bpf_ntohl(pe.rsn) >> 24))
        return RX_MALFORMED;                  /* EXT-4 */
    u8 op = mop & 0x3F;
    u32 ssn = bpf_ntohl(pe.ssn);
    int now = ackreq || (pe.flags & PETH_F_ACK_NOW);
    int ce = rp->ecn == 3;
    pl->x.path = pe.path;
    pl->x.ts = bpf_ntohl(pe.ts);
    pl->x.ssn = ssn;
    if (ce) {
        qp->np_ecn_marked_roce_packets++;
        qp->ce_count++;
    }
    u32 d = (psn - qp->epsn) & PSN_MASK;
    u32 reason;
    if (d >= PSN_HALF || (d && d < MR_WINDOW && bm_test(qp->rbm_hi, qp->rbm_lo, d))) {
        qp->duplicate_request++;              /* SACK-3 / RESP-4 */
        if (op == RC_RDMA_READ_REQUEST)
            reason = on_read(ctx, rp, qpn, qp, psn, 1, l4, pl, PETH_LEN, ssn);
        else if (op == RC_COMPARE_SWAP || op == RC_FETCH_ADD)
            reason = on_atomic(ctx, rp, qpn, qp, op, psn, 1, l4, pl, PETH_LEN);
        else
            reason = RX_DUPLICATE;
        if (!pl->kind && now)
            sack(pl, qp, AETH_ACK_UNLIMITED, ce ? SACK_F_ECE : 0);
        return reason;
    }
#ifdef MUTANT_WINDOW_OFF_BY_ONE         /* conformance self-test only: accepts ePSN + W */
    if (d > MR_WINDOW)
#else
    if (d >= MR_WINDOW)
#endif
        return RX_BEYOND_WINDOW;              /* not recorded (SACK-1) */
    int ends = 1;
    u32 npsn = 1;
    if (op >= RC_RDMA_WRITE_FIRST && op <= RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE) {
        reason = on_mr_write(ctx, rp, qpn, qp, op, psn, l4, pad, &pe, &ends, pl, d);
    } else if (op <= RC_SEND_ONLY_WITH_IMMEDIATE) {
        reason = on_mr_send(ctx, rp, qpn, qp, op, psn, l4, pad, &pe, &ends, pl, d);
    } else if (op == RC_RDMA_READ_REQUEST || op == RC_COMPARE_SWAP || op == RC_FETCH_ADD) {
        if (d) {                              /* executed only at the cumulative PSN (PLACE-5) */
            qp->out_of_sequence++;
            return RX_BEYOND_WINDOW;
        }
        if (op == RC_RDMA_READ_REQUEST) {
            struct reth reth;
            if (bpf_xdp_load_bytes(ctx, rp->bth_off + BTH_LEN + PETH_LEN, &reth, sizeof(reth)))
                return RX_MALFORMED;
            u32 len = bpf_ntohl(reth.dmalen), pmtu = qp->pmtu ? qp->pmtu : 1024;
            npsn = len ? (len + pmtu - 1) / pmtu : 1;
            reason = on_read(ctx, rp, qpn, qp, psn, 0, l4, pl, PETH_LEN, ssn);
        } else {
            reason = on_atomic(ctx, rp, qpn, qp, op, psn, 0, l4, pl, PETH_LEN);
        }
    } else if ((op | 1) == RC_SEND_ONLY_WITH_INVALIDATE) {
        /* not implemented (optional, HDR-14): an invalid request, never a silent drop */
        return fatal(pl, qp, qpn, psn, AETH_NAK_INV_REQ, TX_NAK_INV_REQ, RX_INVALID_REQUEST);
    } else {
        return RX_UNSUPPORTED_OPCODE;
    }
    if (reason != RX_PLACED && reason != RX_READ_REQUEST && reason != RX_ATOMIC)
        return reason;                        /* RNR, fatal or malformed: not recorded */
    u32 passed = 0;
    if (d == 0) {
        qp->ooo_run = 0;
        passed = mr_advance(qp, npsn, ends);
        if (passed)                           /* a hole filled: user space may complete more */
            event(EV_EPSN, qpn, qp->epsn, 0, 0, 0, 0, passed, qp->msn);
    } else {
        bm_set(&qp->rbm_hi, &qp->rbm_lo, d);
        if (ends)
            bm_set(&qp->rend_hi, &qp->rend_lo, d);
        qp->out_of_sequence++;
    }
    if (pl->kind)                             /* an atomic ACK already answers it */
        return reason;
    u8 flags = ce ? SACK_F_ECE : 0;
    int send = now && reason != RX_READ_REQUEST;   /* a READ is acknowledged by its responses */
    if (d) {
        if (qp->ooo_run % SACK_OOO_EVERY == 0) {
            flags |= SACK_F_OOO;
            send = 1;
        }
        qp->ooo_run++;
    }
    if (ce && qp->ce_count % SACK_CE_EVERY == 1)
        send = 1;
    if (++qp->since_sack >= SACK_EVERY)
        send = 1;
    if (send)
        sack(pl, qp, AETH_ACK_UNLIMITED, flags);
    return reason;
}

/* Requester: an MR_SACK. The cumulative PSN acknowledges everything before it; the bitmap is
 * kept for user space, which repairs holes selectively (SACK-4, SACK-5). */
static __always_inline u32 on_sack(struct xdp_md *ctx, const struct roce_pkt *rp, u32 qpn,
                                   struct nic_qp *qp, u32 psn, u32 l4)
{
    struct {
        __be32 aeth;
        __u8 path;
        __u8 flags;
        __be16 resv;
        __be32 limit;
        __be32 ts;
        __be32 ce;
        __be32 bm[4];
    } sk;
    if (l4 != BTH_LEN + AETH_LEN + SACKETH_LEN + ICRC_LEN ||
        bpf_xdp_load_bytes(ctx, rp->bth_off + BTH_LEN, &sk, sizeof(sk)))
        return RX_MALFORMED;
    u32 w = bpf_ntohl(sk.aeth), syn = w >> 24, msn = w & 0xFFFFFF, type = syn >> 5;
    u32 slot = qp->sq_slot;
    u64 *nxt = sq_psns.lookup(&slot);
    if (!nxt || !qp->sq_open)
        return RX_UNEXPECTED_RESPONSE;
    u32 outstanding = ((u32)*(volatile u64 *)nxt - qp->una) & PSN_MASK;
    qp->sacks_received++;
    if (sk.flags & SACK_F_ECE)                /* congestion echoed (counted; the flag travels */
        qp->rp_cnp_handled++;                 /* to the rate controller in the event) */
    /* One event per SACK that says anything: EV_SACK with psn = the cumulative PSN (for a
     * fatal NAK the offending PSN), the syndrome, the bitmap (wr_id: bits of PSNs cum + 2 ..
     * cum + 65, most significant first; va: the next 64), len = the credit (CREDIT_VALID |
     * Limit PSN, or 0), imm = the timestamp echo (an RTT sample), flags = 1 | PathID << 8 |
     * the SACK's flags << 16 (MP-2: feedback, ECN included, is the path's). */
    u32 fb = 1 | (u32)sk.path << 8 | (u32)sk.flags << 16;
    if (type == 3) {                          /* fatal NAK: BTH.PSN is the offending PSN */
        if (((psn - qp->una) & PSN_MASK) >= outstanding)
            return RX_UNEXPECTED_RESPONSE;
        qp->una = psn;
        event_va(EV_SACK, qpn, psn, syn, 0, 0, 0, bpf_ntohl(sk.ts), fb, msn);
        return RX_ACK;
    }
    if (type == 2)
        return RX_MALFORMED;
    u32 d = (psn + 1 - qp->una) & PSN_MASK;  /* PSNs newly covered by the cumulative PSN */
    if (d >= PSN_HALF)
        d = 0;                                /* older than what is acknowledged */
    if (d > outstanding)
        return RX_UNEXPECTED_RESPONSE;        /* beyond what was sent (RESP-12) */
    u32 cred = sk.flags & SACK_F_CREDIT_VALID ? CREDIT_VALID | (bpf_ntohl(sk.limit) & PSN_MASK) : 0;
    qp->credit = cred;
    if (d) {
        qp->una = (psn + 1) & PSN_MASK;
        qp->acks_received++;
    }
    if (type == 1)                            /* RNR: PSN cumulative + 1 waits (SACK-6) */
        qp->rnr_nak_received++;
    u64 hi = (u64)bpf_ntohl(sk.bm[0]) << 32 | bpf_ntohl(sk.bm[1]);
    u64 lo = (u64)bpf_ntohl(sk.bm[2]) << 32 | bpf_ntohl(sk.bm[3]);
    qp->sbm_hi = hi;
    qp->sbm_lo = lo;
    qp->sack_cum = psn;
    if (d || cred || (hi | lo) || type == 1 || (sk.flags & SACK_F_ECE))
        event_va(EV_SACK, qpn, psn, syn, hi, lo, cred, bpf_ntohl(sk.ts), fb, msn);
    return d || (hi | lo) || type == 1 ? RX_ACK : RX_DUPLICATE;
}

static __always_inline int from_peer(const struct roce_pkt *rp, const struct nic_qp *qp)
{
#ifdef MUTANT_NO_SOURCE_CHECK          /* conformance self-test only: any source accepted */
    return 1;
#endif
    if (!qp->peer_set)
        return 1;
#pragma unroll
    for (int i = 0; i < 16; i++)
        if (rp->saddr[i] != qp->peer_ip[i])
            return 0;
    return 1;
}

/* Stage 1 of the NIC's receive path for one frame: parse, find the QP, check the headers and
 * the QP's end-to-end integrity check; a frame that passes goes on to stage 2 (nic_rx_act). */
static __always_inline int nic_rx_check(struct xdp_md *ctx)
{
    void *data = (void *)(long)ctx->data, *data_end = (void *)(long)ctx->data_end;
    struct roce_pkt rp;
    int rc = parse_roce(data, data_end, &rp);
    if (rc == PARSE_NOT_ROCE)
        return verdict(RX_NOT_ROCE, XDP_PASS);
    u32 blen = bpf_xdp_get_buff_len(ctx), lin = data_end - data;
    port_count(PORT_RCV_PACKETS, blen);
    if (lin < blen) {                       /* a multi-buffer frame (frags) */
        port_count_one(PORT_RCV_MULTI_BUF);
        /* the reply is built in the linear part: if it cannot hold the longest one, refuse
         * the frame now, before it is executed (else it would be placed, its PSN taken, and
         * then counted malformed when the reply does not fit) */
        if (lin < REPLY_MAX_LEN)
            return verdict(RX_MALFORMED, XDP_DROP);
    }
    struct rx_bth h;
    if (rc || read_bth(ctx, &rp, &h))
        return verdict(RX_MALFORMED, XDP_DROP);
    struct bth bth = h.bth;
    u32 l4 = h.l4, qpn = h.qpn, pad = h.pad;
    u8 op = h.op;
    struct nic_qp *qp = qps.lookup(&qpn);
    if (!qp)
        return verdict(RX_UNKNOWN_QP, XDP_DROP);
    if (!from_peer(&rp, qp))
        return verdict(RX_WRONG_SOURCE, XDP_DROP);
    int mr = op >= MR_OPCODE_MIN;
    /* SEND with invalidate (0x16, 0x17; 0xD6, 0xD7) passes: not implemented, it is answered
     * NAK 0x61 below (HDR-15); 0x15 and 0xD5 are reserved */
    if ((op > RC_SEND_ONLY_WITH_INVALIDATE && op != CNP_OPCODE && !mr) ||
        (mr && op > (MR_OPCODE_MIN | RC_SEND_ONLY_WITH_INVALIDATE)) || (op & 0x3F) == 0x15)
        return verdict(RX_UNSUPPORTED_OPCODE, XDP_DROP);
    if (op != CNP_OPCODE && mr != !!qp->metaroce)  /* the other mode's opcodes (EXT-2) */
        return verdict(RX_WRONG_MODE, XDP_DROP);
    /* Header rules computed without branches into fresh values, so that the checks refine no
     * register the ICRC loop below depends on (the verifier would otherwise verify that loop
     * once per refined state and run out of budget):
     *  - TVer must be 0 (HDR-1);
     *  - BTH through ICRC is a multiple of 4 bytes, and only payload opcodes may pad (WIRE-10);
     *  - the QP's P_Key is the default 0xFFFF, a full member: only 0x7FFF/0xFFFF match (HDR-2);
     *    a CNP is exempt, whatever its P_Key (HDR-12: NICs send 0xFFFF in every partition). */
    {
        u32 rop = op & 0x3F;
        u32 cls = (op >> 6) ^ 2;                          /* 0 for CNP's class (0x80-0xBF) */
        u32 payload = (u32)(PAYLOAD_OPCODES >> rop) & ((cls | cls >> 1) & 1);
        u32 bad = (bth.flags & 0x0F) | (l4 & 3) | (pad & (payload - 1));
        if (bad)
            return verdict(RX_MALFORMED, XDP_DROP);
        u32 pk = ((bpf_ntohs(bth.pkey) & 0x7FFF) ^ 0x7FFF) & -(u32)(op != CNP_OPCODE);
        if (pk)
            return verdict(RX_BAD_PKEY, XDP_DROP);
    }
    /* every packet of a known QP passes its QP's check before anything else is read (ICRC-1,
     * INT-3): the ICRC, or on a MetaRoCE QP that negotiated CSUM the IPv4/UDP checksums */
    if (qp->integrity == INT_CSUM) {
        port_count_one(PORT_RCV_CSUM_CHECKED);
#ifndef MUTANT_SKIP_CSUM                /* conformance self-test only: checksums not checked */
        if (!csum_ok(ctx, &rp, l4))
            return verdict(RX_BAD_CSUM, XDP_DROP);
#endif
    } else {
        port_count_one(PORT_RCV_ICRC_CHECKED);
#ifndef MUTANT_SKIP_ICRC                /* conformance self-test only: ICRC not checked */
        if (!icrc_ok(ctx, &rp, l4))
            return verdict(RX_BAD_ICRC, XDP_DROP);
#endif
    }
    /* checked: the rest runs as a program of its own (a tail call), so that each of the two
     * stays well inside the verifier's budget of 1,000,000 instructions walked */
    nic_stages.call(ctx, STAGE_ACT);
    return verdict(RX_MALFORMED, XDP_DROP);     /* no second stage: never once loaded */
}

/* Stage 2 of the receive path: a frame of a known QP that passed every check of stage 1
 * (nic_rx_check, the same frame, a moment earlier on the same CPU) is executed: placed,
 * answered, reported. The headers are read again (nothing is passed between the stages but
 * the frame); what stage 1 refused never gets here. */
static __always_inline int nic_rx_act(struct xdp_md *ctx)
{
    void *data = (void *)(long)ctx->data, *data_end = (void *)(long)ctx->data_end;
    struct roce_pkt rp;
    struct rx_bth h;
    if (parse_roce(data, data_end, &rp) || read_bth(ctx, &rp, &h))
        return verdict(RX_MALFORMED, XDP_DROP);
    u32 l4 = h.l4, qpn = h.qpn, psn = h.psn, pad = h.pad;
    u32 se = h.bth.flags & 0x80 ? RECV_F_SOLICITED : 0;
    int ackreq = h.ackreq;
    u8 op = h.op;
    struct nic_qp *qp = qps.lookup(&qpn);
    if (!qp)                                /* destroyed between the two stages */
        return verdict(RX_UNKNOWN_QP, XDP_DROP);
    int mr = op >= MR_OPCODE_MIN;
    qp->rx_packets++;
    struct plan pl = {};
    pl.se = se;
    u32 reason;

    if (op == CNP_OPCODE) {                         /* the peer saw CE on our packets */
        qp->rp_cnp_handled++;
        event(EV_CNP, qpn, 0, 0, 0, 0, 0, 0, 0);
        return verdict(RX_CNP, XDP_DROP);
    }
    if (mr) {
        if (op == MR_SACK)
            return verdict(on_sack(ctx, &rp, qpn, qp, psn, l4), XDP_DROP);
        if ((op >= MR_RDMA_READ_RESPONSE_FIRST && op <= MR_RDMA_READ_RESPONSE_ONLY) ||
            op == MR_ATOMIC_ACKNOWLEDGE)           /* READ responses, MR atomic ACK */
            return verdict(on_response(ctx, &rp, qpn, qp, op, psn, l4, pad), XDP_DROP);
        if (qp->state == QP_RX_ERROR)
            return verdict(RX_QP_ERROR, XDP_DROP);
        reason = on_mr_request(ctx, &rp, qpn, qp, op, psn, ackreq, l4, pad, &pl);
        if (pl.kind == REPLY_SACK && !(pl.syndrome >> 5)) {
            u32 *share = credit.lookup(&qpn);      /* incast: grant this sender its share */
            if (share && *share) {
                pl.x.flags |= SACK_F_CREDIT_VALID;
                pl.x.limit = (pl.psn + 1 + *share) & PSN_MASK;
            }
        }
        if (pl.kind)
            return reply(ctx, &rp, &pl, qp, reason);
        return verdict(reason, XDP_DROP);
    }
    if (op == RC_ACKNOWLEDGE)
        return verdict(on_ack(ctx, &rp, qpn, qp, psn, l4), XDP_DROP);
    if (op >= RC_RDMA_READ_RESPONSE_FIRST && op <= RC_ATOMIC_ACKNOWLEDGE)
        return verdict(on_response(ctx, &rp, qpn, qp, op, psn, l4, pad), XDP_DROP);

    /* a request (responder side) */
#ifndef MUTANT_ERR_NOT_STICKY           /* conformance self-test only: ERR keeps answering */
    if (qp->state == QP_RX_ERROR)
        return verdict(RX_QP_ERROR, XDP_DROP);
#endif
    qp->np_ecn_marked_roce_packets += (rp.ecn + 1) >> 2;   /* CE (3) only; no branch, so the
                                                          * verifier does not split every path */
    u32 ahead = (psn - qp->epsn) & PSN_MASK;
    if (ahead && ahead < PSN_HALF) {           /* a gap: NAK it once, drop until it fills */
        qp->out_of_sequence++;
#ifndef MUTANT_NAK_EVERY_GAP            /* conformance self-test only: NAKs every ahead packet */
        if (qp->nak_sent)
            return verdict(RX_PSN_OUT_OF_ORDER, XDP_DROP);
#endif
        qp->nak_sent = 1;
        set_reply(&pl, REPLY_ACK, qp->epsn, AETH_NAK_PSN_SEQ, qp->msn, TX_NAK_SEQ);
        return reply(ctx, &rp, &pl, qp, RX_PSN_OUT_OF_ORDER);
    }
    if (ahead) {                               /* a duplicate (RESP-4) */
        qp->duplicate_request++;
        if (op == RC_RDMA_READ_REQUEST)
            reason = on_read(ctx, &rp, qpn, qp, psn, 1, l4, &pl, 0, 0);
        else if (op == RC_COMPARE_SWAP || op == RC_FETCH_ADD)
            reason = on_atomic(ctx, &rp, qpn, qp, op, psn, 1, l4, &pl, 0);
        else {
#ifndef MUTANT_NO_DUP_REACK             /* conformance self-test only: duplicates not re-ACKed */
            set_reply(&pl, REPLY_ACK, (qp->epsn - 1) & PSN_MASK, AETH_ACK_UNLIMITED, qp->msn,
                      TX_ACK);
#endif
            reason = RX_DUPLICATE;
        }
    } else if (op >= RC_RDMA_WRITE_FIRST && op <= RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE) {
        reason = on_write(ctx, &rp, qpn, qp, op, psn, ackreq, l4, pad, &pl);
    } else if (op <= RC_SEND_ONLY_WITH_IMMEDIATE) {
        reason = on_send(ctx, &rp, qpn, qp, op, psn, ackreq, l4, pad, &pl);
    } else if (op == RC_RDMA_READ_REQUEST) {
        reason = on_read(ctx, &rp, qpn, qp, psn, 0, l4, &pl, 0, 0);
    } else if (op == RC_COMPARE_SWAP || op == RC_FETCH_ADD) {
        reason = on_atomic(ctx, &rp, qpn, qp, op, psn, 0, l4, &pl, 0);
    } else if ((op | 1) == RC_SEND_ONLY_WITH_INVALIDATE) {   /* optional (HDR-14): NAK 0x61 */
        reason = fatal(&pl, qp, qpn, psn, AETH_NAK_INV_REQ, TX_NAK_INV_REQ, RX_INVALID_REQUEST);
    } else {
        reason = RX_UNSUPPORTED_OPCODE;         /* a response opcode handled above */
    }
    /* CE: tell the sender, at most once per interval (COMPAT-7). One packet in, one out: a CE
     * mark is owed a CNP until one goes, so when a reply is due now (or the interval has not
     * passed) the CNP goes instead of the answer to a later request packet that needs none; a
     * reply never cancels it. (ecn + 1) >> 2 is 1 for CE only, without a branch. */
    qp->cnp_owed |= (rp.ecn + 1) >> 2;
    if (!pl.kind && qp->cnp_owed) {
        u64 now = bpf_ktime_get_ns();
        if (now >= qp->cnp_next_ns) {
            qp->cnp_owed = 0;
            qp->cnp_next_ns = now + CNP_INTERVAL_NS;
            qp->np_cnp_sent++;
            pl.kind = REPLY_CNP;
            pl.txc = TX_CNP;
        }
    }
    if (pl.kind)
        return reply(ctx, &rp, &pl, qp, reason);
    return verdict(reason, XDP_DROP);
}

#ifndef NIC_STEER
/* The program on the device when receive steering is off: every frame is handled on the CPU
 * it arrived on; nic_rx_2 is its second stage, in nic_stages. (One build holds either these or
 * the steering set, never both: each copy of the receive path doubles the compile.) */
int nic_rx(struct xdp_md *ctx)
{
    return nic_rx_check(ctx);
}

int nic_rx_2(struct xdp_md *ctx)
{
    return nic_rx_act(ctx);
}
#else

/* Run by the rx_cpus entry of the CPU a frame was handed to by nic_steer; nic_rx_cpu_2 is its
 * second stage. A cpumap program cannot XDP_TX: a reply leaves by redirect to the device
 * (tx_port). The choice is made once, after every path of the stage has returned, so the
 * verifier walks it as it does nic_rx_2 (a redirect inside reply() cost ~7,000 more
 * instructions of its budget). */
int nic_rx_cpu(struct xdp_md *ctx)
{
    return nic_rx_check(ctx);
}

int nic_rx_cpu_2(struct xdp_md *ctx)
{
    int action = nic_rx_act(ctx);
    return action == XDP_TX ? tx_port.redirect_map(0, XDP_DROP) : action;
}

/* The program on the device when receive steering is on: a RoCE frame is handed to the CPU of
 * its destination QP (rx_qp_cpu, written by the daemon; frames of no known QP go to the
 * default CPU, whose nic_rx_cpu counts and drops them), so all of a QP's state is touched by
 * one CPU whatever queue or CPU its frames arrive on. Other frames pass to the stack here. */
int nic_steer(struct xdp_md *ctx)
{
    void *data = (void *)(long)ctx->data, *data_end = (void *)(long)ctx->data_end;
    struct roce_pkt rp = {};
    int rc = parse_roce(data, data_end, &rp);
    if (rc == PARSE_NOT_ROCE)
        return verdict(RX_NOT_ROCE, XDP_PASS);
    struct rx_bth h;
    u32 key = STEER_DEFAULT_KEY;             /* malformed: the default CPU counts it */
    if (!rc && !read_bth(ctx, &rp, &h))
        key = h.qpn;
    u32 *cpu = rx_qp_cpu.lookup(&key);
    if (!cpu) {
        key = STEER_DEFAULT_KEY;
        cpu = rx_qp_cpu.lookup(&key);
        if (!cpu)
            return verdict(RX_UNKNOWN_QP, XDP_DROP);
    }
    port_count_one(PORT_RCV_STEERED);
    return rx_cpus.redirect_map(*cpu, XDP_DROP);
}
#endif
