"""Requester: segments work requests into packets, tracks PSNs, retransmits (go-back-N in
compat mode, selective repeat in MetaRoCE mode) and completes WRs in posting order."""

from collections import deque
from dataclasses import dataclass, field

from metaroce.wire.consts import AETH_TYPE_MASK, AETH_VALUE_MASK, MSN_MASK, AethType, NakCode
from metaroce.wire.consts import Opcode as O

from . import packets as P
from . import psn as psnm
from .qp import Mode, rnr_timer_ns
from .rto import RtoEstimator
from .wr import ATOMICS, NEEDS_RESPONSE, WC_OF_WR, Completion, SendWR, WcStatus, WrOpcode

ACK_REQ_EVERY = 16  # AckReq on the last packet of a message and on every 16th packet
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
    status: WcStatus | None = None

    @property
    def needs_response(self) -> bool:
        return self.wr.opcode in NEEDS_RESPONSE

    @property
    def done(self) -> bool:
        return all(self.acked)

    def psn(self, idx: int) -> int:
        return psnm.add(self.first_psn, idx)


class Requester:
    def __init__(self, qp, min_rto_ns: int = 10_000):
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
        self.stats = {"tx": 0, "retx": 0, "timeouts": 0, "rnr": 0, "rtt_samples": 0}

    @property
    def metaroce(self) -> bool:
        return self.qp.mode is Mode.METAROCE

    def start(self, sq_psn: int) -> None:
        self.nxt = self.tx_ptr = sq_psn
        ack_to = self.qp.attr.local_ack_timeout_ns
        self.rto = RtoEstimator(ack_to or 1_000_000_000, min_ns=self.min_rto_ns,
                                max_ns=max(ack_to or 0, 1_000_000_000))

    # --- posting and transmission -------------------------------------------------------------
    def post(self, wr: SendWR) -> None:
        mtu = self.qp.attr.path_mtu
        n = 1 if wr.opcode in ATOMICS else P.npackets(wr.length, mtu)
        if wr.opcode is WrOpcode.RDMA_READ and n > self.qp.attr.window:
            raise ValueError("READ longer than window x MTU is not supported in this slice")
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
            for i, a in enumerate(w.acked):
                if not a:
                    return w.psn(i)
        return self.nxt

    def _rd_atomic_outstanding(self) -> int:
        return sum(1 for w in self.inflight if w.needs_response and not w.done)

    def pump(self, now: int) -> None:
        """Transmit what the window, RNR wait and QP state allow."""
        if self.rnr_until is not None:
            return
        window, una = self.qp.attr.window, self.una()
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
            if psnm.distance(self.tx_ptr, una) + span > window:
                break
            retx = w.sent_at[idx] is not None
            self._send(w, idx, now, retx)
            self.tx_ptr = psnm.add(self.tx_ptr, span)
        self._arm(now)

    def _assign(self, w: _Wqe) -> None:
        w.first_psn = self.nxt
        w.acked = [False] * w.npkts
        w.seen = [False] * w.npkts
        w.sent_at = [None] * w.npkts
        w.sent_seq = [-1] * w.npkts
        w.retx = [0] * w.npkts
        for i in range(w.npkts):
            self.slots[w.psn(i)] = (w, i)
        self.nxt = psnm.add(self.nxt, w.npkts)
        self.inflight.append(w)

    def _send(self, w: _Wqe, idx: int, now: int, retx: bool) -> None:
        """Emit the packet for PSN slot idx of w (a READ from idx covers the rest of it)."""
        wr, mtu, mr = w.wr, self.qp.attr.path_mtu, self.metaroce
        psn = w.psn(idx)
        place = P.Placement(w.ssn, w.rsn, idx * mtu) if mr else None
        op = wr.opcode
        if op is WrOpcode.RDMA_READ:
            reth = P.Reth(wr.remote_addr + idx * mtu, wr.rkey, max(0, wr.length - idx * mtu))
            pkt = P.Packet(P.to_mode(O.RC_RDMA_READ_REQUEST, mr), psn, self.qp.attr.dest_qpn,
                           ack_req=True, reth=reth, place=place, retx=retx, ts=now)
            touched = range(idx, w.npkts)
        elif op in ATOMICS:
            rc = O.RC_COMPARE_SWAP if op is WrOpcode.ATOMIC_CMP_AND_SWP else O.RC_FETCH_ADD
            a = P.AtomicEth(wr.remote_addr, wr.rkey,
                            wr.swap if op is WrOpcode.ATOMIC_CMP_AND_SWP else wr.compare_add,
                            wr.compare_add if op is WrOpcode.ATOMIC_CMP_AND_SWP else 0)
            pkt = P.Packet(P.to_mode(rc, mr), psn, self.qp.attr.dest_qpn, ack_req=True, atomic=a,
                           place=place, retx=retx, ts=now)
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
                           payload=w.data[idx * mtu:(idx + 1) * mtu])
            touched = (idx,)
        for i in touched:
            if w.sent_at[i] is not None:
                w.retx[i] += 1
            w.sent_at[i] = now
            w.sent_seq[i] = self.tx_seq
        self.tx_seq += 1
        self.stats["retx" if retx else "tx"] += 1
        self.qp.emit(pkt)
        if "complete_before_ack" in self.qp.test_breaks and not w.needs_response:
            if all(t is not None for t in w.sent_at):
                w.acked = [True] * w.npkts

    # --- timers -------------------------------------------------------------------------------
    def _outstanding(self) -> bool:
        return any(not w.done and any(t is not None for t in w.sent_at) for w in self.inflight)

    def _arm(self, now: int) -> None:
        if not self._outstanding():
            self.timer_base = None
        elif self.timer_base is None:
            self.timer_base = now

    def timeout_ns(self) -> int | None:
        if self.metaroce:
            return self.rto.rto_ns
        return self.qp.attr.local_ack_timeout_ns

    def deadline(self) -> int | None:
        cands = []
        if self.rnr_until is not None:
            cands.append(self.rnr_until)
        t = self.timeout_ns()
        if self.timer_base is not None and t is not None and self.rnr_until is None:
            cands.append(self.timer_base + t)
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
        t = self.timeout_ns()
        if self.timer_base is None or t is None or now < self.timer_base + t:
            return
        self.stats["timeouts"] += 1
        self.retries += 1
        if self.retries > self.qp.attr.retry_cnt:
            self._fail(self.inflight[0], WcStatus.RETRY_EXC_ERR)
            return
        self.timer_base = now
        if self.metaroce:
            self.rto.on_timeout()
            self._retransmit_all(now)
        else:
            self.gbn_psn = None
            self._go_back(self.una())
        self.pump(now)

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
            for i in range(w.npkts):
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
                w.acked[i] = True
                progress = True
        return progress

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
        sacked = [psnm.add(cum, 2 + i) for i in range(pkt.sack.bit_length()) if pkt.sack >> i & 1]
        first = self.inflight[0].first_psn if self.inflight else self.nxt
        for w in self.inflight:
            for i in range(w.npkts):
                q = w.psn(i)
                if not (psnm.diff(q, cum) <= 0 and psnm.diff(q, first) >= 0) and q not in sacked:
                    continue
                if w.needs_response:
                    w.seen[i] = True
                elif not w.acked[i]:
                    w.acked[i] = True
                    newly.append((w, i))
        for w, i in newly:
            self.evidence = max(self.evidence, w.sent_seq[i])
        if newly:
            w, i = max(newly, key=lambda wi: wi[0].sent_at[wi[1]] or -1)
            self._sample(w, i, now)
        if typ == AethType.RNR_NAK:
            self._rnr(val, now)
        return bool(newly)

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
        w.acked[i] = True
        w.seen[i] = True
        self._sample(w, i, now)
        self.evidence = max(self.evidence, w.sent_seq[i])

    # --- MetaRoCE selective repeat -------------------------------------------------------------
    def _holes(self):
        """(wqe, idx) of every sent PSN with no evidence of arrival, one per READ."""
        for w in self.inflight:
            if w.wr.opcode is WrOpcode.RDMA_READ:
                if not w.done and not any(w.seen) and w.sent_at[0] is not None:
                    yield w, w.acked.index(False)
                continue
            for i in range(w.npkts):
                if not w.acked[i] and not w.seen[i] and w.sent_at[i] is not None:
                    yield w, i

    def _detect_losses(self, now: int) -> None:
        """SACK evidence: a hole sent before some acknowledged packet is lost (single path)."""
        if "no_hole_retransmit" in self.qp.test_breaks or self.rnr_until is not None:
            return
        min_rtt = self.rto.min_rtt or 0
        for w, i in list(self._holes()):
            if w.sent_seq[i] < self.evidence and now - w.sent_at[i] >= min_rtt // 4:
                self._send(w, i, now, True)

    def _retransmit_all(self, now: int) -> None:
        """RTO (or end of RNR wait): resend every hole and re-request missing responses."""
        broken = "no_hole_retransmit" in self.qp.test_breaks
        for w, i in list(self._holes()):
            if broken and w.sent_seq[i] < self.evidence:
                continue
            self._send(w, i, now, True)
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
        self.timer_base = self.rnr_until = None
