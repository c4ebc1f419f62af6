#!/usr/bin/env python3
"""The requester's cost per event and per packet: the C transport engine (metaroce/cengine, as
the daemon's engine thread will call it) against today's wire path (metaroce/nic/device.py's
on_events and transmit, the Python that runs per kernel event and per transmit round).

BPF-free synthetic event streams, the same for both: one MetaRoCE QP keeps 4 RDMA WRITEs of 64
packets (MTU 1024) posted, window 127 PSNs (the wire's); a receiver model loses the first
transmission of a PSN with probability --loss (the same PSNs for both: a hash of the PSN) and
reports what arrived as the XDP program does, one SACK (cumulative PSN + 128-bit bitmap,
timestamp echo, PathID) per 16 packets and at once for a retransmission or an ACK_NOW. For
device.py the stream goes through its real code: Device.on_events takes the events as the
ring buffer would hand them (EV_ACK when the cumulative PSN moved, EV_SACK with the bitmap),
Device.transmit makes its send decisions; only the frame builder (mr_send_range, C in both
futures) is replaced by a call that records what it was asked to send. The engine is driven by
tools/bench/engine_cost.c (no Python in the loop). Only time inside the contenders' calls
counts; the receiver model is outside.

Reported per contender: ns per packet sent (everything: acknowledgement handling, loss
detection, send decisions, completions), ns per event (an event's handling and the sends it
lets out), ns per event with holes (SACK repair), packets, events, retransmissions. The
engine runs with the wire's rules of today (a fixed 127-packet window, no congestion control)
against device.py, and once more with its window CC on ("C + CC", what it will run).

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
import time
from collections import deque

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


# --- device.py, BPF-free ------------------------------------------------------------------------

class _Lib:
    """The fast path's C functions device.py calls: the real ones, except the event ring (the
    synthetic stream) and the frame builder (records what it was asked to send)."""

    def __init__(self, real, ffi):
        self._real, self._ffi = real, ffi
        self.events = ffi.new("struct mr_nic_event[]", 64)
        self.nevents = 0
        self.sends: list = []
        self.mr_msg_packets = real.mr_msg_packets

    def mr_evring_poll(self, ring, timeout, out):
        out[0] = self.events
        n, self.nevents = self.nevents, 0
        return n

    def mr_send_range(self, x, flow, msg, data, nxt, upto):
        start = nxt[0]
        self.sends.append((msg.psn0, start, upto, msg.retx, msg.ack_at,
                           self._real.mr_msg_packets(msg)))
        nxt[0] = upto
        return upto - start


class _Rx:
    def set_sq_psn(self, qpn, psn):
        pass

    def qp_state(self, qpn):
        return {}

    def set_rd_slot(self, *a, **kw):
        pass


class _Xsk:
    _x = None

    def in_flight(self) -> int:
        return 0


def run_device(p: dict) -> dict:
    from metaroce.fastpath.xsk import _lib
    from metaroce.nic import device as D
    from metaroce.nic.cq import Cq
    mod = _lib()
    ffi = mod.ffi
    lib = _Lib(mod.lib, ffi)
    dev = object.__new__(D.Device)
    dev.ffi, dev.c, dev.rx, dev.xsk = ffi, lib, _Rx(), _Xsk()
    dev.ring, dev._evp = None, ffi.new("struct mr_nic_event **")
    dev.responses, dev.dirty_cqs, dev.overrun_cqs = deque(), set(), []
    dev.credits, dev.cqs, dev.mrs = None, {}, {}
    dev.settle_qps = set()                      # the QP has no shared rings (qp.rings None)
    cq = Cq(1, None, 1 << 16)
    qp = D.Qp(0x11, None, 1, cq, cq, {"max_send_wr": 64})
    qp.metaroce, qp.pmtu, qp.state = True, p["mtu"], "RTS"
    qp.timeout = D.timeout_s(14)
    qp.sq_psn = qp.next_psn = qp.una = 0xFFFF00
    qp.flow = ffi.new("struct mr_roce_flow *")
    dev.qps = {qp.qpn: qp}

    def wqe(i):
        m = ffi.new("struct mr_roce_msg *")
        m.kind, m.pmtu, m.len, m.va, m.rkey = D.MSG_WRITE, p["mtu"], p["mtu"] * p["msg_pkts"], \
            0x1000, 7
        return D.SendWqe(i, D.MSG_WRITE, True, m, ffi.NULL, None, lib.mr_msg_packets(m))

    got = set()
    wire: deque = deque()                       # (PSN, retransmission, asks for a SACK)
    cum = (qp.sq_psn - 1) & 0xFFFFFF
    t_send = t_event = t_sack = 0
    n_events = n_sack = n_pkts = n_retx = delivered = posted = since = 0

    def transmit():
        nonlocal t_send, n_pkts
        t0 = time.perf_counter_ns()
        dev.transmit()
        t_send += time.perf_counter_ns() - t0
        for psn0, start, upto, retx, ack_at, total in lib.sends:
            for idx in range(start, upto):      # roce_tx.c: AckReq / ACK_NOW on these
                ask = retx or idx + 1 == total or (ack_at and idx + 1 == ack_at) or \
                    (idx + 1) % 64 == 0
                wire.append(((psn0 + idx) & 0xFFFFFF, retx, ask))
        n_pkts += sum(u - s for _, s, u, _, _, _ in lib.sends)
        lib.sends = []
        cq.take()
        cq.set_consumer_index(cq.produced)

    while delivered < p["packets"]:
        while posted - cq.produced < p["depth"]:
            qp.pending.append(wqe(posted))
            posted += 1
            transmit()
        if not wire:
            time.sleep(0.0005)                  # the retransmission timer (1 ms floor) is due
            transmit()
            continue
        psn, retx, ask = wire.popleft()
        n_retx += bool(retx)
        if not retx and lost(psn, p["loss_ppm"]):
            continue
        d = (psn - cum) & 0xFFFFFF
        if d == 0 or d >= 8192 or psn in got:
            continue
        got.add(psn)
        delivered += 1
        since += 1
        if not (since >= p["ack_every"] or ask):
            continue
        since = 0                               # the responder SACKs (SACK-2)
        while (cum + 1) & 0xFFFFFF in got:
            cum = (cum + 1) & 0xFFFFFF
            got.discard(cum)
        bm = sum(1 << (127 - i) for i in range(128) if (cum + 2 + i) & 0xFFFFFF in got)
        ts = (time.monotonic_ns() - 20_000) & M32
        evs = []                                # what bpf/nic's on_sack reports
        if 0 < (cum + 1 - qp.una) & 0xFFFFFF < 0x800000:
            evs.append((D.EV_ACK, 0))
        if bm:
            evs.append((D.EV_SACK, bm))
        for i, (typ, bits) in enumerate(evs):
            e = lib.events[i]
            e.type, e.qpn, e.psn, e.syndrome, e.imm = typ, qp.qpn, cum, 0x1F, ts
            e.flags, e.len, e.msn = 1, 0, 0
            e.wr_id, e.va = bits >> 64, bits & M64
        lib.nevents = len(evs)
        if not evs:
            continue
        t0 = time.perf_counter_ns()
        dev.on_events()
        dt = time.perf_counter_ns() - t0
        t_event += dt
        n_events += 1
        if bm:
            t_sack += dt
            n_sack += 1
        transmit()                              # the daemon's loop: events, then transmit
    total = t_send + t_event
    return {"events": n_events, "sack_events": n_sack, "descriptors": n_pkts,
            "retransmissions": n_retx, "delivered": delivered, "ns_engine": total,
            "ns_per_event": total / max(1, n_events), "ns_per_sack_event": t_sack / max(1, n_sack),
            "ns_per_packet": total / max(1, n_pkts)}


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
    out = {"c_engine": [], "device_py": [], "c_engine_cc": []}
    with tempfile.TemporaryDirectory() as tmp:
        driver = build_driver(tmp)
        for r in range(runs):
            print(f"engine_cost: run {r + 1}/{runs}", file=sys.stderr)
            out["c_engine"].append(run_engine(driver, {**p, "paths": 1, "cc": 0}))
            out["device_py"].append(run_device(p))
            out["c_engine_cc"].append(run_engine(driver, {**p, "paths": 1, "cc": 1}))
    res = {}
    for k, rs in out.items():
        res[k] = {m: summary([r[m] for r in rs]) for m in ("ns_per_packet", "ns_per_event",
                                                           "ns_per_sack_event")}
        res[k].update({m: rs[0][m] for m in ("events", "sack_events", "descriptors",
                                             "retransmissions")})
    for m in ("ns_per_packet", "ns_per_event", "ns_per_sack_event"):
        res.setdefault("ratio_device_over_engine", {})[m] = round(
            res["device_py"][m]["median"] / res["c_engine"][m]["median"], 1)
    doc["results"] = res
    path = save(doc, "engine_cost")
    if a.json:
        print(json.dumps(doc))
        return 0
    print(f"{'':<22}{'C engine':>12}{'device.py':>12}{'ratio':>8}{'C + CC':>10}")
    for m, label in (("ns_per_packet", "ns per packet"), ("ns_per_event", "ns per event"),
                     ("ns_per_sack_event", "ns per SACK w/ holes")):
        c, py = res["c_engine"][m]["median"], res["device_py"][m]["median"]
        print(f"{label:<22}{c:>12.0f}{py:>12.0f}{py / c:>7.0f}x"
              f"{res['c_engine_cc'][m]['median']:>10.0f}")
    for m in ("descriptors", "events", "sack_events", "retransmissions"):
        print(f"{m:<22}{res['c_engine'][m]:>12}{res['device_py'][m]:>12}{'':>8}"
              f"{res['c_engine_cc'][m]:>10}")
    print(f"(medians of {runs} runs of {packets} packets, loss {a.loss}; {path})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
