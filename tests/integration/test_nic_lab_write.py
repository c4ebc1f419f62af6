"""The kernel does the work: h1 sends a multi-packet RDMA WRITE over the lab's veth links
(AF_XDP); on h2 no user-space code runs in the data path — the XDP NIC verifies each packet's
ICRC, places it into the registered region and sends the ACK back (XDP_TX) to h1."""

import hashlib
import os

from metaroce.fastpath.xsk import XskSocket
from metaroce.lab import core, fabric, netdev
from metaroce.lab.traffic import udp_socket
from metaroce.nic.rx import ACCESS_REMOTE_WRITE, RxPath
from metaroce.wire import consts as C
from metaroce.wire.headers import AETH, BTH, RETH
from metaroce.wire.packet import UDP, Ethernet, IPv4, RocePacket

MSG = 4 << 20            # 4 MiB
PMTU = 1024              # RoCE path MTU that fits the lab's 1500-byte links
QPN, PEER_QPN, PD, PSN0 = 0x11, 0x22, 3, 0xFFFF00   # the PSN wraps mid-message


def write_frames(eth, ip, mr, data):
    frames, n = [], len(data) // PMTU
    for i in range(n):
        op = (C.Opcode.RC_RDMA_WRITE_FIRST if i == 0 else
              C.Opcode.RC_RDMA_WRITE_LAST if i == n - 1 else C.Opcode.RC_RDMA_WRITE_MIDDLE)
        bth = BTH(opcode=op, dest_qp=QPN, psn=(PSN0 + i) & C.PSN_MASK, ack_req=int(i == n - 1))
        hdrs = (RETH(va=mr.addr, rkey=mr.rkey, dma_len=len(data)),) if i == 0 else ()
        frames.append(RocePacket(ip=ip, bth=bth, headers=hdrs, payload=data[i * PMTU:(i + 1) * PMTU],
                                 udp=UDP(sport=0xC123), eth=eth).to_bytes())
    return frames


def test_write_is_placed_and_acked_by_the_kernel(lab_name):
    core.up(lab_name, "pair")
    view = core.LabView(lab_name)
    h1, h2 = view.plan.node("h1"), view.plan.node("h2")
    a, b = h1.iface("eth0"), h2.iface("eth0")
    nic = RxPath(max_qps=16, max_mrs=16)
    try:
        mr = nic.reg_mr(MSG, PD, ACCESS_REMOTE_WRITE)
        nic.set_qp(QPN, epsn=PSN0, pd=PD, dqpn=PEER_QPN)
        fabric.attach_xdp(h2.netns, "eth0", nic.prog_fd, view.plan.mtu)   # h2's NIC is XDP now
        acks = udp_socket(h1.netns, bind=("", C.ROCEV2_UDP_PORT))
        acks.settimeout(3.0)
        data = os.urandom(MSG)
        frames = write_frames(Ethernet(dst=b.mac, src=a.mac), IPv4(src="10.0.0.1", dst="10.0.0.2"),
                              mr, data)
        with netdev.in_netns(h1.netns):
            xs = XskSocket(view.ports[("h1", "eth0")])
        try:
            sent = 0
            while sent < len(frames):
                sent += xs.send(frames[sent:sent + 256])
            while xs.in_flight():
                pass
        finally:
            xs.close()
        payload, _ = acks.recvfrom(2048)     # BTH + AETH + ICRC of the ACK, through h1's stack
        bth, aeth = BTH.parse(payload[:12]), AETH.parse(payload[12:16])
        assert bth.opcode == C.Opcode.RC_ACKNOWLEDGE and bth.dest_qp == PEER_QPN
        assert bth.psn == (PSN0 + len(frames) - 1) & C.PSN_MASK and aeth.syndrome == 0x1F
        assert aeth.msn == 1
        assert hashlib.sha256(mr.buf).digest() == hashlib.sha256(data).digest()
        c = nic.counters()
        assert c["placed"] == len(frames) and c["tx_ack"] == 1, c
        assert c["bad_icrc"] == c["malformed"] == c["psn_out_of_order"] == 0, c
        assert nic.qp_state(QPN)["epsn"] == (PSN0 + len(frames)) & C.PSN_MASK
    finally:
        core.down(lab_name)
        nic.close()
