"""The wire's congestion-control parameters (metaroce/nic/ccconfig.py): what `metaroce up --cc`
hands the data path per connection, and one clear error for every bad value."""

import math

import pytest

from metaroce.errors import UsageError
from metaroce.nic.ccconfig import CCConfig


def test_default_is_on_and_fills_the_connection():
    c = CCConfig(link_rate_bps=25e9)
    assert c.enabled
    assert c.conn() == {"cc": 1, "cc_line_rate_bps": 25e9, "cc_base_rtt_ns": 500_000,
                        "cc_target_qdelay_ns": int(c.target_qdelay_s * 1e9)}
    assert CCConfig(enabled=False).conn()["cc"] == 0
    assert CCConfig().conn()["cc_line_rate_bps"] == 10e9      # unresolved: 10 Gbit/s
    assert CCConfig(enabled=False).describe() == {"enabled": False}


@pytest.mark.parametrize("field,value", [("target_qdelay_s", -1e-6), ("target_qdelay_s", math.nan),
                                         ("base_rtt_s", 0.0), ("base_rtt_s", math.inf),
                                         ("link_rate_bps", 10.0), ("link_rate_bps", True),
                                         ("enabled", 1)])
def test_bad_values_are_one_usage_error(field, value):
    with pytest.raises(UsageError, match=field.split("_s")[0] if field != "enabled" else "enabled"):
        CCConfig(**{field: value})
