"""Topology planning for a lab: nodes, links, names, MACs, addresses, routes and static
neighbours. Pure code (no kernel calls), so it is unit-tested without root."""

from __future__ import annotations

import re
import zlib
from dataclasses import asdict, dataclass, field

from ..errors import UsageError

TOPOLOGIES = ("pair", "star", "leaf-spine")
NAME_RE = re.compile(r"^[a-z][a-z0-9]{0,9}$")
NETNS_PREFIX = "mr-"
MAX_HOSTS = 48
MIN_MTU, MAX_MTU = 1280, 9000
MAX_QUEUES = 16                  # queues per veth end (lab up --queues)
V6 = "fd00:4d52"          # ULA prefix of every lab ("MR")


@dataclass
class Iface:
    name: str
    mac: str
    mtu: int
    ipv4: str | None = None      # "a.b.c.d/len"
    ipv6: str | None = None      # "addr/len"
    bridge: str | None = None    # enslaved to this bridge of the same node
    peer: tuple[str, str] | None = None   # (node, iface) at the other end of the veth


@dataclass
class Bridge:
    name: str
    mac: str
    ipv4: str | None = None
    ipv6: str | None = None


@dataclass
class Route:
    dst: str                     # "default" or a prefix
    gateways: list[str]          # several = ECMP
    family: int                  # 4 or 6


@dataclass
class Neighbour:
    dev: str                     # iface or bridge name
    ip: str
    mac: str


@dataclass
class Node:
    name: str
    role: str                    # host | switch | leaf | spine
    netns: str
    ifaces: list[Iface] = field(default_factory=list)
    bridges: list[Bridge] = field(default_factory=list)
    routes: list[Route] = field(default_factory=list)
    neighbours: list[Neighbour] = field(default_factory=list)
    forwarding: bool = False

    def iface(self, name: str) -> Iface:
        for i in self.ifaces:
            if i.name == name:
                return i
        raise KeyError(name)


@dataclass
class Link:
    name: str
    a: tuple[str, str]           # (node, iface): the host or lower tier
    b: tuple[str, str]           # (node, iface): the switch side, where impairment acts


@dataclass
class LabPlan:
    name: str
    topology: str
    mtu: int
    rate_bps: int | None
    ecn_threshold: int | None
    nodes: list[Node]
    links: list[Link]
    steer: bool = False          # switches forward on another CPU than the link's (cpumap)
    queues: int = 1              # receive and transmit queues of every veth end

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    @property
    def hosts(self) -> list[Node]:
        return [n for n in self.nodes if n.role == "host"]

    def link(self, name: str) -> Link:
        """A link by name, or the only link of a host given by its name."""
        for l in self.links:
            if l.name == name:
                return l
        mine = [l for l in self.links if name in (l.a[0], l.b[0])]
        if len(mine) == 1:
            return mine[0]
        known = ", ".join(l.name for l in self.links)
        raise UsageError(f"no link {name!r} in lab {self.name!r} (links: {known})")

    def switch_ports(self) -> list[tuple[str, str]]:
        """Every (node, iface) on a switching node: these get the port programs and shaping."""
        return [(n.name, i.name) for n in self.nodes if n.role != "host" for i in n.ifaces]

    def stations(self) -> list[tuple[str, str, str]]:
        """(switch node, port, MAC) for every bridge port and the interface at its other end:
        the bridge's static forwarding entries, and what the fabric forwards in XDP."""
        return [(n.name, i.name, self.node(i.peer[0]).iface(i.peer[1]).mac)
                for n in self.nodes for i in n.ifaces if i.bridge and i.peer]

    def switch_domain(self, node: str) -> int:
        """A number for each node's L2 switch (its bridge), 1.. in plan order; 0 for none."""
        for k, n in enumerate(self.nodes, start=1):
            if n.name == node:
                return k if n.bridges else 0
        raise KeyError(node)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "LabPlan":
        nodes = []
        for n in d["nodes"]:
            nodes.append(Node(
                name=n["name"], role=n["role"], netns=n["netns"], forwarding=n["forwarding"],
                ifaces=[Iface(**{**i, "peer": tuple(i["peer"]) if i["peer"] else None}) for i in n["ifaces"]],
                bridges=[Bridge(**b) for b in n["bridges"]],
                routes=[Route(**r) for r in n["routes"]],
                neighbours=[Neighbour(**x) for x in n["neighbours"]],
            ))
        links = [Link(name=l["name"], a=tuple(l["a"]), b=tuple(l["b"])) for l in d["links"]]
        return cls(name=d["name"], topology=d["topology"], mtu=d["mtu"], rate_bps=d["rate_bps"],
                   ecn_threshold=d["ecn_threshold"], nodes=nodes, links=links,
                   steer=d.get("steer", False), queues=d.get("queues", 1))


_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?(?:e\d+)?)\s*([kmgt]?)(bit|bps|b)?(?:/s)?\s*$", re.I)
_RATE_MULT = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
MAX_RATE_BPS = 10**13


def parse_rate(text: str | int | None) -> int | None:
    """'10gbit', '500mbit', '1g', '2500000', '25e9' -> bits per second (tc units: bit = bits)."""
    if text is None or isinstance(text, int):
        return text
    m = _RATE_RE.match(text)
    if not m:
        raise UsageError(f"bad rate {text!r}: use e.g. 1gbit, 500mbit, 10g or bits per second")
    bps = float(m.group(1)) * _RATE_MULT[m.group(2).lower()]
    if not bps <= MAX_RATE_BPS:             # also catches 1e400 (inf)
        raise UsageError(f"rate {text!r} is above 10 Tbit/s")
    if bps < 10_000:
        raise UsageError(f"rate {text!r} is below 10 kbit/s")
    return int(bps)


def validate_name(name: str) -> str:
    if not NAME_RE.match(name or ""):
        raise UsageError(f"bad lab name {name!r}: 1-10 characters, lowercase letters and digits, "
                         "starting with a letter")
    return name


def netns_name(lab: str, node: str) -> str:
    return f"{NETNS_PREFIX}{lab}-{node}"


def scratch_netns(lab: str) -> str:
    """Where every veth of a lab is born, so interface indices are unique lab-wide."""
    return f"{NETNS_PREFIX}{lab}-build"


class _Macs:
    """Deterministic locally administered MACs: 02:4d:52:<lab>:<node>:<port>."""

    def __init__(self, lab: str):
        self.lab = zlib.crc32(lab.encode()) & 0xFF

    def __call__(self, node_idx: int, port: int) -> str:
        return f"02:4d:52:{self.lab:02x}:{node_idx:02x}:{port:02x}"


def plan_lab(name: str = "lab", topology: str = "pair", hosts: int | None = None,
             mtu: int = 1500, rate: str | int | None = None,
             ecn_threshold: int | None = None, steer: bool = False,
             queues: int = 1) -> LabPlan:
    validate_name(name)
    if not 1 <= queues <= MAX_QUEUES:
        raise UsageError(f"--queues must be between 1 and {MAX_QUEUES}")
    if topology not in TOPOLOGIES:
        raise UsageError(f"unknown topology {topology!r}: choose one of {', '.join(TOPOLOGIES)}")
    default_hosts = {"pair": 2, "star": 3, "leaf-spine": 4}[topology]
    k = default_hosts if hosts is None else hosts
    if topology == "pair" and k != 2:
        raise UsageError("a pair lab has exactly 2 hosts (use --topology star for more)")
    if not 2 <= k <= MAX_HOSTS:
        raise UsageError(f"--hosts must be between 2 and {MAX_HOSTS}")
    if not MIN_MTU <= mtu <= MAX_MTU:
        raise UsageError(f"--mtu must be between {MIN_MTU} and {MAX_MTU}")
    rate_bps = parse_rate(rate)
    if ecn_threshold is not None:
        if not 0 < ecn_threshold <= 1 << 32:
            raise UsageError("--ecn-threshold must be a positive number of bytes, at most 4 GiB")
        if rate_bps is None:
            raise UsageError("--ecn-threshold needs --rate (marking follows the shaped rate)")
    elif rate_bps is not None:
        ecn_threshold = 64 * 1024
    builder = _flat if topology in ("pair", "star") else _leaf_spine
    nodes, links = builder(name, k, mtu, _Macs(name))
    return LabPlan(name=name, topology=topology, mtu=mtu, rate_bps=rate_bps,
                   ecn_threshold=ecn_threshold, nodes=nodes, links=links, steer=bool(steer),
                   queues=queues)


def _connect(nodes: dict[str, Node], links: list[Link], a: str, b: str, mtu: int, macs: _Macs,
             index: dict[str, int]) -> tuple[Iface, Iface]:
    """A veth between nodes a and b: a's end is named after b (hosts: eth0), b's after a."""
    na, nb = nodes[a], nodes[b]
    ia_name = "eth0" if na.role == "host" else b
    ib_name = a
    ia = Iface(ia_name, macs(index[a], len(na.ifaces) + 1), mtu, peer=(b, ib_name))
    ib = Iface(ib_name, macs(index[b], len(nb.ifaces) + 1), mtu, peer=(a, ia_name))
    na.ifaces.append(ia)
    nb.ifaces.append(ib)
    links.append(Link(f"{a}-{b}", (a, ia_name), (b, ib_name)))
    return ia, ib


def _mk_nodes(lab: str, spec: list[tuple[str, str]]) -> tuple[dict[str, Node], dict[str, int]]:
    nodes = {n: Node(n, role, netns_name(lab, n), forwarding=role != "host") for n, role in spec}
    index = {n: i + 1 for i, (n, _) in enumerate(spec)}
    return nodes, index


def _plain(addr: str) -> str:
    return addr.split("/")[0]


def _flat(lab: str, k: int, mtu: int, macs: _Macs):
    """pair / star: K hosts on one L2 switch (a Linux bridge), one IPv4 and one IPv6 subnet."""
    names = [f"h{i}" for i in range(1, k + 1)]
    nodes, index = _mk_nodes(lab, [(h, "host") for h in names] + [("sw1", "switch")])
    nodes["sw1"].forwarding = False       # a pure L2 switch: it bridges, it does not route
    links: list[Link] = []
    sw = nodes["sw1"]
    sw.bridges.append(Bridge("br0", macs(index["sw1"], 0xFE)))
    for i, h in enumerate(names, start=1):
        ia, ib = _connect(nodes, links, h, "sw1", mtu, macs, index)
        ia.ipv4 = f"10.0.0.{i}/24"
        ia.ipv6 = f"{V6}::{i:x}/64"
        ib.bridge = "br0"
    for h in names:
        me = nodes[h]
        for other in names:
            if other != h:
                oi = nodes[other].iface("eth0")
                me.neighbours.append(Neighbour("eth0", _plain(oi.ipv4), oi.mac))
                me.neighbours.append(Neighbour("eth0", _plain(oi.ipv6), oi.mac))
    return list(nodes.values()), links


def _leaf_spine(lab: str, k: int, mtu: int, macs: _Macs):
    """Hosts split over two leaf routers; two spines; leaves route to the other leaf's subnet
    over both spines (ECMP, hashed on UDP ports)."""
    hosts = [f"h{i}" for i in range(1, k + 1)]
    leaves, spines = ["leaf1", "leaf2"], ["spine1", "spine2"]
    spec = [(h, "host") for h in hosts] + [(l, "leaf") for l in leaves] + [(s, "spine") for s in spines]
    nodes, index = _mk_nodes(lab, spec)
    links: list[Link] = []
    half = (k + 1) // 2
    leaf_of = {h: 1 if i <= half else 2 for i, h in enumerate(hosts, start=1)}
    for L in (1, 2):
        leaf = nodes[f"leaf{L}"]
        leaf.bridges.append(Bridge("br0", macs(index[leaf.name], 0xFE),
                                   ipv4=f"10.1.{L}.254/24", ipv6=f"{V6}:1:{L}::fe/64"))
    for i, h in enumerate(hosts, start=1):
        L = leaf_of[h]
        ia, ib = _connect(nodes, links, h, f"leaf{L}", mtu, macs, index)
        ia.ipv4 = f"10.1.{L}.{i}/24"
        ia.ipv6 = f"{V6}:1:{L}::{i:x}/64"
        ib.bridge = "br0"
        gw = nodes[f"leaf{L}"].bridges[0]
        nodes[h].routes += [Route("default", [_plain(gw.ipv4)], 4), Route("default", [_plain(gw.ipv6)], 6)]
        nodes[h].neighbours += [Neighbour("eth0", _plain(gw.ipv4), gw.mac),
                                Neighbour("eth0", _plain(gw.ipv6), gw.mac)]
        nodes[f"leaf{L}"].neighbours += [Neighbour("br0", _plain(ia.ipv4), ia.mac),
                                         Neighbour("br0", _plain(ia.ipv6), ia.mac)]
    p2p = {}
    for L in (1, 2):
        for S in (1, 2):
            ia, ib = _connect(nodes, links, f"leaf{L}", f"spine{S}", mtu, macs, index)
            n = 16 * L + S
            ia.ipv4, ib.ipv4 = f"10.2.{n}.1/24", f"10.2.{n}.2/24"
            ia.ipv6, ib.ipv6 = f"{V6}:2:{n:x}::1/64", f"{V6}:2:{n:x}::2/64"
            nodes[f"leaf{L}"].neighbours += [Neighbour(ia.name, _plain(ib.ipv4), ib.mac),
                                             Neighbour(ia.name, _plain(ib.ipv6), ib.mac)]
            nodes[f"spine{S}"].neighbours += [Neighbour(ib.name, _plain(ia.ipv4), ia.mac),
                                              Neighbour(ib.name, _plain(ia.ipv6), ia.mac)]
            p2p[(L, S)] = (ia, ib)
    for L in (1, 2):
        M = 3 - L
        leaf = nodes[f"leaf{L}"]
        leaf.routes.append(Route(f"10.1.{M}.0/24", [_plain(p2p[(L, S)][1].ipv4) for S in (1, 2)], 4))
        leaf.routes.append(Route(f"{V6}:1:{M}::/64", [_plain(p2p[(L, S)][1].ipv6) for S in (1, 2)], 6))
    for S in (1, 2):
        spine = nodes[f"spine{S}"]
        for L in (1, 2):
            spine.routes.append(Route(f"10.1.{L}.0/24", [_plain(p2p[(L, S)][0].ipv4)], 4))
            spine.routes.append(Route(f"{V6}:1:{L}::/64", [_plain(p2p[(L, S)][0].ipv6)], 6))
    return list(nodes.values()), links
