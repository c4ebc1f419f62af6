"""Compat mode (RoCEv2 RC go-back-N): targeted scenarios with deterministic impairments."""

import pytest

from metaroce.engine import Access, Mode, QPState, RecvWR, SendWR, WcStatus, WrOpcode
from metaroce.engine import packets as P
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


def setup(mode=Mode.COMPAT, ab=None, ba=None, psn=0xFFFFF8, **kw):
    a, b = connect(mode, psn, (psn + 3) % 2**24, **kw)
    mem = bytearray(8192)
    b.mrs.register(RKEY, BASE, mem, Access.ALL_REMOTE)
    loop = EventLoop(1)
    return a, b, mem, loop, Pair(loop, a, b, ab or Impairment(), ba or Impairment())


def acks(pair, qp):
    return [p for _, p in pair.links[id(qp)].log if P.base(p.opcode) is O.RC_ACKNOWLEDGE]


def test_segmentation_opcodes_reth_ackreq_imm():
    a, b = connect(Mode.COMPAT, 0xFFFFFF, 0)
    a.post_send(SendWR(1, WrOpcode.RDMA_WRITE_WITH_IMM, bytes(600), 0, 600, BASE, RKEY, imm=9))
    a.post_send(SendWR(2, WrOpcode.SEND, bytes(256), 0, 256))
    a.post_send(SendWR(3, WrOpcode.RDMA_READ, bytearray(700), 0, 700, BASE, RKEY))
    a.post_send(SendWR(4, WrOpcode.RDMA_WRITE, bytes(100), 0, 100, BASE, RKEY))
    pk = a.take_packets()
    assert [P.base(p.opcode) for p in pk] == [
        O.RC_RDMA_WRITE_FIRST, O.RC_RDMA_WRITE_MIDDLE, O.RC_RDMA_WRITE_LAST_WITH_IMMEDIATE,
        O.RC_SEND_ONLY, O.RC_RDMA_READ_REQUEST, O.RC_RDMA_WRITE_ONLY]
    assert [p.psn for p in pk] == [0xFFFFFF, 0, 1, 2, 3, 6]  # the READ consumes 3 PSNs
    assert [p.reth is not None for p in pk] == [True, False, False, False, True, True]
    assert [p.immdt for p in pk[:3]] == [None, None, 9]
    assert [len(p.payload) for p in pk] == [256, 256, 88, 256, 0, 100]
    assert [p.ack_req for p in pk] == [False, False, True, True, True, True]
    assert all(p.place is None and p.dest_qp == 0x22 for p in pk)


def test_ack_coalescing_and_msn():
    a, b, mem, loop, pair = setup()
    data = bytes(range(256)) * 20
    pair.post_send(a, SendWR(1, WrOpcode.RDMA_WRITE, data, 0, 40 * 128, BASE, RKEY))
    pair.post_send(a, SendWR(2, WrOpcode.RDMA_WRITE, data, 0, 10, BASE, RKEY))
    loop.run()
    assert [c.status for c in a.poll_cq()] == [WcStatus.SUCCESS] * 2
    got = acks(pair, b)
    assert len(got) == 3  # AckReq on packet 16, on the LAST (20) and on the ONLY
    assert [x.aeth.msn for x in got] == [0, 1, 2]
    assert bytes(mem[:10]) == data[:10] and bytes(mem[10:5120]) == data[10:5120]


def test_gap_naked_once_and_go_back_n():
    drop = lambda p, i: i == 2  # the third data packet, first transmission only
    a, b, mem, loop, pair = setup(ab=Impairment(drop=drop))
    data = bytes(range(256)) * 10
    pair.post_send(a, SendWR(1, WrOpcode.RDMA_WRITE, data, 0, 2560, BASE, RKEY))
    loop.run()
    assert [c.status for c in a.poll_cq()] == [WcStatus.SUCCESS]
    naks = [x for x in acks(pair, b) if x.aeth.syndrome == 0x60 | NakCode.PSN_SEQ_ERROR]
    assert len(naks) == 1 and naks[0].psn == (0xFFFFF8 + 2) % 2**24
    assert b.resp.stats["drop"] == 6  # packets 4..10 after the gap: one NAKed, six dropped
    assert a.req.stats["retx"] == 8 and a.req.stats["timeouts"] == 0  # resent from the hole
    assert bytes(mem[:2560]) == data


def test_rnr_then_receive_posted():
    a, b, mem, loop, pair = setup()
    buf = bytearray(64)
    pair.post_send(a, SendWR(1, WrOpcode.SEND, b"hello", 0, 5))
    loop.at(50_000, pair.post_recv, b, RecvWR(9, buf))
    loop.run()
    assert [(c.wr_id, c.status) for c in a.poll_cq()] == [(1, WcStatus.SUCCESS)]
    assert [(c.wr_id, c.byte_len) for c in b.poll_cq()] == [(9, 5)] and buf[:5] == b"hello"
    rnrs = [x for x in acks(pair, b) if x.aeth.syndrome & 0x60 == AethType.RNR_NAK]
    assert len(rnrs) == a.req.stats["rnr"] >= 2 and rnrs[0].aeth.syndrome == 0x20 | 1


def test_rnr_retry_exceeded_flushes_the_rest():
    a, b, mem, loop, pair = setup(rnr_retry=2)
    pair.post_send(a, SendWR(1, WrOpcode.SEND, b"x", 0, 1))
    pair.post_send(a, SendWR(2, WrOpcode.RDMA_WRITE, b"y", 0, 1, BASE, RKEY))
    loop.run()
    assert [(c.wr_id, c.status) for c in a.poll_cq()] == [
        (1, WcStatus.RNR_RETRY_EXC_ERR), (2, WcStatus.WR_FLUSH_ERR)]
    assert a.state is QPState.ERR and a.req.stats["rnr"] == 3


def test_retry_exceeded_after_retry_cnt_timeouts():
    a, b, mem, loop, pair = setup(ab=Impairment(loss=1.0), retry_cnt=3, timeout=5)
    pair.post_send(a, SendWR(1, WrOpcode.RDMA_WRITE, b"z", 0, 1, BASE, RKEY))
    loop.run()
    assert [(c.wr_id, c.status) for c in a.poll_cq()] == [(1, WcStatus.RETRY_EXC_ERR)]
    assert a.req.stats["timeouts"] == 4 and loop.now == 4 * 4096 * 2**5
    assert pair.links[id(a)].sent == 4  # first transmission + 3 retries


def test_remote_access_error_moves_both_to_err():
    a, b, mem, loop, pair = setup()
    b.post_recv(RecvWR(50, bytearray(8)))
    pair.post_send(a, SendWR(1, WrOpcode.RDMA_WRITE, b"ok", 0, 2, BASE, RKEY))
    pair.post_send(a, SendWR(2, WrOpcode.RDMA_WRITE, b"bad", 0, 3, BASE + 8190, RKEY))
    pair.post_send(a, SendWR(3, WrOpcode.SEND, b"never", 0, 5))
    loop.run()
    assert [(c.wr_id, c.status) for c in a.poll_cq()] == [
        (1, WcStatus.SUCCESS), (2, WcStatus.REM_ACCESS_ERR), (3, WcStatus.WR_FLUSH_ERR)]
    assert a.state is QPState.ERR and b.state is QPState.ERR
    assert [(c.wr_id, c.status) for c in b.poll_cq()] == [(50, WcStatus.WR_FLUSH_ERR)]
    assert mem[8190:8192] == b"\0\0" and mem[:2] == b"ok"


def test_send_too_long_for_receive_buffer():
    a, b, mem, loop, pair = setup()
    pair.post_recv(b, RecvWR(50, bytearray(4)))
    pair.post_send(a, SendWR(1, WrOpcode.SEND, b"toolong", 0, 7))
    loop.run()
    assert [(c.wr_id, c.status) for c in a.poll_cq()] == [(1, WcStatus.REM_INV_REQ_ERR)]


def test_duplicate_atomic_returns_saved_result_not_reapplied():
    lose_first_atomic_ack = lambda p, i: P.base(p.opcode) is O.RC_ATOMIC_ACKNOWLEDGE and i == 0
    a, b, mem, loop, pair = setup(ba=Impairment(drop=lose_first_atomic_ack))
    mem[0:8] = (40).to_bytes(8, "little")
    res = bytearray(8)
    pair.post_send(a, SendWR(1, WrOpcode.ATOMIC_FETCH_AND_ADD, res, 0, 8, BASE, RKEY,
                             compare_add=2))
    loop.run()
    assert [c.status for c in a.poll_cq()] == [WcStatus.SUCCESS]
    assert b.resp.stats["duplicate"] == 1 and a.req.stats["timeouts"] == 1
    assert int.from_bytes(res, "little") == 40 and int.from_bytes(mem[:8], "little") == 42


def test_compare_swap():
    a, b, mem, loop, pair = setup()
    mem[8:16] = (5).to_bytes(8, "little")
    r1, r2 = bytearray(8), bytearray(8)
    pair.post_send(a, SendWR(1, WrOpcode.ATOMIC_CMP_AND_SWP, r1, 0, 8, BASE + 8, RKEY,
                             compare_add=5, swap=77))
    pair.post_send(a, SendWR(2, WrOpcode.ATOMIC_CMP_AND_SWP, r2, 0, 8, BASE + 8, RKEY,
                             compare_add=5, swap=99))
    loop.run()
    assert int.from_bytes(r1, "little") == 5 and int.from_bytes(r2, "little") == 77
    assert int.from_bytes(mem[8:16], "little") == 77


def test_lost_read_response_is_re_read_from_the_missing_psn():
    lose = lambda p, i: P.base(p.opcode) is O.RC_RDMA_READ_RESPONSE_MIDDLE and i == 1
    a, b, mem, loop, pair = setup(ba=Impairment(drop=lose))
    mem[:1024] = bytes(range(256)) * 4
    out = bytearray(1024)
    pair.post_send(a, SendWR(1, WrOpcode.RDMA_READ, out, 0, 1024, BASE, RKEY))
    loop.run()
    assert [c.status for c in a.poll_cq()] == [WcStatus.SUCCESS] and out == mem[:1024]
    reqs = [p for _, p in pair.links[id(a)].log]
    assert [(p.reth.va - BASE, p.reth.length) for p in reqs] == [(0, 1024), (256, 768)]


def test_completion_waits_for_read_response_even_after_later_ack():
    """A READ followed by a WRITE: the WRITE's ACK must not complete the READ."""
    lose = lambda p, i: P.base(p.opcode) in P.READ_RESP and i == 0
    a, b, mem, loop, pair = setup(ba=Impairment(drop=lose))
    out = bytearray(16)
    mem[:16] = b"0123456789abcdef"
    pair.post_send(a, SendWR(1, WrOpcode.RDMA_READ, out, 0, 16, BASE, RKEY))
    pair.post_send(a, SendWR(2, WrOpcode.RDMA_WRITE, b"w", 0, 1, BASE + 100, RKEY))
    loop.run()
    assert [(c.wr_id, c.status) for c in a.poll_cq()] == [(1, WcStatus.SUCCESS),
                                                           (2, WcStatus.SUCCESS)]
    assert out == mem[:16]


def test_every_duplicate_write_is_re_acked():
    """RESP-4 / RESP-16: a duplicate SEND or WRITE is acknowledged again (ePSN - 1, the MSN)
    with or without AckReq, as current Linux rxe and the XDP data path do (the engine answered
    only duplicates with AckReq)."""
    a, b, mem, loop, pair = setup()
    e = 0xFFFFF8                                     # b's expected PSN (a's start PSN)
    w = P.Packet(int(O.RC_RDMA_WRITE_ONLY), e, 0x22, ack_req=True, reth=P.Reth(BASE, RKEY, 4),
                 payload=b"once")
    b.receive(w, 0)
    assert [(p.opcode, p.psn) for p in b.take_packets()] == [(O.RC_ACKNOWLEDGE, e)]
    for ack_req in (False, True):
        b.receive(P.Packet(int(O.RC_RDMA_WRITE_ONLY), e, 0x22, ack_req=ack_req,
                           reth=P.Reth(BASE, RKEY, 4), payload=b"TWCE"), 10)
        out = b.take_packets()
        assert [(p.opcode, p.psn, p.aeth.msn) for p in out] == [(O.RC_ACKNOWLEDGE, e, 1)]
    assert bytes(mem[:4]) == b"once"                 # never executed twice
