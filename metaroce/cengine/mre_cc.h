/* Retransmission timeout (RTO-1 .. RTO-3), congestion control (CC-1 .. CC-7, COMPAT-4) and
 * pacing: the engine's per-QP rate and window state. Clock-free: every call takes `now` (ns).
 * The components' types are part of the cffi interface so that unit tests drive them alone. */
#ifndef METAROCE_MRE_CC_H
#define METAROCE_MRE_CC_H

#include <stdint.h>

/* RFC 6298 estimator with exponential backoff (rto.c). */
struct mre_rto {
    int64_t initial, min, max, g;
    double srtt;               /* valid when has_srtt */
    double rttvar;
    int64_t min_rtt;           /* -1: none */
    uint32_t backoff;
    uint32_t samples;
    uint8_t has_srtt;
};

void mre_rto_init(struct mre_rto *r, int64_t initial_ns, int64_t min_ns, int64_t max_ns,
                  int64_t granularity_ns);
void mre_rto_sample(struct mre_rto *r, int64_t rtt_ns);
int64_t mre_rto_base_ns(const struct mre_rto *r);
int64_t mre_rto_ns(const struct mre_rto *r);

/* MetaRoCE sender window (cc.c): a byte window capped at bdp_factor x BDP, ECN + delay. */
struct mre_wcc {
    double cwnd, max_cwnd;
    int64_t base_rtt;
    int64_t target_qdelay;
    int64_t last_md;           /* -1: never */
    int64_t last_loss_cut;     /* -1: never */
    double alpha, beta, max_mdf;
    uint32_t mtu;
    uint8_t enabled;
    uint64_t md, loss_cuts, rto_resets, ecn_path_only;
};

void mre_wcc_init(struct mre_wcc *c, double line_rate_bps, int64_t base_rtt_ns,
                  int64_t target_qdelay_ns, double bdp_factor, double alpha, double beta,
                  double max_mdf, int enabled, uint32_t mtu);
/* One SACK's signals (rtt_ns < 0: no sample). Returns 1 when the ECN is a path signal only. */
int mre_wcc_on_ack(struct mre_wcc *c, int64_t now, int64_t acked, int64_t rtt_ns, int ecn,
                   double srtt);
void mre_wcc_on_loss(struct mre_wcc *c, int64_t now, int64_t lost_bytes, double srtt);
void mre_wcc_on_rto(struct mre_wcc *c, int64_t now);

/* DCQCN reaction point (cc.c), evaluated lazily at each call. */
struct mre_dcqcn {
    double line, rc, rt, alpha;
    double g, ai, hai, min_rate;
    int64_t alpha_timer, rate_timer, byte_counter;
    int64_t alpha_t, rate_t;   /* -1: idle (at line rate) */
    int64_t t_count, b_count, bytes;
    int32_t fast_steps;
    uint8_t enabled;
    uint8_t cnp_since_alpha;
    uint64_t cnps;
};

void mre_dcqcn_init(struct mre_dcqcn *d, double line_rate_bps, int enabled, double g,
                    int64_t alpha_timer_ns, int64_t rate_timer_ns, int64_t byte_counter,
                    int32_t fast_steps, double ai_bps, double hai_bps, double min_bps);
void mre_dcqcn_on_cnp(struct mre_dcqcn *d, int64_t now);
void mre_dcqcn_advance(struct mre_dcqcn *d, int64_t now);
void mre_dcqcn_on_sent(struct mre_dcqcn *d, int64_t nbytes);

/* Pacing: the next packet may leave at next_ns, with a burst allowance. */
struct mre_pacer {
    int64_t next_ns;
    int64_t burst;
};

void mre_pacer_sent(struct mre_pacer *p, int64_t now, int64_t nbytes, double rate_bps);

#endif
