"""The lab fabric programs (bpf/lab/fabric.bpf.c): compile once per lab, pin maps and
programs under /sys/fs/bpf/metaroce/<lab>/, attach to every link end (natively at every MTU:
the XDP programs are frags-aware), fill the XDP forwarding tables, and read or change their
state from any later process through the pins."""

from __future__ import annotations

import ctypes
import os
import shutil
import struct
from dataclasses import dataclass

from ..kern import libbpf
from ..kern.bcc_loader import build_program, load
from .netdev import ifindex, in_netns, ipr_in

PIN_ROOT = "/sys/fs/bpf/metaroce"
MAX_PORTS = 256
DIR_IN, DIR_OUT = 0, 1
IMPAIR_ENABLED, IMPAIR_ALL_TRAFFIC = 1 << 0, 1 << 1
TC_INGRESS, TC_EGRESS = 0xFFFFFFF2, 0xFFFFFFF3

PORT_SHAPED, PORT_STEER = 1 << 0, 1 << 1
MAX_CPUS = 64                     # bpf/lab/fabric_consts.h
CPU_QUEUE = 2048                  # frames a cpumap entry queues for its CPU
PROGRAMS = {  # pin name -> (function, type)
    "host_xdp": ("fabric_host_xdp", "xdp.frags"),
    "port_xdp": ("fabric_port_xdp", "xdp.frags"),
    "port_tc_in": ("fabric_port_tc_in", "sched_cls"),
    "port_tc_out": ("fabric_port_tc_out", "sched_cls"),
    "cpu_xdp": ("fabric_cpu_xdp", "xdp.cpumap"),
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
    "impair_seq": Layout("<Q", ("n",), False),
    "ecn_cfg": Layout("<2Q", ("rate_Bps", "threshold"), False),
    "port_cfg": Layout("<3I", ("domain", "flags", "cpus"), False),
}
FDB_KEY = struct.Struct("<I6sH")        # struct fdb_key: domain, mac, pad
FORWARDING_MAPS = ("fdb", "tx_ports", "cpus", "steer_stats")   # pinned too; written at `up`


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
        """Set a port direction's impairment and start its draw sequence over: the frames it
        considers from now on take draws 0, 1, 2, … of the seed (same seed, same traffic:
        same frames lost), on the XDP and the tc path alike."""
        slot = port * 2 + direction
        self.maps["impair_cfg"].update(slot, LAYOUTS["impair_cfg"].pack(**cfg))
        self.maps["impair_seq"].update(slot, LAYOUTS["impair_seq"].pack(n=0))

    def impair_seq(self, port: int, direction: int) -> int:
        """How many draws a port direction has taken since its impairment was last set."""
        return self._read("impair_seq", port * 2 + direction)["n"]

    def set_ecn(self, port: int, rate_bps: int, threshold: int) -> None:
        self.maps["ecn_cfg"].update(port, LAYOUTS["ecn_cfg"].pack(rate_Bps=rate_bps // 8,
                                                                  threshold=threshold))

    def set_port(self, port: int, domain: int, shaped: bool, cpus: int = 0) -> None:
        """A switch-side port's forwarding: its switch (0: never forwarded in XDP), shaping,
        and over how many CPUs the frames it forwards in XDP are handed on (cpus > 1: each to
        the CPU after the one it arrived on, PORT_STEER; 0 or 1: sent on where it arrived)."""
        flags = (PORT_SHAPED if shaped else 0) | (PORT_STEER if cpus > 1 else 0)
        self.maps["port_cfg"].update(port, LAYOUTS["port_cfg"].pack(
            domain=domain, flags=flags, cpus=cpus if cpus > 1 else 0))

    def steer_stats(self) -> dict:
        """Per CPU: frames its port programs handed to another CPU, and frames its cpumap
        program sent on to their port."""
        m = libbpf.PinnedMap(os.path.join(pin_dir(self.lab), "steer_stats"), 8, True)
        try:
            handed = [struct.unpack("<Q", v)[0] for v in m.lookup(0)]
            forwarded = [struct.unpack("<Q", v)[0] for v in m.lookup(1)]
        finally:
            m.close()
        return {"handed": handed, "forwarded": forwarded}

    def port_cfg(self, port: int) -> dict:
        return self._read("port_cfg", port)


def add_station(bpf, netns_name: str, domain: int, port: int, mac: str) -> None:
    """Let XDP forward frames for `mac` on switch `domain` to `port` (an interface of the
    switch's namespace, where the devmap entry must be made)."""
    key = FDB_KEY.pack(domain, bytes.fromhex(mac.replace(":", "")), 0)
    libbpf.map_update_raw(bpf[b"fdb"].map_fd, key, struct.pack("<I", port))
    with in_netns(netns_name):
        libbpf.map_update_raw(bpf[b"tx_ports"].map_fd, struct.pack("<I", port),
                              struct.pack("<I", port))


def load_and_pin(lab: str):
    """Build the fabric (compiled once per configuration, kern/progcache.py), load its programs,
    pin maps and programs. Returns the program object (it owns the fds: keep it until the
    programs are attached) and the program fds by pin name."""
    bpf = build_program("lab/fabric.bpf.c", {"MAX_PORTS": MAX_PORTS}, dict(PROGRAMS.values()))
    _check_layouts(bpf)
    d = pin_dir(lab)
    os.makedirs(d, exist_ok=True)
    for name in (*LAYOUTS, *FORWARDING_MAPS):
        libbpf.obj_pin(bpf[name.encode()].map_fd, os.path.join(d, name))
    fds = {}
    for pin, (func, kind) in PROGRAMS.items():
        fn = load(bpf, func, kind)
        libbpf.obj_pin(fn.fd, os.path.join(d, pin))
        fds[pin] = fn.fd
    for cpu in steer_cpus():         # each CPU's queue runs fabric_cpu_xdp (PORT_STEER)
        libbpf.map_update_raw(bpf[b"cpus"].map_fd, struct.pack("<I", cpu),
                              struct.pack("<Ii", CPU_QUEUE, fds["cpu_xdp"]))
    return bpf, fds


def steer_cpus() -> list[int]:
    """The CPUs a switch hands frames over to: those this process may run on, 0 .. n - 1
    contiguous from 0 (port_cfg.cpus is a count), at most MAX_CPUS."""
    mine = os.sched_getaffinity(0)
    n = 0
    while n < MAX_CPUS and n in mine:
        n += 1
    return list(range(n))


def unpin(lab: str) -> bool:
    d = pin_dir(lab)
    if os.path.isdir(d):
        shutil.rmtree(d, ignore_errors=True)
        return True
    return False


def attach_xdp(netns_name: str, iface: str, prog_fd: int, mtu: int | None = None) -> str:
    """Attach by netlink on a host end, where a MetaRoCE daemon can take the slot for its own
    NIC program and put the lab's back. A frags-aware program (mtu None: the lab's own)
    attaches natively at every MTU; for another program, pass the MTU: natively while a frame
    fits one page, else in generic mode (libbpf.xdp_mode_for_mtu). Returns the mode."""
    mode, flags = "native", libbpf.XDP_FLAGS_DRV_MODE
    if mtu is not None:
        mode, flags, _why = libbpf.xdp_mode_for_mtu(mtu)
    with ipr_in(netns_name) as ipr:
        idx = ifindex(ipr, iface)
        ipr.link("set", index=idx, xdp={"attrs": [("IFLA_XDP_FD", prog_fd), ("IFLA_XDP_FLAGS", flags)]})
    return mode


def link_pin(lab: str, node: str, iface: str) -> str:
    return os.path.join(pin_dir(lab), f"link-{node}-{iface}")


def attach_xdp_link(lab: str, node: str, netns_name: str, iface: str, prog_fd: int) -> str:
    """A switch-side port: attach natively through a BPF link, pinned with the lab's maps, so
    that nothing replaces or detaches it by netlink while the lab is up (`lab down` unpins)."""
    with ipr_in(netns_name) as ipr:
        idx = ifindex(ipr, iface)
    with in_netns(netns_name):            # the link's ifindex is resolved in this namespace
        fd = libbpf.xdp_link_create(prog_fd, idx, libbpf.XDP_FLAGS_DRV_MODE)
    try:
        libbpf.obj_pin(fd, link_pin(lab, node, iface))
    finally:
        os.close(fd)
    return "native"


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
