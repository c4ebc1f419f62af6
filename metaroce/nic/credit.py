"""Receiver credits in the real data path (spec CC-8, CC-9): the daemon's side.

The XDP responder stamps every MR_SACK of a QP that has an entry in the `credit` map with flag C
and Limit PSN = cumulative PSN + 1 + share; the XDP requester hands a received credit to its
daemon in the ACK/SACK event, and the daemon sends no new PSN at or beyond the limit (device.py).
What is left to user space is deciding the shares, which is done here on a timer: a QP is an
active sender while its expected PSN moved within `idle_s`; with at least `min_senders` active
(incast: their windows together exceed the receiver link's BDP) each gets
share = max(min_share, BDP in packets // active senders); otherwise no QP is limited. The map is
written only when a share changes.

A sender starts limited (CC-8): a QP that connects while others can receive is admitted with
the share it would have if every live QP sent, and keeps a first-round-trip share (as if every
such fresh QP started beside the active ones) until its first packet arrives; only then does the
activity rule above decide. Without this, QPs connected ahead of an incast looked idle at the
first tick, lost their grant, and all started with a whole window (docs/engine.md rule 8).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import UsageError
from ..lab.plan import parse_rate as lab_parse_rate


def parse_rate(text: str | float | int) -> float:
    """A link rate in bits per second, 1 kbit/s .. 10 Tbit/s, from a number or the lab's rate
    syntax (150mbit, 10G, 25e9; metaroce.lab.plan.parse_rate)."""
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        try:
            value = float(lab_parse_rate(str(text)))
        except UsageError as exc:
            raise ValueError(f"not a rate: {text!r} (e.g. 150mbit, 10gbit, 25e9): {exc}") from None
    if not 1e3 <= value <= 1e13:
        raise ValueError(f"a link rate must be between 1 kbit/s and 10 Tbit/s, not {value:g}")
    return value


def link_speed_bps(dev: str) -> float | None:
    """The kernel's idea of the device's speed (veth says 10 Gbit/s), or None."""
    try:
        with open(os.path.join("/sys/class/net", dev, "speed")) as f:
            mbit = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return mbit * 1e6 if mbit > 0 else None


@dataclass
class CreditConfig:
    link_rate_bps: float | None = None   # the receiver's link, the incast bottleneck (None:
                                         # the interface's speed, resolved by the daemon)
    base_rtt_s: float = 500e-6      # this software NIC's round trip floor
    pmtu: int = 1024
    min_senders: int = 2
    idle_s: float = 0.020           # a sender is active while it delivered within this time
    tick_s: float = 0.002
    quiet_tick_s: float = 0.02     # while no QP is receiving, look less often
    min_share: int = 2

    def __post_init__(self):
        self.validate()

    def validate(self) -> "CreditConfig":
        """Every field finite and in range, or one clear UsageError (a NaN round trip would
        otherwise make every share a NaN long after the daemon started)."""
        def check(name: str, lo, hi, types=(int, float), unit: str = "") -> None:
            v = getattr(self, name)
            # `not lo <= v <= hi` is True for NaN: every comparison with NaN is False
            if isinstance(v, bool) or not isinstance(v, types) or not lo <= v <= hi:
                raise UsageError(f"credit {name} must be from {lo:g} to {hi:g}{unit}, not {v!r}")
        if self.link_rate_bps is not None:
            check("link_rate_bps", 1e3, 1e13, unit=" bit/s")
        for name, hi in (("base_rtt_s", 1.0), ("idle_s", 60.0), ("tick_s", 60.0),
                         ("quiet_tick_s", 60.0)):
            check(name, 1e-6, hi, unit=" s")
        check("pmtu", 256, 8192, int)
        check("min_senders", 1, 1 << 20, int)
        check("min_share", 1, 1 << 24, int)
        return self

    @property
    def bdp_pkts(self) -> int:
        return self.bdp_pkts_of(self.pmtu)

    def bdp_pkts_of(self, pmtu: int) -> int:
        """The link's BDP in packets of pmtu bytes."""
        return max(1, int(self.link_rate_bps * self.base_rtt_s / 8 / pmtu))

    def describe(self) -> dict:
        return {"enabled": True, "link_rate_bps": self.link_rate_bps,
                "base_rtt_us": round(self.base_rtt_s * 1e6, 1), "bdp_pkts": self.bdp_pkts,
                "min_senders": self.min_senders, "idle_s": self.idle_s}


class CreditGranter:
    """Decides each MetaRoCE QP's share every tick_s and writes it to the kernel's map."""

    def __init__(self, rx, cfg: CreditConfig):
        self.rx, self.cfg = rx, cfg
        self.next_tick = 0.0
        self.seen: dict[int, int] = {}          # qpn -> expected PSN at the last tick
        self.active_until: dict[int, float] = {}
        self.granted: dict[int, int] = {}       # qpn -> share in the map (absent: 0)
        self.fresh: set[int] = set()            # admitted, not sent a packet yet
        self.stats = {"credit_ticks": 0, "credit_updates": 0, "credit_admitted": 0,
                      "incast_active_max": 0}

    def tick(self, qps, now: float) -> None:
        if now < self.next_tick:
            return
        self.stats["credit_ticks"] += 1
        live = [q for q in qps if q.state == "RTS" and q.metaroce]
        active = []
        for q in live:
            epsn = self.rx.qp_epsn(q.qpn)
            if epsn is not None and epsn != self.seen.get(q.qpn):
                self.seen[q.qpn] = epsn
                self.active_until[q.qpn] = now + self.cfg.idle_s
                self.fresh.discard(q.qpn)
            if self.active_until.get(q.qpn, 0.0) > now:
                active.append(q.qpn)
        fresh = [q.qpn for q in live if q.qpn in self.fresh]
        pmtu = {q.qpn: q.pmtu for q in live}
        n = len(active)
        self.next_tick = now + (self.cfg.tick_s if n or fresh else self.cfg.quiet_tick_s)
        self.stats["incast_active_max"] = max(self.stats["incast_active_max"], n)
        want = {qpn: self.share(n, pmtu[qpn]) for qpn in active}
        # admitted QPs that have not sent yet keep a share for their first round trip: what
        # each would get if all of them started now beside the active ones
        want.update((qpn, self.share(n + len(fresh), pmtu[qpn])) for qpn in fresh)
        want = {qpn: s for qpn, s in want.items() if s}
        for qpn in set(self.granted) | set(want):
            s = want.get(qpn, 0)
            if s != self.granted.get(qpn, 0):
                self.rx.set_credit(qpn, s)
                self.stats["credit_updates"] += 1
                if s:
                    self.granted[qpn] = s
                else:
                    self.granted.pop(qpn, None)

    def admit(self, qpn: int, qps, now: float) -> None:
        """CC-8, a sender starts limited: a MetaRoCE QP connecting while others can receive
        gets the share it would have if all of them sent, before it sends its first packet, so
        that senders starting together (an incast's first round trip) do not each bring a
        whole window. The next tick, due at once, replaces the guess with what the QPs do."""
        self.fresh.add(qpn)
        self.seen[qpn] = self.rx.qp_epsn(qpn)       # it is fresh until this moves
        self.stats["credit_admitted"] += 1
        live = sum(1 for q in qps if q.state == "RTS" and q.metaroce and q.qpn != qpn) + 1
        share = self.share(live, next((q.pmtu for q in qps if q.qpn == qpn), None))
        if share:
            self.rx.set_credit(qpn, share)
            self.granted[qpn] = share
            self.stats["credit_updates"] += 1
        self.next_tick = min(self.next_tick, now + self.cfg.tick_s)

    def share(self, senders: int, pmtu: int | None = None) -> int:
        """Each sender's share of the link's BDP, in packets of pmtu bytes (its QP's path MTU:
        shares are bytes, counted in each QP's packets; None: the device's), 0 (no limit)
        below min_senders."""
        if senders < self.cfg.min_senders:
            return 0
        return max(self.cfg.min_share, self.cfg.bdp_pkts_of(pmtu or self.cfg.pmtu) // senders)

    def forget(self, qpn: int) -> None:
        for d in (self.seen, self.active_until, self.granted):
            d.pop(qpn, None)
        self.fresh.discard(qpn)

    def share_of(self, qpn: int) -> int:
        return self.granted.get(qpn, 0)
