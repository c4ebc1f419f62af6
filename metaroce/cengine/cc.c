/* RTO estimator, MetaRoCE window congestion control, DCQCN and the pacer. The rules and their
 * reasons are in docs/engine.md; metaroce/engine/cc.py and rto.py are the reference model the
 * differential tests compare with (same arithmetic, same order of operations). */
#include <math.h>

#include "mre_cc.h"

/* ---- RTO-1: RFC 6298 ------------------------------------------------------------------- */

void mre_rto_init(struct mre_rto *r, int64_t initial_ns, int64_t min_ns, int64_t max_ns,
                  int64_t granularity_ns)
{
    r->initial = initial_ns;
    r->min = min_ns;
    r->max = max_ns;
    r->g = granularity_ns;
    r->srtt = 0.0;
    r->rttvar = 0.0;
    r->has_srtt = 0;
    r->min_rtt = -1;
    r->backoff = 0;
    r->samples = 0;
}

void mre_rto_sample(struct mre_rto *r, int64_t rtt_ns)
{
    int64_t rtt = rtt_ns < 0 ? 0 : rtt_ns;
    if (!r->has_srtt) {
        r->srtt = (double)rtt;
        r->rttvar = (double)rtt / 2;
        r->has_srtt = 1;
    } else {
        r->rttvar = (1 - 0.25) * r->rttvar + 0.25 * fabs(r->srtt - (double)rtt);
        r->srtt = (1 - 0.125) * r->srtt + 0.125 * (double)rtt;
    }
    if (r->min_rtt < 0 || rtt < r->min_rtt)
        r->min_rtt = rtt;
    r->samples++;
}

int64_t mre_rto_base_ns(const struct mre_rto *r)
{
    if (!r->has_srtt)
        return r->initial;
    double var = 4 * r->rttvar;
    return (int64_t)(r->srtt + ((double)r->g >= var ? (double)r->g : var));
}

int64_t mre_rto_ns(const struct mre_rto *r)
{
    int64_t base = mre_rto_base_ns(r);
    int64_t v = base > r->min ? base : r->min;
    if (v > r->max)
        v = r->max;
    v <<= r->backoff < 16 ? r->backoff : 16;
    return v < r->max ? v : r->max;
}

/* ---- MetaRoCE window (CC-1 .. CC-4) ------------------------------------------------------ */

void mre_wcc_init(struct mre_wcc *c, double line_rate_bps, int64_t base_rtt_ns,
                  int64_t target_qdelay_ns, double bdp_factor, double alpha, double beta,
                  double max_mdf, int enabled, uint32_t mtu)
{
    double bdp = line_rate_bps * (double)base_rtt_ns / 8e9;
    double cap = bdp_factor * bdp;
    c->max_cwnd = (double)mtu >= cap ? (double)mtu : cap;
    c->cwnd = c->max_cwnd;               /* line-rate start (CC-1) */
    c->base_rtt = base_rtt_ns;
    c->target_qdelay = target_qdelay_ns;
    c->last_md = c->last_loss_cut = -1;
    c->alpha = alpha;
    c->beta = beta;
    c->max_mdf = max_mdf;
    c->mtu = mtu;
    c->enabled = (uint8_t)enabled;
    c->md = c->loss_cuts = c->rto_resets = c->ecn_path_only = 0;
}

static void wcc_clamp(struct mre_wcc *c)
{
    double lo = (double)c->mtu >= c->cwnd ? (double)c->mtu : c->cwnd;
    c->cwnd = c->max_cwnd <= lo ? c->max_cwnd : lo;
}

int mre_wcc_on_ack(struct mre_wcc *c, int64_t now, int64_t acked, int64_t rtt, int ecn,
                   double srtt)
{
    if (!c->enabled)
        return 0;
    if (rtt < 0)
        rtt = srtt != 0.0 ? (int64_t)srtt : c->base_rtt;
    if (rtt > 0 && rtt < c->base_rtt)
        c->base_rtt = rtt;
    int64_t target = c->base_rtt + c->target_qdelay;
    int path_only = 0;
    if (!ecn) {
        if (acked) {
            if (rtt < target)
                c->cwnd += c->alpha * (double)acked * (double)(target - rtt) / (double)target;
            else
                c->cwnd += (double)((int64_t)c->mtu * acked) / c->cwnd;
        }
    } else if (rtt >= target) {
        double gap = srtt >= (double)c->base_rtt ? srtt : (double)c->base_rtt;
        if (c->last_md < 0 || (double)(now - c->last_md) >= gap) {
            double f = 1 - c->beta * (double)(rtt - target) / (double)rtt;
            double floor = 1 - c->max_mdf;
            c->cwnd *= f >= floor ? f : floor;
            c->last_md = now;
            c->md++;
        }
    } else {
        path_only = 1;               /* quadrant 4: the caller lowers that path's weight */
        c->ecn_path_only++;
    }
    wcc_clamp(c);
    return path_only;
}

void mre_wcc_on_loss(struct mre_wcc *c, int64_t now, int64_t lost_bytes, double srtt)
{
    if (!c->enabled)
        return;
    double gap = srtt >= (double)c->base_rtt ? srtt : (double)c->base_rtt;
    if (c->last_loss_cut >= 0 && (double)(now - c->last_loss_cut) < gap)
        return;                      /* at most once per SRTT (CC-4) */
    c->last_loss_cut = now;
    c->cwnd -= (double)lost_bytes;
    c->loss_cuts++;
    wcc_clamp(c);
}

void mre_wcc_on_rto(struct mre_wcc *c, int64_t now)
{
    (void)now;
    if (!c->enabled)
        return;
    c->cwnd = (double)c->mtu;
    c->rto_resets++;
}

/* ---- DCQCN reaction point (COMPAT-4) ----------------------------------------------------- */

void mre_dcqcn_init(struct mre_dcqcn *d, double line_rate_bps, int enabled, double g,
                    int64_t alpha_timer_ns, int64_t rate_timer_ns, int64_t byte_counter,
                    int32_t fast_steps, double ai_bps, double hai_bps, double min_bps)
{
    d->line = d->rc = d->rt = line_rate_bps;
    d->alpha = 1.0;
    d->g = g;
    d->ai = ai_bps;
    d->hai = hai_bps;
    d->min_rate = min_bps;
    d->alpha_timer = alpha_timer_ns;
    d->rate_timer = rate_timer_ns;
    d->byte_counter = byte_counter;
    d->alpha_t = d->rate_t = -1;
    d->t_count = d->b_count = d->bytes = 0;
    d->fast_steps = fast_steps;
    d->enabled = (uint8_t)enabled;
    d->cnp_since_alpha = 0;
    d->cnps = 0;
}

void mre_dcqcn_on_cnp(struct mre_dcqcn *d, int64_t now)
{
    if (!d->enabled)
        return;
    mre_dcqcn_advance(d, now);
    d->cnps++;
    d->rt = d->rc;
    double cut = d->rc * (1 - d->alpha / 2);
    d->rc = d->min_rate >= cut ? d->min_rate : cut;
    d->alpha = (1 - d->g) * d->alpha + d->g;
    d->cnp_since_alpha = 1;
    d->alpha_t = d->rate_t = now;
    d->t_count = d->b_count = d->bytes = 0;
}

static void dcqcn_increase(struct mre_dcqcn *d, int64_t t, int64_t b)
{
    int64_t f = d->fast_steps;
    int64_t hi = t > b ? t : b, lo = t < b ? t : b;
    if (hi < f) {
        /* fast recovery: towards the target rate */
    } else if (lo > f) {
        double rt = d->rt + d->hai * (double)(lo - f);
        d->rt = d->line <= rt ? d->line : rt;
    } else {
        double rt = d->rt + d->ai;
        d->rt = d->line <= rt ? d->line : rt;
    }
    double rc = (d->rt + d->rc) / 2;
    d->rc = d->line <= rc ? d->line : rc;
}

void mre_dcqcn_advance(struct mre_dcqcn *d, int64_t now)
{
    if (d->alpha_t < 0)
        return;
    while (now - d->alpha_t >= d->alpha_timer) {
        d->alpha_t += d->alpha_timer;
        if (!d->cnp_since_alpha)
            d->alpha *= 1 - d->g;
        d->cnp_since_alpha = 0;
    }
    int steps = 0;
    while (now - d->rate_t >= d->rate_timer && d->rc < d->line && steps < 10000) {
        d->rate_t += d->rate_timer;
        d->t_count++;
        dcqcn_increase(d, d->t_count, d->b_count);
        steps++;
    }
    if (d->rc >= d->line) {
        d->rc = d->rt = d->line;
        d->alpha_t = d->rate_t = -1;     /* at line rate: nothing left to recover */
    }
}

void mre_dcqcn_on_sent(struct mre_dcqcn *d, int64_t nbytes)
{
    if (d->rate_t < 0)
        return;
    d->bytes += nbytes;
    if (d->bytes >= d->byte_counter) {
        d->bytes = 0;
        d->b_count++;
        dcqcn_increase(d, d->t_count, d->b_count);
    }
}

/* ---- pacing (CC-6) ------------------------------------------------------------------------- */

void mre_pacer_sent(struct mre_pacer *p, int64_t now, int64_t nbytes, double rate_bps)
{
    int64_t gap = rate_bps > 0 ? (int64_t)((double)nbytes * 8e9 / rate_bps) : 0;
    int64_t lo = now - p->burst * gap;
    p->next_ns = (p->next_ns >= lo ? p->next_ns : lo) + gap;
}
