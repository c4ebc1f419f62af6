"""Provisioning a planned lab with pyroute2: namespaces, veth pairs, bridges, addresses,
routes, static neighbours and sysctls. Also the same calls a user would make on a real rack."""

from __future__ import annotations

import contextlib
import errno
import os
import socket

from pyroute2 import IPRoute, netns

from .plan import LabPlan, Node, scratch_netns

NUD_PERMANENT = 0x80
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
            scratch.link("add", ifname=ta, kind="veth", peer=tb)
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


def configure_node(node: Node, mtu: int) -> None:
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
