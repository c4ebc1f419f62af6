#!/usr/bin/env python3
"""The requester's cost per event and per packet in the C transport engine (metaroce/cengine),
as the daemon's engine thread calls it (metaroce/datapath), driven by tools/bench/engine_cost.c
with no Python in the loop.

A BPF-free synthetic event stream: one MetaRoCE QP keeps 4 RDMA WRITEs of 64 packets (MTU 1024)
posted, window 127 PSNs; a receiver model loses the first transmission of a PSN with
probability --loss (a hash of the PSN) and reports what arrived as the XDP program does, one
SACK (cumulative PSN + 128-bit bitmap, timestamp echo, PathID) per 16 packets and at once for a
retransmission or an ACK_NOW. Only time inside the engine's calls counts; the receiver model is
outside.

Reported: ns per packet sent (everything: acknowledgement handling, loss detection, send
decisions, completions), ns per event (an event's handling and the sends it lets out), ns per
event with holes (SACK repair), packets, events, retransmissions — with the wire's rules of
today (a fixed window, no congestion control: "C engine") and with its window CC on ("C + CC").
The Python requester this was once compared with (the old metaroce/nic/device.py, ~30x the
cost per event) is gone: the wire runs this engine.

    .venv/bin/python tools/bench/engine_cost.py [--quick] [--loss 0.01] [--packets N] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)

from benchlab import header, save, summary  # noqa: E402

ENGINE = os.path.join(ROOT, "metaroce", "cengine")
SOURCES = ("engine.c", "requester.c", "responder.c", "readresp.c", "cc.c", "paths.c", "credit.c")
M32, M64 = 0xFFFFFFFF, (1 << 64) - 1


def lost(psn: int, ppm: int) -> bool:
    """engine_cost.c's loss decision: splitmix64 of the PSN."""
    z = (psn + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    z ^= z >> 31
    return z % 1_000_000 < ppm


# --- the C engine ----------------------------------------------------------------------------

def build_driver(tmp: str) -> str:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise SystemExit("engine_cost: no C compiler (cc) on PATH")
    out = os.path.join(tmp, "engine_cost")
    subprocess.run([cc, "-O2", "-std=gnu11", f"-I{ENGINE}", os.path.join(HERE, "engine_cost.c"),
                    *(os.path.join(ENGINE, s) for s in SOURCES), "-lm", "-o", out], check=True)
    return out


def run_engine(driver: str, p: dict) -> dict:
    args = [f"{k}={v}" for k, v in p.items()]
    res = subprocess.run([driver, *args], check=True, capture_output=True, text=True)
    return json.loads(res.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="100,000 packets, 3 runs")
    ap.add_argument("--packets", type=int, default=None)
    ap.add_argument("--loss", type=float, default=0.01)
    ap.add_argument("--runs", type=int, default=None)
    ap.add_argument("--json", action="store_true", help="print the result document")
    a = ap.parse_args()
    if not 0 <= a.loss < 1:
        print("engine_cost: --loss must be in [0, 1)", file=sys.stderr)
        return 2
    packets = a.packets or (100_000 if a.quick else 400_000)
    runs = a.runs or (3 if a.quick else 5)
    p = {"packets": packets, "loss_ppm": int(a.loss * 1e6), "ack_every": 16, "window": 127,
         "mtu": 1024, "msg_pkts": 64, "depth": 4}
    doc = header("engine_cost", root=False)
    doc["params"] = p
    out = {"c_engine": [], "c_engine_cc": []}
    with tempfile.TemporaryDirectory() as tmp:
        driver = build_driver(tmp)
        for r in range(runs):
            print(f"engine_cost: run {r + 1}/{runs}", file=sys.stderr)
            out["c_engine"].append(run_engine(driver, {**p, "paths": 1, "cc": 0}))
            out["c_engine_cc"].append(run_engine(driver, {**p, "paths": 1, "cc": 1}))
    res = {}
    for k, rs in out.items():
        res[k] = {m: summary([r[m] for r in rs]) for m in ("ns_per_packet", "ns_per_event",
                                                           "ns_per_sack_event")}
        res[k].update({m: rs[0][m] for m in ("events", "sack_events", "descriptors",
                                             "retransmissions")})
    doc["results"] = res
    path = save(doc, "engine_cost")
    if a.json:
        print(json.dumps(doc))
        return 0
    print(f"{'':<22}{'C engine':>12}{'C + CC':>10}")
    for m, label in (("ns_per_packet", "ns per packet"), ("ns_per_event", "ns per event"),
                     ("ns_per_sack_event", "ns per SACK w/ holes")):
        print(f"{label:<22}{res['c_engine'][m]['median']:>12.0f}"
              f"{res['c_engine_cc'][m]['median']:>10.0f}")
    for m in ("descriptors", "events", "sack_events", "retransmissions"):
        print(f"{m:<22}{res['c_engine'][m]:>12}{res['c_engine_cc'][m]:>10}")
    print(f"(medians of {runs} runs of {packets} packets, loss {a.loss}; {path})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
