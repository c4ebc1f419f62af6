"""The data-path worker of one device, inside the daemon: protection domains, memory regions,
completion queues and RC queue pairs of every application, the requester of each QP (PSNs,
the go-back-N window, retransmission, retry and RNR budgets, in-order completion), READ
responses, and the events the kernel reports. Work requests arrive in the QPs' shared rings
(metaroce/nic/vrings.py) and completions leave through the CQs' rings. The kernel places,
acknowledges and drops; the C fast path builds and sends packets in batches; this module
decides per work request and per event, never per packet."""

from __future__ import annotations

import os
import secrets
import sys
import time
from collections import deque
from dataclasses import dataclass

from ..engine.wr import WcStatus
from ..errors import MetaroceError
from ..fastpath.xsk import XskSocket, _lib
from . import neigh
from ..wire.consts import SACK_F_ECE
from .cq import MAX_CQE, Cq, checked_cqe, ring_entries
from .credit import CreditConfig, CreditGranter
from .paths import MAX_DP_PATHS, PathSet
from .rx import (CREDIT_VALID, ACCESS_LOCAL_WRITE, ACCESS_REMOTE_ATOMIC, ACCESS_REMOTE_READ, EV_ACK, EV_CNP,
                 EV_EPSN, EV_NAK, EV_QP_ERROR, EV_RD_DONE, EV_RD_GAP, EV_READ_REQUEST, EV_RECV,
                 EV_RECV_ERR, EV_SACK, QP_COUNTERS, QP_RX_ERROR, RD_ATOMIC, RD_DEPTH, RD_READ,
                 RQ_DEPTH, RX_REASONS, MemoryRegion, RxPath)
from .vrings import CqRing, QpRings, RingTable, Scratch, drain_eventfd, new_eventfd
from .wqe import (MAX_MSG, MSG_CMP_SWAP, MSG_FETCH_ADD, MSG_READ_REQ, MSG_READ_RESP, MSG_SEND,
                  MSG_WRITE, SEND_KINDS, BadWqe, check_recv, check_send, check_sge_in,
                  not_in_pd)

PSN_MASK, PSN_HALF = 0xFFFFFF, 0x800000
RECV_F_SOLICITED = 8     # EV_RECV flags: the message had SE set (bpf/nic/nic_consts.h)
MSG_NAMES = {MSG_WRITE: "WRITE", MSG_SEND: "SEND", MSG_READ_REQ: "READ", MSG_CMP_SWAP: "CMP_SWAP",
             MSG_FETCH_ADD: "FETCH_ADD"}
WC_OPCODE = {MSG_WRITE: "RDMA_WRITE", MSG_SEND: "SEND", MSG_READ_REQ: "RDMA_READ",
             MSG_CMP_SWAP: "COMP_SWAP", MSG_FETCH_ADD: "FETCH_ADD"}


def _wc_opcode(wr_opcode: int) -> str:
    """The completion opcode of a work request opcode (SEND for one that is not any)."""
    kind = SEND_KINDS.get(wr_opcode)
    return WC_OPCODE[kind[0]] if kind else "SEND"


def _wc_op(w) -> str:
    return w.opcode or WC_OPCODE[w.kind]


# a failed receive's status by the program's reason: too long for its buffer, or a slot of the
# owner's receive queue that is no receive; else its buffer was not the owner's to receive into
_RECV_ERR_STATUS = {RX_REASONS.index("invalid_request"): WcStatus.LOC_LEN_ERR,
                    RX_REASONS.index("bad_recv_wqe"): WcStatus.LOC_QP_OP_ERR}
NAK_STATUS = {0x61: WcStatus.REM_INV_REQ_ERR, 0x62: WcStatus.REM_ACCESS_ERR,
              0x63: WcStatus.REM_OP_ERR}
SEND_SIGNALED, SEND_INLINE, SEND_SOLICITED = 2, 8, 4       # IBV_SEND_* values
MAX_INLINE = 256         # max_inline_data
MAX_SGE = 16             # max_sge
WINDOW_PKTS = 1024       # request packets in flight per QP (go-back-N window)
MR_WINDOW_PKTS = 127     # MetaRoCE: the responder records PSNs up to ePSN + 127 (SACK-1)
REORDER_THRESHOLD = 16   # SACK-5 (b): PSNs below the highest SACKed before any path's hole counts
MAX_EXT = 48             # the longest extension headers a packet carries (PETH + AtomicETH)
# RTO-1: the spec's default RTO_min is 50 us; this software NIC's event loop (Python, woken
# across vCPUs) has millisecond jitter, so its floor is 1 ms: a lower one retransmits spuriously
RTO_MIN_S = 1e-3
INITIAL_CREDIT_PKTS = 2         # CC-8: what a MetaRoCE sender may send before the first SACK
DEVICE_LIMITS = {"max_qp": 4096, "max_mr": 4096, "max_cq": 65536, "max_pd": 65536,
                 "max_cqe": MAX_CQE, "max_qp_wr": 4096, "max_sge": MAX_SGE, "max_qp_rd_atom": RD_DEPTH,
                 "max_qp_init_rd_atom": RD_DEPTH, "max_mr_size": 1 << 34,
                 "max_msg_sz": MAX_MSG, "max_srq": 0, "atomic_cap": "ATOMIC_HCA",
                 "max_recv_wr": RQ_DEPTH, "max_paths": 8, "max_inline_data": MAX_INLINE}


def _after(a: int, b: int) -> bool:
    return 0 < ((a - b) & PSN_MASK) < PSN_HALF


def _add(a: int, n: int) -> int:
    return (a + n) & PSN_MASK


def timeout_s(code: int) -> float | None:
    """Local ACK timeout 4.096 us * 2^code (RESP-8); 0 = infinite."""
    return None if code == 0 else 4.096e-6 * (1 << code)


def rnr_timer_s(code: int) -> float:
    table = (655.36, .01, .02, .03, .04, .06, .08, .12, .16, .24, .32, .48, .64, .96, 1.28, 1.92,
             2.56, 3.84, 5.12, 7.68, 10.24, 15.36, 20.48, 30.72, 40.96, 61.44, 81.92, 122.88,
             163.84, 245.76, 327.68, 491.52)
    return table[code & 31] / 1000


@dataclass
class SendWqe:
    wr_id: int
    kind: int
    signaled: bool
    msg: object            # cffi struct mr_roce_msg
    data: object           # cffi pointer to the payload (or NULL)
    keep: object           # what keeps an inline / gathered payload alive
    npkts: int
    local: tuple | None = None   # READ / atomic destination: (lkey, addr, length)
    first_psn: int = 0
    rd_idx: int = -1
    done: bool = False
    status: int = 0
    opcode: str | None = None    # the completion's opcode when it never became a message

    @property
    def last_psn(self) -> int:
        return _add(self.first_psn, self.npkts - 1)


def _cap(cap: dict, name: str, default: int, lo: int, hi: int) -> int:
    try:
        v = int(cap.get(name, default))
    except (TypeError, ValueError):
        raise MetaroceError(f"{name} must be a number") from None
    if not lo <= v <= hi:
        raise MetaroceError(f"{name} must be {lo} .. {hi}, not {v}")
    return v


class Qp:
    def __init__(self, qpn: int, owner, pd: int, send_cq: Cq, recv_cq: Cq, cap: dict):
        self.qpn, self.owner, self.pd = qpn, owner, pd
        self.send_cq, self.recv_cq = send_cq, recv_cq
        self.max_send_wr = _cap(cap, "max_send_wr", 1024, 1, DEVICE_LIMITS["max_qp_wr"])
        self.max_recv_wr = min(_cap(cap, "max_recv_wr", RQ_DEPTH, 0, 1 << 20), RQ_DEPTH)
        self.max_send_sge = _cap(cap, "max_send_sge", MAX_SGE, 0, MAX_SGE)
        self.max_recv_sge = min(_cap(cap, "max_recv_sge", 1, 0, MAX_SGE), 1)   # receives take one
        self.max_inline = _cap(cap, "max_inline_data", MAX_INLINE, 0, MAX_INLINE)
        self.rings: QpRings | None = None       # the owner's shared send and receive queues
        self.state = "INIT"
        self.sq_psn = secrets.randbits(24)      # unpredictable initial PSN (SEC)
        self.remote: dict = {}
        self.flow = None
        self.pmtu = 1024
        self.pending: deque[SendWqe] = deque()  # posted, no PSN yet
        self.sq: deque[SendWqe] = deque()       # PSNs assigned, not completed (posting order)
        self.cursor = (0, 0)                    # next (index in sq, packet) to transmit
        self.next_psn = self.sq_psn
        self.una = self.sq_psn
        self.rd_next = 0                        # READ/ATOMIC slots used
        self.rd_open = 0                        # of them outstanding
        self.retry_cnt = self.rnr_retry = 7
        self.retries_left = self.rnr_left = 7
        self.timeout = None
        self.never_fails = False                # timeout 0: no failure for lack of ACKs (RTO-4)
        self.deadline = None                    # retransmission timer
        self.hold_until = 0.0                   # RNR wait
        self.rq_done = 0                        # receives completed (the ring's consumer index)
        # MetaRoCE mode (spec 5.2): selective repeat
        self.metaroce = False
        self.ssn = 0                            # next request message's SSN
        self.rsn = 0                            # receive-consuming messages sent so far
        self.sacked: set[int] = set()           # PSNs the peer SACKed beyond una
        self.retx: deque[int] = deque()         # PSNs to retransmit, ahead of new data
        self.retx_sent: set[int] = set()        # retransmitted once for this loss (SACK-5)
        self.rereads: deque = deque()           # partial READ requests to send (RESP-4)
        self.rd_served: int | None = None       # as a responder: last READ response PSN queued
        self.rx_epsn = None                     # the responder's cumulative PSN as last heard
        self.recv_wait: dict[int, tuple] = {}   # RSN -> (last PSN, WC): completes in order
        self.srtt = None                        # RTO-1 estimator (seconds)
        self.rttvar = 0.0
        self.backoff = 1                        # RTO-2 doubling until progress
        self.rd_progress = None                 # the kernel's READ response position at the last expiry
        self.fatal = None                       # (failing WQE, status) of a fatal NAK that waits
                                                # for the READ responses before it (_on_nak)
        self.stats = {"retransmitted_packets": 0, "local_ack_timeout_err": 0, "rnr_nak_retry": 0,
                      "packet_seq_err_handled": 0, "sent_packets": 0, "sent_bytes": 0,
                      "read_response_packets": 0, "sacks_handled": 0,
                      "selective_retransmits": 0, "rto_expired": 0, "partial_rereads": 0,
                      "read_go_backs": 0, "read_requests_pending": 0,
                      "cnp_received": 0, "credit_grants": 0, "credit_blocked": 0}
        self.credit_limit = None                # CC-8: no new PSN at or past it (None: unlimited)
        self.paths: PathSet | None = None       # MetaRoCE multipath (spec 5.4), when negotiated
        self.last_rtt = None                    # the latest RTT sample (SACK-5 (b))
        self.send_log: deque = deque()          # (first PSN after a send batch, when): SACK-5's
                                                # recency check, one entry per batch

    @property
    def in_flight_pkts(self) -> int:
        return (self.next_psn - self.una) & PSN_MASK if self.sq else 0


class Device:
    """PDs, MRs, CQs and QPs of every connection of one daemon, and the worker that moves
    their work requests."""

    def __init__(self, rx: RxPath, ifindex: int, mode: str, credits: CreditConfig | None = None):
        self.rx, self.ifindex, self.mode = rx, ifindex, mode
        self.credits = CreditGranter(rx, credits) if credits and mode == "metaroce" else None
        mod = _lib()
        self.ffi, self.c = mod.ffi, mod.lib
        self.xsk = XskSocket(ifindex)
        err = self.ffi.new("int *")
        self.ring = self.c.mr_evring_open(rx.events_fd, err)
        if self.ring == self.ffi.NULL:
            raise MetaroceError(f"event ring: {os.strerror(err[0])}")
        self._evp = self.ffi.new("struct mr_nic_event **")
        self.mrs: dict[int, tuple[MemoryRegion, object, object]] = {}   # key -> (mr, owner, ptr)
        self.pds: dict[int, object] = {}
        self.cqs: dict[int, Cq] = {}
        self.qps: dict[int, Qp] = {}
        self.destroyed_qp_counters: dict[str, int] = {}   # summed over QPs that are gone
        self.responses: deque = deque()          # READ responses to send: (qp, msg, ptr, next)
        self._next_handle = 1
        self.dirty_cqs: set[int] = set()
        self.overrun_cqs: list[Cq] = []          # overran since the last take_async_events
        # the shared-memory queues: every ring drained, a scratch to copy WQEs out into, each
        # application's doorbell (an eventfd it rings when the daemon sleeps) and completion
        # channels (eventfds the daemon signals)
        self.rings = RingTable()
        self.scratch = Scratch(512)
        self.doorbells: dict[object, int] = {}
        self.channels: dict[int, tuple[object, int]] = {}
        self.settle_qps: set[Qp] = set()         # whose ring slots to release this round

    # ---- resources ---------------------------------------------------------------------

    def _handle(self) -> int:
        self._next_handle += 1
        return self._next_handle

    def alloc_pd(self, owner) -> int:
        h = self._handle()
        self.pds[h] = owner
        return h

    def _own_pd(self, owner, pd: int) -> None:
        if self.pds.get(pd) is not owner:
            raise MetaroceError(f"no protection domain {pd}")

    def reg_mr(self, owner, pd: int, length: int, access: int) -> MemoryRegion:
        self._own_pd(owner, pd)
        if not 0 < length <= DEVICE_LIMITS["max_mr_size"]:
            raise MetaroceError(f"MR length must be 1 .. {DEVICE_LIMITS['max_mr_size']} bytes")
        if access & (ACCESS_REMOTE_ATOMIC | 2) and not access & ACCESS_LOCAL_WRITE:
            raise MetaroceError("remote write or atomic access needs local write (as in verbs)")
        mr = self.rx.reg_mr(length, pd, access)
        self.mrs[mr.rkey] = (mr, owner, self.ffi.from_buffer(mr._mm))
        return mr

    def dereg_mr(self, owner, key: int) -> None:
        ent = self.mrs.get(key)
        if ent is None or ent[1] is not owner:
            raise MetaroceError(f"no memory region with key 0x{key:08x}")
        del self.mrs[key]
        self._dereg(ent)

    def _dereg(self, ent) -> None:
        self.ffi.release(ent[2])        # the C view of the memory first, then the kernel's
        self.rx.dereg_mr(ent[0])

    def create_comp_channel(self, owner) -> tuple[int, int]:
        """A completion channel: (handle, its eventfd, which the owner gets a copy of)."""
        h = self._handle()
        self.channels[h] = (owner, new_eventfd())
        return h, self.channels[h][1]

    def destroy_comp_channel(self, owner, h: int) -> None:
        ent = self.channels.get(h)
        if ent is None or ent[0] is not owner:
            raise MetaroceError(f"no completion channel {h}")
        if any(c.channel == h for c in self.cqs.values()):
            raise MetaroceError(f"completion channel {h} still has CQs")
        os.close(self.channels.pop(h)[1])

    def create_cq(self, owner, cqe: int, channel: int | None = None, shared: bool = True) -> Cq:
        """A CQ; shared: its completions go into a ring in shared memory (an application's),
        events to `channel` (or to a channel of its own, created here)."""
        if len(self.cqs) >= DEVICE_LIMITS["max_cq"]:
            raise MetaroceError(f"too many CQs (max_cq {DEVICE_LIMITS['max_cq']})")
        checked_cqe(cqe)
        if channel is not None and self.channels.get(channel, (None,))[0] is not owner:
            raise MetaroceError(f"no completion channel {channel}")
        h = self._handle()
        ring = None
        if shared:
            if channel is None:                  # a channel of its own, gone with the CQ
                channel, _ = self.create_comp_channel(owner)
                own = channel
            else:
                own = None
            ring = CqRing(h, ring_entries(cqe), self.channels[channel][1])
        cq = Cq(h, owner, cqe, ring, channel=channel if shared else None,
                own_channel=own if shared else None)
        self.cqs[h] = cq
        return cq

    def doorbell(self, owner) -> int:
        """The owner's doorbell eventfd (one per application, made with its first QP)."""
        if owner not in self.doorbells:
            self.doorbells[owner] = new_eventfd()
        return self.doorbells[owner]

    def _own_cq(self, owner, h: int) -> Cq:
        cq = self.cqs.get(h)
        if cq is None or cq.owner is not owner:
            raise MetaroceError(f"no completion queue {h}")
        return cq

    def create_qp(self, owner, pd: int, send_cq: int, recv_cq: int, cap: dict,
                  shared: bool = True) -> Qp:
        """An RC QP; shared: its send and receive queues are rings in shared memory (an
        application's; the daemon's own endpoints are driven by the wire only)."""
        self._own_pd(owner, pd)
        scq, rcq = self._own_cq(owner, send_cq), self._own_cq(owner, recv_cq)
        if len(self.qps) >= DEVICE_LIMITS["max_qp"]:
            raise MetaroceError(f"too many QPs (max_qp {DEVICE_LIMITS['max_qp']})")
        qpn = secrets.randbits(24)
        while qpn in self.qps or qpn < 2:
            qpn = secrets.randbits(24)
        qp = Qp(qpn, owner, pd, scq, rcq, cap)
        if shared:
            rq = self.rx.create_rq(qpn, 1 << max(0, (max(1, qp.max_recv_wr) - 1).bit_length()),
                                   max_wr=qp.max_recv_wr)
            try:
                qp.rings = QpRings(qpn, qp.max_send_wr, qp.max_send_sge, qp.max_inline, rq)
            except (MetaroceError, OSError):
                self.rx.del_rq(qpn)
                raise
            self.rings.add(qp, qp.rings.sq)
        self.qps[qpn] = qp
        return qp

    def own_qp(self, owner, qpn: int) -> Qp:
        qp = self.qps.get(qpn)
        if qp is None or qp.owner is not owner:
            raise MetaroceError(f"no QP 0x{qpn:06x}")
        return qp

    def qp_attrs(self, qp: Qp) -> dict:
        addrs = neigh.local_addresses(self.ifindex)
        return {"qpn": qp.qpn, "psn": qp.sq_psn, "gid": addrs[0] if addrs else None,
                "addrs": addrs, "mac": neigh.local_mac(self.ifindex), "mtu": qp.pmtu,
                "state": qp.state, "mode": self.mode}

    def connect_qp(self, qp: Qp, remote: dict, attr: dict) -> dict:
        """RTR + RTS from the peer's attributes (qpn, psn, ip; mtu optional)."""
        if qp.state not in ("INIT", "RESET"):
            raise MetaroceError(f"QP 0x{qp.qpn:06x} is {qp.state}, not INIT")
        try:
            rqpn, rpsn, rip = int(remote["qpn"]), int(remote["psn"]), str(remote["ip"])
        except (KeyError, TypeError, ValueError):
            raise MetaroceError("remote attributes need qpn, psn and ip") from None
        if not (0 < rqpn <= PSN_MASK and 0 <= rpsn <= PSN_MASK):
            raise MetaroceError("remote qpn/psn must be 24-bit")
        want = str(attr.get("mode", remote.get("mode", "roce")))
        if want not in ("roce", "metaroce"):
            raise MetaroceError(f"mode must be roce or metaroce, not {want!r}")
        # MetaRoCE only when this device offers it and the peer asks for it (CM-5);
        # anything else gets plain RoCEv2 behaviour
        qp.metaroce = self.mode == "metaroce" and want == "metaroce"
        pmtu = min(int(remote.get("mtu", 1024)), int(attr.get("path_mtu", 4096)), self.max_pmtu())
        if pmtu not in (256, 512, 1024, 2048, 4096):
            raise MetaroceError(f"path MTU {pmtu} is not a RoCE MTU (256 .. 4096)")
        path = neigh.resolve(rip, self.ifindex)
        qp.pmtu = pmtu
        qp.retry_cnt = qp.retries_left = int(attr.get("retry_cnt", 7)) & 7
        qp.rnr_retry = qp.rnr_left = int(attr.get("rnr_retry", 7)) & 7
        qp.timeout = timeout_s(int(attr.get("timeout", 14)))
        qp.never_fails = qp.timeout is None      # timeout 0 = infinite (RESP-8)
        if qp.metaroce and qp.never_fails:
            qp.timeout = 1.0                     # RTO-4: the RTO still repairs, RTO_max 1 s
        import ipaddress  # noqa: PLC0415
        peer = ipaddress.ip_address(rip).packed
        npaths = int(attr.get("paths") or 0) if qp.metaroce else 0   # MP-1: negotiated N
        if npaths and not 1 <= npaths <= MAX_DP_PATHS:
            raise MetaroceError(f"paths must be 1-{MAX_DP_PATHS}, not {npaths}")
        qp.paths = PathSet(npaths) if npaths else None
        qp.flow = self.xsk.flow(dmac=path.dmac, smac=path.smac, src_ip=path.src_ip, dst_ip=rip,
                                dqpn=rqpn, sport=0xC000 | (qp.qpn & 0x3FFF),
                                sports=qp.paths.sports if qp.paths else None)
        qp.remote = {"qpn": rqpn, "psn": rpsn, "ip": rip, "mac": path.dmac, "mtu": pmtu}
        self.rx.set_qp(qp.qpn, rpsn, qp.pd, rqpn, pmtu=pmtu, sq_psn=qp.sq_psn, peer_ip=peer,
                       rnr_timer=int(attr.get("min_rnr_timer", 12)), metaroce=qp.metaroce)
        qp.rx_epsn = rpsn
        if qp.metaroce and attr.get("credit"):   # CC-8: with the peer's CREDIT capability, start
            qp.credit_limit = _add(qp.sq_psn, INITIAL_CREDIT_PKTS)   # in credit mode; the first
                                                # SACK's grant (or its absence) replaces it
        qp.state = "RTS"
        if qp.rings is not None:
            qp.rings.set_ready(True)             # its send queue is drained from now on
        return {"qpn": qp.qpn, "state": qp.state, "path": path.__dict__, "mtu": pmtu,
                "mode": self.qp_mode(qp)}

    @staticmethod
    def qp_mode(qp: Qp) -> str:
        return "metaroce" if qp.metaroce else "roce"

    def max_pmtu(self) -> int:
        """The largest RoCE MTU the link and a UMEM frame hold (the link MTU is read at most
        once a second: a netlink round trip costs about a millisecond here)."""
        now = time.monotonic()
        cached = getattr(self, "_pmtu", None)
        if cached is not None and now - cached[0] < 1.0:
            return cached[1]
        from pyroute2 import IPRoute  # noqa: PLC0415
        with IPRoute() as ipr:
            mtu = ipr.link("get", index=self.ifindex)[0].get_attr("IFLA_MTU")
        room = min(mtu, self.xsk.frame_size) - 14 - 40 - 8 - 12 - MAX_EXT - 4 - 3
        pmtu = max(m for m in (256, 512, 1024, 2048, 4096) if m <= room)
        self._pmtu = (now, pmtu)
        return pmtu

    def destroy_qp(self, owner, qpn: int) -> None:
        qp = self.own_qp(owner, qpn)
        self._flush(qp, None)
        self._forget_qp(qp)

    def _forget_qp(self, qp: Qp) -> None:
        self._keep_counters(qp)
        if qp.rings is not None:
            self.rings.remove(qp)
            qp.rings.close()
            qp.rings = None
        self.rx.del_qp(qp.qpn)                   # its receive ring too
        if self.credits:
            self.credits.forget(qp.qpn)
        self.settle_qps.discard(qp)
        del self.qps[qp.qpn]

    def _keep_counters(self, qp: Qp) -> None:
        """A QP about to go adds its counters (the kernel's and the requester's) to the
        device's: device counters never go backwards while the daemon lives."""
        try:
            st = self.rx.qp_state(qp.qpn)
        except KeyError:                         # never connected: nothing in the kernel
            st = {}
        kept = self.destroyed_qp_counters
        for k, v in [*((k, st.get(k, 0)) for k in QP_COUNTERS), *qp.stats.items()]:
            kept[k] = kept.get(k, 0) + int(v)

    def release_pd(self, owner, pd: int) -> None:
        """Free a PD with what owner registered in it (its QPs must be gone)."""
        self._own_pd(owner, pd)
        if any(q.pd == pd and q.owner is owner for q in self.qps.values()):
            raise MetaroceError(f"protection domain {pd} still has QPs")
        for key in [k for k, e in self.mrs.items() if e[1] is owner and e[0].pd == pd]:
            self._dereg(self.mrs.pop(key))
        del self.pds[pd]

    def destroy_cq(self, owner, h: int) -> None:
        cq = self._own_cq(owner, h)
        if any(q.send_cq is cq or q.recv_cq is cq for q in self.qps.values()):
            raise MetaroceError(f"completion queue {h} is still used by a QP")
        self._forget_cq(cq)

    def _forget_cq(self, cq: Cq) -> None:
        del self.cqs[cq.handle]
        if cq.ring is not None:
            cq.ring.close()
            cq.ring = None
        if cq.own_channel is not None:
            os.close(self.channels.pop(cq.own_channel)[1])

    def release(self, owner) -> None:
        """A connection went away: reclaim everything it created."""
        for qp in [qp for qp in self.qps.values() if qp.owner is owner]:
            self._forget_qp(qp)
        for key in [k for k, e in self.mrs.items() if e[1] is owner]:
            self._dereg(self.mrs.pop(key))
        for cq in [c for c in self.cqs.values() if c.owner is owner]:
            self._forget_cq(cq)
        for h in [h for h, (o, _) in self.channels.items() if o is owner]:
            os.close(self.channels.pop(h)[1])
        if owner in self.doorbells:
            os.close(self.doorbells.pop(owner))
        self.overrun_cqs = [c for c in self.overrun_cqs if c.owner is not owner]
        for h in [h for h, o in self.pds.items() if o is owner]:
            del self.pds[h]
        self.responses = deque(r for r in self.responses if r[0].owner is not owner)

    # ---- work requests -----------------------------------------------------------------

    def _local(self, owner, pd: int, sge, need: int) -> tuple[MemoryRegion, object, int]:
        """The region an SGE lies in (of owner, in pd, with access need): (mr, its C view, the
        SGE's offset in it); BadWqe otherwise."""
        addr, length, lkey = (int(v) for v in sge)
        ent = self.mrs.get(lkey)
        if ent is None or ent[1] is not owner or ent[0].pd != pd:
            raise not_in_pd(lkey)
        mr = ent[0]
        check_sge_in((addr, length), lkey, mr.addr, mr.length, mr.access, need)
        return mr, ent[2], addr - mr.addr

    def drain_rings(self) -> int:
        """Copy the new WQEs out of every ring that has some (a batch per ring) and act on
        them; returns how many were taken."""
        taken = 0
        for qp, is_send in self.rings.pending():
            if qp.rings is None:
                continue
            if is_send:
                taken += self._drain_send(qp)
            else:
                taken += self._flush_recvs(qp)
        return taken

    def _ring_broken(self, qp: Qp, which: str) -> None:
        """A producer index the owner wrote is impossible: an error completion and ERR (once:
        the rings are not read again)."""
        qp.rings.set_broken()
        if qp.state == "ERR":
            return
        cq = qp.send_cq if which == "send" else qp.recv_cq
        self._wc(cq, {"wr_id": 0, "status": int(WcStatus.LOC_QP_OP_ERR),
                      "opcode": "SEND" if which == "send" else "RECV", "qp_num": qp.qpn,
                      "byte_len": 0})
        self._error(qp, why=f"impossible {which} queue producer index")

    def _drain_send(self, qp: Qp) -> int:
        entries = qp.rings.fetch_send(self.scratch)
        if entries is None:
            self._ring_broken(qp, "send")
            return 0
        if qp.state == "ERR":                   # posted to a QP in ERR: flushed
            for e in entries:
                self._wc(qp.send_cq, {"wr_id": e.wr_id, "status": int(WcStatus.WR_FLUSH_ERR),
                                      "opcode": _wc_opcode(e.opcode), "qp_num": qp.qpn,
                                      "byte_len": 0})
            self.settle_qps.add(qp)
            return len(entries)
        for i, e in enumerate(entries):
            try:
                w = self._build_wqe(qp, e)
            except BadWqe as exc:               # as a verbs device: error completion, ERR
                rest = [SendWqe(x.wr_id, 0, True, None, None, None, 0, opcode=_wc_opcode(x.opcode))
                        for x in entries[i:]]
                qp.pending.extend(rest)
                self._error(qp, rest[0], exc.status, f"bad work request {e.wr_id}: {exc}")
                return len(entries)
            qp.pending.append(w)
        return len(entries)

    def _flush_recvs(self, qp: Qp) -> int:
        """A QP in ERR: every receive posted beyond the completed ones completes flushed (the
        NIC's program takes none any more)."""
        entries = qp.rings.fetch_recv(self.scratch)
        if entries is None:                     # an impossible index: nothing to flush
            qp.rings.set_broken()
            return 0
        for e in entries:
            self._wc(qp.recv_cq, {"wr_id": e.wr_id, "status": int(WcStatus.WR_FLUSH_ERR),
                                  "opcode": "RECV", "qp_num": qp.qpn, "byte_len": 0})
        qp.rq_done += len(entries)
        self.settle_qps.add(qp)
        return len(entries)

    def _error(self, qp: Qp, failing: "SendWqe | None" = None, status: int = 0,
               why: str | None = None) -> None:
        """A bad WQE (or ring) of the owner's: the QP goes to ERR as on a verbs device (the
        failing WQE completes with its status, everything else is flushed, the responder in
        the kernel drops every request)."""
        if why:
            print(f"metaroce: QP 0x{qp.qpn:06x} of application pid "
                  f"{getattr(qp.owner, 'pid', 0)}: {why}: QP to ERR", file=sys.stderr, flush=True)
        if qp.state != "ERR":
            self._flush(qp, failing, status)
        if qp.state == "ERR" and self.rx is not None:
            self.rx.set_qp_error(qp.qpn)

    def _build_wqe(self, qp: Qp, e) -> SendWqe:
        """The message of one send WQE copied out of the ring, checked by the rules the library
        applies too (metaroce/nic/wqe.py)."""
        owner, pd = qp.owner, qp.pd
        kind, imm, length, parts = check_send(
            e.opcode, e.flags, e.sges, e.inline_len, e.remote_addr, qp.max_send_sge,
            qp.max_inline, lambda s, need: self._local(owner, pd, s, need))
        flags = e.flags
        m = self.ffi.new("struct mr_roce_msg *")
        self.c.mr_wqe_msg(self.scratch.buf + e.slot, kind, imm, length, qp.pmtu, m)
        keep, data, local = None, self.ffi.NULL, None
        if kind in (MSG_WRITE, MSG_SEND):
            if flags & SEND_INLINE:
                keep = self.ffi.new("uint8_t[]", e.inline or b"\0")
                data = keep
            elif len(parts) == 1:
                mr, ptr, off = parts[0]
                data = ptr + off
            elif parts:                          # several SGEs: gathered once at post time
                raw = b"".join(bytes(mr._mm[off:off + int(s[1])])
                               for (mr, _, off), s in zip(parts, e.sges))
                keep = self.ffi.new("uint8_t[]", raw or b"\0")
                data = keep
        else:
            s = e.sges[0]
            local = (int(s[2]), int(s[0]), length)
        npkts = self.c.mr_msg_packets(m)
        if kind == MSG_READ_REQ:
            npkts = max(1, -(-length // qp.pmtu))       # the PSNs its response takes
        return SendWqe(e.wr_id, kind, bool(flags & SEND_SIGNALED), m, data, keep, npkts, local)

    def settle_rings(self) -> None:
        """Release the ring slots of the work requests that completed this round."""
        for qp in self.settle_qps:
            if qp.rings is not None:
                qp.rings.settle(len(qp.sq) + len(qp.pending), qp.rq_done)
        self.settle_qps.clear()

    # ---- completions -------------------------------------------------------------------

    def _wc(self, cq: Cq, wc: dict) -> None:
        was_overrun = cq.overrun
        if cq.produce(wc):
            self.dirty_cqs.add(cq.handle)
        elif not was_overrun:                    # it overran just now: settled by
            self.overrun_cqs.append(cq)          # take_async_events, not in the middle of
                                                 # retiring or flushing a QP

    def _complete_send(self, qp: Qp, w: SendWqe, status: int) -> None:
        if w.signaled or status:
            self._wc(qp.send_cq, {"wr_id": w.wr_id, "status": int(status),
                                  "opcode": _wc_op(w), "qp_num": qp.qpn,
                                  "byte_len": int(w.msg.len) if w.msg is not None else 0})

    def _retire(self, qp: Qp) -> None:
        """Complete, in posting order, every WQE at the head that is done."""
        n = 0
        while qp.sq:
            w = qp.sq[0]
            if not w.done and not (w.kind in (MSG_WRITE, MSG_SEND) and _after(qp.una, w.last_psn)):
                break
            qp.sq.popleft()
            n += 1
            if w.rd_idx >= 0:
                qp.rd_open -= 1
            self._complete_send(qp, w, w.status)
        if n:
            self.settle_qps.add(qp)
            i, p = qp.cursor
            qp.cursor = (max(0, i - n), p if i >= n else 0)
            qp.retries_left = qp.retry_cnt
            qp.deadline = (time.monotonic() + self._timer(qp)) if qp.sq and qp.timeout else None

    def _flush(self, qp: Qp, failing: SendWqe | None, status: int = 0) -> None:
        """ERR: the failing WQE gets its status, every later one (and receives) a flush."""
        qp.state = "ERR"
        if qp.rings is not None:                 # the owner's posts are refused or flushed,
            qp.rings.set_error(qp.rq_done)       # its posted receives too (ERR-1)
            self.rings.add(qp, qp.rings.rq, is_send=False)
            self.settle_qps.add(qp)
        for w in list(qp.sq) + list(qp.pending):
            if w is failing:
                self._complete_send(qp, w, status)
            else:
                self._wc(qp.send_cq, {"wr_id": w.wr_id, "status": int(WcStatus.WR_FLUSH_ERR),
                                      "opcode": _wc_op(w), "qp_num": qp.qpn,
                                      "byte_len": 0})
        if qp.rings is not None:
            self._flush_recvs(qp)
        qp.recv_wait.clear()
        qp.sq.clear()
        qp.pending.clear()
        qp.deadline = None
        qp.fatal = None

    def _go_back(self, qp: Qp, psn: int) -> None:
        for i, w in enumerate(qp.sq):
            d = (psn - w.first_psn) & PSN_MASK
            if d < w.npkts:
                pkt = 0 if w.kind != MSG_WRITE and w.kind != MSG_SEND else d
                if (i, pkt) < qp.cursor:
                    qp.stats["retransmitted_packets"] += sum(x.npkts for x in list(qp.sq)[i:]) - pkt
                qp.cursor = (i, pkt)
                return

    # ---- retransmission timer ---------------------------------------------------------------

    def _timer(self, qp: Qp) -> float | None:
        """The retransmission timeout now: compat mode the local ACK timeout (RESP-8); MetaRoCE
        mode RFC 6298's estimate from SACK timestamp echoes (RTO-1), the low tail RTO with 4 or
        fewer packets outstanding (RTO-3), doubled per expiry without progress (RTO-2), never
        above the local ACK timeout."""
        if not qp.metaroce or qp.timeout is None:
            return qp.timeout
        if qp.srtt is None:
            return qp.timeout
        if qp.in_flight_pkts <= 4:
            base = max(2 * qp.srtt, RTO_MIN_S)
        else:
            base = max(qp.srtt + max(4 * qp.rttvar, 5e-6), RTO_MIN_S)
        return min(base * qp.backoff, qp.timeout)

    @staticmethod
    def _rtt_sample(qp: Qp, ts_echo: int) -> float | None:
        r = ((time.monotonic_ns() & 0xFFFFFFFF) - ts_echo & 0xFFFFFFFF) / 1e9
        if r <= 0 or r > 1.0:
            return None                             # not one of ours, or wrapped: no sample
        qp.last_rtt = r
        if qp.srtt is None:
            qp.srtt, qp.rttvar = r, r / 2
        else:
            qp.rttvar = 0.75 * qp.rttvar + 0.25 * abs(qp.srtt - r)
            qp.srtt = 0.875 * qp.srtt + 0.125 * r
        return r

    # ---- MetaRoCE selective repeat (SACK-4, SACK-5) ----------------------------------------

    def _wqe_of(self, qp: Qp, psn: int) -> SendWqe | None:
        for w in qp.sq:
            if (psn - w.first_psn) & PSN_MASK < w.npkts:
                return w
        return None

    def _sent_upto(self, qp: Qp) -> int:
        """The first PSN not transmitted yet (the cursor's)."""
        i, pkt = qp.cursor
        return _add(qp.sq[i].first_psn, pkt) if i < len(qp.sq) else qp.next_psn

    def _sent_at(self, qp: Qp, psn: int) -> float | None:
        """When the batch that first sent psn went out (None: before the log)."""
        for end, t in qp.send_log:
            if _after(end, psn):
                return t
        return None

    def _on_sack(self, qp: Qp, cum: int, bitmap: int) -> None:
        """Record what the SACK reports received; retransmit each hole declared lost once (a
        lost retransmission is left to the RTO). SACK-5: with one path, every hole below the
        highest SACKed PSN is lost; with N paths (packets stay in order on a path, not across
        paths), a hole is lost when (a) a later first transmission on its own path was SACKed,
        or (b) it lies REORDER_THRESHOLD PSNs below the highest SACKed and was sent longer ago
        than SRTT + 2 RTTVAR; spraying over paths of different delays is not a loss."""
        qp.stats["sacks_handled"] += 1
        highest = None
        n = len(qp.paths) if qp.paths is not None else 1
        hi_path = [-1] * n                    # per path: furthest SACKed first transmission
        for i in range(128):
            if bitmap >> (127 - i) & 1:
                p = _add(cum, 2 + i)
                qp.sacked.add(p)
                highest = p
                if n > 1 and p not in qp.retx_sent:
                    off = (p - qp.una) & PSN_MASK
                    if off < PSN_HALF and off > hi_path[p % n]:
                        hi_path[p % n] = off
        if highest is None or not _after(highest, qp.una):
            return                            # a stale SACK: nothing below it is still open
        end = self._sent_upto(qp)
        if _after(highest, end):
            highest = end                     # never past what was sent
        # one walk over the send queue (in PSN order), not a queue search per PSN
        span = (highest - qp.una) & PSN_MASK            # PSNs una .. highest - 1
        if n > 1:
            now = time.monotonic()
            base = max((qp.srtt + 2 * qp.rttvar) if qp.srtt is not None else RTO_MIN_S,
                       1.25 * (qp.last_rtt or 0.0))
            settle = [max(base, 1.5 * (ps.srtt or 0.0)) for ps in qp.paths.paths]

            def lost(p: int, off: int) -> bool:
                if off < hi_path[p % n]:
                    return True                                       # (a)
                if off + REORDER_THRESHOLD > span:
                    return False
                t = self._sent_at(qp, p)
                return t is None or now - t >= settle[p % n]          # (b)
        else:
            def lost(p: int, off: int) -> bool:
                return True
        for w in qp.sq:
            lo = (w.first_psn - qp.una) & PSN_MASK
            if lo >= span and lo < PSN_HALF:
                break                                    # at or past the highest SACKed PSN
            if w.kind not in (MSG_WRITE, MSG_SEND):      # READ / atomic: the request again
                if lo < PSN_HALF and not w.done and w.first_psn not in qp.retx_sent and \
                        lost(w.first_psn, lo):
                    qp.retx.append(w.first_psn)
                    qp.retx_sent.add(w.first_psn)
                    if qp.paths is not None:
                        self._path_loss(qp, w.first_psn, 0)
                continue
            for k in range(w.npkts):
                off = (lo + k) & PSN_MASK                # distance from una
                if off >= PSN_HALF:
                    continue                             # acknowledged already
                if off >= span:
                    break
                p = _add(w.first_psn, k)
                if p not in qp.sacked and p not in qp.retx_sent and lost(p, off):
                    qp.retx.append(p)
                    qp.retx_sent.add(p)
                    if qp.paths is not None:
                        self._path_loss(qp, p, 0)

    def _rto_selective(self, qp: Qp) -> None:
        """RTO in MetaRoCE mode: resend every sent, unacknowledged PSN not SACKed (SACK-4)."""
        qp.retx.clear()
        qp.retx_sent.clear()
        end = self._sent_upto(qp)
        for w in qp.sq:
            if not _after(end, w.first_psn):
                break
            if w.kind in (MSG_WRITE, MSG_SEND):
                for k in range(w.npkts):
                    p = _add(w.first_psn, k)
                    if not _after(end, p):
                        break
                    if (_after(p, qp.una) or p == qp.una) and p not in qp.sacked:
                        qp.retx.append(p)
                        qp.retx_sent.add(p)
            elif not w.done:
                qp.retx.append(w.first_psn)
                qp.retx_sent.add(w.first_psn)

    def _send_retx(self, qp: Qp) -> int:
        sent_total = 0
        nxt = self.ffi.new("uint32_t *")
        while qp.retx:
            p = qp.retx[0]
            w = self._wqe_of(qp, p)
            data = w is not None and w.kind in (MSG_WRITE, MSG_SEND)
            if w is None or (w.done if not data else
                             (not _after(p, qp.una) and p != qp.una) or p in qp.sacked):
                qp.retx.popleft()                       # acknowledged (answered) meanwhile
                continue
            idx = (p - w.first_psn) & PSN_MASK if w.kind in (MSG_WRITE, MSG_SEND) else 0
            nxt[0] = idx
            w.msg.retx = 1
            sent = self.c.mr_send_range(self.xsk._x, qp.flow, w.msg, w.data, nxt, idx + 1)
            w.msg.retx = 0
            if not sent:
                sent_total += 1                         # rings full: come back soon
                break
            qp.retx.popleft()
            qp.stats["retransmitted_packets"] += 1
            qp.stats["selective_retransmits"] += 1
            sent_total += sent
        return sent_total

    def _prune_sacked(self, qp: Qp) -> None:
        while qp.send_log and not _after(qp.send_log[0][0], qp.una):
            qp.send_log.popleft()
        if qp.sacked:
            qp.sacked = {p for p in qp.sacked if _after(p, qp.una)}
        if qp.retx_sent:
            qp.retx_sent = {p for p in qp.retx_sent if _after(p, qp.una) or p == qp.una}

    def _release_recvs(self, qp: Qp) -> None:
        """MetaRoCE receive completions, in RSN order, once the cumulative PSN passed them
        (PLACE-5)."""
        while True:
            ent = qp.recv_wait.get(qp.rq_done & PSN_MASK)
            if ent is None or qp.rx_epsn is None or not _after(qp.rx_epsn, ent[0]):
                return
            del qp.recv_wait[qp.rq_done & PSN_MASK]
            qp.rq_done += 1
            self.settle_qps.add(qp)
            self._wc(qp.recv_cq, ent[1])

    def _recv_wc(self, qp: Qp, e, ok: bool) -> dict:
        wc = {"wr_id": e.wr_id, "qp_num": qp.qpn, "src_qp": qp.remote.get("qpn", 0),
              "byte_len": e.len, "opcode": "RECV_RDMA_WITH_IMM" if e.flags & 2 else "RECV",
              "status": 0 if ok else int(_RECV_ERR_STATUS.get(e.syndrome,
                                                              WcStatus.LOC_PROT_ERR))}
        if e.flags & 1:
            wc["imm_data"] = int.from_bytes(int(e.imm).to_bytes(4, "little"), "big")
        if e.flags & RECV_F_SOLICITED:
            wc["solicited"] = True          # a solicited event (req_notify solicited_only)
        return wc

    def _reread(self, qp: Qp, rd_idx: int, psn: int, progress: bool = True) -> None:
        """Re-request a READ from its first missing response PSN only (RESP-4: a duplicate READ
        may start inside the original response; SACK-8): VA and length moved by the part that
        arrived. After a reported gap progress was made, so the retry budget is full again."""
        w = next((x for x in qp.sq if x.rd_idx == rd_idx and x.kind == MSG_READ_REQ), None)
        if w is None or w.done:
            return
        k = (psn - w.first_psn) & PSN_MASK
        if k >= w.npkts:
            return
        m = self.ffi.new("struct mr_roce_msg *")
        self.ffi.memmove(m, w.msg, self.ffi.sizeof("struct mr_roce_msg"))
        m.psn0 = psn
        m.va = w.msg.va + k * qp.pmtu
        m.len = w.msg.len - k * qp.pmtu
        qp.rereads.append(m)
        if progress:                         # responses came up to the gap: a fresh budget
            qp.retries_left = qp.retry_cnt
            if qp.timeout:
                qp.deadline = time.monotonic() + self._timer(qp)

    def _send_rereads(self, qp: Qp) -> int:
        sent_total = 0
        nxt = self.ffi.new("uint32_t *")
        while qp.rereads:
            nxt[0] = 0
            sent = self.c.mr_send_range(self.xsk._x, qp.flow, qp.rereads[0], self.ffi.NULL, nxt, 1)
            if not sent:
                return sent_total + 1
            qp.rereads.popleft()
            qp.stats["retransmitted_packets"] += 1
            qp.stats["partial_rereads"] += 1
            sent_total += sent
        return sent_total

    def _stalled_read(self, qp: Qp, st: dict | None) -> bool:
        """RTO with a READ at the head whose responses stopped part way (a lost tail) or never
        came: re-read from the kernel's next expected response."""
        w = qp.sq[0] if qp.sq else None
        if w is None or w.kind != MSG_READ_REQ or w.done:
            return False
        st = st if st is not None else self.rx.qp_state(qp.qpn)
        if st.get("rd_head") != w.rd_idx or st.get("rd_state") not in (0, 1, 2):
            return False                         # 2: a gap was reported and its re-read lost
        # 0: none of its responses came (sent while an earlier READ was being repaired, and
        # discarded): ask for this one only, from its first PSN; the later READs' responses
        # still queued at the responder follow it (_go_back_responses). Re-requesting every
        # outstanding READ instead (the MetaRoCE RTO) re-sent up to 16 MiB per timeout: 37x
        # the needed response packets at 2 % loss against 13x (test_read_recovery.py).
        self._reread(qp, w.rd_idx, st["rd_psn"] if st.get("rd_state") else w.first_psn,
                     progress=False)
        return True

    def on_events(self) -> int:
        n = self.c.mr_evring_poll(self.ring, 0, self._evp)
        evs = self._evp[0]
        for i in range(max(n, 0)):
            e = evs[i]
            qp = self.qps.get(e.qpn)
            if qp is None:
                continue
            t = e.type
            if t == EV_ACK:
                if e.flags & 1 and qp.metaroce:
                    r = self._rtt_sample(qp, e.imm)
                    self._credit(qp, e.len)
                    if qp.paths is not None:
                        self._path_feedback(qp, e.flags, r)
                if _after(_add(e.psn, 1), qp.una):       # progress: full retry budget again
                    qp.una = _add(e.psn, 1)
                    qp.retries_left = qp.retry_cnt
                    qp.rnr_left = qp.rnr_retry
                    qp.backoff = 1
                    if qp.timeout:
                        qp.deadline = time.monotonic() + self._timer(qp)
                    if qp.metaroce:
                        self._prune_sacked(qp)
                self._retire(qp)
            elif t == EV_RD_DONE:
                for w in qp.sq:
                    if w.rd_idx == e.flags:
                        w.done, w.status = True, (WcStatus.LOC_PROT_ERR if e.syndrome else 0)
                        break
                self._implicit_ack(qp, _add(e.psn, 1))
                if qp.fatal and not self._responses_due(qp, qp.fatal[0]):
                    self._flush(qp, *qp.fatal)         # the NAK that waited for it
            elif t == EV_NAK:
                self._on_nak(qp, e.psn, e.syndrome)
            elif t == EV_RD_GAP:
                qp.stats["packet_seq_err_handled"] += 1
                self._reread(qp, e.flags, e.psn)
            elif t == EV_READ_REQUEST:
                self._answer_read(qp, e)
            elif t == EV_RECV and qp.metaroce:          # complete in order (PLACE-5)
                qp.recv_wait[int(e.va) & PSN_MASK] = (e.psn, self._recv_wc(qp, e, True))
                if e.flags & 4:                            # it arrived in order
                    qp.rx_epsn = _add(e.psn, 1)
                self._release_recvs(qp)
            elif t == EV_EPSN:
                qp.rx_epsn = e.psn
                self._release_recvs(qp)
            elif t == EV_SACK:
                r = self._rtt_sample(qp, e.imm)
                self._credit(qp, e.len)
                if qp.paths is not None:
                    self._path_feedback(qp, e.flags, r)
                self._on_sack(qp, e.psn, int(e.wr_id) << 64 | int(e.va))
            elif t in (EV_RECV, EV_RECV_ERR):
                qp.rq_done += 1
                self.settle_qps.add(qp)
                self._wc(qp.recv_cq, self._recv_wc(qp, e, t == EV_RECV))
            elif t == EV_QP_ERROR:                      # the responder sent a fatal NAK:
                self._flush(qp, None)                      # ERR, everything flushed (ERR-1)
            elif t == EV_CNP:
                qp.stats["cnp_received"] += 1
        return n

    # ---- multipath (MP-3 .. MP-5) ------------------------------------------------------------

    @staticmethod
    def _repath(qp: Qp, k: int) -> None:
        """Give the fast path path k's (new) source port."""
        qp.flow.sports[k] = qp.paths.paths[k].sport

    def _path_feedback(self, qp: Qp, flags: int, rtt: float | None) -> None:
        """An ACK/SACK event: flags carry the echoed PathID (bits 8-15) and the SACK's flags
        (bits 16-23, ECE = 0x80) (MP-2, MP-5's ECN rule); its RTT sample is the path's too."""
        k = flags >> 8 & 0xFF
        if rtt is not None:
            qp.paths.on_rtt(k, rtt)
        if qp.paths.on_feedback(k, bool(flags >> 16 & SACK_F_ECE), time.monotonic()):
            self._repath(qp, k)

    def _path_loss(self, qp: Qp, psn: int, retx: int) -> None:
        """PSN psn's retx-th transmission was lost: count it against its path (MP-4, MP-5)."""
        k = qp.paths.path_of(psn, retx)
        if qp.paths.on_loss(k, time.monotonic(), qp.srtt):
            self._repath(qp, k)

    def _path_rto(self, qp: Qp) -> None:
        """MP-5: the path of the oldest unacknowledged packet's last transmission caused the
        RTO."""
        k = qp.paths.path_of(qp.una, 1 if qp.una in qp.retx_sent else 0)
        qp.paths.on_rto(k, time.monotonic())
        self._repath(qp, k)

    @staticmethod
    def _credit(qp: Qp, cred: int) -> None:
        """A SACK's credit (CC-8): with flag C the sender may not send PSNs at or past the Limit
        PSN; a SACK without it ends credit mode."""
        if cred & CREDIT_VALID:
            qp.credit_limit = cred & PSN_MASK
            qp.stats["credit_grants"] += 1
        else:
            qp.credit_limit = None

    def _implicit_ack(self, qp: Qp, psn: int) -> None:
        """A READ response or atomic ACK acknowledges every request before it (the responder
        executes them at its cumulative PSN), whether or not their own ACK arrived; una stops at
        the first READ/atomic still waiting for its response (an atomic's ACK may overtake a
        READ's data), so that one is still re-requested."""
        for w in qp.sq:
            if not _after(psn, w.first_psn):
                break
            if not w.done and w.kind not in (MSG_WRITE, MSG_SEND):
                psn = w.first_psn
                break
        if _after(psn, qp.una):
            qp.una = psn
            if qp.metaroce:
                self._prune_sacked(qp)
        self._retire(qp)

    def _on_nak(self, qp: Qp, psn: int, syn: int) -> None:
        if _after(psn, qp.una):
            qp.una = psn
        self._retire(qp)
        if syn >> 5 == 1:                              # RNR NAK: wait, then resend (RESP-6)
            qp.rnr_left -= qp.rnr_retry != 7
            if qp.rnr_left < 0:
                self._flush(qp, qp.sq[0] if qp.sq else None, WcStatus.RNR_RETRY_EXC_ERR)
                return
            qp.stats["rnr_nak_retry"] += 1
            qp.hold_until = time.monotonic() + rnr_timer_s(syn & 31)
            self._go_back(qp, psn)
        elif syn == 0x60:                              # sequence error: go back (COMPAT-2)
            qp.stats["packet_seq_err_handled"] += 1
            self._go_back(qp, psn)
        else:                                          # fatal (RESP-5)
            failing = next((w for w in qp.sq if (psn - w.first_psn) & PSN_MASK < w.npkts), None)
            status = NAK_STATUS.get(syn, WcStatus.REM_OP_ERR)
            if failing is not None and self._responses_due(qp, failing):
                # The responder executed every request before the failing one (RESP-10), but
                # its READ responses come from its daemon and may leave after its kernel sent
                # this NAK: they complete first, and only later WQEs are flushed (ERR-1). No
                # new request goes out meanwhile; one RTO bounds the wait.
                qp.fatal = (failing, status)
                qp.deadline = time.monotonic() + (self._timer(qp) or 1.0)
                return
            self._flush(qp, failing, status)

    @staticmethod
    def _responses_due(qp: Qp, failing: SendWqe) -> bool:
        """A READ or atomic posted before `failing` still waits for its response."""
        for w in qp.sq:
            if w is failing:
                return False
            if not w.done and w.kind not in (MSG_WRITE, MSG_SEND):
                return True
        return False

    def _answer_read(self, qp: Qp, e) -> None:
        """Queue the response to a READ request, or, for a request at a PSN this QP's
        responses already passed, send the stream back there (`_go_back_responses`)."""
        if qp.flow is None:
            return
        req = (e.psn, e.msn, e.va, e.len, e.rkey, e.imm)
        if qp.rd_served is not None and not _after(e.psn, qp.rd_served):
            self._go_back_responses(qp, req)
            return
        self._queue_read_response(qp, req)

    def _queue_read_response(self, qp: Qp, req: tuple, front: int | None = None) -> bool:
        psn, msn, va, length, rkey, ssn = req
        data = self.ffi.NULL                 # a zero-length READ names no memory: its R_Key
        if length:                           # is not checked, as in InfiniBand
            ent = self.mrs.get(rkey)
            if ent is None:
                return False         # deregistered meanwhile: the requester's retry will fail
            mr, _, ptr = ent
            data = ptr + (va - mr.addr)
        m = self.ffi.new("struct mr_roce_msg *")
        m.kind, m.pmtu, m.psn0, m.msn, m.len = MSG_READ_RESP, qp.pmtu, psn, msn, length
        if qp.metaroce:                      # PETH echoes the request's SSN (PLACE-4)
            m.metaroce, m.ssn = 1, ssn
        end = _add(psn, max(0, self.c.mr_msg_packets(m) - 1))
        if qp.rd_served is None or _after(end, qp.rd_served):
            qp.rd_served = end
        if front is None:
            self.responses.append([qp, m, data, 0])
        else:
            self.responses.insert(front, [qp, m, data, 0])
        return True

    def _go_back_responses(self, qp: Qp, req: tuple) -> None:
        """A READ request at a PSN p this QP's responses already reached (RESP-4: the
        requester lost the response at p; responses are taken in order, so it discards what
        follows until it has p again).
          - p is queued and not sent yet (this responder is behind and the requester's timer
            fired): the stream delivers it in order anyway, nothing to do;
          - else the response from p goes ahead of the QP's queued responses (the later
            READs' responses then arrive in order after it, accepted), and the queued rest
            of the response that contained p is dropped (the new one covers it).
        Before, every re-read and every request repeated on a timeout was queued behind all
        of the QP's responses, which the requester discarded and asked for again, each time
        adding another copy: the demo's responder sent 1.4 million response packets where
        262,144 were needed and the requester ran out of retries (5 of 6 demos on a loaded
        machine)."""
        psn = req[0]
        at = None
        keep = deque()
        for r in self.responses:
            if r[0] is qp:
                nxt = _add(r[1].psn0, r[3])                         # its next PSN to send
                end = _add(r[1].psn0, self.c.mr_msg_packets(r[1]))  # one past its last
                if not _after(nxt, psn) and _after(end, psn):
                    qp.stats["read_requests_pending"] += 1          # queued, not sent yet
                    return
                if at is None:
                    at = len(keep)
                if not _after(r[1].psn0, psn) and _after(end, psn):
                    continue                 # the rest of the response containing p
            keep.append(r)
        self.responses = keep
        self._queue_read_response(qp, req, len(keep) if at is None else at)
        qp.stats["read_go_backs"] += 1

    # ---- transmit ----------------------------------------------------------------------

    def _assign(self, qp: Qp) -> None:
        while qp.pending:
            w = qp.pending[0]
            if w.kind in (MSG_READ_REQ, MSG_CMP_SWAP, MSG_FETCH_ADD):
                if qp.rd_open >= RD_DEPTH:
                    return
                w.rd_idx = qp.rd_next
                self.rx.set_rd_slot(qp.qpn, w.rd_idx, wr_id=w.wr_id, addr=w.local[1],
                                    length=w.local[2], lkey=w.local[0], first_psn=qp.next_psn,
                                    kind=RD_READ if w.kind == MSG_READ_REQ else RD_ATOMIC)
                qp.rd_next += 1
                qp.rd_open += 1
            qp.pending.popleft()
            w.first_psn = w.msg.psn0 = qp.next_psn
            if qp.metaroce:                  # PETH numbering, in sending order (EXT-5)
                w.msg.metaroce = 1
                w.msg.ssn = qp.ssn
                w.msg.rsn = qp.rsn & PSN_MASK
                qp.ssn = _add(qp.ssn, 1)
                if w.kind == MSG_SEND or (w.kind == MSG_WRITE and w.msg.with_imm):
                    qp.rsn += 1
            qp.next_psn = _add(qp.next_psn, w.npkts)
            qp.sq.append(w)
            self.rx.set_sq_psn(qp.qpn, qp.next_psn)

    def transmit(self) -> int:
        """One round: READ responses first, then each QP within its window. Returns packets
        queued plus frames still in the TX ring (0: nothing to do until an event or timer)."""
        busy = 0
        now = time.monotonic()
        while self.responses:
            r = self.responses[0]
            nxt = self.ffi.new("uint32_t *", r[3])
            sent = self.c.mr_send_msg(self.xsk._x, r[0].flow, r[1], r[2], nxt)
            r[3] = nxt[0]
            busy += sent
            r[0].stats["sent_packets"] += sent
            r[0].stats["read_response_packets"] += sent
            if r[3] >= self.c.mr_msg_packets(r[1]):
                r[0].stats["sent_bytes"] += int(r[1].len)
                self.responses.popleft()
            elif not sent:
                busy += 1
                break
        for qp in self.qps.values():
            if qp.state != "RTS":
                continue
            if qp.fatal:                    # waiting for READ responses before a fatal NAK
                if qp.deadline is not None and now > qp.deadline:
                    self._flush(qp, *qp.fatal)       # they never came: flushed with the rest
                continue
            if not (qp.pending or qp.retx or qp.rereads) and qp.cursor[0] >= len(qp.sq) and \
                    (qp.deadline is None or now <= qp.deadline):
                if qp.deadline is None and qp.sq and qp.timeout:    # nothing to send: only
                    qp.deadline = now + self._timer(qp)             # the timer (as _send_qp)
                continue                                            # (cheap with 1000s of QPs)
            if qp.pending:
                self._assign(qp)
            if qp.deadline is not None and now > qp.deadline and qp.sq:
                st = self.rx.qp_state(qp.qpn)
                if self._kernel_acked(qp, st):
                    pass                                     # an ACK event was missed: progress
                elif qp.rd_open and self._read_progressed(qp, st):
                    qp.deadline = now + self._timer(qp)      # responses are arriving: wait on
                else:
                    self._expire(qp, st, now)
                if qp.state != "RTS":
                    continue
            if now < qp.hold_until:
                continue
            if qp.rereads:
                busy += self._send_rereads(qp)
            if qp.retx:
                busy += self._send_retx(qp)
            busy += self._send_qp(qp, now)
        return busy + self.xsk.in_flight()

    def _kernel_acked(self, qp: Qp, st: dict) -> bool:
        """The kernel's una is the requester's truth (it consumes every ACK, SACK and response);
        if it is ahead of the daemon's at expiry, what it acknowledged retires now."""
        kuna = st.get("una", qp.una) & PSN_MASK
        if not _after(kuna, qp.una) or _after(kuna, qp.next_psn):
            return False
        before = qp.una
        self._implicit_ack(qp, kuna)
        if qp.una == before:
            return False
        qp.retries_left, qp.backoff = qp.retry_cnt, 1
        if qp.sq and qp.timeout:
            qp.deadline = time.monotonic() + self._timer(qp)
        return True

    @staticmethod
    def _read_progressed(qp: Qp, st: dict) -> bool:
        """The kernel places READ responses without telling the daemon until a READ ends, so
        at expiry the retransmission timer asks it: if the head READ's responses moved since
        the last expiry, the peer is answering and the timer restarts without a retry (RESP-9:
        the local ACK timer covers the time to the next response, not to the last)."""
        if st.get("rd_state") != 1:
            qp.rd_progress = None
            return False
        pos = (st.get("rd_head"), st.get("rd_psn"), st.get("rd_off"))
        moved = pos != qp.rd_progress
        qp.rd_progress = pos
        return moved

    def _expire(self, qp: Qp, st: dict | None, now: float) -> None:
        """The retransmission timer expired with no progress: count it and resend. A sender
        blocked by a credit leaves credit mode (CC-9): the next SACK grants again if the
        receiver is still in incast."""
        qp.credit_limit = None
        rto = self._timer(qp)
        qp.stats["rto_expired"] += 1
        if not qp.metaroce or (rto >= qp.timeout and not qp.never_fails):   # RTO-2, RTO-4
            qp.stats["local_ack_timeout_err"] += 1
            qp.retries_left -= 1
            if qp.retries_left < 0:
                self._log_retry_exceeded(qp, st)
                self._flush(qp, qp.sq[0], WcStatus.RETRY_EXC_ERR)
                return
        if qp.metaroce:
            qp.backoff = min(qp.backoff * 2, 1 << 16)
            if qp.paths is not None:
                self._path_rto(qp)
        if self._stalled_read(qp, st):
            pass
        elif qp.metaroce:
            self._rto_selective(qp)
        else:
            self._go_back(qp, self._resume_psn(qp))
        qp.deadline = now + self._timer(qp)

    @staticmethod
    def _resume_psn(qp: Qp) -> int:
        """Where go-back-N resumes: una, or the first READ/atomic before it still waiting for
        its response (a later ACK implies the request arrived, not that its response did)."""
        for w in qp.sq:
            if not _after(qp.una, w.first_psn):
                break
            if not w.done and w.kind not in (MSG_WRITE, MSG_SEND):
                return w.first_psn
        return qp.una

    def _log_retry_exceeded(self, qp: Qp, st: dict | None) -> None:
        """One line in the device's log (stderr) saying where the QP was stuck."""
        st = st if st is not None else self.rx.qp_state(qp.qpn)
        w = qp.sq[0]
        kern = {k: st.get(k) for k in ("una", "rd_head", "rd_psn", "rd_state", "epsn", "state")}
        print(f"metaroce: QP 0x{qp.qpn:06x} ({self.qp_mode(qp)}) retry exceeded: head "
              f"{MSG_NAMES.get(w.kind, w.kind)} psn {w.first_psn}+{w.npkts} rd_idx {w.rd_idx}, "
              f"una {qp.una} next {qp.next_psn} cursor {qp.cursor} sq {len(qp.sq)} "
              f"retx {len(qp.retx)} rereads {len(qp.rereads)} kernel {kern}",
              file=sys.stderr, flush=True)

    def _send_qp(self, qp: Qp, now: float) -> int:
        i, pkt = qp.cursor
        queued = 0
        nxt = self.ffi.new("uint32_t *")
        while i < len(qp.sq):
            w = qp.sq[i]
            psn = _add(w.first_psn, pkt)
            ahead = (psn - qp.una) & PSN_MASK
            window = MR_WINDOW_PKTS if qp.metaroce else WINDOW_PKTS
            if qp.credit_limit is not None:
                allowed = (qp.credit_limit - qp.una) & PSN_MASK
                window = min(window, allowed if allowed < PSN_HALF else 0)
            if ahead >= PSN_HALF:
                ahead = 0                               # behind una (after a go-back)
            if ahead >= window:
                if qp.credit_limit is not None:
                    qp.stats["credit_blocked"] += 1
                break                                   # window full (MetaRoCE: the responder
                                                        # would not record it, SACK-1)
            total = w.npkts if w.kind in (MSG_WRITE, MSG_SEND) else 1
            nxt[0] = pkt
            upto = min(total, pkt + window - ahead)
            if upto < total and qp.metaroce:
                w.msg.ack_at = upto                     # the edge's packet asks for a SACK now
            sent = self.c.mr_send_range(self.xsk._x, qp.flow, w.msg, w.data, nxt, upto)
            w.msg.ack_at = 0
            if sent and qp.paths is not None:
                qp.send_log.append((_add(w.first_psn, nxt[0]), now))
            qp.stats["sent_packets"] += sent
            queued += sent
            pkt = nxt[0]
            if pkt >= total:
                qp.stats["sent_bytes"] += int(w.msg.len) if w.kind in (MSG_WRITE, MSG_SEND) else 0
                i, pkt = i + 1, 0
            elif not sent:
                queued += 1                             # rings full: come back soon
                break
        qp.cursor = (i, pkt)
        if qp.sq and qp.deadline is None and qp.timeout:
            qp.deadline = now + self._timer(qp)
        return queued

    def idle(self) -> bool:
        return not self.responses and all(not q.sq and not q.pending for q in self.qps.values())

    def tick(self, now: float) -> None:
        """Periodic work: the receiver's credit shares (CC-8)."""
        if self.credits is not None and self.qps:
            self.credits.tick(self.qps.values(), now)

    def next_deadline(self) -> float | None:
        """The earliest retransmission timer, RNR wait or credit tick (one pass over the QPs:
        the event loop asks every round)."""
        now = time.monotonic()
        best = None
        for q in self.qps.values():
            d = q.deadline
            if d and (best is None or d < best):
                best = d
            h = q.hold_until
            if h > now and (best is None or h < best):
                best = h
        if self.credits is not None and any(q.metaroce for q in self.qps.values()):
            t = self.credits.next_tick
            best = t if best is None or t < best else best
        return best

    def take_wcs(self) -> list[tuple[Cq, list]]:
        """Publish what this round wrote into the CQs' rings (their owners see it and, if they
        armed the CQ, get an event); returns the ring-less CQs' completions."""
        out = []
        for h in self.dirty_cqs:
            cq = self.cqs.get(h)
            if cq is None:
                continue
            if cq.ring is not None:
                cq.ring.publish()
            elif cq.wcs:
                out.append((cq, cq.take()))
        self.dirty_cqs.clear()
        return out

    def take_async_events(self) -> list[tuple[object, dict]]:
        """Settle the CQs that overran (as in verbs): each QP using one goes to ERR (its work
        flushed, its responder dropping every request as after a fatal error); returns the
        async events for their owners, IBV_EVENT_CQ_ERR and IBV_EVENT_QP_FATAL."""
        out = []
        while self.overrun_cqs:
            cq = self.overrun_cqs.pop(0)
            if self.cqs.get(cq.handle) is not cq:
                continue                         # destroyed meanwhile
            if cq.ring is not None:
                cq.ring.set_error()              # poll raises at once, a waiter wakes
            out.append((cq.owner, {"type": "CQ_ERR", "cq": cq.handle, "cqe": cq.cqe,
                                   "bad_consumer_index": cq.bad_index}))
            for qp in list(self.qps.values()):
                if (qp.send_cq is cq or qp.recv_cq is cq) and qp.state != "ERR":
                    self._flush(qp, None)        # may overrun its other CQ: settled in turn
                    self.rx.set_qp_error(qp.qpn)
                    out.append((qp.owner, {"type": "QP_FATAL", "qp_num": qp.qpn,
                                           "cq": cq.handle}))
        return out

    @staticmethod
    def _unfetched(qp: Qp) -> int:
        """Send WQEs the owner published that the daemon has not taken yet (as the ring says:
        at most its size)."""
        if qp.rings is None or qp.rings.broken or qp.state != "RTS":
            return 0
        q = qp.rings.sq
        return min((int(q.hdr.prod) - int(q.head)) & 0xFFFFFFFF, int(q.entries))

    def qp_stats(self, qp: Qp) -> dict:
        st = self.rx.qp_state(qp.qpn) if qp.state in ("RTS", "ERR") else {}
        if qp.state == "RTS" and st.get("state") == QP_RX_ERROR:
            self.on_events()            # the kernel sent a fatal NAK: its event settles the state
        out = {"qpn": qp.qpn, "state": qp.state, "mode": self.qp_mode(qp), "remote": qp.remote,
               "sq_outstanding": len(qp.sq) + len(qp.pending) + self._unfetched(qp),
               "window_pkts": qp.in_flight_pkts}
        out.update({k: st.get(k, 0) for k in QP_COUNTERS})
        out.update(qp.stats)
        if qp.srtt is not None:
            out["srtt_us"] = round(qp.srtt * 1e6, 1)
            out["rttvar_us"] = round(qp.rttvar * 1e6, 1)
        rto = self._timer(qp)
        out["rto_us"] = round(rto * 1e6, 1) if rto else None
        out["cwnd_pkts"] = MR_WINDOW_PKTS if qp.metaroce else WINDOW_PKTS
        out["credit_limit_psn"] = qp.credit_limit           # as a sender (None: unlimited)
        kc = int(st.get("credit", 0))                        # what the kernel took from the SACK
        out["kernel_credit_limit_psn"] = kc & PSN_MASK if kc & CREDIT_VALID else None
        out["credit_share_pkts"] = self.credits.share_of(qp.qpn) if self.credits else 0
        out["paths"] = len(qp.paths) if qp.paths else 1
        out["path_evictions"] = sum(p.evictions for p in qp.paths.paths) if qp.paths else 0
        if qp.paths is not None:                             # MP-4: per-path statistics
            out["path_stats"] = [{**p, "sent_packets": int(qp.flow.path_pkts[p["path"]])}
                                 for p in qp.paths.stats()]
        return out

    def close(self) -> None:
        for owner in {q.owner for q in self.qps.values()} | {c.owner for c in self.cqs.values()}:
            self.release(owner)
        for key in list(self.mrs):
            self._dereg(self.mrs.pop(key))
        for _, fd in self.channels.values():
            os.close(fd)
        for fd in self.doorbells.values():
            os.close(fd)
        self.c.mr_evring_close(self.ring)
        self.xsk.close()
