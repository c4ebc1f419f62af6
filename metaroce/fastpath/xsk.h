/* AF_XDP socket with its own UMEM: batched transmit from user space (copy or zero-copy mode).
 * The C side of metaroce.fastpath.xsk; built with cffi by the setup step. */
#ifndef METAROCE_XSK_H
#define METAROCE_XSK_H

#include <stdint.h>

struct mr_xsk_stats {
    uint64_t tx_queued;        /* frames handed to the kernel (one or more descriptors each) */
    uint64_t tx_completed;     /* frames the kernel gave back (every descriptor completed) */
    uint64_t kicks;            /* sendto() wakeups */
    uint64_t kick_busy;        /* sendto() answered EAGAIN/EBUSY/ENOBUFS: retried later */
    uint64_t kick_deferred;    /* wakeups not made: the driver said busy and took nothing, and
                                * its back-off (2 us doubling to 128 us) had not run out */
    uint64_t tx_ring_full;     /* frames not queued for want of a ring slot or UMEM frame */
    uint64_t tx_bytes;         /* bytes of the frames the kernel gave back (tx_completed's) */
    uint64_t tx_multi;         /* frames queued as several descriptors (XDP_USE_SG) */
    uint64_t tx_refused;       /* frames not queued: empty or longer than a slot (frame cap) */
    /* the kernel's own view (getsockopt XDP_STATISTICS), read by mr_xsk_get_stats */
    uint64_t kern_tx_invalid_descs;     /* descriptors it refused (bad address or length) */
    uint64_t kern_tx_ring_empty_descs;  /* wakeups that found the TX ring empty */
};

struct mr_xsk;

/* Open an AF_XDP socket bound to (ifindex, queue) of the calling thread's network namespace.
 * frame_size is the UMEM chunk (2048 or 4096: the kernel refuses larger ones); nframes UMEM
 * slots (frames in flight at most), ring_size frames the TX ring holds (both powers of two,
 * ring_size <= nframes). bind_flags e.g. XDP_COPY (1 << 1); with XDP_USE_SG (1 << 4) a slot is
 * MR_XSK_SG_CHUNKS adjacent chunks and a frame longer than a chunk leaves as one descriptor per
 * chunk (XDP_PKT_CONTD on all but the last); a kernel or driver that refuses SG (bind EINVAL /
 * EOPNOTSUPP) gets a socket without it (mr_xsk_sg says which). NULL + *err on failure. */
#define MR_XSK_SG_CHUNKS 2
struct mr_xsk *mr_xsk_open(int ifindex, uint32_t queue, uint32_t nframes, uint32_t frame_size,
                           uint32_t ring_size, uint16_t bind_flags, uint32_t tx_budget, int *err);
void mr_xsk_close(struct mr_xsk *x);
int mr_xsk_fd(struct mr_xsk *x);
/* Whether the socket took XDP_USE_SG, and the largest frame it sends (a slot: the chunk size
 * without SG, MR_XSK_SG_CHUNKS chunks with it). */
int mr_xsk_sg(struct mr_xsk *x);
uint32_t mr_xsk_frame_cap(struct mr_xsk *x);

/* Queue n frames, packed back to back in data with their lengths in lens, and kick the kernel.
 * Returns how many were queued (fewer when the ring or UMEM is full: call again). */
uint32_t mr_xsk_send(struct mr_xsk *x, const uint8_t *data, const uint32_t *lens, uint32_t n);

/* Reap completions (waking the kernel if the TX ring is not drained); returns how many
 * frames are still in flight (a slot is free again once all its descriptors completed). */
uint32_t mr_xsk_poll_tx(struct mr_xsk *x);

void mr_xsk_get_stats(struct mr_xsk *x, struct mr_xsk_stats *out);

/* For builders that write frames in place (roce_tx.c): how many frames can be queued now
 * (whatever their length: each counted at the descriptors a full slot takes), the next free
 * slot's memory (*cap = mr_xsk_frame_cap), and queueing it with its length (1 .. cap; one
 * descriptor per chunk it spans); then mr_xsk_kick. */
uint32_t mr_xsk_tx_room(struct mr_xsk *x);
uint8_t *mr_xsk_tx_frame(struct mr_xsk *x, uint32_t *cap);
void mr_xsk_tx_commit(struct mr_xsk *x, uint32_t len);
/* Wake the kernel (sendto), unless the driver's last answer was busy without progress and its
 * back-off has not run out (then mr_xsk_poll_tx wakes it later). */
void mr_xsk_kick(struct mr_xsk *x);

#endif
