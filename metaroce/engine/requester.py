"""Requester: segments work requests into packets, tracks PSNs, retransmits (go-back-N in
compat mode, selective repeat in MetaRoCE mode) and completes WRs in posting order.

Transmission gates, in :meth:`Requester.pump`: PSN window (CC-5), congestion window
(cc.WindowCC, MetaRoCE), receiver credit (credits.CreditGate, CC-8) and pacing (DCQCN rate in
compat mode; cwnd/SRTT or the credit rate in MetaRoCE mode, CC-6). Lost PSNs wait in a
retransmission queue served ahead of new data; each transmission picks a path from the
multipath.PathSet (MP-3) and loss detection is per path (SACK-5)."""

from collections import deque
from dataclasses import dataclass, field, replace

from metaroce.wire.consts import (AETH_TYPE_MASK, AETH_VALUE_MASK, MSN_MASK, SACK_BITMAP_BITS,
                                  AethType, NakCode)
from metaroce.wire.consts import Opcode as O

from . import packets as P
from . import psn as psnm
from .cc import Dcqcn, Pacer, WindowCC
from .credits import CreditGate
from .multipath import PathSet
from .qp import Mode, rnr_timer_ns
from .rto import RtoEstimator
from .wr import ATOMICS, NEEDS_RESPONSE, WC_OF_WR, Completion, SendWR, WcStatus, WrOpcode

ACK_REQ_EVERY = 16  # AckReq on the last packet of a message and on every 16th packet
HDR_BYTES = 64  # per-packet header bytes counted by the congestion window
REORDER_THRESHOLD = 16  # SACK-5 (b)
TAIL_PKTS = 4  # RTO-3: at most this many outstanding PSNs use the low RTO
NAK_STATUS = {
    NakCode.INVALID_REQUEST: WcStatus.REM_INV_REQ_ERR,
    NakCode.REMOTE_ACCESS_ERROR: WcStatus.REM_ACCESS_ERR,
    NakCode.REMOTE_OPERATIONAL_ERROR: WcStatus.REM_OP_ERR,
    NakCode.INVALID_RD_REQUEST: WcStatus.REM_INV_REQ_ERR,
}


@dataclass
class _Wqe:
    wr: SendWR
    data: bytes
    ssn: int
    rsn: int
    npkts: int
    first_psn: int = 0
    acked: list = field(default_factory=list)  # per packet: ACKed (SEND/WRITE) or response got
    seen: list = field(default_factory=list)  # MetaRoCE: a SACK covered this request PSN
    sent_at: list = field(default_factory=list)
    sent_seq: list = field(default_factory=list)  # transmission order (ties in time broken)
    retx: list = field(default_factory=list)
    path: list = field(default_factory=list)  # path of the last transmission
    infl: list = field(default_factory=list)  # counted in the congestion window's in-flight
    queued: list = field(default_factory=list)  # waiting in the retransmission queue
    status: WcStatus | None = None
    nacked: int = 0
    una_idx: int = 0  # every packet before it is acked

    @property
    def needs_response(self) -> bool:
        return self.wr.opcode in NEEDS_RESPONSE

    @property
    def done(self) -> bool:
        return self.nacked == self.npkts

    def ack(self, i: int) -> bool:
        if self.acked[i]:
            return False
        self.acked[i] = True
        self.nacked += 1
        while self.una_idx < self.npkts and self.acked[self.una_idx]:
            self.una_idx += 1
        return True

    def psn(self, idx: int) -> int:
        return psnm.add(self.first_psn, idx)


class Requester:
    def __init__(self, qp, min_rto_ns: int = 50_000):
        self.qp = qp
        self.pending: deque[_Wqe] = deque()  # posted, no PSN yet
        self.inflight: deque[_Wqe] = deque()  # PSNs assigned, not completed (posting order)
        self.slots: dict[int, tuple[_Wqe, int]] = {}
        self.nxt = self.tx_ptr = 0
        self.ssn = self.rsn = 0
        self.timer_base: int | None = None
        self.rnr_until: int | None = None
        self.retries = self.rnr_retries = 0
        self.gbn_psn: int | None = None  # compat: go-back already started from this PSN
        self.tx_seq = 0  # transmission counter: orders packets sent at the same instant
        self.evidence = -1  # MetaRoCE: latest transmission (tx_seq) known to have arrived
        self.min_rto_ns = min_rto_ns
        self.rto: RtoEstimator | None = None
        self.stats = {"tx": 0, "retx": 0, "timeouts": 0, "rnr": 0, "rtt_samples": 0,
                      "lost": 0, "lost_a": 0, "lost_b": 0, "cnp": 0, "probes": 0,
                      "tx_bytes": 0}
        self.high = 0  # one past the highest PSN ever transmitted
        self.rtxq: deque = deque()  # (wqe, idx) declared lost, served ahead of new data
        self.inflight_bytes = 0
        self.cc: WindowCC | None = None
        self.dcqcn: Dcqcn | None = None
        self.pacer = Pacer()
        self.paths: PathSet | None = None
        self.credit: CreditGate | None = None
        self.blocked: str | None = None  # why pump stopped: window/cwnd/credit/pace
        self.high_sacked: int | None = None  # furthest PSN a SACK covered
        self.sack_horizon: int | None = None  # furthest PSN a SACK could have reported
        self.last_ce = 0
        self.last_rtt: int | None = None

    @property
    def metaroce(self) -> bool:
        return self.qp.mode is Mode.METAROCE

    def start(self, sq_psn: int) -> None:
        self.nxt = self.tx_ptr = self.high = sq_psn
        self.ask_psn: int | None = None  # the latest PSN sent with AckReq
        ack_to = self.qp.attr.local_ack_timeout_ns
        self.rto = RtoEstimator(ack_to or 1_000_000_000, min_ns=self.min_rto_ns,
                                max_ns=ack_to or 1_000_000_000)  # RTO_max: RESP-8's timeout
        a, cfg = self.qp.attr, self.qp.cc_cfg
        npaths = self.qp.npaths if self.metaroce else 1
        self.paths = PathSet(npaths, a.qpn, a.dest_qpn, self.qp.seed)
        if cfg is not None:
            if self.metaroce:
                self.cc = WindowCC(cfg, a.path_mtu)
            elif cfg.dcqcn:
                self.dcqcn = Dcqcn(cfg)
        if self.metaroce and self.qp.credits is not None:
            self.credit = CreditGate(sq_psn, self.qp.credits.cfg.initial_credit_pkts)

    # --- posting and transmission -------------------------------------------------------------
    def post(self, wr: SendWR) -> None:
        mtu = self.qp.attr.path_mtu
        n = 1 if wr.opcode in ATOMICS else P.npackets(wr.length, mtu)
        consumes = wr.opcode in (WrOpcode.SEND, WrOpcode.SEND_WITH_IMM,
                                 WrOpcode.RDMA_WRITE_WITH_IMM)
        data = bytes(wr.local[wr.offset:wr.offset + wr.length]) if wr.opcode not in NEEDS_RESPONSE \
            else b""
        w = _Wqe(wr, data, self.ssn, self.rsn, n)
        self.ssn = (self.ssn + 1) & MSN_MASK
        if consumes:
            self.rsn = (self.rsn + 1) & MSN_MASK
        self.pending.append(w)

    def una(self) -> int:
        for w in self.inflight:
            if w.una_idx < w.npkts:
                return w.psn(w.una_idx)
        return self.nxt

    def _ask_outstanding(self) -> bool:
        """RESP-1: a packet sent with AckReq that the cumulative PSN has not passed: its answer
        reopens a closed window, so the edge need not ask too (a full window whose every SACK
        opens one PSN would otherwise make every packet an ask and every ask a SACK)."""
        return self.ask_psn is not None and psnm.diff(self.ask_psn, self.una()) >= 0

    def _rd_atomic_outstanding(self) -> int:
        return sum(1 for w in self.inflight if w.needs_response and not w.done)

    def _pkt_bytes(self, w: _Wqe, idx: int) -> int:
        """Bytes the congestion window counts for a packet (SEND/WRITE data only)."""
        if w.needs_response:
            return 0
        mtu = self.qp.attr.path_mtu
        return min(mtu, max(0, len(w.data) - idx * mtu)) + HDR_BYTES

    def _pace_rate(self) -> float:
        """Pacing rate in bit/s, 0 = unpaced (the NIC serialises at line rate)."""
        if self.dcqcn is not None:
            return self.dcqcn.rc if self.dcqcn.limited else 0.0
        rate = 0.0
        if self.cc is not None and self.cc.cwnd < 4 * self.qp.attr.path_mtu:
            srtt = self.rto.srtt or self.cc.base_rtt
            rate = self.cc.cwnd * 8e9 / max(srtt, 1.0)  # CC-6
        if self.credit is not None and self.credit.active and self.credit.rate_mbps:
            cr = self.credit.rate_mbps * 1e6
            rate = cr if not rate else min(rate, cr)
        return rate

    def _gate(self, w: _Wqe, idx: int, now: int, new: bool) -> str | None:
        """Why the packet cannot leave now (None: it can)."""
        if self.cc is not None:
            size = self._pkt_bytes(w, idx)
            if size and self.inflight_bytes and self.inflight_bytes + size > self.cc.cwnd:
                return "cwnd"
        if new and self.credit is not None and not self.credit.allows(w.psn(idx)):
            return "credit"
        if self.dcqcn is not None:
            self.dcqcn.advance(now)
        rate = self._pace_rate()
        if rate and not self.pacer.ready(now):
            return "pace"
        return None

    def pump(self, now: int) -> None:
        """Transmit what the window, congestion window, credit, pacing, RNR wait and QP state
        allow: queued retransmissions first, then new data (or go-back-N from tx_ptr)."""
        self.blocked = None
        if self.rnr_until is not None:
            return
        while self.rtxq:
            w, idx = self.rtxq[0]
            if w.acked[idx] or w.status is not None or w.seen[idx]:
                self.rtxq.popleft()
                w.queued[idx] = False
                continue
            why = self._gate(w, idx, now, False)
            if why:
                self.blocked = why
                self._arm(now)
                return
            self.rtxq.popleft()
            w.queued[idx] = False
            self._send(w, idx, now, True)
        window, una, sent = self.qp.attr.window, self.una(), 0
        while True:
            if self.tx_ptr == self.nxt:
                if not self.pending or not self.qp.can_issue_new():
                    break
                w = self.pending[0]
                if w.needs_response and self._rd_atomic_outstanding() >= self.qp.attr.max_rd_atomic:
                    break
                self._assign(self.pending.popleft())
            w, idx = self.slots[self.tx_ptr]
            span = w.npkts - idx if w.wr.opcode is WrOpcode.RDMA_READ else 1
            if psnm.distance(self.tx_ptr, una) >= window:   # SACK-9: the request's PSN, not
                self.blocked = "window"                     # its responses', must be inside
                break
            retx = w.sent_at[idx] is not None
            why = self._gate(w, idx, now, not retx)
            if why:
                self.blocked = why
                break
            self._send(w, idx, now, retx)
            sent += 1
            self.tx_ptr = psnm.add(self.tx_ptr, span)
            if psnm.diff(self.tx_ptr, self.high) > 0:
                self.high = self.tx_ptr
        if sent and self.blocked in ("window", "cwnd", "credit") and not self._ask_outstanding():
            out = self.qp._out  # the edge's packet asks for an acknowledgement (RESP-1)
            out[-1] = replace(out[-1], ack_req=True)
            self.ask_psn = out[-1].psn
        if self.credit is not None:
            if self.blocked == "credit":
                if self.credit.blocked_since is None:
                    self.credit.blocked_since = now
            else:
                self.credit.blocked_since = None
        self._arm(now)

    def _assign(self, w: _Wqe) -> None:
        w.first_psn = self.nxt
        w.acked = [False] * w.npkts
        w.seen = [False] * w.npkts
        w.sent_at = [None] * w.npkts
        w.sent_seq = [-1] * w.npkts
        w.retx = [0] * w.npkts
        w.path = [0] * w.npkts
        w.infl = [False] * w.npkts
        w.queued = [False] * w.npkts
        for i in range(w.npkts):
            self.slots[w.psn(i)] = (w, i)
        self.nxt = psnm.add(self.nxt, w.npkts)
        self.inflight.append(w)

    def _send(self, w: _Wqe, idx: int, now: int, retx: bool) -> None:
        """Emit the packet for PSN slot idx of w (a READ from idx covers the rest of it)."""
        wr, mtu, mr = w.wr, self.qp.attr.path_mtu, self.metaroce
        psn = w.psn(idx)
        paths = self.paths
        k = paths.pick(w.path[idx] if retx else None)
        path = paths.paths[k]
        sport = path.sport
        if path.born is None:
            path.born = self.tx_seq
        place = P.Placement(w.ssn, w.rsn, idx * mtu) if mr else None
        op = wr.opcode
        if op is WrOpcode.RDMA_READ:
            reth = P.Reth(wr.remote_addr + idx * mtu, wr.rkey, max(0, wr.length - idx * mtu))
            pkt = P.Packet(P.to_mode(O.RC_RDMA_READ_REQUEST, mr), psn, self.qp.attr.dest_qpn,
                           ack_req=True, reth=reth, place=place, retx=retx, ts=now, path=k,
                           sport=sport)
            touched = range(idx, w.npkts)
        elif op in ATOMICS:
            rc = O.RC_COMPARE_SWAP if op is WrOpcode.ATOMIC_CMP_AND_SWP else O.RC_FETCH_ADD
            a = P.AtomicEth(wr.remote_addr, wr.rkey,
                            wr.swap if op is WrOpcode.ATOMIC_CMP_AND_SWP else wr.compare_add,
                            wr.compare_add if op is WrOpcode.ATOMIC_CMP_AND_SWP else 0)
            pkt = P.Packet(P.to_mode(rc, mr), psn, self.qp.attr.dest_qpn, ack_req=True, atomic=a,
                           place=place, retx=retx, ts=now, path=k, sport=sport)
            touched = (idx,)
        else:
            kind = "send" if op in (WrOpcode.SEND, WrOpcode.SEND_WITH_IMM) else "write"
            ops = P.segment_opcodes(kind, w.npkts, wr.imm is not None)
            rc = ops[idx]
            reth = None
            if kind == "write" and (mr or idx == 0):
                reth = P.Reth(wr.remote_addr, wr.rkey, wr.length)
            last = idx == w.npkts - 1
            pkt = P.Packet(P.to_mode(rc, mr), psn, self.qp.attr.dest_qpn,
                           ack_req=last or retx or (idx + 1) % ACK_REQ_EVERY == 0, reth=reth,
                           immdt=wr.imm if last else None, place=place, retx=retx, ts=now,
                           payload=w.data[idx * mtu:(idx + 1) * mtu], path=k, sport=sport)
            touched = (idx,)
        for i in touched:
            if w.sent_at[i] is not None:
                w.retx[i] += 1
            w.sent_at[i] = now
            w.sent_seq[i] = self.tx_seq
            w.path[i] = k
        self.tx_seq += 1
        if pkt.ack_req:
            self.ask_psn = psn
        self.stats["retx" if retx else "tx"] += 1
        size = self._pkt_bytes(w, idx)
        self.stats["tx_bytes"] += size
        if size and not w.infl[idx] and not w.acked[idx]:
            w.infl[idx] = True
            self.inflight_bytes += size
        rate = self._pace_rate()
        if rate:
            self.pacer.sent(now, size or HDR_BYTES, rate)
        if self.dcqcn is not None:
            self.dcqcn.on_sent(size)
        self.qp.emit(pkt)
        if "complete_before_ack" in self.qp.test_breaks and not w.needs_response:
            if all(t is not None for t in w.sent_at):
                for i in range(w.npkts):
                    w.ack(i)

    # --- timers -------------------------------------------------------------------------------
    def _outstanding(self) -> bool:
        """Some transmitted PSN is not acknowledged yet."""
        return psnm.diff(self.high, self.una()) > 0

    def _arm(self, now: int) -> None:
        if not self._outstanding():
            self.timer_base = None
        elif self.timer_base is None:
            self.timer_base = now

    def timeout_ns(self) -> int | None:
        if self.metaroce:
            rto = self.rto
            t = rto.rto_ns
            if self.cc is not None and rto.srtt is not None and \
                    psnm.distance(self.high, self.una()) <= TAIL_PKTS:
                low = max(int(2 * rto.srtt), rto.min) << min(rto.backoff, 16)  # RTO-3
                t = min(t, low, rto.max)
            return t
        return self.qp.attr.local_ack_timeout_ns

    def _credit_probe_at(self) -> int | None:
        c = self.credit
        if c is None or self.blocked != "credit" or c.blocked_since is None:
            return None
        since = max(c.blocked_since, c.last_grant or c.blocked_since)
        return since + self.qp.credits.cfg.liveness_rtos * self.rto.rto_ns

    def deadline(self) -> int | None:
        cands = []
        if self.rnr_until is not None:
            cands.append(self.rnr_until)
        t = self.timeout_ns()
        if self.timer_base is not None and t is not None and self.rnr_until is None:
            cands.append(self.timer_base + t)
        if self.blocked == "pace" and self.rnr_until is None:
            cands.append(self.pacer.next_ns)
        probe = self._credit_probe_at()
        if probe is not None:
            cands.append(probe)
        return min(cands) if cands else None

    def on_timer(self, now: int) -> None:
        if self.rnr_until is not None:
            if now < self.rnr_until:
                return
            self.rnr_until = None
            self.timer_base = now
            if self.metaroce:
                self._retransmit_all(now)
            self.pump(now)
            return
        probe = self._credit_probe_at()
        if probe is not None and now >= probe:
            self._credit_probe(now)
            self.pump(now)
        t = self.timeout_ns()
        if self.timer_base is None or t is None or now < self.timer_base + t:
            if self.blocked == "pace" and now >= self.pacer.next_ns:
                self.pump(now)
            return
        self.stats["timeouts"] += 1
        if not self.metaroce or (self.rto.rto_ns >= self.rto.max and
                                 self.qp.attr.local_ack_timeout_ns is not None):
            self.retries += 1  # RTO-2: only expiries at RTO_max count; RTO-4: none if infinite
        if self.retries > self.qp.attr.retry_cnt:
            self._fail(self.inflight[0], WcStatus.RETRY_EXC_ERR)
            return
        self.timer_base = now
        if self.metaroce:
            self.rto.on_timeout()
            oldest = next(self._holes(), None)
            if oldest is not None:
                self.paths.on_rto(oldest[0].path[oldest[1]], now)  # RTO-2, MP-5
            if self.cc is not None:
                self.cc.on_rto(now)
            self._retransmit_all(now)
        else:
            self.gbn_psn = None
            self._go_back(self.una())
        self.pump(now)

    def _credit_probe(self, now: int) -> None:
        """CC-9: blocked by credit with no grant for a while: ask the receiver (MR_PROBE)."""
        c = self.credit
        c.blocked_since = now
        c.probes += 1
        c.limit = psnm.add(c.limit, 1)  # CC-9: one new packet may go with the probe
        self.stats["probes"] += 1
        k = self.paths.pick()
        self.qp.emit(P.Packet(int(O.MR_PROBE), self.nxt, self.qp.attr.dest_qpn, ack_req=True,
                              place=P.Placement(0, 0, 0), ts=now, path=k,
                              sport=self.paths.sport(k)))

    # --- acknowledgements ---------------------------------------------------------------------
    def _in_window(self, psn: int) -> bool:
        return self.inflight and psnm.between(self.inflight[0].first_psn, psn, self.nxt)

    def handle(self, pkt: P.Packet, now: int) -> None:
        op = P.base(pkt.opcode)
        progress = False
        if self.metaroce and pkt.opcode == int(O.MR_SACK):
            progress = self._on_sack(pkt, now)
        elif not self.metaroce and op is O.RC_ACKNOWLEDGE:
            progress = self._on_ack(pkt, now)
        elif op in P.READ_RESP:
            progress = self._on_read_response(pkt, now)
        elif op is O.RC_ATOMIC_ACKNOWLEDGE:
            progress = self._on_atomic_ack(pkt, now)
        if self.qp.state_is_err():
            return
        if progress:
            self.retries = 0
            self.rnr_retries = 0  # RESP-6: rnr_retry counts NAKs of the same PSN
            self.rto.on_progress()
            self.timer_base = now
        self._retire()
        if self.metaroce:
            self._detect_losses(now)
        self.pump(now)

    def _ack_through(self, psn: int) -> bool:
        """Cumulative ACK of every PSN up to psn; an unanswered READ/ATOMIC before it means its
        response was lost (implied NAK): go back to it (compat)."""
        progress = False
        for w in self.inflight:
            for i in range(w.una_idx, w.npkts):
                if psnm.diff(w.psn(i), psn) > 0:
                    return progress
                if w.acked[i]:
                    continue
                if w.needs_response:
                    if self.metaroce:
                        w.seen[i] = True
                        continue
                    self._go_back(w.psn(i))
                    return progress
                self._acked(w, i)
                progress = True
        return progress

    def _acked(self, w: _Wqe, i: int) -> None:
        w.ack(i)
        if w.infl[i]:
            w.infl[i] = False
            self.inflight_bytes -= self._pkt_bytes(w, i)

    def _go_back(self, psn: int) -> None:
        if self.gbn_psn == psn or not self._in_window(psn):
            return
        if psnm.diff(psn, self.tx_ptr) < 0:
            self.tx_ptr = psn
            self.gbn_psn = psn

    def _on_ack(self, pkt, now) -> bool:
        syn = pkt.aeth.syndrome
        typ, val = syn & AETH_TYPE_MASK, syn & AETH_VALUE_MASK
        psn = pkt.psn
        if typ == AethType.ACK:
            if not self._in_window(psn):
                return False
            return self._ack_through(psn)
        prev = psnm.add(psn, -1)
        progress = self._ack_through(prev) if self._in_window(prev) else False
        if not self._in_window(psn):
            return progress
        if typ == AethType.RNR_NAK:
            self._rnr(val, now)
            self.gbn_psn = None
            self._go_back(psn)
        elif typ == AethType.NAK:
            if val == NakCode.PSN_SEQ_ERROR:
                self._go_back(psn)
            else:
                self._fail(self.slots[psn][0], NAK_STATUS.get(NakCode(val), WcStatus.REM_OP_ERR))
        return progress

    def _rnr(self, code: int, now: int) -> None:
        self.stats["rnr"] += 1
        rr = self.qp.attr.rnr_retry
        self.rnr_retries += 1
        if rr != 7 and self.rnr_retries > rr:
            self._fail(self.inflight[0], WcStatus.RNR_RETRY_EXC_ERR)
            return
        self.rnr_until = now + rnr_timer_ns(code)

    def _sample(self, w: _Wqe, i: int, now: int) -> None:
        """Karn's rule: only packets transmitted exactly once give an RTT sample."""
        if w.retx[i] == 0 and w.sent_at[i] is not None:
            self.rto.sample(now - w.sent_at[i])
            self.stats["rtt_samples"] += 1

    def _on_sack(self, pkt, now) -> bool:
        typ, val = pkt.aeth.syndrome & AETH_TYPE_MASK, pkt.aeth.syndrome & AETH_VALUE_MASK
        if typ == AethType.NAK:
            if self._in_window(pkt.psn):
                self._fail(self.slots[pkt.psn][0],
                           NAK_STATUS.get(NakCode(val), WcStatus.REM_OP_ERR))
            return False
        cum = pkt.psn
        newly: list[tuple[_Wqe, int]] = []

        def cover(w, i):
            if w.needs_response:
                w.seen[i] = True
            elif not w.acked[i]:
                self._acked(w, i)
                newly.append((w, i))

        for w in self.inflight:  # cumulative part
            if psnm.diff(w.first_psn, cum) > 0:
                break
            start = 0 if w.needs_response else w.una_idx
            for i in range(start, w.npkts):
                if psnm.diff(w.psn(i), cum) > 0:
                    break
                cover(w, i)
        bm, far = pkt.sack or 0, cum
        while bm:  # bitmap part: bit i = PSN cum + 2 + i
            low = bm & -bm
            q = psnm.add(cum, 1 + low.bit_length())
            bm ^= low
            hit = self.slots.get(q)
            if hit is not None:
                cover(*hit)
                far = q
        if self.high_sacked is None or psnm.diff(far, self.high_sacked) > 0:
            self.high_sacked = far
        horizon = psnm.add(cum, 1 + SACK_BITMAP_BITS)  # the last PSN this SACK can report
        if self.sack_horizon is None or psnm.diff(horizon, self.sack_horizon) > 0:
            self.sack_horizon = horizon
        paths = self.paths
        acked_bytes = 0
        for w, i in newly:
            s = w.sent_seq[i]
            if s > self.evidence:
                self.evidence = s
            p = paths.paths[w.path[i]] if w.path[i] < len(paths.paths) else None
            if p is not None and s > p.evidence and w.retx[i] == 0:
                p.evidence = s  # only unambiguous (never retransmitted) packets are evidence
            acked_bytes += self._pkt_bytes(w, i)
        # congestion signals (CC-2): RTT from the timestamp echo, ECN from E / CE count
        rtt = (now - pkt.ts_echo) & 0xFFFFFFFF
        if rtt > 1 << 31:
            rtt = None
        if newly:
            if rtt is not None:
                self.rto.sample(rtt)  # RTO-1: echoes identify the transmission (no Karn)
                self.stats["rtt_samples"] += 1
            else:
                w, i = max(newly, key=lambda wi: wi[0].sent_at[wi[1]] or -1)
                self._sample(w, i, now)
        ecn = pkt.ecn_echo or pkt.ce_count != self.last_ce and \
            ((pkt.ce_count - self.last_ce) & 0xFFFFFFFF) < 1 << 31
        if ((pkt.ce_count - self.last_ce) & 0xFFFFFFFF) < 1 << 31:
            self.last_ce = pkt.ce_count
        if rtt is not None:
            self.last_rtt = rtt
        paths.on_ack(pkt.path, rtt, ecn, now)
        if ecn:
            paths.congested(pkt.path)  # MP-3: the path's weight falls with its ECN echoes
        if self.cc is not None:
            self.cc.on_ack(now, acked_bytes, rtt, ecn, self.rto.srtt or 0.0)
        if self.credit is not None:
            if pkt.credit_limit is not None:
                self.credit.refresh(pkt.credit_limit, now)
            elif pkt.probe_reply and self.credit.active:
                self.credit.active = False  # CC-9: the probe's answer says credit mode is off
                self.credit.last_grant = now
        if typ == AethType.RNR_NAK:
            self._rnr(val, now)
        return bool(newly)

    # --- congestion and credit feedback --------------------------------------------------------
    def on_cnp(self, pkt: P.Packet, now: int) -> None:
        """CNP: DCQCN rate cut (compat, COMPAT-4) or an ECN signal to the window (CC-7)."""
        self.stats["cnp"] += 1
        if self.dcqcn is not None:
            self.dcqcn.on_cnp(now)
        elif self.cc is not None:
            self.cc.on_ack(now, 0, self.last_rtt, True, self.rto.srtt or 0.0)
        self.pump(now)

    def on_grant(self, pkt: P.Packet, now: int) -> None:
        """MR_CREDIT (CC-8): ordered by its BTH.PSN; stale grants are ignored."""
        if self.credit is None or pkt.grant is None:
            return
        active, limit, rate = pkt.grant
        if self.credit.on_grant(pkt.psn, active, limit, rate, now):
            self.credit.blocked_since = None
            self.pump(now)

    def _on_response(self, pkt, now, check_op) -> tuple[_Wqe, int] | None:
        hit = self.slots.get(pkt.psn)
        if hit is None or not check_op(hit[0].wr.opcode) or hit[0].acked[hit[1]]:
            return None
        w, i = hit
        if not self.metaroce:
            if any(not a for a in w.acked[:i]):  # compat: responses arrive in order or not at all
                self._go_back(w.psn(w.acked.index(False)))
                return None
            self._ack_through(psnm.add(w.first_psn, -1))
        return w, i

    def _on_read_response(self, pkt, now) -> bool:
        hit = self._on_response(pkt, now, lambda op: op is WrOpcode.RDMA_READ)
        if hit is None:
            return False
        w, i = hit
        mtu = self.qp.attr.path_mtu
        off = pkt.place.offset if self.metaroce else i * mtu
        exp = min(mtu, w.wr.length - off) if w.wr.length else 0
        if len(pkt.payload) != max(0, exp):
            return False
        start = w.wr.offset + off
        w.wr.local[start:start + len(pkt.payload)] = pkt.payload
        self._mark_response(w, i, now)
        return True

    def _on_atomic_ack(self, pkt, now) -> bool:
        hit = self._on_response(pkt, now, lambda op: op in ATOMICS)
        if hit is None:
            return False
        w, i = hit
        w.wr.local[w.wr.offset:w.wr.offset + 8] = pkt.atomic_ack.to_bytes(8, "little")
        self._mark_response(w, i, now)
        return True

    def _mark_response(self, w, i, now) -> None:
        self._acked(w, i)
        w.seen[i] = True
        self._sample(w, i, now)
        self.evidence = max(self.evidence, w.sent_seq[i])

    # --- MetaRoCE selective repeat -------------------------------------------------------------
    def _holes(self):
        """(wqe, idx) of every sent PSN with no evidence of arrival, one per READ, oldest
        first (not those already waiting in the retransmission queue)."""
        for w in self.inflight:
            if w.wr.opcode is WrOpcode.RDMA_READ:
                if not w.done and not any(w.seen) and w.sent_at[0] is not None:
                    yield w, w.acked.index(False)
                continue
            for i in range(w.una_idx, w.npkts):
                if w.sent_at[i] is None:
                    return  # first transmissions go in PSN order: nothing later was sent
                if not w.acked[i] and not w.seen[i] and not w.queued[i]:
                    yield w, i

    def _lose(self, w: _Wqe, i: int, now: int) -> None:
        """Declare (w, i) lost: out of the window, attributed to its path, queued for resend."""
        self.stats["lost"] += 1
        srtt = self.rto.srtt or 0.0
        if w.infl[i]:
            w.infl[i] = False
            size = self._pkt_bytes(w, i)
            self.inflight_bytes -= size
            if self.cc is not None:
                self.cc.on_loss(now, size, srtt)
        self.paths.on_loss(w.path[i], now, srtt)
        w.queued[i] = True
        self.rtxq.append((w, i))

    def _detect_losses(self, now: int) -> None:
        """SACK-5: (a) a later transmission on the same path was SACKed and RTT_min/4 passed;
        (b) a later transmission on any path was SACKed, the PSN is reorder_threshold below the
        furthest SACKed PSN and SRTT + 2 RTTVAR passed (recency)."""
        if "no_hole_retransmit" in self.qp.test_breaks or self.rnr_until is not None:
            return
        min_rtt = self.rto.min_rtt or 0
        srtt = self.rto.srtt
        recency = int(srtt + 2 * self.rto.rttvar) if srtt is not None else None
        paths = self.paths.paths
        far = self.high_sacked
        lost = []
        horizon = self.sack_horizon
        for w, i in self._holes():
            seq, age = w.sent_seq[i], now - w.sent_at[i]
            if seq >= self.evidence:
                continue
            if horizon is not None and psnm.diff(w.psn(i), horizon) > 0:
                break  # beyond every SACK bitmap so far: its arrival could not be reported
            if w.wr.opcode is WrOpcode.RDMA_READ or w.needs_response:
                if age >= min_rtt // 4:
                    lost.append((w, i))
                continue
            p = paths[w.path[i]]
            if p.born is not None and p.born <= seq < p.evidence and age >= min_rtt // 4:
                lost.append((w, i))  # (a): same port, a later packet arrived
                self.stats["lost_a"] += 1
            elif recency is not None and far is not None and \
                    age >= max(recency, 1.5 * (p.srtt or 0), 1.25 * (self.last_rtt or 0)) and \
                    psnm.diff(far, w.psn(i)) >= REORDER_THRESHOLD:
                lost.append((w, i))  # (b): reorder threshold + recency (the path's own RTT)
                self.stats["lost_b"] += 1
        for w, i in lost:
            if w.needs_response:
                self._send(w, i, now, True)
            else:
                self._lose(w, i, now)

    def _retransmit_all(self, now: int) -> None:
        """RTO (or end of RNR wait): queue every hole, oldest first, and re-request missing
        responses. The queue drains as the congestion window allows (one MTU after an RTO)."""
        broken = "no_hole_retransmit" in self.qp.test_breaks
        for w, i in list(self._holes()):
            if broken and w.sent_seq[i] < self.evidence:
                continue
            if w.needs_response:
                self._send(w, i, now, True)
                continue
            if w.infl[i]:
                w.infl[i] = False
                self.inflight_bytes -= self._pkt_bytes(w, i)
            w.queued[i] = True
            self.rtxq.append((w, i))
        for w in self.inflight:
            if w.needs_response and not w.done and any(w.seen):
                self._send(w, w.acked.index(False), now, True)

    # --- completion ---------------------------------------------------------------------------
    def _retire(self) -> None:
        while self.inflight and self.inflight[0].done:
            w = self.inflight.popleft()
            for i in range(w.npkts):
                self.slots.pop(w.psn(i), None)
            if self.gbn_psn is not None and not self._in_window(self.gbn_psn):
                self.gbn_psn = None
            self._complete(w, WcStatus.SUCCESS)
        if psnm.diff(self.tx_ptr, self.una()) < 0:
            self.tx_ptr = self.una()

    def _complete(self, w: _Wqe, status: WcStatus) -> None:
        wr = w.wr
        self.qp.cq.append(Completion(wr.wr_id, status, WC_OF_WR[wr.opcode],
                                     wr.length if status is WcStatus.SUCCESS else 0, None,
                                     self.qp.attr.qpn))

    def _fail(self, w: _Wqe, status: WcStatus) -> None:
        w.status = status
        self.qp.requester_error()

    def flush(self) -> None:
        """Complete everything outstanding: the failed WQE with its status, the rest flushed."""
        for w in list(self.inflight) + list(self.pending):
            self._complete(w, w.status or WcStatus.WR_FLUSH_ERR)
        self.inflight.clear()
        self.pending.clear()
        self.slots.clear()
        self.rtxq.clear()
        self.inflight_bytes = 0
        self.timer_base = self.rnr_until = None
