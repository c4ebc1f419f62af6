"""The verbs objects. Every call is one request to the device's daemon; completions come back
asynchronously on the same connection and wait in their CQ until polled."""

from __future__ import annotations

import array
import base64
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
from .enums import IBV_EVENT_CQ_ERR, IBV_SEND_INLINE, IBV_SEND_SIGNALED


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
            if m.get("event") == "wc":
                cq = self._cqs.get(m["cq"])
                if cq is not None:
                    cq._wcs.extend(WC(**w) for w in m["wcs"])
            elif m.get("event") == "async":
                ev = AsyncEvent(m["type"], m.get("cq"), m.get("qp_num"))
                self._async.append(ev)
                cq = self._cqs.get(m.get("cq"))
                if ev.event_type == IBV_EVENT_CQ_ERR and cq is not None:
                    cq._overrun = True
            elif "id" in m:
                nfds = 1 if m.get("map_bytes") else 0
                self._replies[m["id"]] = (m, [self._fds.popleft() for _ in range(nfds)])
        return True

    def request(self, op: str, **kw) -> tuple[dict, list[int]]:
        if self.closed:
            raise MetaroceError("the device context is closed")
        self._next += 1
        rid = self._next
        req = {"op": op, "id": rid, **kw}
        ci = self._consumer_indexes()
        if ci:
            req["cq_ci"] = ci            # what was polled since, piggybacked
        self._write(req)
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

    def _consumer_indexes(self) -> list[list[int]]:
        out = []
        for cq in self._cqs.values():
            if cq._polled != cq._reported:
                out.append([cq.handle, cq._polled])
                cq._reported = cq._polled
        return out

    def _ring_ci(self, cq: "CQ") -> None:
        """Tell the daemon how far cq was polled (a doorbell: no reply)."""
        if self.closed:
            return
        cq._reported = cq._polled
        self._write({"op": "cq_ci", "cq_ci": [[cq.handle, cq._polled]]})

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


class CQ:
    """A completion queue of at least cqe entries (`cqe` says how many it got). Completions
    not yet polled count against it; one more overruns it, as in verbs: the CQ and its QPs go
    to ERR, IBV_EVENT_CQ_ERR arrives (Context.get_async_event) and poll/wait raise."""

    def __init__(self, ctx: Context, cqe: int = 1024):
        self.ctx = ctx
        rep = ctx.request("create_cq", cqe=int(cqe))[0]
        self.handle, self.cqe, self._ci_every = rep["cq"], rep["cqe"], rep["ci_every"]
        self._wcs: deque[WC] = deque()
        self._polled = self._reported = 0     # the consumer index, and what the daemon knows
        self._overrun = False
        ctx._cqs[self.handle] = self

    def _check(self) -> None:
        if self._overrun:
            raise MetaroceError(f"CQ {self.handle} overran: more than its {self.cqe} entries "
                                f"were left unpolled (IBV_EVENT_CQ_ERR); the CQ and its QPs are "
                                f"in ERR")

    def _take(self, n: int) -> list[WC]:
        out = [self._wcs.popleft() for _ in range(n)]
        self._polled += n
        if self._polled - self._reported >= self._ci_every:
            self.ctx._ring_ci(self)
        return out

    def poll(self, num_entries: int = 1) -> list[WC]:
        """Up to num_entries completions, without waiting."""
        if not self._wcs:
            self.ctx._pump(0)
        self._check()
        return self._take(min(num_entries, len(self._wcs)))

    def wait(self, num_entries: int = 1, timeout_s: float = 10.0) -> list[WC]:
        """Block until num_entries completions arrived (or raise after timeout_s)."""
        deadline = time.monotonic() + timeout_s
        while len(self._wcs) < num_entries:
            self._check()
            left = deadline - time.monotonic()
            if left <= 0:
                raise MetaroceError(f"no completion within {timeout_s} s "
                                    f"({len(self._wcs)} of {num_entries})")
            self.ctx._pump(min(left, 0.5))
        self._check()
        return self._take(num_entries)


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

    def to_json(self) -> dict:
        d = {"opcode": self.opcode, "wr_id": self.wr_id, "sg_list": self.sg_list,
             "send_flags": self.send_flags, "remote_addr": self.remote_addr, "rkey": self.rkey,
             "imm_data": self.imm_data, "compare_add": self.compare_add, "swap": self.swap}
        if self.send_flags & IBV_SEND_INLINE:
            d["inline"] = base64.b64encode(self.inline_data or b"").decode()
        return d


@dataclass
class RecvWR:
    wr_id: int = 0
    sg_list: list = field(default_factory=list)


class QP:
    """A reliable connected QP. `attrs` holds what the peer needs (qpn, psn, gid, mtu)."""

    def __init__(self, pd: PD, init: QPInitAttr):
        if init.qp_type != "RC":
            raise MetaroceError("only RC QPs are supported")
        self.pd, self.ctx = pd, pd.ctx
        cap = init.cap.__dict__
        self.attrs = self.ctx.request("create_qp", pd=pd.handle, send_cq=init.send_cq.handle,
                                      recv_cq=init.recv_cq.handle, cap=cap)[0]
        self.qp_num, self.psn = self.attrs["qpn"], self.attrs["psn"]
        self.state = "INIT"
        self._remote: dict | None = None

    def to_init(self) -> None:
        self.state = "INIT"

    def to_rtr(self, remote: dict, **attr) -> None:
        """Remote attributes: qpn, psn, ip (or gid), optionally mtu and mode (what the peer's
        device offers: "metaroce" selects MetaRoCE mode when this device offers it too; a peer
        that says nothing gets plain RoCEv2)."""
        self._remote = {"qpn": remote["qpn"], "psn": remote["psn"],
                        "ip": remote.get("ip") or remote.get("gid"), "mtu": remote.get("mtu", 1024),
                        "mode": remote.get("mode", "roce")}
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

    def post_send(self, wrs) -> None:
        wrs = wrs if isinstance(wrs, list) else [wrs]
        self.ctx.request("post_send", qpn=self.qp_num, wrs=[w.to_json() for w in wrs])

    def post_recv(self, wrs) -> None:
        wrs = wrs if isinstance(wrs, list) else [wrs]
        self.ctx.request("post_recv", qpn=self.qp_num,
                         wrs=[{"wr_id": w.wr_id, "sg_list": w.sg_list} for w in wrs])

    def query(self) -> dict:
        return self.ctx.request("query_qp", qpn=self.qp_num)[0]

    def close(self) -> None:
        if not self.ctx.closed:
            self.ctx.request("destroy_qp", qpn=self.qp_num)
