#!/usr/bin/env python3
"""N-to-1 incast on a real lab: N senders WRITE to one receiver through a shaped switch port.

A star lab (h1 receives, h2 .. h(N+1) send), every switch egress shaped with htb to --rate
(default 200 Mbit/s, so this 2-vCPU machine can overload it; the queue in front of it holds
1000 frames) with the lab's ECN marking above 64 KB of virtual queue; a `metaroce up` daemon
(the XDP NIC) on every host. For N = 2, 4, 8, 16 senders and each repetition, the contenders
run one after another on the same lab and daemons:
  - MetaRoCE mode: one QP per sender, RDMA WRITEs of 64 KiB, 16 posted per QP, for --seconds;
  - RoCEv2 compat mode (go-back-N): the same;
  - TCP: one iperf3 stream per sender to its own server on h1 (cubic);
  - MetaRoCE + receiver credits, when `metaroce up --help` lists --credits: the receiver's
    daemon is restarted once with --credits --link-rate RATE and this contender runs after the
    others for every N (restarting a daemon between contenders costs ~10 s each time); the
    others run with --no-credits.
Measured per run: aggregate goodput (bytes of the WRITEs completed inside the timed window;
TCP: iperf3's received bytes), Jain's index over the senders' goodputs, drops at the
bottleneck (the htb queue's drop counter on sw1's port to h1), ECN CE marks there (the lab's
tc counter), the queue's deepest sampled backlog, retransmitted packets and RTO expiries (the
senders' daemons' QP counters; TCP: iperf3's retransmits), the senders' smoothed RTT,
application errors (failed work completions, failed QPs). Medians (min, max) of --runs go to
JSON and a PNG plot in tools/bench/results/.

    sudo .venv/bin/python tools/bench/incast.py [--quick | --full] [--rate 200mbit] [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from benchlab import (cli_supports, fresh_lab, header, jain, path_mtu, pyplot, save,
                      save_figure, start_daemons, stop_daemons, summary)
from metaroce.lab import core, shaping
from metaroce.lab.fabric import Fabric
from metaroce.lab.plan import parse_rate
from metaroce.nic import daemon as d
from metaroce.verbs import (CQ, MR, PD, QP, IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_REMOTE_WRITE,
                            IBV_WC_SUCCESS, IBV_WR_RDMA_WRITE, Context, QPCap, QPInitAttr,
                            SendWR, wait_for_completions, wc_status_str)

LAB = "bincast"
MSG = 64 * 1024
DEPTH = 16
CREDIT_RTT_US = 2000          # the credit BDP's round trip: this lab's loaded RTT is ~1-3 ms
LABELS = {"metaroce": "MetaRoCE", "roce": "RoCEv2 (go-back-N)", "tcp": "TCP (iperf3, cubic)",
          "metaroce_credits": "MetaRoCE + credits"}


class Lab:
    """The star, its daemons and one verbs context (PD, MR, CQ) per host."""

    def __init__(self, senders: int, rate_bps: int):
        self.n = senders
        self.rate = rate_bps
        self.view = fresh_lab(LAB, "star", hosts=senders + 1, rate=str(rate_bps))
        self.hosts = [f"h{i + 1}" for i in range(senders + 1)]
        self.ns = {h: self.view.plan.node(h).netns for h in self.hosts}
        self.ip = {h: self.view.plan.node(h).iface("eth0").ipv4.split("/")[0] for h in self.hosts}
        self.devs = {h: d.DeviceId("eth0", self.ns[h]) for h in self.hosts}
        self.sw_ns = self.view.plan.node("sw1").netns
        self.port = self.view.ports[("sw1", "h1")]
        self.ctx: dict[str, Context] = {}
        self.bufs: dict[str, tuple] = {}

    # -- daemons --
    def start(self, extra: list[str]) -> None:
        start_daemons(list(self.devs.values()), "metaroce", extra)

    def restart_receiver(self, extra: list[str]) -> None:
        self.close_host("h1")
        stop_daemons([self.devs["h1"]])
        start_daemons([self.devs["h1"]], "metaroce", extra)

    def open(self) -> None:
        for h in self.hosts:
            if h not in self.ctx:
                c = Context("eth0", self.ns[h], timeout_s=120)
                pd = PD(c)
                size = MSG * DEPTH * (self.n if h == "h1" else 1)
                mr = MR(pd, size, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)
                self.ctx[h] = c
                self.bufs[h] = (pd, mr, CQ(c, 4096))

    def close_host(self, h: str) -> None:
        if h in self.ctx:
            self.bufs.pop(h)[1].close()
            self.ctx.pop(h).close()

    def close(self) -> None:
        for h in list(self.ctx):
            try:
                self.close_host(h)
            except Exception:  # noqa: BLE001 (its daemon may be gone)
                pass
        stop_daemons([dev for dev in self.devs.values() if d.running_pid(dev)])
        core.down(LAB)

    # -- the bottleneck: sw1's egress toward h1 --
    def bottleneck(self) -> dict:
        q = shaping.queue_stats(self.sw_ns, "h1")
        with Fabric(LAB) as fab:
            st = fab.port_stats(self.port)
        return {"drops": q["drops"], "backlog_bytes": q["backlog_bytes"],
                "tx_packets": st["tx_packets"], "tx_bytes": st["tx_bytes"],
                "ecn_marked": st["ecn_marked"], "ecn_not_ect": st["ecn_not_ect"]}

    def settle(self, timeout_s: float = 10.0) -> None:
        """Wait until the bottleneck queue is empty (the last run's tail has drained)."""
        end = time.monotonic() + timeout_s
        while self.bottleneck()["backlog_bytes"] and time.monotonic() < end:
            time.sleep(0.05)
        time.sleep(0.1)


def delta(after: dict, before: dict) -> dict:
    return {k: after[k] - before[k] for k in ("drops", "tx_packets", "tx_bytes", "ecn_marked",
                                              "ecn_not_ect")}


def rdma_run(lab: Lab, n: int, mode: str, seconds: float, credit: bool = False) -> dict:
    """credit: the senders' QPs know their peer grants credits (what the CM's CREDIT
    capability says, CC-8): they start in credit mode and obey flag C."""
    senders = lab.hosts[1:n + 1]
    rpd, rmr, rcq = lab.bufs["h1"]
    cap = QPCap(max_send_wr=2 * DEPTH, max_recv_wr=1)
    pairs = []
    try:
        for h in senders:
            pd, _, cq = lab.bufs[h]
            a = QP(pd, QPInitAttr(cq, cq, cap))
            b = QP(rpd, QPInitAttr(rcq, rcq, cap))
            pairs.append((h, a, b))
            mtu = path_mtu(mode, lab.ctx[h], lab.ctx["h1"])
            a.connect({"qpn": b.qp_num, "psn": b.psn, "ip": lab.ip["h1"], "mode": mode,
                       "mtu": mtu}, **({"credit": True} if credit else {}))
            b.connect({"qpn": a.qp_num, "psn": a.psn, "ip": lab.ip[h], "mode": mode,
                       "mtu": mtu})
        lab.settle()
        before = lab.bottleneck()
        done = {h: 0 for h in senders}
        posted = {h: 0 for h in senders}
        outstanding = {h: 0 for h in senders}
        errors: list[str] = []
        backlog_max = 0

        def post(i, h, a, k):
            wrs = []
            for _ in range(k):
                slot = posted[h] % DEPTH
                wrs.append(SendWR(IBV_WR_RDMA_WRITE, wr_id=posted[h],
                                  sg_list=[lab.bufs[h][1].sge(slot * MSG, MSG)],
                                  remote_addr=rmr.addr + (i * DEPTH + slot) * MSG,
                                  rkey=rmr.rkey))
                posted[h] += 1
            a.post_send(wrs)
            outstanding[h] += k

        t0 = time.monotonic()
        end = t0 + seconds
        for i, (h, a, _) in enumerate(pairs):
            post(i, h, a, DEPTH)
        index = {h: i for i, h in enumerate(senders)}
        qp_of = {h: a for h, a, _ in pairs}
        next_sample = t0
        drain_until = None
        while any(outstanding.values()):
            now = time.monotonic()
            if now >= end and drain_until is None:
                drain_until = now + 30
            if drain_until is not None and now > drain_until:
                errors.append(f"drain: {sum(outstanding.values())} WRITEs not completed 30 s "
                              "after the window")
                break
            if now >= next_sample:
                backlog_max = max(backlog_max, lab.bottleneck()["backlog_bytes"])
                next_sample = now + 0.1
            wait_for_completions([lab.bufs[h][2] for h in senders], 0.05)
            for h in senders:
                got = 0
                for w in lab.bufs[h][2].poll(4 * DEPTH):
                    outstanding[h] -= 1
                    if w.status != IBV_WC_SUCCESS:
                        errors.append(f"{h}: {wc_status_str(w.status)}")
                        continue
                    if time.monotonic() <= end:
                        done[h] += 1
                        got += 1
                if got and time.monotonic() < end and not errors:
                    post(index[h], h, qp_of[h], got)
        after = lab.bottleneck()
        qst = [a.query() for _, a, _ in pairs]
        rst = [b.query() for _, _, b in pairs]
        rstatus = lab.ctx["h1"].status()
        per = [done[h] * MSG * 8 / seconds for h in senders]
        return {"goodput_bps": sum(per), "jain": jain(per), "per_sender_bps": per,
                **delta(after, before), "queue_backlog_max_bytes": backlog_max,
                "retransmitted_packets": sum(q.get("retransmitted_packets", 0) for q in qst),
                "rto_expired": sum(q.get("rto_expired", 0) for q in qst),
                "sent_packets": sum(q.get("sent_packets", 0) for q in qst),
                "credit_grants": sum(q.get("credit_grants", 0) for q in qst),
                "credit_blocked": sum(q.get("credit_blocked", 0) for q in qst),
                "srtt_us": (summary([q.get("srtt_us") for q in qst]) or {}).get("median"),
                "receiver_ecn_marked": sum(q.get("np_ecn_marked_roce_packets", 0) for q in rst),
                "receiver_credits": rstatus.get("credits"),
                "app_errors": len(errors),
                "failed_qps": len({e.split(":")[0] for e in errors if not e.startswith("drain")}),
                "errors": errors[:5]}
    finally:
        for _, a, b in pairs:
            for q in (a, b):
                try:
                    q.close()
                except Exception:  # noqa: BLE001 (a failed QP is already gone)
                    pass


def tcp_run(lab: Lab, n: int, seconds: float, run: int) -> dict:
    senders = lab.hosts[1:n + 1]
    ports = [5400 + 20 * (run % 10) + i for i in range(n)]
    lab.settle()
    srvs = [subprocess.Popen(["ip", "netns", "exec", lab.ns["h1"], "iperf3", "-s", "-1", "-p",
                              str(p)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for p in ports]
    time.sleep(0.5)
    before = lab.bottleneck()
    try:
        # every client sleeps until the same instant, so the streams share one window
        go = time.time() + 0.5 + 0.05 * n
        cls = []
        for h, p in zip(senders, ports):
            wait = max(0.0, go - time.time())
            cls.append(subprocess.Popen(
                ["ip", "netns", "exec", lab.ns[h], "sh", "-c",
                 f"sleep {wait:.3f}; exec iperf3 -c {lab.ip['h1']} -p {p} -t {seconds:g} -J"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        backlog_max = 0
        while any(c.poll() is None for c in cls):
            backlog_max = max(backlog_max, lab.bottleneck()["backlog_bytes"])
            time.sleep(0.1)
        docs, errors = [], []
        for c in cls:
            out, err = c.communicate(timeout=seconds + 60)
            try:
                docs.append(json.loads(out)["end"])
            except (ValueError, KeyError):
                docs.append(None)
                errors.append((err or out)[-200:])
        after = lab.bottleneck()
    finally:
        for s in srvs:
            try:
                s.wait(timeout=10)
            except subprocess.TimeoutExpired:
                s.kill()
                s.wait()
    # bytes over the (common) window, as for the RDMA contenders
    per = [x["sum_received"]["bytes"] * 8 / seconds if x else 0.0 for x in docs]
    return {"goodput_bps": sum(per), "jain": jain(per), "per_sender_bps": per,
            **delta(after, before), "queue_backlog_max_bytes": backlog_max,
            "retransmitted_packets": sum(x["sum_sent"].get("retransmits", 0) for x in docs if x),
            "app_errors": len(errors), "failed_qps": len(errors), "errors": errors[:5]}


METRICS = ("goodput_bps", "jain", "drops", "ecn_marked", "ecn_not_ect", "tx_packets",
           "retransmitted_packets", "rto_expired", "queue_backlog_max_bytes", "credit_grants",
           "credit_blocked", "receiver_ecn_marked", "srtt_us", "app_errors", "failed_qps")


def plot(doc: dict) -> str | None:
    plt = pyplot("incast")
    if plt is None:
        return None
    fig, ax = plt.subplots(1, 4, figsize=(18, 4.3))
    ns = doc["senders"]
    for c in doc["contenders"]:
        pts = [doc["points"][str(n)][c] for n in ns]
        for a, key, scale in ((ax[0], "goodput_bps", 1e-6), (ax[1], "jain", 1),
                              (ax[2], "drops", 1), (ax[3], "queue_backlog_max_bytes", 1e-3)):
            ys = [p[key]["median"] * scale if p.get(key) else float("nan") for p in pts]
            lo = [y - p[key]["min"] * scale if p.get(key) else 0 for y, p in zip(ys, pts)]
            hi = [p[key]["max"] * scale - y if p.get(key) else 0 for y, p in zip(ys, pts)]
            a.errorbar(ns, ys, yerr=[lo, hi], marker="o", capsize=3, label=LABELS[c])
    rate = doc["rate_bps"] / 1e6
    ax[0].axhline(rate, color="k", linestyle=":", label=f"link {rate:g} Mbit/s")
    ax[0].set(ylabel="aggregate goodput, Mbit/s", title="Goodput through the shaped link")
    ax[1].set(ylabel="Jain's index over senders", ylim=(0, 1.05), title="Fairness")
    ax[2].set(ylabel="frames dropped at the bottleneck", title="Drops (htb queue, 1000 frames)")
    ax[2].set_yscale("symlog", linthresh=10)
    ax[3].set(ylabel="deepest sampled backlog, KB", title="Bottleneck queue (sampled / 100 ms)")
    for a in ax:
        a.set_xscale("log", base=2)
        a.set_xticks(ns)
        a.set_xticklabels([str(n) for n in ns])
        a.set_xlabel("senders")
        a.grid(True, alpha=0.3)
    ax[0].legend(fontsize=8)
    return save_figure(fig, doc, "incast", f"incast, lab star, {rate:g} Mbit/s bottleneck, "
                                           f"median (min-max) of {doc['runs']} runs")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", help="3 runs of 2 s per point (default)")
    g.add_argument("--full", action="store_true", help="5 runs of 5 s per point")
    ap.add_argument("--senders", default="2,4,8,16", help="comma-separated sender counts")
    ap.add_argument("--rate", default="200mbit", help="bottleneck rate (every switch egress)")
    ap.add_argument("--no-tcp", action="store_true", help="leave TCP out")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    runs, secs = (5, 5.0) if a.full else (3, 2.0)
    ns = sorted(int(x) for x in a.senders.split(","))
    rate = parse_rate(a.rate)
    doc = header("incast")
    credits = cli_supports(["up"], "--credits")
    contenders = ["metaroce", "roce"] + ([] if a.no_tcp else ["tcp"])
    phase2 = ["metaroce_credits"] if credits else []
    raw = {str(n): {c: [] for c in contenders + phase2} for n in ns}
    t_start = time.monotonic()
    lab = Lab(max(ns), rate)
    setup = {}
    try:
        t = time.monotonic()
        lab.start(["--no-credits"] if credits else [])
        setup["daemons_start_s"] = round(time.monotonic() - t, 1)
        lab.open()
        pmtu = {m: path_mtu(m, *lab.ctx.values()) for m in ("metaroce", "roce")}  # rdma_run's
        for n in ns:
            for r in range(runs):
                for c in contenders:
                    print(f"incast: {n} senders, run {r + 1}/{runs}, {c}", file=sys.stderr,
                          flush=True)
                    raw[str(n)][c].append(tcp_run(lab, n, secs, r) if c == "tcp"
                                          else rdma_run(lab, n, c, secs))
        if phase2:
            t = time.monotonic()
            lab.restart_receiver(["--credits", "--link-rate", str(rate),
                                  "--credit-rtt-us", str(CREDIT_RTT_US)])
            setup["receiver_restart_s"] = round(time.monotonic() - t, 1)
            lab.open()
            for n in ns:
                for r in range(runs):
                    print(f"incast: {n} senders, run {r + 1}/{runs}, metaroce + credits",
                          file=sys.stderr, flush=True)
                    raw[str(n)]["metaroce_credits"].append(rdma_run(lab, n, "metaroce", secs,
                                                                   credit=True))
    finally:
        lab.close()
    points = {n: {c: {m: summary([x.get(m) for x in rs]) for m in METRICS
                      if any(m in x for x in rs)} for c, rs in per.items()}
              for n, per in raw.items()}
    for n, per in points.items():
        for c, p in per.items():
            p["app_errors_total"] = sum(x["app_errors"] for x in raw[n][c])
            p["failed_qps_total"] = sum(x["failed_qps"] for x in raw[n][c])
    doc.update({"kind": "lab: the real data path (XDP programs and MetaRoCE daemons in network "
                        "namespaces on one VM), not a simulation",
                "runs": runs, "seconds": secs, "rate_bps": rate, "ecn_threshold_bytes": 65536,
                "queue_limit_frames": 1000, "msg_bytes": MSG, "depth_per_qp": DEPTH,
                "senders": ns, "contenders": contenders + phase2, "pmtu": pmtu,
                "credits": ({"supported": True, "link_rate_bps": rate,
                             "credit_rtt_us": CREDIT_RTT_US,
                             "how": "receiver daemon restarted with --credits after the other "
                                    "contenders; the others ran with --no-credits"}
                            if credits else
                            {"supported": False,
                             "note": "receiver credits are not built into the data path yet "
                                     "(`metaroce up --help` has no --credits)"}),
                "setup": setup, "wall_s": round(time.monotonic() - t_start, 1),
                "points": points, "raw": raw})
    doc["plot"] = plot(doc)
    save(doc, "incast")
    if a.json:
        print(json.dumps(doc))
        return 0
    print(render(doc))
    return 0


def render(doc: dict) -> str:
    def m(x, scale=1.0, fmt="{:.3g}"):
        return fmt.format(x["median"] * scale) if x else "-"
    lines = [f"{'N':>3} {'contender':<17} {'Mbit/s':>7} {'Jain':>6} {'drops':>7} {'CE':>7} "
             f"{'retx':>7} {'backlog KB':>10} {'failed QPs':>10}"]
    for n in doc["senders"]:
        for c in doc["contenders"]:
            p = doc["points"][str(n)][c]
            lines.append(f"{n:>3} {c:<17} {m(p['goodput_bps'], 1e-6):>7} "
                         f"{m(p['jain'], 1, '{:.3f}'):>6} {m(p['drops']):>7} "
                         f"{m(p['ecn_marked']):>7} {m(p.get('retransmitted_packets')):>7} "
                         f"{m(p.get('queue_backlog_max_bytes'), 1e-3):>10} "
                         f"{p['failed_qps_total']:>10}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
