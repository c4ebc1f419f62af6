"""The wire's congestion-control parameters (metaroce/nic/ccconfig.py): what `metaroce up --cc`
hands the data path per connection, and one clear error for every bad value."""

import math

import pytest

from metaroce.errors import UsageError
from metaroce.nic.ccconfig import CCConfig


def test_default_is_on_and_fills_the_connection():
    c = CCConfig(link_rate_bps=25e9)
    assert c.enabled
    e = c.engine(127, 1024)
    assert (e.line_rate_bps, e.base_rtt_ns, e.target_qdelay_ns) == \
        (25e9, 500_000, int(c.target_qdelay_s * 1e9))
    assert e.enabled and e.dcqcn
    assert CCConfig(enabled=False).engine(127, 1024) is None
    assert CCConfig().engine(127, 1024).line_rate_bps == 10e9      # unresolved: 10 Gbit/s
    assert CCConfig(enabled=False).describe() == {"enabled": False}


def test_the_window_cap_is_what_the_psn_window_lets_out():
    """max_cwnd = min(1.25 x BDP, window x (PMTU + 64)), CC-1 counting 64 bytes a packet."""
    big = CCConfig(link_rate_bps=25e9).engine(127, 1024)          # BDP 1.56 MB
    assert big.bdp_factor * big.bdp_bytes == pytest.approx(127 * (1024 + 64))
    small = CCConfig(link_rate_bps=200e6).engine(127, 1024)       # BDP 12.5 KB
    assert small.bdp_factor == 1.25


@pytest.mark.parametrize("field,value", [("target_qdelay_s", -1e-6), ("target_qdelay_s", math.nan),
                                         ("base_rtt_s", 0.0), ("base_rtt_s", math.inf),
                                         ("link_rate_bps", 10.0), ("link_rate_bps", True),
                                         ("enabled", 1)])
def test_bad_values_are_one_usage_error(field, value):
    with pytest.raises(UsageError, match=field.split("_s")[0] if field != "enabled" else "enabled"):
        CCConfig(**{field: value})
