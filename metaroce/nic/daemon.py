"""The software RNIC daemon (`metaroce up`): owns the XDP NIC of one device in one network
namespace. The program is attached through a BPF link held by this process, so if the daemon
dies for any reason the kernel stops placing and acknowledging at once. Applications talk to it
over a local control socket (JSON lines: requests with an "id" get a reply with that id;
completions arrive as {"event": "wc"} lines); memory regions travel to their owner as map fds
(SCM_RIGHTS), so an application can map only the MRs it registered, and everything a
connection created is reclaimed when it closes."""

from __future__ import annotations

import array
import json
import os
import selectors
import signal
import socket
import sys
import time
import traceback
from dataclasses import dataclass

from pyroute2 import IPRoute

from ..errors import MetaroceError
from ..kern import libbpf
from pyroute2 import netns as _netns

from .credit import CreditConfig, link_speed_bps
from .device import DEVICE_LIMITS, Device
from .endpoints import Endpoints
from .rx import RxPath

RUN_DIR = os.environ.get("METAROCE_RUN_DIR", "/run/metaroce/nic")


@dataclass(frozen=True)
class DeviceId:
    """A device is named by its network namespace (None = the caller's) and interface."""
    dev: str
    netns: str | None = None

    @property
    def tag(self) -> str:
        return f"{self.netns or 'host'}--{self.dev}"

    @property
    def sock_path(self) -> str:
        return os.path.join(RUN_DIR, f"{self.tag}.sock")

    @property
    def pid_path(self) -> str:
        return os.path.join(RUN_DIR, f"{self.tag}.pid")

    @property
    def log_path(self) -> str:
        return os.path.join(RUN_DIR, f"{self.tag}.log")


def running_pid(dev: DeviceId) -> int | None:
    try:
        pid = int(open(dev.pid_path).read().strip())
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                return None                 # dead, not yet reaped by its parent
    except (ProcessLookupError, FileNotFoundError):
        return None
    return pid


def clean_stale(dev: DeviceId) -> bool:
    """Remove the pid file and socket of a daemon that is gone; True if there was any."""
    if running_pid(dev) is not None:
        return False
    found = False
    for p in (dev.pid_path, dev.sock_path):
        try:
            os.unlink(p)
            found = True
        except FileNotFoundError:
            pass
    return found


def _detach_netlink_xdp(ifindex: int) -> None:
    """A netlink-attached program (e.g. the lab's pass-through) blocks link attachment."""
    with IPRoute() as ipr:
        ipr.link("set", index=ifindex, xdp={"attrs": [("IFLA_XDP_FD", -1)]})


def parse_request(line: bytes) -> tuple[dict, str | None]:
    """A request line: the object, and the first NaN or ±Infinity in it (Python's json reads
    them, JSON has none; a NaN passes every range check and fails long after it was accepted,
    so a request carrying one is refused, by its id)."""
    constants: list[str] = []
    req = json.loads(line, parse_constant=lambda name: constants.append(name) or float(name))
    if not isinstance(req, dict):
        raise ValueError("a request is a JSON object")
    return req, (constants[0] if constants else None)


def _checked_wrs(wrs) -> list:
    """Work requests are objects whose wr_id fits 64 bits: it is stored in BPF maps when the
    request is sent (a READ's slot), long after the request was accepted."""
    wrs = list(wrs)
    for wr in wrs:
        if not isinstance(wr, dict):
            raise MetaroceError("a work request is a JSON object")
        if not 0 <= int(wr.get("wr_id", 0)) < 1 << 64:
            raise MetaroceError("wr_id must fit 64 bits (0 .. 2^64-1)")
    return wrs


class Daemon:
    """Load, attach and serve; `serve_forever` returns on SIGTERM/SIGINT."""

    def __init__(self, dev: DeviceId, mode: str = "roce", credits: CreditConfig | None = None):
        if mode not in ("roce", "metaroce"):
            raise MetaroceError("--mode must be roce or metaroce")
        if credits is not None:
            credits.validate()          # before anything is attached
        self.rx = self.link_fd = self.device = self.sock = None
        self._created: list[str] = []   # the files this daemon made (socket, pid file)
        try:
            self._start(dev, mode, credits)
        except BaseException:
            self.close()                # a failed start leaves nothing attached or behind
            raise

    def _start(self, dev: DeviceId, mode: str, credits: CreditConfig | None) -> None:
        self.dev, self.mode = dev, mode
        self.started = time.time()
        if dev.netns:                    # the daemon lives in its device's namespace
            _netns.setns(dev.netns)
        try:
            self.ifindex = socket.if_nametoindex(dev.dev)
        except OSError:
            raise MetaroceError(f"no interface {dev.dev}"
                                f"{' in ' + dev.netns if dev.netns else ''}") from None
        self.rx = RxPath()
        with IPRoute() as ipr:
            mtu = ipr.link("get", index=self.ifindex)[0].get_attr("IFLA_MTU")
        _detach_netlink_xdp(self.ifindex)
        self.xdp_mode, flags, self.xdp_why = libbpf.xdp_mode_for_mtu(mtu)
        self.link_fd = libbpf.xdp_link_create(self.rx.prog_fd, self.ifindex, flags)
        if credits is not None:
            if credits.link_rate_bps is None:
                credits.link_rate_bps = link_speed_bps(dev.dev) or 10e9
            credits.pmtu = min(4096, 1 << (max(256, mtu - 100).bit_length() - 1))
        self.device = Device(self.rx, self.ifindex, mode, credits)
        os.makedirs(RUN_DIR, exist_ok=True)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            os.unlink(dev.sock_path)
        except FileNotFoundError:
            pass
        self.sock.bind(dev.sock_path)
        self._created.append(dev.sock_path)
        os.chmod(dev.sock_path, 0o660)      # root and the socket's group may use the device
        self.sock.listen(16)
        self._created.append(dev.pid_path)
        with open(dev.pid_path, "w") as f:
            f.write(str(os.getpid()))
        self._stop = False
        self.persistent = Endpoints()
        self.raw_qps: dict[int, object] = {}     # QPN armed by set_qp -> the connection

    def status(self) -> dict:
        return {"dev": self.dev.dev, "netns": self.dev.netns, "pid": os.getpid(),
                "mode": self.mode, "xdp_mode": self.xdp_mode, "xdp_mode_reason": self.xdp_why,
                "uptime_s": round(time.time() - self.started, 3), "mrs": len(self.rx.mrs),
                "bpf_build": self.rx.build_info,
                "counters": self.rx.counters(), "events": self.rx.event_counters(),
                "port": self.rx.port_counters(),
                "destroyed_qp_counters": dict(self.device.destroyed_qp_counters),
                "tx": self.device.xsk.stats(),
                "credits": ({**self.device.credits.cfg.describe(), **self.device.credits.stats}
                            if self.device.credits else {"enabled": False}),
                "qps": [self.device.qp_stats(q) for q in self.device.qps.values()]}

    def _op(self, conn, req: dict) -> tuple[dict, list[int]]:
        """One request of connection conn; returns the reply and fds to pass. A request with
        "persistent": true acts for the daemon's own owner: what it creates outlives the
        connection (the `metaroce qp` endpoints) until it is destroyed explicitly."""
        d, op = self.device, req.get("op")
        if req.get("persistent"):
            conn = self.persistent
        if op == "status":
            return self.status(), []
        if op == "create_endpoint":
            return self.persistent.create(d, int(req.get("mr_bytes", 1 << 20)),
                                          int(req.get("access", 15)), dict(req.get("cap", {})))
        if op == "destroy_endpoint":
            self.persistent.destroy(d, int(req["qpn"]))
            return {"ok": True}, []
        if op == "list_endpoints":
            return {"endpoints": self.persistent.describe(d)}, []
        if op == "query_device":
            return {"limits": DEVICE_LIMITS, "mode": self.mode, "xdp_mode": self.xdp_mode,
                    "max_pmtu": d.max_pmtu(), "node_guid": f"{self.ifindex:016x}"}, []
        if op == "alloc_pd":
            return {"pd": d.alloc_pd(conn)}, []
        if op == "reg_mr":
            mr = d.reg_mr(conn, int(req["pd"]), int(req["length"]), int(req["access"]))
            return {"lkey": mr.rkey, "rkey": mr.rkey, "addr": mr.addr, "length": mr.length,
                    "map_bytes": len(mr._mm)}, [mr.fd]
        if op == "dereg_mr":
            d.dereg_mr(conn, int(req["key"]))
            return {"ok": True}, []
        if op == "create_cq":
            return {"cq": d.create_cq(conn, int(req.get("depth", 1024)))}, []
        if op == "create_qp":
            qp = d.create_qp(conn, int(req["pd"]), int(req["send_cq"]), int(req["recv_cq"]),
                             dict(req.get("cap", {})))
            return d.qp_attrs(qp), []
        if op == "connect_qp":
            qp = d.own_qp(conn, int(req["qpn"]))
            return d.connect_qp(qp, dict(req["remote"]), dict(req.get("attr", {}))), []
        if op == "query_qp":
            return d.qp_stats(d.own_qp(conn, int(req["qpn"]))), []
        if op == "destroy_qp":
            d.destroy_qp(conn, int(req["qpn"]))
            return {"ok": True}, []
        if op == "post_send":
            d.post_send(conn, int(req["qpn"]), _checked_wrs(req["wrs"]))
            return {"ok": True}, []
        if op == "post_recv":
            d.post_recv(conn, int(req["qpn"]), _checked_wrs(req["wrs"]))
            return {"ok": True}, []
        if op == "set_qp":           # raw receive state, for tools driving the wire directly
            qpn, pd = int(req["qpn"]), int(req["pd"])
            if not 0 < qpn <= 0xFFFFFF:
                raise MetaroceError("qpn must be 24-bit")
            if qpn in d.qps:         # never another application's QP (nor a verbs QP at all)
                raise MetaroceError(f"QP 0x{qpn:06x} belongs to a verbs QP")
            d._own_pd(conn, pd)      # and only into the caller's own protection domain
            if self.raw_qps.get(qpn, conn) is not conn:
                raise MetaroceError(f"QP 0x{qpn:06x} was armed by another connection")
            self.rx.del_qp(qpn)      # a fresh state: no receive slots of an earlier arming
            self.rx.set_qp(qpn, int(req["epsn"]), pd, int(req.get("dqpn", 0)),
                           pmtu=int(req.get("pmtu", 1024)),
                           metaroce=bool(req.get("metaroce", False)))
            self.raw_qps[qpn] = conn
            return {"ok": True}, []
        if op == "raw_qp_state":     # the kernel's state of a QP this connection armed
            qpn = int(req["qpn"])
            if self.raw_qps.get(qpn) is not conn:
                raise MetaroceError(f"QP 0x{qpn:06x} was not armed by this connection")
            return self.rx.qp_state(qpn), []
        return {"error": f"unknown op {op!r}"}, []

    def _handle(self, conn: socket.socket, line: bytes) -> None:
        fds: list[int] = []
        rid = None
        try:
            req, constant = parse_request(line)
            rid = req.get("id")
            if constant:
                raise MetaroceError(f"{constant} is not a number a request may carry")
            rep, fds = self._op(conn, req)
        except (ValueError, KeyError, TypeError, OverflowError, MetaroceError, OSError) as exc:
            rep = {"error": str(exc) or type(exc).__name__}
        except Exception as exc:  # noqa: BLE001 (one bad request must not stop the device)
            traceback.print_exc()             # to the device's log
            rep = {"error": f"request refused ({type(exc).__name__}): {exc}"[:500]}
        if rid is not None:
            rep = {**rep, "id": rid}
        self._send(conn, rep, fds)

    def _send(self, conn: socket.socket, msg: dict, fds: list[int] = ()) -> None:
        data = (json.dumps(msg) + "\n").encode()
        try:
            if fds:
                conn.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
            else:
                conn.sendall(data)
        except OSError:
            pass                     # the application went away; its close reclaims it

    def serve_forever(self) -> None:
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "_stop", True))
        signal.signal(signal.SIGINT, lambda *_: setattr(self, "_stop", True))
        sel = selectors.DefaultSelector()
        sel.register(self.sock, selectors.EVENT_READ, "listen")
        sel.register(self.device.c.mr_evring_fd(self.device.ring), selectors.EVENT_READ, "ring")
        buffers: dict[socket.socket, bytes] = {}
        dev = self.device
        busy = 0
        try:
            while not self._stop:
                if busy:
                    timeout = 0
                else:
                    dl = dev.next_deadline()
                    timeout = 0.5 if dl is None else min(0.5, max(0.0, dl - time.monotonic()))
                for key, _ in sel.select(timeout=timeout):
                    if key.data == "listen":
                        conn, _ = self.sock.accept()
                        sel.register(conn, selectors.EVENT_READ, "conn")
                        buffers[conn] = b""
                        continue
                    if key.data == "ring":
                        continue
                    conn = key.fileobj
                    try:
                        chunk = conn.recv(1 << 20)
                    except OSError:
                        chunk = b""
                    if not chunk:
                        sel.unregister(conn)
                        buffers.pop(conn, None)
                        dev.release(conn)
                        for qpn in [q for q, c in self.raw_qps.items() if c is conn]:
                            self.rx.del_qp(qpn)       # raw QPs go with their connection
                            del self.raw_qps[qpn]
                        conn.close()
                        continue
                    buffers[conn] += chunk
                    while b"\n" in buffers[conn]:
                        line, buffers[conn] = buffers[conn].split(b"\n", 1)
                        self._handle(conn, line)
                    if len(buffers[conn]) > 16 << 20:
                        self._send(conn, {"error": "request line too long"})
                        buffers[conn] = b""
                dev.on_events()
                dev.tick(time.monotonic())
                busy = dev.transmit()
                dev.on_events()
                for cq, wcs in dev.take_wcs():
                    if cq.owner is self.persistent:
                        self.persistent.completed(cq.handle, wcs)
                    else:
                        self._send(cq.owner, {"event": "wc", "cq": cq.handle, "wcs": wcs})
        finally:
            self.close()

    def close(self) -> None:
        """Detach and release everything; also what a start that failed half-way had made."""
        if self.link_fd is not None:
            os.close(self.link_fd)          # detaches the program
            self.link_fd = None
        if self.device is not None:
            self.device.close()
            self.device = None
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        for p in self._created:
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
        self._created = []
        try:                                # a clean stop keeps a log only if it says something
            if os.path.getsize(self.dev.log_path) == 0:
                os.unlink(self.dev.log_path)
        except OSError:
            pass
        if self.rx is not None:
            self.rx.close()
            self.rx = None


def request(dev: DeviceId, req: dict, timeout: float = 5.0) -> tuple[dict, list[int]]:
    """One request to a running daemon; returns its reply and any fds it passed. Every failure,
    an {"error": ...} reply included, is a MetaroceError with one clear line."""
    where, op = f"{dev.dev}{' in ' + dev.netns if dev.netns else ''}", req.get("op")
    try:
        line = (json.dumps(req, allow_nan=False) + "\n").encode()
    except ValueError:
        raise MetaroceError(f"{op}: a request cannot carry NaN or an infinity") from None
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    fds = array.array("i")
    rep = None
    try:
        try:
            s.connect(dev.sock_path)
        except (FileNotFoundError, ConnectionRefusedError):
            raise MetaroceError(f"no MetaRoCE device on {where} (start it: metaroce up "
                                f"--dev {dev.dev})") from None
        s.sendall(line)
        data = b""
        while not data.endswith(b"\n"):
            msg, anc, _flags, _addr = s.recvmsg(65536, socket.CMSG_SPACE(16 * fds.itemsize))
            if not msg:
                raise MetaroceError(f"the MetaRoCE daemon on {where} closed the connection "
                                    f"without answering {op}")
            data += msg
            for level, ctype, cdata in anc:
                if level == socket.SOL_SOCKET and ctype == socket.SCM_RIGHTS:
                    fds.frombytes(cdata[:len(cdata) - len(cdata) % fds.itemsize])
        rep = json.loads(data)
        if not isinstance(rep, dict):
            raise MetaroceError(f"the MetaRoCE daemon on {where} answered {op} with {rep!r}")
        if "error" in rep:
            raise MetaroceError(f"{op} on {where}: {rep['error']}")
    except TimeoutError:
        raise MetaroceError(f"the MetaRoCE daemon on {where} did not answer {op} "
                            f"within {timeout:g} s") from None
    except (OSError, ValueError) as exc:    # a refused connection, a reply that is not JSON
        raise MetaroceError(f"talking to the MetaRoCE daemon on {where}: {exc}") from None
    finally:
        s.close()
        if not isinstance(rep, dict) or "error" in rep:
            for fd in fds:                  # nobody will use what came with a failure
                os.close(fd)
    return rep, list(fds)


def start_background(dev: DeviceId, mode: str = "roce", credits: CreditConfig | None = None) -> dict:
    """Fork a daemon for dev, wait until it serves (or report why it could not), return its
    status."""
    pid = running_pid(dev)
    if pid:
        raise MetaroceError(f"a MetaRoCE daemon already runs on {dev.dev} (pid {pid}): "
                            f"metaroce down --dev {dev.dev}")
    clean_stale(dev)
    rfd, wfd = os.pipe()
    child = os.fork()
    if child == 0:                      # the daemon
        os.close(rfd)
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        os.makedirs(RUN_DIR, exist_ok=True)
        log = os.open(dev.log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.dup2(log, 2)                 # a crash's traceback lands in the device's log
        # inherit nothing else: a copy of the caller's descriptors (another device's MR maps,
        # sockets, BPF objects) would keep them alive as long as this daemon lives
        os.closerange(3, wfd)
        os.closerange(wfd + 1, 1 << 16)
        # and Python's own streams must be the new 0-2, not whatever the caller's were (a test
        # runner's capture files, closed just now)
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        try:
            dm = Daemon(dev, mode, credits)
        except BaseException as exc:  # noqa: BLE001 (reported to the parent, then exit)
            os.write(wfd, f"error: {exc}".encode())
            os._exit(1)
        os.write(wfd, b"ok")
        os.close(wfd)
        code = 0
        try:
            dm.serve_forever()
        except BaseException:  # noqa: BLE001 (the log keeps the traceback)
            traceback.print_exc()
            code = 1
        finally:
            sys.stderr.flush()
            os._exit(code)
    os.close(wfd)
    answer = os.read(rfd, 4096).decode() or "error: the daemon died while starting"
    os.close(rfd)
    if answer != "ok":
        os.waitpid(child, 0)
        raise MetaroceError(answer.removeprefix("error: "))
    try:
        return request(dev, {"op": "status"})[0]
    except BaseException as exc:        # serving, but not well: nothing may stay behind
        _reap(child)
        clean_stale(dev)
        if isinstance(exc, MetaroceError):
            raise MetaroceError(f"the daemon on {dev.dev} started but failed; it was stopped "
                                f"({exc})") from None
        raise


def _reap(child: int, timeout_s: float = 5.0) -> None:
    """Stop a daemon this process forked (SIGTERM, then SIGKILL) and wait for it: once it is
    gone its BPF link is closed, so its program is detached."""
    try:
        os.kill(child, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if os.waitpid(child, os.WNOHANG) != (0, 0):
            return
        time.sleep(0.02)
    os.kill(child, signal.SIGKILL)
    os.waitpid(child, 0)


def stop(dev: DeviceId, timeout_s: float = 5.0) -> dict:
    """Stop the daemon of dev (SIGTERM, then SIGKILL), or clean up after a dead one."""
    pid = running_pid(dev)
    if pid is None:
        if clean_stale(dev):
            return {"dev": dev.dev, "stopped": None, "cleaned_stale": True}
        raise MetaroceError(f"no MetaRoCE daemon runs on {dev.dev}")
    os.kill(pid, signal.SIGTERM)
    deadline = time.time() + timeout_s
    while running_pid(dev) is not None and time.time() < deadline:
        time.sleep(0.05)
    if running_pid(dev) is not None:
        os.kill(pid, signal.SIGKILL)
        clean_stale(dev)
    try:
        os.waitpid(pid, os.WNOHANG)     # reap it when it is our child
    except ChildProcessError:
        pass
    return {"dev": dev.dev, "stopped": pid, "cleaned_stale": False}
