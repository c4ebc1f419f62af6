/* RDMA WRITE segmentation into RoCEv2 frames, built in place in the UMEM. */
#include <isa-l/crc.h>
#include <string.h>

#include "roce_tx.h"
#include "xsk.h"

#define ETH_LEN 14
#define UDP_LEN 8
#define BTH_LEN 12
#define RETH_LEN 16
#define ICRC_LEN 4
#define ROCE_PORT 4791

enum {
    RC_RDMA_WRITE_FIRST = 0x06,
    RC_RDMA_WRITE_MIDDLE = 0x07,
    RC_RDMA_WRITE_LAST = 0x08,
    RC_RDMA_WRITE_ONLY = 0x0A,
};

static void put16(uint8_t *p, uint16_t v) { p[0] = v >> 8; p[1] = v; }
static void put32(uint8_t *p, uint32_t v) { p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v; }
static void put64(uint8_t *p, uint64_t v) { put32(p, v >> 32); put32(p + 4, (uint32_t)v); }

static uint32_t sum16(const uint8_t *p, uint32_t n, uint32_t s)
{
    uint64_t acc = s;
    for (; n >= 2; n -= 2, p += 2)
        acc += (uint32_t)p[0] << 8 | p[1];
    if (n)
        acc += (uint32_t)p[0] << 8;
    while (acc >> 16)
        acc = (acc & 0xffff) + (acc >> 16);
    return (uint32_t)acc;
}

uint32_t mr_roce_icrc(const uint8_t *frame, uint32_t len)
{
    /* 8 bytes of 0xFF, then the IP header onward with the variant fields masked to ones */
    static const uint8_t ones[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    uint8_t hdr[40 + UDP_LEN + BTH_LEN];
    int v6 = frame[12] == 0x86 && frame[13] == 0xdd;
    uint32_t ihl = v6 ? 40 : 20, hl = ihl + UDP_LEN + BTH_LEN;
    memcpy(hdr, frame + ETH_LEN, hl);
    if (v6) {
        hdr[0] |= 0x0f;
        hdr[1] = hdr[2] = hdr[3] = 0xff;
        hdr[7] = 0xff;
    } else {
        hdr[1] = 0xff;
        hdr[8] = 0xff;
        hdr[10] = hdr[11] = 0xff;
    }
    hdr[ihl + 6] = hdr[ihl + 7] = 0xff;
    hdr[ihl + UDP_LEN + 4] = 0xff;
    uint32_t crc = crc32_gzip_refl(0, ones, 8);
    crc = crc32_gzip_refl(crc, hdr, hl);
    uint32_t rest = ETH_LEN + hl;
    return crc32_gzip_refl(crc, frame + rest, len - rest - ICRC_LEN);
}

/* Write one frame; returns its length. */
static uint32_t build(uint8_t *p, const struct mr_roce_flow *f, uint8_t opcode, uint32_t psn,
                      int ackreq, const uint8_t *reth, const uint8_t *payload, uint32_t plen)
{
    uint32_t pad = (4 - (plen & 3)) & 3;
    uint32_t ihl = f->ipv6 ? 40 : 20;
    uint32_t l4 = UDP_LEN + BTH_LEN + (reth ? RETH_LEN : 0) + plen + pad + ICRC_LEN;
    uint32_t total = ETH_LEN + ihl + l4;
    memcpy(p, f->dmac, 6);
    memcpy(p + 6, f->smac, 6);
    uint8_t *ip = p + ETH_LEN, *udp = ip + ihl, *bth = udp + UDP_LEN;
    if (f->ipv6) {
        put16(p + 12, 0x86dd);
        put32(ip, 6u << 28 | (uint32_t)f->tos << 20);
        put16(ip + 4, l4);
        ip[6] = 17;
        ip[7] = f->ttl;
        memcpy(ip + 8, f->src_ip, 16);
        memcpy(ip + 24, f->dst_ip, 16);
    } else {
        put16(p + 12, 0x0800);
        ip[0] = 0x45;
        ip[1] = f->tos;
        put16(ip + 2, ihl + l4);
        put32(ip + 4, 0x00004000);      /* id 0, DF */
        ip[8] = f->ttl;
        ip[9] = 17;
        put16(ip + 10, 0);
        memcpy(ip + 12, f->src_ip, 4);
        memcpy(ip + 16, f->dst_ip, 4);
        put16(ip + 10, ~sum16(ip, 20, 0) & 0xffff);
    }
    put16(udp, f->sport);
    put16(udp + 2, ROCE_PORT);
    put16(udp + 4, l4);
    put16(udp + 6, 0);
    bth[0] = opcode;
    bth[1] = pad << 4;
    put16(bth + 2, f->pkey);
    put32(bth + 4, f->dqpn & 0xffffff);
    put32(bth + 8, (ackreq ? 0x80000000u : 0) | (psn & 0xffffff));
    uint8_t *q = bth + BTH_LEN;
    if (reth) {
        memcpy(q, reth, RETH_LEN);
        q += RETH_LEN;
    }
    memcpy(q, payload, plen);
    memset(q + plen, 0, pad);
    uint32_t icrc = mr_roce_icrc(p, total);
    uint8_t *ic = p + total - ICRC_LEN;
    ic[0] = icrc;
    ic[1] = icrc >> 8;
    ic[2] = icrc >> 16;
    ic[3] = icrc >> 24;
    if (f->ipv6) {                     /* IPv6 needs the UDP checksum */
        uint32_t s = sum16(ip + 8, 32, 0);
        s = sum16(udp, l4, s + l4 + 17);
        uint16_t c = ~s & 0xffff;
        put16(udp + 6, c ? c : 0xffff);
    }
    return total;
}

uint32_t mr_roce_build_write(uint8_t *out, uint32_t cap, const struct mr_roce_flow *f,
                             const uint8_t *data, uint64_t len, uint32_t pmtu, uint32_t psn0,
                             uint64_t va, uint32_t rkey, uint64_t idx)
{
    uint64_t npkts = len ? (len + pmtu - 1) / pmtu : 1;
    if (idx >= npkts || ETH_LEN + 40 + UDP_LEN + BTH_LEN + RETH_LEN + pmtu + 3 + ICRC_LEN > cap)
        return 0;
    uint64_t off = idx * pmtu;
    uint32_t plen = len - off < pmtu ? (uint32_t)(len - off) : pmtu;
    int first = idx == 0, last = idx == npkts - 1;
    uint8_t op = first && last ? RC_RDMA_WRITE_ONLY : first ? RC_RDMA_WRITE_FIRST
               : last ? RC_RDMA_WRITE_LAST : RC_RDMA_WRITE_MIDDLE;
    uint8_t reth[RETH_LEN];
    put64(reth, va);
    put32(reth + 8, rkey);
    put32(reth + 12, (uint32_t)len);
    return build(out, f, op, psn0 + (uint32_t)idx, last, first ? reth : NULL, data + off, plen);
}

uint32_t mr_send_write(struct mr_xsk *x, const struct mr_roce_flow *f, const uint8_t *data,
                       uint64_t len, uint32_t pmtu, uint32_t psn0, uint64_t va, uint32_t rkey,
                       uint64_t *offset)
{
    uint32_t room = mr_xsk_tx_room(x), queued = 0;
    uint64_t npkts = len ? (len + pmtu - 1) / pmtu : 1;
    while (room--) {
        uint64_t idx = *offset / pmtu;
        if (idx >= npkts || (len && *offset >= len))
            break;
        uint32_t cap;
        uint8_t *frame = mr_xsk_tx_frame(x, &cap);
        uint32_t flen = mr_roce_build_write(frame, cap, f, data, len, pmtu, psn0, va, rkey, idx);
        if (!flen)
            break;                     /* the caller picked a PMTU larger than a frame */
        mr_xsk_tx_commit(x, flen);
        *offset = len ? (idx + 1) * pmtu < len ? (idx + 1) * pmtu : len : 1;
        queued++;
    }
    if (queued)
        mr_xsk_kick(x);
    return queued;
}
