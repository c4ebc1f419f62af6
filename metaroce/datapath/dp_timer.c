/* Timers: each QP's next engine deadline (retransmission, RNR wait, pacing, credit probe) in a
 * binary min-heap, pushed when it changes; an entry whose QP has another deadline by now (or is
 * gone) is stale and skipped. No pass over every QP, however many there are. */
#include <stdlib.h>

#include "dp_int.h"

static void swap(struct dp_timer *a, struct dp_timer *b)
{
    struct dp_timer t = *a;
    *a = *b;
    *b = t;
}

static void push(struct mr_dp *d, struct dp_timer t)
{
    if (d->nheap == d->heap_cap) {
        uint32_t cap = d->heap_cap * 2;
        struct dp_timer *h = realloc(d->heap, sizeof(*h) * cap);
        if (!h)
            return;                    /* out of memory: the QP's timer is late, not lost */
        d->heap = h;
        d->heap_cap = cap;
    }
    uint32_t i = d->nheap++;
    d->heap[i] = t;
    while (i && d->heap[(i - 1) / 2].at > d->heap[i].at) {
        swap(&d->heap[(i - 1) / 2], &d->heap[i]);
        i = (i - 1) / 2;
    }
}

static void pop(struct mr_dp *d)
{
    d->heap[0] = d->heap[--d->nheap];
    uint32_t i = 0;
    for (;;) {
        uint32_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < d->nheap && d->heap[l].at < d->heap[m].at)
            m = l;
        if (r < d->nheap && d->heap[r].at < d->heap[m].at)
            m = r;
        if (m == i)
            return;
        swap(&d->heap[m], &d->heap[i]);
        i = m;
    }
}

static int stale(struct mr_dp *d, const struct dp_timer *t)
{
    const struct dp_qp *q = &d->qps[t->qi];
    return !q->used || q->gen != t->gen || q->deadline != t->at;
}

void dp_timer_set(struct mr_dp *d, struct dp_qp *q, int64_t at)
{
    if (at == q->deadline)
        return;
    q->deadline = at;
    if (at >= 0)
        push(d, (struct dp_timer){at, (uint32_t)(q - d->qps), q->gen});
    if (d->nheap > 8 * d->nqps + 64) {          /* mostly stale: keep the live entries */
        uint32_t k = 0;
        for (uint32_t i = 0; i < d->nheap; i++)
            if (!stale(d, &d->heap[i]))
                d->heap[k++] = d->heap[i];
        struct dp_timer *all = d->heap;
        uint32_t n = k;
        d->nheap = 0;
        for (uint32_t i = 0; i < n; i++)
            push(d, all[i]);
    }
}

int dp_run_timers(struct mr_dp *d, int64_t now)
{
    int n = 0;
    while (d->nheap && d->heap[0].at <= now) {
        struct dp_timer t = d->heap[0];
        pop(d);
        if (stale(d, &t))
            continue;
        struct dp_qp *q = &d->qps[t.qi];
        q->deadline = -1;
        if (q->eh == DP_NONE)
            continue;
        dp_read_progress(d, q, now);
        mre_on_timer(d->e, q->eh, now);
        dp_touch(d, q);
        d->st.timers++;
        n++;
    }
    return n;
}

int64_t dp_next_deadline(struct mr_dp *d)
{
    while (d->nheap && stale(d, &d->heap[0]))
        pop(d);
    return d->nheap ? d->heap[0].at : -1;
}
