/* Engine internals shared by its sources (not part of the cffi interface). */
#ifndef METAROCE_MRE_INT_H
#define METAROCE_MRE_INT_H

#include <stdint.h>

#include "mre.h"
#include "mre_cc.h"
#include "mre_credit.h"
#include "mre_paths.h"
#include "psn.h"

#define NONE32 UINT32_MAX
#define ACK_REQ_EVERY 16       /* AckReq on the last packet of a message and every 16th */
#define HDR_BYTES 64           /* per-packet bytes the congestion window counts (CC-1) */
#define REORDER_THRESHOLD 16   /* SACK-5 (b) */
#define TAIL_PKTS 4            /* RTO-3 */
#define SACK_BITS 128
#define SACK_EVERY 4           /* responder: SACK at least every 4 accepted packets */
#define SACK_DELAY_NS 2000     /* responder: an accepted packet is SACKed within this delay */
#define ACK_SYNDROME 0x1F      /* ACK, credits invalid (AETH_ACK_UNLIMITED) */
#define MSN_MASK 0xFFFFFFu
#define RTO_G_NS 5000          /* RTO-1: G, the RTTVAR floor of the RTO */
#define RTO_MAX_INFINITE_NS 1000000000   /* RTO_max when the local ACK timeout is infinite (RTO-4) */

/* RC opcodes (IBTA 9.2); MetaRoCE = 0xC0 | RC opcode (EXT-2) */
enum {
    OP_SEND_FIRST = 0x00, OP_SEND_MIDDLE = 0x01, OP_SEND_LAST = 0x02,
    OP_SEND_LAST_IMM = 0x03, OP_SEND_ONLY = 0x04, OP_SEND_ONLY_IMM = 0x05,
    OP_WRITE_FIRST = 0x06, OP_WRITE_MIDDLE = 0x07, OP_WRITE_LAST = 0x08,
    OP_WRITE_LAST_IMM = 0x09, OP_WRITE_ONLY = 0x0A, OP_WRITE_ONLY_IMM = 0x0B,
    OP_READ_REQ = 0x0C, OP_READ_RESP_FIRST = 0x0D, OP_READ_RESP_MIDDLE = 0x0E,
    OP_READ_RESP_LAST = 0x0F, OP_READ_RESP_ONLY = 0x10, OP_ACK = 0x11, OP_ATOMIC_ACK = 0x12,
    OP_CMP_SWAP = 0x13, OP_FETCH_ADD = 0x14,
    OP_CNP = 0x81, OP_MR_SACK = 0xD1, OP_MR_CREDIT = 0xE0, OP_MR_PROBE = 0xE2
};

/* ---- requester ---- */

/* A send WQE with its PSN range and acknowledgement progress. */
struct wqe {
    struct mre_wqe wr;
    uint32_t ssn, rsn, npkts, first_psn;
    uint32_t nacked, una_idx, nseen;
    uint8_t status;            /* 0xFF: none (not failed) */
    uint8_t needs_response;    /* READ or atomic */
    uint8_t is_read;
};

/* Scoreboard: one entry per transmitted PSN, indexed by PSN mod size (SACK-4). */
struct sb_ent {
    uint32_t psn;              /* tag: the entry is PSN psn's */
    uint32_t wqe;              /* absolute SQ index */
    uint32_t idx;              /* packet index in the WQE */
    uint32_t retx;             /* retransmissions so far */
    int64_t sent_at;
    int64_t sent_seq;
    uint8_t acked, seen, infl, queued, path, valid;
};

struct requester {
    struct wqe *sq;
    uint32_t sq_mask, sq_cap;
    uint32_t sq_head, sq_infl, sq_tail;  /* [head, infl) have PSNs, [infl, tail) pending */
    struct sb_ent *sb;
    uint32_t sb_mask;
    uint32_t *rtxq;            /* PSNs declared lost, served ahead of new data */
    uint32_t rtxq_mask, rtxq_head, rtxq_tail;
    uint32_t *scratch;         /* hole lists (size of the scoreboard) */
    uint32_t read_max;         /* PSNs of the largest READ posted (sizes the scoreboard) */
    uint32_t nxt, tx_ptr, high;
    uint32_t tx_wqe;           /* cached: the WQE tx_ptr is in */
    uint32_t last_desc;        /* output ring index of the latest packet sent */
    int64_t ask_psn;           /* the latest PSN sent with AckReq (-1: none yet) */
    uint32_t ssn, rsn;
    int64_t timer_base;        /* -1: timer off */
    int64_t rnr_until;         /* -1: not waiting */
    int32_t retries, rnr_retries;
    int64_t gbn_psn;           /* -1: none */
    int64_t tx_seq, evidence;
    struct mre_rto rto;
    int64_t min_rto_ns;
    int64_t inflight_bytes;
    uint32_t rd_outstanding;
    uint8_t has_cc, has_dcqcn, has_credit, started;
    struct mre_wcc cc;
    struct mre_dcqcn dcqcn;
    struct mre_pacer pacer;
    struct mre_pathset paths;
    struct mre_credit_gate credit;
    uint8_t blocked;
    int64_t high_sacked;       /* -1: none */
    int64_t sack_horizon;      /* -1: none */
    uint32_t last_ce;
    int64_t last_rtt;          /* -1: none */
    uint64_t tx, retx, timeouts, rnr, rtt_samples, lost, lost_a, lost_b, cnp, probes, tx_bytes;
    uint64_t credit_grants, credit_blocked;
    uint64_t ack_timeouts, seq_errs, sacks, rereads;
    /* a fatal NAK that waits for the responses of READs/atomics before the failing WQE */
    uint8_t fatal_wait, fatal_status;
    uint32_t fatal_wqe;
    int64_t fatal_until;
};

/* ---- responder ---- */

struct recv_wqe {
    uint64_t wr_id;
    uint8_t *buf;
    uint32_t len;
};

/* A recorded request packet waiting for ePSN to pass it (in-order side effects). */
struct pending {
    uint32_t psn;              /* tag */
    uint8_t valid;
    uint8_t op;                /* RC opcode */
    uint8_t has_imm, has_place;
    uint32_t imm;
    uint32_t msg_len;
    uint64_t va;               /* READ: RETH; atomic: AtomicETH */
    uint32_t rkey, len;
    uint64_t swap_add, compare;
    uint32_t ssn, rsn, offset;
    uint16_t sport;
};

/* One READ response stream queued for transmission (RESP-4's go-back works on these). */
struct rd_resp {
    uint32_t psn0, npkts, next;
    uint32_t msn, ssn, base_off;
    uint64_t va;
    uint32_t rkey, len;
    uint16_t sport;
    uint8_t has_place;
};

/* A receive the wire's data path completed, waiting for the cumulative PSN (PLACE-5). */
struct recv_done {
    uint64_t wr_id;
    uint32_t rsn, last_psn, byte_len, imm;
    uint8_t valid, opcode, status, wc_flags;
};

struct atomic_saved {
    uint32_t psn;
    uint64_t value;
};

struct responder {
    uint8_t started;
    uint32_t epsn;
    uint64_t *bitmap;          /* bit (PSN mod size): received (MetaRoCE window) */
    uint32_t bm_mask;
    struct pending *pend;      /* indexed by PSN mod size */
    uint32_t window;
    uint8_t sent_psn_nak;
    uint8_t seq;               /* 0 none, 1 SEND, 2 WRITE (compat opcode-sequence cursor) */
    uint64_t cur_va;
    uint32_t cur_rkey;
    uint64_t cur_remaining;
    uint32_t cur_off;
    uint32_t cur_len;          /* compat: length of the message in progress */
    uint32_t msn;
    struct recv_wqe *rq;
    uint32_t rq_mask, rq_cap, rq_head, rq_tail;  /* rq_head: RSN of the oldest (mod 2^24) */
    uint32_t recv_head;        /* RSN of rq_head (24-bit) */
    struct recv_done *rwait;   /* wire: receives completed out of order, by RSN */
    uint32_t rwait_next;       /* the next RSN to complete */
    int64_t rx_epsn;           /* wire: the data path's cumulative PSN + 1 as last reported */
    struct atomic_saved *atomics;
    uint32_t atomics_cap, atomics_n, atomics_head;
    struct rd_resp *rd;        /* READ response queue (ring) */
    uint32_t rd_mask, rd_head, rd_tail;
    int64_t rd_served;         /* last response PSN queued so far (-1: none) */
    uint32_t ce_count;
    uint32_t ce_run;
    int64_t last_cnp;          /* -1: never */
    struct mre_grant_state grant;
    uint32_t since_sack;
    int64_t sack_due;          /* -1: none */
    int64_t now;
    /* the packet that triggered the latest acknowledgement (PathID, timestamp, CE, port) */
    uint8_t has_trig, trig_path, trig_ce;
    uint32_t trig_ts, trig_psn;
    uint16_t trig_sport;
    uint64_t accept, duplicate, drop, nak_seq, nak_invalid, nak_access, rnr;
    uint64_t ce, cnp, sacks, grants, probes, rx_bytes, read_go_backs, read_pending;
    uint64_t read_responses;
};

/* ---- QP and engine ---- */

struct qp {
    uint8_t used;
    uint8_t state;
    uint8_t mode;
    uint32_t qpn;
    struct mre_qp_cfg cfg;
    struct mre_qp_attr attr;
    struct requester req;
    struct responder resp;
    uint8_t rd_active;         /* on the engine's READ-response list */
    uint32_t rd_next_active;
};

struct mr {
    uint8_t used;
    uint32_t rkey;
    uint32_t access;
    uint64_t addr, len;
    uint8_t *mem;
};

struct mre_engine {
    struct mre_engine_cfg cfg;
    struct qp *qps;
    uint32_t nqps;
    struct mr *mrs;            /* open addressing by rkey (linear probing), 2 x max_mrs slots */
    uint32_t mrs_mask;
    uint32_t nmrs;
    struct mre_pkt *out;       /* output ring */
    uint32_t out_mask, out_head, out_tail;
    struct mre_cqe *cq;
    uint32_t cq_mask, cq_head, cq_tail;
    uint64_t cq_overruns;
    uint32_t rd_first, rd_last; /* QPs with READ responses to send, in order */
    uint8_t txq_blocked;       /* some QP stopped because the output ring was full */
    uint32_t txq_next;         /* where the next resume scan starts (round robin) */
    struct mre_credit_mgr credit;
    uint8_t has_credit;
};

/* engine.c */
struct mre_pkt *eng_out(struct mre_engine *e);       /* NULL: the ring is full */
int eng_out_room(const struct mre_engine *e);
void eng_cqe(struct mre_engine *e, struct qp *q, uint64_t wr_id, uint8_t status, uint8_t opcode,
             uint32_t byte_len, uint8_t wc_flags, uint32_t imm);
void eng_qp_error(struct mre_engine *e, struct qp *q);
const struct mr *eng_mr(const struct mre_engine *e, uint32_t rkey);
void eng_rd_activate(struct mre_engine *e, struct qp *q);

static inline int qp_metaroce(const struct qp *q) { return q->mode == MRE_METAROCE; }
static inline int qp_can_send(const struct qp *q) { return q->state == MRE_RTS || q->state == MRE_SQD; }
static inline uint8_t mode_op(const struct qp *q, uint8_t rc) { return qp_metaroce(q) ? (uint8_t)(rc | 0xC0) : rc; }
static inline uint32_t npackets(uint64_t len, uint32_t mtu) { return len ? (uint32_t)((len + mtu - 1) / mtu) : 1; }

/* requester.c */
int req_alloc(struct qp *q);
void req_free(struct qp *q);
void req_reset(struct qp *q);
void req_start(struct mre_engine *e, struct qp *q);
int req_post(struct mre_engine *e, struct qp *q, const struct mre_wqe *w);
int req_reserve(struct qp *q, uint32_t window, uint32_t read_max);
void req_pump(struct mre_engine *e, struct qp *q, int64_t now);
void req_event(struct mre_engine *e, struct qp *q, const struct mre_event *ev, int64_t now);
int64_t req_deadline(const struct mre_engine *e, struct qp *q);
void req_on_timer(struct mre_engine *e, struct qp *q, int64_t now);
void req_flush(struct mre_engine *e, struct qp *q);
uint32_t req_una(const struct qp *q);
int64_t req_timeout_ns(const struct qp *q);
uint16_t req_sport0(const struct qp *q);

/* responder.c */
int resp_alloc(struct qp *q);
void resp_free(struct qp *q);
void resp_reset(struct qp *q);
void resp_start(struct qp *q);
int resp_post_recv(struct qp *q, uint64_t wr_id, uint8_t *buf, uint32_t len);
void resp_handle(struct mre_engine *e, struct qp *q, const struct mre_pkt *p, int64_t now);
void resp_on_probe(struct mre_engine *e, struct qp *q, const struct mre_pkt *p, int64_t now);
void resp_on_sack_timer(struct mre_engine *e, struct qp *q, int64_t now);
void resp_flush(struct mre_engine *e, struct qp *q);
void resp_event(struct mre_engine *e, struct qp *q, const struct mre_event *ev);

/* readresp.c */
void rd_queue(struct mre_engine *e, struct qp *q, const struct pending *req, uint32_t msn);
void rd_go_back(struct mre_engine *e, struct qp *q, const struct pending *req, uint32_t msn);
int rd_take(struct mre_engine *e, struct qp *q, struct mre_pkt *out, int max);

#endif
