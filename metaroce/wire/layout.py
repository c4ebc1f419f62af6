"""Which extension headers follow the BTH for each opcode, and whether a payload may follow."""

from dataclasses import dataclass

from . import consts as C
from .consts import Opcode as O
from .errors import ParseError, Reason
from .headers import (AETH, CMETH, CNPPad, CREDITETH, IETH, PETH, RETH, SACKETH, AtomicAckETH,
                      AtomicETH, ImmDt)


@dataclass(frozen=True)
class Layout:
    headers: tuple  # header classes, in wire order
    payload: bool  # True: a payload (possibly empty) may follow; False: none allowed


def _rc_like(mr: bool) -> dict:
    p = (PETH,) if mr else ()
    base = 0xC0 if mr else 0x00
    rows = {
        0x00: (p, True), 0x01: (p, True), 0x02: (p, True), 0x03: (p + (ImmDt,), True),
        0x04: (p, True), 0x05: (p + (ImmDt,), True),
        0x06: (p + (RETH,), True), 0x07: (p + ((RETH,) if mr else ()), True),
        0x08: (p + ((RETH,) if mr else ()), True),
        0x09: (p + ((RETH, ImmDt) if mr else (ImmDt,)), True),
        0x0A: (p + (RETH,), True), 0x0B: (p + (RETH, ImmDt), True),
        0x0C: (p + (RETH,), False),
        0x0D: (p if mr else (AETH,), True), 0x0E: (p, True),
        0x0F: (p if mr else (AETH,), True), 0x10: (p if mr else (AETH,), True),
        0x12: (p + (AETH, AtomicAckETH), False),
        0x13: (p + (AtomicETH,), False), 0x14: (p + (AtomicETH,), False),
    }
    return {base | op: Layout(h, pay) for op, (h, pay) in rows.items()}


LAYOUTS: dict[int, Layout] = {
    **_rc_like(False),
    O.RC_ACKNOWLEDGE: Layout((AETH,), False),
    O.RC_SEND_LAST_WITH_INVALIDATE: Layout((IETH,), True),
    O.RC_SEND_ONLY_WITH_INVALIDATE: Layout((IETH,), True),
    O.CNP: Layout((CNPPad,), False),
    **_rc_like(True),
    O.MR_SACK: Layout((AETH, SACKETH), False),
    O.MR_CREDIT: Layout((CREDITETH,), False),
    O.MR_CM: Layout((CMETH,), False),
    O.MR_PROBE: Layout((PETH,), False),
    O.MR_SEND_LAST_WITH_INVALIDATE: Layout((PETH, IETH), True),
    O.MR_SEND_ONLY_WITH_INVALIDATE: Layout((PETH, IETH), True),
}
assert set(LAYOUTS) == {int(o) for o in O}, "every opcode has a layout"

# IBTA opcodes of other transports, and IBA 1.5 RC opcodes, that MetaRoCE does not carry.
_FOREIGN_RC = {0x1C, 0x1D}  # FLUSH, ATOMIC_WRITE (IBA 1.5)


def layout_for(opcode: int, off: int | None = None, bth=None) -> Layout:
    """The layout of ``opcode``, or ParseError(UNKNOWN_OPCODE / UNSUPPORTED_TRANSPORT)."""
    lay = LAYOUTS.get(opcode)
    if lay is not None:
        return lay
    transport = opcode & 0xE0
    if transport in (C.TRANSPORT_UC, C.TRANSPORT_RD, C.TRANSPORT_UD, C.TRANSPORT_XRC) or \
            opcode in _FOREIGN_RC:
        raise ParseError(Reason.UNSUPPORTED_TRANSPORT,
                         f"opcode 0x{opcode:02x} is not carried by MetaRoCE RC", off, bth=bth)
    raise ParseError(Reason.UNKNOWN_OPCODE, f"opcode 0x{opcode:02x} is reserved/undefined",
                     off, bth=bth)
