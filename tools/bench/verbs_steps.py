#!/usr/bin/env python3
"""The cost of each step of the posting and completion paths (issue 19), one at a time, in one
process: the library's post_send (check, pack, copy into the ring, publish), the daemon copying
WQEs out of the ring and decoding them, checking one and building its message, storing the next
PSN for the kernel, writing a CQE and publishing it, and the library's poll (an empty CQ, one
completion). The daemon's side runs as the daemon does (metaroce.nic.device.Device on h1 of a
lab pair, its QP connected), but called directly so that each step is timed alone: mean over
--n calls, median over --runs runs. What it leaves out — the wait for the daemon to notice,
the packet's trip and the scheduler — is what post_to_wire.py measures end to end.

    sudo .venv/bin/python tools/bench/verbs_steps.py [--runs 3] [--n 2000] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import threading
import time

from benchlab import fresh_lab, header, save, summary
from metaroce.lab import core
from metaroce.lab.netdev import in_netns
from metaroce.nic.device import Device
from metaroce.nic.rx import RxPath
from metaroce.nic.wqe import check_sge_in
from metaroce.verbs.api import WC, SendWR
from metaroce.verbs.queues import CompletionRing, Mapping, SendQueue

LAB = "bsteps"
STEPS = ("library post_send", "daemon: copy out + decode (per WQE, batches of 64)",
         "daemon: check + build the message", "daemon: next PSN for the kernel (a store)",
         "daemon: write a CQE", "daemon: publish the CQ (+ event check)",
         "library poll, empty CQ", "library poll, one completion", "daemon: idle round pieces "
         "(events, transmit, deliver)")


def timed(fn, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e6


def one_run(ns: str, peer_ip: str, n: int) -> dict:
    out: dict = {}

    def run():
        with in_netns(ns):
            rx = RxPath()
            dev = Device(rx, socket.if_nametoindex("eth0"), "roce")
            try:
                measure(rx, dev)
            finally:
                dev.close()
                rx.close()

    def measure(rx, dev):
        owner = object()
        pd = dev.alloc_pd(owner)
        mr = dev.reg_mr(owner, pd, 1 << 20, 15)
        cq = dev.create_cq(owner, 4096)
        qp = dev.create_qp(owner, pd, cq.handle, cq.handle, {"max_send_wr": 4096})
        dev.connect_qp(qp, {"qpn": 0x123456, "psn": 0, "ip": peer_ip}, {"timeout": 0})
        desc = qp.rings.describe()
        sq = SendQueue(Mapping(os.dup(qp.rings.fds[0]), desc["sq"]["bytes"]), desc["sq"], -1)
        ring = CompletionRing(Mapping(os.dup(cq.ring.fd), cq.ring.mem.size), cq.ring.describe(),
                              WC)
        wr = SendWR("RDMA_WRITE", wr_id=1, sg_list=[[mr.addr, 64, mr.rkey]], remote_addr=0x1000,
                    rkey=5, send_flags=0)

        def local(s, need):
            return check_sge_in((s[0], s[1]), s[2], mr.addr, mr.length, mr.access, need)

        out[STEPS[0]] = timed(lambda: sq.post([wr], local), n)
        t, ents = time.perf_counter(), []
        while True:
            got = qp.rings.fetch_send(dev.scratch)
            if not got:
                break
            for e in got:                   # built while the scratch still holds its batch
                ents.append(e)
        fetch = (time.perf_counter() - t) / max(1, len(ents)) * 1e6
        out[STEPS[1]] = fetch
        for _ in range(n):                  # post again, then time the build alone
            sq.post([wr], local)
        builds = 0.0
        while True:
            got = qp.rings.fetch_send(dev.scratch)
            if not got:
                break
            t = time.perf_counter()
            for e in got:
                dev._build_wqe(qp, e)
            builds += time.perf_counter() - t
        out[STEPS[2]] = builds / n * 1e6
        qp.rings.settle(0, 0)
        out[STEPS[3]] = timed(lambda: rx.set_sq_psn(qp.qpn, 7), n)
        wc = {"wr_id": 1, "status": 0, "opcode": "RDMA_WRITE", "qp_num": qp.qpn, "byte_len": 64}
        out[STEPS[4]] = timed(lambda: cq.ring.put(wc), n)
        out[STEPS[5]] = timed(cq.ring.publish, n)
        ring.poll(4096)
        out[STEPS[6]] = timed(lambda: ring.poll(1), n)
        per = 0.0
        for _ in range(n):
            cq.ring.put(wc)
            cq.ring.publish()
            t = time.perf_counter()
            ring.poll(1)
            per += time.perf_counter() - t
        out[STEPS[7]] = per / n * 1e6
        out[STEPS[8]] = timed(lambda: (dev.on_events(), dev.transmit(), dev.settle_rings(),
                                       dev.take_wcs()), n)
        ring.mapping.close()
        sq.mapping.close()

    th = threading.Thread(target=run)
    th.start()
    th.join()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    view = fresh_lab(LAB, "pair")
    try:
        ns1 = view.plan.node("h1").netns
        ip2 = view.plan.node("h2").iface("eth0").ipv4.split("/")[0]
        runs = []
        for r in range(a.runs):
            print(f"verbs_steps: run {r + 1}/{a.runs}", file=sys.stderr)
            runs.append(one_run(ns1, ip2, a.n))
    finally:
        core.down(LAB)
    res = {k: summary([r[k] for r in runs]) for k in STEPS}
    doc = {**header("verbs_steps"), "runs": a.runs, "calls": a.n, "results_us": res}
    save(doc, "verbs_steps")
    if a.json:
        print(json.dumps(doc))
        return 0
    for k, v in res.items():
        print(f"{k:<62}{v['median']:>8.2f} us ({v['min']:.2f} .. {v['max']:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
