"""Parameter types every command shares, so that a number means the same everywhere: floats are
finite (NaN and ±inf are refused by the parser, before anything runs), QP numbers are 24-bit
and may be written in decimal or 0x-hex (rdma-core prints them in hex), seeds fit 64 bits."""

from __future__ import annotations

import math

import click

from ..numbers import parse_qpn

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
