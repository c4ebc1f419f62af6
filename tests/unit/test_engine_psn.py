"""24-bit PSN arithmetic, including the wrap at 2^24 and the 2^23 comparison window."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metaroce.engine import psn

P = st.integers(0, 2**24 - 1)
D = st.integers(-(2**23), 2**23 - 1)


def test_wraparound_examples():
    assert psn.add(0xFFFFFF, 1) == 0
    assert psn.add(0, -1) == 0xFFFFFF
    assert psn.add(0xFFFFFE, 5) == 3
    assert psn.diff(2, 0xFFFFFE) == 4
    assert psn.diff(0xFFFFFE, 2) == -4
    assert psn.distance(2, 0xFFFFFE) == 4
    assert psn.after(0, 0xFFFFFF) and psn.before(0xFFFFFF, 0)
    assert psn.between(0xFFFFF0, 0x5, 0x10) and not psn.between(0xFFFFF0, 0x10, 0x10)


def test_window_edges():
    # 2^23 - 1 ahead is "after"; exactly 2^23 ahead is interpreted as behind
    assert psn.diff(2**23 - 1, 0) == 2**23 - 1
    assert psn.diff(2**23, 0) == -(2**23)
    assert psn.before(2**23, 0)
    assert psn.after(0, 2**23 + 1)


def test_check_range():
    assert psn.check(0xFFFFFF) == 0xFFFFFF
    with pytest.raises(ValueError):
        psn.check(1 << 24)
    with pytest.raises(ValueError):
        psn.check(-1)


@settings(max_examples=300, deadline=None)
@given(a=P, d=D)
def test_add_then_diff_roundtrip(a, d):
    b = psn.add(a, d)
    assert 0 <= b < 2**24
    assert psn.diff(b, a) == d
    assert psn.diff(a, b) == (-d if d != -(2**23) else -(2**23))
    assert psn.after(b, a) == (d > 0) and psn.before(b, a) == (d < 0)


@settings(max_examples=300, deadline=None)
@given(a=P, b=P)
def test_antisymmetry_and_distance(a, b):
    assert psn.distance(a, b) == (a - b) % 2**24
    if psn.diff(a, b) != -(2**23):
        assert psn.diff(a, b) == -psn.diff(b, a)
    assert not (psn.before(a, b) and psn.after(a, b))
    assert (a == b) == (psn.diff(a, b) == 0)
