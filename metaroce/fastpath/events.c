/* Batched draining of the NIC's BPF ring buffer with libbpf. */
#include <bpf/libbpf.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "events.h"

struct mr_evring {
    struct ring_buffer *rb;
    struct mr_nic_event *ev;
    size_t n, cap;
    /* our own read-only views of the ring's positions (libbpf keeps its own private) */
    const unsigned long *cons_pos, *prod_pos;
    size_t page;
};

static int on_event(void *ctx, void *data, size_t size)
{
    struct mr_evring *r = ctx;
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 1024;
        struct mr_nic_event *ev = realloc(r->ev, cap * sizeof(*ev));
        if (!ev)
            return 0;                  /* out of memory: this event is lost, keep going */
        r->ev = ev;
        r->cap = cap;
    }
    memset(&r->ev[r->n], 0, sizeof(r->ev[0]));
    memcpy(&r->ev[r->n], data, size < sizeof(r->ev[0]) ? size : sizeof(r->ev[0]));
    r->n++;
    return 0;
}

struct mr_evring *mr_evring_open(int map_fd, int *err)
{
    struct mr_evring *r = calloc(1, sizeof(*r));
    if (!r) {
        *err = ENOMEM;
        return NULL;
    }
    r->rb = ring_buffer__new(map_fd, on_event, r, NULL);
    if (!r->rb) {
        *err = errno ? errno : EINVAL;
        free(r);
        return NULL;
    }
    r->page = (size_t)sysconf(_SC_PAGESIZE);
    void *c = mmap(NULL, r->page, PROT_READ, MAP_SHARED, map_fd, 0);
    void *p = mmap(NULL, r->page, PROT_READ, MAP_SHARED, map_fd, (off_t)r->page);
    r->cons_pos = c == MAP_FAILED ? NULL : c;
    r->prod_pos = p == MAP_FAILED ? NULL : p;
    return r;
}

void mr_evring_close(struct mr_evring *r)
{
    if (!r)
        return;
    ring_buffer__free(r->rb);
    if (r->cons_pos)
        munmap((void *)r->cons_pos, r->page);
    if (r->prod_pos)
        munmap((void *)r->prod_pos, r->page);
    free(r->ev);
    free(r);
}

int mr_evring_fd(struct mr_evring *r)
{
    return ring_buffer__epoll_fd(r->rb);
}

int mr_evring_poll(struct mr_evring *r, int timeout_ms, struct mr_nic_event **out)
{
    r->n = 0;
    int rc = timeout_ms ? ring_buffer__poll(r->rb, timeout_ms) : ring_buffer__consume(r->rb);
    *out = r->ev;
    if (rc < 0 && rc != -EINTR)
        return rc;
    return (int)r->n;
}

int mr_evring_pending(struct mr_evring *r)
{
    if (!r->cons_pos || !r->prod_pos)
        return 1;                      /* cannot tell: let the caller look */
    return __atomic_load_n(r->prod_pos, __ATOMIC_ACQUIRE) !=
           __atomic_load_n(r->cons_pos, __ATOMIC_ACQUIRE);
}
