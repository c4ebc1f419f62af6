/* Structs of the NIC receive path, shared by its maps and (by layout) metaroce/nic/. */
#ifndef __NIC_STRUCTS_H
#define __NIC_STRUCTS_H

#include "nic_consts.h"

struct mr_chunk {
    __u8 b[MR_CHUNK];
};

struct mr_info {
    __u64 va;         /* address the requester uses for the first byte */
    __u64 length;
    __u32 access;     /* IBV_ACCESS_* */
    __u32 pd;
};

/* Receive state of one QP, keyed by local QPN. */
struct qp_rx {
    __u32 epsn;       /* next expected PSN */
    __u32 pd;
    __u32 state;      /* QP_RX_* */
    __u32 wr_rkey;    /* the WRITE in progress */
    __u64 wr_va;      /* where its next packet lands */
    __u64 wr_left;    /* bytes of it still to come */
    __u32 dqpn;       /* the peer's QPN: destination of our ACKs */
    __u32 msn;        /* messages completed (24 bits on the wire) */
    __u32 nak_sent;   /* a PSN sequence NAK is outstanding for this gap */
    __u32 pad;
};

struct scratch {
    __u8 b[MAX_PAYLOAD];
};

#endif
