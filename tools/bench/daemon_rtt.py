#!/usr/bin/env python3
"""The posting path's floor: the round trip of a request an application makes to its device's
daemon (a request the daemon answers at once with an error, so nothing but the control socket,
the JSON and the wake-ups is timed). Every verbs call (post_send, post_recv, ...) pays it.
Medians (min-max) of --runs runs of --n requests; the application unpinned, as perf runs it.

    sudo .venv/bin/python tools/bench/daemon_rtt.py [--runs 3] [--n 3000] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from benchlab import header, two_hosts
from metaroce.errors import MetaroceError
from metaroce.verbs import Context

HERE = os.path.dirname(os.path.abspath(__file__))


def one(ctx: Context, n: int) -> dict:
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        try:
            ctx.request("nop")
        except MetaroceError:
            pass                                  # the answer: "unknown op"
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return {"p50_us": ts[n // 2] * 1e6, "p99_us": ts[int(n * 0.99)] * 1e6}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    with two_hosts("benchrtt") as lab:
        ctx = Context("eth0", lab.ns1)
        rs = [one(ctx, a.n) for _ in range(a.runs)]
        ctx.close()
    out = {k: {"median": statistics.median(r[k] for r in rs), "min": min(r[k] for r in rs),
               "max": max(r[k] for r in rs)} for k in ("p50_us", "p99_us")}
    doc = {**header("daemon_rtt"), "runs": a.runs, "requests": a.n, "results": out}
    path = os.path.join(HERE, "results", "daemon_rtt.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    if a.json:
        print(json.dumps(doc))
    else:
        for k, v in out.items():
            print(f"request round trip {k}: {v['median']:.1f} ({v['min']:.1f}-{v['max']:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
