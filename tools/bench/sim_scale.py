#!/usr/bin/env python3
"""SIMULATION: the transport engine at scales one machine's lab cannot reach, on metaroce.sim
(the real engine, the C one in metaroce/cengine, over a deterministic discrete-event network:
integer-ns virtual clock, seeded; no host CPU costs, no PFC). Every number here is simulated.

Scenarios, each with the contenders run back to back for every seed (a run = a seed):
  qps      1, 1024 (and 4096 with --full) QPs spread over 16 sender hosts, long-lived RDMA
           WRITE streams into one receiver: the receiver's 100 Gbit/s downlink is the shared
           link. Starts spread over 1 ms; after a warm-up, a window long enough for ~8 packets
           per QP measures aggregate goodput, Jain's index over per-QP goodput, starved QPs
           (nothing delivered in the window), drops, deepest switch queue, RTO expiries. With
           the default 1 MiB switch buffer and a deep 32 MiB one (one packet per QP must fit).
           Contenders: MetaRoCE (window CC), MetaRoCE + receiver credits, RoCEv2 (go-back-N +
           DCQCN).
  incast   64:1 (--full: 8, 32, 64, 128): every sender writes 1 MiB at once (metaroce.sim's
           run_incast): goodput, Jain over per-flow throughput, drops, deepest queue,
           retransmissions, RTO expiries, p99 flow completion. Same three contenders.
  failure  leaf-spine, 4 spines, one QP writes 32 MiB; at 200 us the link from leaf1 to the
           spine the RoCEv2 flow hashes to fails (both ways) and stays down; routing does not
           converge. Recovery time (rate back
           to 90 % of 3/4 of before), application errors, goodput, RTO expiries, path
           evictions; and the same transfer without the failure. MetaRoCE sprays 16 entropies,
           RoCEv2 has its one ECMP path.

    .venv/bin/python tools/bench/sim_scale.py [--quick | --full] [--jobs N] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from multiprocessing import Pool

from benchlab import header, jain, pyplot, save, save_figure, summary
from metaroce.engine.cc import CCConfig
from metaroce.engine.credits import CreditConfig
from metaroce.sim import net as N
from metaroce.sim import scenarios as S

CONTENDERS = {  # name -> (mode, receiver credits)
    "metaroce_credits": ("metaroce", True),
    "metaroce": ("metaroce", False),
    "roce": ("roce", False),
}
LABELS = {"metaroce_credits": "MetaRoCE + credits", "metaroce": "MetaRoCE (window CC)",
          "roce": "RoCEv2 (go-back-N, DCQCN)"}
RATE = 100e9
SENDERS = 16
STAGGER_NS = 1_000_000
WARMUP_NS = 2_000_000         # after the last start
PKTS_PER_QP = 8               # in the measured window
MIN_WINDOW_NS = 2_000_000
BUFFERS = {"1 MiB": 1 * S.MiB, "32 MiB": 32 * S.MiB}
FAIL_AT_S = 200e-6
PATHS = 4


# --- the scenarios (one simulation each; run in worker processes) -----------------------------

def _start(fl) -> None:
    fl.kick()
    fl.src.service(fl.qa)


def sim_qps(qps: int, contender: str, seed: int, buffer: str) -> dict:
    mode, credits = CONTENDERS[contender]
    r = S.Run(seed, mode, S.Fabric(buffer_bytes=BUFFERS[buffer]))
    senders = min(SENDERS, qps)
    r.net, txs, rx = N.incast(r.sim, senders, RATE, r.fabric.delay_ns, **r.sw())
    rtt = S.base_rtt_ns([RATE] * 2, r.fabric.delay_ns)
    cc = CCConfig(line_rate_bps=RATE, base_rtt_ns=rtt)
    ccfg = CreditConfig(link_rate_bps=RATE, base_rtt_ns=rtt, mtu=S.MTU) if credits else None
    rng = random.Random(seed ^ 0x5CA1E)
    for i in range(qps):
        fl = r.connect(txs[i % senders], rx, cc=cc, credits=ccfg, size=1 << 50, msg=64 * S.KiB,
                       depth=2)
        r.sim.at(rng.randrange(STAGGER_NS) if qps > 1 else 0, _start, fl)
    window = max(MIN_WINDOW_NS, int(PKTS_PER_QP * qps * S.MTU * 8e9 / RATE))
    t0 = STAGGER_NS + WARMUP_NS
    r.sim.run(until=t0)
    b0 = [f.qb.resp.rx_bytes for f in r.flows]
    m0 = r.metrics()
    r.sim.run(until=t0 + window)
    m1 = r.metrics()
    per = [(f.qb.resp.rx_bytes - b) * 8e9 / window for f, b in zip(r.flows, b0)]
    agg = sum(per)
    return {"qps": qps, "buffer": buffer, "contender": contender, "seed": seed,
            "aggregate_bps": agg, "jain": jain(per), "starved_qps": sum(1 for x in per if not x),
            "min_over_fair": min(per) / (agg / qps) if agg else 0.0,
            "max_over_fair": max(per) / (agg / qps) if agg else 0.0,
            "drops": m1["drops"], "drops_in_window": m1["drops"] - m0["drops"],
            "max_queue_bytes": m1["max_queue_bytes"], "timeouts": m1["timeouts"],
            "timeouts_in_window": m1["timeouts"] - m0["timeouts"],
            "retransmissions": m1["retransmissions"], "app_errors": m1["app_errors"],
            "ecn_marks": m1["ecn_marks"], "window_s": window / 1e9, "warmup_s": t0 / 1e9,
            "events": m1["events"]}


def sim_incast(senders: int, contender: str, seed: int) -> dict:
    mode, credits = CONTENDERS[contender]
    m = S.run_incast(senders, credits and mode == "metaroce", mode, seed)
    keep = ("goodput_bps", "jain_fairness", "drops", "max_queue_bytes", "retransmissions",
            "timeouts", "app_errors", "fct_p50_s", "fct_p99_s", "completed_flows", "ecn_marks",
            "cnps", "credit_grants", "sim_time_s", "events")
    return {"senders": senders, "contender": contender, "seed": seed,
            **{k: m[k] for k in keep}}


def sim_failure(contender: str, seed: int, fail: bool, timeline: bool) -> dict:
    """scenarios.run_multipath's transfer, built here to keep the delivered-rate timeline."""
    mode, _ = CONTENDERS[contender]
    r = S.Run(seed, mode)
    hr, fr = 400e9, 100e9
    r.net, left, right, fab = N.leaf_spine(r.sim, PATHS, 1, hr, fr, r.fabric.delay_ns, **r.sw())
    cc = CCConfig(line_rate_bps=min(hr, fr * PATHS),
                  base_rtt_ns=S.base_rtt_ns([hr, fr, fr, hr], r.fabric.delay_ns))
    fl = r.connect(left[0], right[0], cc=cc, paths=4 * PATHS, size=32 * S.MiB, msg=S.MiB)
    # the spine that path 0 -- the RoCEv2 flow-label port, MetaRoCE's first entropy -- hashes
    # to at leaf0: its link to leaf1 fails, so the single-path flow is hit (MetaRoCE sprays
    # over every spine: any link is one of its paths)
    sport0 = fl.qa.req.paths.stats()[0]["sport"]
    spine = N.ecmp_hash(left[0].id, right[0].id, sport0, r.net.switches[0].salt) % PATHS
    fail_ns = int(FAIL_AT_S * 1e9)
    if fail:
        up, down = fab[(1, spine)]
        r.sim.at(fail_ns, up.fail)
        r.sim.at(fail_ns, down.fail)
    r.start()
    r.run()
    m = r.metrics()
    out = {"contender": contender, "seed": seed, "fail": fail, "failed_spine": spine,
           "recovery_s": S.recovery(r, fail_ns, PATHS) if fail else None,
           **{k: m[k] for k in ("goodput_bps", "app_errors", "timeouts", "retransmissions",
                                "drops", "path_evictions", "completed_flows", "fct_p50_s",
                                "sim_time_s", "events")}}
    if timeline and r.bins:
        last = min(max(r.bins), int(3e-3 * 1e9) // r.bin_ns)   # the first 3 ms
        out["timeline_gbps"] = [r.bins.get(b, 0) * 8 / r.bin_ns for b in range(last + 1)]
        out["bin_s"] = r.bin_ns / 1e9
    return out


def _task(t):
    fn, args = t
    t0 = time.monotonic()
    res = {"sim_qps": sim_qps, "sim_incast": sim_incast, "sim_failure": sim_failure}[fn](*args)
    res["wall_s"] = round(time.monotonic() - t0, 2)
    print(f"sim_scale: {fn}{args} {res['wall_s']} s", file=sys.stderr, flush=True)
    return res


# --- aggregation --------------------------------------------------------------------------------

def aggregate(rows: list[dict], keys: tuple, metrics: tuple) -> list[dict]:
    groups: dict = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in keys), []).append(r)
    out = []
    for k, rs in groups.items():
        rs.sort(key=lambda r: r["seed"])
        out.append({**dict(zip(keys, k)), "seeds": [r["seed"] for r in rs],
                    **{m: summary([r.get(m) for r in rs]) for m in metrics},
                    "wall_s": summary([r["wall_s"] for r in rs])})
    return out


QPS_METRICS = ("aggregate_bps", "jain", "starved_qps", "min_over_fair", "max_over_fair", "drops",
               "drops_in_window", "max_queue_bytes", "timeouts", "timeouts_in_window",
               "retransmissions", "app_errors", "ecn_marks")
INCAST_METRICS = ("goodput_bps", "jain_fairness", "drops", "max_queue_bytes", "retransmissions",
                  "timeouts", "app_errors", "fct_p50_s", "fct_p99_s", "completed_flows",
                  "ecn_marks", "cnps", "credit_grants")
FAIL_METRICS = ("recovery_s", "goodput_bps", "app_errors", "timeouts", "retransmissions",
                "drops", "path_evictions", "completed_flows")


# --- plot -------------------------------------------------------------------------------------

def plot(doc: dict) -> str | None:
    plt = pyplot("sim_scale")
    if plt is None:
        return None
    fig, ax = plt.subplots(2, 2, figsize=(12, 8))
    colors = {"metaroce_credits": "tab:green", "metaroce": "tab:blue", "roce": "tab:red"}
    for buf, style in (("32 MiB", "-"), ("1 MiB", "--")):
        for c in CONTENDERS:
            pts = sorted((p for p in doc["qps"] if p["contender"] == c and p["buffer"] == buf),
                         key=lambda p: p["qps"])
            if not pts:
                continue
            xs = [p["qps"] for p in pts]
            kw = dict(color=colors[c], linestyle=style, marker="o",
                      label=f"{LABELS[c]}, buffer {buf}")
            ax[0][0].plot(xs, [p["aggregate_bps"]["median"] / 1e9 for p in pts], **kw)
            ax[0][1].plot(xs, [p["jain"]["median"] for p in pts], **kw)
    for a, yl in ((ax[0][0], "aggregate goodput, Gbit/s"), (ax[0][1], "Jain's index, per QP")):
        a.set_xscale("log", base=2)
        a.set(xlabel="QPs sharing the receiver's 100 Gbit/s link", ylabel=yl)
        a.grid(True, alpha=0.3)
    ax[0][0].set_ylim(0, 105)
    ax[0][1].set_ylim(0, 1.05)
    ax[0][1].legend(fontsize=7)
    ax[0][0].set_title("Many QPs, one link (median of seeds)")
    ax[0][1].set_title("Fairness among them")
    inc = [p for p in doc["incast"] if p["senders"] == doc["incast_focus"]]
    names = [c for c in CONTENDERS if any(p["contender"] == c for p in inc)]
    a = ax[1][0]
    vals = {p["contender"]: p for p in inc}
    xs = range(len(names))
    a.bar(xs, [vals[c]["goodput_bps"]["median"] / 1e9 for c in names],
          color=[colors[c] for c in names])
    for x, c in zip(xs, names):
        v = vals[c]
        a.annotate(f"drops {v['drops']['median']:.0f}\nJain {v['jain_fairness']['median']:.3f}\n"
                   f"max queue {v['max_queue_bytes']['median'] / 1024:.0f} KiB",
                   (x, v["goodput_bps"]["median"] / 1e9), ha="center", va="bottom", fontsize=8)
    a.set_xticks(list(xs))
    a.set_xticklabels([LABELS[c] for c in names], fontsize=8)
    a.set(ylabel="goodput, Gbit/s", ylim=(0, 135),
          title=f"Incast {doc['incast_focus']}:1, 1 MiB each (median of seeds)")
    a = ax[1][1]
    for p in doc["failure_timelines"]:
        ys = p["timeline_gbps"]
        a.plot([i * p["bin_s"] * 1e6 for i in range(len(ys))], ys, color=colors[p["contender"]],
               label=f"{LABELS[p['contender']]}, seed {p['seed']}")
    a.axvline(FAIL_AT_S * 1e6, color="k", linestyle=":", label="a spine - leaf1 link fails")
    a.set(xlabel="simulated time, µs", ylabel="delivered, Gbit/s (10 µs bins)",
          title=f"Leaf-spine, {PATHS} spines, one QP, a link fails")
    a.legend(fontsize=7)
    a.grid(True, alpha=0.3)
    return save_figure(fig, doc, "sim_scale", "sim_scale (SIMULATION, metaroce.sim)")


# --- main -------------------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true",
                   help="seeds 1-3; 1 and 1024 QPs; incast 64:1 (default)")
    g.add_argument("--full", action="store_true",
                   help="seeds 1-5; 1, 1024, 4096 QPs; incast 8, 32, 64, 128:1")
    ap.add_argument("--jobs", type=int, default=1, help="simulations run in parallel")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    seeds = list(range(1, 6 if a.full else 4))
    qps_sizes = [1, 1024, 4096] if a.full else [1, 1024]
    fan_in = [8, 32, 64, 128] if a.full else [64]
    tasks = []
    for seed in seeds:              # every contender of a seed back to back
        for n in qps_sizes:
            for buf in BUFFERS:
                for c in CONTENDERS:
                    tasks.append(("sim_qps", (n, c, seed, buf)))
        for n in fan_in:
            for c in CONTENDERS:
                tasks.append(("sim_incast", (n, c, seed)))
        for c in ("metaroce", "roce"):
            for fail in (True, False):
                tasks.append(("sim_failure", (c, seed, fail, fail and seed == 1)))
    t0 = time.monotonic()
    if a.jobs > 1:
        with Pool(a.jobs) as pool:
            res = pool.map(_task, tasks, chunksize=1)
    else:
        res = [_task(t) for t in tasks]
    wall = time.monotonic() - t0
    by = {"sim_qps": [], "sim_incast": [], "sim_failure": []}
    for (fn, _), r in zip(tasks, res):
        by[fn].append(r)
    doc = {**header("sim_scale", root=False), "simulation": True,
           "what": "metaroce.sim: the real transport engine on a deterministic discrete-event "
                   "network (integer-ns virtual clock); runs are seeds; no host CPU costs, "
                   "no PFC, no routing convergence",
           "seeds": seeds, "jobs": a.jobs, "wall_s": round(wall, 1),
           "fabric": {"rate_bps": RATE, "mtu": S.MTU, "link_delay_ns": S.Fabric().delay_ns,
                      "buffer_bytes": S.Fabric().buffer_bytes, "ecn_bytes": S.Fabric().ecn_bytes,
                      "psn_window": S.Fabric().window, "rto_min_ns": S.Fabric().min_rto_ns,
                      "compat_timeout_ns": int(4096 * 2 ** S.Fabric().compat_timeout)},
           "qps_setup": {"senders": SENDERS, "msg_bytes": 64 * S.KiB, "depth": 2,
                         "stagger_s": STAGGER_NS / 1e9, "warmup_after_starts_s": WARMUP_NS / 1e9,
                         "pkts_per_qp_in_window": PKTS_PER_QP, "buffers": BUFFERS},
           "incast_setup": {k: v for k, v in S.INCAST_DEFAULTS.items()},
           "failure_setup": {"spines": PATHS, "entropies": 4 * PATHS, "host_bps": 400e9,
                             "fabric_bps": 100e9, "size_bytes": 32 * S.MiB,
                             "fail_at_s": FAIL_AT_S},
           "incast_focus": 64,
           "qps": aggregate(by["sim_qps"], ("qps", "buffer", "contender"), QPS_METRICS),
           "incast": aggregate(by["sim_incast"], ("senders", "contender"), INCAST_METRICS),
           "failure": aggregate(by["sim_failure"], ("fail", "contender"), FAIL_METRICS),
           "failure_timelines": [r for r in by["sim_failure"] if "timeline_gbps" in r],
           "raw": {k: [{x: y for x, y in r.items() if x != "timeline_gbps"} for r in v]
                   for k, v in by.items()}}
    doc["plot"] = plot(doc)
    save(doc, "sim_scale")
    if a.json:
        print(json.dumps(doc))
        return 0
    print(render(doc))
    return 0


def render(doc: dict) -> str:
    def m(x, scale=1.0, fmt="{:.3g}"):
        return fmt.format(x["median"] * scale) if x else "-"
    lines = [f"{'QPs':>5} {'buffer':>7} {'contender':<17} {'Gbit/s':>7} {'Jain':>6} "
             f"{'starved':>7} {'drops':>7} {'RTOs':>6}"]
    for p in doc["qps"]:
        lines.append(f"{p['qps']:>5} {p['buffer']:>7} {p['contender']:<17} "
                     f"{m(p['aggregate_bps'], 1e-9):>7} {m(p['jain'], 1, '{:.3f}'):>6} "
                     f"{m(p['starved_qps']):>7} {m(p['drops']):>7} {m(p['timeouts']):>6}")
    lines.append(f"\n{'fan-in':>6} {'contender':<17} {'Gbit/s':>7} {'Jain':>6} {'drops':>7} "
                 f"{'maxq KiB':>8} {'retx':>7} {'p99 ms':>7}")
    for p in doc["incast"]:
        lines.append(f"{p['senders']:>6} {p['contender']:<17} {m(p['goodput_bps'], 1e-9):>7} "
                     f"{m(p['jain_fairness'], 1, '{:.3f}'):>6} {m(p['drops']):>7} "
                     f"{m(p['max_queue_bytes'], 1 / 1024):>8} {m(p['retransmissions']):>7} "
                     f"{m(p['fct_p99_s'], 1e3):>7}")
    lines.append(f"\n{'fail':>5} {'contender':<17} {'recovery us':>11} {'Gbit/s':>7} "
                 f"{'app err':>7} {'RTOs':>5}")
    for p in doc["failure"]:
        lines.append(f"{str(p['fail']):>5} {p['contender']:<17} "
                     f"{m(p['recovery_s'], 1e6):>11} {m(p['goodput_bps'], 1e-9):>7} "
                     f"{m(p['app_errors']):>7} {m(p['timeouts']):>5}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
