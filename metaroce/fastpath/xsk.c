/* AF_XDP transmit with a private UMEM, raw syscalls only (uapi <linux/if_xdp.h>). */
#include <errno.h>
#include <linux/if_xdp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "xsk.h"

#ifndef AF_XDP
#define AF_XDP 44
#endif
#ifndef SOL_XDP
#define SOL_XDP 283
#endif
#define MR_XDP_MAX_TX_SKB_BUDGET 9    /* not in Debian 12's uapi headers; the kernel has it */

struct ring {
    volatile uint32_t *producer;
    volatile uint32_t *consumer;
    volatile uint32_t *flags;
    void *ring;
    uint32_t mask;
    uint32_t size;
    void *map;
    size_t map_len;
};

struct mr_xsk {
    int fd;
    uint8_t *umem;
    size_t umem_len;
    uint32_t frame_size, nframes;
    struct ring fill, comp, tx;
    uint64_t *free_frames;     /* UMEM offsets ready for new frames */
    uint32_t *frame_len;       /* length queued in each UMEM frame (by offset / frame_size) */
    uint32_t nfree;
    /* A wakeup the driver answered busy without taking a descriptor (its queue is stopped:
     * veth's peer ring is full until the peer's NAPI runs) is not repeated at once: the next
     * one waits backoff_ns (doubling from MR_KICK_BACKOFF_MIN_NS to _MAX_NS), and any wakeup
     * that moves the TX ring ends the back-off. Spinning sendto() on a stopped queue takes the
     * CPU the peer needs to drain it. */
    uint64_t backoff_ns, retry_at_ns;
    struct mr_xsk_stats st;
};

#define MR_KICK_BACKOFF_MIN_NS 2000ull
#define MR_KICK_BACKOFF_MAX_NS 128000ull

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int map_ring(int fd, struct ring *r, const struct xdp_ring_offset *off, uint32_t size,
                    size_t desc_size, off_t pgoff)
{
    r->map_len = off->desc + (size_t)size * desc_size;
    r->map = mmap(NULL, r->map_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, pgoff);
    if (r->map == MAP_FAILED) {
        r->map = NULL;
        return -errno;
    }
    r->producer = (uint32_t *)((uint8_t *)r->map + off->producer);
    r->consumer = (uint32_t *)((uint8_t *)r->map + off->consumer);
    r->flags = (uint32_t *)((uint8_t *)r->map + off->flags);
    r->ring = (uint8_t *)r->map + off->desc;
    r->size = size;
    r->mask = size - 1;
    return 0;
}

void mr_xsk_close(struct mr_xsk *x)
{
    if (!x)
        return;
    struct ring *rings[] = {&x->fill, &x->comp, &x->tx};
    for (unsigned i = 0; i < 3; i++)
        if (rings[i]->map)
            munmap(rings[i]->map, rings[i]->map_len);
    if (x->fd >= 0)
        close(x->fd);
    if (x->umem)
        munmap(x->umem, x->umem_len);
    free(x->free_frames);
    free(x->frame_len);
    free(x);
}

struct mr_xsk *mr_xsk_open(int ifindex, uint32_t queue, uint32_t nframes, uint32_t frame_size,
                           uint32_t ring_size, uint16_t bind_flags, uint32_t tx_budget, int *err)
{
    struct mr_xsk *x = calloc(1, sizeof(*x));
    int rc = 0;
    if (!x) {
        *err = ENOMEM;
        return NULL;
    }
    x->fd = -1;
    if ((ring_size & (ring_size - 1)) || (nframes & (nframes - 1)) || ring_size > nframes) {
        rc = -EINVAL;
        goto fail;
    }
    x->frame_size = frame_size;
    x->nframes = nframes;
    x->umem_len = (size_t)nframes * frame_size;
    x->umem = mmap(NULL, x->umem_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (x->umem == MAP_FAILED) {
        x->umem = NULL;
        rc = -errno;
        goto fail;
    }
    x->free_frames = malloc(sizeof(uint64_t) * nframes);
    x->frame_len = calloc(nframes, sizeof(uint32_t));
    if (!x->free_frames || !x->frame_len) {
        rc = -ENOMEM;
        goto fail;
    }
    for (uint32_t i = 0; i < nframes; i++)
        x->free_frames[i] = (uint64_t)i * frame_size;
    x->nfree = nframes;

    x->fd = socket(AF_XDP, SOCK_RAW | SOCK_CLOEXEC, 0);
    if (x->fd < 0) {
        rc = -errno;
        goto fail;
    }
    struct xdp_umem_reg reg = {.addr = (uint64_t)(uintptr_t)x->umem, .len = x->umem_len,
                               .chunk_size = frame_size, .headroom = 0};
    if (setsockopt(x->fd, SOL_XDP, XDP_UMEM_REG, &reg, sizeof(reg)) ||
        setsockopt(x->fd, SOL_XDP, XDP_UMEM_FILL_RING, &ring_size, sizeof(ring_size)) ||
        setsockopt(x->fd, SOL_XDP, XDP_UMEM_COMPLETION_RING, &ring_size, sizeof(ring_size)) ||
        setsockopt(x->fd, SOL_XDP, XDP_TX_RING, &ring_size, sizeof(ring_size))) {
        rc = -errno;
        goto fail;
    }
    if (tx_budget)   /* best effort: more frames per kick on kernels that have it */
        setsockopt(x->fd, SOL_XDP, MR_XDP_MAX_TX_SKB_BUDGET, &tx_budget, sizeof(tx_budget));
    struct xdp_mmap_offsets off;
    socklen_t optlen = sizeof(off);
    if (getsockopt(x->fd, SOL_XDP, XDP_MMAP_OFFSETS, &off, &optlen)) {
        rc = -errno;
        goto fail;
    }
    if ((rc = map_ring(x->fd, &x->fill, &off.fr, ring_size, sizeof(uint64_t), XDP_UMEM_PGOFF_FILL_RING)) ||
        (rc = map_ring(x->fd, &x->comp, &off.cr, ring_size, sizeof(uint64_t), XDP_UMEM_PGOFF_COMPLETION_RING)) ||
        (rc = map_ring(x->fd, &x->tx, &off.tx, ring_size, sizeof(struct xdp_desc), XDP_PGOFF_TX_RING)))
        goto fail;
    struct sockaddr_xdp sxdp = {.sxdp_family = AF_XDP, .sxdp_ifindex = ifindex,
                                .sxdp_queue_id = queue, .sxdp_flags = bind_flags};
    if (bind(x->fd, (struct sockaddr *)&sxdp, sizeof(sxdp))) {
        rc = -errno;
        goto fail;
    }
    return x;
fail:
    *err = -rc;
    mr_xsk_close(x);
    return NULL;
}

int mr_xsk_fd(struct mr_xsk *x)
{
    return x->fd;
}

uint32_t mr_xsk_poll_tx(struct mr_xsk *x)
{
    uint32_t cons = *x->comp.consumer;
    uint32_t prod = __atomic_load_n(x->comp.producer, __ATOMIC_ACQUIRE);
    const uint64_t *addrs = x->comp.ring;
    while (cons != prod) {
        uint64_t addr = addrs[cons & x->comp.mask];
        x->free_frames[x->nfree++] = addr;
        x->st.tx_bytes += x->frame_len[addr / x->frame_size];
        cons++;
        x->st.tx_completed++;
    }
    __atomic_store_n(x->comp.consumer, cons, __ATOMIC_RELEASE);
    /* in copy mode one wakeup sends at most the TX budget: wake the kernel while the TX ring
     * still holds descriptors it has not taken (completions first: the kernel reserves a
     * completion slot for each descriptor it takes) */
    if (*x->tx.producer != __atomic_load_n(x->tx.consumer, __ATOMIC_ACQUIRE))
        mr_xsk_kick(x);
    return (uint32_t)(x->st.tx_queued - x->st.tx_completed);
}

void mr_xsk_kick(struct mr_xsk *x)
{
    if (x->backoff_ns) {
        if (now_ns() < x->retry_at_ns) {
            x->st.kick_deferred++;
            return;
        }
    }
    uint32_t before = __atomic_load_n(x->tx.consumer, __ATOMIC_ACQUIRE);
    x->st.kicks++;
    if (sendto(x->fd, NULL, 0, MSG_DONTWAIT, NULL, 0) < 0 &&
        (errno == EAGAIN || errno == EBUSY || errno == ENOBUFS)) {
        x->st.kick_busy++;
        if (__atomic_load_n(x->tx.consumer, __ATOMIC_ACQUIRE) == before) {
            x->backoff_ns = x->backoff_ns ? x->backoff_ns * 2 : MR_KICK_BACKOFF_MIN_NS;
            if (x->backoff_ns > MR_KICK_BACKOFF_MAX_NS)
                x->backoff_ns = MR_KICK_BACKOFF_MAX_NS;
            x->retry_at_ns = now_ns() + x->backoff_ns;
            return;
        }
    }
    x->backoff_ns = 0;
}

uint32_t mr_xsk_send(struct mr_xsk *x, const uint8_t *data, const uint32_t *lens, uint32_t n)
{
    mr_xsk_poll_tx(x);
    uint32_t prod = *x->tx.producer;
    uint32_t cons = __atomic_load_n(x->tx.consumer, __ATOMIC_ACQUIRE);
    uint32_t room = x->tx.size - (prod - cons);
    struct xdp_desc *descs = x->tx.ring;
    uint32_t queued = 0;
    size_t off = 0;
    while (queued < n && room && x->nfree) {
        uint32_t len = lens[queued];
        if (len > x->frame_size)
            break;      /* the caller splits larger frames */
        uint64_t addr = x->free_frames[--x->nfree];
        memcpy(x->umem + addr, data + off, len);
        x->frame_len[addr / x->frame_size] = len;
        descs[prod & x->tx.mask] = (struct xdp_desc){.addr = addr, .len = len, .options = 0};
        prod++;
        room--;
        off += len;
        queued++;
    }
    if (queued < n)
        x->st.tx_ring_full += n - queued;
    if (queued) {
        __atomic_store_n(x->tx.producer, prod, __ATOMIC_RELEASE);
        x->st.tx_queued += queued;
        mr_xsk_kick(x);
    }
    return queued;
}

void mr_xsk_get_stats(struct mr_xsk *x, struct mr_xsk_stats *out)
{
    /* struct xdp_statistics grew over time: rx_dropped, rx_invalid_descs, tx_invalid_descs,
     * then rx_ring_full, rx_fill_ring_empty_descs, tx_ring_empty_descs (5.9+) */
    uint64_t ks[6] = {0};
    socklen_t len = sizeof(ks);
    *out = x->st;
    if (getsockopt(x->fd, SOL_XDP, XDP_STATISTICS, ks, &len) == 0) {
        out->kern_tx_invalid_descs = ks[2];
        out->kern_tx_ring_empty_descs = len >= sizeof(ks) ? ks[5] : 0;
    }
}

uint32_t mr_xsk_tx_room(struct mr_xsk *x)
{
    mr_xsk_poll_tx(x);
    uint32_t cons = __atomic_load_n(x->tx.consumer, __ATOMIC_ACQUIRE);
    uint32_t room = x->tx.size - (*x->tx.producer - cons);
    return room < x->nfree ? room : x->nfree;
}

uint8_t *mr_xsk_tx_frame(struct mr_xsk *x, uint32_t *cap)
{
    *cap = x->frame_size;
    return x->umem + x->free_frames[x->nfree - 1];
}

void mr_xsk_tx_commit(struct mr_xsk *x, uint32_t len)
{
    uint64_t addr = x->free_frames[--x->nfree];
    x->frame_len[addr / x->frame_size] = len;
    uint32_t prod = *x->tx.producer;
    struct xdp_desc *descs = x->tx.ring;
    descs[prod & x->tx.mask] = (struct xdp_desc){.addr = addr, .len = len, .options = 0};
    __atomic_store_n(x->tx.producer, prod + 1, __ATOMIC_RELEASE);
    x->st.tx_queued++;
}
