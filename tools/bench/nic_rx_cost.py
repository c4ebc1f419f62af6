#!/usr/bin/env python3
"""Per-packet cost of the XDP NIC receive path (ICRC check + placement, with and without the
ACK it generates), side by side with a pass-through XDP program (the floor) in the same run.
Uses BPF_PROG_TEST_RUN single runs (the kernel times each), median of 200 per run, median of
--runs runs; both programs are timed the same way, so the ratio is fair.

    sudo .venv/bin/python tools/bench/nic_rx_cost.py [--runs 5] [--json]
"""

import argparse
import json
import statistics
import sys

from metaroce.kern import libbpf
from metaroce.lab import fabric
from metaroce.nic.rx import ACCESS_REMOTE_WRITE, RxPath
from metaroce.wire import consts as C
from metaroce.wire.headers import BTH, RETH
from metaroce.wire.packet import IPv4, RocePacket

SIZES = (256, 1024, 2048, 4096)


def frame(mr, size, ack_req):
    return RocePacket(ip=IPv4(src="10.0.0.1", dst="10.0.0.2"),
                      bth=BTH(opcode=C.Opcode.RC_RDMA_WRITE_ONLY, dest_qp=1, psn=0, ack_req=ack_req),
                      headers=(RETH(va=mr.addr, rkey=mr.rkey, dma_len=size),),
                      payload=bytes(size)).to_bytes()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    nic = RxPath(max_qps=4, max_mrs=4)
    bpf, fds = fabric.load_and_pin("benchrx")
    fabric.unpin("benchrx")
    mr = nic.reg_mr(1 << 20, 1, ACCESS_REMOTE_WRITE)
    rows = []
    for size in SIZES:
        row = {"payload_bytes": size}
        for name, ack in (("place_ns", 0), ("place_and_ack_ns", 1)):
            p = frame(mr, size, ack)
            samples = []
            for _ in range(args.runs):
                # each accepted packet advances the expected PSN, so `repeat` would time the
                # duplicate path: reset the QP and time single runs instead
                durations = []
                for _ in range(200):
                    nic.set_qp(1, epsn=0, pd=1)
                    rc, _, ns = libbpf.prog_test_run(nic.prog_fd, p, repeat=1)
                    assert rc in (1, 3), rc            # XDP_DROP (placed) / XDP_TX (ACK)
                    durations.append(ns)
                samples.append(statistics.median(durations))
            row[name] = statistics.median(samples)
        pf = frame(mr, size, 0)
        floor = [statistics.median(libbpf.prog_test_run(fds["host_xdp"], pf, repeat=1)[2]
                                   for _ in range(200)) for _ in range(args.runs)]
        row["pass_through_ns"] = statistics.median(floor)
        row["ratio_vs_pass"] = round(row["place_ns"] / max(row["pass_through_ns"], 1), 1)
        row["place_gbps_per_core"] = round(size * 8 / max(row["place_ns"], 1), 2)
        rows.append(row)
    bpf.cleanup()
    nic.close()
    doc = {"benchmark": "nic_rx_cost", "runs": args.runs, "rows": rows,
           "note": "BPF_PROG_TEST_RUN single-run durations, median of 200 per run, median of runs"}
    if args.json:
        print(json.dumps(doc))
    else:
        print(f"{'payload':>8} {'pass ns':>8} {'place ns':>9} {'+ack ns':>8} {'x pass':>7} {'Gbit/s/core':>12}")
        for r in rows:
            print(f"{r['payload_bytes']:>8} {r['pass_through_ns']:>8.0f} {r['place_ns']:>9.0f} "
                  f"{r['place_and_ack_ns']:>8.0f} {r['ratio_vs_pass']:>7} {r['place_gbps_per_core']:>12}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
