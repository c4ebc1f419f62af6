"""A lab's life: up (namespaces, links, programs, shaping), status, impair, exec, down."""

from __future__ import annotations

import os
import shutil

from ..errors import MetaroceError, UsageError
from ..kern import libbpf
from ..system import import_bcc, require_root
from . import fabric, netdev, procs, shaping, state
from .fabric import DIR_IN, DIR_OUT, MAX_PORTS
from .impair import Impairment, directions
from .plan import NETNS_PREFIX, LabPlan, plan_lab, validate_name


def _log(msg: str) -> None:
    from ..cli.output import log  # noqa: PLC0415 (keep the library free of click at import)
    log(msg)


def namespaces_of(name: str) -> list[str]:
    prefix = f"{NETNS_PREFIX}{name}-"
    return [ns for ns in netdev.list_netns() if ns.startswith(prefix)]


def preflight() -> None:
    require_root("the lab")
    import_bcc()
    if not libbpf.is_bpffs():
        raise MetaroceError("bpffs is not mounted on /sys/fs/bpf (sudo mount -t bpf bpf /sys/fs/bpf)")


def up(name: str = "lab", topology: str = "pair", hosts: int | None = None, mtu: int = 1500,
       rate: str | None = None, ecn_threshold: int | None = None, hash_seed: int = 0x4D52,
       steer: bool = False, queues: int = 1) -> dict:
    plan = plan_lab(name, topology, hosts, mtu, rate, ecn_threshold, steer, queues)
    preflight()
    if name in state.names() or namespaces_of(name):
        raise MetaroceError(f"lab {name!r} already exists (metaroce lab down --name {name})")
    try:
        record = _build(plan, hash_seed)
    except BaseException:
        down(name)
        raise
    state.save(name, record)
    return record


def _build(plan: LabPlan, hash_seed: int) -> dict:
    _log(f"lab {plan.name}: {plan.topology}, {len(plan.hosts)} hosts, mtu {plan.mtu}")
    netdev.create_namespaces(plan)
    ports = netdev.build_links(plan)
    too_big = [f"{n}/{i}" for (n, i), idx in ports.items() if idx >= MAX_PORTS]
    if too_big:
        raise MetaroceError(f"interface index beyond the fabric's {MAX_PORTS} ports: {too_big}")
    stations = plan.stations()
    for node in plan.nodes:
        netdev.configure_sysctls(node, hash_seed)
        netdev.configure_node(node, plan.mtu, stations)
    _log(f"lab {plan.name}: compiling and attaching the fabric programs")
    bpf, fds = fabric.load_and_pin(plan.name)
    cpus = len(fabric.steer_cpus()) if plan.steer else 0
    modes = set()
    try:
        with fabric.Fabric(plan.name) as fab:
            for node in plan.nodes:
                for itf in node.ifaces:
                    if node.role == "host":
                        modes.add(fabric.attach_xdp(node.netns, itf.name, fds["host_xdp"]))
                        continue
                    port = ports[(node.name, itf.name)]
                    fab.set_port(port, plan.switch_domain(node.name), shaped=bool(plan.rate_bps),
                                 cpus=cpus)
                    modes.add(fabric.attach_xdp_link(plan.name, node.name, node.netns, itf.name,
                                                     fds["port_xdp"]))
                    fabric.attach_tc(node.netns, itf.name, fds["port_tc_in"], fds["port_tc_out"])
                    if plan.rate_bps:
                        shaping.shape(node.netns, itf.name, plan.rate_bps, plan.mtu)
                        fab.set_ecn(port, plan.rate_bps, plan.ecn_threshold)
            for node, iface, mac in stations:
                fabric.add_station(bpf, plan.node(node).netns, plan.switch_domain(node),
                                   ports[(node, iface)], mac)
    finally:
        bpf.cleanup()   # the attachments and pins hold the programs and maps; this closes our fds
    return {
        "plan": plan.to_dict(),
        "ports": [{"node": n, "iface": i, "ifindex": idx} for (n, i), idx in sorted(ports.items())],
        "xdp_mode": modes.pop() if len(modes) == 1 else "mixed",
        "forwarding": forwarding(plan),
        "steering": {"cpus": cpus} if cpus > 1 else "off",
        "hash_seed": hash_seed,
        "impair": {},
    }


def forwarding(plan: LabPlan) -> str:
    """How switches pass frames between hosts: 'xdp' (a redirect between ports: unshaped L2
    switches) or 'stack' (the bridge, tc and htb; routers always). Duplicating or reordering a
    link direction sends that direction through the stack while it lasts (see
    direction_forwarding); loss alone does not."""
    routed = any(n.forwarding for n in plan.nodes)
    return "stack" if plan.rate_bps or routed or not plan.stations() else "xdp"


def direction_forwarding(lab_forwarding: str, impair: dict | None) -> str:
    """How the frames of one link direction cross its switch-side port (needs_tc() in
    bpf/lab/fabric_fwd.h): 'xdp' in an XDP-forwarding lab unless the direction duplicates or
    reorders (tc does those, so all its frames take the stack); loss is drawn in XDP.
    Broadcasts and frames for stations behind a port that takes the stack cross the bridge
    whatever this says."""
    if lab_forwarding != "xdp":
        return "stack"
    return "stack" if impair and (impair.get("dup") or impair.get("reorder")) else "xdp"


def down(name: str) -> dict:
    """Stop every daemon and process running in the lab's namespaces, then remove every
    namespace, pin and record of the lab; works on half-built labs too."""
    require_root("the lab")
    validate_name(name)
    inodes = procs.namespace_inodes(namespaces_of(name))
    daemons = _stop_daemons(inodes)
    ended = procs.end_all(inodes)
    removed = [ns for ns in namespaces_of(name) if netdev.remove_namespace(ns)]
    pins = fabric.unpin(name)
    had_state = state.remove(name)
    if not (removed or pins or had_state):
        raise MetaroceError(f"no lab named {name!r} exists")
    return {"name": name, "removed_netns": removed, "removed_pins": pins,
            "stopped_daemons": daemons, "ended_pids": ended}


def _stop_daemons(inodes: set[int]) -> list[dict]:
    """`metaroce down` for each device daemon in the lab's namespaces (a clean stop: its
    files go, and what it displaced on the interface is put back before the namespace goes)."""
    from ..nic import daemon as nicd  # noqa: PLC0415
    from ..nic.devid import devices_in_run_dir  # noqa: PLC0415
    out = []
    for dev in devices_in_run_dir():
        if dev.inode in inodes:
            try:
                r = nicd.stop(dev)
            except MetaroceError:
                continue
            out.append({"dev": dev.dev, "netns": r.get("netns"), "pid": r.get("stopped")})
    return out


def lab_names() -> list[str]:
    """Every lab with a record, a namespace or pins (also half-built or half-removed ones)."""
    labs = set(state.names())
    for ns in netdev.list_netns():
        if ns.startswith(NETNS_PREFIX) and ns.count("-") >= 2:
            labs.add(ns[len(NETNS_PREFIX):].rsplit("-", 1)[0])
    if os.path.isdir(fabric.PIN_ROOT):
        labs.update(os.listdir(fabric.PIN_ROOT))
    return sorted(labs)


def down_all() -> list[dict]:
    require_root("the lab")
    return [down(n) for n in lab_names()]


class LabView:
    """A lab that is up, from its record: plan, port indices, live counters."""

    def __init__(self, name: str | None = None):
        require_root("the lab")
        self.name = state.resolve(name)
        self.record = state.load(self.name)
        self.plan = LabPlan.from_dict(self.record["plan"])
        self.ports = {(p["node"], p["iface"]): p["ifindex"] for p in self.record["ports"]}

    def _end(self, node: str, iface: str) -> dict:
        return {"node": node, "iface": iface}

    def status(self, counters: bool = True) -> dict:
        hosts = []
        for n in self.plan.nodes:
            ifaces = [{"name": i.name, "mac": i.mac, "ipv4": i.ipv4, "ipv6": i.ipv6, "mtu": i.mtu,
                       "ifindex": self.ports.get((n.name, i.name))} for i in n.ifaces]
            for b in n.bridges:
                ifaces.append({"name": b.name, "mac": b.mac, "ipv4": b.ipv4, "ipv6": b.ipv6,
                               "mtu": self.plan.mtu, "ifindex": None})
            hosts.append({"name": n.name, "role": n.role, "netns": n.netns, "ifaces": ifaces})
        links = []
        fab = fabric.Fabric(self.name) if counters else None
        try:
            for l in self.plan.links:
                impair = self.record["impair"].get(l.name, {})
                lab_fwd = self.record.get("forwarding", "stack")
                entry = {"name": l.name, "a": self._end(*l.a), "b": self._end(*l.b),
                         "rate": self.plan.rate_bps, "ecn_threshold": self.plan.ecn_threshold,
                         "impair": impair,
                         "forwarding": {d: direction_forwarding(lab_fwd, impair.get(d))
                                        for d in ("a-b", "b-a")}}
                if fab:
                    entry["counters"] = {"a-b": self._direction(fab, l.a, l.b, DIR_IN, l.b),
                                         "b-a": self._direction(fab, l.b, l.a, DIR_OUT, l.b)}
                links.append(entry)
        finally:
            if fab:
                fab.close()
        return {"name": self.name, "topology": self.plan.topology, "mtu": self.plan.mtu,
                "xdp_mode": self.record["xdp_mode"],
                "forwarding": self.record.get("forwarding", "stack"),
                "steering": self.record.get("steering", "off"), "hosts": hosts,
                "links": links}

    def _direction(self, fab, src, dst, impair_dir, impair_end) -> dict:
        s_node = self.plan.node(src[0])
        out = {}
        rx = fab.port_stats(self.ports[dst])
        out["rx_packets"], out["rx_bytes"] = rx["rx_packets"], rx["rx_bytes"]
        if s_node.role != "host":
            tx = fab.port_stats(self.ports[src])
            q = shaping.queue_stats(s_node.netns, src[1])
            out.update(tx_packets=tx["tx_packets"], tx_bytes=tx["tx_bytes"],
                       ecn_marked=tx["ecn_marked"], ecn_not_ect=tx["ecn_not_ect"],
                       queue_drops=q["drops"])
        out["impair"] = fab.impair_stats(self.ports[impair_end], impair_dir)
        return out

    def impair(self, link_name: str, direction: str, imp: Impairment | None) -> dict:
        """Set (or with imp=None clear) the impairment of a link direction."""
        link = self.plan.link(link_name)
        port = self.ports[link.b]
        settings = self.record["impair"].setdefault(link.name, {})
        with fabric.Fabric(self.name) as fab:
            for d in directions(direction):
                slot_dir = DIR_IN if d == "a-b" else DIR_OUT
                if imp is None or not imp.active:
                    fab.set_impair(port, slot_dir, **Impairment().to_cfg())
                    settings.pop(d, None)
                else:
                    fab.set_impair(port, slot_dir, **imp.to_cfg())
                    settings[d] = imp.to_dict()
        if not settings:
            self.record["impair"].pop(link.name, None)
        state.save(self.name, self.record)
        return {"link": link.name, "impair": self.record["impair"].get(link.name, {})}

    def exec(self, node: str, argv: list[str]) -> None:
        """Replace this process with argv running inside the node's namespace."""
        try:
            ns = self.plan.node(node).netns
        except KeyError:
            known = ", ".join(n.name for n in self.plan.nodes)
            raise UsageError(f"no node {node!r} in lab {self.name!r} (nodes: {known})") from None
        if not argv:
            raise UsageError("nothing to run: metaroce lab exec HOST -- CMD [ARGS]")
        if shutil.which(argv[0]) is None:
            raise UsageError(f"command not found: {argv[0]}")
        from pyroute2 import netns as pr_netns  # noqa: PLC0415
        pr_netns.setns(ns)
        os.execvp(argv[0], argv)
