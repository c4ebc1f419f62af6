"""Responder: applies the per-packet verdict, places data, executes READ/ATOMIC in PSN order,
delivers receive completions in order, and generates ACK / NAK / RNR NAK / SACK / responses."""

from collections import OrderedDict, deque
from dataclasses import dataclass, replace

from metaroce.wire.consts import AETH_ACK_UNLIMITED, MSN_MASK, SACK_BITMAP_BITS, AethType, NakCode
from metaroce.wire.consts import Opcode as O

from . import packets as P
from . import psn as psnm
from .qp import Mode
from .verdict import PktFields, RespState, Verdict, responder_verdict
from .wr import Completion, RecvWR, WcOpcode, WcStatus

ACK_SYNDROME = int(AethType.ACK) | AETH_ACK_UNLIMITED


@dataclass
class _Pending:
    """A recorded request packet waiting for ePSN to pass it (in-order side effects)."""

    op: O
    pkt: P.Packet
    target: tuple | None
    msg_len: int


class Responder:
    def __init__(self, qp):
        self.qp = qp
        self.epsn = 0
        self.state = None  # RespState, built at RTR
        self.msn = 0
        self.recv: deque[RecvWR] = deque()
        self.recv_head = 0
        self.pending: dict[int, _Pending] = {}
        self.atomic_results: OrderedDict[int, int] = OrderedDict()
        self._cur_len = 0  # compat: length of the WRITE/SEND message in progress
        self.stats = {v.value: 0 for v in Verdict}

    @property
    def metaroce(self) -> bool:
        return self.qp.mode is Mode.METAROCE

    def start(self, rq_psn: int) -> None:
        a = self.qp.attr
        self.state = RespState(metaroce=self.metaroce, epsn=rq_psn, mtu=a.path_mtu,
                               window=a.window if self.metaroce else 1)

    def post_recv(self, wr: RecvWR) -> None:
        self.recv.append(wr)

    def snapshot(self) -> RespState:
        """The verdict inputs, as an XDP program would hold them in maps."""
        recv = {self.recv_head + i: w.length for i, w in enumerate(self.recv)}
        return replace(self.state, recv_head=self.recv_head, recv=recv,
                       mrs=self.qp.mrs.bounds())

    # --- packet path --------------------------------------------------------------------------
    def handle(self, pkt: P.Packet, now: int) -> None:
        res = responder_verdict(self.snapshot(), PktFields.of(pkt))
        self.stats[res.verdict.value] += 1
        old_epsn = self.state.epsn
        self.state = replace(res.state, recv={}, mrs={})
        v = res.verdict
        op = P.base(pkt.opcode)
        if v is Verdict.ACCEPT:
            self._accept(pkt, op, res, old_epsn)
        elif v is Verdict.DUPLICATE:
            self._duplicate(pkt, op, res)
        elif v is Verdict.NAK_SEQ:
            self._ack(self._nak(NakCode.PSN_SEQ_ERROR), self.state.epsn)  # NAK names ePSN
        elif v is Verdict.RNR:
            syn = int(AethType.RNR_NAK) | self.qp.attr.min_rnr_timer
            self._ack(syn, pkt.psn if not self.metaroce else psnm.add(self.state.epsn, -1))
        elif v in (Verdict.NAK_INVALID, Verdict.NAK_ACCESS):
            code = NakCode.INVALID_REQUEST if v is Verdict.NAK_INVALID else NakCode.REMOTE_ACCESS_ERROR
            self._ack(self._nak(code), pkt.psn, fatal=True)
            self.qp.responder_error()

    @staticmethod
    def _nak(code: NakCode) -> int:
        return int(AethType.NAK) | int(code)

    def _accept(self, pkt, op, res, old_epsn) -> None:
        if res.target and pkt.payload:
            self._place(res.target, pkt.payload)
        if op in P.SEND_FIRST | P.SEND_ONLY | P.WRITE_FIRST | P.WRITE_ONLY:
            self._cur_len = 0
        self._cur_len += len(pkt.payload)
        msg_len = (pkt.place.offset + len(pkt.payload)) if self.metaroce and op in P.SENDS \
            else (pkt.reth.length if self.metaroce and pkt.reth else self._cur_len)
        self.pending[pkt.psn] = _Pending(op, pkt, res.target, msg_len)
        # in-order side effects for every PSN ePSN moved over
        for i in range(psnm.distance(self.state.epsn, old_epsn)):
            p = self.pending.pop(psnm.add(old_epsn, i), None)
            if p is not None:
                self._in_order(p)
        if self.qp.state_is_err():
            return
        if self.metaroce:
            ooo = psnm.diff(pkt.psn, old_epsn) > 0
            filled_hole = psnm.distance(self.state.epsn, old_epsn) > res.npsn
            if pkt.ack_req or ooo or filled_hole:
                self._sack()
        elif pkt.ack_req and op not in P.READ_REQ | P.ATOMIC_REQ:
            self._ack(ACK_SYNDROME, psnm.add(self.state.epsn, -1))

    def _place(self, target, data: bytes) -> None:
        kind, key, off = target
        if kind == "mr":
            self.qp.mrs.write(key, off, data)
        else:
            w = self.recv[key - self.recv_head]
            w.buf[w.offset + off:w.offset + off + len(data)] = data

    def _in_order(self, p: _Pending) -> None:
        op, pkt = p.op, p.pkt
        if op in P.MSG_END:
            self.msn = (self.msn + 1) & MSN_MASK
        if op in P.READ_REQ:
            self._read_responses(pkt)
        elif op in P.ATOMIC_REQ:
            self._execute_atomic(pkt)
        elif op in P.SEND_LAST | P.SEND_ONLY:
            self._complete_recv(WcOpcode.RECV, p.msg_len, pkt.immdt)
        elif op in P.WITH_IMM:  # WRITE with immediate
            self._complete_recv(WcOpcode.RECV_RDMA_WITH_IMM, p.msg_len, pkt.immdt)

    def _complete_recv(self, wc_op, byte_len, imm) -> None:
        w = self.recv.popleft()
        self.recv_head = psnm.add(self.recv_head, 1)
        self.qp.cq.append(Completion(w.wr_id, WcStatus.SUCCESS, wc_op, byte_len, imm,
                                     self.qp.attr.qpn))

    def _execute_atomic(self, pkt) -> None:
        a = pkt.atomic
        old = int.from_bytes(self.qp.mrs.read(a.rkey, a.va, 8), "little")
        if P.base(pkt.opcode) is O.RC_FETCH_ADD:
            new = (old + a.swap_add) & (2**64 - 1)
        else:
            new = a.swap_add if old == a.compare else old
        self.qp.mrs.write(a.rkey, a.va, new.to_bytes(8, "little"))
        self.atomic_results[pkt.psn] = old
        while len(self.atomic_results) > max(64, 4 * self.qp.attr.max_dest_rd_atomic):
            self.atomic_results.popitem(last=False)
        self._atomic_ack(pkt, old)

    def _atomic_ack(self, pkt, value) -> None:
        self.qp.emit(P.Packet(P.to_mode(O.RC_ATOMIC_ACKNOWLEDGE, self.metaroce), pkt.psn,
                              self.qp.attr.dest_qpn, aeth=P.Aeth(ACK_SYNDROME, self.msn),
                              atomic_ack=value, place=pkt.place))

    def _read_responses(self, pkt) -> None:
        r, mtu = pkt.reth, self.qp.attr.path_mtu
        data = self.qp.mrs.read(r.rkey, r.va, r.length) if r.length else b""
        n = P.npackets(r.length, mtu)
        base_off = pkt.place.offset if pkt.place else 0
        for i in range(n):
            op = P.read_resp_opcode(i, n)
            aeth = None if op is O.RC_RDMA_READ_RESPONSE_MIDDLE else P.Aeth(ACK_SYNDROME, self.msn)
            place = P.Placement(pkt.place.ssn, 0, base_off + i * mtu) if self.metaroce else None
            self.qp.emit(P.Packet(P.to_mode(op, self.metaroce), psnm.add(pkt.psn, i),
                                  self.qp.attr.dest_qpn, aeth=aeth, place=place,
                                  payload=data[i * mtu:(i + 1) * mtu]))

    def _duplicate(self, pkt, op, res) -> None:
        executed = psnm.diff(pkt.psn, self.state.epsn) < 0
        if op in P.READ_REQ:
            if executed:
                self._read_responses(pkt)  # READ duplicates are re-executed
        elif op in P.ATOMIC_REQ:
            if "atomic_reexecute" in self.qp.test_breaks and executed:
                self._execute_atomic(pkt)
            elif executed and pkt.psn in self.atomic_results:
                self._atomic_ack(pkt, self.atomic_results[pkt.psn])  # never applied twice
        elif pkt.ack_req:
            if self.metaroce:
                self._sack()
            else:
                self._ack(ACK_SYNDROME, psnm.add(self.state.epsn, -1))

    # --- ACK generation -----------------------------------------------------------------------
    def _ack(self, syndrome: int, psn: int, fatal: bool = False) -> None:
        if self.metaroce:
            self._sack(syndrome, psn if fatal else None, fatal)
            return
        self.qp.emit(P.Packet(int(O.RC_ACKNOWLEDGE), psn, self.qp.attr.dest_qpn,
                              aeth=P.Aeth(syndrome, self.msn)))

    def _sack(self, syndrome: int = ACK_SYNDROME, psn: int | None = None, fatal=False) -> None:
        """MR_SACK: PSN = cumulative (ePSN - 1); sack bit i = PSN cumulative + 2 + i."""
        cum = psnm.add(self.state.epsn, -1) if psn is None else psn
        bitmap = 0 if fatal else (self.state.bitmap >> 1) & ((1 << SACK_BITMAP_BITS) - 1)
        self.qp.emit(P.Packet(int(O.MR_SACK), cum, self.qp.attr.dest_qpn,
                              aeth=P.Aeth(syndrome, self.msn), sack=bitmap))

    def flush(self) -> None:
        while self.recv:
            w = self.recv.popleft()
            self.qp.cq.append(Completion(w.wr_id, WcStatus.WR_FLUSH_ERR, WcOpcode.RECV, 0, None,
                                         self.qp.attr.qpn))
