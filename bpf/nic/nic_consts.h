/* Constants of the MetaRoCE NIC receive path. Wire numbers mirror metaroce/wire/consts.py
 * (IBTA values; tests/unit check that the two agree). Tunables are overridable with -D. */
#ifndef __NIC_CONSTS_H
#define __NIC_CONSTS_H

#ifndef MAX_QPS
#define MAX_QPS 4096
#endif
#ifndef MAX_MRS
#define MAX_MRS 4096
#endif

#define ROCE_UDP_PORT 4791
#define BTH_LEN 12
#define RETH_LEN 16
#define ICRC_LEN 4

/* RC opcodes (IBTA 9.2, transport RC = 0x00) */
#define RC_RDMA_WRITE_FIRST 0x06
#define RC_RDMA_WRITE_MIDDLE 0x07
#define RC_RDMA_WRITE_LAST 0x08
#define RC_RDMA_WRITE_LAST_WITH_IMMEDIATE 0x09
#define RC_RDMA_WRITE_ONLY 0x0A
#define RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE 0x0B

#define RC_ACKNOWLEDGE 0x11
#define AETH_LEN 4
#define AETH_ACK_UNLIMITED 0x1F   /* ACK, credits invalid */
#define AETH_NAK_PSN_SEQ 0x60     /* NAK, PSN sequence error */
#define ACK_TTL 64

#define PSN_MASK 0xFFFFFF
#define PSN_HALF 0x800000         /* PSNs ahead by less than this are "ahead" */
#define BTH_ACKREQ 0x80000000

/* Registered memory is an array map of CHUNK-byte values per MR, mmap-ed by the owner. */
#define MR_CHUNK 65536
#define MAX_PAYLOAD 4096          /* largest RoCE path MTU */

/* IBV_ACCESS_* (rdma-core verbs.h) */
#define ACCESS_REMOTE_WRITE (1 << 1)

/* qp_rx.state */
#define QP_RX_IDLE 0              /* between messages */
#define QP_RX_IN_WRITE 1          /* FIRST or MIDDLE of a WRITE seen; more to come */

/* Receive verdicts counted per reason (index into rx_counters). */
#define RX_PLACED 0               /* payload written into registered memory */
#define RX_NOT_ROCE 1             /* passed to the stack untouched */
#define RX_MALFORMED 2            /* truncated or inconsistent headers */
#define RX_UNKNOWN_QP 3
#define RX_PSN_OUT_OF_ORDER 4     /* compat mode: not the expected PSN */
#define RX_BAD_OPCODE_SEQ 5       /* e.g. WRITE MIDDLE without FIRST */
#define RX_BAD_RKEY 6
#define RX_MR_BOUNDS 7            /* outside the registered region */
#define RX_MR_ACCESS 8            /* region lacks remote write access or is another PD's */
#define RX_UNSUPPORTED_OPCODE 9   /* not handled in the kernel (yet): passed to user space */
#define RX_BAD_ICRC 10
#define RX_DUPLICATE 11           /* already received: re-acknowledged, not placed again */
#define RX_NREASONS 12

/* Replies generated in the kernel (index into tx_counters). */
#define TX_ACK 0
#define TX_NAK_SEQ 1
#define TX_NCOUNTERS 2

#endif
