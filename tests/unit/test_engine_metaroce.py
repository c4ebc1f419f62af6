"""MetaRoCE mode: per-packet placement, SACK, hole-only retransmission, adaptive RTO."""

import pytest

from metaroce.engine import Access, Mode, QPState, RecvWR, SendWR, WcStatus, WrOpcode
from metaroce.engine import packets as P
from metaroce.engine.rto import RtoEstimator
from metaroce.sim.channel import EventLoop, Impairment, Pair
from metaroce.wire.consts import AethType, NakCode
from metaroce.wire.consts import Opcode as O
from tests.unit import engine_harness as H
from tests.unit.engine_harness import connect


@pytest.fixture(autouse=True, params=["c", "py"])
def impl(request, monkeypatch):
    """Every scenario runs on the C engine and on the Python reference model."""
    monkeypatch.setattr(H, "DEFAULT_IMPL", request.param)
    return request.param

RKEY, BASE = 7, 0x4000


def setup(ab=None, ba=None, psn=0xFFFFFA, **kw):
    a, b = connect(Mode.METAROCE, psn, (psn + 1) % 2**24, **kw)
    mem = bytearray(16384)
    b.mrs.register(RKEY, BASE, mem, Access.ALL_REMOTE)
    loop = EventLoop(2)
    return a, b, mem, loop, Pair(loop, a, b, ab or Impairment(), ba or Impairment())


def sent(pair, qp):
    return [p for _, p in pair.links[id(qp)].log]


def test_every_data_packet_carries_placement():
    a, b = connect(Mode.METAROCE, 0xFFFFFF, 0)
    a.post_send(SendWR(1, WrOpcode.RDMA_WRITE, bytes(600), 0, 600, BASE, RKEY))
    a.post_send(SendWR(2, WrOpcode.SEND, bytes(300), 0, 300))
    a.post_send(SendWR(3, WrOpcode.RDMA_WRITE_WITH_IMM, bytes(1), 0, 1, BASE, RKEY, imm=4))
    a.post_send(SendWR(4, WrOpcode.SEND, bytes(1), 0, 1))
    pk = a.take_packets()
    assert [p.opcode for p in pk] == [O.MR_RDMA_WRITE_FIRST, O.MR_RDMA_WRITE_MIDDLE,
                                      O.MR_RDMA_WRITE_LAST, O.MR_SEND_FIRST, O.MR_SEND_LAST,
                                      O.MR_RDMA_WRITE_ONLY_WITH_IMMEDIATE, O.MR_SEND_ONLY]
    assert all(p.reth == P.Reth(BASE, RKEY, 600) for p in pk[:3])
    assert [(p.place.ssn, p.place.rsn, p.place.offset) for p in pk] == [
        (0, 0, 0), (0, 0, 256), (0, 0, 512), (1, 0, 0), (1, 0, 256), (2, 1, 0), (3, 2, 0)]


def test_only_the_hole_is_retransmitted():
    drop = lambda p, i: i == 4
    a, b, mem, loop, pair = setup(ab=Impairment(drop=drop))
    data = bytes(range(256)) * 20
    pair.post_send(a, SendWR(1, WrOpcode.RDMA_WRITE, data, 0, 5120, BASE, RKEY))
    loop.run()
    assert [c.status for c in a.poll_cq()] == [WcStatus.SUCCESS] and bytes(mem[:5120]) == data
    assert a.req.stats == dict(a.req.stats, tx=20, retx=1, timeouts=0)
    retx = [p for p in sent(pair, a) if p.retx]
    assert [p.place.offset for p in retx] == [4 * 256] and retx[0].ack_req
    sacks = sent(pair, b)
    assert all(p.opcode == O.MR_SACK for p in sacks)
    first = next(p for p in sacks if p.sack)
    assert first.psn == (0xFFFFFA + 3) % 2**24 and first.sack == 1  # cum=PSN 3, PSN 5 held
    assert not any(p.aeth.syndrome == 0x60 for p in sacks)  # EXT-6: no PSN-sequence NAKs


def test_reordered_packets_are_placed_not_dropped():
    a, b, mem, loop, pair = setup(ab=Impairment(jitter_ns=20_000))
    data = bytes(reversed(range(256))) * 30
    pair.post_send(a, SendWR(1, WrOpcode.RDMA_WRITE, data, 0, 7680, BASE, RKEY))
    loop.run()
    assert bytes(mem[:7680]) == data
    assert b.resp.stats["accept"] == 30 and b.resp.stats["drop"] == 0
    assert a.req.stats["timeouts"] == 0


def test_out_of_order_sends_complete_in_order():
    a, b, mem, loop, pair = setup(ab=Impairment(jitter_ns=30_000))
    bufs = [bytearray(600) for _ in range(6)]
    for i, buf in enumerate(bufs):
        pair.post_recv(b, RecvWR(i, buf))
    msgs = [bytes([i]) * (100 * i + 50) for i in range(6)]
    for i, m in enumerate(msgs):
        pair.post_send(a, SendWR(i, WrOpcode.SEND, m, 0, len(m)))
    loop.run()
    assert [(c.wr_id, c.byte_len) for c in b.poll_cq()] == [(i, len(m)) for i, m in enumerate(msgs)]
    assert all(bytes(buf[:len(m)]) == m for buf, m in zip(bufs, msgs))
    assert [c.wr_id for c in a.poll_cq()] == list(range(6))


def first_copy_of(offsets):
    """Drop the first transmission of the READ responses at these offsets."""
    left = set(offsets)

    def drop(p, i):
        if P.base(p.opcode) in P.READ_RESP and p.place.offset in left:
            left.discard(p.place.offset)
            return True
        return False
    return drop


def test_lost_read_responses_recovered_and_read_waits_for_them():
    lose = first_copy_of((256, 512))
    a, b, mem, loop, pair = setup(ba=Impairment(drop=lose))
    mem[:2048] = bytes(range(256)) * 8
    out = bytearray(2048)
    pair.post_send(a, SendWR(1, WrOpcode.RDMA_READ, out, 0, 2048, BASE, RKEY))
    pair.post_send(a, SendWR(2, WrOpcode.RDMA_WRITE, b"w", 0, 1, BASE + 4000, RKEY))
    loop.run()
    assert [(c.wr_id, c.status) for c in a.poll_cq()] == [(1, WcStatus.SUCCESS),
                                                           (2, WcStatus.SUCCESS)]
    assert out == mem[:2048]
    rereads = [p for p in sent(pair, a) if p.opcode == O.MR_RDMA_READ_REQUEST and p.retx]
    assert [(p.reth.va - BASE, p.place.offset) for p in rereads] == [(256, 256)]


def test_remote_access_error_is_a_nak_sack():
    a, b, mem, loop, pair = setup()
    pair.post_send(a, SendWR(1, WrOpcode.RDMA_WRITE, b"x" * 300, 0, 300, BASE + 16300, RKEY))
    pair.post_send(a, SendWR(2, WrOpcode.SEND, b"n", 0, 1))
    loop.run()
    assert [(c.wr_id, c.status) for c in a.poll_cq()] == [(1, WcStatus.REM_ACCESS_ERR),
                                                           (2, WcStatus.WR_FLUSH_ERR)]
    nak = [p for p in sent(pair, b) if p.aeth.syndrome & 0x60 == AethType.NAK]
    assert nak and nak[0].aeth.syndrome == 0x60 | NakCode.REMOTE_ACCESS_ERROR and nak[0].sack == 0
    assert a.state is QPState.ERR and b.state is QPState.ERR


def test_rnr_in_metaroce_mode():
    a, b, mem, loop, pair = setup()
    buf = bytearray(16)
    pair.post_send(a, SendWR(1, WrOpcode.SEND, b"late", 0, 4))
    loop.at(30_000, pair.post_recv, b, RecvWR(5, buf))
    loop.run()
    assert [c.status for c in a.poll_cq()] == [WcStatus.SUCCESS] and buf[:4] == b"late"
    assert a.req.stats["rnr"] >= 1 and b.resp.stats["rnr_nak"] == a.req.stats["rnr"]


def test_adaptive_rto_tracks_rtt():
    a, b, mem, loop, pair = setup(ab=Impairment(delay_ns=3_000), ba=Impairment(delay_ns=3_000))
    for i in range(20):
        pair.post_send(a, SendWR(i, WrOpcode.RDMA_WRITE, b"r", 0, 1, BASE + i, RKEY))
        loop.run()
    rto = a.req.rto
    assert rto.samples >= 20 and 6_000 <= rto.srtt <= 7_000
    assert rto.rto_ns < a.attr.local_ack_timeout_ns and rto.rto_ns >= rto.min


def test_rfc6298_estimator_and_backoff():
    e = RtoEstimator(initial_ns=1_000_000, min_ns=1_000, max_ns=10**9, granularity_ns=1)
    assert e.rto_ns == 1_000_000
    e.sample(100_000)
    assert e.srtt == 100_000 and e.rttvar == 50_000 and e.rto_ns == 300_000
    e.sample(200_000)
    assert e.rttvar == pytest.approx(0.75 * 50_000 + 0.25 * 100_000)
    assert e.srtt == pytest.approx(0.875 * 100_000 + 0.125 * 200_000)
    base = e.rto_ns
    e.on_timeout()
    e.on_timeout()
    assert e.rto_ns == 4 * base
    e.on_progress()
    assert e.rto_ns == base
    assert RtoEstimator(1, min_ns=50).rto_ns == 50


def test_an_echo_samples_the_retransmission_not_the_first_send():
    """RTO-1: the timestamp echo names the copy that arrived, so a retransmitted PSN gives a
    sample (Karn's rule is for the sender's own send times) and it is the retransmission's RTT,
    not the time since the first transmission (which includes the timeout)."""
    drop = lambda p, i: i == 0
    a, b, mem, loop, pair = setup(ab=Impairment(drop=drop))
    pair.post_send(a, SendWR(1, WrOpcode.RDMA_WRITE, b"k", 0, 1, BASE, RKEY))
    loop.run()
    assert [c.status for c in a.poll_cq()] == [WcStatus.SUCCESS]
    assert a.req.stats["timeouts"] == 1 and a.req.rto.samples == 1
    assert a.req.rto.srtt < a.req.rto.max / 4              # the timeout is RTO_max here


def test_rto_defaults_of_the_spec():
    """RTO-1/PAR-2: RTO_min 50 us, G 5 us, RTO_max = the local ACK timeout (was max(it, 1 s)),
    and RTO = RTO_max before the first sample (was a 10 us floor, 1 us G)."""
    e = RtoEstimator(initial_ns=10**6)
    e.sample(1_000)
    assert e.rto_ns == 50_000                        # SRTT 1 us + max(4 x 0.5 us, 5 us) < RTO_min
    e = RtoEstimator(initial_ns=10**6, min_ns=1)
    for _ in range(20):
        e.sample(10_000)                             # RTTVAR falls below G / 4
    assert e.rto_ns == int(e.srtt + 5_000)
    a, b, mem, loop, pair = setup(timeout=14)
    assert a.req.rto.max == 4096 << 14 == a.req.rto.rto_ns   # before a sample: RTO_max
    a, b, mem, loop, pair = setup(timeout=0)
    assert a.req.rto.max == 10**9                    # RTO-4: 1 s with an infinite timeout


def test_infinite_timeout_retransmits_but_never_fails():
    """RTO-4 (C9): timeout 0 in MetaRoCE mode still repairs a loss with the RTO, but its
    expiries consume no retry_cnt: a responder silent for 12 s does not fail the QP."""
    silent_until = 12 * 10**9
    drop = lambda p, i: loop.now < silent_until
    a, b, mem, loop, pair = setup(ab=Impairment(drop=drop), timeout=0, retry_cnt=2)
    pair.post_send(a, SendWR(1, WrOpcode.RDMA_WRITE, b"patient", 0, 7, BASE, RKEY))
    loop.run(until=silent_until + 3 * 10**9)
    assert [(c.wr_id, c.status) for c in a.poll_cq()] == [(1, WcStatus.SUCCESS)]
    assert a.req.stats["timeouts"] > 2 + 3 and a.req.rto.max == 10**9
    assert bytes(mem[:7]) == b"patient"


def test_a_read_larger_than_the_window():
    """SACK-9 (G2): the window bounds a request's PSN, not its responses': a READ of 4 W MTUs
    is answered in full and the requests after it go once the responses arrived (the engine
    refused such a READ at post time, and its responder dropped it)."""
    a, b, mem, loop, pair = setup(window=8)
    mem[:] = bytes(range(256)) * 64
    n = 4 * 8 * 256                                  # 32 MTUs, window 8
    buf = bytearray(n)
    pair.post_send(a, SendWR(1, WrOpcode.RDMA_READ, buf, 0, n, BASE, RKEY))
    pair.post_send(a, SendWR(2, WrOpcode.RDMA_WRITE, b"after", 0, 5, BASE + n, RKEY))
    loop.run()
    assert [(c.wr_id, c.status) for c in a.poll_cq()] == [(1, WcStatus.SUCCESS),
                                                           (2, WcStatus.SUCCESS)]
    assert bytes(buf) == bytes(mem[:n]) and bytes(mem[n:n + 5]) == b"after"


def test_a_window_raised_in_rts_is_used():
    """The PSN window may be raised in RTS (RTS -> RTS): the requester then sends up to the new
    window at once (the C engine refused a window larger than the one its scoreboard was sized
    for at RTS; the scoreboard grows now, as for a READ larger than any before, SACK-9)."""
    a = H.IMPLS[H.DEFAULT_IMPL](0x11, Mode.METAROCE, H.MRTable())
    a.modify(QPState.INIT)
    a.modify(QPState.RTR, dest_qpn=0x22, rq_psn=0, path_mtu=256, window=8)
    a.modify(QPState.RTS, sq_psn=0xFFFFF0)
    a.post_send(SendWR(1, WrOpcode.RDMA_WRITE, bytes(290 * 256), 0, 290 * 256, BASE, RKEY))
    assert len(a.take_packets()) == 8
    a.modify(QPState.RTS, window=300)
    a.post_send(SendWR(2, WrOpcode.RDMA_WRITE, bytes(1), 0, 1, BASE, RKEY))
    assert [p.psn for p in a.take_packets()] == [(0xFFFFF8 + i) % 2**24 for i in range(283)]
