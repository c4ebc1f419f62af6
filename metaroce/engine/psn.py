"""24-bit PSN arithmetic (mod 2^24) with a 2^23 comparison window, as in IBTA / rxe psn_compare."""

from metaroce.wire.consts import PSN_HALF, PSN_MASK

MOD = PSN_MASK + 1


def add(psn: int, n: int) -> int:
    """psn + n mod 2^24 (n may be negative)."""
    return (psn + n) & PSN_MASK


def diff(a: int, b: int) -> int:
    """Signed distance a - b in [-2^23, 2^23): positive when a is after b."""
    d = (a - b) & PSN_MASK
    return d - MOD if d >= PSN_HALF else d


def distance(a: int, b: int) -> int:
    """Forward distance from b to a, in [0, 2^24)."""
    return (a - b) & PSN_MASK


def before(a: int, b: int) -> bool:
    return diff(a, b) < 0


def after(a: int, b: int) -> bool:
    return diff(a, b) > 0


def between(lo: int, x: int, hi: int) -> bool:
    """lo <= x < hi on the PSN circle (hi exclusive, forward from lo)."""
    return distance(x, lo) < distance(hi, lo)


def check(psn: int) -> int:
    if not 0 <= psn <= PSN_MASK:
        raise ValueError(f"PSN {psn} out of 24-bit range")
    return psn
