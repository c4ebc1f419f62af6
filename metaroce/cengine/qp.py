"""The simulator's adapter of the C engine: `Engine` (one per simulated NIC: its QPs, its
registered memory, its receiver credit manager) and `QueuePair`, with the interface of the
Python reference model (metaroce.engine.QueuePair): ``modify``, ``post_send``, ``post_recv``,
``receive(pkt, now)``, ``on_timer(now)`` at ``next_deadline()``, ``take_packets()``,
``poll_cq()``. Every decision is the C engine's; this module moves work requests, packets and
completions across and exposes the engine's counters (``req.stats``, ``resp.stats``, ...)."""

from __future__ import annotations

import weakref
from collections import deque
from dataclasses import replace

from metaroce.engine.cc import CCConfig
from metaroce.engine.credits import CreditConfig, CreditManager
from metaroce.engine.mr import MRTable
from metaroce.engine.qp import Mode, QPAttr, QPState, QPStateError, check_transition
from metaroce.engine.wr import Completion, RecvWR, SendWR, WcOpcode, WcStatus, WrOpcode
from metaroce.errors import MetaroceError

from . import packets as conv

# deliberately broken behaviour (tests only): name -> MRE_BREAK_* bit
BREAKS = {"complete_before_ack": 1, "no_hole_retransmit": 2, "atomic_reexecute": 4,
          "ignore_credit": 8, "no_spray": 16}
WR_CODE = {WrOpcode.RDMA_WRITE: 0, WrOpcode.RDMA_WRITE_WITH_IMM: 1, WrOpcode.SEND: 2,
           WrOpcode.SEND_WITH_IMM: 3, WrOpcode.RDMA_READ: 4, WrOpcode.ATOMIC_CMP_AND_SWP: 5,
           WrOpcode.ATOMIC_FETCH_AND_ADD: 6}
WC_OF_CODE = {0: WcOpcode.SEND, 1: WcOpcode.RDMA_WRITE, 2: WcOpcode.RDMA_READ,
              3: WcOpcode.COMP_SWAP, 4: WcOpcode.FETCH_ADD, 128: WcOpcode.RECV,
              129: WcOpcode.RECV_RDMA_WITH_IMM}
STATES = list(QPState)  # C state numbers follow this order (RESET .. ERR)
BLOCKED = {0: None, 1: "window", 2: "cwnd", 3: "credit", 4: "pace", 5: "txq"}
VERDICTS = ("accept", "duplicate", "drop", "nak_psn_seq_error", "nak_invalid_request",
            "nak_remote_access_error", "rnr_nak")
BATCH = 256


def _mod():
    try:
        from . import _mre  # noqa: PLC0415
    except ImportError as exc:
        raise MetaroceError("the transport engine is not built: run sudo make setup "
                            "(it builds metaroce/cengine/_mre with cffi)") from exc
    return _mre


class Engine:
    """One C engine: a simulated NIC's QPs, registered memory and credit manager."""

    def __init__(self, credits: CreditConfig | None = None, max_qps: int = 64,
                 max_mrs: int = 64, out_cap: int = 4096, cq_cap: int = 16384):
        m = _mod()
        self.ffi, self.lib = m.ffi, m.lib
        cfg = self.ffi.new("struct mre_engine_cfg *")
        cfg.max_qps, cfg.max_mrs, cfg.out_cap, cfg.cq_cap = max_qps, max_mrs, out_cap, cq_cap
        self.credit_cfg = credits
        if credits is not None:
            cfg.credits, cfg.credit_pace = 1, int(credits.pace)
            cfg.credit_min_senders = credits.min_senders
            cfg.credit_initial_pkts = credits.initial_credit_pkts
            cfg.credit_liveness_rtos = credits.liveness_rtos
            cfg.credit_mtu = credits.mtu
            cfg.credit_idle_ns = credits.idle_ns
            cfg.credit_base_rtt_ns = credits.base_rtt_ns
            cfg.credit_link_rate_bps = credits.link_rate_bps
        e = self.lib.mre_engine_new(cfg)
        if e == self.ffi.NULL:
            raise MemoryError("mre_engine_new")
        self.e = self.ffi.gc(e, self.lib.mre_engine_free)
        self.qps: dict[int, QueuePair] = {}
        self._tx = self.ffi.new("struct mre_pkt[]", BATCH)
        self._cqes = self.ffi.new("struct mre_cqe[]", BATCH)
        self._rx = self.ffi.new("struct mre_pkt *")
        self._mem: dict[int, object] = {}        # rkey -> cdata keeping registered memory alive

    @property
    def grants(self) -> int:
        """MR_CREDIT packets this NIC's responders sent."""
        return self.lib.mre_credit_grants(self.e)

    def register(self, mrs: MRTable) -> None:
        for m in mrs.regions():
            mem = self.ffi.from_buffer(m.buf)
            self._mem[m.rkey] = mem
            if self.lib.mre_mr_reg(self.e, m.rkey, m.addr, len(m.buf), int(m.access), mem) < 0:
                raise MetaroceError("too many memory regions for this engine")

    def drain(self, now: int) -> None:
        """Move the engine's output to its QPs: packets to send, completions."""
        lib, ffi, e, qps = self.lib, self.ffi, self.e, self.qps
        tx = self._tx
        while True:
            n = lib.mre_take_tx(e, tx, BATCH, now)
            if not n:
                break
            for i in range(n):
                d = tx[i]
                qps[d.qp]._out.append(conv.to_packet(ffi, d))
        cq = self._cqes
        while True:
            n = lib.mre_take_cqes(e, cq, BATCH)
            if not n:
                break
            for i in range(n):
                qps[cq[i].qp]._completed(cq[i])


def set_cc(cfg, cc: CCConfig) -> None:
    """Turn congestion control on in a `struct mre_qp_cfg` with cc's parameters (the
    simulator's QPs here, the wire's through metaroce/nic/ccconfig.py)."""
    cfg.cc = 1
    for f in ("line_rate_bps", "base_rtt_ns", "target_qdelay_ns", "bdp_factor", "alpha", "beta",
              "max_mdf"):
        setattr(cfg, "cc_" + f, getattr(cc, f))
    cfg.cc_enabled, cfg.dcqcn = int(cc.enabled), int(cc.dcqcn)
    for f in ("g", "alpha_timer_ns", "rate_timer_ns", "byte_counter", "fast_steps", "ai_bps",
              "hai_bps", "min_bps"):
        setattr(cfg, "dcqcn_" + f, getattr(cc, "dcqcn_" + f))
    cfg.cnp_interval_ns = cc.cnp_interval_ns


_SHARED: "weakref.WeakKeyDictionary[CreditManager, Engine]" = weakref.WeakKeyDictionary()


def _engine_for(credits: CreditManager) -> Engine:
    """QPs given the same Python CreditManager share one engine (one receiving NIC)."""
    eng = _SHARED.get(credits)
    if eng is None:
        eng = _SHARED[credits] = Engine(credits.cfg)
    return eng


class QueuePair:
    """A QP of the C engine, driven like metaroce.engine.QueuePair."""

    def __init__(self, qpn: int, mode: Mode = Mode.COMPAT, mrs: MRTable | None = None,
                 min_rto_ns: int = 50_000, _test_break: str | set | None = None,
                 cc: CCConfig | None = None, paths: int = 1, credits=None, seed: int = 0,
                 engine: Engine | None = None, sq_cap: int = 1024, rq_cap: int = 1024):
        """``credits``: None (no CREDIT capability), True (the engine's credit manager) or a
        CreditManager (QPs given the same one share an engine); ``engine``: the NIC this QP
        lives on (default: a private one)."""
        breaks = {_test_break} if isinstance(_test_break, str) else set(_test_break or ())
        if breaks - set(BREAKS):
            raise ValueError(f"unknown _test_break {breaks - set(BREAKS)}")
        if engine is None:
            engine = _engine_for(credits) if isinstance(credits, CreditManager) else Engine()
        self.engine, self.ffi, self.lib = engine, engine.ffi, engine.lib
        self.mode, self.cc_cfg, self.npaths, self.seed = mode, cc, paths, seed
        self.mrs = mrs if mrs is not None else MRTable()
        self._mr_version = None
        cfg = self.ffi.new("struct mre_qp_cfg *")
        cfg.qpn, cfg.mode, cfg.paths = qpn, int(mode is Mode.METAROCE), paths
        cfg.credits = int(credits is not None)
        cfg.breaks = sum(BREAKS[b] for b in breaks)
        cfg.sq_cap, cfg.rq_cap, cfg.min_rto_ns, cfg.seed = sq_cap, rq_cap, min_rto_ns, seed
        if cc is not None:
            set_cc(cfg, cc)
        h = self.lib.mre_qp_new(engine.e, cfg)
        if h < 0:
            raise ValueError("paths must be in 1..64 (MP-1)" if not 1 <= paths <= 64 else
                             f"cannot create QP (engine error {h})")
        self.h = h
        engine.qps[h] = self
        self.attr = QPAttr(qpn=qpn)
        self.cq: list[Completion] = []
        self._out: list = []
        self._send_keep: deque = deque()        # posted SGEs, until their completion
        self._recv_keep: deque = deque()
        self._wqe = self.ffi.new("struct mre_wqe *")
        self.req, self.resp = _Requester(self), _Responder(self)

    def destroy(self) -> None:
        """ibv_destroy_qp: the engine forgets this QP (else it goes with the engine)."""
        if self.engine.qps.get(self.h) is self:
            del self.engine.qps[self.h]
            self.lib.mre_qp_free(self.engine.e, self.h)

    @property
    def state(self) -> QPState:
        return STATES[self.lib.mre_qp_state(self.engine.e, self.h)]

    def info(self):
        i = self.ffi.new("struct mre_qp_info *")
        self.lib.mre_qp_info(self.engine.e, self.h, i)
        return i

    # --- verbs --------------------------------------------------------------------------------
    def modify(self, new: QPState, **attrs) -> None:
        check_transition(self.state, new)
        cand = replace(self.attr, **attrs)
        cand.validate()
        a = self.ffi.new("struct mre_qp_attr *")
        for f in ("dest_qpn", "sq_psn", "rq_psn", "path_mtu", "timeout", "retry_cnt",
                  "rnr_retry", "min_rnr_timer", "max_rd_atomic", "max_dest_rd_atomic",
                  "window"):
            setattr(a, f, getattr(cand, f))
        rc = self.lib.mre_qp_modify(self.engine.e, self.h, STATES.index(new), a)
        if rc < 0:
            raise QPStateError(f"modify to {new.value} failed (engine error {rc})")
        self.attr = cand
        self._drain(0)

    def post_send(self, wr: SendWR, now: int = 0) -> None:
        st = self.state
        if st is not QPState.ERR and st not in (QPState.RTS, QPState.SQD):
            raise QPStateError(f"post_send in state {st.value}")
        w = self._wqe
        w.wr_id, w.opcode, w.send_flags = wr.wr_id, WR_CODE[wr.opcode], 2   # signaled
        w.length, w.remote_addr, w.rkey = wr.length, wr.remote_addr, wr.rkey
        w.imm = (wr.imm or 0) & 0xFFFFFFFF
        w.compare_add, w.swap = wr.compare_add & (2**64 - 1), wr.swap & (2**64 - 1)
        keep = self.ffi.from_buffer(wr.local) if len(wr.local) else None
        w.local = int(self.ffi.cast("uintptr_t", keep)) + wr.offset if keep is not None else 0
        rc = self.lib.mre_post_send(self.engine.e, self.h, w, now)
        if rc < 0:
            raise ValueError(f"post_send failed (engine error {rc})")
        self._send_keep.append(keep)
        self._drain(now)

    def post_recv(self, wr: RecvWR) -> None:
        if self.state is QPState.RESET:
            raise QPStateError("post_recv in state RESET")
        keep = self.ffi.from_buffer(wr.buf) if len(wr.buf) else None
        ptr = keep + wr.offset if keep is not None else self.ffi.NULL
        self._recv_keep.append(keep)
        if self.lib.mre_post_recv(self.engine.e, self.h, wr.wr_id, ptr, wr.length) < 0:
            self._recv_keep.pop()
            raise ValueError("receive queue full")
        self._drain(0)

    def poll_cq(self) -> list[Completion]:
        out, self.cq = self.cq, []
        return out

    # --- packet and timer input ----------------------------------------------------------------
    def receive(self, pkt, now: int) -> None:
        if self._mr_version != self.mrs.version:
            self.engine.register(self.mrs)
            self._mr_version = self.mrs.version
        d = self.engine._rx
        keep = conv.fill(self.ffi, d, pkt)
        self.lib.mre_rx(self.engine.e, self.h, d, now)
        del keep
        self._drain(now)

    def next_deadline(self) -> int | None:
        d = self.lib.mre_qp_deadline(self.engine.e, self.h)
        return None if d < 0 else d

    def on_timer(self, now: int) -> None:
        self.lib.mre_on_timer(self.engine.e, self.h, now)
        self._drain(now)

    def take_packets(self) -> list:
        out, self._out = self._out, []
        return out

    # --- engine output ---------------------------------------------------------------------------
    def _drain(self, now: int) -> None:
        self.engine.drain(now)

    def _completed(self, c) -> None:
        recv = c.opcode >= 128
        q = self._recv_keep if recv else self._send_keep
        if q:
            q.popleft()
        self.cq.append(Completion(c.wr_id, WcStatus(c.status), WC_OF_CODE[c.opcode],
                                  c.byte_len, c.imm if c.wc_flags & 2 else None, c.qpn))


class _Rto:
    def __init__(self, i):
        self.srtt = None if i.srtt < 0 else i.srtt
        self.rttvar, self.samples, self.backoff = i.rttvar, i.rto_samples, i.backoff
        self.min_rtt = None if i.min_rtt < 0 else i.min_rtt
        self.rto_ns, self.min, self.max = i.rto_ns, i.rto_min, i.rto_max


class _Window:
    def __init__(self, i):
        self.cwnd, self.max_cwnd = i.cwnd, i.max_cwnd
        self.stats = {"md": i.cc_md, "loss_cuts": i.cc_loss_cuts, "rto_resets": i.cc_rto_resets,
                      "ecn_path_only": i.cc_ecn_path_only}


class _Paths:
    def __init__(self, qp):
        self._qp = qp
        i = qp.info()
        self.evictions = i.path_evictions
        p = qp.ffi.new("struct mre_path_info *")
        self.paths = []
        for k in range(i.paths):
            qp.lib.mre_path_info(qp.engine.e, qp.h, k, p)
            self.paths.append(_Path(p))

    def __len__(self) -> int:
        return len(self.paths)

    def sport(self, k: int) -> int:
        return self.paths[k].sport

    def stats(self) -> list[dict]:
        return [p.stats() for p in self.paths]


class _Path:
    def __init__(self, p):
        self.sport, self.weight, self.sent, self.acked = p.sport, p.weight, p.sent, p.acked
        self.lost, self.rtos, self.ecn, self.evictions = p.lost, p.rtos, p.ecn, p.evictions
        self.srtt = None if p.srtt < 0 else p.srtt

    def stats(self) -> dict:
        return {"sport": self.sport, "weight": round(self.weight, 3), "sent": self.sent,
                "acked": self.acked, "lost": self.lost, "rtos": self.rtos, "ecn": self.ecn,
                "srtt_ns": None if self.srtt is None else int(self.srtt),
                "evictions": self.evictions}


class _Gate:
    def __init__(self, i):
        self.active, self.limit = bool(i.credit_active), i.credit_limit


class _Dcqcn:
    def __init__(self, i):
        self.limited, self.rc = bool(i.dcqcn_limited), i.dcqcn_rc


class _Requester:
    """The requester's counters and state, read from the engine (names of the Python model)."""

    def __init__(self, qp):
        self._qp = qp

    @property
    def stats(self) -> dict:
        i = self._qp.info()
        return {k: getattr(i, k) for k in ("tx", "retx", "timeouts", "rnr", "rtt_samples",
                                           "lost", "lost_a", "lost_b", "cnp", "probes",
                                           "tx_bytes")}

    @property
    def rto(self) -> _Rto:
        return _Rto(self._qp.info())

    @property
    def cc(self) -> _Window | None:
        i = self._qp.info()
        return _Window(i) if i.cwnd >= 0 else None

    @property
    def paths(self) -> _Paths:
        return _Paths(self._qp)

    @property
    def credit(self) -> _Gate | None:
        i = self._qp.info()
        return _Gate(i) if i.credit_on else None

    @property
    def dcqcn(self) -> _Dcqcn | None:
        i = self._qp.info()
        return _Dcqcn(i) if i.dcqcn_on else None

    @property
    def blocked(self) -> str | None:
        return BLOCKED[self._qp.info().blocked]

    @property
    def nxt(self) -> int:
        return self._qp.info().nxt

    @property
    def last_rtt(self) -> int | None:
        v = self._qp.info().last_rtt
        return None if v < 0 else v

    def timeout_ns(self) -> int | None:
        v = self._qp.info().timeout_ns
        return None if v < 0 else v


class _RespState:
    def __init__(self, epsn):
        self.epsn = epsn


class _Responder:
    def __init__(self, qp):
        self._qp = qp

    @property
    def rx_bytes(self) -> int:
        return self._qp.lib.mre_qp_rx_bytes(self._qp.engine.e, self._qp.h)

    @property
    def stats(self) -> dict:
        i = self._qp.info()
        out = dict(zip(VERDICTS, (i.r_accept, i.r_duplicate, i.r_drop, i.r_nak_seq,
                                  i.r_nak_invalid, i.r_nak_access, i.r_rnr)))
        out.update(ce=i.r_ce, cnp=i.r_cnp, sacks=i.r_sacks, grants=i.r_grants,
                   probes=i.r_probes, rx_bytes=i.r_rx_bytes, read_go_backs=i.read_go_backs,
                   read_pending=i.read_pending)
        return out

    @property
    def msn(self) -> int:
        return self._qp.info().msn

    @property
    def state(self) -> _RespState:
        return _RespState(self._qp.info().epsn)
