"""Impairment settings of one link direction: validation and the encoding the fabric reads."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..errors import UsageError
from .fabric import IMPAIR_ALL_TRAFFIC, IMPAIR_ENABLED

DIRECTIONS = ("a-b", "b-a", "both")


@dataclass
class Impairment:
    loss: float = 0.0
    dup: float = 0.0
    reorder: float = 0.0
    reorder_depth: int = 1
    all_traffic: bool = False
    seed: int = 0

    def validate(self) -> "Impairment":
        for what in ("loss", "dup", "reorder"):
            p = getattr(self, what)
            if not 0.0 <= p <= 1.0:
                raise UsageError(f"--{what} must be a probability between 0 and 1 (got {p})")
        if not 1 <= self.reorder_depth <= 1000:
            raise UsageError("--reorder-depth must be between 1 and 1000 frames")
        if not 0 <= self.seed < 2**64:
            raise UsageError("--seed must be between 0 and 2^64-1")
        return self

    @property
    def active(self) -> bool:
        return bool(self.loss or self.dup or self.reorder)

    def to_cfg(self) -> dict:
        """Field values for the fabric's struct impair_cfg."""
        flags = (IMPAIR_ENABLED if self.active else 0) | (IMPAIR_ALL_TRAFFIC if self.all_traffic else 0)
        return {"flags": flags, "loss": threshold(self.loss), "dup": threshold(self.dup),
                "reorder": threshold(self.reorder), "reorder_depth": self.reorder_depth,
                "seed": self.seed}

    def to_dict(self) -> dict:
        return asdict(self)


def threshold(p: float) -> int:
    """Probability -> threshold on a uniform 32-bit draw (draw < threshold)."""
    return min(int(round(p * 2**32)), 2**32 - 1)


_M64 = (1 << 64) - 1


def _mix64(z: int) -> int:
    """splitmix64's finaliser, as bpf/lab/fabric_helpers.h computes it."""
    z = (z + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def lost_draws(seed: int, loss: float, count: int, start: int = 0) -> list[int]:
    """Which of draws start .. start+count-1 of a port direction lose their frame: the fabric's
    own computation, so a test can predict exactly which frames a seeded loss drops (draw n is
    the n-th frame the impairment considered since it was set)."""
    thr = threshold(loss)
    return [n for n in range(start, start + count)
            if thr and (_mix64(seed ^ _mix64(n)) & 0xFFFFFFFF) < thr]


def directions(which: str) -> list[str]:
    if which not in DIRECTIONS:
        raise UsageError(f"--dir must be one of {', '.join(DIRECTIONS)}")
    return ["a-b", "b-a"] if which == "both" else [which]
