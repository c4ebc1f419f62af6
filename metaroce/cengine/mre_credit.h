/* Receiver credits for last-hop incast (CC-8, CC-9), clock-free (credit.c): the sender's gate,
 * the responder's per-QP grant state and the receiving NIC's manager (who is active, what
 * each active sender's share is). Part of the cffi interface for the unit tests. */
#ifndef METAROCE_MRE_CREDIT_H
#define METAROCE_MRE_CREDIT_H

#include <stdint.h>

/* Requester side of one QP: no new PSN at or beyond limit while active. */
struct mre_credit_gate {
    uint32_t limit;
    uint32_t seq;
    uint32_t rate_mbps;
    uint8_t active;
    uint8_t has_seq;
    int64_t last_grant;        /* -1: never */
    int64_t blocked_since;     /* -1: not blocked */
    uint64_t probes, grants;
};

void mre_gate_init(struct mre_credit_gate *g, uint32_t start_psn, uint32_t initial);
int mre_gate_allows(const struct mre_credit_gate *g, uint32_t psn);
/* An MR_CREDIT (stale ones ignored); 1 when applied. */
int mre_gate_on_grant(struct mre_credit_gate *g, uint32_t seq, int active, uint32_t limit,
                      uint32_t rate, int64_t now);
/* SACK flag C: a newer limit while in credit mode (limits only move forward). */
void mre_gate_refresh(struct mre_credit_gate *g, uint32_t limit, int64_t now);

/* Responder side of one QP: what it last granted. */
struct mre_grant_state {
    uint8_t announced;
    uint8_t active;
    uint32_t limit;
    uint32_t seq;
    int64_t resent_at;         /* -1: never */
};

/* Per receiving NIC: senders active in the last idle_ns, and each one's share. */
struct mre_credit_mgr {
    double link_rate_bps;
    int64_t base_rtt_ns;
    int64_t idle_ns;
    uint32_t mtu;
    uint32_t min_senders;
    uint32_t initial_pkts;
    uint32_t liveness_rtos;
    uint8_t pace;
    uint32_t count;
    int64_t count_at;          /* -1: recount at the next query */
    uint32_t max_active;
    uint32_t grants;
    /* the QPs that delivered recently: a list through their last_seen slots */
    int64_t *last_seen;        /* per QP handle, -1: never */
    uint32_t *next;            /* per QP handle: the next in the seen list */
    uint8_t *listed;
    uint32_t head;             /* UINT32_MAX: empty */
    uint32_t nslots;
};

uint32_t mre_credit_bdp_pkts(const struct mre_credit_mgr *m);
int mre_credit_mgr_init(struct mre_credit_mgr *m, uint32_t nslots, double link_rate_bps,
                        int64_t base_rtt_ns, uint32_t mtu, uint32_t min_senders,
                        int64_t idle_ns, uint32_t initial_pkts, uint32_t liveness_rtos,
                        int pace);
void mre_credit_mgr_free(struct mre_credit_mgr *m);
void mre_credit_touch(struct mre_credit_mgr *m, uint32_t slot, int64_t now);
uint32_t mre_credit_active(struct mre_credit_mgr *m, int64_t now);
/* Packets each active sender may have beyond its cumulative PSN, max(1, ceil(BDP / active));
 * -1: no incast. */
int64_t mre_credit_share(struct mre_credit_mgr *m, int64_t now);
uint32_t mre_credit_rate_mbps(struct mre_credit_mgr *m, int64_t now);

#endif
