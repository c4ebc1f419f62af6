"""The per-packet responder decision as a pure function: the boundary to the XDP data path.

``responder_verdict(state, pkt)`` sees exactly what an XDP program holds per QP (expected PSN,
receive bitmap, opcode-sequence cursor, the rkey -> bounds table, the posted receive WQE
lengths) and one packet's header fields. It returns a :class:`Verdict`, where to place the
payload, and the new values of the state fields; it never touches memory or queues.
See docs/engine.md.
"""

from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Mapping

from metaroce.wire.consts import is_metaroce

from . import packets as P
from . import psn as psnm
from .mr import Access


class Verdict(Enum):
    ACCEPT = "accept"  # new PSN: place payload, record PSN, advance ePSN over the contiguous run
    DUPLICATE = "duplicate"  # seen before: re-ACK / re-execute READ / replay saved atomic result
    DROP = "drop"  # silently discard (beyond window, gap already NAKed, wrong mode)
    NAK_SEQ = "nak_psn_seq_error"  # compat: first packet after a gap
    NAK_INVALID = "nak_invalid_request"
    NAK_ACCESS = "nak_remote_access_error"
    RNR = "rnr_nak"  # needs a receive WQE that is not posted


class Seq(Enum):
    """Compat-mode opcode-sequence cursor: inside which multi-packet message we are."""

    NONE = 0
    SEND = 1
    WRITE = 2


@dataclass(frozen=True)
class RespState:
    metaroce: bool
    epsn: int
    mtu: int
    window: int = 1
    bitmap: int = 0  # bit i set: PSN epsn+i already received (bit 0 is never set)
    sent_psn_nak: bool = False
    seq: Seq = Seq.NONE
    cur_va: int = 0  # compat WRITE cursor (next VA, rkey, bytes remaining)
    cur_rkey: int = 0
    cur_remaining: int = 0
    cur_off: int = 0  # compat SEND cursor: offset in the current receive WQE
    recv_head: int = 0  # RSN of the oldest posted, unconsumed receive WQE
    recv: Mapping[int, int] = field(default_factory=dict)  # RSN -> receive WQE length
    mrs: Mapping[int, tuple[int, int, int]] = field(default_factory=dict)  # rkey -> addr,len,access


@dataclass(frozen=True)
class PktFields:
    opcode: int
    psn: int
    payload_len: int = 0
    reth: P.Reth | None = None
    atomic: P.AtomicEth | None = None
    place: P.Placement | None = None

    @classmethod
    def of(cls, pkt: P.Packet) -> "PktFields":
        return cls(pkt.opcode, pkt.psn, len(pkt.payload), pkt.reth, pkt.atomic, pkt.place)


@dataclass(frozen=True)
class Result:
    verdict: Verdict
    state: RespState
    npsn: int = 1  # PSNs the request consumes (a READ: one per response packet)
    target: tuple | None = None  # ("mr", rkey, va) or ("recv", rsn, offset): where payload goes


def _mr_ok(s: RespState, rkey: int, va: int, length: int, need: Access) -> bool:
    b = s.mrs.get(rkey)
    return b is not None and bool(b[2] & need) and b[0] <= va and va + length <= b[0] + b[1]


def responder_verdict(s: RespState, f: PktFields) -> Result:
    """Decide one request packet. Pure: same inputs, same output."""
    if is_metaroce(f.opcode) != s.metaroce:
        return Result(Verdict.DROP, s)
    try:
        op = P.base(f.opcode)
    except ValueError:
        return Result(Verdict.NAK_INVALID, s)
    if op not in P.REQUESTS and op not in P.SEND_INVALIDATE:
        return Result(Verdict.DROP, s)
    npsn = P.npackets(f.reth.length, s.mtu) if op in P.READ_REQ and f.reth else 1
    d = psnm.diff(f.psn, s.epsn)
    if d < 0:
        return Result(Verdict.DUPLICATE, s, npsn)
    if s.metaroce:
        # SACK-1: the window holds the request's PSN; SACK-9: a READ at ePSN takes its n
        # response PSNs beyond it. A READ or atomic ahead of ePSN is discarded unrecorded (the
        # requester repairs it as lost): SACK-9 allows recording it too, the XDP responder
        # does not, and this function decides as the data path does (docs/engine.md)
        if d >= s.window:
            return Result(Verdict.DROP, s, npsn)
        if s.bitmap >> d & 1:
            return Result(Verdict.DUPLICATE, s, npsn)
        if d > 0 and op in P.READ_REQ | P.ATOMIC_REQ:
            return Result(Verdict.DROP, s, npsn)
    elif d > 0:
        if s.sent_psn_nak:
            return Result(Verdict.DROP, s, npsn)
        return Result(Verdict.NAK_SEQ, replace(s, sent_psn_nak=True), npsn)
    if op in P.SEND_INVALIDATE:             # not implemented (HDR-14): an invalid request
        return Result(Verdict.NAK_INVALID, s, npsn)
    verdict, s2, target = (_check_metaroce if s.metaroce else _check_compat)(s, f, op)
    if verdict is not Verdict.ACCEPT:
        if verdict is Verdict.RNR and not s.metaroce:
            s2 = replace(s2, sent_psn_nak=True)  # the gap behind an RNR NAK is not NAKed again
        return Result(verdict, s2, npsn)
    bm = s.bitmap | ((1 << npsn) - 1) << d
    epsn = s.epsn
    while bm & 1:
        bm >>= 1
        epsn = psnm.add(epsn, 1)
    sent_nak = s2.sent_psn_nak and d != 0
    return Result(Verdict.ACCEPT, replace(s2, epsn=epsn, bitmap=bm, sent_psn_nak=sent_nak),
                  npsn, target)


def _check_common(s: RespState, f: PktFields, op):
    """READ and ATOMIC checks shared by both modes; None when op is neither."""
    if op in P.READ_REQ:
        r = f.reth
        if r is None:
            return Verdict.NAK_INVALID, s, None
        if r.length and not _mr_ok(s, r.rkey, r.va, r.length, Access.REMOTE_READ):
            return Verdict.NAK_ACCESS, s, None
        return Verdict.ACCEPT, s, None
    if op in P.ATOMIC_REQ:
        a = f.atomic
        if a is None or a.va % 8:
            return Verdict.NAK_INVALID, s, None
        if not _mr_ok(s, a.rkey, a.va, 8, Access.REMOTE_ATOMIC):
            return Verdict.NAK_ACCESS, s, None
        return Verdict.ACCEPT, s, None
    return None


def _check_compat(s: RespState, f: PktFields, op):
    n, mtu = f.payload_len, s.mtu
    first_or_only = op in P.SEND_FIRST | P.SEND_ONLY | P.WRITE_FIRST | P.WRITE_ONLY
    if op in P.READ_REQ | P.ATOMIC_REQ or first_or_only:
        if s.seq is not Seq.NONE:
            return Verdict.NAK_INVALID, s, None
    common = _check_common(s, f, op)
    if common:
        return common
    if op in P.WRITES:
        if op in P.WRITE_FIRST | P.WRITE_ONLY:
            r = f.reth
            if r is None:
                return Verdict.NAK_INVALID, s, None
            if (op in P.WRITE_ONLY and (n != r.length or n > mtu)) or \
                    (op in P.WRITE_FIRST and (n != mtu or r.length <= mtu)):
                return Verdict.NAK_INVALID, s, None             # RESP-15
            if n and not _mr_ok(s, r.rkey, r.va, r.length, Access.REMOTE_WRITE):
                return Verdict.NAK_ACCESS, s, None
            va, rkey, remaining = r.va, r.rkey, r.length
        else:
            if s.seq is not Seq.WRITE:
                return Verdict.NAK_INVALID, s, None
            va, rkey, remaining = s.cur_va, s.cur_rkey, s.cur_remaining
            if (op in P.WRITE_MIDDLE and (n != mtu or remaining <= mtu)) or \
               (op in P.WRITE_LAST and (n != remaining or n > mtu)):
                return Verdict.NAK_INVALID, s, None             # RESP-15
        if op in P.CONSUMES_RECV and s.recv_head not in s.recv:
            return Verdict.RNR, s, None
        last = op in P.WRITE_LAST | P.WRITE_ONLY
        s2 = replace(s, seq=Seq.NONE if last else Seq.WRITE, cur_va=va + n, cur_rkey=rkey,
                     cur_remaining=remaining - n)
        return Verdict.ACCEPT, s2, ("mr", rkey, va)
    # SEND
    if op in P.SEND_FIRST | P.SEND_ONLY:
        if s.recv_head not in s.recv:
            return Verdict.RNR, s, None
        off = 0
        if (op in P.SEND_FIRST and n != mtu) or n > mtu:
            return Verdict.NAK_INVALID, s, None
    else:
        if s.seq is not Seq.SEND:
            return Verdict.NAK_INVALID, s, None
        off = s.cur_off
        if (op in P.SEND_MIDDLE and n != mtu) or n > mtu or (op in P.SEND_LAST and not n):
            return Verdict.NAK_INVALID, s, None                 # RESP-15: LAST has 1 .. MTU
    if off + n > s.recv[s.recv_head]:
        return Verdict.NAK_INVALID, s, None  # receiver: LOC_LEN_ERR
    last = op in P.SEND_LAST | P.SEND_ONLY
    s2 = replace(s, seq=Seq.NONE if last else Seq.SEND, cur_off=0 if last else off + n)
    return Verdict.ACCEPT, s2, ("recv", s.recv_head, off)


def _check_metaroce(s: RespState, f: PktFields, op):
    common = _check_common(s, f, op)
    if common:
        return common
    pl, n = f.place, f.payload_len
    if pl is None or n > s.mtu:
        return Verdict.NAK_INVALID, s, None
    ends = op not in P.SEND_FIRST | P.SEND_MIDDLE | P.WRITE_FIRST | P.WRITE_MIDDLE
    first = op in P.SEND_FIRST | P.SEND_ONLY | P.WRITE_FIRST | P.WRITE_ONLY
    if (not ends and n != s.mtu) or (first and pl.offset):
        return Verdict.NAK_INVALID, s, None                     # RESP-15 with PETH.Offset
    if op in P.WRITES:
        r = f.reth
        if r is None or pl.offset + n > r.length or (ends and pl.offset + n != r.length):
            return Verdict.NAK_INVALID, s, None
        if op in P.CONSUMES_RECV and pl.rsn not in s.recv:
            return Verdict.RNR, s, None
        # PLACE-2: the whole range of the RETH is checked before any packet of it is placed
        if r.length and not _mr_ok(s, r.rkey, r.va, r.length, Access.REMOTE_WRITE):
            return Verdict.NAK_ACCESS, s, None
        return Verdict.ACCEPT, s, ("mr", r.rkey, r.va + pl.offset)
    if pl.rsn not in s.recv:
        return Verdict.RNR, s, None
    if pl.offset + n > s.recv[pl.rsn]:
        return Verdict.NAK_INVALID, s, None
    return Verdict.ACCEPT, s, ("recv", pl.rsn, pl.offset)
