"""Congestion control, multipath and receiver credits as engine units (no network simulator).

Clauses: CC-1 … CC-9, MP-1 … MP-5, SACK-5, RTO-1, RTO-3, COMPAT-4, COMPAT-5.
"""

import pytest

from metaroce.engine import Access, Mode, RecvWR, SendWR, WcStatus, WrOpcode
from metaroce.engine import packets as P
from metaroce.engine.cc import CCConfig, Dcqcn, Pacer, WindowCC
from metaroce.engine.credits import CreditConfig, CreditGate, CreditManager
from metaroce import cengine
from metaroce.engine.multipath import PathSet, flow_label_sport
from metaroce.engine.queue_pair import QueuePair as PyQueuePair
from metaroce.engine.qp import QPState
from metaroce.sim.channel import EventLoop, Impairment, Pair
from metaroce.wire.consts import UDP_SPORT_MAX, UDP_SPORT_MIN
from metaroce.wire.consts import Opcode as O

MTU = 1024
CFG = CCConfig(line_rate_bps=100e9, base_rtt_ns=8_000, target_qdelay_ns=10_000)


def test_window_starts_at_the_bdp_cap_and_stays_in_bounds():
    """CC-1: initial cwnd = max_cwnd = 1.25 x BDP; never below one MTU."""
    cc = WindowCC(CFG, MTU)
    assert cc.max_cwnd == pytest.approx(1.25 * 100e9 * 8e-6 / 8) and cc.cwnd == cc.max_cwnd
    for t in range(50):
        cc.on_ack(t * 100_000, MTU, 60_000, True, 20_000.0)
    assert cc.cwnd == MTU
    for t in range(2000):
        cc.on_ack(10**7 + t * 1000, MTU, 8_000, False, 8_000.0)
    assert cc.cwnd == cc.max_cwnd


def test_window_quadrants():
    """CC-3: (1) low delay grows proportionally, (2) high delay grows by MTU per window,
    (3) ECN + high delay cuts at most once per SRTT, (4) ECN + low delay: no window change."""
    cc = WindowCC(CFG, MTU)
    cc.cwnd = 50_000.0
    cc.on_ack(0, 4096, 9_000, False, 9_000.0)
    assert cc.cwnd == pytest.approx(50_000 + 4096 * (18_000 - 9_000) / 18_000)
    cc.cwnd = 50_000.0
    cc.on_ack(0, 4096, 30_000, False, 30_000.0)
    assert cc.cwnd == pytest.approx(50_000 + MTU * 4096 / 50_000)
    cc.cwnd = 50_000.0
    cc.on_ack(1_000_000, 4096, 36_000, True, 20_000.0)
    assert cc.cwnd == pytest.approx(50_000 * max(1 - 0.8 * (36_000 - 18_000) / 36_000, 0.5))
    cut = cc.cwnd
    cc.on_ack(1_010_000, 4096, 36_000, True, 20_000.0)  # within one SRTT: no second cut
    assert cc.cwnd == cut
    cc.on_ack(1_030_000, 4096, 36_000, True, 20_000.0)
    assert cc.cwnd < cut
    cc.cwnd = 50_000.0
    assert cc.on_ack(2_000_000, 4096, 9_000, True, 9_000.0) is True and cc.cwnd == 50_000.0


def test_loss_cut_once_per_srtt_and_rto_resets():
    """CC-4: a loss removes its bytes once per SRTT; an RTO sets cwnd to one MTU."""
    cc = WindowCC(CFG, MTU)
    top = cc.cwnd
    cc.on_loss(0, 4000, 10_000.0)
    cc.on_loss(5_000, 4000, 10_000.0)
    assert cc.cwnd == top - 4000
    cc.on_loss(20_000, 4000, 10_000.0)
    assert cc.cwnd == top - 8000
    cc.on_rto(30_000)
    assert cc.cwnd == MTU


def test_dcqcn_cuts_on_cnp_and_recovers():
    """COMPAT-4: Rc x= (1 - alpha/2) per CNP, then timer-driven recovery to line rate."""
    d = Dcqcn(CFG)
    d.on_cnp(0)
    assert d.rc == pytest.approx(50e9) and d.limited
    d.on_cnp(1_000)
    assert d.rc < 50e9
    low = d.rc
    d.advance(2_000_000)
    assert low < d.rc
    d.advance(10**9)
    assert d.rc == d.line and not d.limited


def test_pacer_spacing():
    p = Pacer(burst_pkts=0)
    p.sent(0, 1250, 10e9)  # 1 us per 1250 bytes at 10 Gbit/s
    assert not p.ready(999) and p.ready(1000)


def test_path_set_entropy_wrr_and_eviction():
    """MP-1: distinct ports in 0xC000-0xFFFF, path 0 = the compat flow-label port (COMPAT-5);
    MP-3: weighted round robin; MP-5: two losses within 8 SRTT evict with fresh entropy."""
    ps = PathSet(8, 0x11, 0x22, seed=3)
    ports = [p.sport for p in ps.paths]
    assert len(set(ports)) == 8 and all(UDP_SPORT_MIN <= s <= UDP_SPORT_MAX for s in ports)
    assert ports[0] == flow_label_sport(0x11, 0x22)
    picks = [ps.pick() for _ in range(80)]
    assert all(picks.count(k) == 10 for k in range(8))
    ps.congested(3)
    picks = [ps.pick() for _ in range(800)]
    assert picks.count(3) < 60 and max(picks.count(k) for k in range(8)) <= 120
    assert ps.pick(avoid=ps.pick()) is not None
    old = ps.sport(5)
    assert not ps.on_loss(5, 0, 10_000.0)
    assert ps.on_loss(5, 50_000, 10_000.0)  # second loss within 8 SRTT
    assert ps.sport(5) not in ports and ps.paths[5].evictions == 1
    assert ps.paths[5].weight == pytest.approx(1 / 8) and old in ps.retired
    ps.on_loss(6, 0, 1_000.0)
    assert not ps.on_loss(6, 100_000, 1_000.0)  # far apart: no eviction
    ps.on_rto(7, 1)
    assert ps.paths[7].rtos == 1 and ps.paths[7].evictions == 1
    with pytest.raises(ValueError):
        PathSet(65, 1, 2)


def test_path_set_evicts_mostly_marked_path():
    """MP-5: more than half of a path's packets ECN-marked while the others are clean."""
    ps = PathSet(4, 1, 2)
    old = ps.sport(2)
    for t in range(64):
        for k in range(4):
            ps.on_ack(k, 10_000, k == 2, t)
    assert ps.sport(2) != old and 1 <= ps.paths[2].evictions <= 64 // 16
    assert all(ps.paths[k].evictions == 0 for k in (0, 1, 3))


def test_credit_manager_shares_the_bdp():
    """CC-8: share = max(1, ceil(BDP packets / active senders)) (rules decided: together the
    shares cover one BDP); none below min_senders."""
    cfg = CreditConfig(link_rate_bps=100e9, base_rtt_ns=8_000, mtu=4096, idle_ns=20_000)
    m = CreditManager(cfg)
    assert cfg.bdp_pkts == 24
    m.touch(1, 0)
    assert m.share(0) is None
    for k in range(2, 5):
        m.touch(k, 100)
    assert m.share(100) == 6
    m.touch(5, 150)
    assert m.share(150) == 5              # 24 / 5: 5 x 5 >= 24 (4 x 5 would leave a gap)
    for k in range(5, 60):
        m.touch(k, 200)
    assert m.share(200) == 1
    m.touch(1, 50_000)
    assert m.share(50_000) is None  # the others went idle


def test_credit_gate_ordering_and_limit():
    """CC-8: no new PSN at or beyond the limit; stale grants ignored; A=0 ends credit mode."""
    g = CreditGate(0xFFFFFE, initial=2)
    assert g.allows(0xFFFFFF) and not g.allows(0)
    assert g.on_grant(5, True, 10, 0, 1)
    assert g.allows(9) and not g.allows(10)
    assert not g.on_grant(4, False, 0, 0, 2)  # older grant: ignored
    g.refresh(8, 3)
    assert g.limit == 10  # limits never move back
    g.refresh(12, 3)
    assert g.limit == 12
    assert g.on_grant(6, False, 0, 0, 4) and g.allows(10**6)


@pytest.fixture(params=[cengine.QueuePair, PyQueuePair], ids=["c", "py"])
def QP(request):
    """QP-level clauses hold for the C engine and the Python reference model."""
    return request.param


def _connect(QueuePair, mode, cc=None, paths=1, credits=None, window=128):
    a = QueuePair(0x11, mode, min_rto_ns=50_000, cc=cc, paths=paths, credits=credits)
    b = QueuePair(0x22, mode, min_rto_ns=50_000, cc=cc, paths=paths, credits=credits)
    mem = bytearray(1 << 20)
    b.mrs.register(7, 0x1000, mem, Access.ALL_REMOTE)
    for q, peer in ((a, 0x22), (b, 0x11)):
        q.modify(QPState.INIT)
        q.modify(QPState.RTR, dest_qpn=peer, rq_psn=100, path_mtu=MTU, window=window)
        q.modify(QPState.RTS, sq_psn=100, timeout=8)
    return a, b, mem


def test_cwnd_bounds_inflight_bytes(QP):
    """CC-1: with a stalled receiver, unacknowledged bytes never exceed cwnd."""
    cfg = CCConfig(line_rate_bps=10e9, base_rtt_ns=10_000)
    a, b, _ = _connect(QP, Mode.METAROCE, cc=cfg)
    a.post_send(SendWR(1, WrOpcode.RDMA_WRITE, bytes(64 * MTU), 0, 64 * MTU, 0x1000, 7), 0)
    pk = a.take_packets()
    sent = sum(len(p.payload) + 64 for p in pk)
    assert sent <= a.req.cc.cwnd < sent + MTU + 64 and len(pk) < 64
    assert a.req.blocked == "cwnd"


def test_sack_echoes_path_timestamp_ce_and_multipath_spray(QP):
    """CC-2/CC-7 and MP-1/MP-2: the SACK echoes PathID, timestamp and CE; packets go out on
    distinct ports, one PathID per port."""
    a, b, _ = _connect(QP, Mode.METAROCE, cc=CFG, paths=4)
    a.post_send(SendWR(1, WrOpcode.RDMA_WRITE, bytes(8 * MTU), 0, 8 * MTU, 0x1000, 7), 1000)
    pk = a.take_packets()
    assert len({p.sport for p in pk}) == 4
    assert all(len({p.path for p in pk if p.sport == s}) == 1 for s in {p.sport for p in pk})
    from dataclasses import replace
    b.receive(replace(pk[0], ce=True), 5000)
    sack = [p for p in b.take_packets() if p.opcode == O.MR_SACK][0]
    assert sack.ecn_echo and sack.ce_count == 1 and sack.path == pk[0].path
    assert sack.ts_echo == 1000 and sack.sport == pk[0].sport
    a.receive(sack, 9000)
    assert a.req.last_rtt == 8000 and a.req.paths.paths[pk[0].path].ecn == 1


def test_compat_cnp_interval_and_rate_cut(QP):
    """COMPAT-4: CE-marked requests make at most one CNP per 50 us; the sender's rate falls
    and it paces. COMPAT-5: one fixed source port."""
    a, b, _ = _connect(QP, Mode.COMPAT, cc=CFG)
    a.post_send(SendWR(1, WrOpcode.RDMA_WRITE, bytes(8 * MTU), 0, 8 * MTU, 0x1000, 7), 0)
    pk = a.take_packets()
    assert len({p.sport for p in pk}) == 1
    from dataclasses import replace
    for i, p in enumerate(pk):
        b.receive(replace(p, ce=True), 1000 + i * 10_000)
    cnps = [p for p in b.take_packets() if p.opcode == O.CNP]
    assert len(cnps) == 2  # t = 1 us and 51 us (71 us is only 20 us later)
    a.receive(cnps[0], 80_000)
    assert a.req.dcqcn.limited and a.req.stats["cnp"] == 1


def test_credit_liveness_without_any_grant(QP):
    """CC-9: every MR_CREDIT dropped: the sender probes and the transfer still completes."""
    cfg = CreditConfig(link_rate_bps=10e9, base_rtt_ns=10_000, mtu=MTU, initial_credit_pkts=2)
    mgr = CreditManager(cfg)
    a, b, mem = _connect(QP, Mode.METAROCE, cc=CCConfig(line_rate_bps=10e9, base_rtt_ns=10_000),
                         credits=mgr)
    loop = EventLoop(4)
    no_credit = Impairment(drop=lambda p, i: p.opcode == O.MR_CREDIT)
    pair = Pair(loop, a, b, Impairment(), no_credit)
    data = bytes(range(256)) * 64
    pair.post_send(a, SendWR(1, WrOpcode.RDMA_WRITE, data, 0, len(data), 0x1000, 7))
    loop.run(until=10**9)
    assert [c.status for c in a.poll_cq()] == [WcStatus.SUCCESS] and mem[:len(data)] == data
    assert a.req.stats["probes"] >= 1 and b.resp.stats["probes"] >= 1


def test_credit_grant_ends_implicit_credit_for_a_lone_sender(QP):
    """CC-8: a sender starts with its initial credit; a receiver without incast answers A=0."""
    mgr = CreditManager(CreditConfig(mtu=MTU, initial_credit_pkts=2))
    a, b, _ = _connect(QP, Mode.METAROCE, cc=CFG, credits=mgr)
    a.post_send(SendWR(1, WrOpcode.RDMA_WRITE, bytes(8 * MTU), 0, 8 * MTU, 0x1000, 7), 0)
    pk = a.take_packets()
    assert len(pk) == 2 and a.req.blocked == "credit"
    b.receive(pk[0], 1000)
    grants = [p for p in b.take_packets() if p.opcode == O.MR_CREDIT]
    assert [g.grant[0] for g in grants] == [False]
    a.receive(grants[0], 3000)
    assert not a.req.credit.active and len(a.take_packets()) == 6


def test_tail_rto_is_low(QP):
    """RTO-3: with at most 4 packets outstanding the RTO is max(2 SRTT, RTO_min)."""
    a, b, _ = _connect(QP, Mode.METAROCE, cc=CFG)
    a.post_send(SendWR(1, WrOpcode.RDMA_WRITE, bytes(MTU), 0, MTU, 0x1000, 7), 0)
    b.receive(a.take_packets()[0], 50_000)           # one round trip of 100 us
    a.receive(b.take_packets()[0], 100_000)
    assert a.req.rto.srtt == 100_000
    a.post_send(SendWR(2, WrOpcode.RDMA_WRITE, bytes(MTU), 0, MTU, 0x1000, 7), 100_000)
    assert a.req.timeout_ns() == 200_000 < a.req.rto.rto_ns


def test_control_opcodes_are_ignored_in_compat_mode(QP):
    a, b, _ = _connect(QP, Mode.COMPAT)
    b.receive(P.Packet(int(O.MR_PROBE), 100, 0x22, place=P.Placement(0, 0, 0)), 0)
    a.receive(P.Packet(int(O.MR_CREDIT), 1, 0x11, grant=(True, 0, 0)), 0)
    assert b.take_packets() == [] and a.req.credit is None


# --- the rules decided in docs/engine.md, on both engines -----------------------------------------

def _pair(QP, mode, ab=None, ba=None, **modify):
    a, b, mem = _connect(QP, mode)
    for q in (a, b):
        if modify:
            q.modify(QPState.RTS, **modify)
    loop = EventLoop(5)
    return a, b, mem, loop, Pair(loop, a, b, ab or Impairment(), ba or Impairment())


def test_rto_backs_off_to_the_local_ack_timeout_not_beyond(QP):
    """RTO-1/RTO-2: RTO_max is the local ACK timeout (here 2^8 x 4.096 us = 1.05 ms). After one
    RTT sample the RTO is RTO_min (50 us); with the responder black-holed it doubles up to the
    local ACK timeout, never beyond, and the QP fails after retry_cnt expiries at it: within
    milliseconds (with a 1 s RTO_max it took seconds)."""
    a, b, _, loop, pair = _pair(QP, Mode.METAROCE, ab=Impairment(drop=lambda p, i: i >= 1),
                                retry_cnt=3)
    pair.post_send(a, SendWR(1, WrOpcode.RDMA_WRITE, b"x", 0, 1, 0x1000, 7))
    loop.run(until=20_000)
    assert [c.status for c in a.poll_cq()] == [WcStatus.SUCCESS]
    pair.post_send(a, SendWR(2, WrOpcode.RDMA_WRITE, b"y", 0, 1, 0x1000, 7))
    loop.run(until=10**9, stop=lambda: bool(a.cq))
    assert [c.status for c in a.poll_cq()] == [WcStatus.RETRY_EXC_ERR]
    sends = [t for t, _ in pair.links[id(a)].log][1:]
    gaps = [y - x for x, y in zip(sends, sends[1:])]
    top = 4096 * 2**8
    assert gaps == [50_000, 100_000, 200_000, 400_000, 800_000] + [top] * (len(gaps) - 5)
    assert len(gaps) == 5 + 3 and loop.now < 10 * top


def test_rnr_budget_is_per_psn(QP):
    """RESP-6: rnr_retry counts RNR NAKs of the same PSN; progress restores it. Three SENDs,
    each NAKed once before its receive is posted, complete with rnr_retry = 1."""
    a, b, _, loop, pair = _pair(QP, Mode.COMPAT, rnr_retry=1)
    for i in range(3):
        loop.at(i * 100_000, pair.post_send, a, SendWR(i, WrOpcode.SEND, b"m", 0, 1))
        loop.at(i * 100_000 + 5_000, pair.post_recv, b, RecvWR(i, bytearray(4)))
    loop.run(until=10**9)
    assert [(c.wr_id, c.status) for c in a.poll_cq()] == [(i, WcStatus.SUCCESS) for i in range(3)]
    assert a.req.stats["rnr"] == 3


@pytest.mark.parametrize("mode", list(Mode))
def test_the_packet_at_the_window_edge_asks_for_an_ack(QP, mode):
    """The last packet a closed window lets out carries AckReq / ACK_NOW (RESP-1; the wire's
    rule): a 20-packet WRITE through an 8-packet window completes without a timeout."""
    a, b, mem, loop, pair = _pair(QP, mode, window=8)
    data = bytes(range(256)) * 80
    pair.post_send(a, SendWR(1, WrOpcode.RDMA_WRITE, data, 0, len(data), 0x1000, 7))
    loop.run(until=100_000)                  # far below the 1 ms local ACK timeout
    assert [c.status for c in a.poll_cq()] == [WcStatus.SUCCESS] and mem[:len(data)] == data
    assert a.req.stats["timeouts"] == 0
    first8 = [p for _, p in pair.links[id(a)].log][:8]
    assert [p.ack_req for p in first8] == [False] * 7 + [True]


@pytest.mark.parametrize("mode", list(Mode))
def test_a_full_window_asks_once_per_round_trip_not_per_packet(QP, mode):
    """RESP-1: the edge of a closed window asks only when no earlier ask is unanswered. Fed
    back packet by packet (each of the responder's acknowledgements reaches the requester before
    its next packet leaves, as on the wire's synchronous path), a 512-packet WRITE through a
    32-packet window asks on its every-16th packets, its last and the edges that had no ask
    on the way: not on almost every packet (an acknowledgement that opened one PSN made the
    next packet an edge and its ask the next acknowledgement)."""
    a, b, mem = _connect(QP, mode)
    for q in (a, b):
        q.modify(QPState.RTS, window=32)
    data = bytes(range(256)) * (2 * MTU)
    a.post_send(SendWR(1, WrOpcode.RDMA_WRITE, data, 0, len(data), 0x1000, 7), 0)
    now, sent, queue = 0, [], list(a.take_packets())
    while queue and now < 10**8:
        p = queue.pop(0)
        sent.append(p)
        now += 1000
        b.receive(p, now)
        for r in b.take_packets():
            a.receive(r, now)
        queue += a.take_packets()
    assert [c.status for c in a.poll_cq()] == [WcStatus.SUCCESS] and mem[:len(data)] == data
    assert len(sent) == 512
    assert sum(p.ack_req for p in sent) <= 2 * 512 // 16 + 2
