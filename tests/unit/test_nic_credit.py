"""The daemon's credit shares (spec CC-8) and the rate parser of `metaroce up --link-rate`."""

import pytest

from metaroce.nic.credit import CreditConfig, CreditGranter, parse_rate


class FakeRx:
    def __init__(self):
        self.epsn, self.map = {}, {}

    def qp_epsn(self, qpn):
        return self.epsn.get(qpn)

    def set_credit(self, qpn, share):
        if share:
            self.map[qpn] = share
        else:
            self.map.pop(qpn, None)


class Q:
    def __init__(self, qpn, metaroce=True, pmtu=None):
        self.qpn, self.metaroce, self.state, self.pmtu = qpn, metaroce, "RTS", pmtu


@pytest.mark.parametrize("text,bps", [("150mbit", 150e6), ("10G", 10e9), ("25e9", 25e9),
                                      ("1.5gbit", 1.5e9), (2e6, 2e6), ("100kbps", 1e5)])
def test_parse_rate(text, bps):
    assert parse_rate(text) == bps


@pytest.mark.parametrize("bad", ["", "fast", "-5mbit", "1e20", "10 furlongs", "0"])
def test_parse_rate_refuses(bad):
    with pytest.raises(ValueError):
        parse_rate(bad)


def test_shares_only_in_incast_and_split_the_bdp():
    cfg = CreditConfig(link_rate_bps=100e6, base_rtt_s=2e-3, pmtu=1024, tick_s=0.001)
    assert cfg.bdp_pkts == 24
    rx, qps = FakeRx(), [Q(1), Q(2), Q(3), Q(4, metaroce=False)]
    g = CreditGranter(rx, cfg)
    rx.epsn = {1: 10}
    g.tick(qps, 0.0)
    assert rx.map == {}                       # one active sender: no incast, nobody limited
    rx.epsn = {1: 11, 2: 5, 3: 7, 4: 9}
    g.tick(qps, 0.002)
    assert rx.map == {1: 8, 2: 8, 3: 8}       # 24 // 3; the RoCEv2 QP is never limited
    g.tick(qps, 0.003)                        # nothing moved, but still active (idle_s)
    assert rx.map == {1: 8, 2: 8, 3: 8}
    rx.epsn[1] = 12
    g.tick(qps, 0.030)                        # 2 and 3 went idle: 1 alone is no incast
    assert rx.map == {}
    g.forget(1)
    assert g.share_of(1) == 0


def test_a_qp_connecting_beside_others_starts_limited_until_it_sends():
    """CC-8, a sender starts limited: QPs connected ahead of an incast keep a first-round-trip
    share however long they wait before sending (they used to look idle at the first tick,
    lose their grant and all start with a whole window: 16:1 incast dropped 600 frames)."""
    cfg = CreditConfig(link_rate_bps=100e6, base_rtt_s=2e-3, pmtu=1024, tick_s=0.001)
    rx, qps = FakeRx(), []
    g = CreditGranter(rx, cfg)
    for qpn in (1, 2, 3, 4):
        rx.epsn[qpn] = 100
        g.admit(qpn, qps, 0.0)
        qps.append(Q(qpn))
    assert 1 not in rx.map                        # alone when it connected: no incast
    assert rx.map == {2: 12, 3: 8, 4: 6}          # BDP 24 over the live QPs
    g.tick(qps, 1.0)                              # a second later, none has sent yet
    assert rx.map == {1: 6, 2: 6, 3: 6, 4: 6}     # all four may start together
    rx.epsn[1] = 101                              # 1 starts: active, the others still fresh
    g.tick(qps, 1.002)
    assert rx.map == {2: 6, 3: 6, 4: 6}           # 1 alone is no incast; theirs stays
    rx.epsn.update({2: 101, 3: 101, 4: 101})
    g.tick(qps, 1.004)
    assert rx.map == {1: 6, 2: 6, 3: 6, 4: 6}     # four active senders: 24 // 4
    assert g.stats["credit_admitted"] == 4


def test_a_lone_fresh_qp_is_not_limited():
    cfg = CreditConfig(link_rate_bps=100e6, base_rtt_s=2e-3, pmtu=1024, tick_s=0.001)
    rx = FakeRx()
    g = CreditGranter(rx, cfg)
    rx.epsn[7] = 0
    g.admit(7, [], 0.0)
    g.tick([Q(7)], 0.5)
    assert rx.map == {}
    g.forget(7)
    assert not g.fresh


def test_shares_are_bytes_counted_in_each_qps_packets():
    """A share is the QP's part of the BDP in bytes, counted in packets of its own path MTU:
    a QP at 2048 bytes gets half the packets of one at 1024 (the device's own MTU counts for a
    QP that has none yet)."""
    cfg = CreditConfig(link_rate_bps=100e6, base_rtt_s=2e-3, pmtu=1344, tick_s=0.001)
    assert cfg.bdp_pkts == 18 and cfg.bdp_pkts_of(1024) == 24 and cfg.bdp_pkts_of(2048) == 12
    rx, qps = FakeRx(), [Q(1, pmtu=1024), Q(2, pmtu=2048), Q(3)]
    g = CreditGranter(rx, cfg)
    rx.epsn = {1: 1, 2: 1, 3: 1}
    g.tick(qps, 0.0)
    rx.epsn = {1: 2, 2: 2, 3: 2}
    g.tick(qps, 0.002)
    assert rx.map == {1: 8, 2: 4, 3: 6}           # 24 // 3, 12 // 3, 18 // 3
    g.admit(4, qps + [Q(4, pmtu=8000)], 0.003)
    assert rx.map[4] == 2                          # 3 packets of 8000 // 4, at least min_share
