/* The C transport engine's cost per event, driven the way the daemon's engine thread would
 * drive it (no Python, no kernel): one MetaRoCE requester QP keeps `depth` RDMA WRITEs of
 * `msg_pkts` packets posted; a receiver model takes its packet descriptors, loses the first
 * transmission of a PSN with probability loss_ppm / 1e6 (a deterministic hash: the same PSNs
 * in every contender), taking the packets in the order they were sent (a FIFO wire), and
 * reports what arrived as the XDP program does: one SACK event (cumulative PSN + bitmap) per
 * `ack_every` packets and for every packet asking for one (AckReq / ACK_NOW).
 * Only the time spent inside the engine's calls is counted. Built and run by engine_cost.py:
 *     engine_cost packets=N loss_ppm=P ack_every=K window=W mtu=M msg_pkts=S depth=D paths=N
 * Prints one JSON object. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mre.h"

#define RING 8192                     /* receiver model: PSNs tracked above the cumulative */

static uint64_t arg(int argc, char **argv, const char *key, uint64_t dflt)
{
    size_t n = strlen(key);
    for (int i = 1; i < argc; i++)
        if (!strncmp(argv[i], key, n) && argv[i][n] == '=')
            return strtoull(argv[i] + n + 1, NULL, 10);
    return dflt;
}

static inline uint64_t ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* the loss decision shared with engine_cost.py: splitmix64 of the PSN */
static int lost(uint32_t psn, uint64_t ppm)
{
    uint64_t z = psn + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return z % 1000000 < ppm;
}

int main(int argc, char **argv)
{
    uint64_t packets = arg(argc, argv, "packets", 1000000), ppm = arg(argc, argv, "loss_ppm", 10000);
    uint32_t ack_every = arg(argc, argv, "ack_every", 16), window = arg(argc, argv, "window", 127);
    uint32_t mtu = arg(argc, argv, "mtu", 1024), msg_pkts = arg(argc, argv, "msg_pkts", 64);
    uint32_t depth = arg(argc, argv, "depth", 4), npaths = arg(argc, argv, "paths", 1);
    uint32_t cc = arg(argc, argv, "cc", 1);
    struct mre_engine_cfg ec = {.max_qps = 2, .max_mrs = 1, .out_cap = 4096, .cq_cap = 1024};
    struct mre_engine *e = mre_engine_new(&ec);
    struct mre_qp_cfg qc = {.qpn = 0x11, .mode = MRE_METAROCE, .paths = npaths, .cc = cc,
                            .sq_cap = 64, .rq_cap = 1, .min_rto_ns = 50000, .seed = 1,
                            .cc_line_rate_bps = 10e9, .cc_base_rtt_ns = 20000,
                            .cc_target_qdelay_ns = 10000, .cc_bdp_factor = 1.25,
                            .cc_alpha = 1.0, .cc_beta = 0.8, .cc_max_mdf = 0.5, .cc_enabled = 1};
    int q = mre_qp_new(e, &qc);
    struct mre_qp_attr a = {.dest_qpn = 0x22, .sq_psn = 0xFFFF00, .rq_psn = 0, .path_mtu = mtu,
                            .timeout = 14, .retry_cnt = 7, .rnr_retry = 7, .min_rnr_timer = 1,
                            .max_rd_atomic = 16, .max_dest_rd_atomic = 16, .window = window};
    for (uint32_t st = MRE_INIT; st <= MRE_RTS; st++)
        if (mre_qp_modify(e, q, st, &a) < 0) {
            fprintf(stderr, "engine_cost: modify failed\n");
            return 1;
        }
    uint8_t *buf = calloc(1, (size_t)mtu * msg_pkts);
    struct mre_wqe w = {.opcode = MRE_WR_RDMA_WRITE, .send_flags = MRE_SEND_SIGNALED,
                        .length = mtu * msg_pkts, .remote_addr = 0x1000, .rkey = 7,
                        .local = (uint64_t)(uintptr_t)buf};
    /* the wire: a FIFO of (PSN, flags, timestamp, path) the engine sent */
    static uint32_t f_psn[1 << 16], f_ts[1 << 16];
    static uint8_t f_flags[1 << 16], f_path[1 << 16];
    uint32_t fh = 0, ft = 0, fmask = (1 << 16) - 1;
    static struct mre_pkt out[512];
    static struct mre_cqe cqe[64];
    static uint8_t got[RING];
    uint32_t cum = (a.sq_psn - 1) & 0xFFFFFF;   /* receiver: last PSN with all before it */
    uint64_t t_event = 0, t_sack = 0, t_send = 0, n_events = 0, n_sack = 0, n_desc = 0;
    uint64_t n_retx = 0, delivered = 0, posted = 0, done = 0, since = 0;
    int64_t now = 1000000;
    struct mre_event ev;
    uint64_t t0;
#define TAKE()                                                                    \
    do {                                                                          \
        int n_;                                                                   \
        t0 = ns();                                                                \
        while ((n_ = mre_take_tx(e, out, 512, now)) > 0) {                        \
            t_send += ns() - t0;                                                  \
            for (int i_ = 0; i_ < n_; i_++, ft++) {                               \
                f_psn[ft & fmask] = out[i_].psn;                                  \
                f_flags[ft & fmask] = out[i_].flags;                              \
                f_ts[ft & fmask] = out[i_].ts;                                    \
                f_path[ft & fmask] = out[i_].path;                                \
            }                                                                     \
            n_desc += n_;                                                         \
            t0 = ns();                                                            \
        }                                                                         \
        done += mre_take_cqes(e, cqe, 64);                                        \
        t_send += ns() - t0;                                                      \
    } while (0)
    while (delivered < packets) {
        while (posted - done < depth) {
            w.wr_id = posted++;
            t0 = ns();
            mre_post_send(e, q, &w, now);
            t_send += ns() - t0;
            TAKE();
        }
        if (fh == ft) {                           /* nothing on the wire: the next timer */
            int64_t dl = mre_qp_deadline(e, q);
            if (dl < 0) {
                fprintf(stderr, "engine_cost: stalled\n");
                return 1;
            }
            now = dl > now ? dl : now;
            t0 = ns();
            mre_on_timer(e, q, now);
            t_event += ns() - t0;
            TAKE();
            continue;
        }
        uint32_t psn = f_psn[fh & fmask], ts = f_ts[fh & fmask];
        uint8_t fl = f_flags[fh & fmask], path = f_path[fh & fmask];
        fh++;
        now += 100;                               /* 100 ns of wire per packet */
        int retx = (fl & MRE_PF_RETX) != 0;
        n_retx += retx;
        if (!retx && lost(psn, ppm))
            continue;
        uint32_t d = (psn - cum) & 0xFFFFFF;
        if (d == 0 || d >= RING || got[psn % RING])
            continue;                             /* a duplicate */
        got[psn % RING] = 1;
        delivered++;
        if (!(++since >= ack_every || (fl & MRE_PF_ACK_REQ)))
            continue;
        since = 0;                                /* the responder SACKs (SACK-2) */
        while (got[(cum + 1) % RING]) {           /* the cumulative PSN moves */
            cum = (cum + 1) & 0xFFFFFF;
            got[cum % RING] = 0;
        }
        memset(&ev, 0, sizeof(ev));
        ev.type = MRE_EV_SACK;
        ev.psn = cum;
        ev.syndrome = 0x1F;
        ev.ts_echo = ts;
        ev.path = path;
        for (uint32_t i = 0; i < 128; i++)
            if (got[(cum + 2 + i) % RING])
                ev.sack[i >> 6] |= 1ull << (i & 63);
        int holes = ev.sack[0] || ev.sack[1];
        t0 = ns();
        mre_event(e, q, &ev, now);
        uint64_t t1 = ns();
        t_event += t1 - t0;
        if (holes) {
            t_sack += t1 - t0;
            n_sack++;
        }
        n_events++;
        TAKE();
    }
    uint64_t total = t_event + t_send;
    printf("{\"events\": %llu, \"sack_events\": %llu, \"descriptors\": %llu, "
           "\"retransmissions\": %llu, \"delivered\": %llu, \"completed\": %llu, "
           "\"ns_engine\": %llu, \"ns_in_events\": %llu, \"ns_in_sack_events\": %llu, "
           "\"ns_per_event\": %.1f, \"ns_per_sack_event\": %.1f, \"ns_per_packet\": %.1f}\n",
           (unsigned long long)n_events, (unsigned long long)n_sack,
           (unsigned long long)n_desc, (unsigned long long)n_retx,
           (unsigned long long)delivered, (unsigned long long)done, (unsigned long long)total,
           (unsigned long long)t_event, (unsigned long long)t_sack,
           n_events ? (double)total / n_events : 0.0, n_sack ? (double)t_sack / n_sack : 0.0,
           n_desc ? (double)total / n_desc : 0.0);
    mre_engine_free(e);
    free(buf);
    return 0;
}
