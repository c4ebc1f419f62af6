/* Receiver credits (CC-8, CC-9): sender gate, grant state, the receiving NIC's manager.
 * Reference model: metaroce/engine/credits.py. */
#include <stdlib.h>

#include "mre_credit.h"
#include "psn.h"

#define NONE UINT32_MAX

void mre_gate_init(struct mre_credit_gate *g, uint32_t start_psn, uint32_t initial)
{
    g->active = 1;
    g->limit = psn_add(start_psn, initial > 1 ? initial : 1);
    g->has_seq = 0;
    g->seq = 0;
    g->rate_mbps = 0;
    g->last_grant = -1;
    g->blocked_since = -1;
    g->probes = g->grants = 0;
}

int mre_gate_allows(const struct mre_credit_gate *g, uint32_t psn)
{
    return !g->active || psn_diff(psn, g->limit) < 0;
}

int mre_gate_on_grant(struct mre_credit_gate *g, uint32_t seq, int active, uint32_t limit,
                      uint32_t rate, int64_t now)
{
    if (g->has_seq && psn_diff(seq, g->seq) <= 0)
        return 0;                    /* an older grant, reordered */
    g->seq = seq;
    g->has_seq = 1;
    g->active = (uint8_t)(active != 0);
    g->rate_mbps = active ? rate : 0;
    g->last_grant = now;
    if (active)
        g->limit = limit;
    g->grants++;
    return 1;
}

void mre_gate_refresh(struct mre_credit_gate *g, uint32_t limit, int64_t now)
{
    if (g->active && psn_diff(limit, g->limit) > 0) {
        g->limit = limit;
        g->last_grant = now;
    }
}

uint32_t mre_credit_bdp_pkts(const struct mre_credit_mgr *m)
{
    double pkts = m->link_rate_bps * (double)m->base_rtt_ns / 8e9;
    int64_t n = (int64_t)(pkts / m->mtu);    /* int(x // mtu) of a float */
    return n > 1 ? (uint32_t)n : 1;
}

int mre_credit_mgr_init(struct mre_credit_mgr *m, uint32_t nslots, double link_rate_bps,
                        int64_t base_rtt_ns, uint32_t mtu, uint32_t min_senders,
                        int64_t idle_ns, uint32_t initial_pkts, uint32_t liveness_rtos,
                        int pace)
{
    m->link_rate_bps = link_rate_bps;
    m->base_rtt_ns = base_rtt_ns;
    m->idle_ns = idle_ns;
    m->mtu = mtu ? mtu : 4096;
    m->min_senders = min_senders;
    m->initial_pkts = initial_pkts;
    m->liveness_rtos = liveness_rtos;
    m->pace = (uint8_t)pace;
    m->count = 0;
    m->count_at = -1;
    m->max_active = 0;
    m->grants = 0;
    m->head = NONE;
    m->nslots = nslots;
    m->last_seen = malloc(sizeof(*m->last_seen) * nslots);
    m->next = malloc(sizeof(*m->next) * nslots);
    m->listed = calloc(nslots, 1);
    if (!m->last_seen || !m->next || !m->listed) {
        mre_credit_mgr_free(m);
        return -1;
    }
    for (uint32_t i = 0; i < nslots; i++)
        m->last_seen[i] = -1;
    return 0;
}

void mre_credit_mgr_free(struct mre_credit_mgr *m)
{
    free(m->last_seen);
    free(m->next);
    free(m->listed);
    m->last_seen = NULL;
    m->next = NULL;
    m->listed = NULL;
}

void mre_credit_touch(struct mre_credit_mgr *m, uint32_t slot, int64_t now)
{
    if (slot >= m->nslots)
        return;
    if (!m->listed[slot] || now - m->last_seen[slot] >= m->idle_ns)
        m->count_at = -1;            /* a sender (re)joined: recount now */
    if (!m->listed[slot]) {
        m->listed[slot] = 1;
        m->next[slot] = m->head;
        m->head = slot;
    }
    m->last_seen[slot] = now;
}

uint32_t mre_credit_active(struct mre_credit_mgr *m, int64_t now)
{
    if (m->count_at < 0 || now - m->count_at >= m->idle_ns / 8) {
        int64_t horizon = now - m->idle_ns;
        uint32_t n = 0, *link = &m->head;
        while (*link != NONE) {
            uint32_t s = *link;
            if (m->last_seen[s] < horizon) {     /* idle: out of the list */
                *link = m->next[s];
                m->listed[s] = 0;
            } else {
                n++;
                link = &m->next[s];
            }
        }
        m->count = n;
        m->count_at = now;
        if (n > m->max_active)
            m->max_active = n;
    }
    return m->count;
}

int64_t mre_credit_share(struct mre_credit_mgr *m, int64_t now)
{
    uint32_t n = mre_credit_active(m, now);
    if (n < m->min_senders)
        return -1;
    uint32_t bdp = mre_credit_bdp_pkts(m), s = (bdp + n - 1) / n;  /* in flight >= one BDP */
    return s > 1 ? s : 1;
}

uint32_t mre_credit_rate_mbps(struct mre_credit_mgr *m, int64_t now)
{
    if (!m->pace)
        return 0;
    uint32_t n = mre_credit_active(m, now);
    double r = m->link_rate_bps / 1e6 / (n > 1 ? n : 1);
    return r > 1 ? (uint32_t)r : 1;
}
