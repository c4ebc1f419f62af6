"""A completion queue as the control plane knows it: its handle, owner, size and completion
channel. The accounting a verbs device keeps (cqe entries, the owner's consumer index read and
checked at each completion, overrun when a completion would leave more than cqe unconsumed:
IBV_EVENT_CQ_ERR and its QPs to ERR) is the data path thread's, which writes the completions
(metaroce/datapath/dp_cq.c); `Device.cq_describe` reads it back."""

from __future__ import annotations

from dataclasses import dataclass

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
    ring: object = None                         # a CqRing, or None (the daemon's endpoints)
    channel: int | None = None                  # the completion channel its events go to
    own_channel: int | None = None              # that channel, when it was made for this CQ

    def __post_init__(self):
        self.cqe = self.ring.entries if self.ring is not None else self.requested
