"""What one round of the daemon's loop costs, by phase, over the rounds that did work (the last
SAMPLES of them): `metaroce status --json` shows p50/p99 per phase in microseconds, which is
where docs/architecture.md's cost of each step of the posting and completion paths comes
from. A sample is two clock reads (~0.1 us)."""

from __future__ import annotations

import time
from array import array

SAMPLES = 4096


class LoopTimer:
    def __init__(self, phases: tuple[str, ...]):
        self.phases = phases
        self._buf = {p: array("d", bytes(8 * SAMPLES)) for p in phases}
        self._n = 0
        self._row: dict[str, float] = {}
        self._t = 0

    def start(self) -> None:
        self._row.clear()
        self._t = time.perf_counter_ns()

    def mark(self, phase: str) -> None:
        t = time.perf_counter_ns()
        self._row[phase] = (t - self._t) / 1000
        self._t = t

    def keep(self) -> None:
        """This round did work: record its phases."""
        i = self._n % SAMPLES
        for p in self.phases:
            self._buf[p][i] = self._row.get(p, 0.0)
        self._n += 1

    def describe(self) -> dict:
        n = min(self._n, SAMPLES)
        out = {"rounds": self._n}
        if not n:
            return out
        for p in self.phases:
            xs = sorted(self._buf[p][:n])
            out[p] = {"p50_us": round(xs[n // 2], 2), "p99_us": round(xs[int(n * 0.99)], 2)}
        return out
