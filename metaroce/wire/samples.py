"""One valid packet of every opcode the specification defines, for golden files and tests."""

from . import consts as C
from .consts import Opcode as O
from .headers import (AETH, BTH, CMETH, CNPPad, CREDITETH, IETH, PETH, RETH, SACKETH,
                      AtomicAckETH, AtomicETH, ImmDt, ack_syndrome)
from .layout import LAYOUTS
from .packet import UDP, IPv4, IPv6, RocePacket

V4 = ("192.0.2.1", "192.0.2.2")
V6 = ("2001:db8::1", "2001:db8::2")


def _header(cls, opcode: int, i: int):
    if cls is RETH:
        return RETH(va=0x00007F00_00001000 + 0x100 * i, rkey=0x1234_0000 | i, dma_len=4096)
    if cls is AETH:
        return AETH(syndrome=ack_syndrome(C.AETH_ACK_UNLIMITED), msn=0x000100 + i)
    if cls is ImmDt:
        return ImmDt(0xDEAD0000 | i)
    if cls is IETH:
        return IETH(0x5678_0000 | i)
    if cls is AtomicETH:
        return AtomicETH(va=0x00007F00_00002000 + 8 * i, rkey=0x4321_0000 | i, swap_add=i + 1,
                         compare=0x0102030405060708)
    if cls is AtomicAckETH:
        return AtomicAckETH(orig=0x1111_2222_3333_0000 | i)
    if cls is CNPPad:
        return CNPPad()
    if cls is PETH:
        return PETH(path_id=i % 4, ssn=0x10 + i, rsn=0x08 + i // 2, offset=1024 * (i % 3),
                    ts=0x01000000 + i)
    if cls is SACKETH:
        return SACKETH(path_id=1, flags=C.SACK_F_ECE | C.SACK_F_CREDIT_VALID,
                       credit_limit_psn=0x000400, ts_echo=0x01000005, ce_count=3,
                       bitmap=SACKETH.bitmap_for(0x100, [0x102, 0x103, 0x110]))
    if cls is CREDITETH:
        return CREDITETH(flags=C.CREDIT_F_ACTIVE, limit_psn=0x000200, rate_mbps=25000)
    if cls is CMETH:
        return CMETH(cm_type=C.CmType.CONNECT_REQ, txn_id=0xC0FFEE00 | i, qpn=0x000011,
                     start_psn=0x00ABCDEF, caps=C.CAPS_DEFINED, mtu=4, max_paths=8,
                     window_pkts=128, gid=bytes(10) + b"\xff\xff" + bytes([192, 0, 2, 1]))
    raise AssertionError(cls)


def sample_packet(opcode: int, ip_version: int = 4, i: int = 0) -> RocePacket:
    """A valid packet of ``opcode``; payloads have lengths that exercise every pad count."""
    lay = LAYOUTS[opcode]
    headers = tuple(_header(cls, opcode, i) for cls in lay.headers)
    payload = bytes((i + k) & 0xFF for k in range(16 + i % 4)) if lay.payload else b""
    ip = IPv4(*V4) if ip_version == 4 else IPv6(*V6, flow_label=0x12345)
    if opcode in _FEEDBACK:  # WIRE-8, WIRE-9: feedback is Not-ECT on the priority DSCP
        ip = IPv4(*V4, dscp=C.DSCP_CNP_DEFAULT, ecn=C.ECN_NOT_ECT) if ip_version == 4 else \
            IPv6(*V6, dscp=C.DSCP_CNP_DEFAULT, ecn=C.ECN_NOT_ECT)
    qp = C.GSI_QPN if opcode == O.MR_CM else 0x000100 + i
    bth = BTH(opcode=opcode, dest_qp=qp, psn=0 if opcode in (O.CNP, O.MR_CM) else 0x00FFF0 + i,
              ack_req=1 if opcode in _ACK_REQ else 0, becn=1 if opcode == O.CNP else 0,
              se=1 if opcode in _SOLICITED else 0)
    return RocePacket(ip=ip, bth=bth, headers=headers, payload=payload,
                      udp=UDP(sport=C.UDP_SPORT_MIN | (0x100 + i)))


_FEEDBACK = {O.CNP, O.MR_SACK, O.MR_CREDIT, O.MR_CM}
_ACK_REQ = {O.RC_SEND_LAST, O.RC_SEND_ONLY, O.RC_RDMA_WRITE_LAST, O.RC_RDMA_WRITE_ONLY,
            O.RC_RDMA_READ_REQUEST, O.RC_COMPARE_SWAP, O.RC_FETCH_ADD, O.MR_SEND_LAST,
            O.MR_SEND_ONLY, O.MR_RDMA_WRITE_LAST, O.MR_RDMA_WRITE_ONLY, O.MR_PROBE}
_SOLICITED = {O.RC_SEND_LAST_WITH_IMMEDIATE, O.RC_SEND_ONLY_WITH_IMMEDIATE}


def sample_packets(ip_versions=(4, 6)) -> list[RocePacket]:
    """Every defined opcode, in opcode order, for each IP version."""
    return [sample_packet(op, v, i) for v in ip_versions
            for i, op in enumerate(sorted(LAYOUTS))]
