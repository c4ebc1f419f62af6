#!/usr/bin/env python3
"""System calls an application makes per signalled post + poll, in steady state (issue 19: 3.06
socket system calls per post when every verb was a JSON line to the daemon). An application
(post_poll_app.py) on h1 of a lab pair posts --n signalled 64-byte RDMA WRITEs to a QP on h2,
one at a time, each completion waited for before the next post, (a) spinning on CQ.poll and
(b) with CQ.wait (which polls for 50 us, then arms the CQ and sleeps on its completion
channel). metaroce.syscount counts every system call of the application's process by number
(a BCC program on the sys_enter raw tracepoint; no ptrace, so the application runs at full
speed), from just before "go" to its answer (the two pipe lines of the handshake are in the
count). Medians of --runs runs.

    sudo .venv/bin/python tools/bench/post_syscalls.py [--runs 3] [--n 2000] [--json]
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
from metaroce.syscount import SOCKET, WAITS, SyscallCounter
from metaroce.verbs import (CQ, MR, PD, QP, IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_REMOTE_WRITE,
                            Context, QPInitAttr)

HERE = os.path.dirname(os.path.abspath(__file__))
LAB = "bsysc"
APP = os.path.join(HERE, "post_poll_app.py")
def one(app, tracer: SyscallCounter, mode: str, n: int) -> dict:
    tracer.clear()
    app.stdin.write(f"go {mode} {n}\n")
    app.stdin.flush()
    res = json.loads(app.stdout.readline())
    by = tracer.by_name()
    total = sum(by.values())
    return {"posts": n, "syscalls_per_post": total / n,
            "socket_syscalls_per_post": sum(by.get(x, 0) for x in SOCKET) / n,
            "wait_syscalls_per_post": sum(by.get(x, 0) for x in WAITS) / n,
            "doorbells_per_post": res["doorbells"] / n,
            "by_name": by, "post_to_completion_p50_us": res["p50_us"],
            "post_to_completion_p99_us": res["p99_us"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    view = fresh_lab(LAB, "pair")
    ns1, ns2 = (view.plan.node(h).netns for h in ("h1", "h2"))
    ip1, ip2 = (view.plan.node(h).iface("eth0").ipv4.split("/")[0] for h in ("h1", "h2"))
    devs = [d.DeviceId("eth0", ns) for ns in (ns1, ns2)]
    started, app, tracer = [], None, None
    rows = {"poll": [], "wait": []}
    try:
        for dev in devs:
            d.start_background(dev, "roce")
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
        app.stdin.flush()
        assert app.stdout.readline().strip() == "ready"
        tracer = SyscallCounter(app.pid)
        one(app, tracer, "poll", 200)                   # warm up
        for r in range(a.runs):
            print(f"post_syscalls: run {r + 1}/{a.runs}", file=sys.stderr)
            for mode in rows:
                rows[mode].append(one(app, tracer, mode, a.n))
        app.stdin.write("quit\n")
        app.stdin.flush()
        app.wait(timeout=30)
        qp.close()
        mr.close()
        c2.close()
    finally:
        if tracer is not None:
            tracer.close()
        if app is not None and app.poll() is None:
            app.kill()
            app.wait()
        stop_daemons(started)
        core.down(LAB)
    keys = ("syscalls_per_post", "socket_syscalls_per_post", "wait_syscalls_per_post",
            "doorbells_per_post", "post_to_completion_p50_us", "post_to_completion_p99_us")
    out = {mode: {k: summary([x[k] for x in xs]) for k in keys} for mode, xs in rows.items()}
    doc = {**header("post_syscalls"), "runs": a.runs, "posts": a.n, "results": out,
           "by_name_last_run": {m: xs[-1]["by_name"] for m, xs in rows.items()}}
    save(doc, "post_syscalls")
    if a.json:
        print(json.dumps(doc))
        return 0
    for mode, res in out.items():
        print(f"{mode}: " + ", ".join(f"{k} {v['median']:.3g}" for k, v in res.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
