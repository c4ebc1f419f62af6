"""The daemon's side of the shared-memory verbs queues (metaroce/fastpath/vq.h). It creates a
QP's send ring and a CQ's completion ring in memfds sealed against shrinking (an application
cannot pull the memory from under the daemon; the receive ring is a BPF map, rx.RecvRing),
hands the fds to the owner, copies WQEs out of the rings in batches before looking at them (an
index or a length read there is never trusted: the C layer masks indices and bounds counts by
the ring), writes CQEs and signals completion channels, and keeps the table of rings it
busy-polls and sleeps on."""

from __future__ import annotations

import fcntl
import mmap
import os
from typing import NamedTuple

from ..errors import MetaroceError
from ..fastpath.vqlayout import (C, CQE, HDR_SIZE, MAX_SGE, RECV_WQE, RECV_WQE_DATA, SEND_WQE,
                                 SGE, WC_CODES, WC_SOLICITED, WC_WITH_IMM, WQE_DATA, ring_bytes,
                                 stride_for)
from ..fastpath.xsk import _lib

FETCH_BATCH = 64               # WQEs copied out of one ring per call
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
_SEND_INLINE = C["MR_SEND_INLINE"]


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


class SendEntry(NamedTuple):
    """A send WQE as copied out of the ring (nothing here is checked yet); slot: its offset in
    the scratch it was copied to (valid until the next fetch)."""
    slot: int
    wr_id: int
    opcode: int
    flags: int
    sges: list
    inline: bytes
    inline_len: int
    remote_addr: int
    rkey: int
    imm: int
    compare_add: int
    swap: int


class RecvEntry(NamedTuple):
    wr_id: int
    sges: list


class Scratch:
    """Where WQEs are copied out of shared memory: the daemon's own, reused by every fetch."""

    def __init__(self, max_stride: int):
        mod = _lib()
        self.ffi, self.c = mod.ffi, mod.lib
        self.buf = self.ffi.new("uint8_t[]", FETCH_BATCH * max_stride)

    def take(self, q, stride: int) -> bytes | None:
        """Copy the ring's new WQEs (a batch); None when its producer index is impossible."""
        n = self.c.mr_vq_fetch(q, self.buf, FETCH_BATCH)
        if n < 0:
            return None
        return self.ffi.buffer(self.buf, n * stride)[:]


def _sges(raw: bytes, off: int, n: int, room: int) -> list:
    """n SGEs at off; those past the slot (room of them fit) read as empty: the rules refuse
    more SGEs than the QP takes, and a slot holds that many."""
    return [SGE.unpack_from(raw, off + 16 * j) if j < room else (0, 0, 0) for j in range(n)]


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
        self.sq.paused = 1                   # the send queue is drained from RTS on
        self.rq = rq.view
        self.broken = False                  # an impossible index was read: never drained again

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

    def fetch_send(self, scratch: Scratch) -> list[SendEntry] | None:
        raw = scratch.take(self.sq, self.sq_stride)
        if raw is None:
            return None
        stride, room = self.sq_stride, (self.sq_stride - WQE_DATA) // 16
        out = []
        for off in range(0, len(raw), stride):
            wr_id, op, flags, nsge, ilen, raddr, rkey, imm, ca, swap = SEND_WQE.unpack_from(raw, off)
            inline = raw[off + WQE_DATA:off + WQE_DATA + min(ilen, stride - WQE_DATA)]
            sges = _sges(raw, off + WQE_DATA, nsge, room)
            out.append(SendEntry(off, wr_id, op, flags, sges, inline, ilen, raddr, rkey, imm, ca,
                                 swap))
        return out

    def fetch_recv(self, scratch: Scratch) -> list[RecvEntry] | None:
        """The receives posted beyond the released ones (the NIC's program does not take them
        any more: a QP in ERR flushes them)."""
        stride = self.rq_ring.stride
        raw = scratch.take(self.rq, stride)
        if raw is None:
            return None
        room = (stride - RECV_WQE_DATA) // 16
        out = []
        for off in range(0, len(raw), stride):
            wr_id, nsge = RECV_WQE.unpack_from(raw, off)
            out.append(RecvEntry(wr_id, _sges(raw, off + RECV_WQE_DATA, min(nsge, MAX_SGE + 1),
                                              room)))
        return out

    def settle(self, send_outstanding: int, recvs_done: int) -> None:
        """Release the slots of what completed (no longer outstanding): the owner may post
        into them again."""
        self.c.mr_vq_settle(self.sq, send_outstanding)
        done = recvs_done & 0xFFFFFFFF
        if done != self.rq.tail:
            self.c.mr_vq_consume_to(self.rq, done)

    def set_ready(self, ready: bool) -> None:
        self.sq.paused = 0 if ready and not self.broken else 1

    def set_error(self, recvs_done: int) -> None:
        """The QP is in ERR: the owner's library refuses to post; whatever is posted is
        flushed (the receives from recvs_done on)."""
        for q in (self.sq, self.rq):
            self.c.mr_vq_set_flags(q, C["MR_VQ_ERR"], 0)
        self.sq.paused = self.rq.paused = int(self.broken)
        self.c.mr_vq_consume_to(self.rq, recvs_done & 0xFFFFFFFF)

    def set_broken(self) -> None:
        """The owner wrote an index no ring can have: neither ring is read again (the QP is
        in ERR; the owner can only destroy it)."""
        self.broken = True
        self.sq.paused = self.rq.paused = 1

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
        self.head = 0
        self.eligible = False            # a solicited or error CQE since the last publish

    @property
    def fd(self) -> int:
        return self.mem.fd

    def describe(self) -> dict:
        return {"bytes": self.mem.size, "entries": self.entries, "stride": CQE.size}

    def consumer_index(self) -> int:
        """The owner's consumer index as it is in shared memory now (unchecked)."""
        return self.c.mr_vq_consumer(self.q)

    def put(self, wc: dict) -> None:
        """Write the next CQE (the caller has checked that the owner consumed its slot)."""
        flags = WC_WITH_IMM if wc.get("imm_data") is not None else 0
        status = int(wc.get("status", 0))
        if wc.get("solicited"):
            flags |= WC_SOLICITED
        if status or flags & WC_SOLICITED:
            self.eligible = True
        CQE.pack_into(self.mem.mm, HDR_SIZE + (self.head & (self.entries - 1)) * CQE.size,
                      int(wc["wr_id"]) & (1 << 64) - 1, int(wc.get("byte_len", 0)) & 0xFFFFFFFF,
                      int(wc.get("imm_data") or 0) & 0xFFFFFFFF, int(wc["qp_num"]),
                      int(wc.get("src_qp", 0)), status, WC_CODES[wc["opcode"]], flags)
        self.head += 1

    def publish(self) -> None:
        """Make what was put visible and signal the channel if the owner armed the CQ."""
        self.q.head = self.head & 0xFFFFFFFF
        self.c.mr_vq_publish(self.q, int(self.eligible))
        self.eligible = False

    def set_error(self) -> None:
        self.c.mr_vq_set_flags(self.q, C["MR_VQ_ERR"], 0)
        self.q.head = self.head & 0xFFFFFFFF
        self.c.mr_vq_publish(self.q, 1)      # an armed waiter wakes and sees the error

    def close(self) -> None:
        self.mem.close()


def new_eventfd() -> int:
    return os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)


def drain_eventfd(fd: int) -> None:
    try:
        os.eventfd_read(fd)
    except (BlockingIOError, OSError):
        pass


class RingTable:
    """Every send and receive ring the daemon drains, as one C array of views for the scans:
    which rings have work, busy-polling, and the need_wakeup handshake before sleeping."""

    def __init__(self):
        mod = _lib()
        self.ffi, self.c = mod.ffi, mod.lib
        self.owners: list[tuple[object, bool]] = []     # (qp, is_send) per ring
        self._views: list = []
        self._arr = None
        self._idx = None

    def add(self, qp, view, is_send: bool = True) -> None:
        """A ring to drain: a QP's send queue; its receive queue only once the QP is in ERR
        (until then the NIC's program takes receives, and the daemon only flushes them)."""
        if (qp, is_send) in self.owners:
            return
        self.owners.append((qp, is_send))
        self._views.append(view)
        self._arr = None

    def remove(self, qp) -> None:
        keep = [i for i, (q, _) in enumerate(self.owners) if q is not qp]
        self.owners = [self.owners[i] for i in keep]
        self._views = [self._views[i] for i in keep]
        self._arr = None

    def _array(self):
        if self._arr is None:
            self._arr = self.ffi.new("struct mr_vq *[]", self._views or 1)
            self._idx = self.ffi.new("uint32_t[]", max(1, len(self._views)))
        return self._arr

    def pending(self) -> list[tuple[object, bool]]:
        """The rings with WQEs to fetch now."""
        arr = self._array()
        n = self.c.mr_vqs_pending(arr, len(self._views), self._idx, len(self._views))
        return [self.owners[self._idx[i]] for i in range(n)]

    def spin(self, until_ns: int, evring) -> bool:
        return bool(self.c.mr_vqs_spin(self._array(), len(self._views), evring, until_ns))

    def sleep(self) -> bool:
        """Tell every owner the daemon sleeps (ring the doorbell after posting); False, with
        the flags cleared again, if work arrived meanwhile."""
        arr = self._array()
        if self.c.mr_vqs_sleep(arr, len(self._views)):
            self.c.mr_vqs_wake(arr, len(self._views))
            return False
        return True

    def wake(self) -> None:
        self.c.mr_vqs_wake(self._array(), len(self._views))
