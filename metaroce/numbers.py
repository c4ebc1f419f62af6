"""Integers a user writes (command lines, JSON and description files): decimal or 0x-hex,
within a number of bits, never a float, a boolean, NaN or an infinity silently truncated."""

from __future__ import annotations

import re

_UINT = re.compile(r"\s*(0[xX][0-9a-fA-F]+|[0-9]+)\s*")


def parse_uint(value, bits: int, what: str = "a number") -> int:
    """An unsigned integer of at most `bits` bits from an int or a decimal / 0x-hex string
    (what JSON files and command lines carry); ValueError with one clear line otherwise. Floats,
    booleans, NaN and infinities are refused, not truncated."""
    if isinstance(value, int) and not isinstance(value, bool):
        n = value
    else:
        m = _UINT.fullmatch(value) if isinstance(value, str) else None
        if m is None:
            raise ValueError(f"{what} must be an integer (decimal, or hex as 0x…), not {value!r}")
        t = m.group(1)
        n = int(t[2:], 16) if t[:2] in ("0x", "0X") else int(t, 10)
    if not 0 <= n < 1 << bits:
        raise ValueError(f"{what} must fit in {bits} bits (0 .. 0x{(1 << bits) - 1:x}), "
                         f"not {value!r}")
    return n


def parse_qpn(value) -> int:
    """A QP number (24 bits) from an int, a decimal string or a 0x-hex string."""
    return parse_uint(value, 24, "a QP number")
