"""Endpoints the daemon owns itself: what `metaroce qp create` makes (a PD, one MR, one CQ and
an RC QP) outlives the command that asked for it, so that a peer we did not write (any RoCEv2
RC implementation, or the conformance suite's tester) can be connected to it by a later
`metaroce qp connect`. Each endpoint lives until `metaroce qp destroy` or `metaroce down`."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from ..errors import MetaroceError
from .rx import RQ_DEPTH

KEEP_WCS = 256          # completions kept per endpoint for `metaroce qp show`


@dataclass
class Endpoint:
    qpn: int
    pd: int
    cq: int
    mr_key: int
    wcs: deque = field(default_factory=lambda: deque(maxlen=KEEP_WCS))
    completed: int = 0


class Endpoints:
    """The daemon's own owner of resources (stands where a connection would)."""

    def __init__(self):
        self.by_qpn: dict[int, Endpoint] = {}

    def create(self, dev, mr_bytes: int, access: int, cap: dict) -> tuple[dict, list[int]]:
        pd = dev.alloc_pd(self)
        cq = None
        try:
            mr = dev.reg_mr(self, pd, mr_bytes, access)
            # room for every work request it can have outstanding: never overrun
            cq = dev.create_cq(self, int(cap.get("max_send_wr", 1024)) +
                               min(int(cap.get("max_recv_wr", RQ_DEPTH)), RQ_DEPTH),
                               shared=False).handle
            qp = dev.create_qp(self, pd, cq, cq, cap, shared=False)
        except MetaroceError:
            if cq is not None:
                dev.destroy_cq(self, cq)
            dev.release_pd(self, pd)
            raise
        self.by_qpn[qp.qpn] = Endpoint(qp.qpn, pd, cq, mr.rkey)
        attrs = dev.qp_attrs(qp)
        attrs.update({"rkey": mr.rkey, "lkey": mr.rkey, "addr": mr.addr, "length": mr.length,
                      "access": mr.access})
        return attrs, []

    def get(self, qpn: int) -> Endpoint:
        ep = self.by_qpn.get(qpn)
        if ep is None:
            raise MetaroceError(f"no endpoint with QP 0x{qpn:06x} (see metaroce qp list)")
        return ep

    def destroy(self, dev, qpn: int) -> None:
        ep = self.get(qpn)
        dev.destroy_qp(self, qpn)
        dev.destroy_cq(self, ep.cq)
        dev.release_pd(self, ep.pd)
        del self.by_qpn[qpn]

    def completed(self, cq, wcs: list) -> None:
        """The daemon is the consumer of its endpoints' CQs: it keeps the last KEEP_WCS
        completions of each and consumes every one at once."""
        for ep in self.by_qpn.values():
            if ep.cq == cq.handle:
                ep.wcs.extend(wcs)
                ep.completed += len(wcs)

    def describe(self, dev) -> list[dict]:
        out = []
        for ep in self.by_qpn.values():
            qp = dev.qps.get(ep.qpn)
            mr = dev.mrs.get(ep.mr_key)
            if qp is None or mr is None:
                continue
            doc = dev.qp_stats(qp)
            doc.update({"rkey": ep.mr_key, "addr": mr[0].addr, "length": mr[0].length,
                        "completions": ep.completed, "last_wcs": list(ep.wcs)[-8:]})
            out.append(doc)
        return out
