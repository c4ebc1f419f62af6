"""The C requester path segments an RDMA WRITE into frames built in the UMEM and sends them
with AF_XDP; h2's XDP NIC verifies, places and ACKs them (IPv4 and IPv6)."""

import hashlib
import os
import socket

import pytest
from roce_util import parse_ack

from metaroce.fastpath.xsk import XskSocket
from metaroce.lab import core, fabric, netdev
from metaroce.lab.traffic import udp_socket
from metaroce.nic.rx import ACCESS_REMOTE_WRITE, RxPath
from metaroce.wire import consts as C

QPN, PEER_QPN, PD = 0x51, 0x52, 2


@pytest.mark.parametrize("v6", [False, True])
def test_c_write_path_end_to_end(lab_name, v6):
    core.up(lab_name, "pair")
    view = core.LabView(lab_name)
    h1, h2 = view.plan.node("h1"), view.plan.node("h2")
    a, b = h1.iface("eth0"), h2.iface("eth0")
    fam = socket.AF_INET6 if v6 else socket.AF_INET
    src, dst = ((a.ipv6, b.ipv6) if v6 else (a.ipv4, b.ipv4))
    src, dst = src.split("/")[0], dst.split("/")[0]
    nic = RxPath(max_qps=4, max_mrs=4)
    try:
        size = 8 << 20
        mr = nic.reg_mr(size, PD, ACCESS_REMOTE_WRITE)
        nic.set_qp(QPN, epsn=0xFFFFF0, pd=PD, dqpn=PEER_QPN)
        fabric.attach_xdp(h2.netns, "eth0", nic.prog_fd, view.plan.mtu)
        acks = udp_socket(h1.netns, fam, bind=("", C.ROCEV2_UDP_PORT), rcvbuf=8 << 20)
        acks.settimeout(3.0)
        data = os.urandom(size - 1000 - 5)        # not a multiple of the PMTU, odd pad
        with netdev.in_netns(h1.netns):
            xs = XskSocket(view.ports[("h1", "eth0")])
        try:
            flow = xs.flow(dmac=b.mac, smac=a.mac, src_ip=src, dst_ip=dst, dqpn=QPN, sport=0xC0DE)
            n = xs.send_write(flow, data, pmtu=1024, psn0=0xFFFFF0, va=mr.addr + 1000, rkey=mr.rkey)
            while xs.in_flight():
                pass
            tx = xs.stats()
        finally:
            xs.close()
        assert n == -(-len(data) // 1024)
        last = (0xFFFFF0 + n - 1) & C.PSN_MASK
        psns = []
        while not psns or psns[-1] != last:        # AckReq every 64 packets and on the last
            try:
                bth, aeth = parse_ack(acks.recvfrom(2048)[0])
            except socket.timeout:
                raise AssertionError(f"no ACK for the last PSN; got {psns}; NIC counters "
                                     f"{nic.counters()}, tx {tx}") from None
            assert aeth.syndrome == 0x1F
            psns.append(bth.psn)
        assert nic.counters()["tx_ack"] == -(-n // 64) and psns == sorted(psns, key=lambda p: (p - 0xFFFFF0) & C.PSN_MASK)
        got = bytes(mr.buf[1000:1000 + len(data)])
        assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest()
        c = nic.counters()
        assert c["placed"] == n and c["bad_icrc"] == 0 and c["malformed"] == 0, c
    finally:
        core.down(lab_name)
        nic.close()

