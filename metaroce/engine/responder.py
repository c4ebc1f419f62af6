"""Responder: applies the per-packet verdict, places data, executes READ/ATOMIC in PSN order,
delivers receive completions in order, and generates ACK / NAK / RNR NAK / SACK / responses.

Congestion feedback: in compat mode a CE-marked request makes a CNP (at most one per
``cnp_interval_ns``, COMPAT-4); in MetaRoCE mode every SACK echoes the trigger's PathID and
timestamp, the ECE flag and the QP's CE count (CC-2, CC-7), and with a credit manager the
responder grants receiver credit (MR_CREDIT and SACK flag C, CC-8) and answers probes (CC-9)."""

from collections import OrderedDict, deque
from dataclasses import dataclass, replace

from metaroce.wire.consts import AETH_ACK_UNLIMITED, MSN_MASK, SACK_BITMAP_BITS, AethType, NakCode
from metaroce.wire.consts import Opcode as O

from . import packets as P
from . import psn as psnm
from .credits import GrantState
from .qp import Mode
from .verdict import PktFields, RespState, Verdict, responder_verdict
from .wr import Completion, RecvWR, WcOpcode, WcStatus

ACK_SYNDROME = int(AethType.ACK) | AETH_ACK_UNLIMITED
SACK_EVERY = 4  # MetaRoCE: SACK at least every 4 accepted packets (SACK-2 e allows up to 16)
SACK_DELAY_NS = 2_000  # MetaRoCE: an accepted packet is SACKed within this delay (RESP-3)


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
        self.stats.update(ce=0, cnp=0, sacks=0, grants=0, probes=0, rx_bytes=0)
        self.ce_count = 0
        self._ce_run = 0
        self._last_cnp: int | None = None
        self.grant = GrantState()
        self._since_sack = 0
        self.sack_due: int | None = None  # delayed-SACK deadline (RESP-3, SACK-2 e)

    @property
    def metaroce(self) -> bool:
        return self.qp.mode is Mode.METAROCE

    @property
    def rx_bytes(self) -> int:
        """Payload bytes accepted so far (the simulator's delivery measurement)."""
        return self.stats["rx_bytes"]

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
        self.now = now
        if pkt.ce:
            self._on_ce(now)
        else:
            self._ce_run = 0
        res = responder_verdict(self.snapshot(), PktFields.of(pkt))
        self.stats[res.verdict.value] += 1
        old_epsn = self.state.epsn
        self.state = replace(res.state, recv={}, mrs={})
        v = res.verdict
        op = P.base(pkt.opcode)
        self._trig = pkt
        if v is Verdict.ACCEPT:
            self.stats["rx_bytes"] += len(pkt.payload)
            if self.qp.credits is not None and self.metaroce:
                self.qp.credits.touch(self.qp.attr.qpn, now)
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

    # --- congestion feedback and credits --------------------------------------------------------
    def _on_ce(self, now: int) -> None:
        self.ce_count = (self.ce_count + 1) & 0xFFFFFFFF
        self.stats["ce"] += 1
        self._ce_run += 1
        if self.metaroce:
            return
        cfg = self.qp.cc_cfg
        gap = cfg.cnp_interval_ns if cfg is not None else 50_000
        if self._last_cnp is None or now - self._last_cnp >= gap:  # COMPAT-4
            self._last_cnp = now
            self.stats["cnp"] += 1
            self.qp.emit(P.Packet(int(O.CNP), 0, self.qp.attr.dest_qpn, sport=self._sport()))

    def _sport(self, trig: P.Packet | None = None) -> int:
        if trig is not None and trig.sport:
            return trig.sport
        return self.qp.req.paths.sport(0) if self.qp.req.paths else 0

    def _credit(self, now: int, force: bool = False) -> int | None:
        """CC-8: the Limit PSN to report (None: credit mode off); sends MR_CREDIT on changes."""
        mgr = self.qp.credits
        if mgr is None or not self.metaroce:
            return None
        g = self.grant
        mgr.touch(self.qp.attr.qpn, now)
        share = mgr.share(now)
        if share is None:
            if g.active or not g.announced or force:
                g.active = False
                self._send_grant(False, 0, 0)
            return None
        limit = psnm.add(self.state.epsn, share)
        trig = getattr(self, "_trig", None)
        beyond = trig is not None and trig.psn is not None and g.active and \
            psnm.diff(trig.psn, g.limit) >= 0
        if not g.active or force or (beyond and (g.resent_at is None or
                                                  now - g.resent_at >= mgr.cfg.base_rtt_ns)):
            g.resent_at = now if beyond else g.resent_at
            g.active, g.limit = True, limit
            self._send_grant(True, limit, mgr.rate_mbps(now))
        elif psnm.diff(limit, g.limit) > 0:
            g.limit = limit
        return g.limit

    def _send_grant(self, active: bool, limit: int, rate: int) -> None:
        g = self.grant
        g.announced = True
        g.seq = (g.seq + 1) & 0xFFFFFF
        self.stats["grants"] += 1
        self.qp.credits.grants += 1
        self.qp.emit(P.Packet(int(O.MR_CREDIT), g.seq, self.qp.attr.dest_qpn,
                              grant=(active, limit, rate), sport=self._sport(self._trig)))

    def on_sack_timer(self, now: int) -> None:
        """The delayed SACK is due: acknowledge what arrived since the last SACK."""
        self.now = now
        self.sack_due = None
        if self.state is not None and self.metaroce and not self.qp.state_is_err():
            self._sack()

    def on_probe(self, pkt: P.Packet, now: int) -> None:
        """MR_PROBE (MP-6, CC-9): a SACK with P set, and the current grant."""
        if self.state is None or not self.metaroce:
            return
        self.now, self._trig = now, pkt
        self.stats["probes"] += 1
        if self.qp.credits is not None:
            self._credit(now, force=True)
        self._sack(probe=True)

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
            credit = self.qp.credits is not None and (self.grant.active or not self.grant.announced)
            ce = pkt.ce and self._ce_run % 4 == 1  # SACK-2 (c), coalesced to one per 4
            self._since_sack += 1
            if pkt.ack_req or ooo or filled_hole or credit or ce or \
                    self._since_sack >= SACK_EVERY:
                self._sack()
            elif self.sack_due is None:
                self.sack_due = self.now + SACK_DELAY_NS
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
                              atomic_ack=value, place=pkt.place, sport=self._sport(pkt)))

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
                                  payload=data[i * mtu:(i + 1) * mtu], sport=self._sport(pkt)))

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
        elif self.metaroce:
            if pkt.ack_req:                 # SACK-3: with AckReq or ACK_NOW
                self._sack()
        else:                               # RESP-4, RESP-16: every duplicate SEND/WRITE
            self._ack(ACK_SYNDROME, psnm.add(self.state.epsn, -1))

    # --- ACK generation -----------------------------------------------------------------------
    def _ack(self, syndrome: int, psn: int, fatal: bool = False) -> None:
        if self.metaroce:
            self._sack(syndrome, psn if fatal else None, fatal)
            return
        self.qp.emit(P.Packet(int(O.RC_ACKNOWLEDGE), psn, self.qp.attr.dest_qpn,
                              aeth=P.Aeth(syndrome, self.msn),
                              sport=self._sport(getattr(self, "_trig", None))))

    def _sack(self, syndrome: int = ACK_SYNDROME, psn: int | None = None, fatal=False,
              probe: bool = False) -> None:
        """MR_SACK: PSN = cumulative (ePSN - 1); sack bit i = PSN cumulative + 2 + i; echoes
        the trigger's PathID, timestamp and CE mark, the CE count and the credit limit."""
        cum = psnm.add(self.state.epsn, -1) if psn is None else psn
        bitmap = 0 if fatal else (self.state.bitmap >> 1) & ((1 << SACK_BITMAP_BITS) - 1)
        trig = getattr(self, "_trig", None)
        limit = None if fatal or probe else self._credit(getattr(self, "now", 0))
        if probe and self.grant.active:
            limit = self.grant.limit
        self._since_sack = 0
        self.sack_due = None
        self.stats["sacks"] += 1
        self.qp.emit(P.Packet(int(O.MR_SACK), cum, self.qp.attr.dest_qpn,
                              aeth=P.Aeth(syndrome, self.msn), sack=bitmap,
                              path=trig.path if trig else 0, ts_echo=trig.ts if trig else 0,
                              ecn_echo=bool(trig and trig.ce), ce_count=self.ce_count,
                              credit_limit=limit, probe_reply=probe, sport=self._sport(trig)))

    def flush(self) -> None:
        while self.recv:
            w = self.recv.popleft()
            self.qp.cq.append(Completion(w.wr_id, WcStatus.WR_FLUSH_ERR, WcOpcode.RECV, 0, None,
                                         self.qp.attr.qpn))
