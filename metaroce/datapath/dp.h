/* The device's user-space data path: one thread per device, in C, that runs the transport
 * engine (metaroce/cengine, mre.h) on the wire. It owns the engine, the NIC program's event ring,
 * the verbs rings of every application (send queues it drains, completion queues it fills;
 * receive queues stay with the XDP program, which takes receives from them itself), the AF_XDP
 * socket and its frame builder, and the retransmission timers. Python is the control plane: it
 * creates and destroys MRs, CQs and QPs, connects QPs and reads statistics through the calls
 * below, each of which takes the data path's lock for a few microseconds between two rounds of
 * the thread; nothing here takes the GIL. docs/architecture.md, "The engine thread".
 *
 * This header is the cffi interface (constants are enums: cffi reads it). */
#ifndef METAROCE_DP_H
#define METAROCE_DP_H

#include <stdint.h>

#include "mre.h"
#include "roce_tx.h"
#include "vq.h"
#include "xsk.h"

enum {
    /* struct mr_dp_async.type */
    MR_DP_CQ_ERR = 1,          /* a CQ overran (or its consumer index was impossible) */
    MR_DP_QP_FATAL = 2,        /* a QP went to ERR because a CQ it uses overran */
    /* errors of the control calls (negative errno values otherwise) */
    MR_DP_E_EXIST = -17,       /* -EEXIST */
    MR_DP_E_NOENT = -2,        /* -ENOENT */
    MR_DP_E_FULL = -28,        /* -ENOSPC */
    MR_DP_E_INVAL = -22        /* -EINVAL */
};

struct mr_dp;

struct mr_dp_cfg {
    int ifindex;
    uint32_t queue;            /* the AF_XDP socket's queue */
    int events_fd;             /* the NIC program's ring buffer (events) */
    int ev_sleep_fd;           /* its mmap-able flag: 1 while this thread sleeps on the ring */
    int sq_psns_fd;            /* its mmap-able array of each QP's next PSN (u64 entries) */
    uint32_t sq_psns_entries;
    int rd_slots_fd;           /* its hash (QPN << 32 | idx % RD_DEPTH) -> struct rd_slot */
    int qps_fd;                /* its hash QPN -> struct nic_qp (a QP's responder to ERR) */
    uint32_t max_qps;
    uint32_t max_mrs;
    uint32_t max_cqs;
    uint32_t xsk_frames;       /* UMEM slots (mr_xsk_open's nframes) */
    uint32_t xsk_frame_size;   /* UMEM chunk */
    uint32_t xsk_ring;
    uint32_t xsk_budget;
    uint16_t xsk_bind_flags;   /* with XDP_USE_SG: frames of several chunks if the kernel takes it */
    uint16_t rsvd;
    int64_t min_rto_ns;        /* RTO_min of MetaRoCE QPs (RTO-1) */
    int64_t busy_poll_ns;      /* busy-poll this long after the last work; < 0: adaptive */
};

/* A QP as created (RESET/INIT): its owner, PD, CQs and limits. */
struct mr_dp_qp {
    uint32_t qpn;
    uint32_t pd;
    uint64_t owner;
    uint32_t send_cq;
    uint32_t recv_cq;
    uint32_t max_send_wr;
    uint32_t max_send_sge;
    uint32_t max_inline;
    uint32_t rq_entries;       /* its receive ring's slots (0: no rings) */
};

/* What connecting a QP (RTR + RTS) fixes. */
struct mr_dp_conn {
    struct mre_qp_attr attr;
    uint8_t mode;              /* MRE_COMPAT / MRE_METAROCE */
    uint8_t paths;             /* MetaRoCE entropy values (MP-1), 1 .. 8 */
    uint8_t credit;            /* the peer has CREDIT: start in credit mode (CC-8) */
    uint8_t rsvd0;
    uint32_t sq_slot;          /* its entry in sq_psns */
    uint32_t remote_qpn;
    uint32_t rsvd;
    struct mr_roce_flow flow;  /* its packets' headers (addresses, TOS, TTL, P_Key) */
    /* the engine's settings the control plane chooses: its congestion control (cc, cc_*,
     * dcqcn*, cnp_interval_ns: metaroce/nic/ccconfig.py); the data path sets every other field
     * of the QP's configuration itself */
    struct mre_qp_cfg engine;
};

struct mr_dp_async {
    uint32_t type;             /* MR_DP_* */
    uint32_t cq;
    uint32_t qpn;
    uint32_t cqe;
    uint64_t owner;
    uint32_t bad_index;        /* CQ_ERR: the owner's consumer index was impossible */
    uint32_t rsvd;
};

/* One QP as the data path sees it (engine counters and the adapter's own). */
struct mr_dp_qp_info {
    struct mre_qp_info e;
    uint32_t connected;
    uint32_t err;              /* in ERR */
    uint32_t unfetched;        /* send WQEs published in the ring, not taken yet */
    uint32_t sq_taken;         /* send WQEs taken and not completed */
    uint64_t wqes;             /* send WQEs taken */
    uint64_t bad_wqes;
    uint64_t sent_packets;     /* every packet it sent (requests, retransmissions, READ resp.) */
    uint64_t sent_bytes;       /* payload bytes of first transmissions */
    uint64_t rd_slots;         /* READ/atomic response slots handed to the kernel */
    uint64_t recv_completions;
};

struct mr_dp_cq_info {
    uint32_t cqe;
    uint32_t produced;
    uint32_t consumed;
    uint32_t overrun;
    uint32_t bad_index;
    uint32_t rsvd;
    uint64_t dropped;          /* completions lost to the overrun */
};

struct mr_dp_stats {
    uint64_t rounds;           /* rounds that found work */
    uint64_t spins;            /* busy-poll slices */
    uint64_t sleeps;
    uint64_t wakeups_by_doorbell;
    uint64_t events;           /* the NIC program's events taken */
    uint64_t events_ignored;   /* of QPs the data path does not drive (raw, destroyed) */
    uint64_t wqes;             /* send WQEs taken out of the rings */
    uint64_t bad_wqes;
    uint64_t tx_packets;       /* descriptors turned into frames */
    uint64_t tx_bad;           /* descriptors no frame could be built for */
    uint64_t tx_full;          /* rounds that stopped on a full AF_XDP ring */
    uint64_t cqes;             /* completions written */
    uint64_t cq_overruns;
    uint64_t timers;           /* timer expiries run */
    uint64_t rd_slot_errors;   /* map updates of response slots that failed */
    uint64_t busy_poll_ns;     /* the bound now */
    uint64_t busy_ns;          /* time spent in rounds (the thread's CPU for work) */
    uint64_t spin_ns;          /* time spent busy-polling */
    uint64_t heap;             /* timer heap entries */
    /* time spent in each phase of the rounds that found work (ns) */
    uint64_t ns_events, ns_rings, ns_timers, ns_tx, ns_finish;
    uint32_t qps;
    uint32_t active_rings;
    uint32_t fixed_busy_poll;
    uint32_t running;
};

/* ---- lifetime ---- */
/* NULL on failure: *err the errno, *stage what failed */
struct mr_dp *mr_dp_new(const struct mr_dp_cfg *cfg, int *err, const char **stage);
int mr_dp_start(struct mr_dp *d);              /* the thread; 0 or -errno */
void mr_dp_free(struct mr_dp *d);              /* stops the thread, frees everything */

/* ---- resources (each takes the lock) ---- */
/* Registered memory: the data path maps the region's map fd itself (map_bytes) and unmaps it
 * when the region is gone and no work request uses it any more. */
int mr_dp_mr_add(struct mr_dp *d, uint32_t key, uint64_t owner, uint32_t pd, uint64_t addr,
                 uint64_t len, uint32_t access, int map_fd, uint64_t map_bytes);
int mr_dp_mr_del(struct mr_dp *d, uint32_t key);
/* A CQ: view is the daemon's view of its ring (copied; the ring stays mapped until
 * mr_dp_cq_del returns); NULL: a ring-less CQ (the daemon's own endpoints, mr_dp_cq_take). */
int mr_dp_cq_add(struct mr_dp *d, uint32_t handle, uint64_t owner, const struct mr_vq *view,
                 uint32_t cqe);
int mr_dp_cq_del(struct mr_dp *d, uint32_t handle);
int mr_dp_cq_take(struct mr_dp *d, uint32_t handle, struct mr_cqe *out, uint32_t max);
int mr_dp_cq_info(struct mr_dp *d, uint32_t handle, struct mr_dp_cq_info *out);
/* A QP: sq and rq are the daemon's views of its rings (copied), NULL for a ring-less QP. */
int mr_dp_qp_add(struct mr_dp *d, const struct mr_dp_qp *c, const struct mr_vq *sq,
                 const struct mr_vq *rq);
int mr_dp_qp_connect(struct mr_dp *d, uint32_t qpn, const struct mr_dp_conn *c);
int mr_dp_qp_del(struct mr_dp *d, uint32_t qpn);
int mr_dp_qp_info(struct mr_dp *d, uint32_t qpn, struct mr_dp_qp_info *out);
int mr_dp_path_info(struct mr_dp *d, uint32_t qpn, uint32_t k, struct mre_path_info *out);
uint32_t mr_dp_path_pkts(struct mr_dp *d, uint32_t qpn, uint32_t k);
/* An application's doorbell eventfd: the thread sleeps on it. */
int mr_dp_doorbell_add(struct mr_dp *d, int fd);
int mr_dp_doorbell_del(struct mr_dp *d, int fd);

/* ---- what the control plane reads ---- */
/* Async events (CQ overruns and the QPs they failed); async_fd is readable while some wait. */
int mr_dp_async_fd(struct mr_dp *d);
int mr_dp_take_async(struct mr_dp *d, struct mr_dp_async *out, uint32_t max);
void mr_dp_get_stats(struct mr_dp *d, struct mr_dp_stats *out);
void mr_dp_xsk_stats(struct mr_dp *d, struct mr_xsk_stats *out);
/* The largest frame the device's AF_XDP socket sends (mr_xsk_frame_cap: a chunk, or several
 * with XDP_USE_SG) and whether it took SG; fixed when the socket is opened. */
uint32_t mr_dp_frame_cap(struct mr_dp *d);
int mr_dp_xsk_sg(struct mr_dp *d);

#endif
