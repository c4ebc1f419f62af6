/* The data path thread: its lifetime, the lock the control plane shares with it, and its loop
 * (rounds while there is work, a bounded busy-poll after the last work, then sleep in epoll on
 * the NIC's event ring, the applications' doorbells and the next timer). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "dp_int.h"

int64_t dp_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The control plane's side of the lock: the thread, between two rounds, lets a waiting control
 * call in before it takes the lock again (a mutex alone would let it re-take at once). */
void dp_lock(struct mr_dp *d)
{
    __atomic_add_fetch(&d->ctl_waiting, 1, __ATOMIC_ACQ_REL);
    pthread_mutex_lock(&d->lock);
}

void dp_unlock(struct mr_dp *d)
{
    pthread_mutex_unlock(&d->lock);
    __atomic_sub_fetch(&d->ctl_waiting, 1, __ATOMIC_ACQ_REL);
}

static void wake(struct mr_dp *d)
{
    uint64_t one = 1;
    if (write(d->wake_fd, &one, sizeof(one)) < 0) {
    }
}

static uint32_t pow2(uint32_t n)
{
    uint32_t p = 1;
    while (p < n)
        p <<= 1;
    return p;
}

static int64_t mini(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

/* ---- one round --------------------------------------------------------------------------- */

/* After the calls of a round: QPs the engine moved to ERR get their side effects (rings,
 * kernel, receive flush), their completions are delivered, timers and ring slots follow. A
 * flush can overrun a CQ, which fails more QPs: repeat until nothing changes. */
static int finish(struct mr_dp *d, int64_t now)
{
    int work = 0, changed;
    do {
        changed = 0;
        work += dp_deliver(d);
        for (uint32_t i = d->touched; i != DP_NONE; i = d->qps[i].next_touched) {
            struct dp_qp *q = &d->qps[i];
            if (!q->err && q->eh != DP_NONE && mre_qp_state(d->e, q->eh) == MRE_ERR) {
                dp_qp_to_err(d, q, NULL);
                changed = 1;
            }
        }
    } while (changed);
    dp_settle(d);
    for (uint32_t i = d->touched; i != DP_NONE;) {
        struct dp_qp *q = &d->qps[i];
        i = q->next_touched;
        q->touched = 0;
        q->next_touched = DP_NONE;
        if (q->eh != DP_NONE)
            dp_timer_set(d, q, mre_qp_deadline(d->e, q->eh));
    }
    d->touched = DP_NONE;
    dp_publish(d);
    (void)now;
    return work;
}

static int round_once(struct mr_dp *d, int64_t now)
{
    int work = 0;
    if (d->scan_stale)
        dp_scan_rebuild(d);
    int64_t t[6];
    t[0] = now;
    work += dp_drain_events(d, now);
    t[1] = dp_now();
    work += dp_drain_rings(d, t[1]);
    t[2] = dp_now();
    work += dp_run_timers(d, t[2]);
    t[3] = dp_now();
    work += dp_transmit(d, t[3]);
    t[4] = dp_now();
    work += finish(d, t[4]);
    if (work) {                         /* each phase's share of the rounds that did work */
        t[5] = dp_now();
        d->st.ns_events += (uint64_t)(t[1] - t[0]);
        d->st.ns_rings += (uint64_t)(t[2] - t[1]);
        d->st.ns_timers += (uint64_t)(t[3] - t[2]);
        d->st.ns_tx += (uint64_t)(t[4] - t[3]);
        d->st.ns_finish += (uint64_t)(t[5] - t[4]);
    }
    return work;
}

static int tx_in_flight(struct mr_dp *d)
{
    return mr_xsk_poll_tx(d->xsk) != 0;
}

/* Spin (under the lock) until a ring or the event ring has work, a control call waits, or
 * until_ns; returns 1 when there is work. */
static int spin(struct mr_dp *d, int64_t until_ns)
{
    unsigned n = 0;
    for (;;) {
        uint32_t k;
        if (d->nscan && mr_vqs_pending(d->scan, d->nscan, &k, 1))
            return 1;
        if (mr_evring_pending(d->ev))
            return 1;
        if (__atomic_load_n(&d->ctl_waiting, __ATOMIC_ACQUIRE))
            return 0;
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
        if (++n % 32 == 0) {
            if (dp_now() >= until_ns)
                return 0;
            /* another runnable thread (the application, the peer's daemon) may need this
             * CPU on a 2-vCPU machine: yielding is how long it waits for it */
            pthread_mutex_unlock(&d->lock);
            sched_yield();
            pthread_mutex_lock(&d->lock);
            if (d->stop || d->scan_stale)
                return 1;
        }
    }
}

static void after_sleep(struct mr_dp *d, int64_t slept, int work)
{
    if (d->fixed_poll)
        return;
    if (work && slept < DP_POLL_HIGH_NS) {
        int64_t b = d->poll_ns * 2;
        d->poll_ns = b < DP_POLL_LOW_NS ? DP_POLL_LOW_NS : b > DP_POLL_HIGH_NS ? DP_POLL_HIGH_NS : b;
    } else if (slept >= DP_POLL_HIGH_NS) {
        int64_t b = d->poll_ns / 2;
        d->poll_ns = b < DP_POLL_LOW_NS ? DP_POLL_LOW_NS : b;
    }
}

static void drain_fd(int fd)
{
    uint64_t v;
    if (read(fd, &v, sizeof(v)) < 0) {
    }
}

static void *dp_main(void *arg)
{
    struct mr_dp *d = arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);    /* signals are the control plane's */
    pthread_setname_np(pthread_self(), "metaroce-dp");
    int64_t last_work = dp_now(), woke_after = -1;
    struct epoll_event evs[32];
    pthread_mutex_lock(&d->lock);
    while (!d->stop) {
        int64_t t0 = dp_now();
        int work = round_once(d, t0);
        int64_t t1 = dp_now();
        if (woke_after >= 0) {
            after_sleep(d, woke_after, work);
            woke_after = -1;
        }
        if (d->scan_stale)
            dp_scan_rebuild(d);
        if (work) {
            d->st.rounds++;
            d->st.busy_ns += (uint64_t)(t1 - t0);
            last_work = t1;
        }
        if (work || tx_in_flight(d)) {
            pthread_mutex_unlock(&d->lock);
            while (__atomic_load_n(&d->ctl_waiting, __ATOMIC_ACQUIRE))
                sched_yield();
            pthread_mutex_lock(&d->lock);
            continue;
        }
        int64_t next = dp_next_deadline(d);
        if (next >= 0 && next <= t1)
            continue;
        if (t1 - last_work < d->poll_ns || (next >= 0 && next - t1 < DP_POLL_LOW_NS)) {
            /* busy-poll: a timer this close is waited for here too (epoll's sleep is coarse) */
            int64_t until = mini(t1 + DP_SPIN_SLICE_NS, last_work + d->poll_ns);
            if (next >= 0)
                until = mini(until, next);
            if (until <= t1)
                until = t1 + 1000;
            d->st.spins++;
            spin(d, until);
            d->st.spin_ns += (uint64_t)(dp_now() - t1);
            pthread_mutex_unlock(&d->lock);
            while (__atomic_load_n(&d->ctl_waiting, __ATOMIC_ACQUIRE))
                sched_yield();
            pthread_mutex_lock(&d->lock);
            continue;
        }
        /* sleep: tell every ring's owner to ring its doorbell and the NIC to wake us (a
         * sequentially consistent store: the look at the ring below cannot pass it), then
         * look once more */
        __atomic_store_n(d->ev_sleep, 1, __ATOMIC_SEQ_CST);
        if ((d->nscan && mr_vqs_sleep(d->scan, d->nscan)) || mr_evring_pending(d->ev)) {
            __atomic_store_n(d->ev_sleep, 0, __ATOMIC_RELAXED);
            mr_vqs_wake(d->scan, d->nscan);
            continue;
        }
        d->st.sleeps++;
        int64_t timeout = next >= 0 ? next - t1 : 500000000;
        struct timespec ts = {timeout / 1000000000, timeout % 1000000000};
        pthread_mutex_unlock(&d->lock);
        int n = epoll_pwait2(d->epfd, evs, 32, &ts, NULL);
        __atomic_store_n(d->ev_sleep, 0, __ATOMIC_RELAXED);      /* polling again */
        pthread_mutex_lock(&d->lock);
        int64_t t2 = dp_now();
        if (d->scan_stale)
            dp_scan_rebuild(d);
        mr_vqs_wake(d->scan, d->nscan);
        int by_event = 0;
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            if (fd == mr_evring_fd(d->ev)) {
                by_event = 1;
                continue;
            }
            drain_fd(fd);
            if (fd != d->wake_fd) {
                d->st.wakeups_by_doorbell++;
                by_event = 1;
            }
        }
        woke_after = by_event ? t2 - t1 : -1;
        if (!by_event && timeout >= DP_POLL_HIGH_NS && t2 - t1 >= DP_POLL_HIGH_NS)
            after_sleep(d, t2 - t1, 0);
    }
    pthread_mutex_unlock(&d->lock);
    return NULL;
}

/* ---- lifetime ------------------------------------------------------------------------------ */

struct mr_dp *mr_dp_new(const struct mr_dp_cfg *cfg, int *err, const char **stage)
{
    *stage = "memory";
    struct mr_dp *d = calloc(1, sizeof(*d));
    int rc = ENOMEM;
    if (!d) {
        *err = ENOMEM;
        return NULL;
    }
    d->cfg = *cfg;
    d->epfd = d->wake_fd = d->async_fd = -1;
    pthread_mutex_init(&d->lock, NULL);
    d->touched = DP_NONE;
    uint32_t nq = cfg->max_qps ? cfg->max_qps : 1, nm = cfg->max_mrs ? cfg->max_mrs : 1;
    uint32_t nc = cfg->max_cqs ? cfg->max_cqs : 1;
    struct mre_engine_cfg ec = {0};
    ec.max_qps = nq;
    ec.max_mrs = nm;
    ec.out_cap = 4096;
    ec.cq_cap = 65536;
    d->e = mre_engine_new(&ec);
    d->nqps = nq;
    d->qps = calloc(nq, sizeof(*d->qps));
    d->qpn_mask = pow2(2 * nq) - 1;
    d->qpn_idx = calloc(d->qpn_mask + 1, sizeof(*d->qpn_idx));
    d->by_eh = malloc(sizeof(*d->by_eh) * nq);
    d->mrs_mask = pow2(2 * nm) - 1;
    d->mrs = calloc(d->mrs_mask + 1, sizeof(*d->mrs));
    d->cqs_mask = pow2(2 * nc) - 1;
    d->cqs = calloc(d->cqs_mask + 1, sizeof(*d->cqs));
    d->dirty = calloc(nc, sizeof(*d->dirty));
    d->scan = calloc(2 * nq, sizeof(*d->scan));
    d->scan_qi = calloc(2 * nq, sizeof(*d->scan_qi));
    d->scan_send = calloc(2 * nq, 1);
    d->heap_cap = 4 * nq;
    d->heap = malloc(sizeof(*d->heap) * d->heap_cap);
    d->fetch_stride = 64 + 16 * MR_MAX_SGE > 64 + MR_MAX_INLINE ? 64 + 16 * MR_MAX_SGE
                                                                 : 64 + MR_MAX_INLINE;
    d->fetch_stride = pow2(d->fetch_stride);
    d->fetch_buf = malloc((size_t)DP_FETCH * d->fetch_stride);
    if (!d->e || !d->qps || !d->qpn_idx || !d->by_eh || !d->mrs || !d->cqs || !d->dirty ||
        !d->scan || !d->scan_qi || !d->scan_send || !d->heap || !d->fetch_buf)
        goto fail;
    for (uint32_t i = 0; i < nq; i++) {
        d->by_eh[i] = DP_NONE;
        d->qps[i].next_touched = DP_NONE;
    }
    int e2 = 0;
    d->xsk = mr_xsk_open(cfg->ifindex, cfg->queue, cfg->xsk_frames, cfg->xsk_frame_size,
                         cfg->xsk_ring, cfg->xsk_bind_flags, cfg->xsk_budget, &e2);
    if (!d->xsk) {
        *stage = "its AF_XDP socket (queue bind)";
        rc = e2;
        goto fail;
    }
    d->ev = mr_evring_open(cfg->events_fd, &e2);
    if (!d->ev) {
        *stage = "the NIC's event ring";
        rc = e2;
        goto fail;
    }
    long page = sysconf(_SC_PAGESIZE);
    d->sq_psns_bytes = ((size_t)8 * cfg->sq_psns_entries + page - 1) / page * page;
    d->sq_psns = mmap(NULL, d->sq_psns_bytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                      cfg->sq_psns_fd, 0);
    if (d->sq_psns == MAP_FAILED) {
        *stage = "the send PSN map";
        d->sq_psns = NULL;
        rc = errno;
        goto fail;
    }
    d->ev_sleep = mmap(NULL, (size_t)page, PROT_READ | PROT_WRITE, MAP_SHARED,
                       cfg->ev_sleep_fd, 0);
    if (d->ev_sleep == MAP_FAILED) {
        *stage = "the event ring's sleep flag";
        d->ev_sleep = NULL;
        rc = errno;
        goto fail;
    }
    d->epfd = epoll_create1(EPOLL_CLOEXEC);
    d->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    d->async_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (d->epfd < 0 || d->wake_fd < 0 || d->async_fd < 0) {
        *stage = "epoll";
        rc = errno;
        goto fail;
    }
    struct epoll_event ee = {.events = EPOLLIN};
    ee.data.fd = d->wake_fd;
    if (epoll_ctl(d->epfd, EPOLL_CTL_ADD, d->wake_fd, &ee)) {
        rc = errno;
        goto fail;
    }
    ee.data.fd = mr_evring_fd(d->ev);
    if (epoll_ctl(d->epfd, EPOLL_CTL_ADD, ee.data.fd, &ee)) {
        rc = errno;
        goto fail;
    }
    d->fixed_poll = cfg->busy_poll_ns >= 0;
    d->poll_ns = d->fixed_poll ? cfg->busy_poll_ns : DP_POLL_START_NS;
    return d;
fail:
    mr_dp_free(d);
    *err = rc ? rc : ENOMEM;
    return NULL;
}

int mr_dp_start(struct mr_dp *d)
{
    if (d->started)
        return 0;
    int rc = pthread_create(&d->thread, NULL, dp_main, d);
    if (rc)
        return -rc;
    d->started = 1;
    return 0;
}

void mr_dp_free(struct mr_dp *d)
{
    if (!d)
        return;
    if (d->started) {
        pthread_mutex_lock(&d->lock);
        d->stop = 1;
        pthread_mutex_unlock(&d->lock);
        wake(d);
        pthread_join(d->thread, NULL);
        d->started = 0;
    }
    if (d->qps)
        for (uint32_t i = 0; i < d->nqps; i++)
            if (d->qps[i].used)
                mr_dp_qp_del(d, d->qps[i].qpn);
    if (d->cqs)
        for (uint32_t i = 0; i <= d->cqs_mask; i++)
            if (d->cqs[i])
                mr_dp_cq_del(d, d->cqs[i]->handle);
    if (d->mrs)
        for (uint32_t i = 0; i <= d->mrs_mask; i++)
            if (d->mrs[i])
                mr_dp_mr_del(d, d->mrs[i]->key);
    if (d->e)
        mre_engine_free(d->e);
    if (d->xsk)
        mr_xsk_close(d->xsk);
    if (d->ev)
        mr_evring_close(d->ev);
    if (d->sq_psns)
        munmap(d->sq_psns, d->sq_psns_bytes);
    if (d->ev_sleep) {
        __atomic_store_n(d->ev_sleep, 0, __ATOMIC_RELEASE);   /* nobody sleeps on it now */
        munmap(d->ev_sleep, (size_t)sysconf(_SC_PAGESIZE));
    }
    int fds[] = {d->epfd, d->wake_fd, d->async_fd};
    for (unsigned i = 0; i < 3; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    free(d->qps);
    free(d->qpn_idx);
    free(d->by_eh);
    free(d->mrs);
    free(d->cqs);
    free(d->dirty);
    free(d->scan);
    free(d->scan_qi);
    free(d->scan_send);
    free(d->heap);
    free(d->fetch_buf);
    pthread_mutex_destroy(&d->lock);
    free(d);
}

int mr_dp_doorbell_add(struct mr_dp *d, int fd)
{
    struct epoll_event ee = {.events = EPOLLIN};
    ee.data.fd = fd;
    int rc = epoll_ctl(d->epfd, EPOLL_CTL_ADD, fd, &ee) ? -errno : 0;
    return rc == -EEXIST ? 0 : rc;
}

int mr_dp_doorbell_del(struct mr_dp *d, int fd)
{
    return epoll_ctl(d->epfd, EPOLL_CTL_DEL, fd, NULL) ? -errno : 0;
}

int mr_dp_async_fd(struct mr_dp *d)
{
    return d->async_fd;
}

void dp_push_async(struct mr_dp *d, uint32_t type, uint64_t owner, uint32_t cq, uint32_t qpn,
                   uint32_t cqe, uint32_t bad_index)
{
    if (d->async_tail - d->async_head >= DP_ASYNC_CAP)
        return;                        /* the control plane is far behind: the state says it */
    struct mr_dp_async *a = &d->async[d->async_tail++ % DP_ASYNC_CAP];
    memset(a, 0, sizeof(*a));
    a->type = type;
    a->owner = owner;
    a->cq = cq;
    a->qpn = qpn;
    a->cqe = cqe;
    a->bad_index = bad_index;
    uint64_t one = 1;
    if (write(d->async_fd, &one, sizeof(one)) < 0) {
    }
}

int mr_dp_take_async(struct mr_dp *d, struct mr_dp_async *out, uint32_t max)
{
    dp_lock(d);
    drain_fd(d->async_fd);
    uint32_t n = 0;
    while (n < max && d->async_head != d->async_tail)
        out[n++] = d->async[d->async_head++ % DP_ASYNC_CAP];
    dp_unlock(d);
    return (int)n;
}

void mr_dp_get_stats(struct mr_dp *d, struct mr_dp_stats *out)
{
    dp_lock(d);
    *out = d->st;
    out->busy_poll_ns = (uint64_t)d->poll_ns;
    out->fixed_busy_poll = (uint32_t)d->fixed_poll;
    out->heap = d->nheap;
    out->active_rings = d->nscan;
    out->running = (uint32_t)d->started;
    uint32_t n = 0;
    for (uint32_t i = 0; i < d->nqps; i++)
        n += d->qps[i].used;
    out->qps = n;
    dp_unlock(d);
}

void mr_dp_xsk_stats(struct mr_dp *d, struct mr_xsk_stats *out)
{
    dp_lock(d);
    mr_xsk_get_stats(d->xsk, out);
    dp_unlock(d);
}

uint32_t mr_dp_frame_cap(struct mr_dp *d)
{
    return mr_xsk_frame_cap(d->xsk);          /* fixed at open: no lock */
}

int mr_dp_xsk_sg(struct mr_dp *d)
{
    return mr_xsk_sg(d->xsk);
}

/* the wake-up of a sleeping thread, for the control calls that change what it sleeps on */
void dp_wake(struct mr_dp *d);
void dp_wake(struct mr_dp *d)
{
    wake(d);
}
