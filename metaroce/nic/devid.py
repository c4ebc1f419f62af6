"""How a device is named: an interface in a network namespace, the namespace identified by
itself (the inode the kernel reports for /proc/thread-self/ns/net), not by the text of a name.

`ip netns exec`, `metaroce lab exec`, `--netns NAME`, containers and systemd units all reach the
same namespace in different ways; all of them find the same daemon through the namespace's
inode, and none of them can find another namespace's daemon. The daemon's files in
/run/metaroce/nic are named `net<inode>--<dev>.{sock,pid,log}`.

A namespace's inode can be reused once the namespace is freed, but a namespace stays alive as
long as a process runs in it: a daemon's pid file is trusted only while that pid runs in the
namespace the file names (`owner_in_netns`)."""

from __future__ import annotations

import ctypes
import os
import re
from dataclasses import dataclass, field

from ..errors import MetaroceError

RUN_DIR = os.environ.get("METAROCE_RUN_DIR", "/run/metaroce/nic")
NETNS_DIR = "/var/run/netns"          # where `ip netns` (and pyroute2, and the lab) name them
_TAG = re.compile(r"net(\d+)--(.+)")
CLONE_NEWNET = 0x40000000


def _libc():
    return ctypes.CDLL(None, use_errno=True)      # os.setns is Python 3.12+


def _inode(path: str) -> int:
    return os.stat(path).st_ino


def own_netns_inode() -> int:
    """The calling thread's network namespace (a thread may have entered another one)."""
    return _inode("/proc/thread-self/ns/net")


def netns_path(netns: str) -> str:
    """A namespace named as `ip netns` does, or given as a path (/proc/PID/ns/net, a bind
    mount of a container's namespace)."""
    return netns if "/" in netns else os.path.join(NETNS_DIR, netns)


def netns_inode(netns: str | None) -> int:
    if netns is None:
        return own_netns_inode()
    if not netns or netns in (".", ".."):
        raise MetaroceError(f"no network namespace {netns!r}")
    inode = netns_inode_or_none(netns)
    if inode is None:
        raise MetaroceError(f"no network namespace {netns!r}")
    return inode


def netns_inode_or_none(netns: str) -> int | None:
    try:
        return _inode(netns_path(netns))
    except OSError:
        return None


def netns_names(inode: int) -> list[str]:
    """The `ip netns` names bound to this namespace (none for the initial namespace, usually)."""
    try:
        entries = sorted(os.listdir(NETNS_DIR))
    except OSError:
        return []
    out = []
    for name in entries:
        try:
            if _inode(os.path.join(NETNS_DIR, name)) == inode:
                out.append(name)
        except OSError:
            continue
    return out


def process_netns_inode(pid: int) -> int | None:
    try:
        return _inode(f"/proc/{pid}/ns/net")
    except OSError:
        return None


@dataclass(frozen=True)
class DeviceId:
    """Interface `dev` in the namespace `netns` (an `ip netns` name or a path; None: the
    caller's own). Two DeviceIds are the same device when interface and namespace inode are."""
    dev: str
    netns: str | None = field(default=None, compare=False)
    inode: int = 0

    def __post_init__(self):
        if not self.dev or "/" in self.dev or len(self.dev) > 15:
            raise MetaroceError(f"--dev {self.dev!r}: not an interface name")
        if not self.inode:
            object.__setattr__(self, "inode", netns_inode(self.netns))

    @classmethod
    def from_tag(cls, tag: str) -> DeviceId:
        """The device a run-directory file is named after (`net<inode>--<dev>`)."""
        m = _TAG.fullmatch(tag)
        if not m:
            raise ValueError(f"not a device tag: {tag!r}")
        inode = int(m.group(1))
        names = netns_names(inode)
        return cls(m.group(2), names[0] if names else None, inode)

    @property
    def tag(self) -> str:
        return f"net{self.inode}--{self.dev}"

    @property
    def sock_path(self) -> str:
        return os.path.join(RUN_DIR, f"{self.tag}.sock")

    @property
    def pid_path(self) -> str:
        return os.path.join(RUN_DIR, f"{self.tag}.pid")

    @property
    def log_path(self) -> str:
        return os.path.join(RUN_DIR, f"{self.tag}.log")

    @property
    def restore_path(self) -> str:
        """What was attached to the interface before the daemon, to put back after it."""
        return os.path.join(RUN_DIR, f"{self.tag}.restore")

    @property
    def is_callers(self) -> bool:
        return self.inode == own_netns_inode()

    def netns_name(self) -> str | None:
        """A name of the namespace to show and to type (--netns), if it has one."""
        if self.netns and "/" not in self.netns and netns_inode_or_none(self.netns) == self.inode:
            return self.netns
        names = netns_names(self.inode)
        return names[0] if names else None

    def where(self) -> str:
        """`eth0`, or `eth0 in netns NAME` / `eth0 in net:[INODE]` when it is not the caller's."""
        if self.is_callers:
            return self.dev
        name = self.netns_name()
        return f"{self.dev} in netns {name}" if name else f"{self.dev} in net:[{self.inode}]"

    def args(self) -> str:
        """The options that name this device for a command run where the caller runs."""
        if self.is_callers:
            return f"--dev {self.dev}"
        name = self.netns_name()
        if name:
            return f"--dev {self.dev} --netns {name}"
        return f"--dev {self.dev} --netns /proc/<pid>/ns/net"

    def describe(self) -> dict:
        return {"dev": self.dev, "netns": self.netns_name(), "netns_inode": self.inode}


def enter(dev: DeviceId) -> None:
    """Move the calling thread into dev's namespace (never creating one: pyroute2's setns
    would create a missing named namespace)."""
    if dev.is_callers:
        return
    if dev.netns is None:
        raise MetaroceError(f"{dev.where()}: the namespace has no name or path to enter")
    fd = os.open(netns_path(dev.netns), os.O_RDONLY)
    try:
        if _libc().setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns {dev.netns}: {os.strerror(err)}")
    finally:
        os.close(fd)
    if own_netns_inode() != dev.inode:
        raise MetaroceError(f"namespace {dev.netns!r} changed while entering it")


def devices_in_run_dir(run_dir: str | None = None) -> list[DeviceId]:
    """Every device with a control socket in the run directory, whichever namespace it is in."""
    out = []
    try:
        names = sorted(os.listdir(run_dir or RUN_DIR))
    except OSError:
        return []
    for f in names:
        if f.endswith(".sock"):
            try:
                out.append(DeviceId.from_tag(f[:-len(".sock")]))
            except (ValueError, MetaroceError):
                continue
    return out
