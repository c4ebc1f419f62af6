"""What every lab benchmark here does the same way: a fresh two-host lab with a MetaRoCE daemon
on each host, torn down whatever happens, and the machine description every result carries."""

from __future__ import annotations

import os
import platform
import time
from contextlib import contextmanager
from dataclasses import dataclass

from metaroce.lab import core
from metaroce.nic import daemon as d


@dataclass
class TwoHosts:
    view: object
    ns1: str
    ns2: str
    ip1: str
    ip2: str
    pids: list


@contextmanager
def two_hosts(name: str, mode: str = "metaroce", mtu: int = 1500):
    if name in core.state.names() or core.namespaces_of(name):
        core.down(name)
    core.up(name, "pair", mtu=mtu)
    view = core.LabView(name)
    ns1, ns2 = (view.plan.node(h).netns for h in ("h1", "h2"))
    ip1, ip2 = (view.plan.node(h).iface("eth0").ipv4.split("/")[0] for h in ("h1", "h2"))
    devs = [d.DeviceId("eth0", ns) for ns in (ns1, ns2)]
    started = []
    try:
        pids = []
        for dev in devs:
            pids.append(d.start_background(dev, mode)["pid"])
            started.append(dev)
        yield TwoHosts(view, ns1, ns2, ip1, ip2, pids)
    finally:
        for dev in started:
            try:
                d.stop(dev)
            except Exception:  # noqa: BLE001 (already gone)
                d.clean_stale(dev)
        core.down(name)


def header(benchmark: str) -> dict:
    return {"benchmark": benchmark, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "machine": {"host": platform.node(), "kernel": platform.release(),
                        "cpus": os.cpu_count()}}
