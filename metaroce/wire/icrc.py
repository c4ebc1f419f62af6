"""RoCEv2 invariant CRC (IBTA Annex A17): CRC-32 over a masked pseudo-packet.

Pseudo-packet = 8 bytes of 0xFF (for the absent LRH) + IP header with its variant fields
set to all ones (IPv4: TOS, TTL, header checksum; IPv6: traffic class, flow label, hop
limit) + UDP header with checksum 0xFFFF + BTH with byte 4 (FECN, BECN, Resv6a) 0xFF + the
rest of the packet up to the ICRC. The CRC-32 value is sent least significant byte first.
"""

import struct
import zlib

from . import consts as C

_PREFIX = zlib.crc32(b"\xff" * 8)  # CRC state after the 8-byte 0xFF LRH stand-in


def masked_header(l3: bytes) -> bytes:
    """The masked IP + UDP + BTH prefix of ``l3`` (which starts at the IP header)."""
    version = l3[0] >> 4
    if version == 4:
        hlen = (l3[0] & 0x0F) * 4
        h = bytearray(l3[:hlen + C.UDP_LEN + C.BTH_LEN])
        h[1] = 0xFF  # DSCP + ECN
        h[8] = 0xFF  # TTL
        h[10:12] = b"\xff\xff"  # header checksum
    elif version == 6:
        hlen = C.IPV6_LEN
        h = bytearray(l3[:hlen + C.UDP_LEN + C.BTH_LEN])
        h[0] |= 0x0F  # traffic class (high nibble)
        h[1:4] = b"\xff\xff\xff"  # traffic class (low nibble) + flow label
        h[7] = 0xFF  # hop limit
    else:
        raise ValueError(f"IP version {version}")
    h[hlen + 6:hlen + 8] = b"\xff\xff"  # UDP checksum
    h[hlen + C.UDP_LEN + 4] = 0xFF  # BTH FECN | BECN | Resv6a
    return bytes(h)


def compute(l3: bytes) -> int:
    """ICRC of a packet; ``l3`` runs from the IP header to just before the ICRC."""
    head = masked_header(l3)
    return zlib.crc32(l3[len(head):], zlib.crc32(head, _PREFIX)) & 0xFFFFFFFF


def encode(value: int) -> bytes:
    """The four ICRC bytes as they appear on the wire (little-endian, like the FCS)."""
    return struct.pack("<I", value)


def decode(trailer: bytes) -> int:
    return struct.unpack("<I", trailer)[0]
