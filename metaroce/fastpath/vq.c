/* Verbs queues in shared memory: see vq.h for the layout and the protocol. */
#include <errno.h>
#include <sched.h>
#include <stddef.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "events.h"
#include "roce_tx.h"
#include "vq.h"

_Static_assert(sizeof(struct mr_vq_hdr) == 320, "ring header: five cache lines");
_Static_assert(offsetof(struct mr_vq_hdr, prod) == 64, "prod on its own line");
_Static_assert(offsetof(struct mr_vq_hdr, cons) == 128, "cons on its own line");
_Static_assert(offsetof(struct mr_vq_hdr, dflags) == 192, "daemon flags on their own line");
_Static_assert(offsetof(struct mr_vq_hdr, arm_sn) == 256, "application's arm on its own line");
_Static_assert(sizeof(struct mr_vq_hdr) <= MR_VQ_HDR_SIZE, "header fits");
_Static_assert(sizeof(struct mr_send_wqe) == MR_WQE_DATA, "send WQE header");
_Static_assert(sizeof(struct mr_recv_wqe) == MR_RECV_WQE_DATA, "receive WQE header");
_Static_assert(sizeof(struct mr_sge) == 16, "SGE");
_Static_assert(sizeof(struct mr_cqe) == 32, "CQE");
_Static_assert(sizeof(struct mr_rq_slot) == MR_RQ_STRIDE, "RQ slot");
_Static_assert(MR_VQ_HDR_SLOTS * MR_RQ_STRIDE == MR_VQ_HDR_SIZE, "RQ header slots");
_Static_assert(MR_VQ_PROD_SLOT * MR_RQ_STRIDE == offsetof(struct mr_vq_hdr, prod), "RQ prod");
_Static_assert(MR_VQ_CONS_SLOT * MR_RQ_STRIDE == offsetof(struct mr_vq_hdr, cons), "RQ cons");

#define LOAD_ACQ(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define STORE_REL(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define LOAD_RLX(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define STORE_RLX(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)
#define FENCE() __atomic_thread_fence(__ATOMIC_SEQ_CST)

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

/* checks of the rings between yields of the CPU while spinning (see mr_vqs_spin) */
static const unsigned spin_yield_every = 32;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int pow2(uint32_t v)
{
    return v && !(v & (v - 1));
}

static void view(struct mr_vq *q, void *base, uint32_t entries, uint32_t stride, uint32_t max_wr,
                 int fd)
{
    memset(q, 0, sizeof(*q));
    q->hdr = base;
    q->slots = (uint8_t *)base + MR_VQ_HDR_SIZE;
    q->entries = entries;
    q->stride = stride;
    q->max_wr = max_wr;
    q->fd = fd;
}

static void ring_doorbell(int fd)
{
    uint64_t one = 1;
    /* EAGAIN (the counter is saturated) means a wake-up is pending anyway */
    if (write(fd, &one, sizeof(one)) < 0) {
    }
}

int mr_vq_create(struct mr_vq *q, void *base, uint32_t kind, uint32_t entries, uint32_t stride,
                 uint32_t max_wr, uint32_t max_sge, uint32_t max_inline, uint32_t id, int fd)
{
    if (!pow2(entries) || stride < 16 || stride % 16 || max_wr > entries ||
        (kind != MR_VQ_SQ && kind != MR_VQ_RQ && kind != MR_VQ_CQ))
        return -EINVAL;
    struct mr_vq_hdr *h = base;
    memset(h, 0, MR_VQ_HDR_SIZE);
    h->magic = MR_VQ_MAGIC;
    h->version = MR_VQ_VERSION;
    h->kind = kind;
    h->entries = entries;
    h->stride = stride;
    h->max_wr = max_wr;
    h->max_sge = max_sge;
    h->max_inline = max_inline;
    h->id = id;
    view(q, base, entries, stride, kind == MR_VQ_CQ ? entries : max_wr, fd);
    FENCE();
    return 0;
}

int mr_vq_attach(struct mr_vq *q, void *base, uint32_t kind, uint32_t entries, uint32_t stride,
                 int fd)
{
    const struct mr_vq_hdr *h = base;
    if (h->magic != MR_VQ_MAGIC || h->version != MR_VQ_VERSION || h->kind != kind ||
        h->entries != entries || h->stride != stride || !pow2(entries) || h->max_wr > entries)
        return -EINVAL;
    view(q, base, entries, stride, kind == MR_VQ_CQ ? entries : h->max_wr, fd);
    if (kind == MR_VQ_CQ) {
        q->head = LOAD_ACQ(&q->hdr->cons);
        q->arm = LOAD_RLX(&q->hdr->arm_sn);
    } else {
        q->head = LOAD_ACQ(&q->hdr->prod);
    }
    return 0;
}

uint32_t mr_vq_flags(const struct mr_vq *q)
{
    return LOAD_ACQ(&q->hdr->dflags);
}

/* ---- the application ---------------------------------------------------------------------- */

int mr_vq_post(struct mr_vq *q, const uint8_t *wqes, uint32_t n)
{
    if (LOAD_ACQ(&q->hdr->dflags) & MR_VQ_ERR)
        return -EPIPE;
    uint32_t outstanding = q->head - LOAD_ACQ(&q->hdr->cons);
    if (outstanding > q->max_wr || n > q->max_wr - outstanding)
        return -ENOSPC;
    uint32_t mask = q->entries - 1;
    for (uint32_t i = 0; i < n; i++)
        memcpy(q->slots + (size_t)((q->head + i) & mask) * q->stride,
               wqes + (size_t)i * q->stride, q->stride);
    q->head += n;
    STORE_REL(&q->hdr->prod, q->head);
    FENCE();                           /* prod before the flag: pairs with mr_vqs_sleep */
    if (q->fd >= 0 && (LOAD_RLX(&q->hdr->dflags) & MR_VQ_NEED_WAKEUP)) {
        ring_doorbell(q->fd);
        q->doorbells++;
    }
    return 0;
}

uint32_t mr_vq_poll(struct mr_vq *q, uint8_t *out, uint32_t max)
{
    uint32_t avail = LOAD_ACQ(&q->hdr->prod) - q->head;
    if (avail > q->entries)
        avail = q->entries;            /* never more than the ring holds */
    uint32_t n = avail < max ? avail : max;
    uint32_t mask = q->entries - 1;
    for (uint32_t i = 0; i < n; i++)
        memcpy(out + (size_t)i * sizeof(struct mr_cqe),
               q->slots + (size_t)((q->head + i) & mask) * q->stride, sizeof(struct mr_cqe));
    if (n) {
        q->head += n;
        STORE_REL(&q->hdr->cons, q->head);
    }
    return n;
}

uint32_t mr_vq_ready(struct mr_vq *q)
{
    FENCE();
    uint32_t avail = LOAD_ACQ(&q->hdr->prod) - q->head;
    return avail > q->entries ? q->entries : avail;
}

uint32_t mr_vq_arm(struct mr_vq *q, int solicited_only)
{
    STORE_RLX(&q->hdr->arm_solicited, solicited_only ? 1u : 0u);
    STORE_REL(&q->hdr->arm_sn, ++q->arm);
    return mr_vq_ready(q);             /* the fence: arm before prod, pairs with publish */
}

uint32_t mr_vq_notified(const struct mr_vq *q)
{
    return LOAD_ACQ(&q->hdr->notify_sn);
}

/* ---- the daemon --------------------------------------------------------------------------- */

int mr_vq_fetch(struct mr_vq *q, uint8_t *out, uint32_t max)
{
    uint32_t prod = LOAD_ACQ(&q->hdr->prod);
    uint32_t posted = prod - q->tail;            /* everything not released */
    uint32_t fetched = q->head - q->tail;
    if (posted > q->entries || posted < fetched)
        return -1;                               /* beyond the ring, or behind what we took */
    uint32_t room = q->max_wr > fetched ? q->max_wr - fetched : 0;
    uint32_t n = posted - fetched;
    if (n > room)
        n = room;
    if (n > max)
        n = max;
    uint32_t mask = q->entries - 1;
    for (uint32_t i = 0; i < n; i++)             /* copied out before anyone looks at it */
        memcpy(out + (size_t)i * q->stride,
               q->slots + (size_t)((q->head + i) & mask) * q->stride, q->stride);
    q->head += n;
    return (int)n;
}

void mr_vq_settle(struct mr_vq *q, uint32_t outstanding)
{
    uint32_t fetched = q->head - q->tail;
    if (outstanding > fetched)
        outstanding = fetched;
    uint32_t tail = q->head - outstanding;
    if (tail != q->tail) {
        q->tail = tail;
        STORE_REL(&q->hdr->cons, tail);
    }
}

void mr_vq_consume_to(struct mr_vq *q, uint32_t cons)
{
    q->head = q->tail = cons;
    STORE_REL(&q->hdr->cons, cons);
}

void mr_vq_set_flags(struct mr_vq *q, uint32_t set, uint32_t clear)
{
    uint32_t f = LOAD_RLX(&q->hdr->dflags);
    STORE_REL(&q->hdr->dflags, (f | set) & ~clear);
}

void mr_wqe_msg(const uint8_t *slot, uint32_t kind, uint32_t with_imm, uint64_t len,
                uint32_t pmtu, struct mr_roce_msg *m)
{
    const struct mr_send_wqe *w = (const void *)slot;
    memset(m, 0, sizeof(*m));
    m->kind = (uint8_t)kind;
    m->with_imm = (uint8_t)with_imm;
    m->solicited = !!(w->send_flags & MR_SEND_SOLICITED);
    m->imm = w->imm_data;
    m->pmtu = pmtu;
    m->len = len;
    if (kind != MR_MSG_SEND) {
        m->va = w->remote_addr;
        m->rkey = w->rkey;
    }
    if (kind == MR_MSG_FETCH_ADD) {
        m->swap_add = w->compare_add;
    } else if (kind == MR_MSG_CMP_SWAP) {
        m->compare = w->compare_add;
        m->swap_add = w->swap;
    }
}

uint32_t mr_vq_consumer(const struct mr_vq *q)
{
    return LOAD_ACQ(&q->hdr->cons);
}

void mr_vq_put(struct mr_vq *q, const uint8_t *cqe)
{
    memcpy(q->slots + (size_t)(q->head & (q->entries - 1)) * q->stride, cqe,
           sizeof(struct mr_cqe));
    q->head++;
}

int mr_vq_publish(struct mr_vq *q, int eligible)
{
    STORE_REL(&q->hdr->prod, q->head);
    FENCE();                           /* prod before the arm: pairs with mr_vq_arm */
    uint32_t sn = LOAD_ACQ(&q->hdr->arm_sn);
    if (sn == q->notified)
        return 0;
    if (LOAD_RLX(&q->hdr->arm_solicited) && !eligible)
        return 0;
    q->notified = sn;
    STORE_REL(&q->hdr->notify_sn, sn);
    if (q->fd >= 0)
        ring_doorbell(q->fd);
    q->doorbells++;
    return 1;
}

static inline int has_work(const struct mr_vq *q)
{
    if (q->paused || q->head - q->tail >= q->max_wr)
        return 0;
    return LOAD_ACQ(&q->hdr->prod) != q->head;
}

uint32_t mr_vqs_pending(struct mr_vq *const *qs, uint32_t n, uint32_t *out, uint32_t max_out)
{
    uint32_t k = 0;
    for (uint32_t i = 0; i < n && k < max_out; i++)
        if (has_work(qs[i]))
            out[k++] = i;
    return k;
}

uint32_t mr_vqs_sleep(struct mr_vq *const *qs, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        mr_vq_set_flags(qs[i], MR_VQ_NEED_WAKEUP, 0);
    FENCE();                           /* the flag before prod: pairs with mr_vq_post */
    uint32_t k = 0;
    for (uint32_t i = 0; i < n; i++)
        k += has_work(qs[i]);
    return k;
}

void mr_vqs_wake(struct mr_vq *const *qs, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        mr_vq_set_flags(qs[i], 0, MR_VQ_NEED_WAKEUP);
}

int mr_vqs_spin(struct mr_vq *const *qs, uint32_t n, struct mr_evring *ev, uint64_t until_ns)
{
    unsigned spins = 0;
    for (;;) {
        for (uint32_t i = 0; i < n; i++)
            if (has_work(qs[i]))
                return 1;
        if (ev && mr_evring_pending(ev))
            return 1;
        cpu_relax();
        if (++spins % spin_yield_every == 0) {
            if (now_ns() >= until_ns)
                return 0;
            /* the application (or the peer's daemon) may need this CPU: a pure spin starves
             * it until the scheduler's tick on a 2-vCPU machine, and the scheduler hands a
             * yielding spinner's CPU to the other runnable one, so how often we yield is how
             * long a posting application on this CPU may wait for it */
            sched_yield();
        }
    }
}
