"""Provisioning a planned lab with pyroute2: namespaces, veth pairs, bridges, addresses,
routes, static neighbours and sysctls. Also the same calls a user would make on a real rack."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import socket
import struct

from pyroute2 import IPRoute, netns

from .plan import LabPlan, Node, scratch_netns

NUD_PERMANENT = 0x80
NUD_NOARP = 0x40           # a bridge fdb entry that is static (never ages, not local)
NTF_MASTER = 0x04
SIOCETHTOOL, ETHTOOL_GTXCSUM, ETHTOOL_STXCSUM = 0x8946, 0x16, 0x17
IFA_F_NODAD = 0x02
NETNS_DIR = "/var/run/netns"


def list_netns() -> list[str]:
    try:
        return sorted(os.listdir(NETNS_DIR))
    except FileNotFoundError:
        return []


@contextlib.contextmanager
def ipr_in(ns: str):
    ipr = IPRoute(netns=ns)
    try:
        yield ipr
    finally:
        ipr.close()


@contextlib.contextmanager
def in_netns(ns: str):
    """Run the calling thread inside a namespace (for sysctls, sockets, exec)."""
    netns.pushns(ns)
    try:
        yield
    finally:
        netns.popns()


def ifindex(ipr: IPRoute, name: str) -> int:
    found = ipr.link_lookup(ifname=name)
    if not found:
        raise LookupError(f"interface {name} not found")
    return found[0]


def create_namespaces(plan: LabPlan) -> None:
    for ns in [scratch_netns(plan.name)] + [n.netns for n in plan.nodes]:
        netns.create(ns)


def remove_namespace(ns: str) -> bool:
    try:
        netns.remove(ns)
        return True
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.EINVAL):
            return False
        raise


def build_links(plan: LabPlan) -> dict[tuple[str, str], int]:
    """Create every veth in the scratch namespace (one index counter: indices are unique across
    the lab), then move each end into its node under its final name. Moving keeps the index
    because no node namespace holds any other index but lo's. Returns (node, iface) -> ifindex."""
    indices: dict[tuple[str, str], int] = {}
    with ipr_in(scratch_netns(plan.name)) as scratch:
        for n, link in enumerate(plan.links):
            ta, tb = f"t{n}a", f"t{n}b"
            q = plan.queues          # veth hands an XDP redirect to queue (sending CPU % q)
            scratch.link("add", ifname=ta, kind="veth", num_rx_queues=q, num_tx_queues=q,
                         peer={"ifname": tb, "num_rx_queues": q, "num_tx_queues": q})
            for tmp, (node, iface) in ((ta, link.a), (tb, link.b)):
                idx = ifindex(scratch, tmp)
                scratch.link("set", index=idx, net_ns_fd=plan.node(node).netns, ifname=iface)
                indices[(node, iface)] = idx
    remove_namespace(scratch_netns(plan.name))
    for (node, iface), idx in indices.items():
        with ipr_in(plan.node(node).netns) as ipr:
            got = ifindex(ipr, iface)
            if got != idx:
                raise RuntimeError(f"{node}/{iface}: index changed on move ({idx} -> {got})")
    return indices


def _write_sysctl(path: str, value: str) -> bool:
    full = "/proc/sys/" + path.replace(".", "/")
    if not os.path.exists(full):
        return False
    with open(full, "w") as f:
        f.write(value)
    return True


def configure_sysctls(node: Node, hash_seed: int) -> None:
    with in_netns(node.netns):
        if node.forwarding:
            _write_sysctl("net.ipv4.ip_forward", "1")
            _write_sysctl("net.ipv6.conf.all.forwarding", "1")
            _write_sysctl("net.ipv4.fib_multipath_hash_policy", "1")   # L4: UDP ports are entropy
            _write_sysctl("net.ipv6.fib_multipath_hash_policy", "1")
            _write_sysctl("net.ipv4.fib_multipath_hash_seed", str(hash_seed))
        # addresses are static: no duplicate address detection, no router solicitations
        _write_sysctl("net.ipv6.conf.all.accept_dad", "0")
        _write_sysctl("net.ipv6.conf.default.accept_dad", "0")


def _add_addr(ipr: IPRoute, idx: int, cidr: str) -> None:
    addr, plen = cidr.split("/")
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    kw = {"flags": IFA_F_NODAD} if family == socket.AF_INET6 else {}
    ipr.addr("add", index=idx, address=addr, prefixlen=int(plen), family=family, **kw)


def _ethtool_value(ns: str, iface: str, cmd: int, data: int = 0) -> int:
    """A legacy ethtool get/set of one value (struct ethtool_value) on an interface of ns."""
    with in_netns(ns):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        val = ctypes.create_string_buffer(struct.pack("=II", cmd, data), 8)
        ifr = struct.pack("16sP", iface.encode(), ctypes.addressof(val)).ljust(40, b"\0")
        fcntl.ioctl(s.fileno(), SIOCETHTOOL, ifr)
        return struct.unpack("=II", val.raw)[1]
    finally:
        s.close()


def tx_checksum(ns: str, iface: str, on: bool | None = None) -> bool:
    """Whether the interface leaves transport checksums to "hardware" (set it when `on` is
    given). A host end of the lab computes them itself: a frame the fabric forwards in XDP
    travels as bytes, and a checksum the sender left partial would arrive unfinished."""
    if on is not None:
        _ethtool_value(ns, iface, ETHTOOL_STXCSUM, int(on))
    return bool(_ethtool_value(ns, iface, ETHTOOL_GTXCSUM))


def configure_node(node: Node, mtu: int, stations: list[tuple[str, str, str]] = ()) -> None:
    """Bring a node's interfaces, bridges, addresses, static bridge forwarding entries
    (`stations`: (node, port, MAC), only the node's own are used), neighbours and routes up."""
    node_stations = [st for st in stations if st[0] == node.name]
    with ipr_in(node.netns) as ipr:
        ipr.link("set", index=ifindex(ipr, "lo"), state="up")
        for br in node.bridges:
            ipr.link("add", ifname=br.name, kind="bridge", address=br.mac, br_stp_state=0,
                     br_forward_delay=0)
            bidx = ifindex(ipr, br.name)
            ipr.link("set", index=bidx, mtu=mtu)
        for itf in node.ifaces:
            idx = ifindex(ipr, itf.name)
            ipr.link("set", index=idx, address=itf.mac, mtu=itf.mtu)
            if itf.bridge:
                ipr.link("set", index=idx, master=ifindex(ipr, itf.bridge))
            if node.role == "host":
                tx_checksum(node.netns, itf.name, on=False)
        for _node, port, mac in node_stations:   # replace: the bridge may have learned it already
            ipr.fdb("replace", ifindex=ifindex(ipr, port), lladdr=mac, state=NUD_NOARP,
                    flags=NTF_MASTER)
        for dev in [*node.bridges, *node.ifaces]:     # bridges first: their ports join them
            idx = ifindex(ipr, dev.name)
            ipr.link("set", index=idx, state="up")
            for cidr in (dev.ipv4, dev.ipv6):
                if cidr:
                    _add_addr(ipr, idx, cidr)
        for nb in node.neighbours:
            ipr.neigh("add", dst=nb.ip, lladdr=nb.mac, ifindex=ifindex(ipr, nb.dev),
                      state=NUD_PERMANENT)
        for rt in node.routes:
            family = socket.AF_INET6 if rt.family == 6 else socket.AF_INET
            dst = rt.dst if rt.dst != "default" else ("::/0" if rt.family == 6 else "0.0.0.0/0")
            if len(rt.gateways) == 1:
                ipr.route("add", dst=dst, gateway=rt.gateways[0], family=family)
            else:
                ipr.route("add", dst=dst, family=family,
                          multipath=[{"gateway": g} for g in rt.gateways])
