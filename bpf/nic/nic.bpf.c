/* The MetaRoCE NIC, receive path (first slice): RoCEv2 RC RDMA WRITE in compat mode (in-order
 * PSNs). Checks QP and ICRC, then PSN (a gap is NAKed once, a duplicate re-ACKed), opcode
 * sequence, rkey, PD, access and bounds, then copies the payload straight into the MR's memory
 * (an mmap-able array map found by rkey) and, when the requester asked (AckReq), turns the
 * packet into its ACK (XDP_TX). Other RoCE opcodes go to user space (XDP_PASS for now);
 * everything that is not RoCE passes untouched.
 * Map syntax is rewritten by BCC only in this file, so all lookups live here. */
#include "nic_maps.h"
#include "nic_parse.h"

static __always_inline int verdict(u32 reason, int action)
{
    u64 *c = rx_counters.lookup(&reason);
    if (c)
        (*c)++;
    return action;
}

/* Copy len payload bytes at pkt_off into the MR at byte offset off. The destination offset is
 * checked at run time (a dynptr over the chunk), so any alignment works and a payload may
 * straddle two chunks. Returns 0 on success. */
static __always_inline int place(struct xdp_md *ctx, void *mem, u64 off, u32 pkt_off, u32 len,
                                 struct scratch *s)
{
    if (len == 0)
        return 0;
    if (len > MAX_PAYLOAD)
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

/* Send an ACK/NAK back out of the port the request came in on (XDP_TX). */
static __always_inline int reply(struct xdp_md *ctx, const struct roce_pkt *rp, u32 dqpn, u32 psn,
                                 u8 syndrome, u32 msn, u32 reason, u32 txc)
{
    u32 zero = 0;
    struct crc_tables *T = crc_tab.lookup(&zero);
    struct icrc_scratch *s = icrc_scratch.lookup(&zero);
    if (!T || !s)
        return verdict(reason, XDP_DROP);
    void *data = (void *)(long)ctx->data, *data_end = (void *)(long)ctx->data_end;
    u32 len = rp->ipver == 6 ? build_ack(data, data_end, 1, dqpn, psn, syndrome, msn, T, s)
                             : build_ack(data, data_end, 0, dqpn, psn, syndrome, msn, T, s);
    if (!len)
        return verdict(RX_MALFORMED, XDP_DROP);
    int delta = (int)len - (int)bpf_xdp_get_buff_len(ctx);
    if (delta && bpf_xdp_adjust_tail(ctx, delta))
        return verdict(RX_MALFORMED, XDP_DROP);
    u64 *c = tx_counters.lookup(&txc);
    if (c)
        (*c)++;
    return verdict(reason, XDP_TX);
}

int nic_rx(struct xdp_md *ctx)
{
    void *data = (void *)(long)ctx->data, *data_end = (void *)(long)ctx->data_end;
    struct roce_pkt rp;
    int rc = parse_roce(data, data_end, &rp);
    if (rc == PARSE_NOT_ROCE)
        return verdict(RX_NOT_ROCE, XDP_PASS);
    if (rc)
        return verdict(RX_MALFORMED, XDP_DROP);
    struct bth bth;
    if (bpf_xdp_load_bytes(ctx, rp.bth_off, &bth, sizeof(bth)))
        return verdict(RX_MALFORMED, XDP_DROP);
    u32 l4 = rp.udp_len - sizeof(struct udphdr);        /* BTH .. ICRC */
    if (rp.bth_off + l4 > bpf_xdp_get_buff_len(ctx))
        return verdict(RX_MALFORMED, XDP_DROP);
    u32 qpn = bpf_ntohl(bth.dqpn) & 0xFFFFFF;
    u32 psn = bpf_ntohl(bth.psn) & PSN_MASK;
    int ackreq = !!(bpf_ntohl(bth.psn) & BTH_ACKREQ);
    u8 op = bth.opcode;
    u32 pad = (bth.flags >> 4) & 3;
    struct qp_rx *qp = qps.lookup(&qpn);
    if (!qp)
        return verdict(RX_UNKNOWN_QP, XDP_DROP);
    if (op < RC_RDMA_WRITE_FIRST || op > RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE)
        return verdict(RX_UNSUPPORTED_OPCODE, XDP_PASS);
    if (!icrc_ok(ctx, &rp, l4))
        return verdict(RX_BAD_ICRC, XDP_DROP);
    /* compat mode (go-back-N): only the expected PSN is accepted */
    u32 ahead = (psn - qp->epsn) & PSN_MASK;
    if (ahead && ahead < PSN_HALF) {           /* a gap: NAK it once, drop until it fills */
        if (qp->nak_sent)
            return verdict(RX_PSN_OUT_OF_ORDER, XDP_DROP);
        qp->nak_sent = 1;
        return reply(ctx, &rp, qp->dqpn, qp->epsn, AETH_NAK_PSN_SEQ, qp->msn,
                     RX_PSN_OUT_OF_ORDER, TX_NAK_SEQ);
    }
    if (ahead)                                 /* a duplicate: re-ACK what we have */
        return reply(ctx, &rp, qp->dqpn, (qp->epsn - 1) & PSN_MASK, AETH_ACK_UNLIMITED, qp->msn,
                     RX_DUPLICATE, TX_ACK);

    int has_reth = op == RC_RDMA_WRITE_FIRST || op == RC_RDMA_WRITE_ONLY ||
                   op == RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE;
    int has_imm = op == RC_RDMA_WRITE_LAST_WITH_IMMEDIATE || op == RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE;
    int ends = op != RC_RDMA_WRITE_FIRST && op != RC_RDMA_WRITE_MIDDLE;
    u32 hdrs = BTH_LEN + (has_reth ? RETH_LEN : 0) + (has_imm ? 4 : 0);
    if (l4 < hdrs + pad + ICRC_LEN)
        return verdict(RX_MALFORMED, XDP_DROP);
    u32 len = l4 - hdrs - pad - ICRC_LEN;

    u64 va, left;
    u32 rkey;
    if (has_reth) {
        struct reth reth;
        if (qp->state != QP_RX_IDLE)
            return verdict(RX_BAD_OPCODE_SEQ, XDP_DROP);
        if (bpf_xdp_load_bytes(ctx, rp.bth_off + BTH_LEN, &reth, sizeof(reth)))
            return verdict(RX_MALFORMED, XDP_DROP);
        va = ((u64)bpf_ntohl(reth.va_hi) << 32) | bpf_ntohl(reth.va_lo);
        rkey = bpf_ntohl(reth.rkey);
        left = bpf_ntohl(reth.dmalen);
    } else {
        if (qp->state != QP_RX_IN_WRITE)
            return verdict(RX_BAD_OPCODE_SEQ, XDP_DROP);
        va = qp->wr_va;
        rkey = qp->wr_rkey;
        left = qp->wr_left;
    }
    if (len > left || (ends && len != left))
        return verdict(RX_MALFORMED, XDP_DROP);      /* payload and DMA length disagree */

    struct mr_info *mr = mr_infos.lookup(&rkey);
    void *mem = mrs.lookup(&rkey);
    if (!mr || !mem)
        return verdict(RX_BAD_RKEY, XDP_DROP);
    if (mr->pd != qp->pd || !(mr->access & ACCESS_REMOTE_WRITE))
        return verdict(RX_MR_ACCESS, XDP_DROP);
    if (va < mr->va || va - mr->va > mr->length || len > mr->length - (va - mr->va))
        return verdict(RX_MR_BOUNDS, XDP_DROP);

    u32 zero = 0;
    struct scratch *s = scratch.lookup(&zero);
    if (!s || place(ctx, mem, va - mr->va, rp.bth_off + hdrs, len, s))
        return verdict(RX_MR_BOUNDS, XDP_DROP);

    qp->wr_va = va + len;
    qp->wr_rkey = rkey;
    qp->wr_left = left - len;
    qp->state = ends ? QP_RX_IDLE : QP_RX_IN_WRITE;
    qp->epsn = (psn + 1) & PSN_MASK;
    qp->nak_sent = 0;
    if (ends)
        qp->msn = (qp->msn + 1) & 0xFFFFFF;
    if (ackreq)
        return reply(ctx, &rp, qp->dqpn, psn, AETH_ACK_UNLIMITED, qp->msn, RX_PLACED, TX_ACK);
    return verdict(RX_PLACED, XDP_DROP);       /* consumed; a later AckReq acknowledges it */
}
