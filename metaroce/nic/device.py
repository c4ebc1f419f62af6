"""The resource table of one device, inside the daemon: protection domains, memory regions,
completion channels, CQs and RC QPs of every application, and what creating, connecting and
destroying them asks of the kernel (the XDP program's maps, metaroce/nic/rx.py) and of the data
path thread (the transport engine on the wire, metaroce/nic/datapath.py). Work requests,
events, retransmissions and completions never pass through here: the data path thread takes
them from and writes them to shared memory itself."""

from __future__ import annotations

import ipaddress
import os
import secrets
import time

from ..errors import MetaroceError
from ..fastpath.xsk import _lib
from ..wire.consts import FITTED_MTU_MAX, FITTED_MTU_MIN, FITTED_MTU_UNIT, path_mtu_ok
from . import neigh
from .cq import MAX_CQE, Cq, checked_cqe, ring_entries
from .ccconfig import CCConfig
from .credit import CreditConfig, CreditGranter
from .datapath import RD_DEPTH, DataPath
from .qpstats import qp_stats
from .rx import ACCESS_LOCAL_WRITE, ACCESS_REMOTE_ATOMIC, QP_COUNTERS, RQ_DEPTH, MemoryRegion, RxPath
from .vrings import CqRing, QpRings, new_eventfd
from .wqe import MAX_MSG

PSN_MASK = 0xFFFFFF
MAX_INLINE = 256         # max_inline_data
MAX_SGE = 16             # max_sge
MAX_PATHS = 8            # MetaRoCE entropy values a QP sprays over (MP-1)
WINDOW_PKTS = 1024       # request packets in flight per QP (compat: the go-back-N window)
MR_WINDOW_PKTS = 127     # MetaRoCE: the responder records PSNs up to ePSN + 127 (SACK-1)
MAX_EXT = 48             # the longest extension headers a packet carries (PETH + AtomicETH)
MAX_PAYLOAD_EXT = 40     # ... and a packet that carries payload (PETH + RETH + ImmDt)
# the end-to-end checks a device may accept for its MetaRoCE connections, strongest first (spec
# 5.7): the RoCEv2 ICRC always; the IPv4 header and UDP checksums in its place only when both
# devices accept them (INT-1: the strongest check both ends offer is the connection's)
INTEGRITY = ("icrc", "csum")
INT_ICRC, INT_CSUM = 0, 1    # nic_qp.integrity (bpf/nic/nic_consts.h)
ROCE_MTUS = (256, 512, 1024, 2048, 4096)


def largest_pmtu(link_mtu: int, frame_cap: int) -> int:
    """The largest RoCE MTU whose packets (IPv6, UDP, BTH, the longest extension headers, pad,
    ICRC) fit an IP packet of link_mtu bytes and, with their Ethernet header, a frame of
    frame_cap bytes (the AF_XDP socket's largest: 4096 in one UMEM chunk, 8192 in two with
    XDP_USE_SG). 256 at the least."""
    return max([m for m in ROCE_MTUS if m <= _room(link_mtu, frame_cap)] or [ROCE_MTUS[0]])


def _room(link_mtu: int, frame_cap: int) -> int:
    return min(link_mtu, frame_cap - 14) - 40 - 8 - 12 - MAX_EXT - 3 - 4


def largest_fitted_pmtu(link_mtu: int, frame_cap: int, ipv6: bool = True) -> int:
    """CM-14: the largest fitted path MTU a MetaRoCE connection over IPv6 (or IPv4) may use on
    this device: a multiple of 64 bytes, 256 .. 8192, such that a packet carrying that much
    payload (its IP header, UDP, BTH, the longest extension headers a payload packet carries,
    no pad: the payload is a multiple of 4, ICRC) fits an IP packet of link_mtu bytes and, with
    its Ethernet header, a frame of frame_cap bytes. At a link MTU of 1500, where the IB enum
    gives 1024: 1408 over IPv4, 1344 over IPv6; at 9000 with two-chunk AF_XDP frames, where it
    gives 4096: 8064 over either (the frame binds)."""
    room = (min(link_mtu, frame_cap - 14) - (40 if ipv6 else 20) - 8 - 12 - MAX_PAYLOAD_EXT
            - 4) // FITTED_MTU_UNIT * FITTED_MTU_UNIT
    return max(FITTED_MTU_MIN, min(FITTED_MTU_MAX, room))


DEVICE_LIMITS = {"max_qp": 4096, "max_mr": 4096, "max_cq": 65536, "max_pd": 65536,
                 "max_cqe": MAX_CQE, "max_qp_wr": 4096, "max_sge": MAX_SGE, "max_qp_rd_atom": RD_DEPTH,
                 "max_qp_init_rd_atom": RD_DEPTH, "max_mr_size": 1 << 34,
                 "max_msg_sz": MAX_MSG, "max_srq": 0, "atomic_cap": "ATOMIC_HCA",
                 "max_recv_wr": RQ_DEPTH, "max_paths": MAX_PATHS, "max_inline_data": MAX_INLINE}


def timeout_s(code: int) -> float | None:
    """Local ACK timeout 4.096 us * 2^code (RESP-8); 0 = infinite."""
    return None if code == 0 else 4.096e-6 * (1 << code)


def _cap(cap: dict, name: str, default: int, lo: int, hi: int) -> int:
    try:
        v = int(cap.get(name, default))
    except (TypeError, ValueError):
        raise MetaroceError(f"{name} must be a number") from None
    if not lo <= v <= hi:
        raise MetaroceError(f"{name} must be {lo} .. {hi}, not {v}")
    return v


def _attr(attr: dict, name: str, default: int, lo: int, hi: int) -> int:
    try:
        v = int(attr.get(name, default))
    except (TypeError, ValueError):
        raise MetaroceError(f"{name} must be a number") from None
    if not lo <= v <= hi:
        raise MetaroceError(f"{name} must be {lo} .. {hi}, not {v}")
    return v


class Qp:
    """What the control plane knows of a QP; its transport state lives in the data path."""

    def __init__(self, qpn: int, owner, pd: int, send_cq: Cq, recv_cq: Cq, cap: dict):
        self.qpn, self.owner, self.pd = qpn, owner, pd
        self.send_cq, self.recv_cq = send_cq, recv_cq
        self.max_send_wr = _cap(cap, "max_send_wr", 1024, 1, DEVICE_LIMITS["max_qp_wr"])
        self.max_recv_wr = min(_cap(cap, "max_recv_wr", RQ_DEPTH, 0, 1 << 20), RQ_DEPTH)
        self.max_send_sge = _cap(cap, "max_send_sge", MAX_SGE, 0, MAX_SGE)
        self.max_recv_sge = min(_cap(cap, "max_recv_sge", 1, 0, MAX_SGE), 1)   # receives take one
        self.max_inline = _cap(cap, "max_inline_data", MAX_INLINE, 0, MAX_INLINE)
        self.rings: QpRings | None = None       # the owner's shared send and receive queues
        self.state = "INIT"
        self.sq_psn = secrets.randbits(24)      # unpredictable initial PSN (SEC)
        self.remote: dict = {}
        self.pmtu = 1024
        self.metaroce = False
        self.paths = 1
        self.integrity = "icrc"


class Device:
    """PDs, MRs, CQs and QPs of every connection of one daemon, and the data path thread that
    moves their work requests."""

    def __init__(self, rx: RxPath, ifindex: int, mode: str, credits: CreditConfig | None = None,
                 integrity: str = "icrc", cc: CCConfig | None = None):
        self.rx, self.ifindex, self.mode = rx, ifindex, mode
        self.cc = cc if cc is not None else CCConfig()   # on unless switched off
        self.integrity = integrity     # the cheapest check this device accepts (INTEGRITY)
        self.credits = CreditGranter(rx, credits) if credits and mode == "metaroce" else None
        mod = _lib()
        self.ffi, self.c = mod.ffi, mod.lib
        self.dp = DataPath(rx, ifindex, max_qps=DEVICE_LIMITS["max_qp"],
                           max_mrs=DEVICE_LIMITS["max_mr"], max_cqs=DEVICE_LIMITS["max_cq"])
        self.mrs: dict[int, tuple[MemoryRegion, object]] = {}   # key -> (mr, owner)
        self.pds: dict[int, object] = {}
        self.cqs: dict[int, Cq] = {}
        self.qps: dict[int, Qp] = {}
        self.destroyed_qp_counters: dict[str, int] = {}   # summed over QPs that are gone
        self._next_handle = 1
        self.doorbells: dict[object, int] = {}
        self.channels: dict[int, tuple[object, int]] = {}
        self._owners: dict[int, object] = {}      # owner id (the data path's) -> owner
        self.dp.start()

    def owner_id(self, owner) -> int:
        oid = id(owner)
        self._owners[oid] = owner
        return oid

    # ---- resources ---------------------------------------------------------------------

    def _handle(self) -> int:
        self._next_handle += 1
        return self._next_handle

    def alloc_pd(self, owner) -> int:
        h = self._handle()
        self.pds[h] = owner
        return h

    def _own_pd(self, owner, pd: int) -> None:
        if self.pds.get(pd) is not owner:
            raise MetaroceError(f"no protection domain {pd}")

    def reg_mr(self, owner, pd: int, length: int, access: int) -> MemoryRegion:
        self._own_pd(owner, pd)
        if not 0 < length <= DEVICE_LIMITS["max_mr_size"]:
            raise MetaroceError(f"MR length must be 1 .. {DEVICE_LIMITS['max_mr_size']} bytes")
        if access & (ACCESS_REMOTE_ATOMIC | 2) and not access & ACCESS_LOCAL_WRITE:
            raise MetaroceError("remote write or atomic access needs local write (as in verbs)")
        mr = self.rx.reg_mr(length, pd, access)
        try:
            self.dp.mr_add(mr.rkey, self.owner_id(owner), pd, mr.addr, mr.length, access, mr.fd,
                           len(mr._mm))
        except MetaroceError:
            self.rx.dereg_mr(mr)
            raise
        self.mrs[mr.rkey] = (mr, owner)
        return mr

    def dereg_mr(self, owner, key: int) -> None:
        ent = self.mrs.get(key)
        if ent is None or ent[1] is not owner:
            raise MetaroceError(f"no memory region with key 0x{key:08x}")
        del self.mrs[key]
        self._dereg(ent[0])

    def _dereg(self, mr: MemoryRegion) -> None:
        self.dp.mr_del(mr.rkey)             # the data path's mapping first, then the kernel's
        self.rx.dereg_mr(mr)

    def create_comp_channel(self, owner) -> tuple[int, int]:
        """A completion channel: (handle, its eventfd, which the owner gets a copy of)."""
        h = self._handle()
        self.channels[h] = (owner, new_eventfd())
        return h, self.channels[h][1]

    def destroy_comp_channel(self, owner, h: int) -> None:
        ent = self.channels.get(h)
        if ent is None or ent[0] is not owner:
            raise MetaroceError(f"no completion channel {h}")
        if any(c.channel == h for c in self.cqs.values()):
            raise MetaroceError(f"completion channel {h} still has CQs")
        os.close(self.channels.pop(h)[1])

    def create_cq(self, owner, cqe: int, channel: int | None = None, shared: bool = True) -> Cq:
        """A CQ; shared: its completions go into a ring in shared memory (an application's),
        events to `channel` (or to a channel of its own, created here)."""
        if len(self.cqs) >= DEVICE_LIMITS["max_cq"]:
            raise MetaroceError(f"too many CQs (max_cq {DEVICE_LIMITS['max_cq']})")
        checked_cqe(cqe)
        if channel is not None and self.channels.get(channel, (None,))[0] is not owner:
            raise MetaroceError(f"no completion channel {channel}")
        h = self._handle()
        ring = own = None
        if shared:
            if channel is None:                  # a channel of its own, gone with the CQ
                channel, _ = self.create_comp_channel(owner)
                own = channel
            ring = CqRing(h, ring_entries(cqe), self.channels[channel][1])
        cq = Cq(h, owner, cqe, ring, channel=channel if shared else None, own_channel=own)
        try:
            self.dp.cq_add(h, self.owner_id(owner), ring.q if ring is not None else None,
                           cq.cqe)
        except MetaroceError:
            if ring is not None:
                ring.close()
            if own is not None:
                os.close(self.channels.pop(own)[1])
            raise
        self.cqs[h] = cq
        return cq

    def doorbell(self, owner) -> int:
        """The owner's doorbell eventfd (one per application, made with its first QP): the
        data path thread sleeps on it."""
        if owner not in self.doorbells:
            fd = new_eventfd()
            self.dp.doorbell_add(fd)
            self.doorbells[owner] = fd
        return self.doorbells[owner]

    def _own_cq(self, owner, h: int) -> Cq:
        cq = self.cqs.get(h)
        if cq is None or cq.owner is not owner:
            raise MetaroceError(f"no completion queue {h}")
        return cq

    def create_qp(self, owner, pd: int, send_cq: int, recv_cq: int, cap: dict,
                  shared: bool = True) -> Qp:
        """An RC QP; shared: its send and receive queues are rings in shared memory (an
        application's; the daemon's own endpoints are driven by the wire only)."""
        self._own_pd(owner, pd)
        scq, rcq = self._own_cq(owner, send_cq), self._own_cq(owner, recv_cq)
        if len(self.qps) >= DEVICE_LIMITS["max_qp"]:
            raise MetaroceError(f"too many QPs (max_qp {DEVICE_LIMITS['max_qp']})")
        qpn = secrets.randbits(24)
        while qpn in self.qps or qpn < 2:
            qpn = secrets.randbits(24)
        qp = Qp(qpn, owner, pd, scq, rcq, cap)
        if shared:
            rq = self.rx.create_rq(qpn, 1 << max(0, (max(1, qp.max_recv_wr) - 1).bit_length()),
                                   max_wr=qp.max_recv_wr)
            try:
                qp.rings = QpRings(qpn, qp.max_send_wr, qp.max_send_sge, qp.max_inline, rq)
            except (MetaroceError, OSError):
                self.rx.del_rq(qpn)
                raise
        try:
            self.dp.qp_add(qpn, self.owner_id(owner), pd, scq.handle, rcq.handle,
                           qp.max_send_wr, qp.max_send_sge, qp.max_inline, qp.rings)
        except MetaroceError:
            if qp.rings is not None:
                qp.rings.close()
                self.rx.del_rq(qpn)
            raise
        self.qps[qpn] = qp
        return qp

    def own_qp(self, owner, qpn: int) -> Qp:
        qp = self.qps.get(qpn)
        if qp is None or qp.owner is not owner:
            raise MetaroceError(f"no QP 0x{qpn:06x}")
        return qp

    def qp_attrs(self, qp: Qp) -> dict:
        addrs = neigh.local_addresses(self.ifindex)
        return {"qpn": qp.qpn, "psn": qp.sq_psn, "gid": addrs[0] if addrs else None,
                "addrs": addrs, "mac": neigh.local_mac(self.ifindex), "mtu": qp.pmtu,
                "state": qp.state, "mode": self.mode, "integrity": self.integrity}

    def connect_qp(self, qp: Qp, remote: dict, attr: dict) -> dict:
        """RTR + RTS from the peer's attributes (qpn, psn, ip; mtu optional)."""
        if qp.state not in ("INIT", "RESET"):
            raise MetaroceError(f"QP 0x{qp.qpn:06x} is {qp.state}, not INIT")
        try:
            rqpn, rpsn, rip = int(remote["qpn"]), int(remote["psn"]), str(remote["ip"])
        except (KeyError, TypeError, ValueError):
            raise MetaroceError("remote attributes need qpn, psn and ip") from None
        if not (0 < rqpn <= PSN_MASK and 0 <= rpsn <= PSN_MASK):
            raise MetaroceError("remote qpn/psn must be 24-bit")
        try:
            peer = ipaddress.ip_address(rip).packed
        except ValueError:
            raise MetaroceError(f"remote ip {rip!r} is not an IP address") from None
        want = str(attr.get("mode", remote.get("mode", "roce")))
        if want not in ("roce", "metaroce"):
            raise MetaroceError(f"mode must be roce or metaroce, not {want!r}")
        # MetaRoCE only when this device offers it and the peer asks for it (CM-5);
        # anything else gets plain RoCEv2 behaviour
        metaroce = self.mode == "metaroce" and want == "metaroce"
        # INT-1: the UDP checksum in place of the ICRC only on a MetaRoCE connection whose two
        # devices both accept it; the ICRC otherwise (and always in compat mode)
        want_int = str(attr.get("integrity", remote.get("integrity", "icrc")))
        if want_int not in INTEGRITY:
            raise MetaroceError(f"integrity must be {' or '.join(INTEGRITY)}, not {want_int!r}")
        csum = metaroce and self.integrity == "csum" and want_int == "csum"
        pmtu = min(int(remote.get("mtu", 1024)), int(attr.get("path_mtu", FITTED_MTU_MAX)),
                   self.max_pmtu(fitted=metaroce, ipv6=len(peer) == 16))
        if not path_mtu_ok(pmtu, metaroce):
            raise MetaroceError(f"path MTU {pmtu} is not a RoCE MTU (256 .. 4096)" +
                                ("" if not metaroce else " nor a fitted one (a multiple of 64 "
                                 "bytes, CM-14)"))
        retry_cnt = _attr(attr, "retry_cnt", 7, 0, 7)
        rnr_retry = _attr(attr, "rnr_retry", 7, 0, 7)
        timeout = _attr(attr, "timeout", 14, 0, 31)
        min_rnr = _attr(attr, "min_rnr_timer", 12, 0, 31)
        npaths = int(attr.get("paths") or 0) if metaroce else 0   # MP-1: negotiated N
        if npaths and not 1 <= npaths <= MAX_PATHS:
            raise MetaroceError(f"paths must be 1-{MAX_PATHS}, not {npaths}")
        path = neigh.resolve(rip, self.ifindex)
        qp.pmtu, qp.metaroce, qp.paths = pmtu, metaroce, max(1, npaths)
        qp.integrity = "csum" if csum else "icrc"
        flow = self._flow(path, rip, rqpn)
        flow.csum = int(csum)
        qp.remote = {"qpn": rqpn, "psn": rpsn, "ip": rip, "mac": path.dmac, "mtu": pmtu}
        self.rx.set_qp(qp.qpn, rpsn, qp.pd, rqpn, pmtu=pmtu, sq_psn=qp.sq_psn, peer_ip=peer,
                       rnr_timer=min_rnr, metaroce=metaroce,
                       integrity=INT_CSUM if csum else INT_ICRC)
        if self.credits is not None and metaroce:
            self.credits.admit(qp.qpn, self.qps.values(), time.monotonic())
        window = MR_WINDOW_PKTS if metaroce else WINDOW_PKTS
        try:
            self.dp.qp_connect(
                qp.qpn, mode="metaroce" if metaroce else "roce",
                attr={"dest_qpn": rqpn, "sq_psn": qp.sq_psn, "rq_psn": rpsn, "path_mtu": pmtu,
                      "timeout": timeout, "retry_cnt": retry_cnt, "rnr_retry": rnr_retry,
                      "min_rnr_timer": min_rnr, "max_rd_atomic": RD_DEPTH,
                      "max_dest_rd_atomic": RD_DEPTH, "window": window},
                paths=qp.paths, credit=bool(metaroce and attr.get("credit")),
                sq_slot=self.rx.sq_slot(qp.qpn), remote_qpn=rqpn, flow=flow,
                cc=self.cc.engine(window, pmtu))
        except MetaroceError:
            self.rx.set_qp_error(qp.qpn)     # the kernel's side answers nothing then
            raise
        qp.state = "RTS"
        return {"qpn": qp.qpn, "state": qp.state, "path": path.__dict__, "mtu": pmtu,
                "mode": self.qp_mode(qp), "integrity": qp.integrity}

    def _flow(self, path, dst_ip: str, dqpn: int):
        """The header template of a QP's packets (DSCP 26 / ECT(0), TTL 64, default P_Key);
        the data path takes the source port and PathID from each packet's descriptor."""
        f = self.ffi.new("struct mr_roce_flow *")
        f.dmac = bytes.fromhex(path.dmac.replace(":", ""))
        f.smac = bytes.fromhex(path.smac.replace(":", ""))
        src, dst = ipaddress.ip_address(path.src_ip), ipaddress.ip_address(dst_ip)
        f.ipv6 = int(src.version == 6)
        f.src_ip = src.packed.ljust(16, b"\0")
        f.dst_ip = dst.packed.ljust(16, b"\0")
        f.tos, f.ttl, f.pkey, f.dqpn = 26 << 2 | 2, 64, 0xFFFF, dqpn
        return f

    @staticmethod
    def qp_mode(qp: Qp) -> str:
        return "metaroce" if qp.metaroce else "roce"

    def max_pmtu(self, fitted: bool = False, ipv6: bool = True) -> int:
        """The largest RoCE MTU the link and the AF_XDP socket's largest frame hold, or with
        fitted the largest fitted one (CM-14; MetaRoCE connections) over IPv6, or IPv4. The
        link MTU is read at most once a second: a netlink round trip costs about a millisecond
        here."""
        now = time.monotonic()
        cached = getattr(self, "_pmtu", None)
        if cached is None or now - cached[0] >= 1.0:
            from pyroute2 import IPRoute  # noqa: PLC0415
            with IPRoute() as ipr:
                mtu = ipr.link("get", index=self.ifindex)[0].get_attr("IFLA_MTU")
            cap = self.dp.frame_cap
            cached = self._pmtu = (now, largest_pmtu(mtu, cap), largest_fitted_pmtu(mtu, cap),
                                   largest_fitted_pmtu(mtu, cap, ipv6=False))
        return (cached[2] if ipv6 else cached[3]) if fitted else cached[1]

    def destroy_qp(self, owner, qpn: int) -> None:
        self._forget_qp(self.own_qp(owner, qpn))

    def _forget_qp(self, qp: Qp) -> None:
        self._keep_counters(qp)
        self.dp.qp_del(qp.qpn)                   # the data path lets go of its rings first
        if qp.rings is not None:
            qp.rings.close()
            qp.rings = None
        self.rx.del_qp(qp.qpn)                   # its receive ring too
        if self.credits:
            self.credits.forget(qp.qpn)
        del self.qps[qp.qpn]

    def _keep_counters(self, qp: Qp) -> None:
        """A QP about to go adds its counters (the kernel's and the data path's) to the
        device's: device counters never go backwards while the daemon lives."""
        st = self.qp_stats(qp)
        kept = self.destroyed_qp_counters
        for k, v in st.items():
            if isinstance(v, int) and not isinstance(v, bool) and k != "qpn":
                if k in QP_COUNTERS or k.endswith(("_packets", "_bytes", "_err", "_handled",
                                                   "_retry", "_retransmits", "_expired",
                                                   "_rereads", "_backs", "_pending",
                                                   "_received", "_grants", "_blocked")):
                    kept[k] = kept.get(k, 0) + v

    def release_pd(self, owner, pd: int) -> None:
        """Free a PD with what owner registered in it (its QPs must be gone)."""
        self._own_pd(owner, pd)
        if any(q.pd == pd and q.owner is owner for q in self.qps.values()):
            raise MetaroceError(f"protection domain {pd} still has QPs")
        for key in [k for k, e in self.mrs.items() if e[1] is owner and e[0].pd == pd]:
            self._dereg(self.mrs.pop(key)[0])
        del self.pds[pd]

    def destroy_cq(self, owner, h: int) -> None:
        cq = self._own_cq(owner, h)
        if any(q.send_cq is cq or q.recv_cq is cq for q in self.qps.values()):
            raise MetaroceError(f"completion queue {h} is still used by a QP")
        self._forget_cq(cq)

    def _forget_cq(self, cq: Cq) -> None:
        self.dp.cq_del(cq.handle)
        del self.cqs[cq.handle]
        if cq.ring is not None:
            cq.ring.close()
            cq.ring = None
        if cq.own_channel is not None:
            os.close(self.channels.pop(cq.own_channel)[1])

    def release(self, owner) -> None:
        """A connection went away: reclaim everything it created."""
        for qp in [qp for qp in self.qps.values() if qp.owner is owner]:
            self._forget_qp(qp)
        for key in [k for k, e in self.mrs.items() if e[1] is owner]:
            self._dereg(self.mrs.pop(key)[0])
        for cq in [c for c in self.cqs.values() if c.owner is owner]:
            self._forget_cq(cq)
        for h in [h for h, (o, _) in self.channels.items() if o is owner]:
            os.close(self.channels.pop(h)[1])
        if owner in self.doorbells:
            fd = self.doorbells.pop(owner)
            self.dp.doorbell_del(fd)
            os.close(fd)
        for h in [h for h, o in self.pds.items() if o is owner]:
            del self.pds[h]
        self._owners.pop(id(owner), None)

    # ---- what the data path reports -----------------------------------------------------

    def take_wcs(self) -> list[tuple[Cq, list]]:
        """The ring-less CQs' completions (the daemon's own endpoints')."""
        out = []
        for cq in self.cqs.values():
            if cq.ring is None:
                wcs = self.dp.cq_take(cq.handle)
                if wcs:
                    out.append((cq, wcs))
        return out

    def take_async_events(self) -> list[tuple[object, dict]]:
        """CQ overruns (as in verbs: each QP using the CQ went to ERR, its work flushed, its
        responder dropping every request): IBV_EVENT_CQ_ERR and IBV_EVENT_QP_FATAL for the
        owners."""
        out = []
        for ev in self.dp.take_async():
            owner = self._owners.get(ev.owner)
            if owner is None:
                continue                         # gone meanwhile
            if ev.type == "CQ_ERR":
                out.append((owner, {"type": "CQ_ERR", "cq": ev.cq, "cqe": ev.cqe,
                                    "bad_consumer_index": ev.bad_index}))
            else:
                qp = self.qps.get(ev.qpn)
                if qp is not None:
                    qp.state = "ERR"
                out.append((owner, {"type": "QP_FATAL", "qp_num": ev.qpn, "cq": ev.cq}))
        return out

    def cq_describe(self, cq: Cq) -> dict:
        info = self.dp.cq_info(cq.handle) or {}
        return {"cq": cq.handle, "cqe": cq.cqe, "produced": info.get("produced", 0),
                "consumed": info.get("consumed", 0),
                "state": "ERR" if info.get("overrun") else "OK",
                "dropped": info.get("dropped", 0),
                "bad_consumer_index": info.get("bad_index", False)}

    def tick(self, now: float) -> None:
        """Periodic work: the receiver's credit shares (CC-8)."""
        if self.credits is not None and self.qps:
            self.credits.tick(self.qps.values(), now)

    def next_deadline(self) -> float | None:
        """When the control plane has work of its own next (the credit tick)."""
        if self.credits is not None and any(q.metaroce for q in self.qps.values()):
            return self.credits.next_tick
        return None

    def qp_stats(self, qp: Qp) -> dict:
        return qp_stats(self, qp)

    def close(self) -> None:
        """The daemon's stop, after its program was detached."""
        self.rx.tear_down()
        for owner in {q.owner for q in self.qps.values()} | {c.owner for c in self.cqs.values()}:
            self.release(owner)
        for key in list(self.mrs):
            self._dereg(self.mrs.pop(key)[0])
        self.dp.close()                          # the thread, with what is left of it
        for _, fd in self.channels.values():
            os.close(fd)
        for fd in self.doorbells.values():
            os.close(fd)
