"""The AF_XDP transmit helper (cffi): batches of frames leave h1 through a real AF_XDP socket
(copy mode on veth) and arrive intact at h2's UDP socket, in order."""

import socket

from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from metaroce.fastpath.xsk import XskSocket
from metaroce.lab import core, netdev
from metaroce.lab.traffic import udp_socket

N = 5000


def test_af_xdp_batches_reach_the_peer(lab_name):
    core.up(lab_name, "pair")
    view = core.LabView(lab_name)
    h1, h2 = view.plan.node("h1"), view.plan.node("h2")
    a, b = h1.iface("eth0"), h2.iface("eth0")
    rx = udp_socket(h2.netns, bind=("", 4791), rcvbuf=64 << 20)
    rx.settimeout(1.0)
    frames = [bytes(Ether(src=a.mac, dst=b.mac) / IP(src="10.0.0.1", dst="10.0.0.2") /
                    UDP(sport=50000, dport=4791) / (i.to_bytes(4, "big") + bytes(1000)))
              for i in range(N)]
    with netdev.in_netns(h1.netns):
        xs = XskSocket(view.ports[("h1", "eth0")])
    try:
        sent = 0
        while sent < N:
            sent += xs.send(frames[sent:sent + 256])
        while xs.in_flight():
            pass
        st = xs.stats()
    finally:
        xs.close()
    assert st["tx_queued"] == st["tx_completed"] == N
    assert st["kicks"] < N / 10, "must be batched: one kick per batch, not per frame"
    seqs = []
    try:
        while len(seqs) < N:
            data = rx.recv(2048)
            assert len(data) == 1004
            seqs.append(int.from_bytes(data[:4], "big"))
    except socket.timeout:
        pass
    assert seqs == list(range(N))


def test_bad_device_is_a_clear_error():
    import pytest
    from metaroce.errors import MetaroceError
    with pytest.raises(MetaroceError, match="AF_XDP socket on ifindex 999999"):
        XskSocket(999999)
