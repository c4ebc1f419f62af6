"""Allreduce bus bandwidth (as nccl-tests reports it: algbw * 2(N-1)/N) over MetaRoCE
(metaroce.collectives, buffers in registered memory) and over Gloo (torch.distributed, TCP) on
the same lab star, in the same run, for 1 KiB ... 256 MiB (--quick: 1 KiB ... 4 MiB), plus the
QP byte counters' check that MetaRoCE moved what its algorithm must move (ring, or the tree
below 256 KiB with 3+ hosts; METAROCE_ALGORITHM=ring|tree forces one). MetaRoCE runs twice:
with the daemons' default integrity check (the ICRC) and with `--integrity csum` on every
daemon, so that its connections negotiate the UDP checksum (spec 5.7), the check TCP's segments
carry. The three contenders alternate within each of --runs runs; medians (min-max). JSON + PNG
in tools/bench/results/.

    sudo .venv/bin/python tools/bench/allreduce.py [--hosts 2] [--quick] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from metaroce.collectives import (Communicator, bus_bandwidth, new_job,  # noqa: E402
                                  ring_allreduce_bytes, tree_allreduce_bytes)
from metaroce.collectives.lab import lab_hosts  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from benchlab import header, summary  # noqa: E402
from metaroce.collectives.launch import run_ranks  # noqa: E402

RESULTS = os.path.join(os.path.dirname(__file__), "results")
KiB, MiB = 1 << 10, 1 << 20


def _iters(size: int) -> int:
    return max(2, min(50, (64 * MiB) // max(size, 1)))


def metaroce_rank(rank, world, addrs, netns, job, sizes, chunk_bytes=None):
    from metaroce.verbs import Context
    ctx = Context("eth0", netns[rank])
    kw = {"chunk_bytes": chunk_bytes} if chunk_bytes else {}
    c = Communicator(ctx, rank, world, addrs, job=job, timeout_s=120, **kw)
    out = []
    try:
        for size in sizes:
            buf = c.buffer(size // 4, "float32")
            buf[:] = rank + 1
            c.allreduce(buf)                                   # warm-up
            n = _iters(size)
            c.barrier()
            s0 = c.sent_bytes()
            t0 = time.perf_counter()
            for _ in range(n):
                c.allreduce(buf)
            dt = (time.perf_counter() - t0) / n
            sent = (c.sent_bytes() - s0) / n
            algo = c.algorithm_for(size)
            out.append({"bytes": size, "seconds": dt, "sent_per_iter": sent, "algorithm": algo,
                        # what this rank (0) must send: the volume the sent/ring column checks
                        "ring_volume": ring_allreduce_bytes(size, world) if algo == "ring" else
                        tree_allreduce_bytes(size, world, rank, c.tree_arity)})
            del buf
        return out
    finally:
        c.close()
        ctx.close()


def gloo_rank(rank, world, master, port, sizes):
    os.environ.update(MASTER_ADDR=master, MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="eth0")
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    out = []
    try:
        for size in sizes:
            t = torch.full((size // 4,), float(rank + 1))
            dist.all_reduce(t)
            n = _iters(size)
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(n):
                dist.all_reduce(t)
            out.append({"bytes": size, "seconds": (time.perf_counter() - t0) / n})
        return out
    finally:
        dist.destroy_process_group()


CONTENDERS = ("metaroce", "gloo", "metaroce_csum")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=2, choices=(2, 3, 4))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int, default=3,
                    help="runs of every contender, alternating (medians reported)")
    ap.add_argument("--out", default=None,
                    help="results path without extension (default: results/allreduce, "
                         "results/allreduce_mtu9000 at --mtu 9000)")
    ap.add_argument("--chunk-bytes", type=int, default=None,
                    help="the communicator's pipelining chunk (default: its own)")
    ap.add_argument("--min-bytes", type=int, default=KiB)
    ap.add_argument("--mtu", type=int, default=1500,
                    help="the lab's link MTU (9000: jumbo frames for both contenders)")
    a = ap.parse_args()
    if a.out is None:
        a.out = os.path.join(RESULTS, "allreduce" + (f"_mtu{a.mtu}" if a.mtu != 1500 else ""))
    if a.runs < 1:
        ap.error("--runs must be at least 1")
    top = 4 * MiB if a.quick else 256 * MiB
    sizes = [s for s in (KiB << (2 * i) for i in range(10)) if a.min_bytes <= s <= top]
    if not sizes:
        ap.error("no size between --min-bytes and the largest")
    runs: dict[str, list[list[dict]]] = {c: [] for c in CONTENDERS}

    def ranks(fn, args, netns=None):
        return run_ranks(fn, a.hosts, args, netns=netns, timeout_s=3600)[0]

    with lab_hosts(a.hosts, handle=True, mtu=a.mtu) as lab:
        addrs, netns = lab.addrs, lab.netns
        for i in range(a.runs):
            if i:
                lab.restart("metaroce", "icrc")
            job = new_job()
            runs["metaroce"].append(ranks(metaroce_rank, lambda r: (
                a.hosts, addrs, netns, job, sizes, a.chunk_bytes)))
            runs["gloo"].append(ranks(gloo_rank, lambda r: (a.hosts, addrs[0], 29800 + i,
                                                            sizes), netns))
            # the same ranks over connections that negotiate the UDP checksum (spec 5.7) in
            # place of the ICRC: TCP's own check, the one Gloo's streams carry
            lab.restart("metaroce", "csum")
            job = new_job()
            runs["metaroce_csum"].append(ranks(metaroce_rank, lambda r: (
                a.hosts, addrs, netns, job, sizes, a.chunk_bytes)))
    rows = []
    for k, size in enumerate(sizes):
        row = {"bytes": size}
        for c in CONTENDERS:
            bw = [bus_bandwidth(size, run[k]["seconds"], a.hosts) * 8 / 1e9 for run in runs[c]]
            row[f"{c}_busbw_gbps"] = summary(bw)
            row[f"{c}_us"] = summary([run[k]["seconds"] * 1e6 for run in runs[c]])
        g = row["gloo_busbw_gbps"]["median"]
        row["ratio"] = row["metaroce_busbw_gbps"]["median"] / g if g else None
        row["ratio_csum"] = row["metaroce_csum_busbw_gbps"]["median"] / g if g else None
        m = runs["metaroce"][-1][k]
        row.update(metaroce_sent_per_iter=m["sent_per_iter"], algorithm=m["algorithm"],
                   ring_volume=m["ring_volume"])
        rows.append(row)
    doc = {**header("allreduce"), "hosts": a.hosts, "quick": a.quick, "runs": a.runs,
           "mtu": a.mtu,
           "rows": rows}
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out + ".json", "w") as f:
        json.dump(doc, f, indent=1)
    print(f"{'size':>10} {'MetaRoCE Gbit/s':>16} {'+CSUM Gbit/s':>13} {'Gloo Gbit/s':>12} "
          f"{'ratio':>6} {'CSUM':>6} {'sent/ring':>9}")
    for r in rows:
        print(f"{r['bytes']:>10} {r['metaroce_busbw_gbps']['median']:>16.3f} "
              f"{r['metaroce_csum_busbw_gbps']['median']:>13.3f} "
              f"{r['gloo_busbw_gbps']['median']:>12.3f} "
              f"{(r['ratio'] or 0):>6.2f} {(r['ratio_csum'] or 0):>6.2f} "
              f"{r['metaroce_sent_per_iter'] / r['ring_volume']:>9.3f}")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing (the bench extra): no PNG", file=sys.stderr)
        return 0
    fig, ax = plt.subplots(figsize=(7, 4))
    xs = [r["bytes"] for r in rows]
    ax.plot(xs, [r["metaroce_busbw_gbps"]["median"] for r in rows], "o-", label="MetaRoCE (ICRC)")
    ax.plot(xs, [r["metaroce_csum_busbw_gbps"]["median"] for r in rows], "^-",
            label="MetaRoCE (UDP checksum)")
    ax.plot(xs, [r["gloo_busbw_gbps"]["median"] for r in rows], "s-", label="Gloo (TCP)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("allreduce size, bytes")
    ax.set_ylabel("bus bandwidth, Gbit/s")
    ax.set_title(f"allreduce, {a.hosts} lab hosts, MTU {a.mtu} (float32 sum)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(a.out + ".png", dpi=110)
    print(f"wrote {a.out}.json and {a.out}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
