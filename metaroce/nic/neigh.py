"""Where a QP's packets go at layer 2: the kernel's route to the peer (its output device,
gateway and our source address) and the neighbour entry of the next hop, so that the data path
works across routed fabrics (the leaf-spine lab) as well as on one link. Runs in the daemon's
network namespace."""

from __future__ import annotations

import ipaddress
import socket
import time
from dataclasses import dataclass

from pyroute2 import IPRoute

from ..errors import MetaroceError

NUD_VALID = 0x02 | 0x04 | 0x08 | 0x10 | 0x40 | 0x80   # REACHABLE STALE DELAY PROBE NOARP PERMANENT


@dataclass(frozen=True)
class Path:
    dst_ip: str
    src_ip: str
    next_hop: str
    ifindex: int
    dmac: str
    smac: str


def _neigh_mac(ipr: IPRoute, ifindex: int, addr: str) -> str | None:
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    for n in ipr.get_neighbours(family=family, ifindex=ifindex):
        if n.get_attr("NDA_DST") == addr and n["state"] & NUD_VALID and n.get_attr("NDA_LLADDR"):
            return n.get_attr("NDA_LLADDR")
    return None


def _provoke_resolution(dst: str, src: str) -> None:
    """A datagram to the discard port makes the kernel resolve the next hop (ARP / ND)."""
    family = socket.AF_INET6 if ":" in dst else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.bind((src, 0))
            s.sendto(b"", (dst, 9))
        except OSError:
            pass


def resolve(dst_ip: str, ifindex: int, timeout_s: float = 1.0) -> Path:
    """The path to dst_ip out of ifindex: source address, next hop and both MACs."""
    try:
        ipaddress.ip_address(dst_ip)
    except ValueError:
        raise MetaroceError(f"not an IP address: {dst_ip!r}") from None
    with IPRoute() as ipr:
        routes = ipr.route("get", dst=dst_ip)
        if not routes:
            raise MetaroceError(f"no route to {dst_ip}")
        r = routes[0]
        oif = r.get_attr("RTA_OIF")
        if oif != ifindex:
            name = ipr.link("get", index=ifindex)[0].get_attr("IFLA_IFNAME")
            raise MetaroceError(f"the route to {dst_ip} does not leave through {name}")
        src = r.get_attr("RTA_PREFSRC")
        hop = r.get_attr("RTA_GATEWAY") or dst_ip
        if src is None:
            raise MetaroceError(f"no source address for {dst_ip}")
        smac = ipr.link("get", index=ifindex)[0].get_attr("IFLA_ADDRESS")
        deadline = time.monotonic() + timeout_s
        mac = _neigh_mac(ipr, ifindex, hop)
        while mac is None and time.monotonic() < deadline:
            _provoke_resolution(dst_ip, src)
            time.sleep(0.02)
            mac = _neigh_mac(ipr, ifindex, hop)
    if mac is None:
        raise MetaroceError(f"next hop {hop} for {dst_ip} does not answer ARP/ND")
    return Path(dst_ip, src, hop, ifindex, mac, smac)


def local_addresses(ifindex: int) -> list[str]:
    with IPRoute() as ipr:
        return [a.get_attr("IFA_ADDRESS") for a in ipr.get_addr(index=ifindex)
                if not str(a.get_attr("IFA_ADDRESS")).startswith("fe80")]


def local_mac(ifindex: int) -> str:
    with IPRoute() as ipr:
        return ipr.link("get", index=ifindex)[0].get_attr("IFLA_ADDRESS")
