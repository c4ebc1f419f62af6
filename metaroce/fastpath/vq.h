/* Verbs queues in shared memory: the small C layer an application and its device's daemon use
 * to post to, poll and drain the rings whose layout bpf/nic/nic_vq.h defines (a send queue and
 * a receive queue per QP, a completion queue per CQ).
 *
 * The daemon creates each ring and hands its fd to the owning application over the control
 * socket (SCM_RIGHTS): the SQ and the CQ in memfds sealed against shrinking, the RQ in an
 * mmap-able BPF array map, because the NIC's XDP program takes receive WQEs from it directly
 * (as a NIC reads a posted receive from host memory). Indices are free-running 32-bit
 * counters; slot = index & (entries - 1), entries a power of two.
 *
 *   SQ: the application produces (prod), the daemon consumes: it copies a WQE out before it
 *       looks at it, and publishes cons when it releases slots, when their work requests
 *       complete (so prod - cons is what is outstanding, at most max_wr).
 *   RQ: the application produces, the XDP program reads the slots in place (copied to its
 *       stack, then checked); the daemon publishes cons as receives complete.
 *   CQ: the daemon produces CQEs, the application consumes (cons = what it has polled).
 *
 * Flags: dflags is written by the daemon only (NEED_WAKEUP: it sleeps, ring the doorbell;
 * ERR: the QP is in ERR / the CQ overran); arm_sn and arm_solicited are written by the
 * application only (req_notify_cq), notify_sn by the daemon (arm requests it answered with an
 * event). No word is written by both sides.
 *
 * Wake-ups (AF_XDP's need_wakeup pattern): the application publishes prod, fences, reads
 * dflags and writes the doorbell eventfd only if NEED_WAKEUP is set; the daemon sets
 * NEED_WAKEUP, fences and checks every ring again before it sleeps. Completion events:
 * the application stores arm_sn, fences and polls; the daemon publishes prod, fences and reads
 * arm_sn. Either way at least one side sees the other's store.
 *
 * Built with cffi by the setup step (constants are enums: cffi reads these files). */
#ifndef METAROCE_VQ_H
#define METAROCE_VQ_H

#include "nic_vq.h"

struct mr_evring;
struct mr_roce_msg;

/* One process's private view of a ring (never in shared memory: everything here is the
 * viewer's own copy, so nothing the other side writes can change a bound). */
struct mr_vq {
    struct mr_vq_hdr *hdr;               /* shared */
    uint8_t *slots;                      /* shared: entries * stride bytes */
    uint32_t entries;
    uint32_t stride;
    uint32_t max_wr;
    uint32_t head;                       /* producer: next index to fill; consumer: next to take */
    uint32_t tail;                       /* daemon SQ/RQ: slots released (its published cons) */
    uint32_t notified;                   /* daemon CQ: the arm_sn last answered with an event */
    uint32_t arm;                        /* application CQ: arm requests made */
    uint32_t paused;                     /* daemon SQ/RQ: not drained for now (QP not ready) */
    int fd;                              /* application SQ/RQ: the doorbell; daemon CQ: the
                                          * completion channel's eventfd; -1: none */
    uint32_t pad;
    uint64_t doorbells;                  /* application: doorbells rung; daemon CQ: events */
};

/* ---- both sides ---------------------------------------------------------------------------- */

/* The daemon: write the header of a new ring at base (entries a power of two) and set up its
 * view. Returns 0, or -EINVAL for a bad geometry. */
int mr_vq_create(struct mr_vq *q, void *base, uint32_t kind, uint32_t entries, uint32_t stride,
                 uint32_t max_wr, uint32_t max_sge, uint32_t max_inline, uint32_t id, int fd);

/* The application: check the header at base against what the daemon announced and set up its
 * view. Returns 0, or -EINVAL when they disagree. */
int mr_vq_attach(struct mr_vq *q, void *base, uint32_t kind, uint32_t entries, uint32_t stride,
                 int fd);

/* The daemon's flags word (acquire). */
uint32_t mr_vq_flags(const struct mr_vq *q);

/* ---- the application ------------------------------------------------------------------------ */

/* Copy n WQEs (n * stride bytes at wqes, each laid out as its slot) into the ring, publish
 * them (release) and ring the doorbell if the daemon sleeps. All or nothing: returns 0,
 * -ENOSPC when more than max_wr would be outstanding, -EPIPE when the QP is in ERR. */
int mr_vq_post(struct mr_vq *q, const uint8_t *wqes, uint32_t n);

/* Take up to max CQEs into out (max * sizeof(struct mr_cqe) bytes); returns how many. */
uint32_t mr_vq_poll(struct mr_vq *q, uint8_t *out, uint32_t max);

/* CQEs waiting (after a full fence: call it after mr_vq_arm). */
uint32_t mr_vq_ready(struct mr_vq *q);

/* req_notify_cq: an event on the next completion (solicited_only: the next solicited or
 * error completion). Returns the CQEs already waiting (they raise no event: poll them). */
uint32_t mr_vq_arm(struct mr_vq *q, int solicited_only);

/* The arm requests the daemon has answered with an event (which CQ of a channel fired). */
uint32_t mr_vq_notified(const struct mr_vq *q);

/* ---- the daemon ----------------------------------------------------------------------------- */

/* SQ/RQ: copy up to max new WQEs into out (max * stride bytes), never more than keep
 * outstanding within max_wr. Returns how many, or -1 when the producer index is impossible
 * (more than entries ahead of the released slots: the QP is to go to ERR). */
int mr_vq_fetch(struct mr_vq *q, uint8_t *out, uint32_t max);

/* SQ/RQ: of the WQEs fetched, this many are outstanding now: release (publish cons for) the
 * others. */
void mr_vq_settle(struct mr_vq *q, uint32_t outstanding);

/* RQ: the receives before cons have completed: publish cons (and fetch from there). */
void mr_vq_consume_to(struct mr_vq *q, uint32_t cons);

/* Set and clear bits of the daemon's flags word. */
void mr_vq_set_flags(struct mr_vq *q, uint32_t set, uint32_t clear);

/* SQ: the message fields of a send WQE slot (copied out, and checked by the rules first):
 * kind and with_imm (MR_MSG_*), its length, the QP's path MTU; the rest from the slot. */
void mr_wqe_msg(const uint8_t *slot, uint32_t kind, uint32_t with_imm, uint64_t len,
                uint32_t pmtu, struct mr_roce_msg *m);

/* CQ: the application's consumer index as it is now (raw: the caller checks it). */
uint32_t mr_vq_consumer(const struct mr_vq *q);

/* CQ: write the next CQE (32 bytes); it becomes visible at mr_vq_publish. */
void mr_vq_put(struct mr_vq *q, const uint8_t *cqe);

/* CQ: publish what was put (release), fence, and signal the channel if the application armed
 * the CQ (a solicited-only arm needs eligible != 0: a solicited or error CQE among them).
 * Returns 1 if an event was signalled. */
int mr_vq_publish(struct mr_vq *q, int eligible);

/* Of the n rings, the indexes (into qs) of those with WQEs to fetch (not paused, room within
 * max_wr); returns how many (at most max_out). */
uint32_t mr_vqs_pending(struct mr_vq *const *qs, uint32_t n, uint32_t *out, uint32_t max_out);

/* Before sleeping: set NEED_WAKEUP on every ring, fence, and count the rings with work after
 * all (if any, call mr_vqs_wake and do not sleep). */
uint32_t mr_vqs_sleep(struct mr_vq *const *qs, uint32_t n);

/* After waking: clear NEED_WAKEUP on every ring. */
void mr_vqs_wake(struct mr_vq *const *qs, uint32_t n);

/* Busy-poll: spin (yielding the CPU every few hundred checks) until a ring has WQEs, the NIC's
 * event ring (ev, may be NULL) has events, or CLOCK_MONOTONIC passes until_ns. Returns 1 when
 * there is work, 0 at the deadline. */
int mr_vqs_spin(struct mr_vq *const *qs, uint32_t n, struct mr_evring *ev, uint64_t until_ns);

#endif
