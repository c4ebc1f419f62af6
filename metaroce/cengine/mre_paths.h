/* Multipath over an entropy set (MP-1 .. MP-5): per QP up to 64 paths, each a UDP source port
 * and a PathID; smooth weighted round robin spraying; per-path feedback, loss attribution and
 * eviction (paths.c). Part of the cffi interface for the unit tests. */
#ifndef METAROCE_MRE_PATHS_H
#define METAROCE_MRE_PATHS_H

#include <stdint.h>

enum { MRE_MAX_PATHS = 64, MRE_PATH_LOSS_HIST = 4, MRE_RETIRED_PORTS = 256, MRE_MT_N = 624 };

struct mre_path {
    double weight;
    double current;            /* smooth-WRR accumulator */
    double ecn_frac;
    double srtt;               /* -1: none */
    uint64_t sent, acked, lost, rtos, ecn, ecn_samples;
    int64_t evidence;          /* newest transmission (tx_seq) SACKed on this path */
    int64_t born;              /* first tx_seq sent on this port (-1: none yet) */
    int64_t loss_times[4];              /* MRE_PATH_LOSS_HIST */
    uint32_t nloss;
    uint32_t evictions;
    uint16_t sport;
};

/* Fresh source ports: MT19937 seeded as Python's random.Random((seed << 48) ^ (lqpn << 24)
 * ^ rqpn), so the C engine and the reference model choose the same ports; retired ports. */
struct mre_entropy {
    uint32_t mt[624];                  /* MRE_MT_N */
    uint32_t mti;
    uint16_t retired_port[256];        /* MRE_RETIRED_PORTS */
    int64_t retired_at[256];
    uint32_t nretired;
};

struct mre_pathset {
    struct mre_path *p;                /* n paths, allocated by mre_paths_init */
    uint32_t n;
    uint32_t evictions;
    struct mre_entropy *ent;           /* with n > 1 only */
    /* MP-5 defaults */
    uint32_t loss_evict;
    double loss_window_srtt;
    double ecn_evict_frac, ecn_others_below, ecn_gain;
    uint32_t ecn_min_samples;
    double weight_cut, weight_min, weight_regain;
    int64_t reuse_holdoff_ns;
};

/* Allocates the n paths (control path, at RTS); 0, or -1 without memory. */
int mre_paths_init(struct mre_pathset *s, uint32_t n, uint32_t lqpn, uint32_t rqpn,
                   uint64_t seed);
void mre_paths_free(struct mre_pathset *s);
/* The path of the next packet (avoid: a retransmission's previous path, -1 none). */
uint32_t mre_paths_pick(struct mre_pathset *s, int avoid);
/* A SACK echoed path k (rtt_ns < 0: no sample). */
void mre_paths_on_ack(struct mre_pathset *s, uint32_t k, int64_t rtt_ns, int ecn, int64_t now);
void mre_paths_congested(struct mre_pathset *s, uint32_t k);
/* A loss attributed to path k; returns 1 when that evicted it. */
int mre_paths_on_loss(struct mre_pathset *s, uint32_t k, int64_t now, double srtt);
void mre_paths_on_rto(struct mre_pathset *s, uint32_t k, int64_t now);
void mre_paths_evict(struct mre_pathset *s, uint32_t k, int64_t now);

#endif
