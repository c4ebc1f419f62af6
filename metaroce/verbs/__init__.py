"""Verbs for MetaRoCE devices, in the style of pyverbs: Context (opened by device), PD, MR,
CQ, QP (RC), work requests and completions named after rdma-core's ibv_* enums.

    ctx = Context(name="eth0", netns="mr-demo-h2")
    pd = PD(ctx)
    mr = MR(pd, 1 << 20, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)
    cq = CQ(ctx, 256)
    qp = QP(pd, QPInitAttr(send_cq=cq, recv_cq=cq))
    qp.connect(remote_attrs)         # or to_init / to_rtr / to_rts
    qp.post_send(SendWR(opcode=IBV_WR_RDMA_WRITE, sg_list=[mr.sge()], remote_addr=..., rkey=...))
    wc = cq.wait()

An application talks to the device's daemon over its control socket for control verbs; the
queues themselves are rings in memory shared with the daemon (posting and polling make no system
call while the daemon is awake), and registered memory is shared with the kernel data path
(mr.buf is the application's writable view of it).
"""

from .api import (CQ, MR, PD, QP, AsyncEvent, CompChannel, Context, QPCap, QPInitAttr, RecvWR,
                  SendWR, WC, WcError, wait_for_completions, wc_status_str)
from .enums import *  # noqa: F403
from .enums import __all__ as _enums

__all__ = ["Context", "PD", "MR", "CQ", "CompChannel", "QP", "QPCap", "QPInitAttr", "SendWR", "RecvWR", "WC",
           "WcError", "AsyncEvent", "wait_for_completions", "wc_status_str", *_enums]
