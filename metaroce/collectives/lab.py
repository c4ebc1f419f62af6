"""A star lab of N hosts with a MetaRoCE daemon on each: what the train demo and the allreduce
benchmark run their ranks on. Torn down whatever happens."""

from __future__ import annotations

import os
from contextlib import contextmanager

from ..lab import core
from ..nic import daemon as nicd


class LabHosts:
    """The hosts of a running star lab: addrs and netns in rank order, and their daemons."""

    def __init__(self, addrs: list[str], netns: list[str]):
        self.addrs, self.netns = addrs, netns
        self.devices = [nicd.DeviceId("eth0", ns) for ns in netns]
        self.running: list[nicd.DeviceId] = []

    def start(self, mode: str, integrity: str) -> None:
        for dev in self.devices:
            nicd.start_background(dev, mode, integrity=integrity)
            self.running.append(dev)

    def stop(self) -> None:
        while self.running:
            dev = self.running.pop()
            try:
                nicd.stop(dev)
            except Exception:  # noqa: BLE001
                nicd.clean_stale(dev)

    def restart(self, mode: str, integrity: str) -> None:
        """Every host's daemon again, e.g. with another integrity check (spec 5.7)."""
        self.stop()
        self.start(mode, integrity)


@contextmanager
def lab_hosts(hosts: int, mode: str = "metaroce", name: str | None = None,
              integrity: str = "icrc", handle: bool = False, mtu: int = 1500):
    """Yields (addrs, netns): each host's eth0 IPv4 address and namespace, in rank order
    (with handle=True the LabHosts, whose daemons can be restarted)."""
    name = name or f"coll{os.getpid() % 100000}"
    core.up(name, "star", hosts=hosts, mtu=mtu)
    lab = None
    try:
        view = core.LabView(name)
        names = [f"h{i + 1}" for i in range(hosts)]
        lab = LabHosts([view.plan.node(h).iface("eth0").ipv4.split("/")[0] for h in names],
                       [view.plan.node(h).netns for h in names])
        lab.start(mode, integrity)
        yield lab if handle else (lab.addrs, lab.netns)
    finally:
        if lab is not None:
            lab.stop()
        core.down(name)
