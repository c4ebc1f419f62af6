"""MetaRoCE multipath state of a sender (spec 5.4, metaroce/nic/paths.py): ports, spraying
order, per-path counters and the eviction rules. Pure code, no root."""

import random

import pytest

from metaroce.nic import paths as P


def _set(n, seed=1):
    r = random.Random(seed)
    return P.PathSet(n, rand=r.randrange)


def test_mp1_distinct_ports_in_range():
    ps = _set(8)
    assert len(set(ps.sports)) == 8
    assert all(P.PORT_LO <= p <= P.PORT_HI for p in ps.sports)
    with pytest.raises(ValueError):
        P.PathSet(0)
    with pytest.raises(ValueError):
        P.PathSet(P.MAX_DP_PATHS + 1)


def test_mp3_spraying_order_and_retransmission_on_another_path():
    ps = _set(4)
    assert [ps.path_of(p) for p in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    for psn in range(100):
        assert ps.path_of(psn, 1) != ps.path_of(psn, 0)          # MP-3: another path
    assert {ps.path_of(p) for p in range(1000)} == {0, 1, 2, 3}   # every path used


def test_mp5_two_losses_within_8_srtt_evict_one_does_not():
    ps = _set(4)
    port = ps.sports[2]
    assert not ps.on_loss(2, 10.0, srtt=0.001)
    assert not ps.on_loss(2, 10.0 + 0.009, srtt=0.001)           # 9 ms > 8 SRTT: the first aged
    assert ps.sports[2] == port
    assert ps.on_loss(2, 10.0 + 0.0095, srtt=0.001)              # 0.5 ms after the second
    new = ps.sports[2]
    assert new != port and len(set(ps.sports)) == 4              # fresh, distinct (MP-1)
    st = ps.stats()[2]
    assert st["lost"] == 3 and st["evictions"] == 1 and st["sport"] == new


def test_mp5_rto_evicts_and_retired_port_is_quarantined():
    class Scripted:                    # offers the retired port first, then another
        def __init__(self, vals):
            self.vals = list(vals)

        def __call__(self, n):
            return self.vals.pop(0)
    ps = P.PathSet(2, rand=Scripted([5, 6]))
    old = ps.sports[0]
    ps._rand = Scripted([old - P.PORT_LO, 7])                   # the same port: refused
    ps.on_rto(0, now=1.0)
    assert ps.sports[0] == P.PORT_LO + 7 and ps.stats()[0]["rtos"] == 1
    ps._rand = Scripted([old - P.PORT_LO])                       # 1.5 s later it may come back
    ps.evict(1, now=2.5)
    assert ps.sports[1] == old


def test_mp5_ecn_rule_evicts_only_the_congested_path():
    ps = _set(2)
    port0, port1 = ps.sports
    evicted = [ps.on_feedback(0, True, 1.0) for _ in range(40)]
    for _ in range(40):
        ps.on_feedback(1, False, 1.0)
    assert any(evicted) and ps.sports[0] != port0 and ps.sports[1] == port1
    # both congested: nobody is evicted (the rule needs the others below 25 %)
    ps = _set(2)
    before = ps.sports
    for _ in range(40):
        assert not ps.on_feedback(0, True, 1.0)
        assert not ps.on_feedback(1, True, 1.0)
    assert ps.sports == before
    assert not ps.on_feedback(9, True, 1.0)                      # not one of our PathIDs


def test_single_path_repaths_on_rto():
    """With MULTIPATH and N = 1 the one path still moves on an RTO (a new ECMP hash)."""
    ps = _set(1)
    old = ps.sports[0]
    ps.on_rto(0, 0.0)
    assert ps.sports[0] != old
