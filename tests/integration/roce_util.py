"""RoCEv2 traffic for NIC tests: WRITE frames built with our codec, sent with AF_XDP."""

from metaroce.fastpath.xsk import XskSocket
from metaroce.lab import netdev
from metaroce.wire import consts as C
from metaroce.wire.headers import AETH, BTH, RETH
from metaroce.wire.packet import UDP, Ethernet, IPv4, RocePacket

PMTU = 1024              # RoCE path MTU that fits the lab's 1500-byte links


def write_frames(eth, ip, rkey, addr, data, qpn, psn0):
    frames, n = [], len(data) // PMTU
    for i in range(n):
        op = (C.Opcode.RC_RDMA_WRITE_FIRST if i == 0 else
              C.Opcode.RC_RDMA_WRITE_LAST if i == n - 1 else C.Opcode.RC_RDMA_WRITE_MIDDLE)
        bth = BTH(opcode=op, dest_qp=qpn, psn=(psn0 + i) & C.PSN_MASK, ack_req=int(i == n - 1))
        hdrs = (RETH(va=addr, rkey=rkey, dma_len=len(data)),) if i == 0 else ()
        frames.append(RocePacket(ip=ip, bth=bth, headers=hdrs, payload=data[i * PMTU:(i + 1) * PMTU],
                                 udp=UDP(sport=0xC123), eth=eth).to_bytes())
    return frames




def send_frames(netns_name: str, ifindex: int, frames: list[bytes]) -> None:
    with netdev.in_netns(netns_name):
        xs = XskSocket(ifindex)
    try:
        sent = 0
        while sent < len(frames):
            sent += xs.send(frames[sent:sent + 256])
        while xs.in_flight():
            pass
    finally:
        xs.close()


def parse_ack(payload: bytes) -> tuple[BTH, AETH]:
    """BTH and AETH of an ACK received on a UDP socket bound to 4791."""
    return BTH.parse(payload[:12]), AETH.parse(payload[12:16])


def lab_write(view, src: str, dst: str, rkey: int, addr: int, data: bytes, qpn: int, psn0: int):
    s, d = view.plan.node(src), view.plan.node(dst)
    a, b = s.iface("eth0"), d.iface("eth0")
    frames = write_frames(Ethernet(dst=b.mac, src=a.mac),
                          IPv4(src=a.ipv4.split("/")[0], dst=b.ipv4.split("/")[0]),
                          rkey, addr, data, qpn, psn0)
    send_frames(s.netns, view.ports[(src, "eth0")], frames)
    return len(frames)
