#!/usr/bin/env python3
"""SIMULATION, not this machine's data path: the deterministic simulator's (metaroce/sim,
docs/engine.md) large scenarios, for behaviour beyond what one 2-vCPU VM can run -- many QPs on
one link, 64:1 incast with and without receiver credits, a failing spine link, 1 % loss --
MetaRoCE mode against RoCEv2 (go-back-N) mode, each point over several seeds (min/median/max).

    .venv/bin/python tools/bench/sim_scale.py [--quick | --full]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))

from benchlab import header  # noqa: E402

from metaroce.sim import scenarios as S  # noqa: E402

RESULTS = os.path.join(os.path.dirname(__file__), "results")
KEYS = ("goodput_bps", "jain_fairness", "drops", "max_queue_bytes", "retransmissions",
        "app_errors", "timeouts", "fct_p99_s")


def stats(xs):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    return {"min": xs[0], "median": xs[len(xs) // 2], "max": xs[-1], "n": len(xs)}


def point(fn, seeds, keys=KEYS) -> dict:
    runs = [fn(s) for s in seeds]
    return {k: stats([r.get(k) for r in runs]) for k in keys}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true")
    g.add_argument("--full", action="store_true")
    ap.add_argument("--out", default=os.path.join(RESULTS, "sim_scale"))
    a = ap.parse_args()
    seeds = list(range(1, 6 if a.full else 4))
    t0 = time.monotonic()
    doc = {**header("sim_scale"), "simulation": True, "seeds": seeds,
           "command": " ".join(["tools/bench/sim_scale.py", *sys.argv[1:]])}

    # (a) many QPs sharing one 100 Gbit/s receiver link: 16 senders x k QPs, 64 KiB each
    qp_counts = (1, 16, 256, 1024) + ((4096,) if a.full else ())
    doc["many_qps"] = []
    for n in qp_counts:
        senders, per = (1, 1) if n == 1 else (16, n // 16)
        for credits in (False, True):
            p = point(lambda s: S.run_incast(senders, credits, "metaroce", s, 100, 64, 64, per),
                      seeds[:2] if n >= 1024 else seeds)
            doc["many_qps"].append({"qps": n, "credits": credits, **p})
            print(f"many QPs {n:>5} credits={credits!s:<5} goodput "
                  f"{p['goodput_bps']['median'] / 1e9:7.2f} Gbit/s Jain "
                  f"{p['jain_fairness']['median']:.3f} drops {p['drops']['median']}", file=sys.stderr)

    # (b) 64:1 incast, 256 KiB per sender
    doc["incast64"] = []
    for mode in ("metaroce", "roce"):
        for credits in ((False, True) if mode == "metaroce" else (False,)):
            p = point(lambda s: S.run_incast(64, credits, mode, s, 100, 256, 64, 1), seeds)
            doc["incast64"].append({"mode": mode, "credits": credits, **p})
            print(f"incast 64:1 {mode:<8} credits={credits!s:<5} goodput "
                  f"{p['goodput_bps']['median'] / 1e9:7.2f} Gbit/s Jain "
                  f"{p['jain_fairness']['median']:.3f} drops {p['drops']['median']} max queue "
                  f"{p['max_queue_bytes']['median']}", file=sys.stderr)

    # (c) leaf-spine, 4 spines, one spine link fails mid-transfer
    doc["spine_failure"] = []
    for mode in ("metaroce", "roce"):
        p = point(lambda s: S.run_multipath(4, 0.0001, mode, s, 400, 100, 32, 1024),
                  seeds, KEYS + ("recovery_s", "path_evictions"))
        doc["spine_failure"].append({"mode": mode, **p})
        rec = p["recovery_s"]
        print(f"spine failure {mode:<8} goodput {p['goodput_bps']['median'] / 1e9:7.2f} Gbit/s "
              f"recovery {rec['median'] if rec else None} app errors {p['app_errors']['median']}",
              file=sys.stderr)

    # (d) 1 % random loss, one QP at 100 Gbit/s
    doc["loss1"] = []
    for mode in ("metaroce", "roce"):
        p = point(lambda s: S.run_loss(0.01, mode, s, 100, 8, 1024),
                  seeds, KEYS + ("goodput_ratio",))
        doc["loss1"].append({"mode": mode, **p})
        print(f"loss 1% {mode:<8} goodput {p['goodput_bps']['median'] / 1e9:7.2f} Gbit/s "
              f"({p['goodput_ratio']['median']:.3f} of lossless)", file=sys.stderr)
    doc["seconds"] = round(time.monotonic() - t0, 1)
    os.makedirs(RESULTS, exist_ok=True)
    with open(a.out + ".json", "w") as f:
        json.dump(doc, f, indent=1)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot (pip install -e '.[bench]')", file=sys.stderr)
        return 0
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    for credits, style in ((False, "o-"), (True, "s--")):
        pts = [r for r in doc["many_qps"] if r["credits"] == credits]
        ax1.plot([r["qps"] for r in pts], [r["goodput_bps"]["median"] / 1e9 for r in pts], style,
                 label=f"MetaRoCE{' + credits' if credits else ''}")
        ax2.plot([r["qps"] for r in pts], [r["jain_fairness"]["median"] for r in pts], style,
                 label=f"MetaRoCE{' + credits' if credits else ''}")
    for ax, yl in ((ax1, "aggregate goodput, Gbit/s"), (ax2, "Jain fairness")):
        ax.set_xscale("log")
        ax.set_xlabel("QPs into one 100 Gbit/s link")
        ax.set_ylabel(yl)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("SIMULATION (metaroce/sim): many QPs, median of seeds")
    fig.tight_layout()
    fig.savefig(a.out + ".png", dpi=110)
    print(a.out + ".json", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
