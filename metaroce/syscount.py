"""Count a process's system calls by number: a BCC program on the sys_enter raw tracepoint (no
tracefs, no ptrace: the process runs at full speed). What the verbs' data path costs an
application in system calls (tools/bench/post_syscalls.py, tests/integration/test_shm_verbs.py)."""

from __future__ import annotations

from .system import import_bcc

# x86_64 numbers of the calls worth naming here (anything else is reported by number)
NAMES = {0: "read", 1: "write", 7: "poll", 23: "select", 24: "sched_yield", 35: "nanosleep",
         44: "sendto", 45: "recvfrom", 46: "sendmsg", 47: "recvmsg", 202: "futex",
         228: "clock_gettime", 230: "clock_nanosleep", 232: "epoll_wait", 270: "pselect6",
         271: "ppoll", 281: "epoll_pwait", 441: "epoll_pwait2"}
SOCKET = frozenset({"sendto", "recvfrom", "sendmsg", "recvmsg"})
WAITS = frozenset({"poll", "select", "pselect6", "ppoll", "epoll_wait", "epoll_pwait",
                   "epoll_pwait2"})
_PROGRAM = r"""
BPF_HASH(counts, u32, u64, 512);
RAW_TRACEPOINT_PROBE(sys_enter) {
    if ((bpf_get_current_pid_tgid() >> 32) != TGID)
        return 0;
    u32 id = ctx->args[1];
    counts.increment(id);
    return 0;
}
"""


class SyscallCounter:
    """Counts the system calls of every thread of process tgid from clear() on."""

    def __init__(self, tgid: int):
        self._bpf = import_bcc().BPF(text=_PROGRAM.replace("TGID", str(int(tgid))).encode())
        self._counts = self._bpf[b"counts"]

    def clear(self) -> None:
        self._counts.clear()

    def by_name(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for k, v in self._counts.items():
            name = NAMES.get(k.value, f"syscall_{k.value}")
            out[name] = out.get(name, 0) + v.value
        return out

    def close(self) -> None:
        self._bpf.cleanup()
