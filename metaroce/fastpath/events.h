/* The NIC's event ring (a BPF ring buffer) drained in batches: completions, READ requests to
 * answer, ACK progress. The C side of metaroce.nic.events; built with cffi by the setup step. */
#ifndef METAROCE_EVENTS_H
#define METAROCE_EVENTS_H

#include <stdint.h>

/* Same layout as struct nic_event in bpf/nic/nic_structs.h. */
struct mr_nic_event {
    uint32_t type;
    uint32_t qpn;
    uint32_t psn;
    uint32_t syndrome;
    uint64_t wr_id;
    uint64_t va;
    uint32_t rkey;
    uint32_t len;
    uint32_t imm;
    uint32_t flags;
    uint32_t msn;
    uint32_t pad;
};

struct mr_evring;

/* Open the ring of the BPF_MAP_TYPE_RINGBUF map_fd; NULL + *err on failure. */
struct mr_evring *mr_evring_open(int map_fd, int *err);
void mr_evring_close(struct mr_evring *r);
/* An fd that is readable when events wait (for select/epoll). */
int mr_evring_fd(struct mr_evring *r);
/* Wait up to timeout_ms (0: do not wait) and take every waiting event; returns how many, and
 * *out points at them until the next call. */
int mr_evring_poll(struct mr_evring *r, int timeout_ms, struct mr_nic_event **out);
/* 1 if events wait, without a system call (the ring's producer and consumer positions). */
int mr_evring_pending(struct mr_evring *r);

#endif
