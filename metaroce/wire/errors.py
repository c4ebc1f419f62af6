"""ParseError: the only exception a parser raises, with a reason from a fixed enum."""

from enum import Enum


class Reason(str, Enum):
    """Why bytes are not a valid packet. The value is the stable, machine-readable code."""

    TRUNCATED = "truncated"
    NOT_IP = "not_ip"  # Ethernet type is neither IPv4 nor IPv6
    BAD_IP_VERSION = "bad_ip_version"
    BAD_IP_HEADER_LENGTH = "bad_ip_header_length"
    BAD_IP_LENGTH = "bad_ip_length"
    BAD_IP_CHECKSUM = "bad_ip_checksum"
    IP_FRAGMENT = "ip_fragment"
    NOT_UDP = "not_udp"
    NOT_ROCE = "not_roce"  # UDP destination port is not 4791
    BAD_UDP_LENGTH = "bad_udp_length"
    BAD_TVER = "bad_tver"
    BAD_ICRC = "bad_icrc"
    UNKNOWN_OPCODE = "unknown_opcode"  # reserved or undefined opcode value
    UNSUPPORTED_TRANSPORT = "unsupported_transport"  # valid IBTA opcode of UC/RD/UD/XRC
    BAD_PAD_COUNT = "bad_pad_count"
    BAD_LENGTH = "bad_length"  # payload length not allowed for the opcode
    BAD_SYNDROME = "bad_syndrome"  # AETH syndrome reserved bit/type/NAK code
    BAD_FIELD = "bad_field"  # reserved or undefined value in an extension header
    UNSUPPORTED_LINKTYPE = "unsupported_linktype"


class ParseError(ValueError):
    """Malformed input. ``reason`` is a :class:`Reason`; ``offset`` the byte where it was found.

    ``bth`` (when the BTH was parsed) and ``icrc_ok`` (when the ICRC was checked) carry what
    was learnt before the failure, for diagnostics; ``packet`` is set for BAD_ICRC only.
    """

    def __init__(self, reason: Reason, detail: str = "", offset: int | None = None, *,
                 bth=None, icrc_ok: bool | None = None, packet=None):
        self.reason = Reason(reason)
        self.detail = detail
        self.offset = offset
        self.bth = bth
        self.icrc_ok = icrc_ok
        self.packet = packet
        where = f" at byte {offset}" if offset is not None else ""
        super().__init__(f"{self.reason.value}{where}" + (f": {detail}" if detail else ""))


def need(buf, off: int, n: int, what: str) -> None:
    """Raise TRUNCATED unless ``buf`` holds ``n`` bytes at ``off``."""
    if off < 0 or off + n > len(buf):
        raise ParseError(Reason.TRUNCATED, f"{what} needs {n} bytes, {max(len(buf) - off, 0)} left", off)
