/* Constants of the MetaRoCE NIC data path. Wire numbers mirror metaroce/wire/consts.py
 * (IBTA values; tests/unit check that the two agree). Tunables are overridable with -D. */
#ifndef __NIC_CONSTS_H
#define __NIC_CONSTS_H

#ifndef MAX_QPS
#define MAX_QPS 4096
#endif
#ifndef MAX_MRS
#define MAX_MRS 4096
#endif
#ifndef RQ_DEPTH
#define RQ_DEPTH 256              /* receive WQEs per QP at most (a power of two): the largest
                                   * receive queue ring (bpf/nic/nic_vq.h) */
#endif
#ifndef RD_DEPTH
#define RD_DEPTH 16               /* outstanding READ/ATOMIC requests per QP (a power of two) */
#endif
#ifndef CNP_INTERVAL_NS
#define CNP_INTERVAL_NS 50000     /* at most one CNP per QP per 50 us (COMPAT-4) */
#endif

#define ROCE_UDP_PORT 4791
#define BTH_LEN 12
#define RETH_LEN 16
#define AETH_LEN 4
#define IMMDT_LEN 4
#define ATOMICETH_LEN 28
#define ATOMICACKETH_LEN 8
#define CNP_PAD_LEN 16
#define ICRC_LEN 4

/* RC opcodes (IBTA 9.2, transport RC = 0x00) */
#define RC_SEND_FIRST 0x00
#define RC_SEND_MIDDLE 0x01
#define RC_SEND_LAST 0x02
#define RC_SEND_LAST_WITH_IMMEDIATE 0x03
#define RC_SEND_ONLY 0x04
#define RC_SEND_ONLY_WITH_IMMEDIATE 0x05
#define RC_RDMA_WRITE_FIRST 0x06
#define RC_RDMA_WRITE_MIDDLE 0x07
#define RC_RDMA_WRITE_LAST 0x08
#define RC_RDMA_WRITE_LAST_WITH_IMMEDIATE 0x09
#define RC_RDMA_WRITE_ONLY 0x0A
#define RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE 0x0B
#define RC_RDMA_READ_REQUEST 0x0C
#define RC_RDMA_READ_RESPONSE_FIRST 0x0D
#define RC_RDMA_READ_RESPONSE_MIDDLE 0x0E
#define RC_RDMA_READ_RESPONSE_LAST 0x0F
#define RC_RDMA_READ_RESPONSE_ONLY 0x10
#define RC_ACKNOWLEDGE 0x11
#define RC_ATOMIC_ACKNOWLEDGE 0x12
#define RC_COMPARE_SWAP 0x13
#define RC_FETCH_ADD 0x14
#define RC_SEND_LAST_WITH_INVALIDATE 0x16   /* optional (HDR-14): not implemented, NAKed (HDR-15) */
#define RC_SEND_ONLY_WITH_INVALIDATE 0x17
#define CNP_OPCODE 0x81

/* MetaRoCE opcodes (spec EXT-2): 0xC0 | the RC opcode of the same meaning, plus SACK */
#define MR_OPCODE_MIN 0xC0
#define MR_RDMA_READ_REQUEST 0xCC
#define MR_RDMA_READ_RESPONSE_FIRST 0xCD
#define MR_RDMA_READ_RESPONSE_MIDDLE 0xCE
#define MR_RDMA_READ_RESPONSE_LAST 0xCF
#define MR_RDMA_READ_RESPONSE_ONLY 0xD0
#define MR_SACK 0xD1
#define MR_ATOMIC_ACKNOWLEDGE 0xD2
#define MR_COMPARE_SWAP 0xD3
#define MR_FETCH_ADD 0xD4
/* bit n set: RC opcode n (or MetaRoCE 0xC0 | n) carries a payload: SEND, WRITE, READ response */
#define PAYLOAD_OPCODES ((1ULL << 12) - 1 | 0xFULL << 13 | 3ULL << 0x16)
#define PETH_LEN 20
#define SACKETH_LEN 32
#define PETH_F_RETX 0x80
#define PETH_F_ACK_NOW 0x40
#define SACK_F_ECE 0x80
#define SACK_F_OOO 0x40
#define SACK_F_CREDIT_VALID 0x10  /* the Credit Limit PSN binds the sender (CC-8) */
#define CREDIT_VALID 0x80000000u  /* in an event's len: a credit limit PSN follows (low 24 bits) */
#ifndef MR_WINDOW
#define MR_WINDOW 128             /* receive window in PSNs (SACK-1); the bitmap holds 127 */
#endif
#define SACK_OOO_EVERY 8          /* SACK-2 (b) */
#define SACK_EVERY 16             /* SACK-2 (e) */
#define SACK_CE_EVERY 4           /* SACK-2 (c): coalesce CE echoes */

#define AETH_ACK_UNLIMITED 0x1F   /* ACK, credits invalid */
#define AETH_RNR_NAK 0x20         /* | the RNR timer code */
#define AETH_NAK_PSN_SEQ 0x60     /* NAK, PSN sequence error */
#define AETH_NAK_INV_REQ 0x61     /* NAK, invalid request */
#define AETH_NAK_REM_ACCESS 0x62  /* NAK, remote access error */
#define AETH_NAK_REM_OP 0x63      /* NAK, remote operational error */
#define ACK_TTL 64
#define CNP_TOS (48 << 2)         /* DSCP 48, Not-ECT (ENC-5) */

#define PSN_MASK 0xFFFFFF
#define PSN_HALF 0x800000         /* PSNs ahead by less than this are "ahead" */
#define BTH_ACKREQ 0x80000000

/* Registered memory is an array map of CHUNK-byte values per MR, mmap-ed by the owner. */
#define MR_CHUNK 65536
#ifndef MAX_PAYLOAD
#define MAX_PAYLOAD 8192          /* largest path MTU: a MetaRoCE connection's fitted one (CM-14;
                                   * the IB enum's largest is 4096). A power of two. */
#endif

/* IBV_ACCESS_* (rdma-core verbs.h) */
#define ACCESS_LOCAL_WRITE (1 << 0)
#define ACCESS_REMOTE_WRITE (1 << 1)
#define ACCESS_REMOTE_READ (1 << 2)
#define ACCESS_REMOTE_ATOMIC (1 << 3)

/* qp.state (receive side) */
#define QP_RX_IDLE 0              /* between messages */
#define QP_RX_IN_WRITE 1          /* FIRST or MIDDLE of a WRITE seen; more to come */
#define QP_RX_IN_SEND 2           /* FIRST or MIDDLE of a SEND seen; more to come */
#define QP_RX_ERROR 3             /* a fatal NAK was sent: everything is dropped */

/* rd_slot.kind */
#define RD_READ 1
#define RD_ATOMIC 2
#define RD_DONE 3                 /* an atomic whose ACK overtook an earlier READ's responses */

/* Receive verdicts counted per reason (index into rx_counters). */
#define RX_PLACED 0               /* payload written into registered memory */
#define RX_NOT_ROCE 1             /* passed to the stack untouched */
#define RX_MALFORMED 2            /* truncated or inconsistent headers */
#define RX_UNKNOWN_QP 3
#define RX_PSN_OUT_OF_ORDER 4     /* compat mode: not the expected PSN */
#define RX_BAD_OPCODE_SEQ 5       /* e.g. WRITE MIDDLE without FIRST */
#define RX_BAD_RKEY 6
#define RX_MR_BOUNDS 7            /* outside the registered region */
#define RX_MR_ACCESS 8            /* region lacks the access or is another PD's */
#define RX_UNSUPPORTED_OPCODE 9   /* an opcode this data path does not implement */
#define RX_BAD_ICRC 10
#define RX_DUPLICATE 11           /* already received: re-acknowledged, not executed again */
#define RX_RNR 12                 /* SEND / WRITE_WITH_IMM with no receive posted: RNR NAK */
#define RX_QP_ERROR 13            /* the QP is in the error state */
#define RX_WRONG_SOURCE 14        /* not from the QP's connected peer */
#define RX_ACK 15                 /* an ACK/NAK consumed by the requester */
#define RX_READ_REQUEST 16        /* a valid READ request handed to user space to answer */
#define RX_ATOMIC 17              /* an atomic executed on registered memory */
#define RX_UNEXPECTED_RESPONSE 18 /* a response or ACK outside what is outstanding */
#define RX_INVALID_REQUEST 19     /* too long for the receive buffer, misaligned atomic ... */
#define RX_CNP 20                 /* a CNP consumed by the requester */
#define RX_WRONG_MODE 21          /* a RoCEv2 opcode on a MetaRoCE QP or the reverse (EXT-2) */
#define RX_BEYOND_WINDOW 22       /* MetaRoCE: PSN past the receive window, or a READ/ATOMIC
                                   * ahead of the cumulative PSN (PLACE-5): not recorded */
#define RX_BAD_PKEY 23             /* P_Key does not match the QP's (HDR-2) */
#define RX_BAD_RECV_WQE 24        /* the owner's receive queue holds a WQE (or an index) no
                                   * receive can be: the QP goes to ERR */
#define RX_BAD_CSUM 25             /* a CSUM QP's packet failed its IPv4 header or UDP checksum,
                                  * or came with no UDP checksum (INT-3) */
#define RX_NREASONS 26

/* Replies generated in the kernel (index into tx_counters). */
#define TX_ACK 0
#define TX_NAK_SEQ 1
#define TX_NAK_RNR 2
#define TX_NAK_INV_REQ 3
#define TX_NAK_REM_ACCESS 4
#define TX_NAK_REM_OP 5
#define TX_ATOMIC_ACK 6
#define TX_CNP 7
#define TX_SACK 8
#define TX_NCOUNTERS 9

/* Port counters (index into port_counters), whatever the QP and the verdict: every RoCE frame
 * received (UDP 4791, malformed and dropped ones included) and every reply sent from here
 * (XDP_TX), in frames and in bytes of the Ethernet frame. The daemon adds what its AF_XDP
 * socket sent to the transmit side. */
#define PORT_RCV_PACKETS 0
#define PORT_RCV_BYTES 1
#define PORT_XMIT_PACKETS 2
#define PORT_XMIT_BYTES 3
#define PORT_RCV_ICRC_CHECKED 4   /* RoCE frames of a known QP checked by the ICRC (ICRC-1) */
#define PORT_RCV_CSUM_CHECKED 5   /* ... by the negotiated UDP checksum instead (INT-3) */
#define PORT_RCV_MULTI_BUF 6      /* RoCE frames that came as a multi-buffer xdp_buff (frags) */
#define PORT_RCV_STEERED 7        /* RoCE frames nic_steer handed to their QP's CPU (cpumap) */
#define PORT_NCOUNTERS 8

/* Receive steering (nic_steer): the CPUs a QP's frames may be handed to, and the key in
 * rx_qp_cpu of the CPU that takes frames of no known QP (QPNs are 24 bits, so it names none) */
#ifndef MAX_CPUS
#define MAX_CPUS 64
#endif
#define STEER_DEFAULT_KEY 0xFFFFFFFFu
#define STAGE_ACT 0                 /* nic_stages: the receive path's second stage */

/* nic_qp.integrity: the end-to-end check a QP's received packets pass (spec 5.7, INT-1) */
#define INT_ICRC 0                /* the RoCEv2 ICRC (CRC-32), every compat QP and the default */
#define INT_CSUM 1                /* MetaRoCE with CSUM negotiated: IPv4 header + UDP checksum */

/* Events for user space (ring buffer). */
#define EV_RECV 1                 /* a receive WQE completed (SEND or WRITE_WITH_IMM) */
#define EV_READ_REQUEST 2         /* answer this READ (responder) */
#define EV_ACK 3                  /* the requester's oldest unacknowledged PSN advanced */
#define EV_NAK 4                  /* a NAK (sequence, RNR, fatal) reached the requester */
#define EV_RD_DONE 5              /* a READ response or atomic ACK completed slot rd_head */
#define EV_RD_GAP 6               /* READ responses arrived past a lost one: re-request */
#define EV_CNP 7                  /* a CNP reached the requester */
#define EV_RECV_ERR 8             /* a receive WQE failed (status in ev.status) */
#define EV_QP_ERROR 9             /* the responder sent a fatal NAK and moved the QP to ERR */
#define EV_SACK 10                /* MetaRoCE requester: any SACK that says something (nic_rx on_sack) */
#define EV_EPSN 11                /* MetaRoCE responder: a filled hole moved ePSN past several */
/* EV_RECV flags: 1 immediate, 2 WRITE with immediate, 4 arrived in order (MetaRoCE), and */
#define RECV_F_SOLICITED 8        /* the message had SE set: its completion is a solicited event */

#endif
