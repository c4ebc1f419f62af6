#!/usr/bin/env python3
"""The daemon's busy-poll bound as a trade-off (issue 19): after its last work the daemon spins
on the rings for this long before it sleeps on the doorbells. For each bound (fixed with
METAROCE_BUSY_POLL_US for both daemons of a lab pair, or the daemon's own adaptive bound,
metaroce/datapath/dp.c), an application (post_poll_app.py) posts
signalled 64-byte RDMA WRITEs one at a time, each completion awaited by spinning on CQ.poll,
--gaps apart; measured: post -> completion p50/p99, the doorbells it had to ring (the daemon
was asleep), and the CPU both daemons burned per post (from /proc/PID/schedstat, nanoseconds
on a CPU). Medians of --runs runs.

    sudo .venv/bin/python tools/bench/busy_poll.py [--bounds adaptive,0,200,1000,5000] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from benchlab import ENV, fresh_lab, header, save, stop_daemons, summary
from metaroce.lab import core
from metaroce.nic import daemon as d
from metaroce.verbs import (CQ, MR, PD, QP, IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_REMOTE_WRITE,
                            Context, QPInitAttr)

HERE = os.path.dirname(os.path.abspath(__file__))
LAB = "bbusy"
APP = os.path.join(HERE, "post_poll_app.py")


def cpu_ns(pid: int) -> int:
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


def ints(text: str, allow=()) -> list:
    out = []
    for x in text.split(","):
        if x in allow:
            out.append(x)
            continue
        try:
            out.append(int(x))
        except ValueError:
            raise argparse.ArgumentTypeError(f"a comma-separated list of integers, not {text!r}")
        if not 0 <= out[-1] <= 1_000_000:
            raise argparse.ArgumentTypeError("each value 0 .. 1000000")
    return out


def with_bound(view, bound_us, gaps: list[int], n: int, runs: int) -> dict:
    ns1, ns2 = (view.plan.node(h).netns for h in ("h1", "h2"))
    ip1, ip2 = (view.plan.node(h).iface("eth0").ipv4.split("/")[0] for h in ("h1", "h2"))
    devs = [d.DeviceId("eth0", ns) for ns in (ns1, ns2)]
    if bound_us != "adaptive":
        os.environ["METAROCE_BUSY_POLL_US"] = str(bound_us)
    started, app = [], None
    rows = {g: [] for g in gaps}
    try:
        pids = []
        for dev in devs:
            pids.append(d.start_background(dev, "roce")["pid"])
            started.append(dev)
        c2 = Context("eth0", ns2)
        pd = PD(c2)
        mr = MR(pd, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)
        cq = CQ(c2, 64)
        qp = QP(pd, QPInitAttr(cq, cq))
        app = subprocess.Popen([sys.executable, APP, "eth0", ns1], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True, env=ENV)
        theirs = json.loads(app.stdout.readline())
        qp.connect({"qpn": theirs["qpn"], "psn": theirs["psn"], "ip": ip1})
        app.stdin.write(json.dumps({"qpn": qp.qp_num, "psn": qp.psn, "ip": ip2,
                                    "addr": mr.addr, "rkey": mr.rkey}) + "\n")
        app.stdin.write("go poll 100 0\n")              # warm up
        app.stdin.flush()
        assert app.stdout.readline().strip() == "ready"
        app.stdout.readline()
        for _ in range(runs):
            for g in gaps:
                k = n if g < 1000 else max(50, n // 4)
                c0 = sum(cpu_ns(p) for p in pids)
                app.stdin.write(f"go poll {k} {g}\n")
                app.stdin.flush()
                res = json.loads(app.stdout.readline())
                used = sum(cpu_ns(p) for p in pids) - c0
                rows[g].append({"p50_us": res["p50_us"], "p99_us": res["p99_us"],
                                "doorbells_per_post": res["doorbells"] / k,
                                "daemon_cpu_us_per_post": used / 1000 / k})
        app.stdin.write("quit\n")
        app.stdin.flush()
        app.wait(timeout=30)
        qp.close()
        mr.close()
        c2.close()
    finally:
        os.environ.pop("METAROCE_BUSY_POLL_US", None)
        if app is not None and app.poll() is None:
            app.kill()
            app.wait()
        stop_daemons(started)
    return {str(g): {k: summary([r[k] for r in rs]) for k in rs[0]} for g, rs in rows.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bounds", type=lambda t: ints(t, ("adaptive",)),
                    default=["adaptive", 0, 200, 1000, 5000],
                    help="busy-poll bounds to try, microseconds, or adaptive (the default)")
    ap.add_argument("--gaps", type=ints, default=[0, 500, 2000, 10000],
                    help="application think time between posts, microseconds")
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    view = fresh_lab(LAB, "pair")
    out = {}
    try:
        for b in a.bounds:
            print(f"busy_poll: bound {b}", file=sys.stderr)
            out[str(b)] = with_bound(view, b, a.gaps, a.n, a.runs)
    finally:
        core.down(LAB)
    doc = {**header("busy_poll"), "runs": a.runs, "posts": a.n, "gaps_us": a.gaps,
           "results": out}
    save(doc, "busy_poll")
    if a.json:
        print(json.dumps(doc))
        return 0
    print(f"{'bound us':>9} {'gap us':>7} {'p50 us':>8} {'p99 us':>9} {'bells/post':>10} "
          f"{'daemon CPU us/post':>19}")
    for b, by_gap in out.items():
        for g, r in by_gap.items():
            print(f"{b:>9} {g:>7} {r['p50_us']['median']:>8.1f} {r['p99_us']['median']:>9.1f} "
                  f"{r['doorbells_per_post']['median']:>10.3f} "
                  f"{r['daemon_cpu_us_per_post']['median']:>19.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
