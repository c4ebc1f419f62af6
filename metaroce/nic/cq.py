"""A completion queue's accounting, as a verbs device keeps it: cqe entries, a producer count
(completions the device wrote) and a consumer index (completions the owner has polled). A
completion that would leave more than cqe entries unconsumed overruns the CQ: it is not queued,
the CQ goes to error (the device then raises IBV_EVENT_CQ_ERR and moves the CQ's QPs to ERR).

The owner tells the device its consumer index (the application piggybacks it on its requests
and rings a small doorbell after polling `ci_every` completions without one), so the device
learns it late by fewer than ci_every completions; the CQ is created with that many entries
more than asked for (a device may give more than cqe, as in ibv_create_cq), so an application
that never has more than its requested cqe completions unpolled never overruns. The consumer
index is read in one place (`consumed`): a CQ ring in shared memory replaces it with a read of
the ring's index."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import MetaroceError

MAX_CQE = 65536          # the largest cqe an application may ask for (max_cqe)


def ci_every(cqe: int) -> int:
    """After how many polled completions the owner reports its consumer index."""
    return max(1, cqe // 4)


def checked_cqe(cqe: int) -> int:
    if not 1 <= cqe <= MAX_CQE:
        raise MetaroceError(f"cqe must be 1 .. {MAX_CQE} (max_cqe), not {cqe}")
    return cqe


@dataclass
class Cq:
    handle: int
    owner: object
    requested: int
    wcs: list = field(default_factory=list)     # produced, not yet handed to the owner
    produced: int = 0
    overrun: bool = False
    dropped: int = 0                            # completions lost to the overrun
    _ci: int = 0

    def __post_init__(self):
        self.report_every = ci_every(self.requested)
        self.cqe = self.requested + self.report_every     # the entries it really has

    @property
    def consumed(self) -> int:
        return self._ci

    def set_consumer_index(self, ci: int) -> None:
        """What the owner has polled so far (a count; it only moves forward)."""
        if not 0 <= ci <= self.produced:
            raise MetaroceError(f"CQ {self.handle}: consumer index {ci} is beyond the "
                                f"{self.produced} completions produced")
        if ci > self._ci:
            self._ci = ci

    def produce(self, wc) -> bool:
        """Queue one completion; False when it is lost: it would overrun the CQ (which goes to
        error now) or the CQ is in error already."""
        if self.overrun:
            self.dropped += 1
            return False
        if self.produced - self.consumed >= self.cqe:
            self.overrun = True
            self.dropped += 1
            return False
        self.wcs.append(wc)
        self.produced += 1
        return True

    def take(self) -> list:
        out, self.wcs = self.wcs, []
        return out

    def describe(self) -> dict:
        return {"cq": self.handle, "cqe": self.cqe, "produced": self.produced,
                "consumed": self.consumed, "state": "ERR" if self.overrun else "OK",
                "dropped": self.dropped}
