/* Message segmentation into RoCEv2 frames, built in place in the UMEM. */
#include <isa-l/crc.h>
#include <string.h>
#include <time.h>

#include "roce_tx.h"
#include "xsk.h"

#define ETH_LEN 14
#define UDP_LEN 8
#define BTH_LEN 12
#define RETH_LEN 16
#define AETH_LEN 4
#define ATOMICETH_LEN 28
#define ICRC_LEN 4
#define ROCE_PORT 4791
#define ACKREQ_EVERY 64        /* AckReq at least every 64 packets of a long message (RESP-1) */
#define PETH_LEN 20
#define MAX_EXT 48             /* the longest extension headers a packet carries (PETH+AtomicETH) */
#define MR_OP 0xC0             /* MetaRoCE opcode = MR_OP | the RC opcode of the same meaning */
#define PETH_RETX 0x80
#define PETH_ACK_NOW 0x40

enum {
    RC_SEND_FIRST = 0x00,
    RC_SEND_MIDDLE = 0x01,
    RC_SEND_LAST = 0x02,
    RC_SEND_LAST_IMM = 0x03,
    RC_SEND_ONLY = 0x04,
    RC_SEND_ONLY_IMM = 0x05,
    RC_RDMA_WRITE_FIRST = 0x06,
    RC_RDMA_WRITE_MIDDLE = 0x07,
    RC_RDMA_WRITE_LAST = 0x08,
    RC_RDMA_WRITE_LAST_IMM = 0x09,
    RC_RDMA_WRITE_ONLY = 0x0A,
    RC_RDMA_WRITE_ONLY_IMM = 0x0B,
    RC_RDMA_READ_REQUEST = 0x0C,
    RC_RDMA_READ_RESPONSE_FIRST = 0x0D,
    RC_RDMA_READ_RESPONSE_MIDDLE = 0x0E,
    RC_RDMA_READ_RESPONSE_LAST = 0x0F,
    RC_RDMA_READ_RESPONSE_ONLY = 0x10,
    RC_ACKNOWLEDGE = 0x11,
    RC_COMPARE_SWAP = 0x13,
    RC_FETCH_ADD = 0x14,
};

static void put16(uint8_t *p, uint16_t v) { p[0] = v >> 8; p[1] = v; }
static void put32(uint8_t *p, uint32_t v) { p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v; }
static void put64(uint8_t *p, uint64_t v) { put32(p, v >> 32); put32(p + 4, (uint32_t)v); }

/* RFC 1071's sum is byte-order independent (section 2B): summed in the CPU's own order and
 * byte-swapped once at the end it is the sum of the big-endian words. So the sum is taken over
 * native words, 32 bytes at a time with AVX2 where the CPU has it (16-bit halves of 32-bit
 * lanes added into 32-bit lanes: no carry is lost within MR_SUM_BLOCK bytes), else 8 at a time,
 * and the payload of a frame is summed in the same pass that copies it into the frame
 * (mr_copy_sum): one pass over the bytes instead of two. */
#define MR_SUM_BLOCK (1u << 20)          /* 32-byte steps adding < 2^17 a lane: < 2^15 steps */

/* The native-order sum of the n bytes at s (any n, any alignment) into a 64-bit accumulator,
 * copied to d as well when d is not NULL (d and s do not overlap). */
static uint64_t sum_tail(uint8_t *d, const uint8_t *s, size_t n, uint64_t acc)
{
    for (; n >= 8; n -= 8, s += 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        if (d) {
            memcpy(d, &w, 8);
            d += 8;
        }
        acc += (w & 0xffffffffu) + (w >> 32);
    }
    if (n) {                              /* the last bytes, zero-padded to a word */
        uint64_t w = 0;
        memcpy(&w, s, n);
        if (d)
            memcpy(d, s, n);
        acc += (w & 0xffffffffu) + (w >> 32);
    }
    return acc;
}

#if defined(__x86_64__)
#include <immintrin.h>

__attribute__((target("avx2")))
static uint64_t sum_avx2(uint8_t *d, const uint8_t *s, size_t n)
{
    const __m256i lo16 = _mm256_set1_epi32(0xffff);
    uint64_t acc = 0;
    while (n >= 64) {
        size_t block = n < MR_SUM_BLOCK ? n : MR_SUM_BLOCK;
        __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
        size_t i = 0;
        for (; i + 64 <= block; i += 64) {
            __m256i v0 = _mm256_loadu_si256((const __m256i *)(s + i));
            __m256i v1 = _mm256_loadu_si256((const __m256i *)(s + i + 32));
            if (d) {
                _mm256_storeu_si256((__m256i *)(d + i), v0);
                _mm256_storeu_si256((__m256i *)(d + i + 32), v1);
            }
            a0 = _mm256_add_epi32(a0, _mm256_add_epi32(_mm256_and_si256(v0, lo16),
                                                       _mm256_srli_epi32(v0, 16)));
            a1 = _mm256_add_epi32(a1, _mm256_add_epi32(_mm256_and_si256(v1, lo16),
                                                       _mm256_srli_epi32(v1, 16)));
        }
        uint32_t l[16];
        _mm256_storeu_si256((__m256i *)l, a0);
        _mm256_storeu_si256((__m256i *)(l + 8), a1);
        for (int k = 0; k < 16; k++)
            acc += l[k];
        s += i;
        if (d)
            d += i;
        n -= i;
    }
    return sum_tail(d, s, n, acc);
}
#endif

static uint64_t copy_sum(uint8_t *d, const uint8_t *s, size_t n)
{
#if defined(__x86_64__)
    static int avx2 = -1;
    if (avx2 < 0)
        avx2 = __builtin_cpu_supports("avx2") ? 1 : 0;
    if (avx2 && n >= 64)
        return sum_avx2(d, s, n);
#endif
    return sum_tail(d, s, n, 0);
}

/* A ones' complement sum folded to 16 bits. */
static uint32_t fold16(uint64_t acc)
{
    while (acc >> 16)
        acc = (acc & 0xffff) + (acc >> 16);
    return (uint32_t)acc;
}

/* A native-order sum folded and put in network order (RFC 1071 2B). */
static uint32_t fold_be(uint64_t acc)
{
    return __builtin_bswap16((uint16_t)fold16(acc));
}

uint32_t mr_csum16(const uint8_t *p, uint32_t n, uint32_t seed)
{
    return fold16((uint64_t)seed + fold_be(copy_sum(NULL, p, n)));
}

uint32_t mr_copy_sum(uint8_t *dst, const uint8_t *src, uint32_t n)
{
    return fold_be(copy_sum(dst, src, n));
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

/* The BTH fields of one packet, and the UDP source port it goes out on. */
struct bth_fields {
    uint16_t sport;
    uint8_t opcode;
    uint8_t ackreq;
    uint8_t solicited;
    uint32_t dqpn;
    uint32_t psn;
};

/* UDP length (UDP header to ICRC) of a packet with elen bytes of extension headers and plen of
 * payload, and the whole frame's. */
static uint64_t l4_len(uint32_t elen, uint32_t plen)
{
    return (uint64_t)UDP_LEN + BTH_LEN + elen + plen + ((4 - (plen & 3)) & 3) + ICRC_LEN;
}

static uint64_t frame_len(const struct mr_roce_flow *f, uint32_t elen, uint32_t plen)
{
    return ETH_LEN + (f->ipv6 ? 40 : 20) + l4_len(elen, plen);
}

/* Write one frame: headers, ext (extension headers, elen bytes), payload; returns its length.
 * The caller checked that it fits (frame_len). Both the message builders (mr_roce_build) and
 * the descriptor builder (mr_build_pkt) come here. */
static uint32_t build_frame(uint8_t *p, const struct mr_roce_flow *f, const struct bth_fields *b,
                            const uint8_t *ext, uint32_t elen, const uint8_t *payload, uint32_t plen)
{
    uint32_t pad = (4 - (plen & 3)) & 3;
    uint32_t ihl = f->ipv6 ? 40 : 20;
    uint32_t l4 = (uint32_t)l4_len(elen, plen);
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
        put16(ip + 10, ~mr_csum16(ip, 20, 0) & 0xffff);
    }
    put16(udp, b->sport);
    put16(udp + 2, ROCE_PORT);
    put16(udp + 4, l4);
    put16(udp + 6, 0);
    bth[0] = b->opcode;
    bth[1] = (b->solicited ? 0x80 : 0) | pad << 4;      /* MigReq 0, TVer 0 */
    put16(bth + 2, f->pkey);
    put32(bth + 4, b->dqpn & 0xffffff);
    put32(bth + 8, (b->ackreq ? 0x80000000u : 0) | (b->psn & 0xffffff));
    uint8_t *q = bth + BTH_LEN;
    if (elen) {
        memcpy(q, ext, elen);
        q += elen;
    }
    /* IPv6 needs the UDP checksum; a CSUM peer checks it. The payload is summed as it is
     * copied, from its own start (q) */
    int sum = f->ipv6 || f->csum;
    uint32_t psum = 0;
    if (plen && sum)
        psum = mr_copy_sum(q, payload, plen);
    else if (plen)
        memcpy(q, payload, plen);
    memset(q + plen, 0, pad);
    uint32_t icrc = mr_roce_icrc(p, total);
    uint8_t *ic = p + total - ICRC_LEN;
    ic[0] = icrc;
    ic[1] = icrc >> 8;
    ic[2] = icrc >> 16;
    ic[3] = icrc >> 24;
    if (sum) {
        uint32_t s = f->ipv6 ? mr_csum16(ip + 8, 32, 0) : mr_csum16(ip + 12, 8, 0);
        /* payload, pad (zeros) and ICRC summed from q: the ICRC is a multiple of 4 bytes past
         * it. Taken from an odd offset of the datagram such a sum is byte-swapped (RFC 1071
         * 2B); every header is a multiple of 4 bytes, so q's offset is even when we send */
        uint32_t h = (uint32_t)(q - udp), tail = mr_csum16(ic, ICRC_LEN, psum);
        if (h & 1)
            tail = __builtin_bswap16((uint16_t)tail);
        s = mr_csum16(udp, h, s + l4 + 17 + tail);                /* UDP header .. extensions */
        uint16_t c = ~s & 0xffff;
        put16(udp + 6, c ? c : 0xffff);
    }
    return total;
}

/* A message packet: to the flow's QP (f->dqpn). */
static uint32_t build(uint8_t *p, const struct mr_roce_flow *f, uint16_t sport, uint8_t opcode, uint32_t psn,
                      int ackreq, int solicited, const uint8_t *ext, uint32_t elen,
                      const uint8_t *payload, uint32_t plen)
{
    struct bth_fields b = {.sport = sport, .opcode = opcode, .ackreq = ackreq != 0,
                           .solicited = solicited != 0, .dqpn = f->dqpn, .psn = psn};
    return build_frame(p, f, &b, ext, elen, payload, plen);
}

static int carries_payload(const struct mr_roce_msg *m)
{
    return m->kind == MR_MSG_WRITE || m->kind == MR_MSG_SEND || m->kind == MR_MSG_READ_RESP;
}

uint32_t mr_msg_packets(const struct mr_roce_msg *m)
{
    if (!carries_payload(m) || m->len == 0 || m->pmtu == 0)
        return 1;
    return (uint32_t)((m->len + m->pmtu - 1) / m->pmtu);
}

/* PETH (EXT-5): path, flags, 2 reserved bytes, SSN, RSN, the packet's offset in the message, the
 * sender's timestamp (ns mod 2^32). */
static uint32_t peth(uint8_t *p, uint8_t path, uint8_t flags, uint32_t ssn, uint32_t rsn,
                     uint32_t off, uint32_t ts)
{
    p[0] = path;
    p[1] = flags;
    p[2] = p[3] = 0;
    put32(p + 4, ssn & 0xffffff);
    put32(p + 8, rsn & 0xffffff);
    put32(p + 12, off);
    put32(p + 16, ts);
    return PETH_LEN;
}

/* The PETH of a message packet, stamped now. */
static uint32_t put_peth(uint8_t *p, const struct mr_roce_msg *m, uint8_t path, uint64_t off,
                         int ack_now)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    /* a retransmission asks for an immediate SACK: its first copy's SACK may be what was lost */
    uint8_t flags = m->retx ? PETH_RETX | PETH_ACK_NOW : ack_now ? PETH_ACK_NOW : 0;
    return peth(p, path, flags, m->ssn, m->rsn, (uint32_t)off,
                (uint32_t)(ts.tv_sec * 1000000000ull + ts.tv_nsec));
}

/* Packet idx of message m in MetaRoCE form (spec 5.1): every packet carries a PETH; every WRITE
 * packet the message's RETH; READ responses carry no AETH (the PETH echoes the SSN). */
static uint32_t build_mr(uint8_t *out, struct mr_roce_flow *f, const struct mr_roce_msg *m,
                         uint32_t idx, int first, int last, int imm, uint64_t off,
                         const uint8_t *payload, uint32_t plen)
{
    uint8_t ext[MAX_EXT], op;
    uint32_t elen;
    int edge = m->ack_at && idx + 1 == m->ack_at;   /* the window's / credit's last packet */
    uint8_t path = m->path;
    uint16_t sport = f->sport;
    if (f->npaths) {                                /* MP-1/MP-3: spray per packet */
        uint32_t psn = (carries_payload(m) ? m->psn0 + idx : m->psn0) & 0xffffff;
        path = (uint8_t)((psn + m->retx) % (f->npaths > 8 ? 8 : f->npaths));
        sport = f->sports[path];
        f->path_pkts[path]++;
    }
    int ackreq = last || edge || (idx + 1) % ACKREQ_EVERY == 0;
    switch (m->kind) {
    case MR_MSG_WRITE:
        op = first && last ? (imm ? RC_RDMA_WRITE_ONLY_IMM : RC_RDMA_WRITE_ONLY)
           : first ? RC_RDMA_WRITE_FIRST : last ? (imm ? RC_RDMA_WRITE_LAST_IMM : RC_RDMA_WRITE_LAST)
           : RC_RDMA_WRITE_MIDDLE;
        elen = put_peth(ext, m, path, off, edge);
        put64(ext + elen, m->va);
        put32(ext + elen + 8, m->rkey);
        put32(ext + elen + 12, (uint32_t)m->len);
        elen += RETH_LEN;
        break;
    case MR_MSG_SEND:
        op = first && last ? (imm ? RC_SEND_ONLY_IMM : RC_SEND_ONLY)
           : first ? RC_SEND_FIRST : last ? (imm ? RC_SEND_LAST_IMM : RC_SEND_LAST) : RC_SEND_MIDDLE;
        elen = put_peth(ext, m, path, off, edge);
        break;
    case MR_MSG_READ_RESP:
        op = first && last ? RC_RDMA_READ_RESPONSE_ONLY : first ? RC_RDMA_READ_RESPONSE_FIRST
           : last ? RC_RDMA_READ_RESPONSE_LAST : RC_RDMA_READ_RESPONSE_MIDDLE;
        elen = put_peth(ext, m, path, off, 0);
        return build(out, f, sport, MR_OP | op, m->psn0 + idx, 0, 0, ext, elen, payload, plen);
    case MR_MSG_READ_REQ:
        elen = put_peth(ext, m, path, 0, 0);
        put64(ext + elen, m->va);
        put32(ext + elen + 8, m->rkey);
        put32(ext + elen + 12, (uint32_t)m->len);
        return build(out, f, sport, MR_OP | RC_RDMA_READ_REQUEST, m->psn0, 1, 0, ext, elen + RETH_LEN,
                     NULL, 0);
    case MR_MSG_CMP_SWAP:
    case MR_MSG_FETCH_ADD:
        elen = put_peth(ext, m, path, 0, 0);
        put64(ext + elen, m->va);
        put32(ext + elen + 8, m->rkey);
        put64(ext + elen + 12, m->swap_add);
        put64(ext + elen + 20, m->compare);
        return build(out, f, sport, MR_OP | (m->kind == MR_MSG_CMP_SWAP ? RC_COMPARE_SWAP : RC_FETCH_ADD),
                     m->psn0, 1, 0, ext, elen + ATOMICETH_LEN, NULL, 0);
    default:
        return 0;
    }
    if (imm) {
        put32(ext + elen, m->imm);
        elen += 4;
    }
    return build(out, f, sport, MR_OP | op, m->psn0 + idx, ackreq, last && m->solicited, ext, elen,
                 payload, plen);
}

uint32_t mr_roce_build(uint8_t *out, uint32_t cap, struct mr_roce_flow *f,
                       const struct mr_roce_msg *m, const uint8_t *data, uint32_t idx)
{
    uint32_t npkts = mr_msg_packets(m);
    if (idx >= npkts || ETH_LEN + 40 + UDP_LEN + BTH_LEN + MAX_EXT + m->pmtu + 3 + ICRC_LEN > cap)
        return 0;
    int first = idx == 0, last = idx == npkts - 1;
    uint8_t ext[MAX_EXT], op;
    uint32_t elen = 0, plen = 0;
    const uint8_t *payload = NULL;
    uint64_t off = (uint64_t)idx * m->pmtu;
    if (carries_payload(m)) {
        plen = m->len - off < m->pmtu ? (uint32_t)(m->len - off) : m->pmtu;
        payload = data + off;
    }
    int imm = m->with_imm && last;
    if (m->metaroce)
        return build_mr(out, f, m, idx, first, last, imm, off, payload, plen);
    switch (m->kind) {
    case MR_MSG_WRITE:
        op = first && last ? (imm ? RC_RDMA_WRITE_ONLY_IMM : RC_RDMA_WRITE_ONLY)
           : first ? RC_RDMA_WRITE_FIRST : last ? (imm ? RC_RDMA_WRITE_LAST_IMM : RC_RDMA_WRITE_LAST)
           : RC_RDMA_WRITE_MIDDLE;
        if (first) {
            put64(ext, m->va);
            put32(ext + 8, m->rkey);
            put32(ext + 12, (uint32_t)m->len);
            elen = RETH_LEN;
        }
        break;
    case MR_MSG_SEND:
        op = first && last ? (imm ? RC_SEND_ONLY_IMM : RC_SEND_ONLY)
           : first ? RC_SEND_FIRST : last ? (imm ? RC_SEND_LAST_IMM : RC_SEND_LAST) : RC_SEND_MIDDLE;
        break;
    case MR_MSG_READ_RESP:
        op = first && last ? RC_RDMA_READ_RESPONSE_ONLY : first ? RC_RDMA_READ_RESPONSE_FIRST
           : last ? RC_RDMA_READ_RESPONSE_LAST : RC_RDMA_READ_RESPONSE_MIDDLE;
        if (first || last) {
            put32(ext, 0x1F000000u | (m->msn & 0xffffff));   /* ACK, credits invalid */
            elen = AETH_LEN;
        }
        return build(out, f, f->sport, op, m->psn0 + idx, 0, 0, ext, elen, payload, plen);
    case MR_MSG_READ_REQ:
        put64(ext, m->va);
        put32(ext + 8, m->rkey);
        put32(ext + 12, (uint32_t)m->len);
        return build(out, f, f->sport, RC_RDMA_READ_REQUEST, m->psn0, 1, 0, ext, RETH_LEN, NULL, 0);
    case MR_MSG_CMP_SWAP:
    case MR_MSG_FETCH_ADD:
        put64(ext, m->va);
        put32(ext + 8, m->rkey);
        put64(ext + 12, m->swap_add);
        put64(ext + 20, m->compare);
        return build(out, f, f->sport, m->kind == MR_MSG_CMP_SWAP ? RC_COMPARE_SWAP : RC_FETCH_ADD,
                     m->psn0, 1, 0, ext, ATOMICETH_LEN, NULL, 0);
    default:
        return 0;
    }
    if (imm) {
        put32(ext + elen, m->imm);
        elen += 4;
    }
    int ackreq = last || (idx + 1) % ACKREQ_EVERY == 0;
    return build(out, f, f->sport, op, m->psn0 + idx, ackreq, last && m->solicited, ext, elen, payload, plen);
}

uint32_t mr_send_msg(struct mr_xsk *x, struct mr_roce_flow *f, const struct mr_roce_msg *m,
                     const uint8_t *data, uint32_t *next)
{
    return mr_send_range(x, f, m, data, next, mr_msg_packets(m));
}

uint32_t mr_send_range(struct mr_xsk *x, struct mr_roce_flow *f, const struct mr_roce_msg *m,
                       const uint8_t *data, uint32_t *next, uint32_t end)
{
    uint32_t room = mr_xsk_tx_room(x), queued = 0, npkts = mr_msg_packets(m);
    if (end < npkts)
        npkts = end;
    while (room-- && *next < npkts) {
        uint32_t cap;
        uint8_t *frame = mr_xsk_tx_frame(x, &cap);
        uint32_t flen = mr_roce_build(frame, cap, f, m, data, *next);
        if (!flen)
            break;                     /* the caller picked a PMTU larger than a frame */
        mr_xsk_tx_commit(x, flen);
        (*next)++;
        queued++;
    }
    if (queued)
        mr_xsk_kick(x);
    return queued;
}

static void write_msg(struct mr_roce_msg *m, uint64_t len, uint32_t pmtu, uint32_t psn0,
                      uint64_t va, uint32_t rkey)
{
    memset(m, 0, sizeof(*m));
    m->kind = MR_MSG_WRITE;
    m->len = len;
    m->pmtu = pmtu;
    m->psn0 = psn0;
    m->va = va;
    m->rkey = rkey;
}

uint32_t mr_roce_build_write(uint8_t *out, uint32_t cap, struct mr_roce_flow *f,
                             const uint8_t *data, uint64_t len, uint32_t pmtu, uint32_t psn0,
                             uint64_t va, uint32_t rkey, uint64_t idx)
{
    struct mr_roce_msg m;
    write_msg(&m, len, pmtu, psn0, va, rkey);
    return idx > 0xffffffffu ? 0 : mr_roce_build(out, cap, f, &m, data, (uint32_t)idx);
}

uint32_t mr_send_write(struct mr_xsk *x, struct mr_roce_flow *f, const uint8_t *data,
                       uint64_t len, uint32_t pmtu, uint32_t psn0, uint64_t va, uint32_t rkey,
                       uint64_t *offset)
{
    struct mr_roce_msg m;
    write_msg(&m, len, pmtu, psn0, va, rkey);
    uint32_t next = (uint32_t)(*offset / pmtu);
    uint32_t n = mr_send_msg(x, f, &m, data, &next);
    uint64_t done = (uint64_t)next * pmtu;
    *offset = len ? (done < len ? done : len) : next;
    return n;
}

/* ---- one engine packet descriptor (struct mre_pkt, metaroce/cengine/mre.h) ---- */

/* The extension headers (MRE_H_*) opcode carries on the wire, in either mode
 * (metaroce/wire/layout.py), and whether a payload may follow; -1: not an opcode built here. */
static int desc_layout(uint8_t opcode, uint8_t *hdrs, int *payload)
{
    int mr;
    if (opcode <= RC_FETCH_ADD)
        mr = 0;
    else if (opcode >= MR_OP && opcode <= (MR_OP | RC_FETCH_ADD))
        mr = 1;
    else
        return -1;
    uint8_t h = 0;
    *payload = 1;
    switch (opcode & ~MR_OP) {
    case RC_SEND_FIRST:
    case RC_SEND_MIDDLE:
    case RC_SEND_LAST:
    case RC_SEND_ONLY:
    case RC_RDMA_READ_RESPONSE_MIDDLE:
        break;
    case RC_SEND_LAST_IMM:
    case RC_SEND_ONLY_IMM:
        h = MRE_H_IMM;
        break;
    case RC_RDMA_WRITE_FIRST:
    case RC_RDMA_WRITE_ONLY:
        h = MRE_H_RETH;
        break;
    case RC_RDMA_WRITE_MIDDLE:
    case RC_RDMA_WRITE_LAST:
        h = mr ? MRE_H_RETH : 0;                  /* MetaRoCE: the RETH on every WRITE packet */
        break;
    case RC_RDMA_WRITE_LAST_IMM:
        h = mr ? MRE_H_RETH | MRE_H_IMM : MRE_H_IMM;
        break;
    case RC_RDMA_WRITE_ONLY_IMM:
        h = MRE_H_RETH | MRE_H_IMM;
        break;
    case RC_RDMA_READ_REQUEST:
        h = MRE_H_RETH;
        *payload = 0;
        break;
    case RC_RDMA_READ_RESPONSE_FIRST:
    case RC_RDMA_READ_RESPONSE_LAST:
    case RC_RDMA_READ_RESPONSE_ONLY:
        h = mr ? 0 : MRE_H_AETH;                  /* MetaRoCE: the PETH echoes the SSN instead */
        break;
    case RC_ACKNOWLEDGE:
        if (mr)
            return -1;                            /* 0xD1 is MR_SACK (SACKETH): not built here */
        h = MRE_H_AETH;
        *payload = 0;
        break;
    case RC_COMPARE_SWAP:
    case RC_FETCH_ADD:
        h = MRE_H_ATOMIC;
        *payload = 0;
        break;
    default:
        return -1;                                /* ATOMIC ACKNOWLEDGE, reserved opcodes */
    }
    *hdrs = h | (mr ? MRE_H_PETH : 0);
    return mr;
}

static int is_read_response(uint8_t opcode)
{
    uint8_t op = opcode & ~MR_OP;
    return op >= RC_RDMA_READ_RESPONSE_FIRST && op <= RC_RDMA_READ_RESPONSE_ONLY;
}

uint32_t mr_build_pkt(uint8_t *out, uint32_t cap, struct mr_roce_flow *f, const struct mre_pkt *p)
{
    uint8_t want, has = p->has, ext[MAX_EXT];
    int payload;
    int mr = desc_layout(p->opcode, &want, &payload);
    if (mr < 0)
        return 0;
    /* the engine names an AETH (syndrome, MSN) on MetaRoCE READ responses too (the simulator
     * reads it); their wire form has none (spec 5.1), so it is left out */
    if (mr && is_read_response(p->opcode))
        has &= (uint8_t)~MRE_H_AETH;
    if (has != want || (p->len && (!payload || !p->data)))
        return 0;                                 /* headers the opcode does not carry / lacks */
    uint32_t e = 0;
    if (has & MRE_H_PETH) {
        uint8_t fl = (p->flags & MRE_PF_RETX ? PETH_RETX : 0) |
                     (p->flags & (MRE_PF_ACK_REQ | MRE_PF_RETX) ? PETH_ACK_NOW : 0);
        e += peth(ext, p->path, fl, p->ssn, p->rsn, p->offset, p->ts);
    }
    if (has & MRE_H_RETH) {
        put64(ext + e, p->reth_va);
        put32(ext + e + 8, p->reth_rkey);
        put32(ext + e + 12, p->reth_len);
        e += RETH_LEN;
    }
    if (has & MRE_H_ATOMIC) {
        put64(ext + e, p->atomic_va);
        put32(ext + e + 8, p->atomic_rkey);
        put64(ext + e + 12, p->swap_add);
        put64(ext + e + 20, p->compare);
        e += ATOMICETH_LEN;
    }
    if (has & MRE_H_AETH) {
        put32(ext + e, (p->syndrome & 0xffu) << 24 | (p->msn & 0xffffff));
        e += AETH_LEN;
    }
    if (has & MRE_H_IMM) {
        put32(ext + e, p->imm);
        e += 4;
    }
    uint64_t total = frame_len(f, e, p->len), l4 = l4_len(e, p->len);
    if (total > cap || l4 > 0xffff - (f->ipv6 ? 0 : 20))   /* IPv4 total / UDP length: 16 bits */
        return 0;
    uint8_t op = p->opcode & ~MR_OP;
    int send_last = op >= RC_SEND_LAST && op <= RC_SEND_ONLY_IMM;
    struct bth_fields b = {.sport = p->sport, .opcode = p->opcode,
                           .ackreq = (p->flags & MRE_PF_ACK_REQ) != 0,
                           .solicited = send_last && (p->se & 1),
                           .dqpn = p->dest_qp, .psn = p->psn};
    uint32_t n = build_frame(out, f, &b, ext, e, p->data, p->len);
    f->path_pkts[p->path & 7]++;
    return n;
}

uint32_t mr_send_pkts(struct mr_xsk *x, struct mr_roce_flow *const *flows, const struct mre_pkt *p,
                      uint32_t n, uint32_t *bad)
{
    uint32_t room = mr_xsk_tx_room(x), done = 0, queued = 0, nbad = 0;
    while (done < n && room) {
        uint32_t cap;
        uint8_t *frame = mr_xsk_tx_frame(x, &cap);  /* the same frame again if not committed */
        uint32_t flen = flows[done] ? mr_build_pkt(frame, cap, flows[done], &p[done]) : 0;
        done++;
        if (!flen) {
            nbad++;
            continue;
        }
        mr_xsk_tx_commit(x, flen);
        queued++;
        room--;
    }
    if (queued)
        mr_xsk_kick(x);
    if (bad)
        *bad += nbad;
    return done;
}
