"""The control plane's handle on the device's data path thread (metaroce/datapath/dp.h): the
transport engine in C running on the wire in a thread of its own, which drains the XDP
program's events and the applications' send rings, retransmits, transmits over AF_XDP and
writes completions. Every call here takes the thread's lock between two of its rounds (a few
microseconds); none is made per packet or per work request."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..cengine.qp import set_cc
from ..errors import MetaroceError
from ..fastpath.xsk import XDP_COPY, XDP_USE_SG, _lib
from .rx import RxPath

RD_DEPTH = 16


def rto_min_ns() -> int:
    """RTO_min of MetaRoCE QPs (RTO-1; docs/engine.md rule 4): METAROCE_RTO_MIN_US, else 1 ms."""
    raw = os.environ.get("METAROCE_RTO_MIN_US")
    if raw is None:
        return 1_000_000
    try:
        us = float(raw)
    except ValueError:
        us = -1.0
    if not 1 <= us <= 1e6:
        raise MetaroceError(f"METAROCE_RTO_MIN_US must be 1 .. 1000000 microseconds, not {raw!r}")
    return int(us * 1000)


def busy_poll_ns() -> int:
    """METAROCE_BUSY_POLL_US fixes the busy-poll bound (0 .. 1e6 us); unset: adaptive (-1)."""
    raw = os.environ.get("METAROCE_BUSY_POLL_US")
    if raw is None:
        return -1
    try:
        us = float(raw)
    except ValueError:
        us = -1.0
    if not 0 <= us <= 1e6:
        raise MetaroceError(f"METAROCE_BUSY_POLL_US must be 0 .. 1000000 microseconds, "
                            f"not {raw!r}")
    return int(us * 1000)


def xsk_sg_wanted() -> bool:
    """Multi-buffer AF_XDP transmit (XDP_USE_SG: frames of two 4 KiB chunks, so PMTU 4096 on a
    link of MTU 9000) unless METAROCE_XSK_SG=0; a kernel that refuses it gets a socket without
    it either way."""
    raw = os.environ.get("METAROCE_XSK_SG", "1")
    if raw not in ("0", "1"):
        raise MetaroceError(f"METAROCE_XSK_SG must be 0 or 1, not {raw!r}")
    return raw == "1"


@dataclass
class AsyncEvent:
    type: str                # "CQ_ERR" or "QP_FATAL"
    owner: int               # the owner's id (Device.owner_id)
    cq: int
    qpn: int
    cqe: int
    bad_index: bool


class DataPath:
    """One device's data path thread (started by start(), stopped by close())."""

    def __init__(self, rx: RxPath, ifindex: int, *, max_qps: int = 4096, max_mrs: int = 4096,
                 max_cqs: int = 65536):
        mod = _lib()
        self.ffi, self.c = mod.ffi, mod.lib
        cfg = self.ffi.new("struct mr_dp_cfg *")
        cfg.ifindex = ifindex
        cfg.queue = 0
        cfg.events_fd = rx.events_fd
        cfg.ev_sleep_fd = rx.ev_sleep_fd
        cfg.sq_psns_fd = rx.sq_psns_fd
        cfg.sq_psns_entries = rx.max_qps
        cfg.rd_slots_fd = rx.rd_slots_fd
        cfg.qps_fd = rx.qps_fd
        cfg.max_qps, cfg.max_mrs, cfg.max_cqs = max_qps, max_mrs, max_cqs
        cfg.xsk_frames, cfg.xsk_frame_size, cfg.xsk_ring, cfg.xsk_budget = 4096, 4096, 2048, 512
        cfg.xsk_bind_flags = XDP_COPY | (XDP_USE_SG if xsk_sg_wanted() else 0)
        cfg.min_rto_ns = rto_min_ns()
        cfg.busy_poll_ns = busy_poll_ns()
        self.min_rto_ns = int(cfg.min_rto_ns)
        err = self.ffi.new("int *")
        stage = self.ffi.new("const char **")
        self.d = self.c.mr_dp_new(cfg, err, stage)
        if self.d == self.ffi.NULL:
            what = self.ffi.string(stage[0]).decode()
            raise MetaroceError(f"the data path of ifindex {ifindex}: {what}: "
                                f"{os.strerror(err[0])}")
        self.frame_cap = int(self.c.mr_dp_frame_cap(self.d))   # the largest frame it sends
        self.sg = bool(self.c.mr_dp_xsk_sg(self.d))
        self._async = self.ffi.new("struct mr_dp_async[64]")
        self._cqes = self.ffi.new("struct mr_cqe[256]")

    def start(self) -> None:
        rc = self.c.mr_dp_start(self.d)
        if rc:
            raise MetaroceError(f"the data path thread: {os.strerror(-rc)}")

    def close(self) -> None:
        if self.d is not None:
            self.c.mr_dp_free(self.d)
            self.d = None

    def _check(self, rc: int, what: str) -> int:
        if rc < 0:
            raise MetaroceError(f"{what}: {os.strerror(-rc)}")
        return rc

    # ---- resources ------------------------------------------------------------------------

    def mr_add(self, key: int, owner: int, pd: int, addr: int, length: int, access: int,
               fd: int, map_bytes: int) -> None:
        self._check(self.c.mr_dp_mr_add(self.d, key, owner, pd, addr, length, access, fd,
                                        map_bytes), f"memory region 0x{key:08x}")

    def mr_del(self, key: int) -> None:
        self.c.mr_dp_mr_del(self.d, key)

    def cq_add(self, handle: int, owner: int, view, cqe: int) -> None:
        self._check(self.c.mr_dp_cq_add(self.d, handle, owner,
                                        self.ffi.NULL if view is None else view, cqe),
                    f"CQ {handle}")

    def cq_del(self, handle: int) -> None:
        self._check(self.c.mr_dp_cq_del(self.d, handle), f"CQ {handle}")

    def cq_take(self, handle: int) -> list[dict]:
        """The completions a ring-less CQ (the daemon's own endpoint's) kept since the last
        take, as work completions (opcode names, imm_data when it has one)."""
        from ..fastpath.vqlayout import WC_NAMES, WC_WITH_IMM  # noqa: PLC0415
        out = []
        while True:
            n = self.c.mr_dp_cq_take(self.d, handle, self._cqes, 256)
            if n <= 0:
                return out
            for i in range(n):
                x = self._cqes[i]
                out.append({"wr_id": int(x.wr_id), "status": int(x.status),
                            "opcode": WC_NAMES.get(int(x.opcode), str(int(x.opcode))),
                            "qp_num": int(x.qp_num), "src_qp": int(x.src_qp),
                            "byte_len": int(x.byte_len),
                            "imm_data": int(x.imm_data) if x.wc_flags & WC_WITH_IMM else None})

    def cq_info(self, handle: int) -> dict | None:
        info = self.ffi.new("struct mr_dp_cq_info *")
        if self.c.mr_dp_cq_info(self.d, handle, info):
            return None
        return {"cqe": info.cqe, "produced": info.produced, "consumed": info.consumed,
                "overrun": bool(info.overrun), "bad_index": bool(info.bad_index),
                "dropped": info.dropped}

    def qp_add(self, qpn: int, owner: int, pd: int, send_cq: int, recv_cq: int,
               max_send_wr: int, max_send_sge: int, max_inline: int, rings) -> None:
        c = self.ffi.new("struct mr_dp_qp *")
        c.qpn, c.pd, c.owner, c.send_cq, c.recv_cq = qpn, pd, owner, send_cq, recv_cq
        c.max_send_wr, c.max_send_sge, c.max_inline = max_send_wr, max_send_sge, max_inline
        sq = rq = self.ffi.NULL
        if rings is not None:
            sq, rq = rings.sq, rings.rq
            c.rq_entries = rings.rq_ring.entries
        self._check(self.c.mr_dp_qp_add(self.d, c, sq, rq), f"QP 0x{qpn:06x}")

    def qp_connect(self, qpn: int, *, mode: str, attr: dict, paths: int, credit: bool,
                   sq_slot: int, remote_qpn: int, flow, cc=None) -> None:
        c = self.ffi.new("struct mr_dp_conn *")
        for k, v in attr.items():
            setattr(c.attr, k, v)
        c.mode = self.c.MRE_METAROCE if mode == "metaroce" else self.c.MRE_COMPAT
        c.paths, c.credit = max(1, paths), int(credit)
        if cc is not None:                  # engine.cc.CCConfig: the engine's CC on the wire
            set_cc(c.engine, cc)
        c.sq_slot, c.remote_qpn = sq_slot, remote_qpn
        self.ffi.memmove(self.ffi.addressof(c.flow), flow, self.ffi.sizeof("struct mr_roce_flow"))
        self._check(self.c.mr_dp_qp_connect(self.d, qpn, c), f"connecting QP 0x{qpn:06x}")

    def qp_del(self, qpn: int) -> None:
        self.c.mr_dp_qp_del(self.d, qpn)

    def doorbell_add(self, fd: int) -> None:
        self._check(self.c.mr_dp_doorbell_add(self.d, fd), "doorbell")

    def doorbell_del(self, fd: int) -> None:
        self.c.mr_dp_doorbell_del(self.d, fd)

    # ---- what the control plane reads -------------------------------------------------------

    @property
    def async_fd(self) -> int:
        return self.c.mr_dp_async_fd(self.d)

    def take_async(self) -> list[AsyncEvent]:
        out = []
        names = {self.c.MR_DP_CQ_ERR: "CQ_ERR", self.c.MR_DP_QP_FATAL: "QP_FATAL"}
        while True:
            n = self.c.mr_dp_take_async(self.d, self._async, 64)
            for i in range(n):
                a = self._async[i]
                out.append(AsyncEvent(names.get(a.type, str(a.type)), int(a.owner), int(a.cq),
                                      int(a.qpn), int(a.cqe), bool(a.bad_index)))
            if n < 64:
                return out

    def qp_info(self, qpn: int):
        """The engine's and the adapter's view of one QP (struct mr_dp_qp_info), or None."""
        info = self.ffi.new("struct mr_dp_qp_info *")
        if self.c.mr_dp_qp_info(self.d, qpn, info):
            return None
        return info

    def path_info(self, qpn: int, k: int) -> dict | None:
        p = self.ffi.new("struct mre_path_info *")
        if self.c.mr_dp_path_info(self.d, qpn, k, p):
            return None
        return {"path": k, "sport": p.sport, "weight": round(p.weight, 3), "sent": p.sent,
                "acked": p.acked, "lost": p.lost, "rtos": p.rtos, "ecn": p.ecn,
                "srtt_us": round(p.srtt / 1e3, 1) if p.srtt >= 0 else None,
                "evictions": p.evictions,
                "sent_packets": int(self.c.mr_dp_path_pkts(self.d, qpn, k))}

    def stats(self) -> dict:
        st = self.ffi.new("struct mr_dp_stats *")
        self.c.mr_dp_get_stats(self.d, st)
        out = {name: int(getattr(st, name)) for name, _ in self.ffi.typeof(st[0]).fields}
        out["busy_poll_us"] = round(out.pop("busy_poll_ns") / 1e3, 1)
        out["busy_poll"] = ("fixed (METAROCE_BUSY_POLL_US)" if out.pop("fixed_busy_poll") else
                            "adaptive 50-2000 us")
        out["rto_min_us"] = self.min_rto_ns / 1e3
        return out

    def xsk_stats(self) -> dict:
        st = self.ffi.new("struct mr_xsk_stats *")
        self.c.mr_dp_xsk_stats(self.d, st)
        out = {name: int(getattr(st, name)) for name, _ in self.ffi.typeof(st[0]).fields}
        return {**out, "sg": self.sg, "frame_cap": self.frame_cap}
