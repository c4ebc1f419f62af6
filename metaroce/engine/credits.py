"""Receiver credits for last-hop incast (spec CC-8, CC-9), clock-free.

One :class:`CreditManager` per receiving NIC (shared by all its QPs) counts the senders that
delivered a request packet in the last ``idle_ns``. When at least ``min_senders`` are active
(their line-rate-start windows, 1.25 × BDP each, then exceed the BDP of the receiver's link),
the receiver is in incast and grants every active sender an equal share of that BDP:
Limit PSN = cumulative PSN + 1 + share, share = max(1, ceil(BDP in packets / active senders))
(rounding up keeps at least one BDP in flight; see docs/engine.md "Rules decided").
A sender with the CREDIT capability starts in credit mode with ``initial_credit_pkts`` (the
receiver's first grant — active or not — replaces it), so the first round trip of an incast
is bounded as well. The per-QP grant state (:class:`GrantState`) lives in the responder, the
sender's gate (:class:`CreditGate`) in the requester.
"""

from dataclasses import dataclass

from . import psn as psnm


@dataclass
class CreditConfig:
    link_rate_bps: float = 100e9  # the receiver's own link (the incast bottleneck)
    base_rtt_ns: int = 8_000
    mtu: int = 4096
    min_senders: int = 2
    idle_ns: int = 20_000  # a sender is active while it delivered within this time
    initial_credit_pkts: int = 2  # a sender's implicit credit before the first grant
    liveness_rtos: int = 4  # CC-9: probe after this many RTOs blocked with no grant
    pace: bool = False  # also grant Rate = link rate / active senders

    @property
    def bdp_pkts(self) -> int:
        return max(1, int(self.link_rate_bps * self.base_rtt_ns / 8e9 // self.mtu))


class CreditManager:
    """Receiver-NIC view: who is active, and each active sender's share."""

    def __init__(self, cfg: CreditConfig | None = None):
        self.cfg = cfg or CreditConfig()
        self.last_seen: dict[int, int] = {}  # QP key -> last arrival
        self._count = 0
        self._count_at: int | None = None
        self.max_active = 0
        self.grants = 0

    def touch(self, key: int, now: int) -> None:
        if key not in self.last_seen or now - self.last_seen[key] >= self.cfg.idle_ns:
            self._count_at = None  # a sender (re)joined: recount now
        self.last_seen[key] = now

    def active(self, now: int) -> int:
        """Active senders; recounted at most every idle/8 unless one joined."""
        if self._count_at is None or now - self._count_at >= self.cfg.idle_ns // 8:
            horizon = now - self.cfg.idle_ns
            stale = [k for k, t in self.last_seen.items() if t < horizon]
            for k in stale:
                del self.last_seen[k]
            self._count = len(self.last_seen)
            self._count_at = now
            self.max_active = max(self.max_active, self._count)
        return self._count

    def share(self, now: int) -> int | None:
        """Packets each active sender may have beyond its cumulative PSN; None: no incast."""
        n = self.active(now)
        if n < self.cfg.min_senders:
            return None
        return max(1, -(-self.cfg.bdp_pkts // n))  # ceil: together at least one BDP

    def rate_mbps(self, now: int) -> int:
        if not self.cfg.pace:
            return 0
        return max(1, int(self.cfg.link_rate_bps / 1e6 / max(1, self.active(now))))


class GrantState:
    """Responder side of one QP: what it last granted."""

    def __init__(self):
        self.announced = False  # first grant sent (replaces the sender's implicit credit)
        self.active = False
        self.limit = 0
        self.seq = 0
        self.resent_at: int | None = None


class CreditGate:
    """Requester side of one QP (CC-8): the limit it must not send new PSNs at or beyond."""

    def __init__(self, start_psn: int, initial: int):
        self.active = True
        self.limit = psnm.add(start_psn, max(1, initial))
        self.seq: int | None = None
        self.rate_mbps = 0
        self.last_grant: int | None = None
        self.blocked_since: int | None = None
        self.probes = 0
        self.grants = 0

    def allows(self, psn: int) -> bool:
        return not self.active or psnm.diff(psn, self.limit) < 0

    def on_grant(self, seq: int, active: bool, limit: int, rate: int, now: int) -> bool:
        """An MR_CREDIT; stale (reordered) grants are ignored. Returns True when applied."""
        if self.seq is not None and psnm.diff(seq, self.seq) <= 0:
            return False
        self.seq = seq
        self.active, self.rate_mbps, self.last_grant = active, rate if active else 0, now
        if active:
            self.limit = limit
        self.grants += 1
        return True

    def refresh(self, limit: int, now: int) -> None:
        """SACK flag C: a newer limit while in credit mode (limits only move forward)."""
        if self.active and psnm.diff(limit, self.limit) > 0:
            self.limit = limit
            self.last_grant = now
