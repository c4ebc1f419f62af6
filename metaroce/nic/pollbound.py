"""How long the daemon busy-polls its rings after its last work before it sleeps on the
doorbells. A sleeping daemon costs the next post a doorbell: an eventfd write that, on this
2-vCPU VM, blocks the posting application for 90-400 us (it wakes the daemon's vCPU) and
delays the work as long (tools/bench/busy_poll.py); a polling daemon burns the CPU it polls on.
So the bound adapts, as KVM's halt-polling does: a sleep that ended with work sooner than the
largest bound means polling a little longer would have caught it (the bound doubles); a sleep
longer than that means the traffic is sparse (the bound halves). METAROCE_BUSY_POLL_US fixes
it instead (0 .. 1e6 microseconds), for measuring the trade-off."""

from __future__ import annotations

import os

from ..errors import MetaroceError

LOW_S, HIGH_S, START_S = 50e-6, 2e-3, 200e-6


class PollBound:
    def __init__(self):
        raw = os.environ.get("METAROCE_BUSY_POLL_US")
        self.fixed = raw is not None
        if raw is None:
            self.s = START_S
            return
        try:
            us = float(raw)
        except ValueError:
            us = -1.0
        if not 0 <= us <= 1e6:
            raise MetaroceError(f"METAROCE_BUSY_POLL_US must be 0 .. 1000000 microseconds, "
                                f"not {raw!r}")
        self.s = us / 1e6

    def after_sleep(self, slept_s: float, work: bool) -> None:
        """A sleep of slept_s ended (with work, or by its timeout / a control request)."""
        if self.fixed:
            return
        if work and slept_s < HIGH_S:
            self.s = min(HIGH_S, max(2 * self.s, LOW_S))
        elif slept_s >= HIGH_S:
            self.s = max(LOW_S, self.s / 2)

    def describe(self) -> dict:
        return {"busy_poll_us": round(self.s * 1e6, 1),
                "busy_poll": "fixed (METAROCE_BUSY_POLL_US)" if self.fixed else
                f"adaptive {LOW_S * 1e6:g}-{HIGH_S * 1e6:g} us"}
