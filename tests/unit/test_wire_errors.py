"""Each malformed input maps to its own ParseError reason."""

import struct

import pytest

from metaroce.wire import (AETH, BTH, CMETH, PETH, RETH, SACKETH, IPv4, IPv6, ParseError,
                           Reason, RocePacket, parse_frame)
from metaroce.wire import consts as C
from metaroce.wire import icrc
from metaroce.wire.headers import AtomicETH, credit_code_for, credits_from_code
from metaroce.wire.samples import sample_packet

V4, V6 = 14, 14  # IP header offsets
UDP4, UDP6 = 34, 54


def reason(data):
    with pytest.raises(ParseError) as info:
        parse_frame(bytes(data))
    return info.value


def fix_icrc(buf: bytearray, ip_off=14):
    """Recompute the ICRC (and IPv4 checksum) after editing a frame, to isolate one fault."""
    if buf[ip_off] >> 4 == 4:
        buf[ip_off + 10:ip_off + 12] = b"\0\0"
        from metaroce.wire.packet import inet_checksum
        buf[ip_off + 10:ip_off + 12] = struct.pack("!H", inet_checksum(bytes(buf[ip_off:ip_off + 20])))
    buf[-4:] = icrc.encode(icrc.compute(bytes(buf[ip_off:-4])))
    return buf


def test_truncation_at_every_length():
    raw = sample_packet(C.Opcode.RC_RDMA_WRITE_FIRST, 4).to_bytes()
    for n in range(len(raw)):
        exc = reason(raw[:n])
        assert exc.reason in (Reason.TRUNCATED, Reason.BAD_IP_LENGTH), n


def test_not_ip_not_udp_not_roce():
    raw = bytearray(sample_packet(C.Opcode.RC_SEND_ONLY, 4).to_bytes())
    arp = raw[:12] + b"\x08\x06" + raw[14:]
    assert reason(arp).reason == Reason.NOT_IP
    tcp = bytearray(raw)
    tcp[V4 + 9] = 6
    assert reason(fix_icrc(tcp)).reason == Reason.NOT_UDP
    other = bytearray(raw)
    other[UDP4 + 2:UDP4 + 4] = struct.pack("!H", 4792)
    exc = reason(other)
    assert exc.reason == Reason.NOT_ROCE and exc.icrc_ok is None and exc.bth is None


def test_bad_ip_fields():
    raw = bytearray(sample_packet(C.Opcode.RC_SEND_ONLY, 4).to_bytes())
    b = bytearray(raw); b[V4] = 0x65
    assert reason(b).reason == Reason.BAD_IP_VERSION
    b = bytearray(raw); b[V4] = 0x44
    assert reason(b).reason == Reason.BAD_IP_HEADER_LENGTH
    b = bytearray(raw); b[V4 + 8] ^= 1
    assert reason(b).reason == Reason.BAD_IP_CHECKSUM
    b = bytearray(raw); b[V4 + 6] |= 0x20  # MF
    assert reason(fix_icrc(b)).reason == Reason.IP_FRAGMENT
    b = bytearray(raw); b[V4 + 2:V4 + 4] = struct.pack("!H", 10)
    assert reason(fix_icrc(b)).reason == Reason.BAD_IP_LENGTH
    b = bytearray(raw); b[UDP4 + 4:UDP4 + 6] = struct.pack("!H", 9)
    assert reason(b).reason == Reason.BAD_UDP_LENGTH
    six = bytearray(sample_packet(C.Opcode.RC_SEND_ONLY, 6).to_bytes())
    b = bytearray(six); b[V6] = 0x40 | b[V6] & 0xF
    assert reason(b).reason == Reason.BAD_IP_VERSION
    b = bytearray(six); b[V6 + 4:V6 + 6] = b"\0\0"
    assert reason(b).reason == Reason.BAD_IP_LENGTH
    b = bytearray(six); b[V6 + 6] = 0
    assert reason(b).reason == Reason.NOT_UDP


@pytest.mark.parametrize("version", [4, 6])
def test_bad_icrc_keeps_the_parsed_packet(version):
    pkt = sample_packet(C.Opcode.RC_RDMA_WRITE_ONLY, version)
    raw = bytearray(pkt.to_bytes())
    raw[-1] ^= 0x80
    exc = reason(raw)
    assert exc.reason == Reason.BAD_ICRC and exc.icrc_ok is False and exc.packet == pkt
    assert parse_frame(bytes(raw), verify_icrc=False) == pkt


@pytest.mark.parametrize("version", [4, 6])
def test_masked_fields_do_not_change_the_icrc(version):
    raw = bytearray(sample_packet(C.Opcode.RC_SEND_ONLY, version).to_bytes())
    udp = UDP4 if version == 4 else UDP6
    if version == 4:
        raw[V4 + 1] ^= 0x03  # ECN -> CE
        raw[V4 + 8] -= 1  # TTL
        fix_ip_only = bytearray(raw)
        from metaroce.wire.packet import inet_checksum
        fix_ip_only[V4 + 10:V4 + 12] = b"\0\0"
        fix_ip_only[V4 + 10:V4 + 12] = struct.pack("!H", inet_checksum(bytes(fix_ip_only[V4:V4 + 20])))
        raw = fix_ip_only
    else:
        raw[V6 + 1] ^= 0x30  # ECN bits of the traffic class
        raw[V6 + 3] ^= 0xFF  # flow label
        raw[V6 + 7] -= 1  # hop limit
    raw[udp + 6:udp + 8] = b"\x12\x34"  # UDP checksum
    raw[udp + 8 + 4] |= 0xC0  # FECN + BECN
    pkt = parse_frame(bytes(raw))
    assert pkt.bth.fecn == pkt.bth.becn == 1
    raw[udp + 8 + 8] ^= 0x01  # Resv7 is NOT masked
    assert reason(raw).reason == Reason.BAD_ICRC


def test_bth_and_opcode_reasons():
    raw = bytearray(sample_packet(C.Opcode.RC_SEND_ONLY, 4).to_bytes())
    bth = UDP4 + 8
    b = bytearray(raw); b[bth + 1] |= 0x01
    exc = reason(fix_icrc(b))
    assert exc.reason == Reason.BAD_TVER and exc.bth.tver == 1
    for op, why in [(0x15, Reason.UNKNOWN_OPCODE), (0x18, Reason.UNKNOWN_OPCODE),
                    (0x1C, Reason.UNSUPPORTED_TRANSPORT), (0x24, Reason.UNSUPPORTED_TRANSPORT),
                    (0x64, Reason.UNSUPPORTED_TRANSPORT), (0x80, Reason.UNKNOWN_OPCODE),
                    (0xBF, Reason.UNSUPPORTED_TRANSPORT), (0xF0, Reason.UNKNOWN_OPCODE)]:
        b = bytearray(raw); b[bth] = op
        exc = reason(fix_icrc(b))
        assert exc.reason == why and exc.icrc_ok is True and exc.bth.opcode == op, hex(op)


def test_length_and_pad_reasons():
    ack = sample_packet(C.Opcode.RC_ACKNOWLEDGE, 4)
    raw = bytearray(ack.to_bytes())
    bth = UDP4 + 8
    b = bytearray(raw); b[bth + 1] |= 0x10
    assert reason(fix_icrc(b)).reason == Reason.BAD_PAD_COUNT
    longer = RocePacket(ip=ack.ip, bth=ack.bth, headers=ack.headers).to_bytes()
    b = bytearray(longer[:-4] + bytes(4) + longer[-4:])
    b[V4 + 2:V4 + 4] = struct.pack("!H", len(b) - 14)
    b[UDP4 + 4:UDP4 + 6] = struct.pack("!H", len(b) - 34)
    assert reason(fix_icrc(b)).reason == Reason.BAD_LENGTH
    send = bytearray(sample_packet(C.Opcode.RC_SEND_ONLY, 4, 0).to_bytes())  # 16 B payload
    b = bytearray(send[:-5] + send[-4:])
    b[V4 + 2:V4 + 4] = struct.pack("!H", len(b) - 14)
    b[UDP4 + 4:UDP4 + 6] = struct.pack("!H", len(b) - 34)
    assert reason(fix_icrc(b)).reason == Reason.BAD_LENGTH  # not 4-byte aligned
    tiny = RocePacket(ip=IPv4("1.1.1.1", "2.2.2.2"), bth=BTH(opcode=0x04, dest_qp=1, psn=1),
                      payload=b"").to_bytes()
    b = bytearray(tiny); b[bth + 1] |= 0x30
    assert reason(fix_icrc(b)).reason == Reason.BAD_PAD_COUNT
    write = bytearray(sample_packet(C.Opcode.RC_RDMA_WRITE_FIRST, 4).to_bytes())
    short_reth = _relen(write[:bth + 12 + 8] + write[-4:])  # RETH cut to 8 of 16 bytes
    assert reason(fix_icrc(short_reth)).reason == Reason.TRUNCATED


def _relen(b):
    b = bytearray(b)
    b[V4 + 2:V4 + 4] = struct.pack("!H", len(b) - 14)
    b[UDP4 + 4:UDP4 + 6] = struct.pack("!H", len(b) - 34)
    return b


def test_syndrome_and_extension_field_reasons():
    raw = bytearray(sample_packet(C.Opcode.RC_ACKNOWLEDGE, 4).to_bytes())
    aeth = UDP4 + 8 + 12
    for syn in (0x80, 0x40, 0x5F, 0x65, 0x7F):
        b = bytearray(raw); b[aeth] = syn
        assert reason(fix_icrc(b)).reason == Reason.BAD_SYNDROME, hex(syn)
    peth = bytearray(sample_packet(C.Opcode.MR_SEND_ONLY, 4).to_bytes())
    b = bytearray(peth); b[aeth + 1] = 0x01
    assert reason(fix_icrc(b)).reason == Reason.BAD_FIELD
    cm = bytearray(sample_packet(C.Opcode.MR_CM, 4).to_bytes())
    b = bytearray(cm); b[aeth] = 99
    assert reason(fix_icrc(b)).reason == Reason.BAD_FIELD


def test_vlan_tagged_frames():
    pkt = sample_packet(C.Opcode.RC_SEND_ONLY, 6)
    from dataclasses import replace
    from metaroce.wire import Ethernet
    tagged = replace(pkt, eth=Ethernet(vlan_tci=0x6064))
    raw = tagged.to_bytes()
    assert raw[12:16] == b"\x81\x00\x60\x64"
    assert parse_frame(raw) == tagged


def test_aeth_helpers_follow_ibta_tables():
    assert [credits_from_code(c) for c in (0, 5, 10, 20, 30)] == [0, 6, 32, 1024, 32768]
    assert credits_from_code(31) is None
    assert credit_code_for(100) == 13 and credit_code_for(0) == 0
    assert C.RNR_TIMER_USEC[0] == 655360 and C.RNR_TIMER_USEC[14] == 1280
    assert AETH(0x31, 5).kind == C.AethType.RNR_NAK and AETH(0x31, 5).value == 0x11
    with pytest.raises(ValueError):
        AETH(0x41, 0)


def test_sack_bitmap_helpers():
    cum = 0xFFFFFE
    got = [0x000001, 0x000003, (cum + 129) & C.PSN_MASK, 0x000200]
    sack = SACKETH(bitmap=SACKETH.bitmap_for(cum, got))
    assert sack.sacked(cum) == got[:3]
    # bit 0 (the MSB) is PSN cum + 2 = 0x000000, not received; bit 1 is PSN 0x000001
    assert sack.bitmap >> 127 & 1 == 0 and sack.bitmap >> 126 & 1 == 1


def test_build_rejects_inconsistent_packets():
    ip = IPv4("1.1.1.1", "2.2.2.2")
    with pytest.raises(ValueError):
        RocePacket(ip=ip, bth=BTH(opcode=0x0A, dest_qp=1, psn=1))  # RETH missing
    with pytest.raises(ValueError):
        RocePacket(ip=ip, bth=BTH(opcode=0x11, dest_qp=1, psn=1), headers=(AETH(0, 0),),
                   payload=b"x")
    with pytest.raises(ValueError):
        BTH(opcode=256, dest_qp=0, psn=0)
    with pytest.raises(ValueError):
        PETH(path_id=0, ssn=1 << 24, offset=0)
    assert CMETH.parse(CMETH(cm_type=1, txn_id=1, qpn=2, start_psn=3).pack()).qpn == 2
    assert RETH.parse(RETH(1, 2, 3).pack()) == RETH(1, 2, 3)
    assert AtomicETH.parse(bytes(28)) == AtomicETH(0, 0, 0, 0)
    assert IPv6("::1", "::2").version == 6
