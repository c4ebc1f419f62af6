"""Multipath over an entropy set (spec MP-1 … MP-5), clock-free.

A path is a UDP source port (the entropy ECMP switches hash) plus a PathID carried in PETH.
The sender sprays packets over live paths by smooth weighted round robin; a path's weight
falls with ECN-only congestion signals and losses and recovers on clean ACKs. Per path it keeps
packets sent, losses, RTOs, ECN echoes, smoothed RTT and the newest transmission known to have
arrived on it (the evidence that path-aware loss detection, SACK-5 (a), needs). A path that
causes an RTO, or two losses within 8 SRTT, or mostly-ECN while the others are clean, is
evicted: it keeps its PathID and gets a fresh source port.
"""

import random
from dataclasses import dataclass, field

from metaroce.wire.consts import UDP_SPORT_MAX, UDP_SPORT_MIN

REUSE_HOLDOFF_NS = 1_000_000_000  # an evicted port is not reused for 1 s (MP-5)


def flow_label_sport(lqpn: int, rqpn: int) -> int:
    """The fixed compat-mode source port of a QP pair, as Linux derives it
    (rdma_calc_flow_label folded by rdma_flow_label_to_udp_sport into 0xC000-0xFFFF)."""
    fl = (lqpn * rqpn) & (2**64 - 1)
    fl ^= fl >> 20
    fl ^= fl >> 40
    fl &= 0xFFFFF
    low, high = fl & 0x3FFF, fl & 0xFC000
    return ((low ^ (high >> 14)) & 0x3FFF) | UDP_SPORT_MIN


@dataclass
class MPConfig:
    loss_evict: int = 2  # losses ...
    loss_window_srtt: float = 8.0  # ... within this many SRTT evict the path
    ecn_evict_frac: float = 0.5  # ECN fraction above which a path is evicted ...
    ecn_others_below: float = 0.25  # ... while the other paths stay below this
    ecn_min_samples: int = 16
    ecn_gain: float = 1 / 16  # EWMA gain of the per-path ECN fraction
    weight_cut: float = 0.5
    weight_min: float = 0.05
    weight_regain: float = 1 / 32


@dataclass
class Path:
    sport: int
    weight: float = 1.0
    current: float = 0.0  # smooth-WRR accumulator
    sent: int = 0
    acked: int = 0
    lost: int = 0
    rtos: int = 0
    ecn: int = 0
    ecn_frac: float = 0.0
    ecn_samples: int = 0
    srtt: float | None = None
    evictions: int = 0
    evidence: int = -1  # newest tx_seq SACKed on this path
    born: int | None = None  # first tx_seq sent on this port (set by the requester)
    loss_times: list = field(default_factory=list)

    def stats(self) -> dict:
        return {"sport": self.sport, "weight": round(self.weight, 3), "sent": self.sent,
                "acked": self.acked, "lost": self.lost, "rtos": self.rtos, "ecn": self.ecn,
                "srtt_ns": None if self.srtt is None else int(self.srtt),
                "evictions": self.evictions}


class PathSet:
    def __init__(self, n: int, lqpn: int, rqpn: int, seed: int = 0,
                 cfg: MPConfig | None = None):
        if not 1 <= n <= 64:
            raise ValueError("paths must be in 1..64 (MP-1)")
        self.cfg = cfg or MPConfig()
        self.rng = random.Random((seed << 48) ^ (lqpn << 24) ^ rqpn)
        first = flow_label_sport(lqpn, rqpn)
        self.paths = [Path(first)]
        self.retired: dict[int, int] = {}  # sport -> time it was evicted
        while len(self.paths) < n:
            self.paths.append(Path(self._fresh_port(0)))
        self.evictions = 0

    def __len__(self) -> int:
        return len(self.paths)

    def sport(self, k: int) -> int:
        return self.paths[k].sport

    def _fresh_port(self, now: int) -> int:
        live = {p.sport for p in getattr(self, "paths", [])}
        while True:
            s = self.rng.randint(UDP_SPORT_MIN, UDP_SPORT_MAX)
            t = self.retired.get(s)
            if s not in live and (t is None or now - t >= REUSE_HOLDOFF_NS):
                return s

    # --- spraying (MP-3) ----------------------------------------------------------------------
    def pick(self, avoid: int | None = None) -> int:
        """Smooth weighted round robin; ``avoid`` (a retransmission's previous path) is skipped
        when another path exists."""
        paths = self.paths
        if len(paths) == 1:
            paths[0].sent += 1
            return 0
        total, best, bw = 0.0, -1, -1e18
        for k, p in enumerate(paths):
            p.current += p.weight
            total += p.weight
            if k != avoid and p.current > bw:
                best, bw = k, p.current
        paths[best].current -= total
        paths[best].sent += 1
        return best

    # --- feedback (MP-4) ----------------------------------------------------------------------
    def on_ack(self, k: int, rtt: int | None, ecn: bool, now: int) -> None:
        if not 0 <= k < len(self.paths):
            return
        p, c = self.paths[k], self.cfg
        p.acked += 1
        if rtt is not None and rtt >= 0:
            p.srtt = rtt if p.srtt is None else 0.875 * p.srtt + 0.125 * rtt
        p.ecn += ecn
        p.ecn_samples += 1
        p.ecn_frac += c.ecn_gain * ((1.0 if ecn else 0.0) - p.ecn_frac)
        if not ecn:
            p.weight = min(1.0, p.weight + c.weight_regain * (1.0 - p.weight))
        elif len(self.paths) > 1 and p.ecn_samples >= c.ecn_min_samples \
                and p.ecn_frac > c.ecn_evict_frac \
                and all(q.ecn_frac < c.ecn_others_below for q in self.paths if q is not p):
            self.evict(k, now)

    def congested(self, k: int) -> None:
        """ECN with low delay (CC-3 quadrant 4): the path, not the receiver, is congested."""
        if 0 <= k < len(self.paths):
            p = self.paths[k]
            p.weight = max(self.cfg.weight_min, p.weight * self.cfg.weight_cut)

    def on_loss(self, k: int, now: int, srtt: float) -> bool:
        """A loss attributed to path k (SACK-5 a/b). Returns True when k was evicted."""
        if not 0 <= k < len(self.paths):
            return False
        p, c = self.paths[k], self.cfg
        p.lost += 1
        p.weight = max(c.weight_min, p.weight * c.weight_cut)
        horizon = now - c.loss_window_srtt * max(srtt, 1.0)
        p.loss_times = [t for t in p.loss_times if t >= horizon] + [now]
        if len(self.paths) > 1 and len(p.loss_times) >= c.loss_evict:
            self.evict(k, now)
            return True
        return False

    def on_rto(self, k: int, now: int) -> None:
        if 0 <= k < len(self.paths):
            self.paths[k].rtos += 1
            if len(self.paths) > 1:
                self.evict(k, now)

    def evict(self, k: int, now: int) -> None:
        """MP-5: fresh entropy, same PathID, weight 1/N, history cleared."""
        old = self.paths[k]
        self.retired[old.sport] = now
        new = Path(self._fresh_port(now), weight=1.0 / len(self.paths))
        new.evictions = old.evictions + 1
        new.sent, new.acked, new.lost, new.rtos, new.ecn = (old.sent, old.acked, old.lost,
                                                            old.rtos, old.ecn)
        self.paths[k] = new  # evidence restarts: the old port's packets are another path
        self.evictions += 1

    def stats(self) -> list[dict]:
        return [p.stats() for p in self.paths]
