/* Requester and responder transmit: segment one message (RDMA WRITE, SEND, READ response) into
 * RoCEv2 frames (FIRST/MIDDLE/LAST or ONLY, RETH / ImmDt / AETH where they belong, AckReq on
 * the last request packet and every ACKREQ_EVERY packets), or build one READ request or atomic
 * request, with IP/UDP checksums and the ICRC, written straight into an AF_XDP socket's UMEM
 * and queued in batches. In MetaRoCE mode the same messages use the 0xC0 | opcode forms with a
 * PETH on every packet and the RETH on every WRITE packet (spec 5.1, PLACE-2). The transport
 * engine's packet descriptors (struct mre_pkt, metaroce/cengine/mre.h) become frames the same
 * way (mr_build_pkt, mr_send_pkts). */
#ifndef METAROCE_ROCE_TX_H
#define METAROCE_ROCE_TX_H

#include <stdint.h>

#include "mre.h"

struct mr_xsk;

/* Everything the headers of one QP's packets need. */
struct mr_roce_flow {
    uint8_t dmac[6];
    uint8_t smac[6];
    uint8_t ipv6;          /* 0: IPv4, 1: IPv6 */
    uint8_t tos;           /* DSCP << 2 | ECN */
    uint8_t ttl;
    uint8_t csum;          /* 1: a UDP checksum over IPv4 too (the QP negotiated CSUM, INT-2);
                            * over IPv6 it is always filled */
    uint8_t src_ip[16];    /* IPv4 uses the first 4 bytes */
    uint8_t dst_ip[16];
    uint16_t sport;        /* UDP source port: the flow's entropy (one path) */
    uint16_t pkey;
    uint32_t dqpn;
    /* MetaRoCE multipath (spec 5.4): with npaths >= 1 a packet with PSN p, sent for the r-th
     * time (r = msg.retx), goes on path (p + r) % npaths (MP-3: per packet, a retransmission
     * on another path), with that path's source port and its PathID in the PETH (MP-1).
     * npaths 0: every packet on sport, PathID msg.path. Up to 8 paths (cffi: literal sizes). */
    uint8_t npaths;
    uint8_t pad2[3];
    uint16_t sports[8];        /* source port of each PathID; the control plane repaths one
                                * by changing its port (MP-5) */
    uint32_t path_pkts[8];     /* packets built per path (MP-4) */
};

/* struct mr_roce_msg.kind */
#define MR_MSG_WRITE 1
#define MR_MSG_SEND 2
#define MR_MSG_READ_RESP 3
#define MR_MSG_READ_REQ 4
#define MR_MSG_CMP_SWAP 5
#define MR_MSG_FETCH_ADD 6

/* One message. Payload-carrying kinds (WRITE, SEND, READ_RESP) take ceil(len / pmtu) packets
 * (one when len is 0); the others take one packet. */
struct mr_roce_msg {
    uint8_t kind;          /* MR_MSG_* */
    uint8_t with_imm;      /* WRITE / SEND with immediate */
    uint8_t solicited;
    uint8_t metaroce;      /* 1: MetaRoCE opcodes with a PETH on every packet (spec 5.1) */
    uint32_t imm;          /* immediate data (host order; sent big-endian) */
    uint32_t pmtu;
    uint32_t psn0;         /* PSN of the first packet */
    uint32_t rkey;         /* WRITE / READ_REQ / atomics */
    uint32_t msn;          /* READ_RESP: the MSN in its AETH */
    uint64_t va;           /* WRITE / READ_REQ / atomics: the remote address */
    uint64_t len;          /* payload length (READ_REQ: the DMA length) */
    uint64_t swap_add;     /* atomics */
    uint64_t compare;
    /* MetaRoCE only (PETH, EXT-5) */
    uint32_t ssn;          /* the request's send sequence number (responses echo it) */
    uint32_t rsn;          /* the receive WQE a SEND / WRITE_IMM consumes */
    uint8_t path;          /* PathID */
    uint8_t retx;          /* set PETH.RETX on what is sent now */
    uint16_t pad2;
    uint32_t ack_at;       /* 1 + the packet index that asks for a SACK at once (ACK_NOW), or 0 */
};

/* Packets the message takes. */
uint32_t mr_msg_packets(const struct mr_roce_msg *m);

/* Build packet idx of message m (payload at data) into out (cap bytes); returns its length, 0
 * if it does not fit or idx is past the end. */
uint32_t mr_roce_build(uint8_t *out, uint32_t cap, struct mr_roce_flow *f,
                       const struct mr_roce_msg *m, const uint8_t *data, uint32_t idx);

/* Queue packets *next .. of message m (as many as the rings take); *next advances. Returns the
 * number queued by this call (0 when the rings are full: reap completions and call again). */
uint32_t mr_send_msg(struct mr_xsk *x, struct mr_roce_flow *f, const struct mr_roce_msg *m,
                     const uint8_t *data, uint32_t *next);

/* Queue packets *next .. end - 1 only (a selective retransmission); as mr_send_msg. */
uint32_t mr_send_range(struct mr_xsk *x, struct mr_roce_flow *f, const struct mr_roce_msg *m,
                       const uint8_t *data, uint32_t *next, uint32_t end);

/* The WRITE-only forms of the two above (kept for their callers). */
uint32_t mr_send_write(struct mr_xsk *x, struct mr_roce_flow *f, const uint8_t *data,
                       uint64_t len, uint32_t pmtu, uint32_t psn0, uint64_t va, uint32_t rkey,
                       uint64_t *offset);
uint32_t mr_roce_build_write(uint8_t *out, uint32_t cap, struct mr_roce_flow *f,
                             const uint8_t *data, uint64_t len, uint32_t pmtu, uint32_t psn0,
                             uint64_t va, uint32_t rkey, uint64_t idx);

/* Build the frame of one engine packet descriptor into out (cap bytes): Ethernet, IPv4 or IPv6
 * (from the flow), UDP (source port p->sport, destination 4791), BTH, the extension headers the
 * descriptor names (p->has), the payload (p->data, p->len bytes), pad, ICRC. Returns the frame's
 * length, 0 if it does not fit in cap or the descriptor is malformed. f->sport/npaths/sports
 * are NOT used: the descriptor says the port. f->path_pkts[p->path & 7] is incremented.
 *
 * All descriptor fields are host order. BTH: opcode p->opcode (MetaRoCE opcodes include 0xC0),
 * AckReq = p->flags & MRE_PF_ACK_REQ, P_Key f->pkey, DestQP p->dest_qp (not f->dqpn), PSN
 * p->psn, TVer 0; SE on a SEND LAST/ONLY (with or without immediate, either mode) when bit 0 of
 * p->se is set: the message's SE (solicited event), set by the engine / the wire adapter.
 * Extension headers in wire order: PETH (MRE_H_PETH: p->path, flags RETX if MRE_PF_RETX and
 * ACK_NOW if MRE_PF_ACK_REQ or MRE_PF_RETX, p->ssn, p->rsn, p->offset, p->ts: the engine's
 * clock), RETH (MRE_H_RETH: p->reth_va, reth_rkey, reth_len), AtomicETH (MRE_H_ATOMIC:
 * p->atomic_va, atomic_rkey, swap_add, compare), AETH (MRE_H_AETH: p->syndrome, p->msn), ImmDt
 * (MRE_H_IMM: p->imm). p->has must name exactly the headers the opcode carries on the wire
 * (metaroce/wire/layout.py), with one exception: the AETH the engine names on MetaRoCE READ
 * responses is left out (their wire form has none). Malformed: an opcode not built here
 * (SACK, CREDIT, ATOMIC ACKNOWLEDGE, probes, CNP, ...), other headers than the opcode's, a
 * payload on a header-only opcode, p->data NULL with p->len > 0. READ responses carry no RETH
 * (reth_va/reth_rkey name their source memory; the engine does not set MRE_H_RETH on them). */
uint32_t mr_build_pkt(uint8_t *out, uint32_t cap, struct mr_roce_flow *f, const struct mre_pkt *p);

/* Build and queue n descriptors on the AF_XDP socket (as many as its rings take now), each
 * with flow flows[i]; kick once if any was queued. Returns how many were queued (they are the
 * first ones; the caller keeps the rest). A descriptor that cannot be built (malformed, too big,
 * flows[i] NULL) is skipped and counted in *bad (added to it; bad may be NULL); it is consumed:
 * counted in the return value too. */
uint32_t mr_send_pkts(struct mr_xsk *x, struct mr_roce_flow *const *flows, const struct mre_pkt *p,
                      uint32_t n, uint32_t *bad);

/* The RoCEv2 ICRC of a complete frame (Ethernet header first, ICRC field last). */
uint32_t mr_roce_icrc(const uint8_t *frame, uint32_t len);

/* The 16-bit ones' complement sum (RFC 1071) of n bytes at p added to seed, folded to 16 bits,
 * in network byte order as a number (0x0000 .. 0xFFFF; not complemented). */
uint32_t mr_csum16(const uint8_t *p, uint32_t n, uint32_t seed);

/* Copy n bytes from src to dst (not overlapping) and return their sum as mr_csum16(src, n, 0)
 * does, in the same pass over the bytes. */
uint32_t mr_copy_sum(uint8_t *dst, const uint8_t *src, uint32_t n);

#endif
