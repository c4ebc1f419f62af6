"""The lab fabric programs (bpf/lab/fabric.bpf.c): compile once per lab, pin maps and
programs under /sys/fs/bpf/metaroce/<lab>/, attach to every link end, and read or change their
state from any later process through the pins."""

from __future__ import annotations

import ctypes
import os
import shutil
import struct
from dataclasses import dataclass

from ..kern import libbpf
from ..kern.bcc_loader import build_program, load
from .netdev import ifindex, ipr_in

PIN_ROOT = "/sys/fs/bpf/metaroce"
MAX_PORTS = 256
DIR_IN, DIR_OUT = 0, 1
IMPAIR_ENABLED, IMPAIR_ALL_TRAFFIC = 1 << 0, 1 << 1
TC_INGRESS, TC_EGRESS = 0xFFFFFFF2, 0xFFFFFFF3

PROGRAMS = {  # pin name -> (function, type)
    "host_xdp": ("fabric_host_xdp", "xdp"),
    "port_xdp": ("fabric_port_xdp", "xdp"),
    "port_tc_in": ("fabric_port_tc_in", "sched_cls"),
    "port_tc_out": ("fabric_port_tc_out", "sched_cls"),
}


@dataclass(frozen=True)
class Layout:
    """A map value as Python sees it; checked against BCC's view of the C struct at load."""
    fmt: str
    fields: tuple[str, ...]
    percpu: bool

    @property
    def size(self) -> int:
        return struct.calcsize(self.fmt)

    def unpack(self, raw: bytes) -> dict:
        return dict(zip(self.fields, struct.unpack(self.fmt, raw)))

    def pack(self, **values) -> bytes:
        return struct.pack(self.fmt, *(values.get(f, 0) for f in self.fields))


LAYOUTS = {
    "port_stats": Layout("<6Q", ("rx_packets", "rx_bytes", "tx_packets", "tx_bytes",
                                 "ecn_marked", "ecn_not_ect"), True),
    "impair_cfg": Layout("<6IQ", ("flags", "loss", "dup", "reorder", "reorder_depth", "pad",
                                  "seed"), False),
    "impair_stats": Layout("<5Q", ("matched", "lost", "duplicated", "reordered", "stash_busy"), True),
    "ecn_cfg": Layout("<2Q", ("rate_Bps", "threshold"), False),
}


def pin_dir(lab: str) -> str:
    return os.path.join(PIN_ROOT, lab)


def _check_layouts(bpf) -> None:
    for name, lay in LAYOUTS.items():
        leaf = bpf[name.encode()].Leaf
        leaf = getattr(leaf, "_type_", leaf)      # per-CPU maps: an array of the struct
        names = tuple(f[0] for f in leaf._fields_)
        if ctypes.sizeof(leaf) != lay.size or names != lay.fields:
            raise RuntimeError(f"map {name}: C layout {names}/{ctypes.sizeof(leaf)} B differs from "
                               f"Python {lay.fields}/{lay.size} B")


class Fabric:
    """Handle on a lab's pinned fabric maps (open from any process after `load_and_pin`)."""

    def __init__(self, lab: str):
        self.lab = lab
        self.maps = {name: libbpf.PinnedMap(os.path.join(pin_dir(lab), name), lay.size, lay.percpu)
                     for name, lay in LAYOUTS.items()}

    def close(self):
        for m in self.maps.values():
            m.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _read(self, name: str, key: int) -> dict:
        lay = LAYOUTS[name]
        per_cpu = [lay.unpack(v) for v in self.maps[name].lookup(key)]
        return {f: sum(d[f] for d in per_cpu) for f in lay.fields} if lay.percpu else per_cpu[0]

    def port_stats(self, port: int) -> dict:
        return self._read("port_stats", port)

    def impair_stats(self, port: int, direction: int) -> dict:
        return self._read("impair_stats", port * 2 + direction)

    def impair_cfg(self, port: int, direction: int) -> dict:
        return self._read("impair_cfg", port * 2 + direction)

    def set_impair(self, port: int, direction: int, **cfg) -> None:
        self.maps["impair_cfg"].update(port * 2 + direction, LAYOUTS["impair_cfg"].pack(**cfg))

    def set_ecn(self, port: int, rate_bps: int, threshold: int) -> None:
        self.maps["ecn_cfg"].update(port, LAYOUTS["ecn_cfg"].pack(rate_Bps=rate_bps // 8,
                                                                  threshold=threshold))


def load_and_pin(lab: str):
    """Build the fabric (compiled once per configuration, kern/progcache.py), load its programs,
    pin maps and programs. Returns the program object (it owns the fds: keep it until the
    programs are attached) and the program fds by pin name."""
    bpf = build_program("lab/fabric.bpf.c", {"MAX_PORTS": MAX_PORTS}, dict(PROGRAMS.values()))
    _check_layouts(bpf)
    d = pin_dir(lab)
    os.makedirs(d, exist_ok=True)
    for name in LAYOUTS:
        libbpf.obj_pin(bpf[name.encode()].map_fd, os.path.join(d, name))
    fds = {}
    for pin, (func, kind) in PROGRAMS.items():
        fn = load(bpf, func, kind)
        libbpf.obj_pin(fn.fd, os.path.join(d, pin))
        fds[pin] = fn.fd
    return bpf, fds


def unpin(lab: str) -> bool:
    d = pin_dir(lab)
    if os.path.isdir(d):
        shutil.rmtree(d, ignore_errors=True)
        return True
    return False


def attach_xdp(netns_name: str, iface: str, prog_fd: int, mtu: int) -> str:
    """Attach natively when the frame fits one page (veth limit for programs that are not
    frags-aware, ~3.5 KB), else in generic mode. Returns 'native' or 'generic'."""
    mode, flags, _why = libbpf.xdp_mode_for_mtu(mtu)
    with ipr_in(netns_name) as ipr:
        idx = ifindex(ipr, iface)
        ipr.link("set", index=idx, xdp={"attrs": [("IFLA_XDP_FD", prog_fd), ("IFLA_XDP_FLAGS", flags)]})
    return mode


def attach_tc(netns_name: str, iface: str, in_fd: int, out_fd: int) -> None:
    with ipr_in(netns_name) as ipr:
        idx = ifindex(ipr, iface)
        ipr.tc("add", "clsact", index=idx)
        ipr.tc("add-filter", "bpf", index=idx, handle=1, fd=in_fd, name="fabric_port_tc_in",
               parent=TC_INGRESS, classid=1, direct_action=True)
        ipr.tc("add-filter", "bpf", index=idx, handle=1, fd=out_fd, name="fabric_port_tc_out",
               parent=TC_EGRESS, classid=1, direct_action=True)


def xdp_attached(netns_name: str, iface: str) -> dict | None:
    """{'mode': 'native'|'generic', 'prog_id': N} for the program on an interface, or None."""
    with ipr_in(netns_name) as ipr:
        link = ipr.link("get", index=ifindex(ipr, iface))[0]
        xdp = link.get_attr("IFLA_XDP")
        if not xdp:
            return None
        attached = xdp.get_attr("IFLA_XDP_ATTACHED") or 0
        if not attached:
            return None
        modes = {1: "native", 2: "generic", 3: "offload", "xdp": "native", "drv": "native",
                 "skb": "generic", "generic": "generic", "hw": "offload"}
        return {"mode": modes.get(attached, str(attached)),
                "prog_id": xdp.get_attr("IFLA_XDP_PROG_ID")}
