"""Receive steering (issue 21 item 3): the NIC program runs for each QP on one CPU of the
daemon's choosing, whatever CPU or queue the QP's frames arrive on.

On the device sits `nic_steer` (bpf/nic/nic.bpf.c): it reads a RoCE frame's destination QP
and hands the frame through a cpumap entry (`rx_cpus`) to the QP's CPU (`rx_qp_cpu`), where
`nic_rx_cpu` — the NIC program built as a cpumap program — checks, places and answers it; its
replies leave by redirect through the one-entry devmap `tx_port` (a cpumap program cannot
XDP_TX). Per-QP state in the kernel is then touched by one CPU only, correct by construction
with no lock, and the receive work of a QP moves off the CPU that sent it the frame (on veth,
the sender's). Frames of no known QP go to the default CPU, which counts them as it would.

The daemon chooses at set_qp (choose_cpu). `metaroce up --rx-cpus auto` (the default) steers on
devices with several receive queues, where it is what keeps a QP's state on one CPU."""

from __future__ import annotations

import os
import struct

from ..errors import MetaroceError
from ..kern import libbpf

MAX_CPUS = 64                    # bpf/nic/nic_consts.h
CPU_QUEUE = 8192                 # frames a cpumap entry queues for its CPU
DEFAULT_KEY = 0xFFFFFFFF         # STEER_DEFAULT_KEY: the CPU of frames of no known QP
_U32 = struct.Struct("=I")


def parse_rx_cpus(text: str, rx_queues: int = 1) -> list[int] | None:
    """`metaroce up --rx-cpus`: the CPUs to steer over, or None (no steering).
     - 'auto': 'all' on a device with several receive queues (RSS, or a veth's queue per
       sending CPU, can hand one QP's frames to two CPUs at once: steering keeps its state on
       one), else off (one queue is one NAPI context: one CPU at a time already);
     - 'all': the CPUs this process may run on, when there are two or more;
     - 'off'; or a list such as '1' or '0,2-3'."""
    t = text.strip().lower()
    if t == "off":
        return None
    mine = sorted(os.sched_getaffinity(0))
    if t in ("all", "auto"):
        cpus = [c for c in mine if c < MAX_CPUS]
        return cpus if len(cpus) > 1 and (t == "all" or rx_queues > 1) else None
    cpus: set[int] = set()
    try:
        for part in filter(None, (p.strip() for p in t.split(","))):
            lo, dash, hi = part.partition("-")
            a, b = int(lo), int(hi) if dash else int(lo)
            if a > b:
                raise ValueError
            cpus.update(range(a, b + 1))
    except ValueError:
        raise MetaroceError(f"--rx-cpus must be auto, all, off or a CPU list like 1 or 0,2-3, not "
                            f"{text!r}") from None
    bad = sorted(c for c in cpus if c not in mine or c >= MAX_CPUS)
    if not cpus or bad:
        raise MetaroceError(f"--rx-cpus {text!r}: CPU {bad[0] if bad else '?'} is not one this "
                            f"process may run on ({_ranges(mine)})")
    return sorted(cpus)


def _ranges(cpus: list[int]) -> str:
    out, i = [], 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        out.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(out)


def choose_cpu(load: dict[int, int]) -> int:
    """The CPU with the fewest QPs; of equals the highest-numbered (interrupts and
    housekeeping tend to land on CPU 0)."""
    return min(load, key=lambda c: (load[c], -c))


class RxSteering:
    """The steering maps of one loaded NIC program: rx_cpus filled with nic_rx_cpu for each
    CPU, tx_port with the device, rx_qp_cpu with a CPU per QP."""

    def __init__(self, bpf, cpu_prog_fd: int, cpus: list[int]):
        self.cpus = list(cpus)
        self._qp_fd = bpf[b"rx_qp_cpu"].map_fd
        self._tx_fd = bpf[b"tx_port"].map_fd
        cpumap = bpf[b"rx_cpus"].map_fd
        for cpu in self.cpus:        # struct bpf_cpumap_val: queue size, program fd
            libbpf.map_update_raw(cpumap, _U32.pack(cpu), struct.pack("=Ii", CPU_QUEUE,
                                                                     cpu_prog_fd))
        self.qp_cpu: dict[int, int] = {}
        self.load = {c: 0 for c in self.cpus}
        libbpf.map_update_raw(self._qp_fd, _U32.pack(DEFAULT_KEY), _U32.pack(self.cpus[0]))

    def set_device(self, ifindex: int) -> None:
        """Where replies leave: the device (resolved in the caller's network namespace)."""
        libbpf.map_update_raw(self._tx_fd, _U32.pack(0), _U32.pack(ifindex))

    def assign(self, qpn: int) -> int:
        """The QP's CPU (chosen once; the same on every later call until release)."""
        cpu = self.qp_cpu.get(qpn)
        if cpu is None:
            cpu = choose_cpu(self.load)
            libbpf.map_update_raw(self._qp_fd, _U32.pack(qpn), _U32.pack(cpu))
            self.qp_cpu[qpn] = cpu
            self.load[cpu] += 1
        return cpu

    def release(self, qpn: int, in_kernel: bool = True) -> None:
        cpu = self.qp_cpu.pop(qpn, None)
        if cpu is None:
            return
        self.load[cpu] -= 1
        if in_kernel:
            libbpf.map_delete_raw(self._qp_fd, _U32.pack(qpn), missing_ok=True)

    def describe(self) -> dict:
        return {"cpus": self.cpus, "qps_per_cpu": {str(c): n for c, n in self.load.items()},
                "cpu_queue": CPU_QUEUE}
