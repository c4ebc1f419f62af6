"""The processes of a lab: everything running in one of its network namespaces, found by the
namespace's inode (a process started by `lab exec`, `ip netns exec`, a `metaroce up` daemon,
an application), and how `lab down` ends them."""

from __future__ import annotations

import os
import signal
import time

from ..nic.devid import netns_inode_or_none, process_netns_inode


def namespace_inodes(netns_names: list[str]) -> set[int]:
    return {i for i in (netns_inode_or_none(n) for n in netns_names) if i is not None}


def pids_in(inodes: set[int]) -> list[int]:
    """Live processes (not zombies) whose network namespace is one of inodes, except this one."""
    out = []
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        if process_netns_inode(pid) not in inodes:
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    continue
        except (OSError, IndexError):
            continue
        out.append(pid)
    return sorted(out)


def end_all(inodes: set[int], grace_s: float = 3.0) -> list[int]:
    """SIGTERM every process in the namespaces, SIGKILL what is left after grace_s; returns
    the pids that were running. Threads of this process that entered a namespace are not
    processes and are left alone."""
    found = pids_in(inodes)
    for pid in found:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while pids_in(inodes) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in pids_in(inodes):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 5
    while pids_in(inodes) and time.monotonic() < deadline:
        time.sleep(0.02)
    for pid in found:                      # reap the ones that were our children
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
    return found
