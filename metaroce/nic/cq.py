"""A completion queue's accounting, as a verbs device keeps it: cqe entries, a producer count
(completions the device wrote) and a consumer index (completions the owner has polled). A
completion that would leave more than cqe entries unconsumed overruns the CQ: it is not queued,
the CQ goes to error (the device then raises IBV_EVENT_CQ_ERR and moves the CQ's QPs to ERR).

An application's CQ is a ring in memory it shares with the daemon (metaroce/nic/vrings.py): cqe
is the ring's size, completions are written into it and the consumer index is the ring's, read
in one place (`consumed`) at the moment a completion is produced. The application writes that
index, so it is checked: one that moves backwards or passes the producer is as fatal to the CQ
as an overrun (it would let the daemon overwrite what the owner has not read). The daemon's own
endpoints keep a plain list and consume at once (set_consumer_index)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import MetaroceError

MAX_CQE = 65536          # the largest cqe an application may ask for (max_cqe)


def checked_cqe(cqe: int) -> int:
    if not 1 <= cqe <= MAX_CQE:
        raise MetaroceError(f"cqe must be 1 .. {MAX_CQE} (max_cqe), not {cqe}")
    return cqe


def ring_entries(cqe: int) -> int:
    """A ring of at least cqe entries (a power of two, as verbs may give more than asked)."""
    return 1 << (checked_cqe(cqe) - 1).bit_length()


@dataclass
class Cq:
    handle: int
    owner: object
    requested: int
    ring: object = None                         # a CqRing, or None (a list, consumed at once)
    wcs: list = field(default_factory=list)     # ring-less: produced, not yet handed over
    produced: int = 0
    overrun: bool = False
    dropped: int = 0                            # completions lost to the overrun
    bad_index: bool = False                     # the owner wrote an impossible consumer index
    channel: int | None = None                  # the completion channel its events go to
    own_channel: int | None = None              # that channel, when it was made for this CQ
    _ci: int = 0

    def __post_init__(self):
        self.cqe = self.ring.entries if self.ring is not None else self.requested

    @property
    def consumed(self) -> int:
        if self.ring is not None:
            lag = (self.produced - self.ring.consumer_index()) & 0xFFFFFFFF
            if lag > self.produced - self._ci:           # backwards, or past the producer
                if not self.bad_index:
                    self.bad_index = True
                return self._ci
            self._ci = self.produced - lag
        return self._ci

    def set_consumer_index(self, ci: int) -> None:
        """A ring-less owner's consumer index (a count; it only moves forward)."""
        if not 0 <= ci <= self.produced:
            raise MetaroceError(f"CQ {self.handle}: consumer index {ci} is beyond the "
                                f"{self.produced} completions produced")
        if ci > self._ci:
            self._ci = ci

    def produce(self, wc) -> bool:
        """Queue one completion; False when it is lost: it would overrun the CQ (which goes to
        error now), the owner's consumer index is impossible, or the CQ is in error already."""
        if self.overrun:
            self.dropped += 1
            return False
        if self.produced - self.consumed >= self.cqe or self.bad_index:
            self.overrun = True
            self.dropped += 1
            return False
        if self.ring is not None:
            self.ring.put(wc)
        else:
            self.wcs.append(wc)
        self.produced += 1
        return True

    def take(self) -> list:
        out, self.wcs = self.wcs, []
        return out

    def describe(self) -> dict:
        return {"cq": self.handle, "cqe": self.cqe, "produced": self.produced,
                "consumed": self.consumed, "state": "ERR" if self.overrun else "OK",
                "dropped": self.dropped, "bad_consumer_index": self.bad_index}
