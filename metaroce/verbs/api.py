"""The verbs objects. Control verbs (PD, MR, CQ and QP create/modify/destroy, connect, query)
are requests to the device's daemon over its control socket; the data path is shared memory:
post_send/post_recv write WQEs into the QP's rings and poll reads CQEs from the CQ's ring
(metaroce/verbs/queues.py), with no system call while the daemon is awake. A CQ blocks in
wait() on its completion channel (an eventfd the daemon signals after req_notify)."""

from __future__ import annotations

import array
import json
import mmap
import os
import select
import socket
import time
from collections import deque
from dataclasses import dataclass, field

from ..engine.wr import WcStatus
from ..errors import MetaroceError
from ..nic.daemon import not_running
from ..nic.devid import DeviceId
from ..nic.wqe import check_sge_in, not_in_pd
from .enums import IBV_EVENT_CQ_ERR, IBV_SEND_SIGNALED
from .queues import CompletionRing, Mapping, RecvQueue, SendQueue

_ENOSPC, _EPIPE = 28, 32
WAIT_SPIN_S = 50e-6     # CQ.wait polls this long before it arms the CQ and blocks (a blocked
                        # waiter's wake-up costs ~30 us on this 2-vCPU VM: facts.md)


class WcError(MetaroceError):
    """A work completion with an error status."""


@dataclass
class AsyncEvent:
    """An affiliated asynchronous event (ibv_async_event): event_type is IBV_EVENT_CQ_ERR (cq
    names the CQ) or IBV_EVENT_QP_FATAL (qp_num names the QP, cq the CQ that caused it)."""
    event_type: str
    cq: int | None = None
    qp_num: int | None = None


def wc_status_str(status: int) -> str:
    try:
        return "IBV_WC_" + WcStatus(status).name
    except ValueError:
        return f"status {status}"


class Context:
    """An open device (one daemon): `Context(name="eth0", netns=None)`."""

    def __init__(self, name: str, netns: str | None = None, timeout_s: float = 30.0):
        self.dev = DeviceId(name, netns)
        self.timeout_s = timeout_s
        self._s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._s.connect(self.dev.sock_path)
        except (FileNotFoundError, ConnectionRefusedError):
            self._s.close()
            raise MetaroceError(not_running(self.dev)) from None
        except PermissionError:
            self._s.close()
            raise MetaroceError(f"not allowed to use the device {self.dev.where()}: the control socket "
                                f"{self.dev.sock_path} is for root and its group") from None
        self._buf = b""
        self._fds: deque[int] = deque()
        self._replies: dict[int, tuple[dict, list]] = {}
        self._next = 0
        self._cqs: dict[int, CQ] = {}
        self._mrs: dict[int, MR] = {}           # lkey -> region: post checks SGEs against them
        self._doorbell: int | None = None       # rung when the daemon sleeps (need_wakeup)
        self._async: deque[AsyncEvent] = deque()
        self.closed = False

    # -- transport --
    def _lost(self):
        self.closed = True
        raise MetaroceError(f"the MetaRoCE daemon of {self.dev.where()} closed the connection: it "
                            f"stopped, or it cut this application off for leaving more than "
                            f"its output bound unread (see the device's log)")

    def _write(self, msg: dict) -> None:
        try:
            self._s.sendall((json.dumps(msg) + "\n").encode())
        except OSError:
            self._lost()

    def _pump(self, timeout: float | None) -> bool:
        """Read what the daemon sent (waiting up to timeout); False on timeout."""
        r, _, _ = select.select([self._s], [], [], timeout)
        if not r:
            return False
        fds = array.array("i")
        try:
            msg, anc, _f, _a = self._s.recvmsg(1 << 20, socket.CMSG_SPACE(16 * fds.itemsize))
        except ConnectionResetError:
            msg = b""
        if not msg:
            self._lost()
        for level, ctype, cdata in anc:
            if level == socket.SOL_SOCKET and ctype == socket.SCM_RIGHTS:
                fds.frombytes(cdata[:len(cdata) - len(cdata) % fds.itemsize])
        self._fds.extend(fds)
        self._buf += msg
        while b"\n" in self._buf:
            line, self._buf = self._buf.split(b"\n", 1)
            m = json.loads(line)
            if m.get("event") == "async":
                ev = AsyncEvent(m["type"], m.get("cq"), m.get("qp_num"))
                self._async.append(ev)
                cq = self._cqs.get(m.get("cq"))
                if ev.event_type == IBV_EVENT_CQ_ERR and cq is not None:
                    cq._overrun = True
            elif "id" in m:
                nfds = int(m.get("fds", 0))
                self._replies[m["id"]] = (m, [self._fds.popleft() for _ in range(nfds)])
        return True

    def _wait_fds(self, fds: list[int], timeout: float | None) -> list[int]:
        """Block until one of fds is readable or the daemon says something (read at once:
        an async event, or the connection closing, ends the wait too); the fds readable."""
        r, _, _ = select.select([self._s, *fds], [], [], timeout)
        if self._s in r:
            self._pump(0)
        return [f for f in r if f is not self._s]

    def request(self, op: str, **kw) -> tuple[dict, list[int]]:
        if self.closed:
            raise MetaroceError("the device context is closed")
        self._next += 1
        rid = self._next
        self._write({"op": op, "id": rid, **kw})
        deadline = time.monotonic() + self.timeout_s
        while rid not in self._replies:
            left = deadline - time.monotonic()
            if left <= 0 or not self._pump(left):
                raise MetaroceError(f"the MetaRoCE daemon did not answer {op} in time")
        rep, fds = self._replies.pop(rid)
        if "error" in rep:
            for fd in fds:
                os.close(fd)
            raise MetaroceError(f"{op}: {rep['error']}")
        return rep, fds

    def get_async_event(self, timeout_s: float | None = 10.0) -> AsyncEvent | None:
        """The next asynchronous event (ibv_get_async_event), waiting up to timeout_s (None:
        for ever); None if none came."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self._async:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            self._pump(0.5 if left is None else min(left, 0.5))
        return self._async.popleft()

    def query_device(self) -> dict:
        return self.request("query_device")[0]

    def query_port(self, port: int = 1) -> dict:
        d = self.query_device()
        return {"port": port, "state": "ACTIVE", "active_mtu": d["max_pmtu"],
                "max_mtu": d["max_pmtu"], "link_layer": "Ethernet", "gid_tbl_len": 1}

    def status(self) -> dict:
        return self.request("status")[0]

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._s.close()
        while self._fds:
            os.close(self._fds.popleft())
        if self._doorbell is not None:
            os.close(self._doorbell)
            self._doorbell = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class PD:
    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.handle = ctx.request("alloc_pd")[0]["pd"]


class MR:
    """Registered memory: `buf` is a writable memoryview the kernel data path places into."""

    def __init__(self, pd: PD, length: int, access: int):
        self.pd, self.ctx = pd, pd.ctx
        rep, fds = self.ctx.request("reg_mr", pd=pd.handle, length=int(length), access=int(access))
        self.lkey, self.rkey, self.addr, self.length = rep["lkey"], rep["rkey"], rep["addr"], rep["length"]
        self.access = access
        self._fd = fds[0]
        self._mm = mmap.mmap(self._fd, rep["map_bytes"])
        self.buf = memoryview(self._mm)[:self.length]
        self.ctx._mrs[self.lkey] = self

    @classmethod
    def from_buffer(cls, pd: PD, buffer, access: int):
        raise MetaroceError("MetaRoCE cannot register an existing buffer: the kernel data path "
                            "places only into memory it owns; register with MR(pd, length, "
                            "access) and use mr.buf (a writable memoryview) instead")

    def sge(self, offset: int = 0, length: int | None = None) -> list[int]:
        length = self.length - offset if length is None else length
        if offset < 0 or length < 0 or offset + length > self.length:
            raise MetaroceError(f"SGE [{offset}, +{length}] is outside this MR ({self.length} bytes)")
        return [self.addr + offset, length, self.lkey]

    def write(self, data: bytes, offset: int = 0) -> None:
        self.buf[offset:offset + len(data)] = data

    def read(self, length: int, offset: int = 0) -> bytes:
        return bytes(self.buf[offset:offset + length])

    def close(self) -> None:
        if self._mm is not None:
            self.buf.release()
            self._mm.close()
            os.close(self._fd)
            self._mm = None
            self.ctx._mrs.pop(self.lkey, None)
            if not self.ctx.closed:
                self.ctx.request("dereg_mr", key=self.lkey)


@dataclass
class WC:
    wr_id: int
    status: int
    opcode: str
    qp_num: int
    byte_len: int = 0
    imm_data: int | None = None
    src_qp: int = 0


class CompChannel:
    """A completion channel (ibv_comp_channel): a pollable fd (fileno()) that becomes
    readable when a CQ attached to it, armed with req_notify, gets a completion."""

    def __init__(self, ctx: Context, *, _fd: int | None = None):
        self.ctx = ctx
        if _fd is None:
            rep, fds = ctx.request("create_comp_channel")
            self.handle, self._fd = rep["channel"], fds[0]
        else:                                   # a CQ's private channel, made with the CQ
            self.handle, self._fd = None, _fd
        self._cqs: list[CQ] = []

    def fileno(self) -> int:
        return self._fd

    def _drain(self) -> None:
        try:
            os.eventfd_read(self._fd)
        except (BlockingIOError, OSError):
            pass

    def get_cq_event(self, timeout_s: float | None = None) -> "CQ | None":
        """The next CQ of this channel that raised an event since it was armed (ibv_get_cq_event),
        waiting up to timeout_s (None: for ever); None if none did. Re-arm it with req_notify."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            for cq in self._cqs:
                sn = cq._ring.notified()
                if sn != cq._events_seen:
                    cq._events_seen = sn
                    return cq
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            if self.ctx._wait_fds([self._fd], 0.5 if left is None else min(left, 0.5)):
                self._drain()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class CQ:
    """A completion queue of at least cqe entries (`cqe` says how many it got), a ring in
    memory shared with the daemon. Completions not yet polled count against it; one more
    overruns it, as in verbs: the CQ and its QPs go to ERR, IBV_EVENT_CQ_ERR arrives
    (Context.get_async_event) and poll/wait raise. channel: a CompChannel to report events
    to (req_notify); without one the CQ gets a channel of its own, which wait() uses."""

    def __init__(self, ctx: Context, cqe: int = 1024, cq_context=None,
                 channel: CompChannel | None = None, comp_vector: int = 0):
        self.ctx, self.cq_context = ctx, cq_context
        rep, fds = ctx.request("create_cq", cqe=int(cqe),
                               channel=channel.handle if channel is not None else None)
        self.handle, self.cqe = rep["cq"], rep["cqe"]
        ring_fd, event_fd = fds
        if channel is not None:
            os.close(event_fd)                  # the channel's own fd serves
        else:
            channel = CompChannel(ctx, _fd=event_fd)
        self.channel = channel
        self._ring = CompletionRing(Mapping(ring_fd, rep["ring"]["bytes"]), rep["ring"], WC)
        self._events_seen = self._ring.notified()
        channel._cqs.append(self)
        self._stash: deque[WC] = deque()        # polled by a wait() that then timed out
        self._overrun = False
        ctx._cqs[self.handle] = self

    def _check(self) -> None:
        if self._ring is None:
            raise MetaroceError(f"CQ {self.handle} is destroyed")
        if self._overrun or self._ring.error:
            self._overrun = True
            raise MetaroceError(f"CQ {self.handle} overran: more than its {self.cqe} entries "
                                f"were left unpolled (IBV_EVENT_CQ_ERR); the CQ and its QPs are "
                                f"in ERR")

    def poll(self, num_entries: int = 1) -> list[WC]:
        """Up to num_entries completions, without waiting (and without a system call)."""
        self._check()
        if self._stash:
            out = [self._stash.popleft() for _ in range(min(num_entries, len(self._stash)))]
            return out + self._ring.poll(num_entries - len(out))
        return self._ring.poll(num_entries)

    def req_notify(self, solicited_only: bool = False) -> None:
        """Ask for an event on the channel at the next completion (ibv_req_notify_cq;
        solicited_only: the next solicited or error completion)."""
        self._ring.arm(solicited_only)

    def ack_events(self, num_events: int = 1) -> None:
        """ibv_ack_cq_events: nothing is held per event here."""

    def wait(self, num_entries: int = 1, timeout_s: float = 10.0) -> list[WC]:
        """Block until num_entries completions arrived (or raise after timeout_s): poll for a
        few microseconds, then arm the CQ and sleep on its channel."""
        out: list[WC] = []
        now = time.monotonic()
        deadline, spin_until = now + timeout_s, now + WAIT_SPIN_S
        while True:
            out += self.poll(num_entries - len(out))
            if len(out) >= num_entries:
                return out
            now = time.monotonic()
            if now < spin_until:
                continue
            if now >= deadline:
                self._stash.extendleft(reversed(out))
                raise MetaroceError(f"no completion within {timeout_s} s "
                                    f"({len(out)} of {num_entries})")
            if self._ring.arm(False):
                continue                        # arrived while arming: poll it
            if self.ctx._wait_fds([self.channel.fileno()], min(deadline - now, 0.5)):
                self.channel._drain()

    def close(self) -> None:
        if self._ring is not None:
            if not self.ctx.closed:
                self.ctx.request("destroy_cq", cq=self.handle)
            self.channel._cqs.remove(self)
            if self.channel.handle is None:
                self.channel.close()
            self._ring.mapping.close()
            self._ring = None
            self.ctx._cqs.pop(self.handle, None)


def wait_for_completions(cqs: list[CQ], timeout_s: float) -> bool:
    """Block until one of the CQs (of any contexts) has completions to poll, or timeout_s
    passes: each is armed (req_notify) and the wait is on their channels, as an application
    polling several CQs sleeps on their ibv_comp_channels. True if one has some."""
    ready = False
    for cq in cqs:
        cq._check()
        ready = cq._ring.arm(False) > 0 or bool(cq._stash) or ready
    if ready:
        return True
    by_ctx: dict = {}
    for cq in cqs:
        by_ctx.setdefault(cq.ctx, []).append(cq.channel.fileno())
    if len(by_ctx) == 1:
        ctx, fds = next(iter(by_ctx.items()))
        got = ctx._wait_fds(fds, timeout_s)
    else:
        socks = {ctx._s: ctx for ctx in by_ctx}
        r, _, _ = select.select([*socks, *(f for fds in by_ctx.values() for f in fds)], [], [],
                                timeout_s)
        for sock in [x for x in r if x in socks]:
            socks[sock]._pump(0)
        got = [x for x in r if x not in socks]
    for cq in cqs:
        if cq.channel.fileno() in got:
            cq.channel._drain()
    return any(cq._ring.ready() for cq in cqs)


@dataclass
class QPCap:
    max_send_wr: int = 1024
    max_recv_wr: int = 256
    max_send_sge: int = 16
    max_recv_sge: int = 1
    max_inline_data: int = 256


@dataclass
class QPInitAttr:
    send_cq: CQ
    recv_cq: CQ
    cap: QPCap = field(default_factory=QPCap)
    qp_type: str = "RC"


@dataclass
class SendWR:
    opcode: str
    wr_id: int = 0
    sg_list: list = field(default_factory=list)
    send_flags: int = IBV_SEND_SIGNALED
    remote_addr: int = 0
    rkey: int = 0
    imm_data: int = 0
    compare_add: int = 0
    swap: int = 0
    inline_data: bytes | None = None


@dataclass
class RecvWR:
    wr_id: int = 0
    sg_list: list = field(default_factory=list)


class QP:
    """A reliable connected QP. `attrs` holds what the peer needs (qpn, psn, gid, mtu). Its
    send and receive queues are rings shared with the daemon."""

    def __init__(self, pd: PD, init: QPInitAttr):
        if init.qp_type != "RC":
            raise MetaroceError("only RC QPs are supported")
        self.pd, self.ctx = pd, pd.ctx
        cap = init.cap.__dict__
        self.attrs, fds = self.ctx.request("create_qp", pd=pd.handle, send_cq=init.send_cq.handle,
                                           recv_cq=init.recv_cq.handle, cap=cap)
        rings = self.attrs.pop("rings")
        sq_fd, rq_fd, doorbell = fds
        if self.ctx._doorbell is None:
            self.ctx._doorbell = doorbell      # one per application: every QP rings it
        else:
            os.close(doorbell)
        self._mem = Mapping(sq_fd, rings["sq"]["bytes"])
        self._rq_mem = Mapping(rq_fd, rings["rq"]["bytes"])
        self._sq = SendQueue(self._mem, rings["sq"], self.ctx._doorbell)
        # the NIC takes receives from their ring itself: no doorbell
        self._rq = RecvQueue(self._rq_mem, rings["rq"], -1)
        self.qp_num, self.psn = self.attrs["qpn"], self.attrs["psn"]
        self.state = "INIT"
        self._remote: dict | None = None

    def to_init(self) -> None:
        self.state = "INIT"

    def to_rtr(self, remote: dict, **attr) -> None:
        """Remote attributes: qpn, psn, ip (or gid), optionally mtu, mode (what the peer's
        device offers: "metaroce" selects MetaRoCE mode when this device offers it too; a peer
        that says nothing gets plain RoCEv2) and integrity (the cheapest check the peer's
        device accepts: "csum" selects the IPv4/UDP checksums in place of the ICRC on a
        MetaRoCE connection when this device accepts them too, spec 5.7). Attribute
        integrity= overrides the remote's (the connection manager passes what it negotiated)."""
        self._remote = {"qpn": remote["qpn"], "psn": remote["psn"],
                        "ip": remote.get("ip") or remote.get("gid"), "mtu": remote.get("mtu", 1024),
                        "mode": remote.get("mode", "roce"),
                        "integrity": remote.get("integrity", "icrc")}
        self._attr = attr
        self.state = "RTR"

    def to_rts(self, **attr) -> dict:
        if self._remote is None:
            raise MetaroceError("to_rts needs to_rtr first")
        rep = self.ctx.request("connect_qp", qpn=self.qp_num, remote=self._remote,
                               attr={**self._attr, **attr})[0]
        self.state = "RTS"
        self.path = rep
        return rep

    def connect(self, remote: dict, **attr) -> dict:
        """INIT -> RTR -> RTS in one call from the peer's attributes."""
        self.to_rtr(remote, **attr)
        return self.to_rts()

    def _local(self, sge, need: int):
        """An SGE of one of this application's regions in this QP's PD, with that access."""
        try:
            addr, length, lkey = (int(v) for v in sge)
        except (TypeError, ValueError):
            raise MetaroceError("an SGE is [addr, length, lkey]") from None
        mr = self.ctx._mrs.get(lkey)
        if mr is None or mr.pd is not self.pd:
            raise not_in_pd(lkey)
        return check_sge_in((addr, length), lkey, mr.addr, mr.length, mr.access, need)

    def _not_rts(self) -> MetaroceError:
        if self._sq.error:
            self.state = "ERR"
        return MetaroceError(f"QP 0x{self.qp_num:06x} is {self.state}: post_send needs RTS")

    def post_send(self, wrs) -> None:
        """Write the work requests into the send queue (all or none: a bad one raises and
        nothing is posted)."""
        wrs = wrs if isinstance(wrs, list) else [wrs]
        if self.state != "RTS":
            raise self._not_rts()
        rc = self._sq.post(wrs, self._local)
        if rc == -_EPIPE:
            raise self._not_rts()
        if rc == -_ENOSPC:
            raise MetaroceError(f"send queue full (max_send_wr {self._sq.max_wr})")

    def post_recv(self, wrs) -> None:
        wrs = wrs if isinstance(wrs, list) else [wrs]
        if self._mem is None:
            raise MetaroceError(f"QP 0x{self.qp_num:06x} is destroyed")
        rc = self._rq.post(wrs, self._local)
        if rc == -_EPIPE:
            self.state = "ERR"
            raise MetaroceError(f"QP 0x{self.qp_num:06x} is in ERR")
        if rc == -_ENOSPC:
            raise MetaroceError(f"receive queue full (max_recv_wr {self._rq.max_wr})")

    def query(self) -> dict:
        return self.ctx.request("query_qp", qpn=self.qp_num)[0]

    def close(self) -> None:
        if self._mem is not None:
            if not self.ctx.closed:
                self.ctx.request("destroy_qp", qpn=self.qp_num)
            self.state = "DESTROYED"
            self._mem.close()
            self._rq_mem.close()
            self._mem = None
