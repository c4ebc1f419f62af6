"""Parameter types every command shares, so that a number means the same everywhere: floats are
finite (NaN and ±inf are refused by the parser, before anything runs), QP numbers are 24-bit
and may be written in decimal or 0x-hex (rdma-core prints them in hex), seeds fit 64 bits."""

from __future__ import annotations

import math
import re

import click

QPN_MAX = (1 << 24) - 1
SEED_MAX = (1 << 64) - 1


class FiniteFloat(click.FloatRange):
    """click.FloatRange that also refuses NaN and infinities (NaN passes every comparison a
    range makes, so a plain FloatRange lets it through)."""

    name = "number"

    def convert(self, value, param, ctx):
        v = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(v):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return super().convert(v, param, ctx)


def finite(min: float | None = None, max: float | None = None, *, min_open: bool = False,
           max_open: bool = False) -> FiniteFloat:
    """A finite float, optionally bounded: `type=finite(0, 1)`."""
    return FiniteFloat(min, max, min_open=min_open, max_open=max_open)


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


class QpnType(click.ParamType):
    """A QP number: decimal (11079288) or hex (0xa90c78), 0 .. 0xffffff."""

    name = "qpn"

    def convert(self, value, param, ctx):
        try:
            return parse_qpn(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def fmt_qpn(qpn) -> str:
    """How human output writes a QP number: hex, as rdma-core's tools do (0x000012)."""
    return "-" if qpn is None else f"0x{int(qpn):06x}"


QPN = QpnType()
SEED = click.IntRange(0, SEED_MAX)
