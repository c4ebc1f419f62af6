/* The verbs queues in shared memory: the one definition of their binary layout. A ring is a
 * header of MR_VQ_HDR_SIZE bytes followed by `entries` slots of `stride` bytes. The application
 * (metaroce/verbs), its device's daemon (metaroce/nic) and, for the receive queue, this NIC's
 * XDP program read it; the protocol between them is described in metaroce/fastpath/vq.h and
 * docs/architecture.md. Included by BPF C (BCC: the kernel's types) and by user space C. */
#ifndef METAROCE_NIC_VQ_H
#define METAROCE_NIC_VQ_H

#ifndef __KERNEL__
#include <stdint.h>
#endif


enum {
    MR_VQ_MAGIC = 0x4d525651,            /* "MRVQ" */
    MR_VQ_VERSION = 1,
    MR_VQ_HDR_SIZE = 512,                /* header bytes before slot 0 */
    MR_VQ_SQ = 1, MR_VQ_RQ = 2, MR_VQ_CQ = 3,
    /* dflags */
    MR_VQ_NEED_WAKEUP = 1,
    MR_VQ_ERR = 2,
    /* struct mr_send_wqe: the data area (SGEs or inline bytes) starts this far in */
    MR_WQE_DATA = 64,
    MR_RECV_WQE_DATA = 16,
    MR_MAX_SGE = 16,
    MR_MAX_INLINE = 256,
    /* WQE opcodes: enum ibv_wr_opcode */
    MR_WR_RDMA_WRITE = 0, MR_WR_RDMA_WRITE_WITH_IMM = 1, MR_WR_SEND = 2,
    MR_WR_SEND_WITH_IMM = 3, MR_WR_RDMA_READ = 4, MR_WR_ATOMIC_CMP_AND_SWP = 5,
    MR_WR_ATOMIC_FETCH_AND_ADD = 6,
    /* send_flags: enum ibv_send_flags */
    MR_SEND_FENCE = 1, MR_SEND_SIGNALED = 2, MR_SEND_SOLICITED = 4, MR_SEND_INLINE = 8,
    /* CQE opcodes: enum ibv_wc_opcode */
    MR_WC_SEND = 0, MR_WC_RDMA_WRITE = 1, MR_WC_RDMA_READ = 2, MR_WC_COMP_SWAP = 3,
    MR_WC_FETCH_ADD = 4, MR_WC_RECV = 128, MR_WC_RECV_RDMA_WITH_IMM = 129,
    /* CQE wc_flags: enum ibv_wc_flags, and one of ours */
    MR_WC_WITH_IMM = 2,
    MR_WC_SOLICITED = 128                /* raised a solicited event (SE) */
};

/* The ring header: five cache lines, each written by one side only. */
struct mr_vq_hdr {
    /* line 0: the layout, written once by the daemon before the fd is handed over (the
     * daemon keeps its own copy and never reads these back) */
    uint32_t magic;
    uint32_t version;
    uint32_t kind;                       /* MR_VQ_SQ / RQ / CQ */
    uint32_t entries;                    /* slots, a power of two */
    uint32_t stride;                     /* bytes per slot */
    uint32_t max_wr;                     /* SQ/RQ: work requests outstanding at most */
    uint32_t max_sge;                    /* SQ/RQ: SGEs per WQE at most */
    uint32_t max_inline;                 /* SQ: inline bytes per WQE at most */
    uint32_t id;                         /* the QPN (SQ, RQ) or the CQ's handle */
    uint8_t pad0[28];
    /* line 1: the producer index */
    uint32_t prod;
    uint8_t pad1[60];
    /* line 2: the consumer index */
    uint32_t cons;
    uint8_t pad2[60];
    /* line 3: written by the daemon only */
    uint32_t dflags;                     /* MR_VQ_NEED_WAKEUP | MR_VQ_ERR */
    uint32_t notify_sn;                  /* CQ: the arm_sn the last event answered */
    uint8_t pad3[56];
    /* line 4: written by the application only */
    uint32_t arm_sn;                     /* CQ: req_notify_cq requests so far */
    uint32_t arm_solicited;              /* CQ: 1 = the last request was solicited-only */
    uint8_t pad4[56];
};

/* One scatter/gather element, as struct ibv_sge. */
struct mr_sge {
    uint64_t addr;
    uint32_t length;
    uint32_t lkey;
};

/* A send queue slot: this 64-byte header, then at MR_WQE_DATA num_sge struct mr_sge or (with
 * MR_SEND_INLINE) inline_len bytes of payload. */
struct mr_send_wqe {
    uint64_t wr_id;
    uint8_t opcode;                      /* MR_WR_* */
    uint8_t send_flags;                  /* MR_SEND_* */
    uint8_t num_sge;
    uint8_t rsvd0;
    uint32_t inline_len;
    uint64_t remote_addr;
    uint32_t rkey;
    uint32_t imm_data;                   /* host order */
    uint64_t compare_add;
    uint64_t swap;
    uint8_t rsvd1[16];
};

/* A receive queue slot: this 16-byte header, then num_sge struct mr_sge. */
struct mr_recv_wqe {
    uint64_t wr_id;
    uint32_t num_sge;
    uint32_t rsvd;
};

/* A completion queue slot. */
struct mr_cqe {
    uint64_t wr_id;
    uint32_t byte_len;
    uint32_t imm_data;                   /* host order, valid with MR_WC_WITH_IMM */
    uint32_t qp_num;
    uint32_t src_qp;
    uint8_t status;                      /* enum ibv_wc_status */
    uint8_t opcode;                      /* MR_WC_* */
    uint8_t wc_flags;                    /* MR_WC_WITH_IMM | MR_WC_SOLICITED */
    uint8_t rsvd0;
    uint32_t rsvd1;
};

/* A receive queue slot: the NIC's receives take one SGE, so the RQ's stride is 32 bytes and
 * the XDP program reads a slot as this. */
struct mr_rq_slot {
    struct mr_recv_wqe wqe;
    struct mr_sge sge;
};

enum {
    MR_RQ_STRIDE = 32,
    MR_VQ_HDR_SLOTS = 16,                /* MR_VQ_HDR_SIZE / MR_RQ_STRIDE: an RQ is an array of
                                          * MR_VQ_HDR_SLOTS + entries slots, the header first */
    MR_VQ_PROD_SLOT = 2,                 /* the slot that starts with prod (offset 64) */
    MR_VQ_CONS_SLOT = 4                  /* the slot that starts with cons (offset 128) */
};

#endif
