"""Congestion control of a device's QPs on the wire (spec CC-1 .. CC-7, COMPAT-4).

The engine (metaroce/cengine/cc.c) runs it; the device only chooses its parameters: the link's
rate (the window's BDP cap, DCQCN's line rate), the base round trip configured for the fabric (a
smaller measured one replaces it) and the queueing delay above the base round trip that counts
as congestion (CC-3). MetaRoCE QPs run the window (ECN + delay), compat QPs DCQCN's reaction to
CNPs. Why the wire's delay target is not the simulator's 10 µs: docs/engine.md rule 8.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UsageError

# The wire's round trip jitters by hundreds of microseconds here (a software NIC on a shared
# 2-vCPU VM: docs/engine.md rule 8; measured on the lab pair under 1 % loss: smallest RTT
# 15-25 us, sRTT 200-450 us, RTTVAR 30-270 us); a delay target below that reads most samples as
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

    def conn(self) -> dict:
        """The data path's per-connection fields (struct mr_dp_conn)."""
        return {"cc": int(self.enabled),
                "cc_line_rate_bps": float(self.link_rate_bps or 10e9),
                "cc_base_rtt_ns": int(self.base_rtt_s * 1e9),
                "cc_target_qdelay_ns": int(self.target_qdelay_s * 1e9)}

    def describe(self) -> dict:
        if not self.enabled:
            return {"enabled": False}
        return {"enabled": True, "metaroce": "window (ECN + delay)", "roce": "dcqcn",
                "link_rate_bps": self.link_rate_bps,
                "base_rtt_us": round(self.base_rtt_s * 1e6, 1),
                "target_qdelay_us": round(self.target_qdelay_s * 1e6, 1)}
