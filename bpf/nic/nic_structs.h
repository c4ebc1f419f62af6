/* Structs of the NIC data path, shared by its maps and (by layout) metaroce/nic/. */
#ifndef __NIC_STRUCTS_H
#define __NIC_STRUCTS_H

#include "nic_consts.h"
#include "nic_vq.h"

struct mr_chunk {
    __u8 b[MR_CHUNK];
};

struct mr_info {
    __u64 va;         /* address the requester uses for the first byte */
    __u64 length;
    __u32 access;     /* IBV_ACCESS_* */
    __u32 pd;
};

/* One QP, keyed by local QPN. User space writes it once (set_qp, RTR); after that the kernel
 * owns it: receive state, requester acknowledgement state, per-QP counters. */
struct nic_qp {
    /* responder */
    __u32 epsn;       /* next expected PSN */
    __u32 pd;
    __u32 state;      /* QP_RX_* */
    __u32 wr_rkey;    /* the WRITE in progress */
    __u64 wr_va;      /* where its next packet lands */
    __u64 wr_left;    /* bytes of it still to come */
    __u64 wr_len;     /* its DMA length (byte_len of a WRITE_WITH_IMM completion) */
    __u32 dqpn;       /* the peer's QPN: destination of our replies */
    __u32 msn;        /* messages completed (24 bits on the wire) */
    __u32 nak_sent;   /* a PSN sequence NAK is outstanding for this gap */
    __u32 pmtu;       /* path MTU: PSNs a READ response takes */
    __u64 rq_head;    /* receive WQEs consumed */
    __u64 send_off;   /* bytes of the SEND in progress placed */
    __u64 atomic_orig;   /* saved result of the last atomic (RESP-4) */
    __u32 atomic_psn;
    __u32 atomic_valid;
    __u32 rnr_timer;  /* min_rnr_timer code in our RNR NAKs */
    __u32 peer_set;   /* accept only packets from peer_ip */
    __u8 peer_ip[16]; /* IPv4 in the first 4 bytes */
    __u64 cnp_next_ns;   /* no CNP before this time */
    __u64 cnp_owed;      /* a CE mark is owed a CNP: a reply went instead (COMPAT-7) */
    /* requester: what the peer acknowledged */
    __u32 una;        /* oldest unacknowledged PSN */
    __u32 rd_head;    /* next READ/ATOMIC slot waiting for its response */
    __u32 rd_psn;     /* next expected response PSN inside a multi-packet READ response */
    __u32 rd_state;   /* 0 idle, 1 inside a READ response, 2 gap reported */
    __u64 rd_off;     /* bytes of that response placed */
    /* per-QP counters (rdma-core hw_counters names where one exists) */
    __u64 rx_packets;
    __u64 rx_bytes;
    __u64 out_of_sequence;
    __u64 duplicate_request;
    __u64 packet_seq_err;    /* PSN sequence NAKs received */
    __u64 rnr_nak_received;
    __u64 np_cnp_sent;
    __u64 rp_cnp_handled;
    __u64 np_ecn_marked_roce_packets;
    __u64 acks_received;
    /* MetaRoCE mode (selective repeat, spec 5.2) */
    __u32 metaroce;   /* 1: this QP speaks MetaRoCE opcodes only */
    __u32 ooo_run;    /* out-of-order arrivals since in-order progress */
    __u32 since_sack; /* packets since the last SACK */
    __u32 ce_count;   /* CE-marked packets received (SACKETH CE Count) */
    __u64 rbm_hi;     /* received PSNs ePSN+1 .. ePSN+127, wire order: bit 63 of hi = ePSN+1 */
    __u64 rbm_lo;
    __u64 rend_hi;    /* of them, those that end a message (the MSN follows them) */
    __u64 rend_lo;
    __u64 sbm_hi;     /* requester: the last SACK's bitmap and cumulative PSN */
    __u64 sbm_lo;
    __u32 sack_cum;
    __u32 credit;     /* requester: the last SACK's credit, CREDIT_VALID | Limit PSN, 0: none */
    __u64 sacks_sent;
    __u64 sacks_received;
    __u32 rq_entries; /* slots of its receive queue ring (a power of two; 0: none) */
    __u32 sq_slot;    /* its entry in sq_psns: the next PSN its requester sends */
    __u32 sq_open;    /* 1: its requester side is open (sq_psns[sq_slot] is valid) */
    __u32 integrity;  /* INT_ICRC or INT_CSUM: the check its packets pass (INT-1) */
};

/* A receive WQE as the program uses it: copied out of the owner's ring (rqs) first, because the
 * owner may rewrite the slot at any moment. */
struct recv_wqe {
    __u64 wr_id;
    __u64 seq;        /* its index in the QP's receive queue */
    __u64 addr;
    __u32 lkey;
    __u32 length;
};

/* An outstanding READ or ATOMIC, keyed by (qpn << 32 | idx % RD_DEPTH): where its response
 * lands. Written by user space before the request leaves. */
struct rd_slot {
    __u64 wr_id;
    __u64 addr;
    __u64 length;
    __u32 lkey;
    __u32 first_psn;
    __u32 kind;       /* RD_READ or RD_ATOMIC */
    __u32 idx;        /* rd_head value this slot is for (stale slots are ignored) */
};

/* A saved atomic result (RESP-4), keyed by (qpn << 32 | psn % RD_DEPTH). */
struct atomic_saved {
    __u32 psn;
    __u32 valid;
    __u64 orig;
};

/* One event for user space. */
struct nic_event {
    __u32 type;       /* EV_* */
    __u32 qpn;
    __u32 psn;
    __u32 syndrome;   /* AETH syndrome, or the WC status */
    __u64 wr_id;
    __u64 va;
    __u32 rkey;
    __u32 len;
    __u32 imm;        /* immediate data, as on the wire (big-endian) */
    __u32 flags;      /* 1: has immediate; 2: WRITE_WITH_IMM; for EV_RD_DONE the slot index */
    __u32 msn;
    __u32 pad;
};

struct scratch {
    __u8 b[MAX_PAYLOAD];
};

#endif
