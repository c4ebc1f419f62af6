"""Sockets inside a lab's namespaces, for probes, tests and benchmarks."""

from __future__ import annotations

import socket

from .netdev import in_netns


def udp_socket(netns_name: str, family: int = socket.AF_INET, bind: tuple | None = None,
               rcvbuf: int | None = None) -> socket.socket:
    """A UDP socket that lives in the namespace (sockets keep the namespace they were made in)."""
    with in_netns(netns_name):
        s = socket.socket(family, socket.SOCK_DGRAM)
        if rcvbuf:
            s.setsockopt(socket.SOL_SOCKET, 33, rcvbuf)  # SO_RCVBUFFORCE (root)
        if bind is not None:
            s.bind(bind)
    return s


def tcp_socket(netns_name: str, family: int = socket.AF_INET) -> socket.socket:
    with in_netns(netns_name):
        return socket.socket(family, socket.SOCK_STREAM)
