#!/usr/bin/env python3
"""Multipath on a leaf-spine lab: 1 vs 4 entropy values (UDP source ports) over two rate-limited
spine links, and a spine link taken down mid-run — MetaRoCE (paths = 4 and 1), RoCEv2 (one
fixed port, go-back-N) and TCP (iperf3, one stream and four) side by side in one run.

The lab: h1 under leaf1, h4 under leaf2, spines 1 and 2, kernel ECMP hashed on UDP/TCP ports.
Both directions of every leaf-spine link are shaped to --rate (htb), so one path carries at most
--rate and two spines 2 x --rate. Each contender sends h1 -> h4 for --seconds (RDMA WRITEs of
--size bytes, --depth in flight on one QP; iperf3 for TCP), alternately, --runs times.

Failure scenario: --fail-at seconds into the run, leaf1's interface to spine 1 is set down (the
spine's side loses carrier: leaf1 stops hashing onto it, but leaf2 and spine 1 keep sending
the reverse direction — ACKs — into the dead link). Reported: goodput over the run, the longest
gap between completions after the failure (time to recover; for TCP from 100 ms iperf3
intervals), and application errors (error completions; must be none for MetaRoCE).

    sudo .venv/bin/python tools/bench/multipath.py [--quick | --full] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

from benchlab import (close_pair, fresh_lab, header, pyplot, qp_pair, save, save_figure,
                      stop_daemons, summary)
from metaroce.lab import core, shaping
from metaroce.lab.plan import parse_rate
from metaroce.nic import daemon as d
from metaroce.verbs import (IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_REMOTE_WRITE, IBV_WC_SUCCESS,
                            IBV_WR_RDMA_WRITE, Context, SendWR)

LAB = "benchmp"
ACCESS = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE
CONTENDERS = ("metaroce_4paths", "metaroce_1path", "roce", "tcp_1stream", "tcp_4streams")


def _spine_links(view):
    return [view.plan.link(f"leaf{leaf}-spine{s}") for leaf in (1, 2) for s in (1, 2)]


def shape_spines(view, rate_bps: int) -> None:
    for link in _spine_links(view):
        for node, iface in (link.a, link.b):
            shaping.shape(view.plan.node(node).netns, iface, rate_bps, view.plan.mtu)


def spine_rx(view) -> dict:
    links = {l["name"]: l["counters"] for l in view.status()["links"]}
    return {s: links[f"leaf1-spine{s}"]["a-b"]["rx_packets"] for s in (1, 2)}


def set_link(view, up: bool) -> None:
    """leaf1's interface towards spine 1, administratively up or down."""
    node, iface = view.plan.link("leaf1-spine1").a
    subprocess.run(["ip", "-n", view.plan.node(node).netns, "link", "set", iface,
                    "up" if up else "down"], check=True)


def rdma_run(c1, c4, ip1, ip4, mode, paths, size, depth, seconds, fail_at=None, view=None):
    attr = {"paths": paths} if mode == "metaroce" else {}
    a, b = qp_pair(c1, c4, ip1, ip4, mode, size * depth, ACCESS, **attr)
    (ma, ca, qa), mb = (a.mr, a.cq, a.qp), b.mr
    done, errors, stamps, outstanding, nxt = 0, 0, [], 0, 0
    timer = None
    t0 = time.monotonic()
    if fail_at is not None:
        timer = threading.Timer(fail_at, set_link, (view, False))
        timer.start()
    end = t0 + seconds
    try:
        while True:
            now = time.monotonic()
            while outstanding < depth and now < end and not errors:
                slot = nxt % depth
                qa.post_send(SendWR(IBV_WR_RDMA_WRITE, wr_id=nxt, sg_list=[ma.sge(slot * size, size)],
                                    remote_addr=mb.addr + slot * size, rkey=mb.rkey))
                nxt += 1
                outstanding += 1
            if not outstanding:
                break
            try:
                wcs = ca.wait(1, timeout_s=max(5.0, end - now + 60))
            except Exception:  # noqa: BLE001 (nothing completes: the QP is stuck; an error)
                errors += outstanding
                break
            for w in wcs:
                outstanding -= 1
                if w.status != IBV_WC_SUCCESS:
                    errors += 1
                else:
                    done += size
                    stamps.append(time.monotonic() - t0)
    finally:
        elapsed = time.monotonic() - t0
        if timer is not None:
            timer.cancel()
        st = qa.query()
        close_pair(a, b)
    out = {"goodput_bps": done * 8 / elapsed, "app_errors": errors,
           "retransmitted_packets": st.get("retransmitted_packets", 0),
           "path_evictions": st.get("path_evictions", 0), "rto_expired": st.get("rto_expired", 0)}
    if fail_at is not None:
        after = [t for t in stamps if t >= fail_at]
        gaps = [b - a for a, b in zip([fail_at] + after, after)]
        out["recovery_s"] = max(gaps) if gaps and not errors else None
        out["goodput_after_bps"] = (len(after) * size * 8 / (elapsed - fail_at)
                                    if elapsed > fail_at else 0.0)
    return out


def tcp_run(view, streams, seconds, fail_at=None):
    ns1, ns4 = view.plan.node("h1").netns, view.plan.node("h4").netns
    ip4 = view.plan.node("h4").iface("eth0").ipv4.split("/")[0]
    srv = subprocess.Popen(["ip", "netns", "exec", ns4, "iperf3", "-s", "-1", "-p", "5299"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.4)
    timer = None
    if fail_at is not None:
        timer = threading.Timer(fail_at + 0.3, set_link, (view, False))   # + iperf3's start
    try:
        if timer:
            timer.start()
        p = subprocess.run(["ip", "netns", "exec", ns1, "iperf3", "-c", ip4, "-p", "5299", "-t",
                            str(seconds), "-P", str(streams), "-i", "0.1", "-J"],
                           capture_output=True, text=True, timeout=seconds + 60)
        try:
            doc = json.loads(p.stdout)
        except ValueError:
            raise RuntimeError(f"iperf3: {p.stderr.strip() or p.stdout.strip()}") from None
    finally:
        if timer:
            timer.cancel()
        srv.wait(timeout=30)
    out = {"goodput_bps": doc["end"]["sum_received"]["bits_per_second"], "app_errors": 0}
    if fail_at is not None:
        iv = [(i["sum"]["start"], i["sum"]["bytes"]) for i in doc["intervals"]]
        base = sorted(b for t, b in iv if t < fail_at)
        ref = base[len(base) // 2] if base else 0
        run = best = 0.0
        for t, b in iv:
            if t < fail_at:
                continue
            run = run + 0.1 if b < 0.1 * ref else 0.0
            best = max(best, run)
        out["recovery_s"] = best
        after = [b for t, b in iv if t >= fail_at]
        out["goodput_after_bps"] = sum(after) * 8 / max(1e-9, len(after) * 0.1)
    return out


def one(name, view, c1, c4, ip1, ip4, a, seconds, fail_at=None):
    if name.startswith("tcp"):
        return tcp_run(view, 1 if name == "tcp_1stream" else 4, seconds, fail_at)
    mode = "roce" if name == "roce" else "metaroce"
    paths = 4 if name == "metaroce_4paths" else 1
    return rdma_run(c1, c4, ip1, ip4, mode, paths, a.size, a.depth, seconds, fail_at, view)


def plot(doc):
    plt = pyplot("multipath")
    if plt is None:
        return None
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    names = list(CONTENDERS)
    for i, (key, title) in enumerate((("steady", "goodput, both spines up"),
                                      ("failure", "goodput with a spine link down mid-run"))):
        ys = [(doc[key][n]["goodput_bps"] or {"median": 0})["median"] / 1e6 for n in names]
        ax[i].bar(range(len(names)), ys)
        ax[i].axhline(doc["rate_bps"] / 1e6, color="grey", ls="--", lw=1, label="one spine link")
        ax[i].set_xticks(range(len(names)))
        ax[i].set_xticklabels([n.replace("_", "\n") for n in names], fontsize=8)
        ax[i].set(ylabel="Mbit/s (median)", title=title)
        ax[i].legend()
    return save_figure(fig, doc, "multipath", f"multipath (leaf-spine lab, {doc['runs']} runs)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", help="3 runs of 4 s")
    g.add_argument("--full", action="store_true", help="5 runs of 8 s")
    ap.add_argument("--rate", default="100mbit", help="each spine link's rate (default 100mbit)")
    ap.add_argument("--size", type=int, default=64 * 1024)
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    runs, secs = (5, 8.0) if a.full else (3, 4.0)
    fail_at = secs / 3
    rate_bps = parse_rate(a.rate)
    view = fresh_lab(LAB, "leaf-spine", hosts=4)
    devs = [d.DeviceId("eth0", view.plan.node(h).netns) for h in ("h1", "h4")]
    started = []
    raw = {k: {n: [] for n in CONTENDERS} for k in ("steady", "failure")}
    spines_used = []
    try:
        shape_spines(view, rate_bps)
        for dev in devs:
            d.start_background(dev, "metaroce")
            started.append(dev)
        c1 = Context("eth0", devs[0].netns, timeout_s=120)
        c4 = Context("eth0", devs[1].netns, timeout_s=120)
        ip1, ip4 = (view.plan.node(h).iface("eth0").ipv4.split("/")[0] for h in ("h1", "h4"))
        for r in range(runs):
            for name in CONTENDERS:
                print(f"multipath: run {r + 1}/{runs} {name} steady", file=sys.stderr)
                before = spine_rx(view)
                raw["steady"][name].append(one(name, view, c1, c4, ip1, ip4, a, secs))
                after = spine_rx(view)
                spines_used.append({"run": r, "contender": name,
                                    **{f"spine{s}_pkts": after[s] - before[s] for s in (1, 2)}})
                print(f"multipath: run {r + 1}/{runs} {name} spine link down at {fail_at:.1f} s",
                      file=sys.stderr)
                try:
                    raw["failure"][name].append(one(name, view, c1, c4, ip1, ip4, a, secs,
                                                    fail_at))
                finally:
                    set_link(view, True)
                    time.sleep(2.0)              # routes revive; stragglers drain
        c1.close()
        c4.close()
    finally:
        stop_daemons(started)
        core.down(LAB)
    doc = {**header("multipath"), "runs": runs, "seconds": secs, "fail_at_s": fail_at,
           "rate_bps": rate_bps, "size": a.size, "depth": a.depth, "spines_used": spines_used}
    for k in ("steady", "failure"):
        doc[k] = {}
        for n, rs in raw[k].items():
            doc[k][n] = {m: summary([x.get(m) for x in rs]) for m in
                         ("goodput_bps", "goodput_after_bps", "recovery_s", "retransmitted_packets",
                          "path_evictions", "rto_expired")}
            doc[k][n]["app_errors"] = sum(x.get("app_errors", 0) for x in rs)
    doc["plot"] = plot(doc)
    save(doc, "multipath")
    if a.json:
        print(json.dumps(doc))
        return 0
    print(f"{'contender':<16} {'steady Mb/s':>11} {'failure Mb/s':>12} {'recovery s':>10} "
          f"{'errors':>6}")
    for n in CONTENDERS:
        s, f = doc["steady"][n], doc["failure"][n]
        rec = f["recovery_s"]["median"] if f["recovery_s"] else float("nan")
        print(f"{n:<16} {s['goodput_bps']['median'] / 1e6:>11.1f} "
              f"{f['goodput_bps']['median'] / 1e6:>12.1f} {rec:>10.2f} {f['app_errors']:>6}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
