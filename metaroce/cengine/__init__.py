"""The transport engine in C (mre.h, docs/engine.md): one implementation of the RC requester,
responder, congestion control, multipath and credits, for the simulator and (next) the wire.

Built by the setup step (``python -m metaroce.cengine.build``). :class:`QueuePair` drives it
with the interface of the Python reference model (metaroce.engine), which stays only for the
differential tests."""

from .qp import BREAKS, Engine, QueuePair

__all__ = ["BREAKS", "Engine", "QueuePair"]
