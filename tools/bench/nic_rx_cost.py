#!/usr/bin/env python3
"""Per-packet cost of the XDP NIC receive path (the integrity check + placement, with and
without the ACK/SACK it generates), side by side with a pass-through XDP program (the floor) in
the same run, for each check a QP can have (spec 5.7): RoCEv2 mode with the ICRC, MetaRoCE mode
with the ICRC, and MetaRoCE mode with the negotiated IPv4/UDP checksums (CSUM). Uses
BPF_PROG_TEST_RUN single runs (the kernel times each), median of 200 per run, median of --runs
runs; every program is timed the same way, so the ratios are fair.

    sudo .venv/bin/python tools/bench/nic_rx_cost.py [--runs 5] [--json] [--out FILE]
"""

import argparse
import json
import os
import statistics
import sys

from benchlab import header

from metaroce.kern import libbpf
from metaroce.lab import fabric
from metaroce.nic.rx import ACCESS_REMOTE_WRITE, RxPath
from metaroce.wire import consts as C
from metaroce.wire.headers import BTH, PETH, RETH
from metaroce.wire.packet import IPv4, RocePacket

SIZES = (256, 1024, 2048, 4096)
# (name, MetaRoCE opcodes, nic_qp.integrity): what the receive path checks and places
CHECKS = (("roce_icrc", False, 0), ("metaroce_icrc", True, 0), ("metaroce_csum", True, 1))


def frame(mr, size, ack_req, metaroce=False, csum=False):
    if metaroce:
        op = C.Opcode.MR_RDMA_WRITE_ONLY
        hdrs = (PETH(path_id=0, ssn=0, offset=0, flags=0x40 if ack_req else 0),
                RETH(va=mr.addr, rkey=mr.rkey, dma_len=size))
    else:
        op = C.Opcode.RC_RDMA_WRITE_ONLY
        hdrs = (RETH(va=mr.addr, rkey=mr.rkey, dma_len=size),)
    return RocePacket(ip=IPv4(src="10.0.0.1", dst="10.0.0.2"),
                      bth=BTH(opcode=op, dest_qp=1, psn=0, ack_req=ack_req), headers=hdrs,
                      payload=bytes(size), udp_checksum=csum).to_bytes()


def time_one(nic, pkt, metaroce, integrity, runs, want):
    samples = []
    for _ in range(runs):
        # each accepted packet advances the expected PSN, so `repeat` would time the
        # duplicate path: reset the QP and time single runs instead
        durations = []
        for _ in range(200):
            nic.set_qp(1, epsn=0, pd=1, pmtu=4096, metaroce=metaroce, integrity=integrity)
            rc, _, ns = libbpf.prog_test_run(nic.prog_fd, pkt, repeat=1)
            assert rc in want, (rc, nic.counters())
            durations.append(ns)
        samples.append(statistics.median(durations))
    return statistics.median(samples)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", default=None, help="default tools/bench/results/nic_rx_cost.json")
    args = ap.parse_args()
    nic = RxPath(max_qps=4, max_mrs=4)
    bpf, fds = fabric.load_and_pin("benchrx")
    fabric.unpin("benchrx")
    mr = nic.reg_mr(1 << 20, 1, ACCESS_REMOTE_WRITE)
    rows = []
    for size in SIZES:
        row = {"payload_bytes": size}
        pf = frame(mr, size, 0)
        floor = [statistics.median(libbpf.prog_test_run(fds["host_xdp"], pf, repeat=1)[2]
                                   for _ in range(200)) for _ in range(args.runs)]
        row["pass_through_ns"] = statistics.median(floor)
        for name, metaroce, integrity in CHECKS:
            csum = integrity == 1
            place = time_one(nic, frame(mr, size, 0, metaroce, csum), metaroce, integrity,
                             args.runs, (1,))                  # XDP_DROP: placed, consumed
            ack = time_one(nic, frame(mr, size, 1, metaroce, csum), metaroce, integrity,
                           args.runs, (3,))                    # XDP_TX: the ACK / SACK
            row[f"{name}_place_ns"] = place
            row[f"{name}_place_and_ack_ns"] = ack
            row[f"{name}_ns_per_kib"] = round(place * 1024 / size, 1)
            row[f"{name}_gbps_per_core"] = round(size * 8 / max(place, 1), 2)
        # the names from before the integrity option: compat mode with the ICRC
        row["place_ns"] = row["roce_icrc_place_ns"]
        row["place_and_ack_ns"] = row["roce_icrc_place_and_ack_ns"]
        row["ratio_vs_pass"] = round(row["place_ns"] / max(row["pass_through_ns"], 1), 1)
        row["place_gbps_per_core"] = row["roce_icrc_gbps_per_core"]
        row["csum_over_icrc"] = round(row["metaroce_csum_place_ns"] /
                                      max(row["metaroce_icrc_place_ns"], 1), 3)
        rows.append(row)
    # the check's own cost: the slope of place_ns over payload bytes (least squares), per KiB
    slopes = {}
    for name, _, _ in CHECKS:
        xs = [r["payload_bytes"] for r in rows]
        ys = [r[f"{name}_place_ns"] for r in rows]
        mx, my = statistics.mean(xs), statistics.mean(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
        slopes[name] = {"ns_per_kib": round(slope * 1024, 1), "fixed_ns": round(my - slope * mx, 1)}
    bpf.cleanup()
    nic.close()
    doc = {**header("nic_rx_cost"), "runs": args.runs, "rows": rows, "per_kib": slopes,
           "checks": [c[0] for c in CHECKS],
           "note": "BPF_PROG_TEST_RUN single-run durations, median of 200 per run, median of "
                   "runs; a WRITE_ONLY of each payload placed into a registered region"}
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                   "nic_rx_cost.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
    if args.json:
        print(json.dumps(doc))
    else:
        print(f"{'payload':>8} {'pass ns':>8} " + " ".join(f"{n + ' ns':>18} {'+ack':>6}"
                                                          for n, _, _ in CHECKS))
        for r in rows:
            print(f"{r['payload_bytes']:>8} {r['pass_through_ns']:>8.0f} " +
                  " ".join(f"{r[n + '_place_ns']:>18.0f} {r[n + '_place_and_ack_ns']:>6.0f}"
                           for n, _, _ in CHECKS))
        for n, v in slopes.items():
            print(f"{n}: {v['ns_per_kib']} ns per KiB of payload + {v['fixed_ns']} ns per packet")
    return 0


if __name__ == "__main__":
    sys.exit(main())
