/* Multipath: spraying (MP-3), per-path feedback and loss attribution (MP-4), eviction with
 * fresh entropy (MP-5). Reference model: metaroce/engine/multipath.py (same rules; the fresh
 * source ports come from this file's own seeded generator, not Python's). */
#include <stdlib.h>

#include "mre.h"
#include "mre_paths.h"

#define SPORT_MIN 0xC000u
#define SPORT_MAX 0xFFFFu

uint16_t mre_flow_label_sport(uint32_t lqpn, uint32_t rqpn)
{
    /* Linux: rdma_calc_flow_label folded by rdma_flow_label_to_udp_sport (COMPAT-5) */
    uint64_t fl = (uint64_t)lqpn * (uint64_t)rqpn;
    fl ^= fl >> 20;
    fl ^= fl >> 40;
    fl &= 0xFFFFF;
    uint64_t low = fl & 0x3FFF, high = fl & 0xFC000;
    return (uint16_t)(((low ^ (high >> 14)) & 0x3FFF) | SPORT_MIN);
}

/* ---- MT19937, seeded and drawn as CPython's random module does ---------------------------- */

static void mt_init(struct mre_entropy *r, uint32_t s)
{
    r->mt[0] = s;
    for (uint32_t i = 1; i < MRE_MT_N; i++)
        r->mt[i] = 1812433253u * (r->mt[i - 1] ^ (r->mt[i - 1] >> 30)) + i;
    r->mti = MRE_MT_N;
}

static void mt_init_by_array(struct mre_entropy *r, const uint32_t *key, uint32_t len)
{
    uint32_t *mt = r->mt, i = 1, j = 0;
    mt_init(r, 19650218u);
    for (uint32_t k = MRE_MT_N > len ? MRE_MT_N : len; k; k--) {
        mt[i] = (mt[i] ^ ((mt[i - 1] ^ (mt[i - 1] >> 30)) * 1664525u)) + key[j] + j;
        i++;
        j++;
        if (i >= MRE_MT_N) {
            mt[0] = mt[MRE_MT_N - 1];
            i = 1;
        }
        if (j >= len)
            j = 0;
    }
    for (uint32_t k = MRE_MT_N - 1; k; k--) {
        mt[i] = (mt[i] ^ ((mt[i - 1] ^ (mt[i - 1] >> 30)) * 1566083941u)) - i;
        i++;
        if (i >= MRE_MT_N) {
            mt[0] = mt[MRE_MT_N - 1];
            i = 1;
        }
    }
    mt[0] = 0x80000000u;
}

static uint32_t mt_next(struct mre_entropy *r)
{
    static const uint32_t mag01[2] = {0, 0x9908b0dfu};
    uint32_t *mt = r->mt, y;
    if (r->mti >= MRE_MT_N) {
        uint32_t k;
        for (k = 0; k < MRE_MT_N - 397; k++) {
            y = (mt[k] & 0x80000000u) | (mt[k + 1] & 0x7fffffffu);
            mt[k] = mt[k + 397] ^ (y >> 1) ^ mag01[y & 1];
        }
        for (; k < MRE_MT_N - 1; k++) {
            y = (mt[k] & 0x80000000u) | (mt[k + 1] & 0x7fffffffu);
            mt[k] = mt[k + (397 - MRE_MT_N)] ^ (y >> 1) ^ mag01[y & 1];
        }
        y = (mt[MRE_MT_N - 1] & 0x80000000u) | (mt[0] & 0x7fffffffu);
        mt[MRE_MT_N - 1] = mt[396] ^ (y >> 1) ^ mag01[y & 1];
        r->mti = 0;
    }
    y = mt[r->mti++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

/* random.randint(SPORT_MIN, SPORT_MAX): _randbelow(16384) by rejection on getrandbits(15) */
static uint16_t random_sport(struct mre_entropy *r)
{
    uint32_t n = SPORT_MAX - SPORT_MIN + 1, v;
    do
        v = mt_next(r) >> (32 - 15);
    while (v >= n);
    return (uint16_t)(SPORT_MIN + v);
}

static void entropy_seed(struct mre_entropy *r, uint64_t seed, uint32_t lqpn, uint32_t rqpn)
{
    /* the integer (seed << 48) ^ (lqpn << 24) ^ rqpn, as 32-bit words, high zeros dropped */
    uint64_t lo = ((seed & 0xFFFF) << 48) ^ ((uint64_t)lqpn << 24) ^ rqpn, hi = seed >> 16;
    uint32_t key[4] = {(uint32_t)lo, (uint32_t)(lo >> 32), (uint32_t)hi, (uint32_t)(hi >> 32)};
    uint32_t len = 4;
    while (len > 1 && key[len - 1] == 0)
        len--;
    mt_init_by_array(r, key, len);
}

static void path_reset(struct mre_path *p, uint16_t sport, double weight)
{
    p->weight = weight;
    p->current = 0.0;
    p->ecn_frac = 0.0;
    p->srtt = -1;
    p->sent = p->acked = p->lost = p->rtos = p->ecn = p->ecn_samples = 0;
    p->evidence = -1;
    p->born = -1;
    p->nloss = 0;
    p->evictions = 0;
    p->sport = sport;
}

static uint16_t fresh_port(struct mre_pathset *s, int64_t now, uint32_t live)
{
    struct mre_entropy *r = s->ent;
    for (;;) {
        uint16_t port = random_sport(r);
        int bad = 0;
        for (uint32_t k = 0; k < live && !bad; k++)
            bad = s->p[k].sport == port;
        uint32_t kept = r->nretired < MRE_RETIRED_PORTS ? r->nretired : MRE_RETIRED_PORTS;
        for (uint32_t i = 0; i < kept && !bad; i++)   /* the latest retirement of the port */
            if (r->retired_port[(r->nretired - 1 - i) % MRE_RETIRED_PORTS] == port) {
                bad = now - r->retired_at[(r->nretired - 1 - i) % MRE_RETIRED_PORTS] <
                      s->reuse_holdoff_ns;
                break;
            }
        if (!bad)
            return port;
    }
}

void mre_paths_free(struct mre_pathset *s)
{
    free(s->p);
    free(s->ent);
    s->p = NULL;
    s->ent = NULL;
    s->n = 0;
}

int mre_paths_init(struct mre_pathset *s, uint32_t n, uint32_t lqpn, uint32_t rqpn,
                   uint64_t seed)
{
    if (n < 1)
        n = 1;
    if (n > MRE_MAX_PATHS)
        n = MRE_MAX_PATHS;
    mre_paths_free(s);
    s->p = calloc(n, sizeof(*s->p));
    s->ent = n > 1 ? calloc(1, sizeof(*s->ent)) : NULL;
    if (!s->p || (n > 1 && !s->ent)) {
        mre_paths_free(s);
        return -1;
    }
    if (s->ent)
        entropy_seed(s->ent, seed, lqpn, rqpn);
    s->n = n;
    s->evictions = 0;
    s->loss_evict = 2;
    s->loss_window_srtt = 8.0;
    s->ecn_evict_frac = 0.5;
    s->ecn_others_below = 0.25;
    s->ecn_gain = 1.0 / 16;
    s->ecn_min_samples = 16;
    s->weight_cut = 0.5;
    s->weight_min = 0.05;
    s->weight_regain = 1.0 / 32;
    s->reuse_holdoff_ns = 1000000000;
    path_reset(&s->p[0], mre_flow_label_sport(lqpn, rqpn), 1.0);
    for (uint32_t k = 1; k < n; k++)
        path_reset(&s->p[k], fresh_port(s, 0, k), 1.0);
    return 0;
}

uint32_t mre_paths_pick(struct mre_pathset *s, int avoid)
{
    if (s->n == 1) {
        s->p[0].sent++;
        return 0;
    }
    double total = 0.0, bw = -1e18;
    int best = -1;
    for (uint32_t k = 0; k < s->n; k++) {
        struct mre_path *p = &s->p[k];
        p->current += p->weight;
        total += p->weight;
        if ((int)k != avoid && p->current > bw) {
            best = (int)k;
            bw = p->current;
        }
    }
    s->p[best].current -= total;
    s->p[best].sent++;
    return (uint32_t)best;
}

void mre_paths_on_ack(struct mre_pathset *s, uint32_t k, int64_t rtt, int ecn, int64_t now)
{
    if (k >= s->n)
        return;
    struct mre_path *p = &s->p[k];
    p->acked++;
    if (rtt >= 0)
        p->srtt = p->srtt < 0 ? (double)rtt : 0.875 * p->srtt + 0.125 * (double)rtt;
    p->ecn += ecn ? 1 : 0;
    p->ecn_samples++;
    p->ecn_frac += s->ecn_gain * ((ecn ? 1.0 : 0.0) - p->ecn_frac);
    if (!ecn) {
        double w = p->weight + s->weight_regain * (1.0 - p->weight);
        p->weight = 1.0 <= w ? 1.0 : w;
    } else if (s->n > 1 && p->ecn_samples >= s->ecn_min_samples &&
               p->ecn_frac > s->ecn_evict_frac) {
        for (uint32_t j = 0; j < s->n; j++)
            if (j != k && !(s->p[j].ecn_frac < s->ecn_others_below))
                return;
        mre_paths_evict(s, k, now);
    }
}

void mre_paths_congested(struct mre_pathset *s, uint32_t k)
{
    if (k >= s->n)
        return;
    struct mre_path *p = &s->p[k];
    double w = p->weight * s->weight_cut;
    p->weight = s->weight_min >= w ? s->weight_min : w;
}

int mre_paths_on_loss(struct mre_pathset *s, uint32_t k, int64_t now, double srtt)
{
    if (k >= s->n)
        return 0;
    struct mre_path *p = &s->p[k];
    p->lost++;
    double w = p->weight * s->weight_cut;
    p->weight = s->weight_min >= w ? s->weight_min : w;
    double horizon = (double)now - s->loss_window_srtt * (srtt >= 1.0 ? srtt : 1.0);
    uint32_t keep = 0;                 /* times are in order: drop the prefix that is too old */
    for (uint32_t i = 0; i < p->nloss; i++)
        if ((double)p->loss_times[i] >= horizon)
            p->loss_times[keep++] = p->loss_times[i];
    if (keep == MRE_PATH_LOSS_HIST) {  /* only "at least loss_evict" matters */
        for (uint32_t i = 1; i < keep; i++)
            p->loss_times[i - 1] = p->loss_times[i];
        keep--;
    }
    p->loss_times[keep++] = now;
    p->nloss = keep;
    if (s->n > 1 && p->nloss >= s->loss_evict) {
        mre_paths_evict(s, k, now);
        return 1;
    }
    return 0;
}

void mre_paths_on_rto(struct mre_pathset *s, uint32_t k, int64_t now)
{
    if (k >= s->n)
        return;
    s->p[k].rtos++;
    if (s->n > 1)
        mre_paths_evict(s, k, now);
}

void mre_paths_evict(struct mre_pathset *s, uint32_t k, int64_t now)
{
    struct mre_path old = s->p[k];
    if (!s->ent)
        return;                        /* one path: nowhere else to go */
    s->ent->retired_port[s->ent->nretired % MRE_RETIRED_PORTS] = old.sport;
    s->ent->retired_at[s->ent->nretired % MRE_RETIRED_PORTS] = now;
    s->ent->nretired++;
    /* the new port must differ from every live port, the evicted one included */
    uint16_t port = fresh_port(s, now, s->n);
    struct mre_path *p = &s->p[k];
    path_reset(p, port, 1.0 / s->n);
    p->evictions = old.evictions + 1;
    p->sent = old.sent;
    p->acked = old.acked;
    p->lost = old.lost;
    p->rtos = old.rtos;
    p->ecn = old.ecn;
    s->evictions++;
}
