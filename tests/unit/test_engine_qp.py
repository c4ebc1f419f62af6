"""QP state machine, attributes, posting rules and flushing on error."""

import pytest

from metaroce import cengine
from metaroce import engine as pyengine
from metaroce.engine import Mode, QPAttr, QPState, QPStateError, RecvWR, SendWR, WcStatus, WrOpcode
from metaroce.engine.qp import check_transition, rnr_timer_ns


@pytest.fixture(params=[cengine.QueuePair, pyengine.QueuePair], ids=["c", "py"])
def QueuePair(request):
    """The C engine and the Python reference model take the same verbs."""
    return request.param

S = QPState
LEGAL = [(S.RESET, S.INIT), (S.INIT, S.RTR), (S.RTR, S.RTS), (S.RTS, S.SQD), (S.SQD, S.RTS),
         (S.SQE, S.RTS), (S.RTS, S.ERR), (S.ERR, S.RESET), (S.INIT, S.INIT), (S.RTS, S.RTS)]
ILLEGAL = [(S.RESET, S.RTR), (S.RESET, S.RTS), (S.INIT, S.RTS), (S.RTR, S.SQD), (S.ERR, S.RTS),
           (S.ERR, S.INIT), (S.RTR, S.RTR), (S.SQD, S.INIT)]


@pytest.mark.parametrize("cur,new", LEGAL)
def test_legal_transitions(cur, new):
    check_transition(cur, new)


@pytest.mark.parametrize("cur,new", ILLEGAL)
def test_illegal_transitions_raise(cur, new):
    with pytest.raises(QPStateError, match=f"{cur.value} -> {new.value}"):
        check_transition(cur, new)


def test_every_state_can_reset_and_error():
    for s in S:
        check_transition(s, S.RESET)
        check_transition(s, S.ERR)


def test_modify_path_and_illegal_modify(QueuePair):
    qp = QueuePair(5)
    with pytest.raises(QPStateError):
        qp.modify(S.RTS)
    qp.modify(S.INIT)
    qp.modify(S.RTR, dest_qpn=9, rq_psn=0xFFFFFE, path_mtu=4096)
    assert qp.resp.state.epsn == 0xFFFFFE
    qp.modify(S.RTS, sq_psn=0x123456, timeout=14, retry_cnt=3, rnr_retry=2)
    assert qp.req.nxt == 0x123456 and qp.state is S.RTS


@pytest.mark.parametrize("bad", [dict(path_mtu=1000), dict(timeout=32), dict(retry_cnt=8),
                                 dict(rnr_retry=9), dict(sq_psn=1 << 24), dict(window=0)])
def test_attribute_validation(bad, QueuePair):
    qp = QueuePair(5)
    qp.modify(S.INIT)
    with pytest.raises(ValueError):
        qp.modify(S.RTR, **bad)
    assert qp.state is S.INIT


def test_local_ack_timeout_and_rnr_table():
    assert QPAttr(1, timeout=0).local_ack_timeout_ns is None
    assert QPAttr(1, timeout=1).local_ack_timeout_ns == 8192
    assert QPAttr(1, timeout=14).local_ack_timeout_ns == 4096 * 2**14  # ~67 ms
    assert rnr_timer_ns(0) == 655_360_000 and rnr_timer_ns(1) == 10_000


def test_post_rules(QueuePair):
    qp = QueuePair(5)
    wr = SendWR(1, WrOpcode.SEND, b"x", 0, 1)
    with pytest.raises(QPStateError):
        qp.post_recv(RecvWR(1, bytearray(4)))
    qp.modify(S.INIT)
    qp.post_recv(RecvWR(1, bytearray(4)))  # allowed from INIT on
    with pytest.raises(QPStateError):
        qp.post_send(wr)
    with pytest.raises(ValueError):
        SendWR(2, WrOpcode.SEND, b"abc", 2, 5)
    with pytest.raises(ValueError):
        SendWR(2, WrOpcode.SEND_WITH_IMM, b"abc", 0, 3)


def test_error_flushes_everything_in_order(QueuePair):
    qp = QueuePair(5, Mode.COMPAT)
    qp.modify(S.INIT)
    qp.modify(S.RTR, dest_qpn=6)
    qp.modify(S.RTS)
    qp.post_recv(RecvWR(100, bytearray(8)))
    for i in range(3):
        qp.post_send(SendWR(i, WrOpcode.SEND, b"abcd", 0, 4))
    assert qp.take_packets()
    qp.modify(S.ERR)
    cqes = qp.poll_cq()
    assert [(c.wr_id, c.status) for c in cqes] == [
        (0, WcStatus.WR_FLUSH_ERR), (1, WcStatus.WR_FLUSH_ERR), (2, WcStatus.WR_FLUSH_ERR),
        (100, WcStatus.WR_FLUSH_ERR)]
    qp.post_send(SendWR(7, WrOpcode.SEND, b"", 0, 0))
    assert [(c.wr_id, c.status) for c in qp.poll_cq()] == [(7, WcStatus.WR_FLUSH_ERR)]


def test_sqd_drains_but_issues_nothing_new(QueuePair):
    qp = QueuePair(5)
    qp.modify(S.INIT)
    qp.modify(S.RTR, dest_qpn=6)
    qp.modify(S.RTS)
    qp.post_send(SendWR(1, WrOpcode.SEND, b"a", 0, 1))
    assert len(qp.take_packets()) == 1
    qp.modify(S.SQD)
    qp.post_send(SendWR(2, WrOpcode.SEND, b"b", 0, 1))
    assert qp.take_packets() == []
    qp.modify(S.RTS)
    qp.post_send(SendWR(3, WrOpcode.SEND, b"c", 0, 1))
    assert [p.payload for p in qp.take_packets()] == [b"b", b"c"]


def test_unknown_test_break_rejected(QueuePair):
    with pytest.raises(ValueError):
        QueuePair(1, _test_break="typo")
