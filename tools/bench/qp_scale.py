#!/usr/bin/env python3
"""Many QPs at once: aggregate WRITE goodput, per-QP fairness (Jain), and what each QP costs
the daemon (RSS) and the kernel (BPF map memory, from the daemon's fdinfo memlock), for 1, 16,
128 (and 1024 with --full) QPs between two lab hosts, in MetaRoCE mode, median of --runs.

    sudo .venv/bin/python tools/bench/qp_scale.py [--quick | --full] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from benchlab import header, jain, path_mtu, two_hosts
from metaroce.procbpf import rss_kib
from metaroce.verbs import (CQ, MR, PD, QP, IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_REMOTE_WRITE,
                            IBV_WC_SUCCESS, IBV_WR_RDMA_WRITE, Context, QPCap, QPInitAttr,
                            SendWR, wc_status_str)

HERE = os.path.dirname(os.path.abspath(__file__))
LAB = "benchqps"
MSG = 16 * 1024
DEPTH = 2


def map_memlock(pid: int, map_type: int | None = None) -> int:
    """Bytes the kernel charges for the process's maps (fdinfo memlock); map_type 1 (hash)
    selects the per-QP / per-MR state tables, leaving out the MR memory (arrays)."""
    total = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                info = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        if "map_id" in info and "memlock" in info and \
                (map_type is None or int(info["map_type"]) == map_type):
            total += int(info["memlock"])
    return total


def one(c1, c2, ip1, ip2, pids, n, seconds):
    base = {p: (rss_kib(p), map_memlock(p), map_memlock(p, 1)) for p in pids}
    pd1, pd2 = PD(c1), PD(c2)
    mr1 = MR(pd1, MSG * DEPTH, IBV_ACCESS_LOCAL_WRITE)
    mr2 = MR(pd2, MSG * DEPTH * n, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)
    cq1, cq2 = CQ(c1, 65536), CQ(c2, 1024)
    cap = QPCap(max_send_wr=4 * DEPTH, max_recv_wr=1)
    qa = [QP(pd1, QPInitAttr(cq1, cq1, cap)) for _ in range(n)]
    qb = [QP(pd2, QPInitAttr(cq2, cq2, cap)) for _ in range(n)]
    mtu = path_mtu("metaroce", c1, c2)
    for a, b in zip(qa, qb):
        a.connect({"qpn": b.qp_num, "psn": b.psn, "ip": ip2, "mode": "metaroce", "mtu": mtu})
        b.connect({"qpn": a.qp_num, "psn": a.psn, "ip": ip1, "mode": "metaroce", "mtu": mtu})
    grown = {p: (rss_kib(p) - base[p][0], map_memlock(p) - base[p][1],
                 map_memlock(p, 1) - base[p][2]) for p in pids}
    done = [0] * n
    index = {q.qp_num: i for i, q in enumerate(qa)}

    def post(i, k):
        qa[i].post_send(SendWR(IBV_WR_RDMA_WRITE, wr_id=i, sg_list=[mr1.sge(0, MSG)],
                               remote_addr=mr2.addr + (i * DEPTH + k % DEPTH) * MSG,
                               rkey=mr2.rkey))
    for i in range(n):
        for k in range(DEPTH):
            post(i, k)
    t0 = time.monotonic()
    end = t0 + seconds
    outstanding = n * DEPTH
    while outstanding:
        for w in cq1.wait(1, timeout_s=60) + cq1.poll(4096):
            if w.status != IBV_WC_SUCCESS:
                raise RuntimeError(wc_status_str(w.status))
            i = index[w.qp_num]
            done[i] += 1
            outstanding -= 1
            if time.monotonic() < end:
                post(i, done[i])
                outstanding += 1
    elapsed = time.monotonic() - t0
    for q in qa + qb:
        q.close()
    mr1.close()
    mr2.close()
    return {"qps": n, "goodput_bps": sum(done) * MSG * 8 / elapsed,
            "jain_fairness": jain(done), "min_qp_msgs": min(done), "max_qp_msgs": max(done),
            "rss_kib_per_qp": {str(p): grown[p][0] / n for p in pids},
            "map_bytes_per_qp": {str(p): grown[p][1] / n for p in pids},
            "state_map_bytes_per_qp": {str(p): grown[p][2] / n for p in pids},
            "state_tables_bytes": {str(p): base[p][2] for p in pids}}


def _sizes(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"QP counts separated by commas, not {text!r}") from None
    if not out or any(not 1 <= n <= 2048 for n in out):
        raise argparse.ArgumentTypeError("each QP count 1 .. 2048")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", help="1, 16, 128 QPs, 3 runs of 2 s")
    g.add_argument("--full", action="store_true", help="1, 16, 128, 1024 QPs, 5 runs of 4 s")
    ap.add_argument("--sizes", type=_sizes, default=None,
                    help="QP counts to run, e.g. 1,1024 (default: by --quick / --full)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    sizes, runs, secs = ([1, 16, 128, 1024], 5, 4) if a.full else ([1, 16, 128], 3, 2)
    sizes = a.sizes or sizes
    rows = []
    with two_hosts(LAB) as lab:
        pids = lab.pids
        c1 = Context("eth0", lab.ns1, timeout_s=120)
        c2 = Context("eth0", lab.ns2, timeout_s=120)
        pmtu = {"metaroce": path_mtu("metaroce", c1, c2)}                 # one()'s
        for n in sizes:
            rs = []
            for r in range(runs):
                print(f"qp_scale: {n} QPs, run {r + 1}/{runs}", file=sys.stderr)
                rs.append(one(c1, c2, lab.ip1, lab.ip2, pids, n, secs))
            med = lambda k: statistics.median(x[k] for x in rs)  # noqa: E731
            rows.append({"qps": n, "goodput_bps": med("goodput_bps"),
                         "jain_fairness": med("jain_fairness"),
                         "goodput_min_max_bps": [min(x["goodput_bps"] for x in rs),
                                                 max(x["goodput_bps"] for x in rs)],
                         "requester_rss_kib_per_qp": statistics.median(
                             x["rss_kib_per_qp"][str(pids[0])] for x in rs),
                         "responder_rss_kib_per_qp": statistics.median(
                             x["rss_kib_per_qp"][str(pids[1])] for x in rs),
                         "kernel_map_bytes_per_qp": statistics.median(
                             x["map_bytes_per_qp"][str(pids[1])] for x in rs),
                         "kernel_state_bytes_per_qp": {
                             side: statistics.median(x["state_map_bytes_per_qp"][str(p)]
                                                     for x in rs)
                             for side, p in (("requester", pids[0]), ("responder", pids[1]))},
                         "state_tables_fixed_bytes": rs[0]["state_tables_bytes"][str(pids[1])]})
        c1.close()
        c2.close()
    doc = {**header("qp_scale"), "runs": runs, "seconds": secs, "msg_bytes": MSG, "pmtu": pmtu,
           "depth_per_qp": DEPTH, "rows": rows}
    out = os.path.join(HERE, "results", "qp_scale.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
    if a.json:
        print(json.dumps(doc))
        return 0
    print(f"{'QPs':>6} {'Gbit/s':>8} {'Jain':>6} {'RSS KiB/QP (req, resp)':>24} {'map B/QP':>10}")
    for r in rows:
        print(f"{r['qps']:>6} {r['goodput_bps'] / 1e9:>8.3f} {r['jain_fairness']:>6.3f} "
              f"{r['requester_rss_kib_per_qp']:>11.1f} {r['responder_rss_kib_per_qp']:>11.1f} "
              f"{r['kernel_map_bytes_per_qp']:>10.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
