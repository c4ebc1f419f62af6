"""Devices under test. An adapter brings up (or describes) the DUT and hands the tester
endpoints: a QP connected to a tester QPN/PSN, and a memory region on it.

- ``reference``: our daemon (`metaroce up`) in host h2 of a lab pair it creates; the tester lives
  in h1. Endpoints are made as an application would (a verbs Context in h2's device), which also
  gives the tester the region's memory, receive posting, completions, counters and the DUT's
  requester (post_send) for checks beyond the wire.
- ``rxe``: Linux Soft-RoCE in a QEMU guest on a lab switch (metaroce/rxe); endpoints are pyverbs
  QPs made on demand in the guest, which also gives memory, receives, completions and requests.
- ``manual``: a JSON file describes endpoints any implementation prepared (the fields `metaroce
  qp create --json` prints) and the tester's side (netns, interface, address, and the QPN/PSN the
  endpoints were connected to). Only the wire is observed; memory is checked through the
  protocol (READ back what was written).
"""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
from dataclasses import dataclass, field

from ..errors import MetaroceError
from ..numbers import parse_uint
from .tester import Skip

ACCESS_LOCAL_WRITE, ACCESS_REMOTE_WRITE, ACCESS_REMOTE_READ, ACCESS_REMOTE_ATOMIC = 1, 2, 4, 8
ALL_ACCESS = 15


class AdapterError(MetaroceError):
    """The DUT could not be brought up or described: the suite cannot run (exit 2)."""
    exit_code = 2


@dataclass
class Endpoint:
    """One DUT QP + MR as the tester addresses it."""
    qpn: int
    psn: int                  # the DUT's first request PSN
    ip: str
    mac: str
    mtu: int
    rkey: int
    addr: int
    length: int
    mode: str
    access: int = ALL_ACCESS
    tester_qpn: int = 0       # the tester QPN the DUT QP is connected to
    tester_psn: int = 0       # the first PSN the DUT expects from the tester (its ePSN)
    window: int | None = None  # MetaRoCE receive window W (SACK-1), when known
    handle: object = None
    integrity: str = "icrc"   # the connection's end-to-end check: "icrc", or "csum" (INT-1)


@dataclass
class TesterSide:
    netns: str | None
    iface: str
    ip: str
    mac: str


class Adapter:
    name = "?"
    caps: frozenset = frozenset()     # memory, recv, post_send, counters, fresh, psn
    claims: tuple = ()                # the conformance profiles the DUT claims (spec PROF-1)
    dut_ip = ""

    def __init__(self, mode: str):
        self.mode = mode

    def open(self) -> TesterSide:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def endpoint(self, *, fresh: bool = False, access: int = ALL_ACCESS,
                 tester_psn: int | None = None) -> Endpoint:
        raise NotImplementedError

    def consumed(self, ep: Endpoint) -> None:
        """The endpoint's QP went to ERR: do not hand it out again."""

    def need(self, cap: str, why: str) -> None:
        if cap not in self.caps:
            raise Skip(f"the {self.name} adapter cannot {why}")

    # optional checks beyond the wire (reference only)
    def read_mem(self, ep: Endpoint, offset: int, length: int) -> bytes:
        raise Skip("no memory access")

    def write_mem(self, ep: Endpoint, offset: int, data: bytes) -> None:
        raise Skip("no memory access")

    def drops(self) -> dict:
        raise Skip("no counters")


# ---- reference ----------------------------------------------------------------------------

class ReferenceAdapter(Adapter):
    """Our daemon in h2 of a lab pair (created here, or an existing lab passed as ``lab``)."""

    name = "reference"
    caps = frozenset({"memory", "recv", "post_send", "counters", "fresh", "psn"})
    claims = ("compat", "base", "multipath", "csum")   # what its CM offers and accepts (12.4)

    def __init__(self, mode: str, lab: str | None = None, defines: dict | None = None,
                 mr_bytes: int = 1 << 20):
        super().__init__(mode)
        self.lab_name = lab
        self.own_lab = lab is None
        self.defines = dict(defines or {})
        self.mr_bytes = mr_bytes
        self.ctx = None
        self.dev = None
        self._eps: list = []
        self._shared: Endpoint | None = None
        if mode == "metaroce":      # its daemon accepts CSUM: connections may ask for it
            self.caps = self.caps | {"csum"}

    def open(self) -> TesterSide:
        from ..lab import core  # noqa: PLC0415
        from ..nic import daemon as d  # noqa: PLC0415
        from ..verbs import Context  # noqa: PLC0415
        try:
            if self.own_lab:
                self.lab_name = f"cf{os.getpid() % 1000}{secrets.token_hex(2)}"
                core.up(self.lab_name, "pair")
            view = core.LabView(self.lab_name)
            h1, h2 = view.plan.node("h1"), view.plan.node("h2")
            self.dut_ns = h2.netns
            self.dut_ip = h2.iface("eth0").ipv4.split("/")[0]
            self.dut_mac = h2.iface("eth0").mac
            side = TesterSide(h1.netns, "eth0", h1.iface("eth0").ipv4.split("/")[0],
                              h1.iface("eth0").mac)
            self.dev = d.DeviceId("eth0", self.dut_ns)
            old = os.environ.get("METAROCE_BPF_DEFINES")
            os.environ["METAROCE_BPF_DEFINES"] = ",".join(f"{k}={v}" for k, v in
                                                          self.defines.items())
            try:
                d.start_background(self.dev, self.mode, integrity="csum"
                                   if self.mode == "metaroce" else "icrc")
            finally:
                if old is None:
                    os.environ.pop("METAROCE_BPF_DEFINES", None)
                else:
                    os.environ["METAROCE_BPF_DEFINES"] = old
            self.ctx = Context("eth0", self.dut_ns)
        except Exception as exc:
            self.close()
            raise AdapterError(f"reference DUT: {exc}") from exc
        self.side = side
        return side

    def close(self) -> None:
        from ..lab import core  # noqa: PLC0415
        from ..nic import daemon as d  # noqa: PLC0415
        if self.ctx is not None:
            for objs in self._eps:
                for o in objs:
                    try:
                        o.close()
                    except Exception:  # noqa: BLE001
                        pass
            self._eps = []
            self.ctx.close()
            self.ctx = None
        if self.dev is not None:
            try:
                d.stop(self.dev)
            except Exception:  # noqa: BLE001
                d.clean_stale(self.dev)
            self.dev = None
        if self.own_lab and self.lab_name:
            try:
                core.down(self.lab_name)
            finally:
                self.lab_name = None

    def endpoint(self, *, fresh: bool = False, access: int = ALL_ACCESS,
                 tester_psn: int | None = None, integrity: str = "icrc") -> Endpoint:
        from ..verbs import CQ, MR, PD, QP, QPInitAttr  # noqa: PLC0415
        pd = PD(self.ctx)
        mr = MR(pd, self.mr_bytes, access)
        cq = CQ(self.ctx)
        qp = QP(pd, QPInitAttr(cq, cq))
        tqpn = secrets.randbelow((1 << 24) - 2) + 2
        tpsn = secrets.randbits(24) if tester_psn is None else tester_psn
        rep = qp.connect({"qpn": tqpn, "psn": tpsn, "ip": self.side.ip, "mtu": 1024,
                          "mode": self.mode, "integrity": integrity})
        # a scratch region for what the DUT's own requests read into
        local = MR(pd, 1 << 16, ALL_ACCESS)
        self._eps.append((local, mr, qp))
        return Endpoint(qpn=qp.qp_num, psn=qp.psn, ip=self.dut_ip, mac=self.dut_mac,
                        mtu=rep["mtu"], rkey=mr.rkey, addr=mr.addr, length=mr.length,
                        mode=rep["mode"], access=access, tester_qpn=tqpn, tester_psn=tpsn,
                        window=128 if rep["mode"] == "metaroce" else None,
                        handle={"qp": qp, "mr": mr, "cq": cq, "local": local},
                        integrity=rep.get("integrity", "icrc"))

    # beyond the wire
    def read_mem(self, ep, offset, length):
        return ep.handle["mr"].read(length, offset)

    def write_mem(self, ep, offset, data):
        ep.handle["mr"].write(data, offset)

    def drops(self) -> dict:
        c = self.ctx.status()["counters"]
        keep = ("malformed", "unknown_qp", "bad_opcode_seq", "unsupported_opcode", "bad_icrc",
                "wrong_source", "wrong_mode", "beyond_window", "psn_out_of_order", "qp_error",
                "bad_pkey", "bad_csum")
        return {k: c.get(k, 0) for k in keep}

    def qp_info(self, ep) -> dict:
        return ep.handle["qp"].query()

    def post_recv(self, ep, wr_id: int, offset: int, length: int) -> None:
        from ..verbs import RecvWR  # noqa: PLC0415
        ep.handle["qp"].post_recv(RecvWR(wr_id=wr_id, sg_list=[ep.handle["mr"].sge(offset, length)]))

    def completions(self, ep, n: int, timeout: float = 2.0) -> list:
        return ep.handle["cq"].wait(n, timeout)

    def poll(self, ep) -> list:
        return ep.handle["cq"].poll(64)

    def post_send(self, ep, wr) -> None:
        ep.handle["qp"].post_send(wr)


# ---- manual -------------------------------------------------------------------------------

DESCRIPTION_FIELDS = ("qpn", "psn", "ip", "mac", "mtu", "rkey", "addr", "length")


def _num(doc: dict, key: str, where: str, bits: int = 64) -> int:
    try:
        return parse_uint(doc.get(key), bits, key)
    except ValueError as exc:
        raise AdapterError(f"{where}: {exc}") from None


def load_description(path: str) -> tuple[dict, list[dict]]:
    """The tester section and the endpoint descriptions of a manual DUT file."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as exc:
        raise AdapterError(f"cannot read {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise AdapterError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("tester"), dict):
        raise AdapterError(f"{path}: expected an object with \"tester\" and \"endpoints\" "
                           f"(see docs/conformance/README.md)")
    eps = doc.get("endpoints")
    if eps is None:
        eps = [doc["dut"]] if isinstance(doc.get("dut"), dict) else None
    if not isinstance(eps, list) or not eps or not all(isinstance(e, dict) for e in eps):
        raise AdapterError(f"{path}: \"endpoints\" must be a non-empty list of QP descriptions")
    return doc["tester"], eps


def _iface_mac(netns: str | None, iface: str) -> str:
    """The interface's MAC from netlink in its namespace (sysfs shows the caller's namespace)."""
    from pyroute2 import IPRoute  # noqa: PLC0415
    try:
        ipr = IPRoute(netns=netns) if netns else IPRoute()
    except OSError as exc:
        raise AdapterError(f"tester network namespace {netns}: {exc.strerror or exc}") from None
    try:
        links = ipr.get_links(ifname=iface)
    except Exception:  # noqa: BLE001 (pyroute2 raises NetlinkError for an unknown name)
        links = []
    finally:
        ipr.close()
    if not links:
        where = f" in network namespace {netns}" if netns else ""
        raise AdapterError(f"tester interface {iface}: no such interface{where}")
    return links[0].get_attr("IFLA_ADDRESS")


class ManualAdapter(Adapter):
    """Endpoints prepared by hand (or by another implementation's tools), read from a file."""

    name = "manual"
    caps = frozenset()

    def __init__(self, mode: str, path: str):
        super().__init__(mode)
        self.path = path
        self.tester, docs = load_description(path)
        t, where = self.tester, f"{path}: tester"
        for k in ("ip", "qpn", "psn"):
            if k not in t:
                raise AdapterError(f"{where}: {k} is required")
        self.tqpn, self.tpsn = _num(t, "qpn", where, 24), _num(t, "psn", where, 24)
        try:
            self.tip = str(ipaddress.ip_address(str(t["ip"])))
        except ValueError:
            raise AdapterError(f"{where}: ip must be an IPv4 or IPv6 address") from None
        self.eps = []
        for i, e in enumerate(docs):
            w = f"{path}: endpoints[{i}]"
            missing = [k for k in DESCRIPTION_FIELDS if k not in e]
            if missing:
                raise AdapterError(f"{w}: missing {', '.join(missing)}")
            mode = str(e.get("mode", "roce"))
            if mode != self.mode:
                continue                   # an endpoint of the other mode is not this run's
            try:
                ip = str(ipaddress.ip_address(str(e["ip"])))
            except ValueError:
                raise AdapterError(f"{w}: ip must be an address") from None
            self.eps.append(Endpoint(
                qpn=_num(e, "qpn", w, 24), psn=_num(e, "psn", w, 24), ip=ip, mac=str(e["mac"]),
                mtu=_num(e, "mtu", w, 16), rkey=_num(e, "rkey", w, 32), addr=_num(e, "addr", w),
                length=_num(e, "length", w), mode=mode,
                access=_num(e, "access", w, 32) if "access" in e else ALL_ACCESS,
                tester_qpn=_num(e, "tester_qpn", w, 24) if "tester_qpn" in e else self.tqpn,
                tester_psn=_num(e, "tester_psn", w, 24) if "tester_psn" in e else self.tpsn,
                window=_num(e, "window", w, 32) if "window" in e else None))
        if not self.eps:
            raise AdapterError(f"{path}: no endpoint in {self.mode!r} mode")
        self.dut_ip = self.eps[0].ip
        self.used: set[int] = set()        # consumed (ERR) endpoints, by QPN
        self.current: Endpoint | None = None
        self.handed: set[int] = set()

    def open(self) -> TesterSide:
        t = self.tester
        mac = t.get("mac") or _iface_mac(t.get("netns"), str(t.get("iface", "eth0")))
        return TesterSide(t.get("netns"), str(t.get("iface", "eth0")), self.tip, mac)

    def _free(self, access: int | None):
        for e in self.eps:
            if e.qpn in self.used:
                continue
            if e.qpn in self.handed or (access is not None and e.access != access):
                continue
            self.handed.add(e.qpn)
            return e
        return None

    def endpoint(self, *, fresh: bool = False, access: int = ALL_ACCESS,
                 tester_psn: int | None = None) -> Endpoint:
        if tester_psn is not None:
            raise Skip("the tester's start PSN is fixed by the description")
        if access != ALL_ACCESS:
            e = self._free(access)
            if e is None:
                raise Skip(f"no unused endpoint with access {access} in the description")
            return e
        if fresh:
            for e in self.eps:
                if e.qpn not in self.used and e.qpn not in self.handed and \
                        e is not self.current and e.access == ALL_ACCESS:
                    self.handed.add(e.qpn)
                    return e
            raise Skip("no unused endpoint left (a test that drives a QP to ERR needs its "
                       "own; list more endpoints in the description)")
        if self.current is None or self.current.qpn in self.used:
            self.current = next((e for e in self.eps if e.qpn not in self.used
                                 and e.qpn not in self.handed and e.access == ALL_ACCESS), None)
            if self.current is None:
                raise Skip("no usable endpoint left in the description")
            self.handed.add(self.current.qpn)
        return self.current

    def consumed(self, ep: Endpoint) -> None:
        self.used.add(ep.qpn)


# ---- rxe ----------------------------------------------------------------------------------

class _GuestRegion:
    """The DUT's local buffer for its own requests (an rxe endpoint's local-only region), as
    the req tests use the reference's local MR: write() and sge() (offsets in the region)."""

    def __init__(self, rv, qpn: int, length: int):
        self.rv, self.qpn, self.length = rv, qpn, length

    def write(self, data: bytes, offset: int = 0) -> None:
        self.rv("write", qpn=self.qpn, offset=offset, data=data.hex(), local=True)

    def sge(self, offset: int = 0, length: int | None = None) -> list:
        return [offset, self.length - offset if length is None else length, 0]


@dataclass
class _Wc:
    wr_id: int
    status: int
    opcode: str
    byte_len: int = 0
    imm_data: int | None = None


class RxeAdapter(Adapter):
    """Linux Soft-RoCE (rdma_rxe, Debian's kernel and rdma-core) in a QEMU guest on the switch
    of a lab pair it creates (metaroce/rxe): the tester lives in h1. Endpoints are RC QPs
    created on demand with pyverbs in the guest and connected to a fresh tester QPN and PSN, so
    every test gets its own; the guest's verbs also give the tester the region's memory,
    receive posting, completions and the DUT's requester. rxe claims Compat-only."""

    name = "rxe"
    caps = frozenset({"memory", "recv", "post_send", "fresh", "psn"})
    claims = ("compat",)

    def __init__(self, mode: str, mr_bytes: int = 1 << 20, lab: str | None = None,
                 tester_host: str = "h1"):
        super().__init__(mode)
        if mode != "roce":
            raise AdapterError("rxe is a RoCEv2 device: it has compat mode only (--mode roce, "
                               "--profile compat)")
        self.mr_bytes = mr_bytes
        self.lab_name = lab               # an existing lab whose guest runs (kept afterwards)
        self.own_lab = lab is None
        self.tester_host = tester_host    # a host without a MetaRoCE daemon on its eth0
        self.guest = self.agent = self.rv = None

    def open(self) -> TesterSide:
        from ..lab import core  # noqa: PLC0415
        from ..rxe import guest  # noqa: PLC0415
        try:
            if self.own_lab:
                self.lab_name = f"cx{os.getpid() % 1000}{secrets.token_hex(2)}"
                core.up(self.lab_name, "pair")
            view = core.LabView(self.lab_name)
            h1 = view.plan.node(self.tester_host)
            self.guest = guest.up(self.lab_name) if self.own_lab else guest.load(self.lab_name)
            self.agent = guest.Agent(self.guest)
            self.agent.open()
            self.rv = guest.RxeVerbs(self.agent)
        except Exception as exc:
            self.close()
            raise AdapterError(f"rxe DUT: {exc}") from exc
        self.dut_ip = self.guest.ip
        self.side = TesterSide(h1.netns, "eth0", h1.iface("eth0").ipv4.split("/")[0],
                               h1.iface("eth0").mac)
        return self.side

    def close(self) -> None:
        from ..lab import core  # noqa: PLC0415
        from ..rxe import guest  # noqa: PLC0415
        if self.rv is not None:
            self.rv.close()
            self.rv = None
        if self.agent is not None:
            self.agent.close()
            self.agent = None
        if self.lab_name and self.own_lab:
            try:
                guest.down(self.lab_name)
            finally:
                core.down(self.lab_name)
                self.lab_name = None

    def endpoint(self, *, fresh: bool = False, access: int = ALL_ACCESS,
                 tester_psn: int | None = None) -> Endpoint:
        ep = self.rv("create", mr_bytes=self.mr_bytes, access=access, local_bytes=1 << 16)
        tqpn = secrets.randbelow((1 << 24) - 2) + 2
        tpsn = secrets.randbits(24) if tester_psn is None else tester_psn
        self.rv("connect", qpn=ep["qpn"], remote={"qpn": tqpn, "psn": tpsn, "ip": self.side.ip},
                mtu=1024)
        return Endpoint(qpn=ep["qpn"], psn=ep["psn"], ip=self.guest.ip, mac=self.guest.mac,
                        mtu=1024, rkey=ep["rkey"], addr=ep["addr"], length=ep["length"],
                        mode="roce", access=access, tester_qpn=tqpn, tester_psn=tpsn,
                        handle={"local": _GuestRegion(self.rv, ep["qpn"], 1 << 16)})

    def read_mem(self, ep, offset, length):
        return self.rv.read(ep.qpn, offset, length)

    def write_mem(self, ep, offset, data):
        self.rv.write(ep.qpn, offset, data)

    def post_recv(self, ep, wr_id: int, offset: int, length: int) -> None:
        self.rv("post_recv", qpn=ep.qpn, wr_id=wr_id, offset=offset, length=length)

    def completions(self, ep, n: int, timeout: float = 2.0) -> list:
        wcs = [_Wc(**w) for w in self.rv.poll(ep.qpn, n, timeout)]
        if len(wcs) < n:
            raise MetaroceError(f"no completion within {timeout} s ({len(wcs)} of {n})")
        return wcs

    def poll(self, ep) -> list:
        return [_Wc(**w) for w in self.rv.poll(ep.qpn, 64, 0)]

    def post_send(self, ep, wr) -> None:
        addr, length, _ = wr.sg_list[0] if wr.sg_list else (0, 0, 0)
        self.rv("post_send", qpn=ep.qpn, opcode=wr.opcode, wr_id=wr.wr_id, offset=addr,
                length=length, remote_addr=wr.remote_addr, rkey=wr.rkey,
                compare_add=wr.compare_add, swap=wr.swap, imm_data=wr.imm_data, local=True)
