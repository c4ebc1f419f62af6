#!/usr/bin/env python3
"""Goodput and message completion time under random loss: MetaRoCE mode (selective repeat)
against RoCEv2 compat mode (go-back-N) and TCP (iperf3), on the same lab link, side by side.

A two-host lab; both devices offer MetaRoCE; for each loss rate the lab's XDP impairment drops
that fraction of frames in both directions of h1's link (the same seeded draw for every
contender; every IP frame, TCP's too, unless --roce-only), then each contender runs for
--seconds: RDMA WRITEs of --size bytes with --depth in flight on one QP (goodput = bytes
completed / time; completion time of each message from post to its completion), and iperf3 for
TCP goodput. Loss alone keeps the lab's switch forwarding in XDP, so every contender crosses the
same path with and without loss. Repeated --runs times, alternating contenders; medians (min,
max) go to JSON and a PNG plot.

    sudo .venv/bin/python tools/bench/loss_sweep.py [--quick | --full] [--roce-only] [--lab NAME] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from benchlab import (close_pair, header, path_mtu, pyplot, qp_pair, save_figure, summary,
                      two_hosts)
from metaroce.lab.impair import Impairment
from metaroce.verbs import (IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_REMOTE_WRITE, IBV_WC_SUCCESS,
                            IBV_WR_RDMA_WRITE, Context, SendWR, wc_status_str)

HERE = os.path.dirname(os.path.abspath(__file__))
LAB = "benchloss"
ACCESS = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE


def rdma_run(c1, c2, ip1, ip2, mode, size, depth, seconds):
    a, b = qp_pair(c1, c2, ip1, ip2, mode, size * depth, ACCESS)
    (ma, ca, qa), mb = (a.mr, a.cq, a.qp), b.mr
    posted_at, fct, done_bytes, errors = {}, [], 0, 0
    t0 = time.monotonic()
    end = t0 + seconds
    nxt = 0
    try:
        while True:
            now = time.monotonic()
            while len(posted_at) < depth and now < end:
                slot = nxt % depth
                qa.post_send(SendWR(IBV_WR_RDMA_WRITE, wr_id=nxt, sg_list=[ma.sge(slot * size, size)],
                                    remote_addr=mb.addr + slot * size, rkey=mb.rkey))
                posted_at[nxt] = time.monotonic()
                nxt += 1
            if not posted_at:
                break
            for w in ca.wait(1, timeout_s=120):
                if w.status != IBV_WC_SUCCESS:
                    errors += 1
                    raise RuntimeError(f"{mode}: {wc_status_str(w.status)}")
                fct.append(time.monotonic() - posted_at.pop(w.wr_id))
                done_bytes += size
    finally:
        elapsed = time.monotonic() - t0
        q = qa.query()
        retx = q.get("retransmitted_packets", 0)
        close_pair(a, b)
    fct.sort()
    p99 = fct[max(0, int(len(fct) * 0.99) - 1)] if fct else None
    return {"goodput_bps": done_bytes * 8 / elapsed, "fct_p50_s": fct[len(fct) // 2] if fct else None,
            "fct_p99_s": p99, "messages": len(fct), "retransmitted_packets": retx,
            "rto_expired": q.get("rto_expired", 0), "srtt_us": q.get("srtt_us"),
            "min_rtt_us": q.get("min_rtt_us"), "rttvar_us": q.get("rttvar_us"),
            "cwnd_pkts": q.get("cwnd_pkts"), "cwnd_loss_cuts": q.get("cwnd_loss_cuts", 0),
            "cwnd_ecn_cuts": q.get("cwnd_ecn_cuts", 0), "app_errors": errors}


def tcp_run(ns1, ns2, ip2, seconds):
    srv = subprocess.Popen(["ip", "netns", "exec", ns2, "iperf3", "-s", "-1", "-p", "5297"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.4)
    try:
        p = subprocess.run(["ip", "netns", "exec", ns1, "iperf3", "-c", ip2, "-p", "5297", "-t",
                            str(seconds), "-J"], capture_output=True, text=True,
                           timeout=seconds + 60)
        return {"goodput_bps": json.loads(p.stdout)["end"]["sum_received"]["bits_per_second"]}
    finally:
        srv.wait(timeout=30)


def plot(doc, name="loss_sweep"):
    plt = pyplot("loss_sweep")
    if plt is None:
        return None
    losses = [p["loss"] * 100 for p in doc["points"]]
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    for key, label in (("metaroce", "MetaRoCE (selective repeat)"), ("roce", "RoCEv2 (go-back-N)"),
                       ("tcp", "TCP (iperf3)")):
        ys = [p[key]["goodput_bps"]["median"] / 1e9 for p in doc["points"]]
        ax[0].plot(losses, ys, marker="o", label=label)
        if key != "tcp":
            ys = [(p[key]["fct_p99_s"] or {"median": float("nan")})["median"] * 1e3
                  for p in doc["points"]]
            ax[1].plot(losses, ys, marker="o", label=label)
    ax[0].set(xlabel="random loss each way (%)", ylabel="goodput (Gbit/s)",
              title="Goodput (median)")
    ax[1].set(yscale="log", xlabel="random loss each way (%)",
              ylabel="p99 message completion (ms)", title=f"{doc['size']}-byte WRITE completion")
    for a in ax:
        a.set_xscale("symlog", linthresh=0.01)
        a.set_xticks(losses)
        a.set_xticklabels([f"{x:g}" for x in losses])
        a.grid(True, alpha=0.3)
        a.legend()
    return save_figure(fig, doc, name, f"loss_sweep (lab veth, {doc['runs']} runs)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", help="3 runs of 2 s at 0, 0.1, 1, 5 %%")
    g.add_argument("--full", action="store_true", help="5 runs of 4 s at 0, 0.01, 0.1, 1, 5 %%")
    ap.add_argument("--size", type=int, default=256 * 1024)
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--roce-only", action="store_true",
                    help="impair only UDP 4791 (RoCE), as before: TCP then runs without loss")
    ap.add_argument("--lab", default=LAB, help=f"lab name (default {LAB})")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    runs, secs, losses = ((5, 4, [0, 0.0001, 0.001, 0.01, 0.05]) if a.full else
                          (3, 2, [0, 0.001, 0.01, 0.05]))
    points = []
    with two_hosts(a.lab) as lab:
        view = lab.view
        c1 = Context("eth0", lab.ns1, timeout_s=120)
        c2 = Context("eth0", lab.ns2, timeout_s=120)
        pmtu = {m: path_mtu(m, c1, c2) for m in ("metaroce", "roce")}    # qp_pair's
        for loss in losses:
            raw = {"metaroce": [], "roce": [], "tcp": []}
            for r in range(runs):
                print(f"loss_sweep: loss {loss:.2%} run {r + 1}/{runs}", file=sys.stderr)
                imp = (Impairment(loss=loss, seed=100 + r, all_traffic=not a.roce_only).validate()
                       if loss else None)
                view.impair("h1-sw1", "both", imp)
                for mode in ("metaroce", "roce"):
                    try:
                        raw[mode].append(rdma_run(c1, c2, lab.ip1, lab.ip2, mode, a.size, a.depth,
                                                  secs))
                    except Exception as exc:  # noqa: BLE001 (an application error is a result)
                        raw[mode].append({"goodput_bps": 0.0, "fct_p50_s": None,
                                          "fct_p99_s": None, "app_errors": 1, "error": str(exc)})
                raw["tcp"].append(tcp_run(lab.ns1, lab.ns2, lab.ip2, secs))
            view.impair("h1-sw1", "both", None)
            pt = {"loss": loss}
            for k, rs in raw.items():
                pt[k] = {m: summary([r.get(m) for r in rs]) for m in
                         ("goodput_bps", "fct_p50_s", "fct_p99_s", "retransmitted_packets",
                          "rto_expired", "srtt_us", "min_rtt_us", "rttvar_us", "cwnd_pkts",
                          "cwnd_loss_cuts")
                         if any(m in r for r in rs)}
                pt[k]["app_errors"] = sum(r.get("app_errors", 0) for r in rs)
            points.append(pt)
        c1.close()
        c2.close()
    doc = {**header("loss_sweep"), "runs": runs, "seconds": secs, "size": a.size, "pmtu": pmtu,
           "depth": a.depth, "impaired": "udp 4791" if a.roce_only else "all ip", "points": points}
    out = os.path.join(HERE, "results", "loss_sweep.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    doc["plot"] = plot(doc)
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
    if a.json:
        print(json.dumps(doc))
        return 0
    print(f"{'loss':>7} {'MetaRoCE Gb/s':>14} {'RoCEv2 Gb/s':>12} {'TCP Gb/s':>9} "
          f"{'MR p99 ms':>10} {'RoCE p99 ms':>12}")
    for p in points:
        def g(k):
            return p[k]["goodput_bps"]["median"] / 1e9

        def f(k):
            v = p[k].get("fct_p99_s")
            return v["median"] * 1e3 if v else float("nan")
        print(f"{p['loss']:>7.2%} {g('metaroce'):>14.3f} {g('roce'):>12.3f} {g('tcp'):>9.3f} "
              f"{f('metaroce'):>10.2f} {f('roce'):>12.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
