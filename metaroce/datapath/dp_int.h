/* Internals of the data path thread shared by its sources (not the cffi interface). */
#ifndef METAROCE_DP_INT_H
#define METAROCE_DP_INT_H

#include <linux/types.h>
#include <pthread.h>
#include <stddef.h>

#include "dp.h"
#include "events.h"
#include "nic_structs.h"

#define DP_NONE UINT32_MAX
#define DP_FETCH 64            /* WQEs copied out of one ring per round */
#define DP_TX_BATCH 64         /* descriptors taken from the engine per transmit call */
#define DP_CQE_BATCH 256
#define DP_LOCAL_CQES 256      /* a ring-less CQ keeps its last completions */
#define DP_ASYNC_CAP 1024
#define DP_SPIN_SLICE_NS 50000 /* a busy-poll slice before the control plane gets a look */
#define DP_POLL_LOW_NS 50000   /* the adaptive busy-poll bound (pollbound.py's rule) */
#define DP_POLL_HIGH_NS 2000000
#define DP_POLL_START_NS 200000
#define DP_MAX_MSG (1ull << 31)

/* ibv_wc_status values the adapter produces itself */
enum { WC_LOC_LEN_ERR = 1, WC_LOC_QP_OP_ERR = 2, WC_LOC_PROT_ERR = 4 };

struct dp_mr {
    uint32_t key, pd, access;
    uint8_t dead;              /* deregistered: unmapped when refs reaches 0 */
    uint64_t owner, addr, len;
    uint8_t *mem;
    size_t map_bytes;
    uint32_t refs;             /* work requests whose payload is read from this mapping */
};

struct dp_cq {
    uint32_t handle;
    uint64_t owner;
    uint8_t ring;              /* has a ring in shared memory (else the local list) */
    uint8_t overrun, bad_index, dirty, eligible, reported;
    struct mr_vq q;
    uint32_t cqe;              /* entries it accounts (the ring's size) */
    uint32_t produced;
    uint32_t ci;               /* the consumer index as last read and checked */
    uint64_t dropped;
    struct mr_cqe *local;      /* ring-less: the last DP_LOCAL_CQES completions */
    uint32_t local_head, local_tail;
};

/* What the adapter keeps of one posted WQE (index: its posting number). */
struct dp_shadow {
    uint8_t *bounce;           /* inline or gathered payload, the adapter's copy */
    struct dp_mr *mr;          /* the region its payload is read from (a reference) */
    uint64_t addr;             /* READ / atomic: the local SGE, where the response lands */
    uint32_t lkey, len;
    uint8_t kind;              /* RD_READ, RD_ATOMIC, or 0 */
};

struct dp_qp {
    uint8_t used, connected, err, has_rings, broken, touched, scanned;
    uint32_t qpn, pd, gen;
    uint64_t owner;
    uint32_t eh;               /* engine QP handle (DP_NONE before connect) */
    uint8_t mode;
    struct dp_cq *scq, *rcq;
    uint32_t max_send_wr, max_send_sge, max_inline, rq_entries;
    struct mr_vq sq, rq;       /* the daemon's views (the rings stay the control plane's) */
    uint32_t rq_done;          /* receives completed (the receive ring's consumer index) */
    struct dp_shadow *shadow;
    uint32_t shadow_mask;
    uint32_t posted, released; /* WQEs posted to the engine, and released again */
    uint32_t rd_next;          /* READ/atomic response slots handed out */
    uint32_t rd_done;          /* of them, completed (EV_RD_DONE) */
    uint32_t rd_seen_psn;      /* the kernel's READ response position at the last expiry */
    uint8_t rd_kind[RD_DEPTH];
    uint32_t sq_slot, nxt_stored;
    uint32_t remote_qpn;
    struct mr_roce_flow flow;
    int64_t deadline;          /* -1: none */
    uint32_t next_touched;
    uint64_t wqes, bad_wqes, sent_packets, sent_bytes, rd_slots, recv_completions;
};

struct dp_timer {
    int64_t at;
    uint32_t qi, gen;
};

struct mr_dp {
    struct mr_dp_cfg cfg;
    pthread_mutex_t lock;
    pthread_t thread;
    int started;
    volatile int stop;
    int ctl_waiting;           /* control calls waiting for the lock (atomic) */
    struct mre_engine *e;
    struct mr_xsk *xsk;
    struct mr_evring *ev;
    int epfd, wake_fd, async_fd;
    uint64_t *sq_psns;         /* mmap of the kernel's next-PSN array */
    size_t sq_psns_bytes;
    uint32_t *ev_sleep;        /* mmap of the NIC's ev_sleep: set while this thread sleeps */
    /* QPs: an array, found by QPN through an open-addressing index, by engine handle */
    struct dp_qp *qps;
    uint32_t nqps;
    uint32_t *qpn_idx;         /* slots: index + 1 into qps, 0 empty */
    uint32_t qpn_mask;
    uint32_t *by_eh;           /* engine handle -> index into qps */
    uint32_t touched;          /* list of QPs touched this round (DP_NONE-terminated) */
    /* MRs and CQs: open-addressing tables of pointers */
    struct dp_mr **mrs;
    uint32_t mrs_mask, nmrs;
    struct dp_cq **cqs;
    uint32_t cqs_mask, ncqs;
    struct dp_cq **dirty;      /* CQs written this round, to publish */
    uint32_t ndirty;
    /* the rings the thread scans: SQs of connected QPs, RQs of QPs in ERR (to flush) */
    struct mr_vq **scan;
    uint32_t *scan_qi;
    uint8_t *scan_send;
    uint32_t nscan;
    int scan_stale;
    /* timers */
    struct dp_timer *heap;
    uint32_t nheap, heap_cap;
    /* async events for the control plane */
    struct mr_dp_async async[DP_ASYNC_CAP];
    uint32_t async_head, async_tail;
    /* scratch */
    uint8_t *fetch_buf;        /* DP_FETCH slots of the largest stride */
    uint32_t fetch_stride;
    struct mre_pkt pkts[DP_TX_BATCH];
    struct mr_roce_flow *flows[DP_TX_BATCH];
    struct mre_cqe cqes[DP_CQE_BATCH];
    /* the busy-poll bound */
    int64_t poll_ns;
    int fixed_poll;
    struct mr_dp_stats st;
};

/* dp.c */
int64_t dp_now(void);
void dp_lock(struct mr_dp *d);
void dp_unlock(struct mr_dp *d);

/* dp_res.c */
struct dp_qp *dp_qp_by_qpn(struct mr_dp *d, uint32_t qpn);
struct dp_qp *dp_qp_by_eh(struct mr_dp *d, uint32_t eh);
struct dp_mr *dp_mr_find(struct mr_dp *d, uint32_t key);
void dp_mr_unref(struct dp_mr *m);
void dp_touch(struct mr_dp *d, struct dp_qp *q);
void dp_scan_rebuild(struct mr_dp *d);
void dp_push_async(struct mr_dp *d, uint32_t type, uint64_t owner, uint32_t cq, uint32_t qpn,
                   uint32_t cqe, uint32_t bad_index);

/* dp_wqe.c */
int dp_drain_rings(struct mr_dp *d, int64_t now);
void dp_release_shadow(struct mr_dp *d, struct dp_qp *q, uint32_t upto);
int dp_flush_recvs(struct mr_dp *d, struct dp_qp *q);

/* dp_events.c */
int dp_drain_events(struct mr_dp *d, int64_t now);
void dp_read_progress(struct mr_dp *d, struct dp_qp *q, int64_t now);

/* dp_tx.c */
int dp_transmit(struct mr_dp *d, int64_t now);

/* dp_cq.c */
void dp_cq_put(struct mr_dp *d, struct dp_cq *c, const struct mr_cqe *cqe);
int dp_deliver(struct mr_dp *d);
void dp_publish(struct mr_dp *d);
void dp_qp_to_err(struct mr_dp *d, struct dp_qp *q, const char *why);
void dp_settle(struct mr_dp *d);

/* dp_timer.c */
void dp_timer_set(struct mr_dp *d, struct dp_qp *q, int64_t at);
int dp_run_timers(struct mr_dp *d, int64_t now);
int64_t dp_next_deadline(struct mr_dp *d);

#endif
