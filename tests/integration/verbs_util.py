"""Two connected verbs endpoints on a lab pair: daemons on h1 and h2, one context on each."""

from contextlib import contextmanager

from metaroce.lab import core
from metaroce.nic import daemon as d
from metaroce.verbs import (CQ, MR, PD, QP, IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_REMOTE_ATOMIC,
                            IBV_ACCESS_REMOTE_READ, IBV_ACCESS_REMOTE_WRITE, Context, QPInitAttr)

ALL_ACCESS = (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
              IBV_ACCESS_REMOTE_ATOMIC)


def ip_of(view, host: str, v6: bool = False) -> str:
    i = view.plan.node(host).iface("eth0")
    return (i.ipv6 if v6 else i.ipv4).split("/")[0]


@contextmanager
def daemons(view, hosts=("h1", "h2"), mode="roce", **kw):
    devs = [d.DeviceId("eth0", view.plan.node(h).netns) for h in hosts]
    started = []
    try:
        for dev in devs:
            d.start_background(dev, mode, **kw)
            started.append(dev)
        yield devs
    finally:
        for dev in started:
            try:
                d.stop(dev)
            except Exception:  # noqa: BLE001 (already gone: the test killed it)
                d.clean_stale(dev)


class End:
    """One side: a PD, an MR, a CQ and a QP."""

    def __init__(self, ctx: Context, mr_bytes: int, access: int = ALL_ACCESS):
        self.ctx = ctx
        self.pd = PD(ctx)
        self.mr = MR(self.pd, mr_bytes, access)
        self.cq = CQ(ctx)
        self.qp = QP(self.pd, QPInitAttr(self.cq, self.cq))


def connect(a: End, b: End, ip_a: str, ip_b: str, mode: str = "roce", **attr) -> None:
    a.qp.connect({"qpn": b.qp.qp_num, "psn": b.qp.psn, "ip": ip_b, "mode": mode}, **attr)
    b.qp.connect({"qpn": a.qp.qp_num, "psn": a.qp.psn, "ip": ip_a, "mode": mode}, **attr)


def lab_pair(name: str):
    core.up(name, "pair")
    return core.LabView(name)


@contextmanager
def leaf_spine(name: str):
    """A 4-host leaf-spine lab with MetaRoCE devices on h1 (under leaf1) and h4 (under leaf2):
    yields (view, context on h1, context on h4); everything torn down afterwards."""
    core.up(name, "leaf-spine", hosts=4)
    view = core.LabView(name)
    try:
        with daemons(view, hosts=("h1", "h4"), mode="metaroce"):
            c1 = Context("eth0", view.plan.node("h1").netns)
            c4 = Context("eth0", view.plan.node("h4").netns)
            try:
                yield view, c1, c4
            finally:
                c1.close()
                c4.close()
    finally:
        core.down(name)
