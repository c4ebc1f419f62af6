"""Congestion control of a device's QPs on the wire (spec CC-1 .. CC-7, COMPAT-4).

The engine (metaroce/cengine/cc.c) runs it; the device only chooses its parameters: the link's
rate (the window's BDP cap, DCQCN's line rate), the base round trip configured for the fabric (a
smaller measured one replaces it) and the queueing delay above the base round trip that counts
as congestion (CC-3). MetaRoCE QPs run the window (ECN + delay), compat QPs DCQCN's reaction to
CNPs. Why the wire's delay target is not the simulator's 10 µs: docs/engine.md rule 8.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..engine import cc as engine_cc
from ..engine.requester import HDR_BYTES
from ..errors import UsageError

# The wire's round trip jitters by hundreds of microseconds here (a software NIC on a shared
# 2-vCPU VM: sRTT ~300 us under 1 % loss in tools/bench/loss_sweep.py, RTTVAR up to ~270 us
# read by hand, docs/engine.md rule 8); a delay target below that reads most samples as
# queueing, so the window grows only additively and CC-4's loss cuts wear it down.
DEFAULT_TARGET_QDELAY_S = 1e-3
DEFAULT_BASE_RTT_S = 500e-6


@dataclass
class CCConfig:
    enabled: bool = True
    link_rate_bps: float | None = None     # None: the interface's speed, resolved by the daemon
    base_rtt_s: float = DEFAULT_BASE_RTT_S
    target_qdelay_s: float = DEFAULT_TARGET_QDELAY_S

    def __post_init__(self):
        self.validate()

    def validate(self) -> "CCConfig":
        """Every field finite and in range, or one clear UsageError."""
        if not isinstance(self.enabled, bool):
            raise UsageError(f"cc enabled must be true or false, not {self.enabled!r}")
        checks = [("base_rtt_s", 1e-6, 1.0, " s"), ("target_qdelay_s", 0.0, 1.0, " s")]
        if self.link_rate_bps is not None:
            checks.append(("link_rate_bps", 1e3, 1e13, " bit/s"))
        for name, lo, hi, unit in checks:
            v = getattr(self, name)
            # `not lo <= v <= hi` is True for NaN: every comparison with NaN is False
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
                raise UsageError(f"cc {name} must be from {lo:g} to {hi:g}{unit}, not {v!r}")
        return self

    def engine(self, window: int, pmtu: int) -> engine_cc.CCConfig | None:
        """The engine's parameters for a QP with this PSN window and path MTU (None: off).
        Beside the link's rate, base RTT and target, the wire differs from the simulator's
        defaults in two places: the window's cap is 1.25 x BDP but never more than the PSN
        window lets out as CC-1 counts bytes (window x (PMTU + 64): a larger cap could not be
        used, and additive growth then fell behind CC-4's loss cuts); DCQCN's steps and floor
        are common RoCE NICs' (5 / 50 Mbit/s, 1 Mbit/s), not sized for 100 Gbit/s."""
        if not self.enabled:
            return None
        rate = float(self.link_rate_bps or 10e9)
        base_ns = int(self.base_rtt_s * 1e9)
        bdp, cap = rate * base_ns / 8e9, window * (pmtu + HDR_BYTES)
        return engine_cc.CCConfig(
            line_rate_bps=rate, base_rtt_ns=base_ns,
            target_qdelay_ns=int(self.target_qdelay_s * 1e9),
            bdp_factor=min(engine_cc.CCConfig.bdp_factor, cap / bdp),
            dcqcn_ai_bps=5e6, dcqcn_hai_bps=50e6, dcqcn_min_bps=1e6)

    def describe(self) -> dict:
        if not self.enabled:
            return {"enabled": False}
        return {"enabled": True, "metaroce": "window (ECN + delay)", "roce": "dcqcn",
                "link_rate_bps": self.link_rate_bps,
                "base_rtt_us": round(self.base_rtt_s * 1e6, 1),
                "target_qdelay_us": round(self.target_qdelay_s * 1e6, 1)}
