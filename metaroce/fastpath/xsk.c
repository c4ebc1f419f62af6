/* AF_XDP transmit with a private UMEM, raw syscalls only (uapi <linux/if_xdp.h>).
 *
 * The UMEM is cut into slots of one chunk, or of MR_XSK_SG_CHUNKS adjacent chunks when the
 * socket took XDP_USE_SG: a builder writes a frame in place into a slot (contiguous memory, up
 * to a slot long), and the frame leaves as one descriptor per chunk it spans, XDP_PKT_CONTD on
 * every one but the last (a descriptor may not cross its chunk). A slot is free again when all
 * of its descriptors came back on the completion ring, in whatever order. The TX ring has room
 * for ring_size full slots' descriptors and the completion ring for every chunk of the UMEM, so
 * a frame of one chunk takes one descriptor of room and the kernel never finds the completion
 * ring full (it reserves a completion slot per descriptor it takes). A descriptor the kernel
 * refuses (zero length, across its chunk, unknown options) is never completed: its slot would
 * be lost, so none is ever queued. */
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
#ifndef XDP_USE_SG                    /* Linux 6.6; Debian 12's uapi headers lack both */
#define XDP_USE_SG (1 << 4)
#endif
#ifndef XDP_PKT_CONTD
#define XDP_PKT_CONTD (1 << 0)
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
    int sg;                    /* bound with XDP_USE_SG */
    uint8_t *umem;
    size_t umem_len;
    uint32_t chunk;            /* UMEM chunk: the most one descriptor carries */
    uint32_t slot_chunks;      /* chunks per slot: 1, or MR_XSK_SG_CHUNKS with SG */
    uint32_t slot_size;        /* chunk * slot_chunks: the largest frame */
    uint32_t nslots;
    struct ring fill, comp, tx;
    uint64_t *free_slots;      /* UMEM offsets of slots ready for new frames */
    uint32_t *slot_len;        /* length of the frame queued in each slot */
    uint8_t *slot_pending;     /* its descriptors not yet completed (0: free or being built) */
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
    free(x->free_slots);
    free(x->slot_len);
    free(x->slot_pending);
    free(x);
}

/* One attempt: slot_chunks 1 without SG, MR_XSK_SG_CHUNKS with it (bind_flags says which). */
static struct mr_xsk *xsk_open(int ifindex, uint32_t queue, uint32_t nslots, uint32_t chunk,
                               uint32_t ring_size, uint16_t bind_flags, uint32_t tx_budget,
                               int *err)
{
    struct mr_xsk *x = calloc(1, sizeof(*x));
    int rc = 0;
    if (!x) {
        *err = ENOMEM;
        return NULL;
    }
    x->fd = -1;
    x->sg = (bind_flags & XDP_USE_SG) != 0;
    x->slot_chunks = x->sg ? MR_XSK_SG_CHUNKS : 1;
    x->chunk = chunk;
    x->slot_size = chunk * x->slot_chunks;
    x->nslots = nslots;
    x->umem_len = (size_t)nslots * x->slot_size;
    x->umem = mmap(NULL, x->umem_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (x->umem == MAP_FAILED) {
        x->umem = NULL;
        rc = -errno;
        goto fail;
    }
    x->free_slots = malloc(sizeof(uint64_t) * nslots);
    x->slot_len = calloc(nslots, sizeof(uint32_t));
    x->slot_pending = calloc(nslots, 1);
    if (!x->free_slots || !x->slot_len || !x->slot_pending) {
        rc = -ENOMEM;
        goto fail;
    }
    for (uint32_t i = 0; i < nslots; i++)     /* popped from the end: slot 0 first */
        x->free_slots[i] = (uint64_t)(nslots - 1 - i) * x->slot_size;
    x->nfree = nslots;

    /* TX ring: ring_size frames of a full slot each; completion ring: every chunk in flight */
    uint32_t tx_size = ring_size * x->slot_chunks, comp_size = nslots * x->slot_chunks;
    x->fd = socket(AF_XDP, SOCK_RAW | SOCK_CLOEXEC, 0);
    if (x->fd < 0) {
        rc = -errno;
        goto fail;
    }
    struct xdp_umem_reg reg = {.addr = (uint64_t)(uintptr_t)x->umem, .len = x->umem_len,
                               .chunk_size = chunk, .headroom = 0};
    if (setsockopt(x->fd, SOL_XDP, XDP_UMEM_REG, &reg, sizeof(reg)) ||
        setsockopt(x->fd, SOL_XDP, XDP_UMEM_FILL_RING, &ring_size, sizeof(ring_size)) ||
        setsockopt(x->fd, SOL_XDP, XDP_UMEM_COMPLETION_RING, &comp_size, sizeof(comp_size)) ||
        setsockopt(x->fd, SOL_XDP, XDP_TX_RING, &tx_size, sizeof(tx_size))) {
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
        (rc = map_ring(x->fd, &x->comp, &off.cr, comp_size, sizeof(uint64_t), XDP_UMEM_PGOFF_COMPLETION_RING)) ||
        (rc = map_ring(x->fd, &x->tx, &off.tx, tx_size, sizeof(struct xdp_desc), XDP_PGOFF_TX_RING)))
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

struct mr_xsk *mr_xsk_open(int ifindex, uint32_t queue, uint32_t nframes, uint32_t frame_size,
                           uint32_t ring_size, uint16_t bind_flags, uint32_t tx_budget, int *err)
{
    if ((ring_size & (ring_size - 1)) || (nframes & (nframes - 1)) || !ring_size ||
        ring_size > nframes || (frame_size != 2048 && frame_size != 4096)) {
        *err = EINVAL;
        return NULL;
    }
    struct mr_xsk *x = xsk_open(ifindex, queue, nframes, frame_size, ring_size, bind_flags,
                                tx_budget, err);
    /* a kernel before 6.6 does not know the flag (EINVAL), a zero-copy driver may not take
     * several buffers a packet (EOPNOTSUPP): the socket without it, frames of one chunk */
    if (!x && (bind_flags & XDP_USE_SG) && (*err == EINVAL || *err == EOPNOTSUPP))
        x = xsk_open(ifindex, queue, nframes, frame_size, ring_size,
                     (uint16_t)(bind_flags & ~XDP_USE_SG), tx_budget, err);
    return x;
}

int mr_xsk_fd(struct mr_xsk *x)
{
    return x->fd;
}

int mr_xsk_sg(struct mr_xsk *x)
{
    return x->sg;
}

uint32_t mr_xsk_frame_cap(struct mr_xsk *x)
{
    return x->slot_size;
}

uint32_t mr_xsk_poll_tx(struct mr_xsk *x)
{
    uint32_t cons = *x->comp.consumer;
    uint32_t prod = __atomic_load_n(x->comp.producer, __ATOMIC_ACQUIRE);
    const uint64_t *addrs = x->comp.ring;
    while (cons != prod) {
        uint64_t slot = addrs[cons & x->comp.mask] / x->slot_size;
        cons++;
        if (slot >= x->nslots || !x->slot_pending[slot] || --x->slot_pending[slot])
            continue;                  /* not the slot's last descriptor (or not ours) */
        x->free_slots[x->nfree++] = slot * x->slot_size;
        x->st.tx_bytes += x->slot_len[slot];
        x->st.tx_completed++;
    }
    __atomic_store_n(x->comp.consumer, cons, __ATOMIC_RELEASE);
    /* in copy mode one wakeup sends at most the TX budget: wake the kernel while the TX ring
     * still holds descriptors it has not taken (completions first: the kernel reserves a
     * completion slot for each descriptor it takes) */
    if (*x->tx.producer != __atomic_load_n(x->tx.consumer, __ATOMIC_ACQUIRE))
        mr_xsk_kick(x);
    return x->nslots - x->nfree;
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

/* Free descriptors on the TX ring. */
static uint32_t tx_free(struct mr_xsk *x)
{
    return x->tx.size - (*x->tx.producer - __atomic_load_n(x->tx.consumer, __ATOMIC_ACQUIRE));
}

/* The descriptors of the frame (len bytes, 1 .. slot_size) in the slot at addr, written from
 * *prod on (not published: the caller stores the producer). */
static void put_frame(struct mr_xsk *x, uint64_t addr, uint32_t len, uint32_t *prod)
{
    struct xdp_desc *descs = x->tx.ring;
    uint32_t n = (len + x->chunk - 1) / x->chunk, slot = (uint32_t)(addr / x->slot_size);
    x->slot_len[slot] = len;
    x->slot_pending[slot] = (uint8_t)n;
    for (uint32_t i = 0; i + 1 < n; i++)
        descs[(*prod)++ & x->tx.mask] = (struct xdp_desc){.addr = addr + (uint64_t)i * x->chunk,
                                                          .len = x->chunk, .options = XDP_PKT_CONTD};
    descs[(*prod)++ & x->tx.mask] = (struct xdp_desc){.addr = addr + (uint64_t)(n - 1) * x->chunk,
                                                      .len = len - (n - 1) * x->chunk, .options = 0};
    x->st.tx_queued++;
    x->st.tx_multi += n > 1;
}

uint32_t mr_xsk_send(struct mr_xsk *x, const uint8_t *data, const uint32_t *lens, uint32_t n)
{
    mr_xsk_poll_tx(x);
    uint32_t prod = *x->tx.producer, room = tx_free(x), queued = 0;
    size_t off = 0;
    int refused = 0;
    while (queued < n && x->nfree) {
        uint32_t len = lens[queued];
        if (!len || len > x->slot_size) {
            refused = 1;   /* the caller splits larger frames; an empty one is not a frame */
            break;
        }
        uint32_t nd = (len + x->chunk - 1) / x->chunk;
        if (nd > room)
            break;
        uint64_t addr = x->free_slots[--x->nfree];
        memcpy(x->umem + addr, data + off, len);
        put_frame(x, addr, len, &prod);
        room -= nd;
        off += len;
        queued++;
    }
    if (refused)
        x->st.tx_refused++;
    else if (queued < n)
        x->st.tx_ring_full += n - queued;
    if (queued) {
        __atomic_store_n(x->tx.producer, prod, __ATOMIC_RELEASE);
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
    uint32_t room = tx_free(x) / x->slot_chunks;   /* each frame at its longest */
    return room < x->nfree ? room : x->nfree;
}

uint8_t *mr_xsk_tx_frame(struct mr_xsk *x, uint32_t *cap)
{
    if (!x->nfree) {
        *cap = 0;
        return NULL;
    }
    *cap = x->slot_size;
    return x->umem + x->free_slots[x->nfree - 1];
}

void mr_xsk_tx_commit(struct mr_xsk *x, uint32_t len)
{
    /* a length no slot holds queues nothing (the builders never commit one); nor does a
     * frame without room (the builders ask mr_xsk_tx_room first) */
    if (!len || len > x->slot_size) {
        x->st.tx_refused++;
        return;
    }
    if (!x->nfree || (len + x->chunk - 1) / x->chunk > tx_free(x)) {
        x->st.tx_ring_full++;
        return;
    }
    uint64_t addr = x->free_slots[--x->nfree];
    uint32_t prod = *x->tx.producer;
    put_frame(x, addr, len, &prod);
    __atomic_store_n(x->tx.producer, prod, __ATOMIC_RELEASE);
}
