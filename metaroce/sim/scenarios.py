"""The `metaroce sim` scenarios: workloads of RDMA WRITE flows on simulated topologies.

A *flow* is one connected QP pair that moves ``size`` bytes as RDMA WRITEs of ``msg`` bytes,
keeping ``depth`` WRs posted (the application posts the next one when one completes). Its FCT
is the time from its first post to its last completion. Every scenario returns one dict:

goodput_bps       payload bytes completed × 8 / (last completion − first post)
retransmissions   retransmitted request packets (all QPs)
drops             frames lost on any link: tail drops, random loss, a failed link
max_queue_bytes   deepest switch egress queue seen (host NIC queues excluded)
jain_fairness     Jain's index over per-flow throughputs (size / FCT)
app_errors        work completions with an error status
fct_p50_s/p99_s   flow completion time percentiles (None when that rank did not finish)

plus the parameters, ``seed`` and ``mode``. Times are simulated seconds, rates bit/s.
"""

import math
import random
from dataclasses import dataclass

from metaroce.cengine import Engine, QueuePair
from metaroce.engine import Access, Mode, MRTable, QPState, SendWR, WcStatus, WrOpcode
from metaroce.engine.cc import CCConfig
from metaroce.engine.credits import CreditConfig

from . import net as N

MTU = 4096
KiB, MiB = 1024, 1024 * 1024
RKEY, BASE = 0x5157, 0x1000_0000
MODES = {"metaroce": Mode.METAROCE, "roce": Mode.COMPAT}


@dataclass
class Fabric:
    """Switch egress queue parameters shared by the scenarios (documented defaults)."""

    buffer_bytes: int = 1 * MiB  # per egress port, tail drop
    ecn_bytes: int = 64 * KiB  # CE-mark above this queue depth
    delay_ns: int = 1_000  # per link, one way
    window: int = 512  # PSN window (MetaRoCE responder window W)
    compat_timeout: int = 14  # compat local ACK timeout exponent: 4.096 us x 2^14 = 67 ms
    min_rto_ns: int = 50_000  # RTO_min (RTO-1)
    max_time_s: float = 2.0  # give up (and report unfinished flows) after this


class Flow:
    def __init__(self, sim, fid, src, dst, qa, qb, size, msg, depth, data):
        self.sim, self.id, self.src, self.dst, self.qa, self.qb = sim, fid, src, dst, qa, qb
        self.size, self.msg, self.depth, self.data = size, msg, depth, data
        self.posted = self.done_bytes = self.outstanding = self.errors = 0
        self.start = self.end = None
        self.next_id = 0

    @property
    def done(self) -> bool:
        return self.end is not None

    @property
    def failed(self) -> bool:
        return self.errors > 0

    def kick(self) -> None:
        now = self.sim.now
        if self.start is None:
            self.start = now
        while self.outstanding < self.depth and self.posted < self.size and not self.errors:
            n = min(self.msg, self.size - self.posted)
            self.qa.post_send(SendWR(self.next_id, WrOpcode.RDMA_WRITE, self.data, 0, n,
                                     BASE, RKEY), now)
            self.next_id += 1
            self.posted += n
            self.outstanding += 1

    def on_completions(self) -> None:
        for c in self.qa.poll_cq():
            self.outstanding -= 1
            if c.status is WcStatus.SUCCESS:
                self.done_bytes += c.byte_len
            else:
                self.errors += 1
        if self.done_bytes >= self.size and self.end is None:
            self.end = self.sim.now
        self.kick()

    def throughput(self, now: int) -> float:
        end = self.end if self.end is not None else now
        return self.done_bytes * 8e9 / max(1, end - (self.start or 0))


class Run:
    """One simulation: a network, QP pairs set up over it, flows, and the metrics. Every host
    is one C engine (metaroce.cengine: its QPs, registered memory and credit manager)."""

    def __init__(self, seed: int, mode: str, fabric: Fabric | None = None,
                 _test_break: str | None = None):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {sorted(MODES)}")
        self.seed, self.mode_name, self.mode = seed, mode, MODES[mode]
        self.breaks = _test_break  # deliberately broken senders, for the tests that catch them
        self.fabric = fabric or Fabric()
        self.sim = N.Sim(seed)
        self.rng = random.Random(seed ^ 0x51A1)
        self.flows: list[Flow] = []
        self.qps: list[QueuePair] = []
        self.data = self.rng.randbytes(MTU)  # repeated: the payload pattern
        self.mrs: dict[int, MRTable] = {}
        self.engines: dict[int, Engine] = {}
        self.flow_of: dict[int, Flow] = {}
        self._qpn = 0x100
        self.bins: dict[int, int] = {}
        self.bin_ns = 10_000
        self.net = None

    def sw(self) -> dict:
        f = self.fabric
        return {"cap_bytes": f.buffer_bytes, "ecn_bytes": f.ecn_bytes}

    def _mr(self, host, msg: int) -> MRTable:
        t = self.mrs.get(host.id)
        if t is None:
            t = MRTable()
            t.register(RKEY, BASE, bytearray(msg), Access.ALL_REMOTE)
            self.mrs[host.id] = t
        return t

    def _engine(self, host, credits: CreditConfig | None) -> Engine:
        e = self.engines.get(host.id)
        if e is None:
            e = self.engines[host.id] = Engine(credits, max_qps=4096, max_mrs=4)
        return e

    def connect(self, src, dst, *, cc: CCConfig, paths: int = 1,
                credits: CreditConfig | None = None, size: int, msg: int = MiB,
                depth: int = 4) -> Flow:
        f = self.fabric
        qpa, qpb = self._qpn, self._qpn + 1
        self._qpn += 2
        if self.mode is not Mode.METAROCE:
            credits = None
        use = True if credits is not None else None
        npaths = paths if self.mode is Mode.METAROCE else 1
        a = QueuePair(qpa, self.mode, MRTable(), min_rto_ns=f.min_rto_ns, cc=cc, paths=npaths,
                      credits=use, seed=self.seed, engine=self._engine(src, credits),
                      _test_break=self.breaks)
        b = QueuePair(qpb, self.mode, self._mr(dst, msg), min_rto_ns=f.min_rto_ns, cc=cc,
                      paths=npaths, credits=use, seed=self.seed,
                      engine=self._engine(dst, credits))
        psn_a, psn_b = self.rng.randrange(1 << 24), self.rng.randrange(1 << 24)
        for q, peer, sq, rq in ((a, qpb, psn_a, psn_b), (b, qpa, psn_b, psn_a)):
            q.modify(QPState.INIT)
            q.modify(QPState.RTR, dest_qpn=peer, rq_psn=rq, path_mtu=MTU, window=f.window)
            q.modify(QPState.RTS, sq_psn=sq, timeout=f.compat_timeout, retry_cnt=7,
                     rnr_retry=7)
        src.attach(a, dst.id)
        dst.attach(b, src.id)
        data = self.data * max(1, -(-msg // MTU))
        fl = Flow(self.sim, len(self.flows), src, dst, a, b, size, msg, depth, data[:msg])
        self.flows.append(fl)
        self.qps += [a, b]
        self.flow_of[qpa] = fl
        src.after_service = self._after_service
        dst.on_deliver = self._delivered
        return fl

    def _after_service(self, qp) -> None:
        fl = self.flow_of.get(qp.attr.qpn)
        if fl is None:
            qp.poll_cq()
            return
        fl.on_completions()
        fl.src.service(qp)

    def _delivered(self, qp, nbytes: int) -> None:
        b = self.sim.now // self.bin_ns
        self.bins[b] = self.bins.get(b, 0) + nbytes

    def start(self, at_ns: int = 0) -> None:
        for fl in self.flows:
            self.sim.at(at_ns, self._start_flow, fl)

    def _start_flow(self, fl: Flow) -> None:
        fl.kick()
        fl.src.service(fl.qa)

    def run(self) -> None:
        limit = int(self.fabric.max_time_s * 1e9)
        self.sim.run(until=limit, stop=lambda: all(f.done or f.failed for f in self.flows))

    # --- metrics -------------------------------------------------------------------------------
    def metrics(self) -> dict:
        now = self.sim.now
        fl = self.flows
        starts = [f.start for f in fl if f.start is not None]
        ends = [f.end for f in fl if f.end is not None]
        t0 = min(starts) if starts else 0
        t1 = max(ends) if len(ends) == len(fl) and ends else now
        total = sum(f.done_bytes for f in fl)
        thr = [f.throughput(now) for f in fl]
        fcts = sorted((f.end - f.start) / 1e9 if f.done else math.inf for f in fl)
        return {
            "goodput_bps": round(total * 8e9 / max(1, t1 - t0)),
            "retransmissions": sum(q.req.stats["retx"] for q in self.qps),
            "drops": self.net.drops(),
            "max_queue_bytes": self.net.max_switch_queue(),
            "jain_fairness": round(jain(thr), 4),
            "app_errors": sum(f.errors for f in fl),
            "fct_p50_s": _finite(percentile(fcts, 50)),
            "fct_p99_s": _finite(percentile(fcts, 99)),
            "flows": len(fl),
            "qps": len(self.qps),
            "completed_flows": len(ends),
            "bytes_delivered": total,
            "timeouts": sum(q.req.stats["timeouts"] for q in self.qps),
            "ecn_marks": sum(p.marks for p in self.net.ports),
            "cnps": sum(q.req.stats["cnp"] for q in self.qps),
            "path_evictions": sum(q.req.paths.evictions for q in self.qps if q.req.paths),
            "sim_time_s": now / 1e9,
            "events": self.sim.events,
        }


def jain(xs) -> float:
    xs = list(xs)
    if not xs or not any(xs):
        return 0.0
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))


def percentile(sorted_xs, p) -> float:
    """Nearest-rank percentile of a sorted list."""
    if not sorted_xs:
        return math.inf
    k = max(1, math.ceil(p / 100 * len(sorted_xs)))
    return sorted_xs[k - 1]


def _finite(x):
    return None if math.isinf(x) else round(x, 9)


def base_rtt_ns(hops: list[float], delay_ns: int, mtu_frame: int = MTU + 142,
                ack_frame: int = 160) -> int:
    """Unloaded RTT of an MTU packet and its ACK over links of the given rates."""
    t = 2 * len(hops) * delay_ns
    for r in hops:
        t += (mtu_frame + ack_frame) * 8e9 / r
    return int(t)


# --- scenarios --------------------------------------------------------------------------------

LOSS_DEFAULTS = dict(rate_gbps=100, size_mib=16, msg_kib=1024)
INCAST_DEFAULTS = dict(rate_gbps=100, size_kib=1024, msg_kib=256, qps=1)
MULTIPATH_DEFAULTS = dict(host_gbps=400, fabric_gbps=100, size_mib=32, msg_kib=1024,
                          entropies=None)


def run_loss(loss: float, mode: str = "metaroce", seed: int = 1, rate_gbps: float = 100,
             size_mib: float = 16, msg_kib: int = 1024, baseline: bool = True,
             fabric: Fabric | None = None, _test_break: str | None = None) -> dict:
    """One QP pair over h0 — s0 — h1; every switch egress loses frames with probability
    ``loss`` (so each packet and each ACK is lost with probability ``loss``)."""
    def once(p):
        r = Run(seed, mode, fabric, _test_break)
        rate = rate_gbps * 1e9
        r.net, a, b = N.pair(r.sim, rate, r.fabric.delay_ns, loss=p, **r.sw())
        cc = CCConfig(line_rate_bps=rate, base_rtt_ns=base_rtt_ns([rate] * 2, r.fabric.delay_ns))
        r.connect(a, b, cc=cc, size=int(size_mib * MiB), msg=msg_kib * KiB)
        r.start()
        r.run()
        return r.metrics()

    out = {"scenario": "loss", "seed": seed, "mode": mode, "loss": loss, "rate_gbps": rate_gbps,
           "size_mib": size_mib, "msg_kib": msg_kib}
    m = once(loss)
    out.update(m)
    if baseline and loss > 0:
        base = once(0.0)
        out["lossless_goodput_bps"] = base["goodput_bps"]
        out["goodput_ratio"] = round(m["goodput_bps"] / max(1, base["goodput_bps"]), 4)
    return out


def run_incast(senders: int, credits: bool = True, mode: str = "metaroce", seed: int = 1,
               rate_gbps: float = 100, size_kib: int = 1024, msg_kib: int = 256, qps: int = 1,
               fabric: Fabric | None = None, _test_break: str | None = None) -> dict:
    """``senders`` hosts each write ``size_kib`` per QP (``qps`` QPs each) to one receiver
    behind the same switch, all starting at once."""
    if senders < 1 or qps < 1:
        raise ValueError("senders and qps must be >= 1")
    r = Run(seed, mode, fabric, _test_break)
    rate = rate_gbps * 1e9
    r.net, txs, rx = N.incast(r.sim, senders, rate, r.fabric.delay_ns, **r.sw())
    rtt = base_rtt_ns([rate] * 2, r.fabric.delay_ns)
    cc = CCConfig(line_rate_bps=rate, base_rtt_ns=rtt)
    ccfg = CreditConfig(link_rate_bps=rate, base_rtt_ns=rtt, mtu=MTU) if credits else None
    for h in txs:
        for _ in range(qps):
            r.connect(h, rx, cc=cc, credits=ccfg, size=size_kib * KiB, msg=msg_kib * KiB)
    r.start()
    r.run()
    out = {"scenario": "incast", "seed": seed, "mode": mode, "senders": senders,
           "credits": credits, "qps_per_sender": qps, "rate_gbps": rate_gbps,
           "size_kib": size_kib, "msg_kib": msg_kib}
    out.update(r.metrics())
    out["credit_grants"] = sum(e.grants for e in r.engines.values())
    return out


def run_multipath(paths: int, fail_at: float | None = None, mode: str = "metaroce",
                  seed: int = 1, host_gbps: float = 400, fabric_gbps: float = 100,
                  size_mib: float = 32, msg_kib: int = 1024, entropies: int | None = None,
                  fabric: Fabric | None = None, _test_break: str | None = None) -> dict:
    """One QP pair between hosts on different leaves of a leaf-spine fabric with ``paths``
    spines (equal-cost paths). Host links are faster than one spine link, so one path alone is
    the bottleneck. MetaRoCE sprays over ``entropies`` source ports (default 4 × paths, at
    most 64); compat mode uses its one fixed port. With ``fail_at`` the spine0 — leaf1 link
    fails (both directions) at that simulated time and stays down."""
    if not 1 <= paths <= 64:
        raise ValueError("paths must be in 1..64")
    ent = entropies or min(64, 4 * paths)
    if not 1 <= ent <= 64:
        raise ValueError("entropies must be in 1..64")
    r = Run(seed, mode, fabric, _test_break)
    hr, fr = host_gbps * 1e9, fabric_gbps * 1e9
    r.net, left, right, fab = N.leaf_spine(r.sim, paths, 1, hr, fr, r.fabric.delay_ns,
                                           **r.sw())
    rtt = base_rtt_ns([hr, fr, fr, hr], r.fabric.delay_ns)
    cc = CCConfig(line_rate_bps=min(hr, fr * paths), base_rtt_ns=rtt)
    r.connect(left[0], right[0], cc=cc, paths=ent, size=int(size_mib * MiB),
              msg=msg_kib * KiB)
    fail_ns = None
    if fail_at is not None:
        fail_ns = int(fail_at * 1e9)
        up, down = fab[(1, 0)]
        r.sim.at(fail_ns, up.fail)
        r.sim.at(fail_ns, down.fail)
    r.start()
    r.run()
    out = {"scenario": "multipath", "seed": seed, "mode": mode, "paths": paths,
           "entropies": ent if r.mode is Mode.METAROCE else 1, "fail_at": fail_at,
           "host_gbps": host_gbps, "fabric_gbps": fabric_gbps, "size_mib": size_mib,
           "msg_kib": msg_kib}
    out.update(r.metrics())
    out["recovery_s"] = recovery(r, fail_ns, paths) if fail_ns is not None else None
    out["path_stats"] = [q.req.paths.stats() for q in r.qps[:1]][0]
    return out


def recovery(r: Run, fail_ns: int, paths: int, window_bins: int = 2,
             lookback_ns: int = 100_000) -> float | None:
    """Time from the failure until the delivered rate over ``window_bins`` bins (10 µs each)
    is back to 90 % of the pre-failure rate scaled to the surviving paths ((K−1)/K); None when
    that never happens before the flows end, or nothing ran before the failure."""
    bn = r.bin_ns
    fb = fail_ns // bn
    pre = [r.bins.get(b, 0) for b in range(max(0, fb - lookback_ns // bn), fb)]
    if not pre or not any(pre) or paths < 2:
        return None
    pre_rate = sum(pre) / len(pre)  # bytes per bin
    target = 0.9 * pre_rate * (paths - 1) / paths
    last = max(r.bins) if r.bins else fb
    for b in range(fb + window_bins, last + 1):
        if sum(r.bins.get(b - i, 0) for i in range(window_bins)) / window_bins >= target:
            return round(((b + 1) * bn - fail_ns) / 1e9, 9)
    return None
