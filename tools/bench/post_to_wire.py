#!/usr/bin/env python3
"""post_send to the first packet on the wire (issue 19). An application on h1 of a lab pair
posts one unsignaled 64-byte RDMA WRITE at a time, reading CLOCK_MONOTONIC just before the
call; an XDP program of this benchmark on h2's port (one lab switch hop away; h2 runs no
MetaRoCE daemon) timestamps the frame with bpf_ktime_get_ns (the same clock) and drops it.
Nothing answers and the QP's ACK timeout is infinite, so nothing is retransmitted.

Three series, each --n samples per run, medians over --runs runs:
  - hot: posts 50 us apart, while the daemon busy-polls its rings;
  - asleep: posts --gap-ms apart, longer than the daemon's busy-poll bound, so it sleeps and
    the post rings its doorbell (an eventfd write, then a cross-CPU wake-up);
  - hop: the floor under both, a frame written on h1 with an AF_PACKET socket (no daemon, no
    verbs) timestamped the same way: the switch hop and the XDP hook themselves.
Also the library's own post_send call (return minus call) and the daemon's loop counters.

    sudo .venv/bin/python tools/bench/post_to_wire.py [--runs 3] [--n 1000] [--json]
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import socket
import struct
import sys
import time

from benchlab import fresh_lab, header, save, summary
from metaroce.fastpath.xsk import _lib
from metaroce.kern import libbpf
from metaroce.lab import core
from metaroce.lab.netdev import in_netns
from metaroce.nic import daemon as d
from metaroce.nic import xdpslot
from metaroce.system import import_bcc
from metaroce.verbs import (CQ, MR, PD, QP, IBV_ACCESS_LOCAL_WRITE, IBV_WR_RDMA_WRITE, Context,
                            QPCap, QPInitAttr, SendWR)

LAB = "bpost"
STAMP = r"""
#include <uapi/linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/in.h>
#include <linux/udp.h>
struct stamp { u64 count; u64 ns; };
BPF_F_TABLE("array", u32, struct stamp, stamps, 1, BPF_F_MMAPABLE);
int xdp_stamp(struct xdp_md *ctx) {
    void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
    struct ethhdr *eth = data;
    if ((void *)(eth + 1) > end || eth->h_proto != htons(ETH_P_IP))
        return XDP_PASS;
    struct iphdr *ip = (void *)(eth + 1);
    if ((void *)(ip + 1) > end || ip->protocol != IPPROTO_UDP || ip->ihl != 5)
        return XDP_PASS;
    struct udphdr *udp = (void *)(ip + 1);
    if ((void *)(udp + 1) > end || udp->dest != htons(4791))
        return XDP_PASS;
    u64 now = bpf_ktime_get_ns();
    u32 k = 0;
    struct stamp *s = stamps.lookup(&k);
    if (s) {
        s->ns = now;
        __sync_fetch_and_add(&s->count, 1);
    }
    return XDP_DROP;
}
"""


class Stamper:
    """The timestamping program on h2's eth0 (through a BPF link; the lab's program is put
    back afterwards)."""

    def __init__(self, ns: str):
        bcc = import_bcc()
        self.b = bcc.BPF(text=STAMP.encode())
        fn = self.b.load_func("xdp_stamp", bcc.BPF.XDP)
        self.ns = ns
        self.record = f"/run/metaroce/bench-{ns}.xdp"
        with in_netns(ns):
            self.ifindex = socket.if_nametoindex("eth0")
            xdpslot.take_over(self.ifindex, self.record)
            self.link = libbpf.xdp_link_create(fn.fd, self.ifindex, libbpf.XDP_FLAGS_DRV_MODE)
        self.mm = mmap.mmap(self.b[b"stamps"].map_fd, mmap.PAGESIZE)

    def read(self) -> tuple[int, int]:
        return struct.unpack_from("=QQ", self.mm, 0)

    def close(self) -> None:
        self.mm.close()
        os.close(self.link)
        with in_netns(self.ns):
            xdpslot.put_back(self.record)
        self.b.cleanup()


def wait_stamp(st: Stamper, count0: int, timeout_s: float = 2.0) -> int | None:
    deadline = time.monotonic() + timeout_s
    while True:
        count, ns = st.read()
        if count != count0:
            return ns
        if time.monotonic() > deadline:
            return None


def series(post, st: Stamper, n: int, gap_s: float, now_ns) -> tuple[list, list]:
    wire, call = [], []
    for _ in range(n):
        c0, _ = st.read()
        t0 = now_ns()
        post()
        t1 = now_ns()
        ns = wait_stamp(st, c0)
        if ns is not None:
            wire.append((ns - t0) / 1000)
            call.append((t1 - t0) / 1000)
        if gap_s:
            time.sleep(gap_s)
    return wire, call


def pct(xs: list, p: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def raw_frame(ns: str, ip1: str, ip2: str, dmac: str) -> tuple[socket.socket, bytes]:
    """An AF_PACKET socket on h1's eth0 and an IPv4/UDP 4791 frame for h2."""
    with in_netns(ns):
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
        s.bind(("eth0", 0))
        smac = s.getsockname()[4]
    payload = bytes(12 + 16 + 64 + 4)
    udp = struct.pack("!HHHH", 0xC000, 4791, 8 + len(payload), 0)
    total = 20 + len(udp) + len(payload)
    iph = struct.pack("!BBHHHBBH4s4s", 0x45, 0, total, 0, 0x4000, 64, 17, 0,
                      socket.inet_aton(ip1), socket.inet_aton(ip2))
    csum = sum(struct.unpack("!10H", iph))
    csum = ~((csum & 0xFFFF) + (csum >> 16)) & 0xFFFF
    iph = iph[:10] + struct.pack("!H", csum) + iph[12:]
    eth = bytes.fromhex(dmac.replace(":", "")) + smac + b"\x08\x00"
    return s, eth + iph + udp + payload


def one_run(lab, dev1, st: Stamper, n: int, gap_ms: float) -> dict:
    c = _lib().lib
    ctx = Context("eth0", lab["ns1"])
    pd = PD(ctx)
    mr = MR(pd, 4096, IBV_ACCESS_LOCAL_WRITE)
    cq = CQ(ctx, 64)
    wr = SendWR(IBV_WR_RDMA_WRITE, wr_id=0, send_flags=0, sg_list=[mr.sge(0, 64)],
                remote_addr=0x10000, rkey=0x1234)

    def qp():
        """A QP of its own per series: nothing acknowledges, so a QP sends at most its
        window (1024 packets) and the series stay below it."""
        q = QP(pd, QPInitAttr(cq, cq, QPCap(max_send_wr=4096)))
        return q, q.connect({"qpn": 0x5A5A5A, "psn": 0, "ip": lab["ip2"]}, timeout=0)

    try:
        q1, path = qp()
        series(lambda: q1.post_send(wr), st, 20, 0, c.mr_now_ns)       # warm up
        hot, hot_call = series(lambda: q1.post_send(wr), st, n, 50e-6, c.mr_now_ns)
        q2, _ = qp()
        loop0 = d.request(dev1, {"op": "status"})[0]["loop"]
        asleep, asleep_call = series(lambda: q2.post_send(wr), st, min(n, 300), gap_ms / 1000,
                                     c.mr_now_ns)
        loop1 = d.request(dev1, {"op": "status"})[0]["loop"]
        s, frame = raw_frame(lab["ns1"], lab["ip1"], lab["ip2"], path["path"]["dmac"])
        hop, _ = series(lambda: s.send(frame), st, n, 50e-6, c.mr_now_ns)
        s.close()
        for q in (q1, q2):
            q.close()
    finally:
        mr.close()
        ctx.close()
    out = {}
    for name, xs in (("hot", hot), ("asleep", asleep), ("hop", hop), ("hot_call", hot_call),
                     ("asleep_call", asleep_call)):
        out[name] = {"p50_us": pct(xs, 50), "p99_us": pct(xs, 99), "samples": len(xs)}
    out["asleep_doorbell_wakeups"] = loop1["wakeups_by_doorbell"] - loop0["wakeups_by_doorbell"]
    out["busy_poll"] = loop1["busy_poll"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--n", type=int, default=1000, choices=range(10, 1001), metavar="10..1000",
                    help="samples per series (a QP sends at most 1000 unacknowledged here)")
    ap.add_argument("--gap-ms", type=float, default=5.0,
                    help="between posts of the 'asleep' series (default 5 ms)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    view = fresh_lab(LAB, "pair")
    ns1, ns2 = (view.plan.node(h).netns for h in ("h1", "h2"))
    ip1, ip2 = (view.plan.node(h).iface("eth0").ipv4.split("/")[0] for h in ("h1", "h2"))
    dev1 = d.DeviceId("eth0", ns1)
    st = None
    try:
        d.start_background(dev1, "roce")
        st = Stamper(ns2)
        lab = {"ns1": ns1, "ip1": ip1, "ip2": ip2}
        runs = []
        for r in range(a.runs):
            print(f"post_to_wire: run {r + 1}/{a.runs}", file=sys.stderr)
            runs.append(one_run(lab, dev1, st, a.n, a.gap_ms))
    finally:
        if st is not None:
            st.close()
        try:
            d.stop(dev1)
        except Exception:  # noqa: BLE001
            d.clean_stale(dev1)
        core.down(LAB)
    res = {f"{k}_{q}": summary([r[k][q] for r in runs])
           for k in ("hot", "asleep", "hop", "hot_call", "asleep_call") for q in ("p50_us", "p99_us")}
    doc = {**header("post_to_wire"), "runs": a.runs, "samples": a.n, "gap_ms": a.gap_ms,
           "busy_poll": runs[0]["busy_poll"], "results": res, "per_run": runs}
    save(doc, "post_to_wire")
    if a.json:
        print(json.dumps(doc))
        return 0
    for k, v in res.items():
        if v:
            print(f"{k:<22}{v['median']:>10.1f}  ({v['min']:.1f} .. {v['max']:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
