"""MetaRoCE transport engine: RC requester/responder state machines, I/O- and clock-free.

Compat mode is RoCEv2 RC go-back-N; MetaRoCE mode is selective repeat with SACK and
per-packet placement. See docs/engine.md.
"""

from .mr import Access, MRTable
from .packets import Aeth, AtomicEth, Packet, Placement, Reth
from .qp import Mode, QPAttr, QPState, QPStateError
from .queue_pair import QueuePair
from .verdict import PktFields, RespState, Verdict, responder_verdict
from .wr import Completion, RecvWR, SendWR, WcOpcode, WcStatus, WrOpcode

__all__ = [
    "Access", "MRTable", "Aeth", "AtomicEth", "Packet", "Placement", "Reth", "Mode", "QPAttr",
    "QPState", "QPStateError", "QueuePair", "PktFields", "RespState", "Verdict",
    "responder_verdict", "Completion", "RecvWR", "SendWR", "WcOpcode", "WcStatus", "WrOpcode",
]
