"""A reliable-connected QP: state machine + requester + responder, with injected time and I/O.

The engine never reads a clock or touches a socket. Drive it with ``receive(pkt, now)``,
``on_timer(now)`` at ``next_deadline()``, and ``post_send/post_recv``; collect output from
``take_packets()`` and ``poll_cq()``. ``now`` is an integer in nanoseconds.
"""

from dataclasses import replace

from metaroce.wire.consts import Opcode

from . import packets as P
from .mr import MRTable
from .cc import CCConfig
from .credits import CreditManager
from .qp import Mode, QPAttr, QPState, QPStateError, check_transition
from .requester import Requester
from .responder import Responder
from .wr import WC_OF_WR, Completion, RecvWR, SendWR, WcStatus

TEST_BREAKS = {"complete_before_ack", "no_hole_retransmit", "atomic_reexecute"}
CNP, MR_CREDIT, MR_PROBE = int(Opcode.CNP), int(Opcode.MR_CREDIT), int(Opcode.MR_PROBE)


class QueuePair:
    def __init__(self, qpn: int, mode: Mode = Mode.COMPAT, mrs: MRTable | None = None,
                 min_rto_ns: int = 50_000, _test_break: str | set | None = None,
                 cc: CCConfig | None = None, paths: int = 1,
                 credits: CreditManager | None = None, seed: int = 0):
        """``cc``: congestion control (None: PSN window only); ``paths``: MetaRoCE multipath
        entropy set size (MP-1); ``credits``: the receiving NIC's credit manager, which also
        turns on the CREDIT capability as a sender (CC-8); ``seed``: entropy choices."""
        breaks = {_test_break} if isinstance(_test_break, str) else set(_test_break or ())
        if breaks - TEST_BREAKS:
            raise ValueError(f"unknown _test_break {breaks - TEST_BREAKS}")
        self.test_breaks = frozenset(breaks)  # deliberately broken behaviour, tests only
        self.cc_cfg, self.npaths, self.credits, self.seed = cc, paths, credits, seed
        self.mode = mode
        self.attr = QPAttr(qpn=qpn)
        self.state = QPState.RESET
        self.mrs = mrs if mrs is not None else MRTable()
        self.cq: list[Completion] = []
        self._out: list[P.Packet] = []
        self.req = Requester(self, min_rto_ns=min_rto_ns)
        self.resp = Responder(self)

    # --- verbs --------------------------------------------------------------------------------
    def modify(self, new: QPState, **attrs) -> None:
        """ibv_modify_qp: checks the transition, applies attributes, starts engines at RTR/RTS."""
        check_transition(self.state, new)
        cand = replace(self.attr, **attrs)
        cand.validate()
        self.attr = cand
        old, self.state = self.state, new
        if new is QPState.RTR and old is QPState.INIT:
            self.resp.start(self.attr.rq_psn)
        elif new is QPState.RTS and old is QPState.RTR:
            self.req.start(self.attr.sq_psn)
        elif new is QPState.ERR and old is not QPState.ERR:
            self._flush()
        elif new is QPState.RESET:
            self.req = Requester(self, self.req.min_rto_ns)
            self.resp = Responder(self)

    def post_send(self, wr: SendWR, now: int = 0) -> None:
        if self.state is QPState.ERR:
            self.cq.append(Completion(wr.wr_id, WcStatus.WR_FLUSH_ERR, WC_OF_WR[wr.opcode], 0,
                                      None, self.attr.qpn))
            return
        if self.state not in (QPState.RTS, QPState.SQD):
            raise QPStateError(f"post_send in state {self.state.value}")
        self.req.post(wr)
        self.req.pump(now)

    def post_recv(self, wr: RecvWR) -> None:
        if self.state is QPState.RESET:
            raise QPStateError("post_recv in state RESET")
        self.resp.post_recv(wr)
        if self.state is QPState.ERR:
            self.resp.flush()

    def poll_cq(self) -> list[Completion]:
        out, self.cq = self.cq, []
        return out

    # --- packet and timer input ----------------------------------------------------------------
    def receive(self, pkt: P.Packet, now: int) -> None:
        if pkt.dest_qp != self.attr.qpn or self.state in (QPState.RESET, QPState.INIT,
                                                          QPState.ERR):
            return
        opc = pkt.opcode
        if opc == CNP:
            if self.state in (QPState.RTS, QPState.SQD):
                self.req.on_cnp(pkt, now)
            return
        if opc == MR_CREDIT or opc == MR_PROBE:
            if self.mode is Mode.METAROCE:
                if opc == MR_PROBE:
                    self.resp.on_probe(pkt, now)
                elif self.state in (QPState.RTS, QPState.SQD):
                    self.req.on_grant(pkt, now)
            return
        try:
            op = P.base(opc)
        except ValueError:
            return
        if op in P.REQUESTS or op in P.SEND_INVALIDATE:
            self.resp.handle(pkt, now)
        elif op in P.RESPONSES and self.state in (QPState.RTS, QPState.SQD):
            self.req.handle(pkt, now)

    def next_deadline(self) -> int | None:
        d = self.req.deadline() if self.state in (QPState.RTS, QPState.SQD) else None
        s = self.resp.sack_due if self.state in (QPState.RTR, QPState.RTS, QPState.SQD) \
            else None
        if s is None:
            return d
        return s if d is None else min(d, s)

    def on_timer(self, now: int) -> None:
        if self.resp.sack_due is not None and now >= self.resp.sack_due and \
                self.state in (QPState.RTR, QPState.RTS, QPState.SQD):
            self.resp.on_sack_timer(now)
        if self.state in (QPState.RTS, QPState.SQD):
            self.req.on_timer(now)

    def take_packets(self) -> list[P.Packet]:
        out, self._out = self._out, []
        return out

    # --- used by requester / responder ---------------------------------------------------------
    def emit(self, pkt: P.Packet) -> None:
        self._out.append(pkt)

    def can_issue_new(self) -> bool:
        return self.state is QPState.RTS  # SQD: drain what is in flight, start nothing new

    def state_is_err(self) -> bool:
        return self.state is QPState.ERR

    def requester_error(self) -> None:
        self.modify(QPState.ERR)

    def responder_error(self) -> None:
        self.modify(QPState.ERR)

    def _flush(self) -> None:
        self.req.flush()
        self.resp.flush()
