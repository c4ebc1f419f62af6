"""Run the rxe guest: a QEMU virtual machine (KVM when /dev/kvm works, TCG otherwise) whose NIC is
a tap port on a lab switch's bridge, so that lab hosts reach it at layer 2 and the lab's
impairment applies between them. The guest creates ``rxe0`` (Linux Soft-RoCE) on its eth0.

The host talks to the guest's agent (``guestfs/agent.py``) over a virtio-serial port exposed as
a UNIX socket; one client at a time (a lock file serialises them). A guest is named after its
lab: one rxe peer per lab, recorded in /run/metaroce/rxe/<lab>.json.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import ipaddress
import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import MetaroceError
from . import image

RUN_DIR = Path("/run/metaroce/rxe")
PORT_NAME = "metaroce.agent"
BOOT_TIMEOUT_S = 180.0
GUEST_HOST_NUM = 200            # the guest's address in the lab's subnet: .200
KVM_PROBE_S = 10.0
KVM_CPU = "host,-arch-capabilities"   # KVM refuses the host's IA32_ARCH_CAPABILITIES MSR here


class GuestError(MetaroceError):
    """The guest cannot be started, reached or stopped."""


class GuestSetupError(GuestError):
    """The guest booted but could not set up eth0 or rxe0."""


def _log(msg: str) -> None:
    from ..cli.output import log  # noqa: PLC0415
    log(msg)


@dataclass
class Guest:
    lab: str
    netns: str              # the switch's namespace, where the tap and QEMU live
    bridge: str
    tap: str
    ip: str                 # the guest's IPv4 address (no prefix)
    prefix: int
    mac: str
    gid: str                # rxe0's RoCEv2 GID (index 1), "::ffff:a.b.c.d"
    gid_index: int
    pid: int
    accel: str              # kvm | tcg
    image: str              # the cached image's key
    hosts: dict             # lab host -> {"ip", "mac", "netns"} given a neighbour entry
    boot_seconds: float = 0.0

    @property
    def agent_path(self) -> Path:
        return RUN_DIR / f"{self.lab}.agent"

    @property
    def log_path(self) -> Path:
        return RUN_DIR / f"{self.lab}.console.log"

    def to_dict(self) -> dict:
        return {**asdict(self), "agent": str(self.agent_path), "console": str(self.log_path)}


def record_path(lab: str) -> Path:
    return RUN_DIR / f"{lab}.json"


def load(lab: str) -> Guest:
    try:
        d = json.loads(record_path(lab).read_text())
    except FileNotFoundError:
        raise GuestError(f"no rxe guest on lab {lab!r} (metaroce rxe up --lab {lab})") from None
    d.pop("agent", None)
    d.pop("console", None)
    return Guest(**d)


def running() -> list[str]:
    return sorted(p.stem for p in RUN_DIR.glob("*.json")) if RUN_DIR.is_dir() else []


def kvm_usable(kernel: Path) -> bool:
    """KVM when /dev/kvm opens read-write and a guest kernel actually runs under it: booted
    without a root file system it must reach its panic within KVM_PROBE_S (nested KVM that
    hangs in early boot exists: this machine's does). The answer is remembered per boot."""
    try:
        fd = os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False
    os.close(fd)
    memo = RUN_DIR / "kvm-probe.memo"
    try:
        return bool(json.loads(memo.read_text())["kvm"])
    except (OSError, ValueError, KeyError):
        pass
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    log = RUN_DIR / "kvm-probe.log"
    log.unlink(missing_ok=True)
    try:
        subprocess.run(["qemu-system-x86_64", "-accel", "kvm", "-cpu", KVM_CPU, "-m", "256",
                        "-display", "none", "-nodefaults", "-no-reboot", "-kernel", str(kernel),
                        "-append", "console=ttyS0 panic=-1", "-serial", f"file:{log}"],
                       capture_output=True, timeout=KVM_PROBE_S)
    except subprocess.TimeoutExpired:
        pass
    except FileNotFoundError:
        raise GuestError("qemu-system-x86_64 not found (make rxe-setup installs it)") from None
    try:
        ok = "Kernel panic" in log.read_text(errors="replace")
    except OSError:
        ok = False
    memo.write_text(json.dumps({"kvm": ok}))
    return ok


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"qemu-system" in f.read()
    except OSError:
        return False


def _mac_for(lab: str) -> str:
    h = hashlib.sha256(f"rxe:{lab}".encode()).digest()
    return "52:54:00:" + ":".join(f"{b:02x}" for b in h[:3])


def _initrd(img_dir: Path) -> Path:
    """This checkout's guest files (an uncompressed cpio archive) followed by the cached image
    (Linux unpacks concatenated archives; an uncompressed one must come first)."""
    ov = image.overlay()
    path = img_dir / f"initrd-{hashlib.sha256(ov).hexdigest()[:12]}.img"
    if not path.exists():
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        with open(tmp, "wb") as out, open(img_dir / "rootfs.cpio.gz", "rb") as base:
            out.write(ov)
            while chunk := base.read(1 << 20):
                out.write(chunk)
        tmp.rename(path)
        for old in img_dir.glob("initrd-*.img"):
            if old != path and time.time() - old.stat().st_mtime > 600:
                old.unlink(missing_ok=True)
    return path


def up(lab: str, switch: str | None = None, mem_mib: int = 1024, accel: str | None = None,
       timeout: float = BOOT_TIMEOUT_S) -> Guest:
    """Build (or take from the cache) the image and boot the guest on the lab's switch."""
    from ..lab import core  # noqa: PLC0415
    from ..system import require_root  # noqa: PLC0415
    require_root("metaroce rxe up")
    if record_path(lab).exists():
        g = load(lab)
        if _alive(g.pid):
            raise GuestError(f"lab {lab!r} already has an rxe guest (pid {g.pid}); "
                             f"metaroce rxe down --lab {lab}")
        _teardown(g)
    view = core.LabView(lab)
    plan = view.plan
    sw = plan.node(switch) if switch else next((n for n in plan.nodes if n.bridges), None)
    if sw is None or not sw.bridges:
        raise GuestError(f"lab {lab!r} has no switch with a bridge to attach the guest to")
    br = sw.bridges[0]
    hosts = [n for n in plan.hosts if _same_l2(n, sw)]
    if not hosts:
        raise GuestError(f"no lab host is on {sw.name}'s bridge")
    net = ipaddress.ip_interface(hosts[0].iface("eth0").ipv4).network
    ip = str(net.network_address + GUEST_HOST_NUM)
    man = image.build()
    img = Path(man["dir"])
    accel = accel or ("kvm" if kvm_usable(img / "vmlinuz") else "tcg")
    initrd = _initrd(img)
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    g = Guest(lab=lab, netns=sw.netns, bridge=br.name, tap=f"rxe{os.getpid() % 100000}"[:15],
              ip=ip, prefix=net.prefixlen, mac=_mac_for(lab), gid="", gid_index=1, pid=0,
              accel=accel, image=man["key"],
              hosts={h.name: {"ip": h.iface("eth0").ipv4.split("/")[0], "mac": h.iface("eth0").mac,
                              "netns": h.netns} for h in hosts})
    t0 = time.monotonic()
    try:
        _add_tap(g, plan.mtu)
        _add_neighbours(g)
        g.pid = _start_qemu(g, img / "vmlinuz", initrd, mem_mib, plan.mtu)
        record_path(lab).write_text(json.dumps(g.to_dict(), indent=1))
        _wait_ready(g, timeout)
    except BaseException:
        _teardown(g)
        raise
    g.boot_seconds = round(time.monotonic() - t0, 1)
    record_path(lab).write_text(json.dumps(g.to_dict(), indent=1))
    _log(f"rxe guest on lab {lab}: {g.ip} ({g.mac}), rxe0 GID {g.gid}, {accel}, "
         f"booted in {g.boot_seconds} s")
    return g


def _same_l2(host, sw) -> bool:
    """The host's link ends on a port of the switch's bridge (switch ports are named after the
    node at their other end)."""
    return any(i.name == host.name and i.bridge for i in sw.ifaces)


def _add_tap(g: Guest, mtu: int) -> None:
    from ..lab import netdev  # noqa: PLC0415
    with netdev.ipr_in(g.netns) as ipr:
        ipr.link("add", ifname=g.tap, kind="tuntap", mode="tap")
        idx = netdev.ifindex(ipr, g.tap)
        ipr.link("set", index=idx, mtu=mtu, master=netdev.ifindex(ipr, g.bridge))
        ipr.link("set", index=idx, state="up")


def _add_neighbours(g: Guest) -> None:
    from ..lab import netdev  # noqa: PLC0415
    for h in g.hosts.values():
        with netdev.ipr_in(h["netns"]) as ipr:
            ipr.neigh("replace", dst=g.ip, lladdr=g.mac, ifindex=netdev.ifindex(ipr, "eth0"),
                      state=netdev.NUD_PERMANENT)


def _start_qemu(g: Guest, kernel: Path, initrd: Path, mem_mib: int, mtu: int) -> int:
    exe = "qemu-system-x86_64"
    neigh = ",".join(f"{h['ip']}@{h['mac']}" for h in g.hosts.values())
    append = (f"console=ttyS0 panic=-1 quiet mr.ip={g.ip}/{g.prefix} mr.mtu={mtu} "
              f"mr.neigh={neigh}")
    pidfile = RUN_DIR / f"{g.lab}.pid"
    pidfile.unlink(missing_ok=True)
    g.agent_path.unlink(missing_ok=True)
    cpu = ["-accel", "kvm", "-cpu", KVM_CPU] if g.accel == "kvm" else ["-accel", "tcg", "-cpu", "max"]
    argv = ["ip", "netns", "exec", g.netns, exe, *cpu, "-m", str(mem_mib), "-smp", "1",
            "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
            "-kernel", str(kernel), "-initrd", str(initrd), "-append", append,
            "-serial", f"file:{g.log_path}",
            "-netdev", f"tap,id=n0,ifname={g.tap},script=no,downscript=no",
            "-device", f"virtio-net-pci,netdev=n0,mac={g.mac}",
            "-device", "virtio-serial-pci",
            "-chardev", f"socket,id=agent,path={g.agent_path},server=on,wait=off",
            "-device", f"virtserialport,chardev=agent,name={PORT_NAME}",
            "-pidfile", str(pidfile), "-daemonize"]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise GuestError("qemu-system-x86_64 not found (make rxe-setup installs it)") from None
    if r.returncode != 0:
        raise GuestError(f"qemu failed to start: {r.stderr.strip()[-500:]}")
    return int(pidfile.read_text().strip())


def _wait_ready(g: Guest, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if not _alive(g.pid):
            raise GuestError(f"the guest exited during boot; console: {_tail(g.log_path)}")
        try:
            with Agent(g, connect_timeout=2.0) as a:
                a.request({"op": "ping"}, timeout=5.0)
                st = a.exec(["cat", "/run/metaroce-guest.status"])["out"].strip()
                if st.startswith("failed"):
                    raise GuestSetupError(f"guest setup {st}; console: {_tail(g.log_path)}")
                gid = a.exec(["cat", "/sys/class/infiniband/rxe0/ports/1/gids/1",
                              "/sys/class/infiniband/rxe0/ports/1/gid_attrs/types/1"])
                lines = gid["out"].split("\n")
                if gid["rc"] == 0 and lines[1].strip() == "RoCE v2":
                    g.gid = _gid_text(lines[0].strip())
                    return
                last = gid["err"] or gid["out"]
        except GuestSetupError:
            raise
        except (OSError, GuestError) as exc:
            last = str(exc)
        time.sleep(0.5)
    raise GuestError(f"the guest's rxe0 was not ready within {timeout:.0f} s ({last}); console: "
                     f"{_tail(g.log_path)}")


def _gid_text(raw: str) -> str:
    a = ipaddress.IPv6Address(bytes.fromhex(raw.replace(":", "")))
    return f"::ffff:{a.ipv4_mapped}" if a.ipv4_mapped else str(a)


def _tail(path: Path, n: int = 400) -> str:
    try:
        return path.read_text(errors="replace")[-n:].replace("\n", " | ")
    except OSError:
        return "(no console log)"


def down(lab: str) -> bool:
    """Stop the lab's guest and remove its tap and neighbour entries. False if none ran."""
    try:
        g = load(lab)
    except GuestError:
        return False
    _teardown(g)
    return True


def _teardown(g: Guest) -> None:
    from ..lab import netdev  # noqa: PLC0415
    if g.pid and _alive(g.pid):
        os.kill(g.pid, signal.SIGTERM)
        for _ in range(50):
            if not _alive(g.pid):
                break
            time.sleep(0.1)
        else:
            os.kill(g.pid, signal.SIGKILL)
    for h in g.hosts.values():
        try:
            with netdev.ipr_in(h["netns"]) as ipr:
                ipr.neigh("del", dst=g.ip, lladdr=g.mac, ifindex=netdev.ifindex(ipr, "eth0"))
        except Exception:  # noqa: BLE001 (the lab may be gone already)
            pass
    try:
        with netdev.ipr_in(g.netns) as ipr:
            idx = ipr.link_lookup(ifname=g.tap)
            if idx:
                ipr.link("del", index=idx[0])
    except Exception:  # noqa: BLE001
        pass
    for p in (record_path(g.lab), g.agent_path, RUN_DIR / f"{g.lab}.pid",
              RUN_DIR / f"{g.lab}.lock", g.log_path):
        p.unlink(missing_ok=True)


class Agent:
    """A connection to the guest's agent: JSON requests and replies, one at a time."""

    def __init__(self, g: Guest, connect_timeout: float = 10.0):
        self.g = g
        self.connect_timeout = connect_timeout
        self.sock = None
        self.lock = None
        self.seq = 0
        self.buf = b""

    def __enter__(self) -> "Agent":
        self.open()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def open(self) -> None:
        RUN_DIR.mkdir(parents=True, exist_ok=True)
        self.lock = open(RUN_DIR / f"{self.g.lab}.lock", "w")
        deadline = time.monotonic() + self.connect_timeout
        while True:
            try:
                fcntl.flock(self.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    self.lock.close()
                    raise GuestError(f"the rxe guest of lab {self.g.lab} is busy with another "
                                     f"client") from None
                time.sleep(0.05)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(str(self.g.agent_path))
        except OSError:
            s.close()
            self.lock.close()
            raise
        self.sock = s

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.lock is not None:
            self.lock.close()
            self.lock = None

    def request(self, req: dict, timeout: float = 60.0) -> dict:
        self.seq += 1
        req = {**req, "seq": self.seq}
        self.sock.settimeout(timeout)
        self.sock.sendall((json.dumps(req) + "\n").encode())
        deadline = time.monotonic() + timeout
        while True:
            while b"\n" in self.buf:
                line, self.buf = self.buf.split(b"\n", 1)
                rep = json.loads(line)
                if rep.get("seq") == self.seq:
                    return rep
            left = deadline - time.monotonic()
            if left <= 0:
                raise GuestError(f"the guest's agent did not answer {req['op']} in {timeout} s")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(1 << 16)
            except socket.timeout:
                continue
            if not chunk:
                raise GuestError("the guest's agent closed the connection")
            self.buf += chunk

    def exec(self, argv, timeout: float = 60.0, input: str | None = None) -> dict:
        rep = self.request({"op": "exec", "argv": list(argv), "timeout": timeout,
                            "input": input}, timeout=timeout + 10)
        if "error" in rep:
            raise GuestError(rep["error"])
        return rep

    def put(self, path: str, data: bytes, mode: int = 0o644) -> None:
        rep = self.request({"op": "put", "path": path, "mode": mode,
                            "data": base64.b64encode(data).decode()})
        if "error" in rep:
            raise GuestError(rep["error"])

    def spawn(self, pid: str, argv) -> None:
        rep = self.request({"op": "spawn", "id": pid, "argv": list(argv)})
        if "error" in rep:
            raise GuestError(rep["error"])

    def call(self, pid: str, line: str | None, timeout: float = 30.0) -> str | None:
        req = {"op": "call", "id": pid, "timeout": timeout}
        if line is not None:
            req["line"] = line
        rep = self.request(req, timeout=timeout + 10)
        if "error" in rep:
            raise GuestError(f"{rep['error']} {rep.get('err', '')}".strip())
        return rep["line"]

    def wait(self, pid: str, timeout: float = 0.0) -> dict:
        return self.request({"op": "wait", "id": pid, "timeout": timeout}, timeout=timeout + 10)

    def kill(self, pid: str) -> dict:
        return self.request({"op": "kill", "id": pid}, timeout=15)


class RxeVerbs:
    """Verbs on the guest's rxe0 (``guestfs/rxe_verbs.py``, pyverbs) through the agent: create
    endpoints, connect them, post work requests, poll completions, read and write regions."""

    def __init__(self, agent: Agent, name: str = "verbs"):
        self.agent, self.name = agent, name
        agent.spawn(name, ["python3", "/opt/metaroce/rxe_verbs.py"])
        ready = json.loads(agent.call(name, None, timeout=60) or "{}")
        if not ready.get("ready"):
            raise GuestError(f"rxe_verbs did not start: {ready}")

    def __call__(self, op: str, wait_s: float = 30.0, **req) -> dict:
        line = self.agent.call(self.name, json.dumps({"op": op, **req}), timeout=wait_s)
        if line is None:
            raise GuestError(f"rxe_verbs: no answer to {op} in {wait_s} s")
        rep = json.loads(line)
        if "error" in rep:
            raise GuestError(f"rxe_verbs {op}: {rep['error']}")
        return rep

    def poll(self, qpn: int, n: int = 1, timeout: float = 10.0) -> list:
        return self("poll", wait_s=timeout + 10, qpn=qpn, n=n, timeout=timeout)["wcs"]

    def read(self, qpn: int, offset: int, length: int) -> bytes:
        return bytes.fromhex(self("read", qpn=qpn, offset=offset, length=length)["data"])

    def write(self, qpn: int, offset: int, data: bytes) -> None:
        self("write", qpn=qpn, offset=offset, data=data.hex())

    def close(self) -> None:
        try:
            self.agent.kill(self.name)
        except (GuestError, OSError):
            pass
