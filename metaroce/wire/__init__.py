"""MetaRoCE wire codec: constants, headers, ICRC, whole frames and classic pcap files."""

from . import consts
from .consts import Opcode
from .errors import ParseError, Reason
from .headers import (AETH, BTH, CMETH, CNPPad, CREDITETH, IETH, PETH, RETH, SACKETH,
                      AtomicAckETH, AtomicETH, ImmDt)
from .packet import UDP, Ethernet, IPv4, IPv6, RocePacket, parse_frame

__all__ = [
    "consts", "Opcode", "ParseError", "Reason", "AETH", "BTH", "CMETH", "CNPPad", "CREDITETH",
    "IETH", "PETH", "RETH", "SACKETH", "AtomicAckETH", "AtomicETH", "ImmDt", "UDP", "Ethernet",
    "IPv4", "IPv6", "RocePacket", "parse_frame",
]
