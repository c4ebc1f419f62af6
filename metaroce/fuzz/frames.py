"""Fast frame assembly and surgery for the fuzzer: Ethernet / IPv4|IPv6 / UDP 4791 / BTH /
extension headers / payload / pad / ICRC, built and patched as bytearrays (the codec builds the
reference templates; tests check that `assemble` agrees with `RocePacket.to_bytes`)."""

from __future__ import annotations

import struct
import zlib

from ..wire import consts as C
from ..wire import icrc as _icrc
from ..wire.layout import LAYOUTS
from ..wire.packet import frame_pseudo_header

ETH_SRC, ETH_DST = bytes.fromhex("020000000001"), bytes.fromhex("020000000002")
V4_SRC, V4_DST = bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2])
V6_SRC = bytes.fromhex("fd000000000000000000000000000001")
V6_DST = bytes.fromhex("fd000000000000000000000000000002")
ETH_LEN, IP4_LEN, IP6_LEN, UDP_LEN, BTH_LEN, ICRC_LEN = 14, 20, 40, 8, 12, 4
BTH_OFF4, BTH_OFF6 = ETH_LEN + IP4_LEN + UDP_LEN, ETH_LEN + IP6_LEN + UDP_LEN
_PREFIX = zlib.crc32(b"\xff" * 8)
_BTH = struct.Struct("!BBHII")


def header_offsets(opcode: int) -> dict[str, int]:
    """Offset (from the end of the BTH) of each extension header of `opcode`, by header NAME."""
    lay = LAYOUTS.get(opcode)
    out, off = {}, 0
    for cls in (lay.headers if lay else ()):
        out.setdefault(cls.__name__, off)
        off += cls.SIZE
    out["_end"] = off
    return out


def inet_checksum(h) -> int:
    if len(h) % 2:
        h = bytes(h) + b"\0"
    total = sum(struct.unpack(f"!{len(h) // 2}H", h))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def assemble(v6: bool, opcode: int, qpn: int, psn: int, hdrs: bytes, payload: bytes, *,
             ackreq: int = 0, se: int = 0, pad: int | None = None, pkey: int = C.DEFAULT_PKEY,
             sport: int = 0xC000, ecn: int = C.ECN_ECT0, dscp: int = C.DSCP_DATA_DEFAULT,
             icrc: bool = True) -> bytearray:
    """One frame; pad defaults to what the payload needs; the ICRC is computed unless told."""
    if pad is None:
        pad = -len(payload) % 4
    body = (_BTH.pack(opcode, se << 7 | (pad & 3) << 4, pkey, qpn & 0xFFFFFF,
                      (ackreq & 1) << 31 | (psn & C.PSN_MASK)) + hdrs + payload + bytes(pad))
    ulen = UDP_LEN + len(body) + ICRC_LEN
    udp = struct.pack("!HHHH", sport, C.ROCEV2_UDP_PORT, ulen & 0xFFFF, 0)
    tos = dscp << 2 | ecn
    if v6:
        ip = struct.pack("!IHBB16s16s", 6 << 28 | tos << 20, ulen & 0xFFFF, C.IPPROTO_UDP, 64,
                         V6_SRC, V6_DST)
        eth = ETH_DST + ETH_SRC + b"\x86\xdd"
    else:
        ip = bytearray(struct.pack("!BBHHHBBH4s4s", 0x45, tos, (IP4_LEN + ulen) & 0xFFFF, 0,
                                   0x4000, 64, C.IPPROTO_UDP, 0, V4_SRC, V4_DST))
        ip[10:12] = inet_checksum(ip).to_bytes(2, "big")
        eth = ETH_DST + ETH_SRC + b"\x08\x00"
    frame = bytearray(eth + ip + udp + body + b"\0\0\0\0")
    if icrc:
        fix_icrc(frame)
    elif v6:
        fix_udp(frame)
    return frame


def fix_udp(frame: bytearray) -> bool:
    """The UDP checksum over what the UDP length field covers (IPv4 or IPv6): what a QP that
    negotiated CSUM checks (INT-3; QPs with the ICRC ignore it, WIRE-15). False if the frame
    has no such place."""
    b = l4_bounds(frame)
    if b is None:
        return False
    _ver, bth, end = b
    udp = bth - UDP_LEN
    seg = bytearray(frame[udp:end])
    seg[6:8] = b"\0\0"
    c = inet_checksum(frame_pseudo_header(frame, len(seg)) + bytes(seg)) or 0xFFFF
    frame[udp + 6:udp + 8] = c.to_bytes(2, "big")
    return True


def l4_bounds(frame) -> tuple[int, int, int] | None:
    """(IP version, offset of the BTH, offset just past the ICRC) as a receiver that trusts the
    UDP length field sees them; None when the frame is not an IP/UDP frame it could parse."""
    if len(frame) < ETH_LEN + IP4_LEN + UDP_LEN:
        return None
    et = frame[12] << 8 | frame[13]
    if et == 0x0800:
        ver, ihl = 4, (frame[14] & 0x0F) * 4
        if ihl < IP4_LEN:
            return None
        udp = ETH_LEN + ihl
    elif et == 0x86DD:
        ver, udp = 6, ETH_LEN + IP6_LEN
    else:
        return None
    if len(frame) < udp + UDP_LEN:
        return None
    ulen = frame[udp + 4] << 8 | frame[udp + 5]
    end = udp + ulen
    if ulen < UDP_LEN + BTH_LEN + ICRC_LEN or end > len(frame):
        return None
    return ver, udp + UDP_LEN, end


def payload_len(frame) -> int | None:
    """The payload bytes of a RoCE frame as its UDP length, opcode and pad count say (what a
    receiver places); None when l4_bounds cannot parse it or its headers do not fit."""
    b = l4_bounds(frame)
    if b is None:
        return None
    _v, bth, end = b
    n = end - ICRC_LEN - (bth + BTH_LEN + header_offsets(frame[bth])["_end"]) - \
        ((frame[bth + 1] >> 4) & 3)
    return n if n >= 0 else None


def fix_icrc(frame: bytearray) -> bool:
    """Recompute the ICRC where a receiver looks for it (the UDP length field says where the
    transport ends), the IPv4 header checksum and then the UDP checksum (so the frame passes a
    CSUM QP's check too, INT-3). False if the frame has no such place."""
    b = l4_bounds(frame)
    if b is None:
        return False
    ver, _bth, end = b
    if ver == 4:
        ihl = (frame[14] & 0x0F) * 4
        frame[24:26] = b"\0\0"
        frame[24:26] = inet_checksum(frame[14:14 + ihl]).to_bytes(2, "big")
    l3 = bytes(frame[ETH_LEN:end - ICRC_LEN])
    try:
        crc = _icrc.compute(l3)
    except (ValueError, IndexError):
        return False
    frame[end - ICRC_LEN:end] = crc.to_bytes(4, "little")
    fix_udp(frame)
    return True


def icrc_valid(frame) -> bool:
    """True if the frame's ICRC (where its UDP length puts it) is right."""
    b = l4_bounds(frame)
    if b is None:
        return False
    _ver, _bth, end = b
    try:
        crc = _icrc.compute(bytes(frame[ETH_LEN:end - ICRC_LEN]))
    except (ValueError, IndexError):
        return False
    return frame[end - ICRC_LEN:end] == crc.to_bytes(4, "little")


def set_udp_len(frame: bytearray, ulen: int) -> None:
    """Write a UDP length (and the matching IP length) into a frame, truthful or not."""
    if len(frame) < ETH_LEN + 1:
        return
    ver = 6 if frame[12:14] == b"\x86\xdd" else 4
    udp = ETH_LEN + (IP6_LEN if ver == 6 else (frame[14] & 0x0F) * 4)
    if len(frame) < udp + 6:
        return
    frame[udp + 4:udp + 6] = (ulen & 0xFFFF).to_bytes(2, "big")
    if ver == 6:
        frame[18:20] = (ulen & 0xFFFF).to_bytes(2, "big")
    else:
        frame[16:18] = ((udp - ETH_LEN + ulen) & 0xFFFF).to_bytes(2, "big")


def bth_fields(frame) -> tuple[int, int, int, int] | None:
    """(BTH offset, opcode, dest QP, PSN) of a frame a receiver would parse as RoCE, else None."""
    b = l4_bounds(frame)
    if b is None:
        return None
    off = b[1]
    return off, frame[off], int.from_bytes(frame[off + 5:off + 8], "big"), \
        int.from_bytes(frame[off + 9:off + 12], "big")
