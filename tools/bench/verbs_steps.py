#!/usr/bin/env python3
"""The cost of each step of the posting and completion paths (issues 19, 20), on a lab pair
with both daemons running. The application's steps are timed in this process, each alone: the
library's post_send (check, pack, copy into the ring, publish, doorbell check), poll on an empty
CQ and poll that returns one completion. The daemon's steps are its engine thread's own
counters (metaroce/datapath, `status` → loop), read before and after --n signalled 64-byte RDMA
WRITEs posted and awaited one at a time: the time the thread spent taking the XDP program's
events, draining the verbs rings (copy out, check, hand to the engine), running timers, building
and sending frames, and writing completions, each divided by what it handled. What this leaves
out — the wait for the thread to notice, the packet's trip and the scheduler — is what
post_to_wire.py measures end to end.

    sudo .venv/bin/python tools/bench/verbs_steps.py [--runs 3] [--n 2000] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from benchlab import header, save, summary, two_hosts
from metaroce.nic import daemon as d
from metaroce.verbs import (CQ, MR, PD, QP, IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_REMOTE_WRITE,
                            IBV_SEND_SIGNALED, IBV_WR_RDMA_WRITE, Context, QPCap, QPInitAttr,
                            SendWR)

LAB = "bsteps"
APP_STEPS = ("library post_send (unsignaled)", "library poll, empty CQ",
             "library poll, one completion")
# (step, phase counter, what it is divided by)
DAEMON_STEPS = (("engine thread: an XDP event (ACK)", "ns_events", "events"),
                ("engine thread: a send WQE out of the ring (copy, check, to the engine)",
                 "ns_rings", "wqes"),
                ("engine thread: a frame built and sent", "ns_tx", "tx_packets"),
                ("engine thread: a completion written and published", "ns_finish", "cqes"),
                ("engine thread: a round that found work, all phases", "busy_ns", "rounds"))


def loop_counters(dev) -> dict:
    return d.request(dev, {"op": "status"})[0]["loop"]


def one_run(h, n: int) -> dict:
    out: dict = {}
    dev1 = d.DeviceId("eth0", h.ns1)
    c1, c2 = Context("eth0", h.ns1), Context("eth0", h.ns2)
    try:
        pd1, pd2 = PD(c1), PD(c2)
        src = MR(pd1, 1 << 16, IBV_ACCESS_LOCAL_WRITE)
        dst = MR(pd2, 1 << 16, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)
        cq1, cq2 = CQ(c1, 4096), CQ(c2, 64)
        qp1 = QP(pd1, QPInitAttr(cq1, cq1, QPCap(max_send_wr=4096)))
        qp2 = QP(pd2, QPInitAttr(cq2, cq2))
        qp1.connect({"qpn": qp2.qp_num, "psn": qp2.psn, "ip": h.ip2})
        qp2.connect({"qpn": qp1.qp_num, "psn": qp1.psn, "ip": h.ip1})

        def wr(flags):
            return SendWR(IBV_WR_RDMA_WRITE, wr_id=1, send_flags=flags,
                          sg_list=[src.sge(0, 64)], remote_addr=dst.addr, rkey=dst.rkey)

        def drain(k):
            got = 0
            deadline = time.monotonic() + 30
            while got < k:
                got += len(cq1.poll(64))
                if time.monotonic() > deadline:
                    raise RuntimeError(f"verbs_steps: {k - got} completions never came")

        # the library's post_send alone: unsignaled posts, a signalled one ends each batch
        unsig, sig = wr(0), wr(IBV_SEND_SIGNALED)
        total = 0.0
        for _ in range(max(1, n // 256)):
            t = time.perf_counter()
            for _ in range(255):
                qp1.post_send(unsig)
            total += time.perf_counter() - t
            qp1.post_send(sig)
            drain(1)
        out[APP_STEPS[0]] = total / (max(1, n // 256) * 255) * 1e6
        t = time.perf_counter()
        for _ in range(n):
            cq1.poll(1)
        out[APP_STEPS[1]] = (time.perf_counter() - t) / n * 1e6
        # one at a time, signalled: the successful poll timed alone; the daemon's counters
        l0 = loop_counters(dev1)
        per = 0.0
        for _ in range(n):
            qp1.post_send(sig)
            while True:
                t = time.perf_counter()
                got = cq1.poll(1)
                if got:
                    per += time.perf_counter() - t
                    break
        l1 = loop_counters(dev1)
        out[APP_STEPS[2]] = per / n * 1e6
        for name, ns, by in DAEMON_STEPS:
            k = l1[by] - l0[by]
            out[name] = (l1[ns] - l0[ns]) / k / 1e3 if k else None
        out["per post: events / frames / rounds"] = [
            round((l1[k] - l0[k]) / n, 2) for k in ("events", "tx_packets", "rounds")]
        qp1.close()
        qp2.close()
        src.close()
        dst.close()
    finally:
        c1.close()
        c2.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.runs < 1 or a.n < 1:
        print("verbs_steps: --runs and --n must be at least 1", file=sys.stderr)
        return 2
    runs = []
    with two_hosts(LAB) as h:
        for r in range(a.runs):
            print(f"verbs_steps: run {r + 1}/{a.runs}", file=sys.stderr)
            runs.append(one_run(h, a.n))
    keys = APP_STEPS + tuple(s[0] for s in DAEMON_STEPS)
    res = {k: summary([r[k] for r in runs if r[k] is not None]) for k in keys}
    doc = {**header("verbs_steps"), "runs": a.runs, "calls": a.n, "results_us": res,
           "per_post_events_frames_rounds": runs[-1]["per post: events / frames / rounds"]}
    save(doc, "verbs_steps")
    if a.json:
        print(json.dumps(doc))
        return 0
    for k, v in res.items():
        if v:
            print(f"{k:<72}{v['median']:>8.2f} us ({v['min']:.2f} .. {v['max']:.2f})")
    print(f"per post: events / frames / rounds {doc['per_post_events_frames_rounds']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
