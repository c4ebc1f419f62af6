"""The software RNIC daemon (`metaroce up`): owns the XDP NIC of one device in one network
namespace. The program is attached through a BPF link held by this process, so if the daemon
dies for any reason the kernel stops placing and acknowledging at once. Applications use it
through a local control socket for control verbs (JSON lines: requests with an "id" get a reply
with that id, carrying "fds": n when n descriptors travel with it by SCM_RIGHTS; async events
arrive as {"event": "async"} lines) and through shared memory for the data path: each QP's
send and receive rings and each CQ's completion ring are memfds handed to their owner, posted
to and polled without a system call (metaroce/nic/vrings.py). Memory regions travel to their
owner as map fds, so an application can map only the MRs it registered, and everything a
connection created is reclaimed when it closes."""

from __future__ import annotations

import array
import dataclasses
import faulthandler
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback

from pyroute2 import IPRoute

from ..errors import MetaroceError
from ..kern import libbpf

from . import xdpslot
from .clients import MAX_OUTPUT_BYTES, MAX_REQUEST_BYTES, Connection
from .ccconfig import CCConfig
from .credit import CreditConfig, link_speed_bps
from .devid import RUN_DIR, DeviceId, enter, process_netns_inode
from .device import DEVICE_LIMITS, INTEGRITY, Device
from .endpoints import Endpoints
from .rx import RxPath
from .steer import parse_rx_cpus



def running_pid(dev: DeviceId) -> int | None:
    """The daemon's pid, if its pid file names a live process in the device's namespace (a
    stale file's pid may have been reused by anything)."""
    try:
        pid = int(open(dev.pid_path).read().strip())
    except (OSError, ValueError):
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                return None                 # dead, not yet reaped by its parent
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    if process_netns_inode(pid) != dev.inode:
        return None
    return pid


def clean_stale(dev: DeviceId) -> bool:
    """Remove the pid file and socket of a daemon that is gone and put back the XDP program it
    had taken the interface's slot from; True if there was anything to clean."""
    if running_pid(dev) is not None:
        return False
    found = False
    if os.path.exists(dev.restore_path):
        found = True
        _in_netns_of(dev, xdpslot.put_back, dev.restore_path)
    for p in (dev.pid_path, dev.sock_path):
        try:
            os.unlink(p)
            found = True
        except FileNotFoundError:
            pass
    return found


def _in_netns_of(dev: DeviceId, fn, *args):
    """fn(*args) in a thread inside dev's namespace (the caller's own thread stays where it
    is); nothing is done when the namespace cannot be entered any more."""
    if dev.is_callers:
        return fn(*args)
    out: list = []

    def run():
        try:
            enter(dev)
        except (MetaroceError, OSError):
            return
        out.append(fn(*args))
    t = threading.Thread(target=run, name="metaroce-netns")
    t.start()
    t.join()
    return out[0] if out else None


# The control plane's loop wakes for requests, the data path's async events and the credit
# tick; otherwise at least this often (the daemon's own endpoints' completions are taken then)
IDLE_WAKE_S = 0.1


def parse_request(line: bytes) -> tuple[dict, str | None]:
    """A request line: the object, and the first NaN or ±Infinity in it (Python's json reads
    them, JSON has none; a NaN passes every range check and fails long after it was accepted,
    so a request carrying one is refused, by its id)."""
    constants: list[str] = []
    req = json.loads(line, parse_constant=lambda name: constants.append(name) or float(name))
    if not isinstance(req, dict):
        raise ValueError("a request is a JSON object")
    return req, (constants[0] if constants else None)


class Daemon:
    """Load, attach and serve; `serve_forever` returns on SIGTERM/SIGINT."""

    def __init__(self, dev: DeviceId, mode: str = "roce", credits: CreditConfig | None = None,
                 integrity: str = "icrc", cc: CCConfig | None = None, rx_cpus: str = "auto"):
        if mode not in ("roce", "metaroce"):
            raise MetaroceError("--mode must be roce or metaroce")
        if integrity not in INTEGRITY:
            raise MetaroceError(f"--integrity must be {' or '.join(INTEGRITY)}")
        self.integrity = integrity
        if credits is not None:
            credits.validate()          # before anything is attached
        self.cc = (cc if cc is not None else CCConfig()).validate()
        parse_rx_cpus(rx_cpus)              # a bad list is refused before anything is attached
        self.rx_cpus_spec = rx_cpus
        self.dev, self.mode = dev, mode
        self.rx = self.link_fd = self.device = self.sock = None
        self.took_slot = False          # a netlink-attached program was taken off (xdpslot)
        self._created: list[str] = []   # the files this daemon made (socket, pid file)
        try:
            self._start(dev, mode, credits)
        except BaseException:
            self.close()                # a failed start leaves nothing attached or behind
            raise

    def _start(self, dev: DeviceId, mode: str, credits: CreditConfig | None) -> None:
        self.started = time.time()
        enter(dev)                       # the daemon lives in its device's namespace
        try:
            self.ifindex = socket.if_nametoindex(dev.dev)
        except OSError:
            raise MetaroceError(f"no interface {dev.where()}") from None
        with IPRoute() as ipr:
            link = ipr.link("get", index=self.ifindex)[0]
            mtu = link.get_attr("IFLA_MTU")
            rx_queues = link.get_attr("IFLA_NUM_RX_QUEUES") or 1
        self.rx = RxPath(rx_cpus=parse_rx_cpus(self.rx_cpus_spec, rx_queues))
        if self.rx.steering:
            self.rx.steering.set_device(self.ifindex)   # where nic_rx_cpu's replies leave
        self.displaced = xdpslot.take_over(self.ifindex, dev.restore_path)
        self.took_slot = True
        self.xdp_mode, flags, self.xdp_why = libbpf.xdp_mode_for_mtu(mtu, frags=True)
        self.link_fd = libbpf.xdp_link_create(self.rx.prog_fd, self.ifindex, flags)
        speed = link_speed_bps(dev.dev) or 10e9     # unless --link-rate said otherwise
        if credits is not None:
            credits.link_rate_bps = credits.link_rate_bps or speed
        self.cc.link_rate_bps = self.cc.link_rate_bps or speed
        self.device = Device(self.rx, self.ifindex, mode, credits, self.integrity, self.cc)
        if credits is not None:
            # a share is bytes, counted in packets of each QP's own path MTU; this one (the
            # fitted MTU MetaRoCE connections take here, CM-14: 1344 bytes at MTU 1500) is the
            # BDP `status` shows and what a QP without one yet is counted in (a power of two,
            # 1024, made every 1344-byte QP's share 1.3 times the bytes it meant)
            credits.pmtu = self.device.max_pmtu(fitted=True)
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
        self.conns: set[Connection] = set()
        self.cut_off = 0                         # connections cut off for not reading

    def status(self) -> dict:
        return {**self.dev.describe(), "pid": os.getpid(),
                "mode": self.mode, "integrity": self.integrity, "xdp_mode": self.xdp_mode,
                "xdp_mode_reason": self.xdp_why, "uptime_s": round(time.time() - self.started, 3), "mrs": len(self.rx.mrs),
                "bpf_build": self.rx.build_info,
                "counters": self.rx.counters(), "events": self.rx.event_counters(),
                "port": self.rx.port_counters(),
                "destroyed_qp_counters": dict(self.device.destroyed_qp_counters),
                "tx": self.device.dp.xsk_stats(),
                "credits": ({**self.device.credits.cfg.describe(), **self.device.credits.stats,
                             "granted_qps": len(self.device.credits.granted),
                             "fresh_qps": len(self.device.credits.fresh)}
                            if self.device.credits else {"enabled": False}),
                "cc": self.cc.describe(),
                "rx_steering": self.rx.steering_status(),
                "clients": {"connected": len(self.conns), "cut_off": self.cut_off,
                            "max_output_bytes": MAX_OUTPUT_BYTES},
                "loop": self.device.dp.stats(),
                "cqs": [self.device.cq_describe(c) for c in self.device.cqs.values()
                        if c.owner is not self.persistent],
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
            return {"limits": DEVICE_LIMITS, "mode": self.mode, "integrity": self.integrity,
                    "credits": d.credits is not None, "xdp_mode": self.xdp_mode,
                    "max_pmtu": d.max_pmtu(), "max_fitted_pmtu": d.max_pmtu(fitted=True),
                    "max_fitted_pmtu_ipv4": d.max_pmtu(fitted=True, ipv6=False),
                    "node_guid": f"{self.ifindex:016x}"}, []
        if op == "alloc_pd":
            return {"pd": d.alloc_pd(conn)}, []
        if op == "reg_mr":
            mr = d.reg_mr(conn, int(req["pd"]), int(req["length"]), int(req["access"]))
            return {"lkey": mr.rkey, "rkey": mr.rkey, "addr": mr.addr, "length": mr.length,
                    "map_bytes": len(mr._mm)}, [mr.fd]
        if op == "dereg_mr":
            d.dereg_mr(conn, int(req["key"]))
            return {"ok": True}, []
        if op == "create_comp_channel":
            h, fd = d.create_comp_channel(conn)
            return {"channel": h}, [fd]
        if op == "destroy_comp_channel":
            d.destroy_comp_channel(conn, int(req["channel"]))
            return {"ok": True}, []
        if op == "create_cq":
            ch = req.get("channel")
            cq = d.create_cq(conn, int(req.get("cqe", 1024)), None if ch is None else int(ch),
                             shared=conn is not self.persistent)
            if cq.ring is None:
                return {"cq": cq.handle, "cqe": cq.cqe}, []
            return ({"cq": cq.handle, "cqe": cq.cqe, "ring": cq.ring.describe()},
                    [cq.ring.fd, d.channels[cq.channel][1]])
        if op == "destroy_cq":
            d.destroy_cq(conn, int(req["cq"]))
            return {"ok": True}, []
        if op == "create_qp":
            shared = conn is not self.persistent
            qp = d.create_qp(conn, int(req["pd"]), int(req["send_cq"]), int(req["recv_cq"]),
                             dict(req.get("cap", {})), shared=shared)
            if not shared:
                return d.qp_attrs(qp), []
            bell = d.doorbell(conn)
            return {**d.qp_attrs(qp), "rings": qp.rings.describe()}, [*qp.rings.fds, bell]
        if op == "connect_qp":
            qp = d.own_qp(conn, int(req["qpn"]))
            return d.connect_qp(qp, dict(req["remote"]), dict(req.get("attr", {}))), []
        if op == "query_qp":
            return d.qp_stats(d.own_qp(conn, int(req["qpn"]))), []
        if op == "destroy_qp":
            d.destroy_qp(conn, int(req["qpn"]))
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

    def _handle(self, conn: Connection, line: bytes) -> None:
        fds: list[int] = []
        rid = None
        try:
            req, constant = parse_request(line)
            rid = req.get("id")
            if constant:
                raise MetaroceError(f"{constant} is not a number a request may carry")
            rep, fds = self._op(conn, req)
            if fds:
                rep = {**rep, "fds": len(fds)}
        except (ValueError, KeyError, TypeError, OverflowError, MetaroceError, OSError) as exc:
            rep = {"error": str(exc) or type(exc).__name__}
        except Exception as exc:  # noqa: BLE001 (one bad request must not stop the device)
            traceback.print_exc()             # to the device's log
            rep = {"error": f"request refused ({type(exc).__name__}): {exc}"[:500]}
        if rid is not None:
            rep = {**rep, "id": rid}
        self._send(conn, rep, fds)

    def _send(self, conn: Connection, msg: dict, fds: list[int] = ()) -> None:
        """Never blocks: what the socket does not take now waits in the connection's bounded
        queue (flushed when the socket is writable); past the bound the connection is cut off."""
        if conn.closed:
            return
        try:
            if not conn.send((json.dumps(msg) + "\n").encode(), fds):
                self._drop(conn, f"cut off: more than {conn.out.limit >> 20} MiB of output "
                                 f"unread")
                return
        except OSError:
            self._drop(conn)            # the application went away
            return
        self._want_write(conn)

    def _want_write(self, conn: Connection) -> None:
        want = selectors.EVENT_READ | (selectors.EVENT_WRITE if len(conn.out) else 0)
        if self._sel.get_key(conn).events != want:
            self._sel.modify(conn, want, conn)

    def _accept(self) -> None:
        try:
            sock, _ = self.sock.accept()
        except OSError:
            return
        conn = Connection(sock)
        self._sel.register(conn, selectors.EVENT_READ, conn)
        self.conns.add(conn)

    def _read(self, conn: Connection) -> None:
        try:
            chunk = conn.sock.recv(1 << 20)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._drop(conn)
            return
        for line in conn.lines(chunk):
            if conn.closed:
                return
            self._handle(conn, line)
        if len(conn.inbuf) > MAX_REQUEST_BYTES:
            conn.inbuf = b""
            self._send(conn, {"error": "request line too long"})

    def _drop(self, conn: Connection, why: str | None = None) -> None:
        """The connection ends (the application closed it, or it is cut off): everything it
        created is reclaimed."""
        if conn.closed:
            return
        if why:
            self.cut_off += 1
            print(f"metaroce: application pid {conn.pid} {why}: its QPs, CQs and MRs are "
                  f"reclaimed", file=sys.stderr, flush=True)
        self._sel.unregister(conn)
        self.conns.discard(conn)
        self.device.release(conn)
        for qpn in [q for q, c in self.raw_qps.items() if c is conn]:
            self.rx.del_qp(qpn)       # raw QPs go with their connection
            del self.raw_qps[qpn]
        conn.close()

    def _deliver(self) -> None:
        """Async events to their owners (CQ overruns and the QPs they failed), and the daemon's
        own endpoints' completions (kept for `metaroce qp show`)."""
        dev = self.device
        for cq, wcs in dev.take_wcs():          # only the daemon's own CQs are ring-less
            self.persistent.completed(cq, wcs)
        for owner, ev in dev.take_async_events():
            if owner is self.persistent:
                continue                # its CQs are consumed at once: they never overrun
            if ev["type"] == "CQ_ERR":
                print(f"metaroce: CQ {ev['cq']} of application pid {owner.pid} overran "
                      f"(cqe {ev['cqe']}): the CQ and its QPs are in ERR",
                      file=sys.stderr, flush=True)
            self._send(owner, {"event": "async", **ev})

    def serve_forever(self) -> None:
        """The control plane's loop: requests, async events, the credit tick. The data path
        (posting, events, retransmission, completions) runs in its own thread meanwhile."""
        # a crash in C code leaves a Python traceback in the log too, and a daemon that does
        # not stop when asked leaves its threads' stacks there before it is killed (`stop`)
        faulthandler.enable()
        faulthandler.register(signal.SIGUSR1, all_threads=True)
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "_stop", True))
        signal.signal(signal.SIGINT, lambda *_: setattr(self, "_stop", True))
        sel = self._sel = selectors.DefaultSelector()
        self.sock.setblocking(False)         # nothing in the loop may block
        sel.register(self.sock, selectors.EVENT_READ, "listen")
        sel.register(self.device.dp.async_fd, selectors.EVENT_READ, "async")
        dev = self.device
        try:
            while not self._stop:
                now = time.monotonic()
                dl = dev.next_deadline()
                timeout = IDLE_WAKE_S if dl is None else min(IDLE_WAKE_S, max(0.0, dl - now))
                self._select(timeout)
                dev.tick(time.monotonic())
                self._deliver()
        finally:
            self.close()

    def _select(self, timeout: float) -> int:
        """Accept, read and write the control sockets that are ready (waiting up to timeout);
        returns how many were."""
        ready = self._sel.select(timeout=timeout)
        for key, mask in ready:
            if key.data == "listen":
                self._accept()
                continue
            if key.data == "async":
                continue                     # taken by _deliver
            conn = key.data
            if mask & selectors.EVENT_WRITE and not conn.closed:
                self._send_queued(conn)
            if mask & selectors.EVENT_READ and not conn.closed:
                self._read(conn)
        return len(ready)

    def _send_queued(self, conn: Connection) -> None:
        try:
            conn.out.flush(conn.sock)
        except OSError:
            self._drop(conn)
            return
        self._want_write(conn)

    def close(self) -> None:
        """Detach and release everything; also what a start that failed half-way had made."""
        if self.link_fd is not None:
            os.close(self.link_fd)          # detaches the program
            self.link_fd = None
        if self.took_slot:
            xdpslot.put_back(self.dev.restore_path)
            self.took_slot = False
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


def not_running(dev: DeviceId) -> str:
    return f"no MetaRoCE device on {dev.where()} (start it: metaroce up {dev.args()})"


def already_running(dev: DeviceId, pid: int) -> str:
    return (f"a MetaRoCE daemon already runs on {dev.where()} (pid {pid}): "
            f"metaroce down {dev.args()}")


def request(dev: DeviceId, req: dict, timeout: float = 5.0) -> tuple[dict, list[int]]:
    """One request to a running daemon; returns its reply and any fds it passed. Every failure,
    an {"error": ...} reply included, is a MetaroceError with one clear line."""
    where, op = dev.where(), req.get("op")
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
            raise MetaroceError(not_running(dev)) from None
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


def start_background(dev: DeviceId, mode: str = "roce", credits: CreditConfig | None = None,
                     integrity: str = "icrc", cc: CCConfig | None = None,
                     rx_cpus: str = "auto") -> dict:
    """Start a daemon for dev in a process of its own (a fresh interpreter: see
    daemon_proc.py for why never a bare fork), wait until it serves (or report why it could
    not), return its status."""
    if credits is not None:
        credits.validate()              # a NaN never reaches the daemon's command line
    if cc is not None:
        cc.validate()
    if integrity not in INTEGRITY:
        raise MetaroceError(f"--integrity must be {' or '.join(INTEGRITY)}")
    parse_rx_cpus(rx_cpus)              # a bad list is refused here, in one line
    pid = running_pid(dev)
    if pid:
        raise MetaroceError(already_running(dev, pid))
    clean_stale(dev)
    os.makedirs(RUN_DIR, exist_ok=True)
    rfd, wfd = os.pipe()
    cmd = [sys.executable, "-m", "metaroce.nic.daemon_proc", "--dev", dev.dev,
           "--netns-inode", str(dev.inode), "--mode", mode, "--integrity", integrity,
           "--rx-cpus", rx_cpus, "--ready-fd", str(wfd)]
    if dev.netns is not None:
        cmd += ["--netns", dev.netns]
    if credits is not None:
        cmd += ["--credits", json.dumps(dataclasses.asdict(credits))]
    if cc is not None:
        cmd += ["--cc", json.dumps(dataclasses.asdict(cc))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [_package_root()] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    try:
        with open(dev.log_path, "wb") as log:
            os.chmod(dev.log_path, 0o640)
            child = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=log, pass_fds=(wfd,), start_new_session=True,
                                     env=env, cwd="/")
    finally:
        os.close(wfd)
    with os.fdopen(rfd, "rb") as r:
        answer = r.read(4096).decode(errors="replace")
    if answer != "ok":
        child.wait()
        if not answer:
            answer = "error: the daemon died while starting: " + _last_line(dev.log_path)
        raise MetaroceError(answer.removeprefix("error: "))
    try:
        st = request(dev, {"op": "status"})[0]
    except BaseException as exc:        # serving, but not well: nothing may stay behind
        _stop_child(child)
        clean_stale(dev)
        if isinstance(exc, MetaroceError):
            raise MetaroceError(f"the daemon on {dev.where()} started but failed; it was "
                                f"stopped ({exc})") from None
        raise
    _children.append(child)                 # reaped by stop(), or when this process exits
    return st


def _stop_child(child: subprocess.Popen, timeout_s: float = 5.0) -> None:
    """Stop a daemon this process started (SIGTERM, then SIGKILL) and reap it: once it is gone
    its BPF link is closed, so its program is detached."""
    child.terminate()
    try:
        child.wait(timeout_s)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


_children: list[subprocess.Popen] = []


def _package_root() -> str:
    """The directory that holds this `metaroce` package (the daemon imports the same code)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _last_line(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            lines = [l.strip() for l in f if l.strip()]
    except OSError:
        lines = []
    return lines[-1] if lines else "(its log is empty)"


def stop(dev: DeviceId, timeout_s: float = 5.0) -> dict:
    """Stop the daemon of dev (SIGTERM, then SIGKILL), or clean up after a dead one."""
    pid = running_pid(dev)
    if pid is None:
        if clean_stale(dev):
            return {**dev.describe(), "stopped": None, "cleaned_stale": True}
        raise MetaroceError(f"no MetaRoCE daemon runs on {dev.where()}")
    os.kill(pid, signal.SIGTERM)
    deadline = time.time() + timeout_s
    while running_pid(dev) is not None and time.time() < deadline:
        time.sleep(0.05)
    if running_pid(dev) is not None:
        os.kill(pid, signal.SIGUSR1)        # its stacks to its log: where was it stuck?
        time.sleep(0.2)
        print(f"metaroce: the daemon of {dev.where()} (pid {pid}) did not stop within "
              f"{timeout_s:g} s of SIGTERM: killed; its stacks are in {dev.log_path}",
              file=sys.stderr, flush=True)
        os.kill(pid, signal.SIGKILL)
        deadline = time.time() + 5
        while running_pid(dev) is not None and time.time() < deadline:
            time.sleep(0.02)
    for c in [c for c in _children if c.pid == pid]:
        c.wait()                         # our child: reap it
        _children.remove(c)
    clean_stale(dev)                    # a daemon killed on the way out left its files
    return {**dev.describe(), "stopped": pid, "cleaned_stale": False}
