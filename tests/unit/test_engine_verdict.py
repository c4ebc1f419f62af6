"""The pure per-packet responder decision (the contract a BPF program must match)."""

from dataclasses import replace

import pytest

from metaroce.engine.mr import Access
from metaroce.engine.packets import AtomicEth, Placement, Reth
from metaroce.engine.verdict import PktFields, RespState, Seq, Verdict, responder_verdict
from metaroce.wire.consts import Opcode as O

MRS = {7: (0x1000, 4096, int(Access.ALL_REMOTE)), 8: (0x9000, 64, int(Access.REMOTE_READ))}
C = RespState(metaroce=False, epsn=0xFFFFFF, mtu=256, recv={0: 1024}, mrs=MRS)
M = RespState(metaroce=True, epsn=0xFFFFFE, mtu=256, window=8, recv={0: 1024, 1: 100}, mrs=MRS)


def v(s, **f):
    return responder_verdict(s, PktFields(**f))


def wr_only(psn, n=16, va=0x1000, rkey=7):
    return dict(opcode=O.RC_RDMA_WRITE_ONLY, psn=psn, payload_len=n, reth=Reth(va, rkey, n))


def test_compat_in_order_accept_advances_across_wrap():
    r = v(C, **wr_only(0xFFFFFF))
    assert r.verdict is Verdict.ACCEPT and r.state.epsn == 0 and r.target == ("mr", 7, 0x1000)


def test_compat_gap_is_naked_once_then_dropped():
    r1 = v(C, **wr_only(1))
    assert r1.verdict is Verdict.NAK_SEQ and r1.state.sent_psn_nak
    r2 = v(r1.state, **wr_only(2))
    assert r2.verdict is Verdict.DROP
    r3 = v(r2.state, **wr_only(0xFFFFFF))
    assert r3.verdict is Verdict.ACCEPT and not r3.state.sent_psn_nak
    assert v(r3.state, **wr_only(5)).verdict is Verdict.NAK_SEQ  # a new gap: NAKed again


def test_compat_duplicate_window():
    assert v(C, **wr_only(0xFFFFFE)).verdict is Verdict.DUPLICATE
    assert v(C, **wr_only((0xFFFFFF - 2**23) % 2**24)).verdict is Verdict.DUPLICATE
    assert v(C, **wr_only((0xFFFFFF + 2**23 - 1) % 2**24)).verdict is Verdict.NAK_SEQ


def test_compat_write_sequence_and_lengths():
    first = dict(opcode=O.RC_RDMA_WRITE_FIRST, psn=0xFFFFFF, payload_len=256,
                 reth=Reth(0x1000, 7, 600))
    r = v(C, **first)
    assert r.verdict is Verdict.ACCEPT and r.state.seq is Seq.WRITE
    mid = v(r.state, opcode=O.RC_RDMA_WRITE_MIDDLE, psn=0, payload_len=256)
    assert mid.verdict is Verdict.ACCEPT and mid.target == ("mr", 7, 0x1100)
    bad_last = v(mid.state, opcode=O.RC_RDMA_WRITE_LAST, psn=1, payload_len=100)
    assert bad_last.verdict is Verdict.NAK_INVALID  # 88 bytes remain
    last = v(mid.state, opcode=O.RC_RDMA_WRITE_LAST, psn=1, payload_len=88)
    assert last.verdict is Verdict.ACCEPT and last.state.seq is Seq.NONE
    # a MIDDLE with no FIRST, a new FIRST inside a message
    assert v(C, opcode=O.RC_RDMA_WRITE_MIDDLE, psn=0xFFFFFF, payload_len=256).verdict \
        is Verdict.NAK_INVALID
    assert v(r.state, **wr_only(0)).verdict is Verdict.NAK_INVALID


@pytest.mark.parametrize("fields,verdict", [
    (wr_only(0xFFFFFF, 16, va=0x1000 + 4090), Verdict.NAK_ACCESS),  # past the end
    (wr_only(0xFFFFFF, 16, rkey=99), Verdict.NAK_ACCESS),  # unknown rkey
    (wr_only(0xFFFFFF, 16, va=0x9000, rkey=8), Verdict.NAK_ACCESS),  # read-only MR
    (dict(opcode=O.RC_RDMA_READ_REQUEST, psn=0xFFFFFF, reth=Reth(0x9000, 8, 65)),
     Verdict.NAK_ACCESS),
    (dict(opcode=O.RC_FETCH_ADD, psn=0xFFFFFF, atomic=AtomicEth(0x1004, 7, 1)),
     Verdict.NAK_INVALID),  # misaligned
    (dict(opcode=O.RC_FETCH_ADD, psn=0xFFFFFF, atomic=AtomicEth(0x9000, 8, 1)),
     Verdict.NAK_ACCESS),  # no atomic access
    (dict(opcode=O.RC_SEND_ONLY, psn=0xFFFFFF, payload_len=200), Verdict.ACCEPT),
    (dict(opcode=O.RC_SEND_ONLY, psn=0xFFFFFF, payload_len=300), Verdict.NAK_INVALID),
    (dict(opcode=O.MR_SEND_ONLY, psn=0xFFFFFF, payload_len=1), Verdict.DROP),  # wrong mode
])
def test_compat_checks(fields, verdict):
    assert v(C, **fields).verdict is verdict


def test_compat_rnr_when_no_receive_and_gap_not_naked():
    s = replace(C, recv={})
    r = v(s, opcode=O.RC_SEND_ONLY, psn=0xFFFFFF, payload_len=4)
    assert r.verdict is Verdict.RNR and r.state.epsn == 0xFFFFFF
    assert v(r.state, opcode=O.RC_SEND_ONLY, psn=0, payload_len=4).verdict is Verdict.DROP
    w = v(s, opcode=O.RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE, psn=0xFFFFFF, payload_len=4,
          reth=Reth(0x1000, 7, 4))
    assert w.verdict is Verdict.RNR


def test_read_consumes_one_psn_per_response():
    r = v(C, opcode=O.RC_RDMA_READ_REQUEST, psn=0xFFFFFF, reth=Reth(0x1000, 7, 257))
    assert r.verdict is Verdict.ACCEPT and r.npsn == 2 and r.state.epsn == 1


def mw(psn, off=0, n=256, length=1024):
    return dict(opcode=O.MR_RDMA_WRITE_MIDDLE, psn=psn, payload_len=n,
                reth=Reth(0x1000, 7, length), place=Placement(0, 0, off))


def test_metaroce_out_of_order_bitmap_and_cumulative_advance():
    r1 = v(M, **mw(0, off=512))  # epsn is 0xFFFFFE: this is 2 ahead
    assert r1.verdict is Verdict.ACCEPT and r1.state.epsn == 0xFFFFFE
    assert r1.state.bitmap == 0b100 and r1.target == ("mr", 7, 0x1200)
    assert v(r1.state, **mw(0, off=512)).verdict is Verdict.DUPLICATE
    r2 = v(r1.state, **mw(0xFFFFFF, off=256))
    assert r2.state.epsn == 0xFFFFFE and r2.state.bitmap == 0b110
    r3 = v(r2.state, **mw(0xFFFFFE))
    assert r3.state.epsn == 1 and r3.state.bitmap == 0
    assert v(r3.state, **mw(0xFFFFFF, off=256)).verdict is Verdict.DUPLICATE


def test_metaroce_window_and_placement_bounds():
    assert v(M, **mw(psn=(0xFFFFFE + 8) % 2**24)).verdict is Verdict.DROP
    assert v(M, **mw(psn=(0xFFFFFE + 7) % 2**24)).verdict is Verdict.ACCEPT
    assert v(M, **mw(0xFFFFFE, off=1000, n=100)).verdict is Verdict.NAK_INVALID
    assert v(M, **mw(0xFFFFFE, off=4000, n=256, length=8000)).verdict is Verdict.NAK_ACCESS
    # PLACE-2: the RETH's whole range is checked, also for a packet whose own bytes fit
    assert v(M, **mw(0xFFFFFE, off=0, n=256, length=8000)).verdict is Verdict.NAK_ACCESS
    # RESP-15 with PETH.Offset: FIRST/MIDDLE carry exactly the MTU, a FIRST starts at 0, the
    # packet that ends the message ends its DMA length
    assert v(M, **mw(0xFFFFFE, off=256, n=200)).verdict is Verdict.NAK_INVALID
    first = dict(mw(0xFFFFFE, off=256), opcode=O.MR_RDMA_WRITE_FIRST)
    assert v(M, **first).verdict is Verdict.NAK_INVALID
    last = dict(mw(0xFFFFFE, off=512, n=100), opcode=O.MR_RDMA_WRITE_LAST)
    assert v(M, **last).verdict is Verdict.NAK_INVALID
    rd = dict(opcode=O.MR_RDMA_READ_REQUEST, psn=(0xFFFFFE + 6) % 2**24,
              reth=Reth(0x1000, 7, 3 * 256), place=Placement(0, 0, 0))
    assert v(M, **rd).verdict is Verdict.DROP  # its 3 response PSNs would leave the window


def test_metaroce_read_and_atomic_ahead_are_discarded_unrecorded():
    """SACK-9/PLACE-5: a READ or atomic is executed only at ePSN; one that arrives ahead is
    discarded unrecorded, as the XDP responder does (the requester repairs it as lost)."""
    rd = dict(opcode=O.MR_RDMA_READ_REQUEST, psn=(0xFFFFFE + 1) % 2**24,
              reth=Reth(0x1000, 7, 8), place=Placement(0, 0, 0))
    r = v(M, **rd)
    assert r.verdict is Verdict.DROP and r.state == M
    at = dict(opcode=O.MR_FETCH_ADD, psn=(0xFFFFFE + 2) % 2**24,
              atomic=AtomicEth(0x1000, 7, 1), place=Placement(0, 0, 0))
    assert v(M, **at).verdict is Verdict.DROP
    assert v(M, **dict(rd, psn=0xFFFFFE)).verdict is Verdict.ACCEPT
    assert v(M, opcode=O.RC_SEND_ONLY, psn=0xFFFFFE, payload_len=1).verdict is Verdict.DROP


def test_metaroce_send_placement_by_rsn_and_rnr():
    r = v(M, opcode=O.MR_SEND_LAST, psn=0, payload_len=50, place=Placement(3, 1, 50))
    assert r.verdict is Verdict.ACCEPT and r.target == ("recv", 1, 50)
    assert v(M, opcode=O.MR_SEND_LAST, psn=0, payload_len=51, place=Placement(3, 1, 50)).verdict \
        is Verdict.NAK_INVALID
    rnr = v(M, opcode=O.MR_SEND_ONLY, psn=0, payload_len=5, place=Placement(3, 2, 0))
    assert rnr.verdict is Verdict.RNR and rnr.state == M  # not recorded


def test_verdict_is_pure():
    before = replace(M)
    a = v(M, **mw(0, off=512))
    b = v(M, **mw(0, off=512))
    assert a == b and M == before


@pytest.mark.parametrize("state,op", [(C, O.RC_SEND_ONLY_WITH_INVALIDATE),
                                      (C, O.RC_SEND_LAST_WITH_INVALIDATE),
                                      (M, O.MR_SEND_ONLY_WITH_INVALIDATE)])
def test_send_with_invalidate_is_an_invalid_request(state, op):
    """HDR-14/HDR-15: send with invalidate is optional; not implementing it, the responder
    answers an in-order one as an invalid request, never a silent drop (was DROP)."""
    place = Placement(0, 0, 0) if state.metaroce else None
    assert v(state, opcode=op, psn=state.epsn, payload_len=8, place=place).verdict \
        is Verdict.NAK_INVALID
    # PSN classes come first: a duplicate is a duplicate, a compat gap is a gap
    assert v(state, opcode=op, psn=(state.epsn - 1) % 2**24, payload_len=8,
             place=place).verdict is Verdict.DUPLICATE
    if not state.metaroce:
        assert v(state, opcode=op, psn=(state.epsn + 1) % 2**24, payload_len=8).verdict \
            is Verdict.NAK_SEQ


def test_compat_length_checks_of_resp_15():
    """RESP-15 (G12), as Linux rxe: FIRST/MIDDLE exactly the MTU, LAST 1 .. MTU, ONLY at most
    the MTU, a WRITE's packets adding up to its DMA length."""
    big = v(C, opcode=O.RC_RDMA_WRITE_ONLY, psn=0xFFFFFF, payload_len=300,
            reth=Reth(0x1000, 7, 300))
    assert big.verdict is Verdict.NAK_INVALID                  # ONLY beyond the MTU
    first = v(C, opcode=O.RC_RDMA_WRITE_FIRST, psn=0xFFFFFF, payload_len=256,
              reth=Reth(0x1000, 7, 1000))
    assert v(first.state, opcode=O.RC_RDMA_WRITE_MIDDLE, psn=0, payload_len=128).verdict \
        is Verdict.NAK_INVALID                                 # MIDDLE short of the MTU
    mid = v(first.state, opcode=O.RC_RDMA_WRITE_MIDDLE, psn=0, payload_len=256)
    assert v(mid.state, opcode=O.RC_RDMA_WRITE_LAST, psn=1, payload_len=488).verdict \
        is Verdict.NAK_INVALID                                 # LAST beyond the MTU
    sf = v(C, opcode=O.RC_SEND_FIRST, psn=0xFFFFFF, payload_len=256)
    assert sf.verdict is Verdict.ACCEPT
    assert v(sf.state, opcode=O.RC_SEND_LAST, psn=0, payload_len=0).verdict \
        is Verdict.NAK_INVALID                                 # LAST without payload (was ACCEPT)
    assert v(sf.state, opcode=O.RC_SEND_LAST, psn=0, payload_len=1).verdict is Verdict.ACCEPT
