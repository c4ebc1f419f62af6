"""What every benchmark here does the same way: fresh labs with MetaRoCE daemons, torn down
whatever happens; the machine (and how busy it was) every result carries; min/median/max of
repeated runs; Jain's index; JSON in tools/bench/results/ and matplotlib plots next to it."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass

from metaroce.lab import core
from metaroce.lab.plan import NETNS_PREFIX
from metaroce.nic import daemon as d

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(HERE, "results")
CLI = [sys.executable, "-m", "metaroce.cli"]
ENV = {**os.environ, "PYTHONPATH": ROOT}


@dataclass
class TwoHosts:
    view: object
    ns1: str
    ns2: str
    ip1: str
    ip2: str
    pids: list


def fresh_lab(name: str, topology: str, **kw):
    """`metaroce lab up` after removing a leftover lab of the same name; returns its view."""
    if name in core.state.names() or core.namespaces_of(name):
        core.down(name)
    core.up(name, topology, **kw)
    return core.LabView(name)


def stop_daemons(devs) -> None:
    for dev in devs:
        try:
            d.stop(dev)
        except Exception:  # noqa: BLE001 (already gone)
            d.clean_stale(dev)


@contextmanager
def two_hosts(name: str, mode: str = "metaroce", mtu: int = 1500, integrity: str = "icrc",
              steer: bool = False, rx_cpus: str = "auto"):
    view = fresh_lab(name, "pair", mtu=mtu, steer=steer)
    ns1, ns2 = (view.plan.node(h).netns for h in ("h1", "h2"))
    ip1, ip2 = (view.plan.node(h).iface("eth0").ipv4.split("/")[0] for h in ("h1", "h2"))
    devs = [d.DeviceId("eth0", ns) for ns in (ns1, ns2)]
    started = []
    try:
        pids = []
        for dev in devs:
            pids.append(d.start_background(dev, mode, integrity=integrity,
                                           rx_cpus=rx_cpus)["pid"])
            started.append(dev)
        yield TwoHosts(view, ns1, ns2, ip1, ip2, pids)
    finally:
        stop_daemons(started)
        core.down(name)


@contextmanager
def bare_veth(name: str, mtu: int = 1500):
    """Two namespaces joined by one veth pair: no XDP, no switch, GSO/GRO as the kernel does
    them — TCP's best path on this machine (the second baseline of ../shared/facts.md). Yields
    (client netns, server netns, server address); removed whatever happens."""
    from pyroute2 import NetNS, netns  # noqa: PLC0415
    names = [f"{NETNS_PREFIX}{name}-a", f"{NETNS_PREFIX}{name}-b"]
    for n in names:
        if n in netns.listnetns():
            netns.remove(n)
    try:
        for n in names:
            netns.create(n)
        with NetNS(names[0]) as ipr:
            ipr.link("add", ifname="bv0", kind="veth", peer={"ifname": "bv1", "net_ns_fd": names[1]})
        for n, ifname, addr in ((names[0], "bv0", "10.254.0.1"), (names[1], "bv1", "10.254.0.2")):
            with NetNS(n) as ipr:
                idx = ipr.link_lookup(ifname=ifname)[0]
                ipr.link("set", index=idx, mtu=mtu)
                ipr.addr("add", index=idx, address=addr, prefixlen=24)
                ipr.link("set", index=idx, state="up")
                ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
        yield names[0], names[1], "10.254.0.2"
    finally:
        for n in names:
            if n in netns.listnetns():
                netns.remove(n)


@dataclass
class BenchEnd:
    """One side of a connected benchmark QP pair: its MR, CQ and QP."""
    mr: object
    cq: object
    qp: object


def path_mtu(mode: str, *contexts) -> int:
    """The path MTU the CM would pick between these contexts' devices over the lab's IPv4
    addresses (metaroce.cm.endpoint.path_mtu); for QPs connected by hand."""
    from metaroce.cm.endpoint import path_mtu as cm_path_mtu  # noqa: PLC0415
    return cm_path_mtu(mode, *contexts)


def qp_pair(c1, c2, ip1: str, ip2: str, mode: str, mr_bytes: int, access: int,
            **attr) -> tuple[BenchEnd, BenchEnd]:
    """A PD, an MR of mr_bytes, a CQ and an RC QP on each context, connected to each other at
    the path MTU the CM would pick (path_mtu; attr: connect attributes, e.g. paths=4); close
    with close_pair."""
    from metaroce.verbs import CQ, MR, PD, QP, QPInitAttr  # noqa: PLC0415
    ends = []
    for c in (c1, c2):
        pd = PD(c)
        cq = CQ(c, 4096)
        ends.append(BenchEnd(MR(pd, mr_bytes, access), cq, QP(pd, QPInitAttr(cq, cq))))
    a, b = ends
    mtu = path_mtu(mode, c1, c2)
    a.qp.connect({"qpn": b.qp.qp_num, "psn": b.qp.psn, "ip": ip2, "mode": mode, "mtu": mtu},
                 **attr)
    b.qp.connect({"qpn": a.qp.qp_num, "psn": a.qp.psn, "ip": ip1, "mode": mode, "mtu": mtu},
                 **attr)
    return a, b


def close_pair(*ends: BenchEnd) -> None:
    for e in ends:
        e.qp.close()
        e.mr.close()


def cli_supports(command: list[str], option: str) -> bool:
    """Whether `metaroce COMMAND --help` lists OPTION (features other work may add later)."""
    p = subprocess.run(CLI + command + ["--help"], capture_output=True, text=True, env=ENV,
                       timeout=60)
    return option in p.stdout


def start_daemons(devs, mode: str = "metaroce", extra: list[str] = (), parallel: int = 4) -> dict:
    """`metaroce up` on every device, at most `parallel` starting at once (each compiles its
    XDP program: ~8 s alone on this VM). Returns {dev: status}."""
    out, todo, running = {}, list(devs), []
    try:
        while todo or running:
            while todo and len(running) < parallel:
                dev = todo.pop(0)
                cmd = CLI + ["up", "--dev", dev.dev, "--mode", mode, "--json", *extra]
                if dev.netns:
                    cmd += ["--netns", dev.netns]
                running.append((dev, subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                                      stderr=subprocess.PIPE, text=True,
                                                      env=ENV)))
            dev, p = running.pop(0)
            so, se = p.communicate(timeout=300)
            if p.returncode:
                raise RuntimeError(f"metaroce up on {dev.netns}: {se.strip() or so.strip()}")
            out[dev] = json.loads(so)
    except BaseException:
        for _, p in running:
            p.wait()
        stop_daemons([x for x in devs if d.running_pid(x)])
        raise
    return out


def summary(xs) -> dict | None:
    """median, min, max (and every run) of the values that are not None."""
    ys = [x for x in xs if x is not None]
    if not ys:
        return None
    ys_sorted = sorted(ys)
    n = len(ys_sorted)
    med = ys_sorted[n // 2] if n % 2 else (ys_sorted[n // 2 - 1] + ys_sorted[n // 2]) / 2
    return {"median": med, "min": ys_sorted[0], "max": ys_sorted[-1], "runs": list(xs)}


def jain(xs) -> float:
    xs = list(xs)
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs)) if any(xs) else 0.0


def load() -> dict:
    """How busy the machine is: load averages and the labs of other users (concurrent tests)."""
    labs = sorted({ns[len(NETNS_PREFIX):].rsplit("-", 1)[0] for ns in core.netdev.list_netns()
                   if ns.startswith(NETNS_PREFIX)}) if os.geteuid() == 0 else []
    return {"loadavg": [round(x, 2) for x in os.getloadavg()], "labs_present": labs}


def header(benchmark: str, argv: list[str] | None = None, root: bool = True) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    run = "sudo .venv/bin/python" if root else ".venv/bin/python"
    return {"benchmark": benchmark, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": " ".join([f"{run} tools/bench/{benchmark}.py", *argv]),
            "machine": {"host": platform.node(), "kernel": platform.release(),
                        "cpus": os.cpu_count(), "cpu_model": _cpu_model()},
            "load_start": load()}


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def save(doc: dict, name: str) -> str:
    """Write results/NAME.json (with the load at the end of the run); returns the path."""
    doc.setdefault("load_end", load())
    os.makedirs(RESULTS, exist_ok=True)
    path = os.path.join(RESULTS, f"{name}.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    return path


def pyplot(who: str):
    """matplotlib.pyplot on the Agg backend, or None (and a note) without the bench extra."""
    try:
        import matplotlib  # noqa: PLC0415
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        print(f"{who}: matplotlib is not installed (pip install -e .[bench]): no plot",
              file=sys.stderr)
        return None
    return plt


def save_figure(fig, doc: dict, name: str, what: str) -> str:
    """Title the figure with what, machine, date and load; write results/NAME.png."""
    la = doc.get("load_start", {}).get("loadavg", ["?"])[0]
    fig.suptitle(f"{what} — {doc['machine']['host']}, {doc['machine']['cpus']} CPUs, "
                 f"load {la}, {doc['date']}", fontsize=10)
    fig.tight_layout()
    os.makedirs(RESULTS, exist_ok=True)
    path = os.path.join(RESULTS, f"{name}.png")
    fig.savefig(path, dpi=100)
    return path
