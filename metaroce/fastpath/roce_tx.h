/* Requester transmit: segment one RDMA WRITE into RoCEv2 frames (FIRST/MIDDLE/LAST or ONLY,
 * RETH on the first, AckReq on the last) with IP/UDP checksums and the ICRC, written straight
 * into an AF_XDP socket's UMEM and queued in batches. */
#ifndef METAROCE_ROCE_TX_H
#define METAROCE_ROCE_TX_H

#include <stdint.h>

struct mr_xsk;

/* Everything the headers of one QP's packets need. */
struct mr_roce_flow {
    uint8_t dmac[6];
    uint8_t smac[6];
    uint8_t ipv6;          /* 0: IPv4, 1: IPv6 */
    uint8_t tos;           /* DSCP << 2 | ECN */
    uint8_t ttl;
    uint8_t pad;
    uint8_t src_ip[16];    /* IPv4 uses the first 4 bytes */
    uint8_t dst_ip[16];
    uint16_t sport;        /* UDP source port: the flow's entropy */
    uint16_t pkey;
    uint32_t dqpn;
};

/* Continue sending the WRITE of `len` bytes at `data` to (va, rkey) whose first packet has
 * PSN psn0. *offset is how much of it is already queued; it advances. Returns the number of
 * packets queued by this call (0 when the rings are full: reap completions and call again). */
uint32_t mr_send_write(struct mr_xsk *x, const struct mr_roce_flow *f, const uint8_t *data,
                       uint64_t len, uint32_t pmtu, uint32_t psn0, uint64_t va, uint32_t rkey,
                       uint64_t *offset);

/* Build packet idx of that WRITE into out (cap bytes); returns its length, 0 if it does not fit
 * or idx is past the end. */
uint32_t mr_roce_build_write(uint8_t *out, uint32_t cap, const struct mr_roce_flow *f,
                             const uint8_t *data, uint64_t len, uint32_t pmtu, uint32_t psn0,
                             uint64_t va, uint32_t rkey, uint64_t idx);

/* The RoCEv2 ICRC of a complete frame (Ethernet header first, ICRC field last). */
uint32_t mr_roce_icrc(const uint8_t *frame, uint32_t len);

#endif
