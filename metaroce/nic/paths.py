"""Multipath state of one MetaRoCE sender (spec 5.4): N paths, each a PathID with its own UDP
source port; per-path counters (MP-4) and the eviction rules (MP-5). Pure Python, no I/O: the
C fast path sprays packets over the ports this module chooses (packet PSN p, sent for the r-th
time, goes on path (p + r) % N), and the device tells it about losses, RTOs and SACK feedback.

An evicted path keeps its PathID and gets a fresh source port, never one a live path uses or
one retired less than a second ago; in an ECMP fabric a new port is a new hash, so a path
through a dead or congested link moves elsewhere. Packets in flight on the old port stay valid
(the receiver does not care which port a packet came on, MP-2)."""

from __future__ import annotations

import secrets
from collections import deque
from dataclasses import dataclass, field

MAX_DP_PATHS = 8              # paths the data path sprays over (the C flow holds 8 ports)
PORT_LO, PORT_HI = 0xC000, 0xFFFF
LOSS_EVICT = 2                # MP-5: losses attributed to a path within ...
LOSS_WINDOW_SRTT = 8          # ... this many smoothed RTTs evict it
LOSS_WINDOW_MIN_S = 0.002     # (never shorter than 2 ms: timer granularity of the daemon)
ECN_GAIN = 1 / 16             # MP-5: EWMA of a path's SACKs' ECN signals
ECN_MIN_SACKS = 16
ECN_EVICT, ECN_OTHERS = 0.5, 0.25
PORT_QUARANTINE_S = 1.0       # a retired port is not reused within this time


@dataclass
class Path:
    sport: int
    lost: int = 0
    rtos: int = 0
    ecn_echoes: int = 0
    sacks: int = 0
    ecn_frac: float = 0.0
    evictions: int = 0
    srtt: float | None = None                 # smoothed RTT of the path's SACKs (SACK-5 (b))
    recent_losses: deque = field(default_factory=deque)


class PathSet:
    """The N paths of one QP. `rand(n)` picks an integer in [0, n) (tests pass a seeded one)."""

    def __init__(self, n: int, rand=secrets.randbelow):
        if not 1 <= n <= MAX_DP_PATHS:
            raise ValueError(f"paths must be 1-{MAX_DP_PATHS}, not {n}")
        self._rand = rand
        self.retired: dict[int, float] = {}          # port -> when it was retired
        self.paths: list[Path] = []
        for _ in range(n):
            self.paths.append(Path(self._fresh_port(0.0)))

    def __len__(self) -> int:
        return len(self.paths)

    @property
    def sports(self) -> list[int]:
        return [p.sport for p in self.paths]

    def path_of(self, psn: int, retx: int = 0) -> int:
        """The path the fast path put PSN psn on, the retx-th time it was sent."""
        return (psn + retx) % len(self.paths)

    def _fresh_port(self, now: float) -> int:
        live = {p.sport for p in self.paths}
        for _ in range(64):
            port = PORT_LO + self._rand(PORT_HI - PORT_LO + 1)
            if port in live:
                continue
            t = self.retired.get(port)
            if t is not None and now - t < PORT_QUARANTINE_S:
                continue
            return port
        raise RuntimeError("no free source port for a path")     # 16,384 ports, <= 8 live

    def evict(self, k: int, now: float) -> int:
        """MP-5: path k gets a new source port (same PathID) and a clean slate."""
        old = self.paths[k]
        self.retired[old.sport] = now
        if len(self.retired) > 256:                 # forget ports retired long ago
            self.retired = {p: t for p, t in self.retired.items()
                            if now - t < PORT_QUARANTINE_S}
        old.sport = self._fresh_port(now)
        old.evictions += 1
        old.recent_losses.clear()
        old.ecn_frac, old.sacks, old.srtt = 0.0, 0, None
        return old.sport

    def on_loss(self, k: int, now: float, srtt: float | None) -> bool:
        """A packet sent on path k was declared lost (SACK-5); True if that evicted it."""
        p = self.paths[k]
        p.lost += 1
        window = max(LOSS_WINDOW_SRTT * (srtt or 0.0), LOSS_WINDOW_MIN_S)
        p.recent_losses.append(now)
        while p.recent_losses and now - p.recent_losses[0] > window:
            p.recent_losses.popleft()
        if len(p.recent_losses) >= LOSS_EVICT:
            self.evict(k, now)
            return True
        return False

    def on_rto(self, k: int, now: float) -> None:
        """MP-5: a path that caused an RTO is evicted."""
        self.paths[k].rtos += 1
        self.evict(k, now)

    def on_rtt(self, k: int, rtt: float) -> None:
        """An RTT sample from a SACK that echoed path k (RFC 6298's gain)."""
        if 0 <= k < len(self.paths):
            p = self.paths[k]
            p.srtt = rtt if p.srtt is None else p.srtt + (rtt - p.srtt) / 8

    def on_feedback(self, k: int, ecn: bool, now: float) -> bool:
        """An ACK/SACK that echoed path k, CE-marked or not; True if the ECN rule evicted it
        (its fraction above 50 % while every other path's is below 25 %)."""
        if not 0 <= k < len(self.paths):
            return False                            # not a PathID of ours
        p = self.paths[k]
        p.sacks += 1
        p.ecn_echoes += ecn
        p.ecn_frac += ECN_GAIN * (float(ecn) - p.ecn_frac)
        if len(self.paths) > 1 and p.sacks >= ECN_MIN_SACKS and p.ecn_frac > ECN_EVICT and \
                all(q.ecn_frac < ECN_OTHERS for i, q in enumerate(self.paths) if i != k):
            self.evict(k, now)
            return True
        return False

    def stats(self) -> list[dict]:
        return [{"path": i, "sport": p.sport, "lost": p.lost, "rtos": p.rtos,
                 "ecn_echoes": p.ecn_echoes, "ecn_frac": round(p.ecn_frac, 3),
                 "srtt_us": round(p.srtt * 1e6, 1) if p.srtt is not None else None,
                 "evictions": p.evictions} for i, p in enumerate(self.paths)]
