"""Whole RoCEv2 / MetaRoCE frames: Ethernet (optional 802.1Q) / IPv4 or IPv6 / UDP / BTH /
extension headers / payload / pad / ICRC. ``RocePacket.to_bytes()`` builds, ``parse_frame``
parses; parsing raises only ParseError and never reads past the given bytes."""

import ipaddress
import struct
from dataclasses import dataclass, field, replace

from . import consts as C
from . import icrc as _icrc
from .errors import ParseError, Reason, need
from .headers import BTH, Header
from .layout import layout_for


def _mac(value: str) -> bytes:
    raw = bytes.fromhex(value.replace(":", "").replace("-", ""))
    if len(raw) != 6:
        raise ValueError(f"bad MAC address {value!r}")
    return raw


def _mac_str(raw: bytes) -> str:
    return ":".join(f"{b:02x}" for b in raw)


@dataclass(frozen=True)
class Ethernet:
    dst: str = "02:00:00:00:00:02"
    src: str = "02:00:00:00:00:01"
    vlan_tci: int | None = None  # 802.1Q TCI (PCP, DEI, VID) when tagged

    def __post_init__(self):
        object.__setattr__(self, "dst", _mac_str(_mac(self.dst)))
        object.__setattr__(self, "src", _mac_str(_mac(self.src)))
        if self.vlan_tci is not None and not 0 <= self.vlan_tci <= 0xFFFF:
            raise ValueError("VLAN TCI is 16 bits")

    def pack(self, ethertype: int) -> bytes:
        head = _mac(self.dst) + _mac(self.src)
        if self.vlan_tci is not None:
            head += struct.pack("!HH", C.ETH_P_8021Q, self.vlan_tci)
        return head + struct.pack("!H", ethertype)


def _check_tos(obj):
    if not 0 <= obj.dscp < 64 or not 0 <= obj.ecn < 4:
        raise ValueError("DSCP is 6 bits, ECN 2 bits")


@dataclass(frozen=True)
class IPv4:
    src: str
    dst: str
    dscp: int = C.DSCP_DATA_DEFAULT
    ecn: int = C.ECN_ECT0
    ttl: int = 64
    ident: int = 0
    df: int = 1
    options: bytes = b""

    version = 4

    def __post_init__(self):
        object.__setattr__(self, "src", str(ipaddress.IPv4Address(self.src)))
        object.__setattr__(self, "dst", str(ipaddress.IPv4Address(self.dst)))
        _check_tos(self)
        if not (0 <= self.ttl < 256 and 0 <= self.ident < 65536 and self.df in (0, 1)):
            raise ValueError("bad IPv4 ttl/ident/df")
        if len(self.options) % 4 or len(self.options) > 40:
            raise ValueError("IPv4 options are a multiple of 4 bytes, at most 40")

    def pack(self, payload_len: int) -> bytes:
        hlen = C.IPV4_MIN_LEN + len(self.options)
        h = struct.pack("!BBHHHBBH4s4s", 0x40 | hlen // 4, self.dscp << 2 | self.ecn,
                        hlen + payload_len, self.ident, self.df << 14, self.ttl, C.IPPROTO_UDP,
                        0, ipaddress.IPv4Address(self.src).packed,
                        ipaddress.IPv4Address(self.dst).packed) + self.options
        return h[:10] + struct.pack("!H", inet_checksum(h)) + h[12:]


@dataclass(frozen=True)
class IPv6:
    src: str
    dst: str
    dscp: int = C.DSCP_DATA_DEFAULT
    ecn: int = C.ECN_ECT0
    flow_label: int = 0
    hop_limit: int = 64

    version = 6

    def __post_init__(self):
        object.__setattr__(self, "src", str(ipaddress.IPv6Address(self.src)))
        object.__setattr__(self, "dst", str(ipaddress.IPv6Address(self.dst)))
        _check_tos(self)
        if not (0 <= self.flow_label < 1 << 20 and 0 <= self.hop_limit < 256):
            raise ValueError("bad IPv6 flow label/hop limit")

    def pack(self, payload_len: int) -> bytes:
        tc = self.dscp << 2 | self.ecn
        return struct.pack("!IHBB16s16s", 6 << 28 | tc << 20 | self.flow_label, payload_len,
                           C.IPPROTO_UDP, self.hop_limit, ipaddress.IPv6Address(self.src).packed,
                           ipaddress.IPv6Address(self.dst).packed)


def inet_checksum(data: bytes) -> int:
    """RFC 1071 one's-complement checksum."""
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def _pseudo_header(ip: IPv4 | IPv6, udp_len: int) -> bytes:
    if isinstance(ip, IPv6):
        return (ipaddress.IPv6Address(ip.src).packed + ipaddress.IPv6Address(ip.dst).packed
                + struct.pack("!IxxxB", udp_len, C.IPPROTO_UDP))
    return (ipaddress.IPv4Address(ip.src).packed + ipaddress.IPv4Address(ip.dst).packed
            + struct.pack("!xBH", C.IPPROTO_UDP, udp_len))


def udp_checksum(ip: IPv4 | IPv6, segment: bytes) -> int:
    """The UDP checksum of a datagram (its checksum field zero) over the pseudo-header of
    either IP version; a computed 0 is sent as 0xFFFF (RFC 768)."""
    return inet_checksum(_pseudo_header(ip, len(segment)) + segment) or 0xFFFF


def frame_pseudo_header(frame, ulen: int) -> bytes:
    """The UDP pseudo-header of an untagged Ethernet frame's datagram of ulen bytes, from the
    addresses in its IP header (IPv4 or IPv6, by the EtherType)."""
    off = C.ETH_LEN
    if struct.unpack_from("!H", frame, 12)[0] == C.ETH_P_IPV6:
        return bytes(frame[off + 8:off + 40]) + struct.pack("!IxxxB", ulen, C.IPPROTO_UDP)
    return bytes(frame[off + 12:off + 20]) + struct.pack("!xBH", C.IPPROTO_UDP, ulen)


def udp_checksum_ok(frame: bytes) -> bool | None:
    """INT-3 on a whole untagged frame: True when the IPv4 header checksum (IPv4) and the UDP
    checksum hold, False when either fails or the UDP checksum is absent (zero), None when the
    frame is not UDP over IP."""
    et = struct.unpack_from("!H", frame, 12)[0]
    off = C.ETH_LEN
    if et == C.ETH_P_IPV4:
        ihl = (frame[off] & 0xF) * 4
        if frame[off + 9] != C.IPPROTO_UDP:
            return None
        if inet_checksum(frame[off:off + ihl]) != 0:
            return False
        udp_off = off + ihl
    elif et == C.ETH_P_IPV6:
        if frame[off + 6] != C.IPPROTO_UDP:
            return None
        if frame[off] >> 4 != 6 or struct.unpack_from("!H", frame, off + 4)[0] != \
                struct.unpack_from("!H", frame, off + 44)[0]:
            return False
        udp_off = off + 40
    else:
        return None
    ulen = struct.unpack_from("!H", frame, udp_off + 4)[0]
    seg = frame[udp_off:udp_off + ulen]
    if len(seg) != ulen or struct.unpack_from("!H", seg, 6)[0] == 0:
        return False
    return inet_checksum(frame_pseudo_header(frame, ulen) + seg) == 0


@dataclass(frozen=True)
class UDP:
    sport: int = C.UDP_SPORT_MIN
    dport: int = C.ROCEV2_UDP_PORT

    def __post_init__(self):
        if not (0 <= self.sport < 65536 and 0 <= self.dport < 65536):
            raise ValueError("UDP ports are 16 bits")


@dataclass(frozen=True)
class RocePacket:
    """One RoCEv2/MetaRoCE frame. ``bth.pad_count`` is derived from the payload length;
    ``icrc`` is computed when building and set (not compared) when parsing. The UDP checksum
    is filled over IPv6 always and over IPv4 when ``udp_checksum`` is set (a MetaRoCE
    connection that negotiated CSUM, INT-2); zero otherwise (WIRE-7)."""

    ip: IPv4 | IPv6
    bth: BTH
    headers: tuple = ()
    payload: bytes = b""
    udp: UDP = UDP()
    eth: Ethernet = Ethernet()
    icrc: int | None = field(default=None, compare=False)
    udp_checksum: bool = field(default=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "headers", tuple(self.headers))
        object.__setattr__(self, "payload", bytes(self.payload))
        lay = layout_for(self.bth.opcode)
        got = tuple(type(h) for h in self.headers)
        if got != lay.headers:
            names = [h.__name__ for h in lay.headers]
            raise ValueError(f"opcode 0x{self.bth.opcode:02x} needs headers {names}, got "
                             f"{[h.__name__ for h in got]}")
        if self.payload and not lay.payload:
            raise ValueError(f"opcode 0x{self.bth.opcode:02x} carries no payload")
        pad = -len(self.payload) % 4
        if self.bth.pad_count != pad:
            object.__setattr__(self, "bth", replace(self.bth, pad_count=pad))

    def get(self, cls: type[Header]):
        """The first extension header of type ``cls``, or None."""
        return next((h for h in self.headers if isinstance(h, cls)), None)

    @property
    def opcode_name(self) -> str:
        return C.OPCODE_NAMES[self.bth.opcode]

    def transport_bytes(self) -> bytes:
        """BTH + extension headers + payload + pad (everything between UDP and ICRC)."""
        return (self.bth.pack() + b"".join(h.pack() for h in self.headers) + self.payload
                + bytes(self.bth.pad_count))

    def to_bytes(self) -> bytes:
        body = self.transport_bytes()
        udp_len = C.UDP_LEN + len(body) + C.ICRC_LEN
        iph = self.ip.pack(udp_len)
        udph = struct.pack("!HHHH", self.udp.sport, self.udp.dport, udp_len, 0)
        crc = _icrc.compute(iph + udph + body)
        tail = body + _icrc.encode(crc)
        if isinstance(self.ip, IPv6) or self.udp_checksum:
            udph = udph[:6] + struct.pack("!H", udp_checksum(self.ip, udph + tail))
        ethertype = C.ETH_P_IPV6 if isinstance(self.ip, IPv6) else C.ETH_P_IPV4
        return self.eth.pack(ethertype) + iph + udph + tail


def parse_frame(data, verify_icrc: bool = True) -> RocePacket:
    """Parse one Ethernet frame. Raises ParseError (with ``reason``) for anything invalid;
    trailing bytes beyond the IP datagram (Ethernet padding, FCS) are ignored."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError("parse_frame needs bytes")
    data = bytes(data)
    need(data, 0, C.ETH_LEN, "Ethernet header")
    dst, src, ethertype = data[0:6], data[6:12], struct.unpack_from("!H", data, 12)[0]
    off, tci = C.ETH_LEN, None
    if ethertype == C.ETH_P_8021Q:
        need(data, off, C.VLAN_LEN, "802.1Q tag")
        tci, ethertype = struct.unpack_from("!HH", data, off)
        off += C.VLAN_LEN
    eth = Ethernet(_mac_str(dst), _mac_str(src), tci)
    if ethertype == C.ETH_P_IPV4:
        ip, l3_end, udp_off = _parse_ipv4(data, off)
    elif ethertype == C.ETH_P_IPV6:
        ip, l3_end, udp_off = _parse_ipv6(data, off)
    else:
        raise ParseError(Reason.NOT_IP, f"ethertype 0x{ethertype:04x}", off - 2)
    return _parse_udp_on(data[:l3_end], off, udp_off, eth, ip, verify_icrc)


def _parse_ipv4(data: bytes, off: int):
    need(data, off, C.IPV4_MIN_LEN, "IPv4 header")
    vihl, tos, total, ident, frag, ttl, proto = struct.unpack_from("!BBHHHBB", data, off)
    if vihl >> 4 != 4:
        raise ParseError(Reason.BAD_IP_VERSION, f"version {vihl >> 4} in an IPv4 frame", off)
    hlen = (vihl & 0xF) * 4
    if hlen < C.IPV4_MIN_LEN:
        raise ParseError(Reason.BAD_IP_HEADER_LENGTH, f"IHL {vihl & 0xF}", off)
    need(data, off, hlen, "IPv4 header with options")
    if total < hlen:
        raise ParseError(Reason.BAD_IP_LENGTH, f"total length {total} < header {hlen}", off + 2)
    need(data, off, total, "IPv4 datagram")
    if inet_checksum(data[off:off + hlen]) != 0:
        raise ParseError(Reason.BAD_IP_CHECKSUM, "IPv4 header checksum", off + 10)
    if frag & 0x3FFF:
        raise ParseError(Reason.IP_FRAGMENT, "fragmented IPv4 datagram", off + 6)
    if proto != C.IPPROTO_UDP:
        raise ParseError(Reason.NOT_UDP, f"IP protocol {proto}", off + 9)
    ip = IPv4(src=str(ipaddress.IPv4Address(data[off + 12:off + 16])),
              dst=str(ipaddress.IPv4Address(data[off + 16:off + 20])), dscp=tos >> 2,
              ecn=tos & 3, ttl=ttl, ident=ident, df=frag >> 14 & 1,
              options=data[off + C.IPV4_MIN_LEN:off + hlen])
    return ip, off + total, off + hlen


def _parse_ipv6(data: bytes, off: int):
    need(data, off, C.IPV6_LEN, "IPv6 header")
    w0, plen, nh, hlim = struct.unpack_from("!IHBB", data, off)
    if w0 >> 28 != 6:
        raise ParseError(Reason.BAD_IP_VERSION, f"version {w0 >> 28} in an IPv6 frame", off)
    if plen == 0:
        raise ParseError(Reason.BAD_IP_LENGTH, "IPv6 payload length 0 (jumbogram)", off + 4)
    need(data, off + C.IPV6_LEN, plen, "IPv6 payload")
    if nh != C.IPPROTO_UDP:
        raise ParseError(Reason.NOT_UDP, f"IPv6 next header {nh}", off + 6)
    tc = w0 >> 20 & 0xFF
    ip = IPv6(src=str(ipaddress.IPv6Address(data[off + 8:off + 24])),
              dst=str(ipaddress.IPv6Address(data[off + 24:off + 40])), dscp=tc >> 2, ecn=tc & 3,
              flow_label=w0 & 0xFFFFF, hop_limit=hlim)
    return ip, off + C.IPV6_LEN + plen, off + C.IPV6_LEN


def _parse_udp_on(data: bytes, ip_off: int, off: int, eth, ip, verify_icrc: bool) -> RocePacket:
    if len(data) - off < C.UDP_LEN:
        raise ParseError(Reason.BAD_IP_LENGTH, "IP payload shorter than a UDP header", off)
    sport, dport, ulen = struct.unpack_from("!HHH", data, off)
    if ulen != len(data) - off:
        raise ParseError(Reason.BAD_UDP_LENGTH, f"UDP length {ulen}, IP payload {len(data) - off}",
                         off + 4)
    if dport != C.ROCEV2_UDP_PORT:
        raise ParseError(Reason.NOT_ROCE, f"UDP destination port {dport}", off + 2)
    udp = UDP(sport, dport)
    bth_off = off + C.UDP_LEN
    end = len(data) - C.ICRC_LEN
    if end - bth_off < C.BTH_LEN:
        raise ParseError(Reason.TRUNCATED, "UDP payload shorter than BTH + ICRC", bth_off)
    bth = BTH.parse(data, bth_off)
    if bth.tver != C.BTH_TVER:
        raise ParseError(Reason.BAD_TVER, f"TVer {bth.tver}", bth_off + 1, bth=bth)
    received = _icrc.decode(data[end:])
    icrc_ok = _icrc.compute(data[ip_off:end]) == received
    try:
        pkt = _parse_transport(data, bth_off, end, bth, eth, ip, udp, received)
    except ParseError as exc:
        exc.bth, exc.icrc_ok = bth, icrc_ok
        if verify_icrc and not icrc_ok:
            raise ParseError(Reason.BAD_ICRC, f"ICRC 0x{received:08x} does not match ({exc.reason.value})",
                             end, bth=bth, icrc_ok=False) from None
        raise
    if verify_icrc and not icrc_ok:
        raise ParseError(Reason.BAD_ICRC, f"ICRC 0x{received:08x} does not match", end, bth=bth,
                         icrc_ok=False, packet=pkt)
    return pkt


def _parse_transport(data, bth_off, end, bth, eth, ip, udp, received) -> RocePacket:
    lay = layout_for(bth.opcode, bth_off, bth)
    off = bth_off + C.BTH_LEN
    headers = []
    for cls in lay.headers:
        if end - off < cls.SIZE:
            raise ParseError(Reason.TRUNCATED, f"{cls.NAME} needs {cls.SIZE} bytes, {end - off} left", off)
        headers.append(cls.parse(data, off))
        off += cls.SIZE
    data_len = end - off
    if not lay.payload:
        if data_len:
            raise ParseError(Reason.BAD_LENGTH, f"{data_len} payload bytes on a header-only opcode", off)
        if bth.pad_count:
            raise ParseError(Reason.BAD_PAD_COUNT, f"pad count {bth.pad_count} without payload", bth_off + 1)
    if data_len % 4:
        raise ParseError(Reason.BAD_LENGTH, f"payload + pad of {data_len} bytes is not 4-byte aligned", off)
    if bth.pad_count > data_len:
        raise ParseError(Reason.BAD_PAD_COUNT, f"pad count {bth.pad_count} > {data_len} data bytes",
                         bth_off + 1)
    payload = data[off:end - bth.pad_count]
    return RocePacket(ip=ip, bth=bth, headers=tuple(headers), payload=payload, udp=udp, eth=eth,
                      icrc=received)
