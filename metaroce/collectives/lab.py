"""A star lab of N hosts with a MetaRoCE daemon on each: what the train demo and the allreduce
benchmark run their ranks on. Torn down whatever happens."""

from __future__ import annotations

import os
from contextlib import contextmanager

from ..lab import core
from ..nic import daemon as nicd


@contextmanager
def lab_hosts(hosts: int, mode: str = "metaroce", name: str | None = None):
    """Yields (addrs, netns): each host's eth0 IPv4 address and namespace, in rank order."""
    name = name or f"coll{os.getpid() % 100000}"
    core.up(name, "star", hosts=hosts)
    started = []
    try:
        view = core.LabView(name)
        names = [f"h{i + 1}" for i in range(hosts)]
        netns = [view.plan.node(h).netns for h in names]
        addrs = [view.plan.node(h).iface("eth0").ipv4.split("/")[0] for h in names]
        for ns in netns:
            dev = nicd.DeviceId("eth0", ns)
            nicd.start_background(dev, mode)
            started.append(dev)
        yield addrs, netns
    finally:
        for dev in started:
            try:
                nicd.stop(dev)
            except Exception:  # noqa: BLE001
                nicd.clean_stale(dev)
        core.down(name)
