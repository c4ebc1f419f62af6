"""The application's side of the shared-memory verbs queues (metaroce/fastpath/vq.h): a QP's
send and receive rings and a CQ's completion ring, mapped from the memfds its daemon passed.
Posting packs the work requests into slots and hands them to the C layer in one call (copy,
release store, the doorbell only if the daemon sleeps); polling copies CQEs out in one call.
Neither makes a system call while the daemon is awake."""

from __future__ import annotations

import mmap
import os
import struct

from ..engine.wr import WcStatus
from ..errors import MetaroceError
from ..fastpath.vqlayout import (C, CQE, RECV_WQE, RECV_WQE_DATA, SEND_WQE, SGE, WC_NAMES,
                                 WC_WITH_IMM, WQE_DATA, WR_CODES)
from ..fastpath.xsk import _lib
from ..nic.wqe import MSG_SEND, MSG_WRITE, SEND_KINDS, U64, BadWqe, check_recv, check_send

_ERR = C["MR_VQ_ERR"]
_INLINE = C["MR_SEND_INLINE"]
_ENOSPC, _EPIPE = 28, 32
POLL_BATCH = 256


class Mapping:
    """The application's mapping of one memfd the daemon passed (the fd is closed once mapped:
    the mapping keeps the memory)."""

    def __init__(self, fd: int, size: int):
        try:
            self.mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        mod = _lib()
        self.ffi = mod.ffi
        self.ptr = self.ffi.from_buffer(self.mm)

    def close(self) -> None:
        if self.mm is not None:
            self.ffi.release(self.ptr)
            self.mm.close()
            self.mm = None


class _Ring:
    def __init__(self, mapping: Mapping, desc: dict, kind: int, fd: int):
        mod = _lib()
        self.ffi, self.c = mod.ffi, mod.lib
        self.mapping = mapping
        self.q = self.ffi.new("struct mr_vq *")
        self.stride = int(desc["stride"])
        if self.c.mr_vq_attach(self.q, mapping.ptr + int(desc.get("offset", 0)), kind,
                               int(desc["entries"]), self.stride, fd):
            raise MetaroceError("the daemon's ring does not match what it announced (a library "
                                "of another version?)")

    @property
    def error(self) -> bool:
        return bool(self.c.mr_vq_flags(self.q) & _ERR)

    @property
    def doorbells(self) -> int:
        return int(self.q.doorbells)


class SendQueue(_Ring):
    def __init__(self, mapping: Mapping, desc: dict, doorbell: int):
        super().__init__(mapping, desc, C["MR_VQ_SQ"], doorbell)
        self.max_wr, self.max_sge = int(desc["max_wr"]), int(desc["max_sge"])
        self.max_inline = int(desc["max_inline"])

    def post(self, wrs: list, local) -> int:
        """Check and pack every work request, then post them all; returns 0 or the C layer's
        -ENOSPC / -EPIPE. local(sge, access) checks an SGE against the caller's regions."""
        stride = self.stride
        buf = bytearray(len(wrs) * stride)
        for i, wr in enumerate(wrs):
            try:
                self._pack(buf, i * stride, wr, local)
            except (TypeError, ValueError, OverflowError, AttributeError) as exc:
                raise MetaroceError(f"work request {i} is malformed: {exc}") from None
        return self.c.mr_vq_post(self.q, self.ffi.from_buffer(buf), len(wrs))

    def _pack(self, buf: bytearray, off: int, wr, local) -> None:
        """One work request into its slot at off, checked by the device's rules."""
        op = WR_CODES.get(str(wr.opcode).removeprefix("IBV_WR_"))
        if op is None:
            raise BadWqe(WcStatus.LOC_QP_OP_ERR, f"unknown work request opcode {wr.opcode!r}")
        flags = int(wr.send_flags)
        inline = SEND_KINDS[op][0] in (MSG_WRITE, MSG_SEND) and flags & _INLINE
        data = b""
        if inline and wr.inline_data is not None:
            if not isinstance(wr.inline_data, (bytes, bytearray, memoryview)):
                raise MetaroceError("inline_data must be bytes")
            data = bytes(wr.inline_data)
        sg = [] if inline else wr.sg_list
        check_send(op, flags, sg, len(data), int(wr.remote_addr), self.max_sge,
                   self.max_inline, local)
        if inline:
            buf[off + WQE_DATA:off + WQE_DATA + len(data)] = data
        else:
            flags &= ~_INLINE
            for j, s in enumerate(sg):
                SGE.pack_into(buf, off + WQE_DATA + 16 * j, int(s[0]), int(s[1]), int(s[2]))
        try:
            SEND_WQE.pack_into(buf, off, int(wr.wr_id), op, flags & 0xFF, len(sg), len(data),
                               int(wr.remote_addr), int(wr.rkey), int(wr.imm_data) & 0xFFFFFFFF,
                               int(wr.compare_add) & U64, int(wr.swap) & U64)
        except struct.error:
            raise MetaroceError(_range_error(wr)) from None


def _range_error(wr) -> str:
    if not 0 <= int(wr.wr_id) <= U64:
        return "wr_id must fit 64 bits (0 .. 2^64-1)"
    if not 0 <= int(wr.remote_addr) <= U64:
        return "remote_addr must fit 64 bits"
    return "rkey must fit 32 bits"


class RecvQueue(_Ring):
    def __init__(self, mapping: Mapping, desc: dict, doorbell: int):
        super().__init__(mapping, desc, C["MR_VQ_RQ"], doorbell)
        self.max_wr = int(desc["max_wr"])

    def post(self, wrs: list, local) -> int:
        """As ibv_post_recv: the receives before the first bad one are posted, then the bad
        one's error is raised; returns 0 or the C layer's -ENOSPC / -EPIPE."""
        stride = self.stride
        buf = bytearray(len(wrs) * stride)
        for i, wr in enumerate(wrs):
            off = i * stride
            try:
                check_recv(wr.sg_list, local)
                s = wr.sg_list[0]
                if not 0 <= int(wr.wr_id) <= U64:
                    raise MetaroceError("wr_id must fit 64 bits (0 .. 2^64-1)")
                RECV_WQE.pack_into(buf, off, int(wr.wr_id), 1)
                SGE.pack_into(buf, off + RECV_WQE_DATA, int(s[0]), int(s[1]), int(s[2]))
            except (MetaroceError, TypeError, ValueError, OverflowError, AttributeError) as exc:
                rc = self.c.mr_vq_post(self.q, self.ffi.from_buffer(buf), i) if i else 0
                if rc:
                    return rc
                if isinstance(exc, MetaroceError):
                    raise
                raise MetaroceError(f"receive {i} is malformed: {exc}") from None
        return self.c.mr_vq_post(self.q, self.ffi.from_buffer(buf), len(wrs))


class CompletionRing(_Ring):
    """A CQ's ring; make(...) builds one completion object from a CQE's fields."""

    def __init__(self, mapping: Mapping, desc: dict, make):
        super().__init__(mapping, desc, C["MR_VQ_CQ"], -1)
        self._make = make
        self._out = self.ffi.new("uint8_t[]", POLL_BATCH * CQE.size)
        self._view = self.ffi.buffer(self._out)

    def poll(self, n: int) -> list:
        out = []
        while n > 0:
            k = self.c.mr_vq_poll(self.q, self._out, min(n, POLL_BATCH))
            if not k:
                break
            make = self._make
            for wr_id, byte_len, imm, qpn, src_qp, status, op, flags in \
                    CQE.iter_unpack(self._view[:k * CQE.size]):
                out.append(make(wr_id, status, WC_NAMES.get(op, op), qpn, byte_len,
                                imm if flags & WC_WITH_IMM else None, src_qp))
            n -= k
        return out

    def arm(self, solicited_only: bool = False) -> int:
        """req_notify_cq; returns the completions already waiting."""
        return self.c.mr_vq_arm(self.q, int(solicited_only))

    def ready(self) -> int:
        return self.c.mr_vq_ready(self.q)

    def notified(self) -> int:
        return self.c.mr_vq_notified(self.q)
