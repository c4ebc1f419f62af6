/* The MetaRoCE transport engine: one RC requester / responder implementation, in C, shared by
 * the simulator (metaroce sim, the property tests) and, later, the wire (the daemon's engine
 * thread). No I/O, no clock, no allocation after a QP reached RTS: the caller passes `now`
 * (integer ns) to every call, feeds work requests, packets (simulator) or the data path's
 * events (wire), and takes packet descriptors, completions and the next timer. docs/engine.md.
 *
 * This header is the API (cffi reads it: no macros beyond the include guard). */
#ifndef METAROCE_MRE_H
#define METAROCE_MRE_H

#include <stdint.h>

enum {
    MRE_COMPAT = 0, MRE_METAROCE = 1,
    /* QP states (ibv_qp_state order) */
    MRE_RESET = 0, MRE_INIT = 1, MRE_RTR = 2, MRE_RTS = 3, MRE_SQD = 4, MRE_SQE = 5, MRE_ERR = 6,
    /* work request opcodes: enum ibv_wr_opcode (as bpf/nic/nic_vq.h MR_WR_*) */
    MRE_WR_RDMA_WRITE = 0, MRE_WR_RDMA_WRITE_WITH_IMM = 1, MRE_WR_SEND = 2,
    MRE_WR_SEND_WITH_IMM = 3, MRE_WR_RDMA_READ = 4, MRE_WR_ATOMIC_CMP_AND_SWP = 5,
    MRE_WR_ATOMIC_FETCH_AND_ADD = 6,
    MRE_SEND_SIGNALED = 2, MRE_SEND_SOLICITED = 4,
    /* completion opcodes: enum ibv_wc_opcode; wc_flags */
    MRE_WC_SEND = 0, MRE_WC_RDMA_WRITE = 1, MRE_WC_RDMA_READ = 2, MRE_WC_COMP_SWAP = 3,
    MRE_WC_FETCH_ADD = 4, MRE_WC_RECV = 128, MRE_WC_RECV_RDMA_WITH_IMM = 129,
    MRE_WC_WITH_IMM = 2,
    /* completion status: enum ibv_wc_status (the ones the engine produces) */
    MRE_WC_SUCCESS = 0, MRE_WC_WR_FLUSH_ERR = 5, MRE_WC_REM_INV_REQ_ERR = 9,
    MRE_WC_REM_ACCESS_ERR = 10, MRE_WC_REM_OP_ERR = 11, MRE_WC_RETRY_EXC_ERR = 12,
    MRE_WC_RNR_RETRY_EXC_ERR = 13,
    /* memory access flags: enum ibv_access_flags */
    MRE_ACCESS_LOCAL_WRITE = 1, MRE_ACCESS_REMOTE_WRITE = 2, MRE_ACCESS_REMOTE_READ = 4,
    MRE_ACCESS_REMOTE_ATOMIC = 8,
    /* struct mre_pkt.flags */
    MRE_PF_ACK_REQ = 1,        /* BTH.AckReq (MetaRoCE: also PETH ACK_NOW) */
    MRE_PF_RETX = 2,           /* PETH R */
    MRE_PF_CE = 4,             /* input: the IP ECN field was CE */
    MRE_PF_ECN_ECHO = 8,       /* SACKETH E */
    MRE_PF_PROBE_REPLY = 16,   /* SACKETH P */
    MRE_PF_CREDIT = 32,        /* SACKETH C: credit_limit is valid */
    MRE_PF_GRANT_ACTIVE = 64,  /* CREDITETH A */
    /* struct mre_pkt.has: which headers the packet carries */
    MRE_H_RETH = 1, MRE_H_AETH = 2, MRE_H_IMM = 4, MRE_H_ATOMIC = 8, MRE_H_ATOMIC_ACK = 16,
    MRE_H_SACK = 32, MRE_H_PETH = 64, MRE_H_GRANT = 128,
    /* why the requester stopped transmitting (mre_qp_info.blocked) */
    MRE_BLK_NONE = 0, MRE_BLK_WINDOW = 1, MRE_BLK_CWND = 2, MRE_BLK_CREDIT = 3,
    MRE_BLK_PACE = 4, MRE_BLK_TXQ = 5,
    MRE_BLK_ORDER = 6,         /* a WRITE/atomic waits for an overlapping READ (hold_overlap) */
    /* deliberately broken behaviour, for the tests that must catch it (mre_qp_cfg.breaks) */
    MRE_BREAK_COMPLETE_BEFORE_ACK = 1,   /* complete SEND/WRITE once sent, not when acked */
    MRE_BREAK_NO_HOLE_RETRANSMIT = 2,    /* MetaRoCE: never repair a SACK hole */
    MRE_BREAK_ATOMIC_REEXECUTE = 4,      /* responder: execute a duplicate atomic again */
    MRE_BREAK_IGNORE_CREDIT = 8,         /* sender: ignore the receiver's credit limit */
    MRE_BREAK_NO_SPRAY = 16,             /* sender: every packet on path 0 */
    /* requester events (the wire's data path reports these; mre_event) */
    MRE_EV_ACK = 1,            /* compat ACK / NAK / RNR NAK: psn, syndrome, msn */
    MRE_EV_SACK = 2,           /* MR_SACK: psn = cumulative, syndrome, msn, bitmap, echoes */
    MRE_EV_READ_RESP = 3,      /* a READ response packet: psn, offset, len (data: place it) */
    MRE_EV_ATOMIC_ACK = 4,     /* an atomic acknowledgement: psn, value */
    MRE_EV_CNP = 5,
    MRE_EV_CREDIT = 6,         /* MR_CREDIT: psn = grant sequence, credit_limit, rate, flag A */
    MRE_EV_READ_DONE = 7,      /* the data path placed a READ's responses up to psn, in order */
    MRE_EV_READ_GAP = 8,       /* READ responses arrived past psn, which is missing: re-read */
    MRE_EV_RECV = 9,           /* responder: a receive completed out of order (wr_id, rsn, psn =
                                * the message's last PSN, len, imm, wc_opcode, status); the
                                * engine completes receives in RSN order once the cumulative
                                * PSN passed them (PLACE-5); MRE_EVF_IN_ORDER: it was in order */
    MRE_EV_EPSN = 10,          /* responder: the cumulative PSN moved: psn = the new ePSN */
    MRE_EV_READ_REQ = 11,      /* responder (wire): the data path checked a READ request and
                                * hands it over to answer: psn, msn (of the response), va,
                                * rkey, len, rsn = its SSN (PETH echo), sport (the request's UDP
                                * source port, answered on it); MRE_EVF_DUPLICATE: a repeat */
    MRE_EV_LOCAL_ERR = 12,     /* requester (wire): the data path could not place the response
                                * to the request at psn (status: enum ibv_wc_status): the WQE
                                * fails with it and the QP goes to ERR */
    MRE_EVF_DUPLICATE = 1,
    MRE_EVF_IN_ORDER = 64,
    MRE_EVF_PLACE = 128,       /* MRE_EV_ATOMIC_ACK: write the value to the WQE's buffer */
    /* errors returned by the API (negative) */
    MRE_E_STATE = -1, MRE_E_FULL = -2, MRE_E_INVAL = -3, MRE_E_NOQP = -4
};

struct mre_engine;

/* One engine per NIC: its QPs, its registered memory, its receiver credit manager. */
struct mre_engine_cfg {
    uint32_t max_qps;
    uint32_t max_mrs;
    uint32_t out_cap;          /* packet descriptors the output ring holds */
    uint32_t cq_cap;           /* completions the completion ring holds */
    /* receiver credits (CC-8, CC-9); credits = 0: this NIC has no CREDIT capability */
    uint8_t credits;
    uint8_t credit_pace;
    uint32_t credit_min_senders;
    uint32_t credit_initial_pkts;
    uint32_t credit_liveness_rtos;
    uint32_t credit_mtu;
    int64_t credit_idle_ns;
    int64_t credit_base_rtt_ns;
    double credit_link_rate_bps;
};

/* Per QP, fixed at creation. */
struct mre_qp_cfg {
    uint32_t qpn;
    uint8_t mode;              /* MRE_COMPAT / MRE_METAROCE */
    uint8_t paths;             /* MetaRoCE entropy set size (MP-1), 1..64 */
    uint8_t credits;           /* use the engine's credit manager (CREDIT capability) */
    uint8_t cc;                /* congestion control on (window CC / DCQCN) */
    uint8_t hold_overlap;      /* a WRITE or atomic whose remote bytes overlap an outstanding
                                * READ's waits until the READ has its data (the wire: its
                                * responder places on arrival but reads memory later) */
    uint8_t credit_sack;       /* credit signalled by SACK flag C only (the wire's data path):
                                * C starts or refreshes credit mode, a SACK without it ends it;
                                * no MR_CREDIT grants; CC-9's probe is one more new packet
                                * (asking), no MR_PROBE; needs no credit manager */
    uint8_t rsvd_cfg[2];
    uint32_t breaks;           /* MRE_BREAK_* */
    uint32_t sq_cap;           /* send WQEs outstanding at most */
    uint32_t rq_cap;           /* receive WQEs posted at most */
    int64_t min_rto_ns;        /* RTO_min (RTO-1) */
    uint64_t seed;             /* entropy choices */
    /* congestion control parameters (engine/cc.py CCConfig) */
    double cc_line_rate_bps;
    int64_t cc_base_rtt_ns;
    int64_t cc_target_qdelay_ns;
    double cc_bdp_factor;
    double cc_alpha;
    double cc_beta;
    double cc_max_mdf;
    uint8_t cc_enabled;        /* 0: window fixed at max_cwnd, no reaction */
    uint8_t dcqcn;             /* compat: DCQCN reaction point */
    double dcqcn_g;
    int64_t dcqcn_alpha_timer_ns;
    int64_t dcqcn_rate_timer_ns;
    int64_t dcqcn_byte_counter;
    int32_t dcqcn_fast_steps;
    double dcqcn_ai_bps;
    double dcqcn_hai_bps;
    double dcqcn_min_bps;
    int64_t cnp_interval_ns;   /* compat responder: at most one CNP per interval */
};

/* ibv_qp_attr subset, applied by mre_qp_modify. */
struct mre_qp_attr {
    uint32_t dest_qpn;
    uint32_t sq_psn;
    uint32_t rq_psn;
    uint32_t path_mtu;
    uint32_t timeout;          /* local ACK timeout: 4.096 us x 2^timeout, 0 = infinite */
    uint32_t retry_cnt;
    uint32_t rnr_retry;        /* 7 = forever */
    uint32_t min_rnr_timer;
    uint32_t max_rd_atomic;
    uint32_t max_dest_rd_atomic;
    uint32_t window;           /* packets in flight; MetaRoCE: also the responder window W */
};

/* A send work request. `local` is the caller's address of the SGE (a pointer): the payload of
 * SEND/WRITE, where a READ's data or an atomic's original value goes. The engine hands it back
 * in packet descriptors; it dereferences it only when asked to place (simulator). */
struct mre_wqe {
    uint64_t wr_id;
    uint8_t opcode;            /* MRE_WR_* */
    uint8_t send_flags;        /* MRE_SEND_SIGNALED */
    uint8_t rsvd[2];
    uint32_t length;
    uint64_t remote_addr;
    uint32_t rkey;
    uint32_t imm;              /* host order */
    uint64_t compare_add;
    uint64_t swap;
    uint64_t local;
};

/* A packet: what the engine wants sent (output) and, in the simulator, what arrived (input).
 * Fields are host order; the transmit path (or the simulator) builds the headers. */
struct mre_pkt {
    uint32_t qp;               /* output: the engine's QP handle that sends it */
    uint32_t dest_qp;          /* BTH.DestQP */
    uint32_t psn;              /* BTH.PSN (MR_SACK: cumulative; MR_CREDIT: grant sequence) */
    uint8_t opcode;
    uint8_t flags;             /* MRE_PF_* */
    uint8_t path;              /* PETH PathID (requests) / SACKETH PathID (echo) */
    uint8_t has;               /* MRE_H_* */
    uint16_t sport;            /* UDP source port */
    uint16_t se;               /* 1: BTH.SE (the last packet of a solicited SEND) */
    uint32_t ts;               /* PETH Timestamp (ns mod 2^32) */
    uint32_t ts_echo;          /* SACKETH Timestamp Echo */
    uint32_t ce_count;         /* SACKETH CE Count */
    uint32_t credit_limit;     /* SACKETH Credit Limit PSN (with MRE_PF_CREDIT) */
    uint32_t syndrome;         /* AETH */
    uint32_t msn;              /* AETH */
    uint32_t imm;              /* ImmDt, host order */
    uint32_t ssn, rsn, offset; /* PETH */
    uint64_t reth_va;          /* RETH */
    uint32_t reth_rkey, reth_len;
    uint64_t atomic_va;        /* AtomicETH */
    uint32_t atomic_rkey, rsvd2;
    uint64_t swap_add, compare;
    uint64_t atomic_ack;       /* AtomicAckETH original value */
    uint64_t sack[2];          /* SACK bitmap: bit i of the 128 = PSN cumulative + 2 + i */
    uint32_t grant_limit;      /* CREDITETH Limit PSN */
    uint32_t grant_rate;       /* CREDITETH Rate, Mbit/s */
    const uint8_t *data;       /* payload (output: the WQE's local buffer or registered memory;
                                * READ responses also name it by reth_rkey / reth_va) */
    uint32_t len;              /* payload bytes */
    uint32_t wqe;              /* output requests: the WQE's posting index (0, 1, ... per QP) */
    uint64_t wr_id;            /* output requests: the WQE's wr_id (for the transmit path) */
};

/* A requester-side event, as the wire's data path reports it (MRE_EV_*). The simulator's
 * packets are turned into the same events inside the engine. */
struct mre_event {
    uint32_t type;
    uint32_t psn;
    uint32_t syndrome;
    uint32_t msn;
    uint64_t sack[2];
    uint32_t ts_echo;
    uint32_t ce_count;
    uint32_t credit_limit;
    uint32_t rate;
    uint32_t offset;
    uint32_t len;
    uint8_t path;
    uint8_t flags;             /* MRE_PF_ECN_ECHO / PROBE_REPLY / CREDIT / GRANT_ACTIVE */
    uint8_t rsvd[6];
    uint64_t value;            /* atomic original value (placed with MRE_EVF_PLACE) */
    const uint8_t *data;       /* READ response payload to place (NULL: placed already) */
    uint64_t wr_id;            /* MRE_EV_RECV */
    uint32_t rsn, imm;
    uint8_t wc_opcode, status, wc_flags, rsvd2;
    uint64_t va;               /* MRE_EV_READ_REQ */
    uint32_t rkey;
    uint16_t sport;
    uint16_t rsvd3;
};

struct mre_cqe {
    uint64_t wr_id;
    uint32_t byte_len;
    uint32_t imm;
    uint32_t qpn;
    uint32_t qp;               /* the engine's QP handle */
    uint8_t status;
    uint8_t opcode;
    uint8_t wc_flags;
    uint8_t rsvd[5];
};

/* Counters and state of one QP (requester, responder, CC, credits), for stats and tests. */
struct mre_qp_info {
    uint32_t state;
    uint32_t blocked;
    uint32_t nxt, una, high, tx_ptr;
    uint32_t epsn, msn;
    int64_t inflight_bytes;
    double cwnd, max_cwnd;
    double srtt;               /* -1: no sample yet */
    double rttvar;
    int64_t min_rtt;           /* -1: none */
    int64_t rto_ns;
    int64_t timeout_ns;        /* what the retransmission timer uses now (-1: infinite) */
    int64_t rto_max;
    int64_t rto_min;
    int64_t last_rtt;          /* -1: none */
    uint32_t rto_samples;
    uint32_t backoff;
    uint8_t credit_on;         /* the sender has a credit gate */
    uint8_t credit_active;
    uint8_t dcqcn_on;
    uint8_t dcqcn_limited;
    uint32_t credit_limit;
    double dcqcn_rc;
    uint64_t tx, retx, timeouts, rnr, rtt_samples, lost, lost_a, lost_b, cnp, probes, tx_bytes;
    uint64_t cc_md, cc_loss_cuts, cc_rto_resets, cc_ecn_path_only;
    /* responder, counted by verdict */
    uint64_t r_accept, r_duplicate, r_drop, r_nak_seq, r_nak_invalid, r_nak_access, r_rnr;
    uint64_t r_ce, r_cnp, r_sacks, r_grants, r_probes, r_rx_bytes;
    uint64_t read_go_backs, read_pending;
    uint32_t paths;
    uint32_t path_evictions;
    uint64_t credit_grants;    /* credit limits applied (grants and SACK flag C) */
    uint64_t credit_blocked;   /* times new data stopped at the credit limit */
    uint64_t read_responses;   /* READ response packets sent */
    uint64_t ack_timeouts;     /* expiries that consumed retry_cnt (local ACK timeouts) */
    uint64_t seq_errs;         /* PSN sequence NAKs and READ gaps acted on */
    uint64_t sacks;            /* SACKs processed */
    uint64_t rereads;          /* READ requests sent again (from their first missing PSN) */
    uint32_t outstanding;      /* send WQEs posted and not completed */
    uint32_t rsvd_info;
};

struct mre_path_info {
    uint32_t sport;
    double weight;
    uint64_t sent, acked, lost, rtos, ecn;
    double srtt;               /* -1: none */
    uint32_t evictions;
};

/* ---- engine ---- */
struct mre_engine *mre_engine_new(const struct mre_engine_cfg *cfg);
void mre_engine_free(struct mre_engine *e);
/* Registered memory (the responder side checks and places; mem may be NULL on the wire). */
int mre_mr_reg(struct mre_engine *e, uint32_t rkey, uint64_t addr, uint64_t len, uint32_t access,
               uint8_t *mem);
int mre_mr_dereg(struct mre_engine *e, uint32_t rkey);                /* 0, or MRE_E_INVAL */
/* Receiver credit manager counters */
uint32_t mre_credit_grants(struct mre_engine *e);
uint32_t mre_credit_max_active(struct mre_engine *e);

/* ---- QPs ---- */
int mre_qp_new(struct mre_engine *e, const struct mre_qp_cfg *cfg);   /* handle, or < 0 */
void mre_qp_free(struct mre_engine *e, uint32_t qp);
int mre_qp_modify(struct mre_engine *e, uint32_t qp, uint32_t state, const struct mre_qp_attr *a);
int mre_qp_to_error(struct mre_engine *e, uint32_t qp);   /* to ERR whatever its state */
int mre_post_send(struct mre_engine *e, uint32_t qp, const struct mre_wqe *w, int64_t now);
int mre_post_recv(struct mre_engine *e, uint32_t qp, uint64_t wr_id, uint8_t *buf, uint32_t len);

/* ---- input ---- */
/* The simulator: one packet for QP qp (the data path's part runs in the engine). */
void mre_rx(struct mre_engine *e, uint32_t qp, const struct mre_pkt *p, int64_t now);
/* The wire: one event of the requester side. */
void mre_event(struct mre_engine *e, uint32_t qp, const struct mre_event *ev, int64_t now);
/* Timers: the next deadline of a QP (-1: none); run what is due. */
int64_t mre_qp_deadline(struct mre_engine *e, uint32_t qp);
void mre_on_timer(struct mre_engine *e, uint32_t qp, int64_t now);

/* ---- output ---- */
/* Take up to max packet descriptors (requests, acknowledgements, then READ responses). A
 * descriptor's data stays valid until the next call into the engine. */
int mre_take_tx(struct mre_engine *e, struct mre_pkt *out, int max, int64_t now);
int mre_take_cqes(struct mre_engine *e, struct mre_cqe *out, int max);
/* Counters of what could not be queued (each is an error of the caller's sizing). */
uint64_t mre_cq_overruns(struct mre_engine *e);

/* ---- introspection ---- */
int mre_qp_state(struct mre_engine *e, uint32_t qp);          /* MRE_RESET .. MRE_ERR, or < 0 */
uint64_t mre_qp_rx_bytes(struct mre_engine *e, uint32_t qp);  /* payload bytes accepted */
uint32_t mre_qp_outstanding(struct mre_engine *e, uint32_t qp); /* send WQEs not completed */
uint32_t mre_qp_next_psn(struct mre_engine *e, uint32_t qp);   /* the next new PSN it sends */
int mre_qp_info(struct mre_engine *e, uint32_t qp, struct mre_qp_info *out);
int mre_path_info(struct mre_engine *e, uint32_t qp, uint32_t k, struct mre_path_info *out);

/* ---- pure helpers, exported for the unit tests ---- */
uint16_t mre_flow_label_sport(uint32_t lqpn, uint32_t rqpn);

#endif
