"""The daemon's side of the shared-memory verbs queues (metaroce/fastpath/vq.h): it creates a
QP's send ring and a CQ's completion ring in memfds sealed against shrinking (an application
cannot pull the memory from under the daemon; the receive ring is a BPF map, rx.RecvRing) and
hands the fds to the owner. The data path thread (metaroce/datapath) drains the send rings and
writes the completion rings through its own copies of these views: it copies WQEs out before
looking at them and never trusts an index or a length read there."""

from __future__ import annotations

import fcntl
import mmap
import os

from ..errors import MetaroceError
from ..fastpath.vqlayout import C, CQE, WQE_DATA, ring_bytes, stride_for
from ..fastpath.xsk import _lib

_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


def _pow2(n: int) -> int:
    return 1 << max(0, (max(1, n) - 1).bit_length())


class SharedMemory:
    """A memfd of `size` bytes, sealed so that its size can never change, mapped here."""

    def __init__(self, name: str, size: int):
        mod = _lib()
        self.ffi = mod.ffi
        self.fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.fd, size)
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, _SEALS)
            self.mm = mmap.mmap(self.fd, size)
        except OSError:
            os.close(self.fd)
            raise
        self.size = size
        self.ptr = self.ffi.from_buffer(self.mm)

    def close(self) -> None:
        if self.mm is not None:
            self.ffi.release(self.ptr)
            self.mm.close()
            os.close(self.fd)
            self.mm = None


class QpRings:
    """A QP's send queue (a memfd of its own) and receive queue (the RecvRing the NIC's program
    reads, metaroce/nic/rx.py): the daemon's views of both."""

    def __init__(self, qpn: int, max_send_wr: int, max_send_sge: int, max_inline: int, rq):
        mod = _lib()
        self.ffi, self.c = mod.ffi, mod.lib
        self.qpn, self.rq_ring = qpn, rq
        self.max_send_sge, self.max_inline = max_send_sge, max_inline
        self.sq_entries = _pow2(max_send_wr)
        self.sq_stride = stride_for(WQE_DATA + max(16 * max_send_sge, max_inline))
        self.mem = SharedMemory(f"metaroce-sq-{qpn:06x}",
                                ring_bytes(self.sq_entries, self.sq_stride))
        self.sq = self.ffi.new("struct mr_vq *")
        if self.c.mr_vq_create(self.sq, self.mem.ptr, C["MR_VQ_SQ"], self.sq_entries,
                               self.sq_stride, max_send_wr, max_send_sge, max_inline, qpn, -1):
            self.mem.close()
            raise MetaroceError("ring geometry refused")      # a bug, never input
        self.rq = rq.view

    @property
    def fds(self) -> list[int]:
        """The send queue's memfd and the receive queue's map, for the owner."""
        return [self.mem.fd, self.rq_ring.fd]

    def describe(self) -> dict:
        """What the owner needs to map the rings (the fds travel with it)."""
        return {"sq": {"bytes": self.mem.size, "offset": 0, "entries": self.sq_entries,
                       "stride": self.sq_stride, "max_wr": int(self.sq.max_wr),
                       "max_sge": self.max_send_sge, "max_inline": self.max_inline},
                "rq": self.rq_ring.describe()}

    def close(self) -> None:
        self.mem.close()            # the receive ring goes with the QP's kernel state


class CqRing:
    """A CQ's completion ring; events go to the eventfd of its completion channel."""

    def __init__(self, handle: int, entries: int, event_fd: int):
        mod = _lib()
        self.ffi, self.c = mod.ffi, mod.lib
        self.entries = entries
        self.mem = SharedMemory(f"metaroce-cq-{handle}", ring_bytes(entries, CQE.size))
        self.q = self.ffi.new("struct mr_vq *")
        if self.c.mr_vq_create(self.q, self.mem.ptr, C["MR_VQ_CQ"], entries, CQE.size, entries,
                               0, 0, handle, event_fd):
            self.mem.close()
            raise MetaroceError("ring geometry refused")

    @property
    def fd(self) -> int:
        return self.mem.fd

    def describe(self) -> dict:
        return {"bytes": self.mem.size, "entries": self.entries, "stride": CQE.size}

    def close(self) -> None:
        self.mem.close()


def new_eventfd() -> int:
    return os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)


def drain_eventfd(fd: int) -> None:
    try:
        os.eventfd_read(fd)
    except (BlockingIOError, OSError):
        pass
