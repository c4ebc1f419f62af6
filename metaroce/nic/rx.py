"""Load the NIC data-path program (bpf/nic/nic.bpf.c) and manage what it reads and writes: QP
state, posted receives, outstanding READ/ATOMIC slots, memory regions (one mmap-able array map
per MR, found by key), counters, and the event ring it reports through."""

from __future__ import annotations

import mmap
import os
import secrets
import struct
from dataclasses import dataclass

from ..errors import MetaroceError
from ..kern import libbpf
from ..kern.bcc_loader import build_program, load
from .steer import RxSteering

MR_CHUNK = 65536
ACCESS_LOCAL_WRITE, ACCESS_REMOTE_WRITE, ACCESS_REMOTE_READ, ACCESS_REMOTE_ATOMIC = 1, 2, 4, 8
RX_REASONS = ("placed", "not_roce", "malformed", "unknown_qp", "psn_out_of_order",
              "bad_opcode_seq", "bad_rkey", "mr_bounds", "mr_access", "unsupported_opcode",
              "bad_icrc", "duplicate", "rnr", "qp_error", "wrong_source", "ack", "read_request",
              "atomic", "unexpected_response", "invalid_request", "cnp", "wrong_mode",
              "beyond_window", "bad_pkey", "bad_recv_wqe", "bad_csum")
TX_COUNTERS = ("ack", "nak_seq", "nak_rnr", "nak_inv_req", "nak_rem_access", "nak_rem_op",
               "atomic_ack", "cnp", "sack")
PORT_COUNTERS = ("rcv_packets", "rcv_bytes", "xmit_packets", "xmit_bytes",   # port_counters map
                 "rcv_icrc_checked", "rcv_csum_checked", "rcv_multi_buf", "rcv_steered")
RQ_DEPTH, RD_DEPTH = 256, 16
RD_READ, RD_ATOMIC = 1, 2
CREDIT_VALID = 0x80000000        # an event's len carries a Credit Limit PSN (nic_consts.h)
QP_RX_ERROR = 3                  # qp.state after a fatal NAK (nic_consts.h)
EV_RECV, EV_READ_REQUEST, EV_ACK, EV_NAK, EV_RD_DONE, EV_RD_GAP, EV_CNP, EV_RECV_ERR, \
    EV_QP_ERROR, EV_SACK, EV_EPSN = range(1, 12)
QP_COUNTERS = ("rx_packets", "rx_bytes", "out_of_sequence", "duplicate_request",
               "packet_seq_err", "rnr_nak_received", "np_cnp_sent", "rp_cnp_handled",
               "np_ecn_marked_roce_packets", "acks_received", "sacks_sent", "sacks_received")


def extra_defines() -> dict:
    """Test-only compile-time switches from METAROCE_BPF_DEFINES ("NAME=1,OTHER=2"): the
    conformance self-test builds deliberately broken data paths (MUTANT_*) this way; unset, the
    program is built as always."""
    out = {}
    for item in filter(None, (s.strip() for s in os.environ.get("METAROCE_BPF_DEFINES", "").split(","))):
        name, _, value = item.partition("=")
        if not name.isidentifier():
            raise MetaroceError(f"METAROCE_BPF_DEFINES: bad name {name!r}")
        out[name] = value or "1"
    return out


def crc32_slice8_tables() -> bytes:
    """The 8 x 256 tables of slice-by-8 CRC-32 (reflected 0xEDB88320), as struct crc_tables."""
    t0 = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0xEDB88320 if c & 1 else c >> 1
        t0.append(c)
    tables = [t0]
    for _ in range(7):
        prev = tables[-1]
        tables.append([(v >> 8) ^ t0[v & 0xFF] for v in prev])
    return b"".join(struct.pack("=256I", *t) for t in tables)
_MR_INFO = struct.Struct("=QQII")       # struct mr_info
_RD_SLOT = struct.Struct("=QQQIIII")    # struct rd_slot


class RecvRing:
    """A QP's receive queue ring (bpf/nic/nic_vq.h): an mmap-able BPF array map of
    MR_VQ_HDR_SLOTS + entries 32-byte slots, the header first, found by QPN in `rqs`. Its owner
    maps it (the fd) and posts into it; the XDP program takes WQEs from it; `view` is a C view
    (struct mr_vq) for the header's indices."""

    def __init__(self, qpn: int, entries: int, max_wr: int):
        from ..fastpath.vqlayout import C, HDR_SIZE  # noqa: PLC0415
        from ..fastpath.xsk import _lib  # noqa: PLC0415
        mod = _lib()
        self.ffi, self.c = mod.ffi, mod.lib
        stride = C["MR_RQ_STRIDE"]
        self.entries, self.stride = entries, stride
        n = C["MR_VQ_HDR_SLOTS"] + entries
        self.fd = libbpf.map_create(libbpf.BPF_MAP_TYPE_ARRAY, "rq", 4, stride, n,
                                    libbpf.BPF_F_MMAPABLE | libbpf.BPF_F_INNER_MAP)
        self.size = -(-n * stride // mmap.PAGESIZE) * mmap.PAGESIZE
        self.mm = mmap.mmap(self.fd, self.size)
        self.ptr = self.ffi.from_buffer(self.mm)
        self.view = self.ffi.new("struct mr_vq *")
        if self.c.mr_vq_create(self.view, self.ptr, C["MR_VQ_RQ"], entries, stride, max_wr, 1, 0,
                               qpn, -1):
            self.close()
            raise MetaroceError(f"receive queue of {entries} entries refused")
        assert HDR_SIZE == C["MR_VQ_HDR_SLOTS"] * stride

    def describe(self) -> dict:
        return {"bytes": self.size, "offset": 0, "entries": self.entries, "stride": self.stride,
                "max_wr": int(self.view.max_wr), "max_sge": 1}

    def post(self, seq: int, wr_id: int, addr: int, lkey: int, length: int) -> None:
        """Write receive WQE number seq and publish the ring up to it (the raw path tools and
        tests take; applications post through their own mapping)."""
        from ..fastpath.vqlayout import HDR_SIZE, RECV_WQE, SGE  # noqa: PLC0415
        off = HDR_SIZE + (seq % self.entries) * self.stride
        RECV_WQE.pack_into(self.mm, off, wr_id, 1)
        SGE.pack_into(self.mm, off + RECV_WQE.size, addr, length, lkey)
        self.view.hdr.prod = (seq + 1) & 0xFFFFFFFF

    def close(self) -> None:
        if self.mm is not None:
            self.ffi.release(self.ptr)
            self.mm.close()
            os.close(self.fd)
            self.mm = None


@dataclass
class MemoryRegion:
    """Registered memory: `buf` is the application's view, the XDP program writes into it."""
    rkey: int
    addr: int
    length: int
    access: int
    pd: int
    fd: int
    buf: memoryview
    _mm: mmap.mmap


class RxPath:
    """One loaded receive program with its maps; attach `prog_fd` to a device or test-run it."""

    def __init__(self, max_qps: int = 4096, max_mrs: int = 4096,
                 rx_cpus: list[int] | None = None):
        """rx_cpus: receive steering over these CPUs (nic/steer.py; the device runs nic_steer,
        prog_fd), or None: the device runs nic_rx on whatever CPU a frame arrives on (and
        BPF_PROG_TEST_RUN can drive it: prog_fd)."""
        # frags-aware (BPF_F_XDP_HAS_FRAGS): every read of the packet past its headers is
        # bpf_xdp_load_bytes, so a multi-buffer frame is parsed, checked and placed like any
        # other, and veth runs the program natively at MTU 9000 (issue 21)
        # the receive path is two programs, the second tail-called by the first once a frame
        # has passed its checks (each within the verifier's budget: nic_stages)
        funcs = ({"nic_steer": "xdp.frags", "nic_rx_cpu": "xdp.cpumap",
                  "nic_rx_cpu_2": "xdp.cpumap"} if rx_cpus else
                 {"nic_rx": "xdp.frags", "nic_rx_2": "xdp.frags"})
        steer = {"NIC_STEER": 1} if rx_cpus else {}
        self.bpf = build_program("nic/nic.bpf.c", {"MAX_QPS": max_qps, "MAX_MRS": max_mrs,
                                                   **steer, **extra_defines()}, funcs)
        self.build_info = dict(self.bpf.build_info)
        self.steering = None
        first, second = ("nic_rx_cpu", "nic_rx_cpu_2") if rx_cpus else ("nic_rx", "nic_rx_2")
        stages = [load(self.bpf, name, funcs[name]) for name in (first, second)]
        libbpf.map_update_raw(self.bpf[b"nic_stages"].map_fd, struct.pack("=I", 0),
                              struct.pack("=I", stages[1].fd))
        if rx_cpus:
            self.prog = load(self.bpf, "nic_steer", "xdp.frags")
            self.steering = RxSteering(self.bpf, stages[0].fd, rx_cpus)
        else:
            self.prog = stages[0]
        self.prog_fd = self.prog.fd
        # the verifier's walk of each stage of the receive path against its budget: what is
        # left for new checks (the larger of the two is what binds)
        walked = {name: libbpf.prog_verified_insns(f.fd) for name, f in zip((first, second),
                                                                            stages)}
        self.build_info["verified_insns_by_program"] = walked
        self.build_info["verified_insns"] = max((v for v in walked.values() if v), default=None)
        self.build_info["verifier_budget"] = libbpf.VERIFIER_BUDGET
        self._mrs_fd = self.bpf[b"mrs"].map_fd
        self._info_fd = self.bpf[b"mr_infos"].map_fd
        self._qps = self.bpf[b"qps"]
        self._qps_fd = self._qps.map_fd
        sq = self.bpf[b"sq_psns"]
        self.max_qps = max_qps
        self._tearing_down = False
        self.sq_psns_fd = sq.map_fd
        self._sq_mm = mmap.mmap(sq.map_fd, -(-8 * max_qps // mmap.PAGESIZE) * mmap.PAGESIZE)
        self._sq_slots: dict[int, int] = {}          # QPN -> its entry in sq_psns
        self._sq_free = list(range(max_qps - 1, -1, -1))
        self._rqs_fd = self.bpf[b"rqs"].map_fd
        self.rqs: dict[int, RecvRing] = {}
        self._rd_fd = self.rd_slots_fd = self.bpf[b"rd_slots"].map_fd
        self.qps_fd = self._qps_fd
        self._atomic_fd = self.bpf[b"atomic_results"].map_fd
        self.events_fd = self.bpf[b"events"].map_fd
        self.ev_sleep_fd = self.bpf[b"ev_sleep"].map_fd
        self._credit_fd = self.bpf[b"credit"].map_fd
        libbpf.map_update_raw(self.bpf[b"crc_tab"].map_fd, struct.pack("=I", 0), crc32_slice8_tables())
        self.mrs: dict[int, MemoryRegion] = {}

    def close(self) -> None:
        self.tear_down()
        for mr in list(self.mrs.values()):
            self.dereg_mr(mr)
        for qpn in list(self.rqs):
            self.del_rq(qpn)
        self._sq_mm.close()
        self.bpf.cleanup()

    def tear_down(self) -> None:
        """The program is detached and its maps go with it: from now on releasing a receive
        ring or an MR leaves the map-in-map entries in place (deleting one waits for an RCU
        grace period, ~9 ms: 1,024 QPs took the daemon's stop past its 5 s)."""
        self._tearing_down = True

    def create_rq(self, qpn: int, entries: int = RQ_DEPTH, max_wr: int | None = None) -> RecvRing:
        """The QP's receive queue ring (entries a power of two, at most RQ_DEPTH), in place for
        the program from now on."""
        if qpn in self.rqs:
            raise MetaroceError(f"QP 0x{qpn:06x} has a receive queue")
        if entries & (entries - 1) or not 0 < entries <= RQ_DEPTH:
            raise MetaroceError(f"a receive queue has 1 .. {RQ_DEPTH} entries, a power of two")
        ring = RecvRing(qpn, entries, entries if max_wr is None else max_wr)
        try:
            libbpf.map_update_raw(self._rqs_fd, struct.pack("=I", qpn), struct.pack("=I", ring.fd))
        except OSError:
            ring.close()
            raise
        self.rqs[qpn] = ring
        return ring

    def del_rq(self, qpn: int) -> None:
        """Take the ring away from the program first, then release it."""
        if not self._tearing_down:
            libbpf.map_delete_raw(self._rqs_fd, struct.pack("=I", qpn), missing_ok=True)
        ring = self.rqs.pop(qpn, None)
        if ring is not None:
            ring.close()

    def set_qp(self, qpn: int, epsn: int, pd: int, dqpn: int = 0, msn: int = 0, *,
               pmtu: int = 1024, sq_psn: int | None = None, peer_ip: bytes | None = None,
               rnr_timer: int = 12, metaroce: bool = False, integrity: int = 0) -> None:
        """A QP in RTR/RTS: what it expects next, whom it answers, where its requests start
        (sq_psn: the first PSN it sends; None leaves the requester side closed), with
        peer_ip (4 or 16 bytes) the only source it accepts, and which mode's opcodes it
        speaks (metaroce: selective repeat with SACK, spec section 5), and which check its
        packets pass (integrity: 0 the ICRC, 1 the IPv4/UDP checksums, INT-3). Its receive queue is
        the ring create_rq made (one of RQ_DEPTH entries is made here if there is none)."""
        ring = self.rqs.get(qpn) or self.create_rq(qpn)
        try:                       # armed again: the receives it consumed stay consumed
            head = self._qps[self._qps.Key(qpn)].rq_head
        except KeyError:
            head = ring.view.tail
        leaf = self._qps.Leaf()
        leaf.rq_entries = ring.entries
        leaf.rq_head = head
        leaf.epsn, leaf.pd, leaf.dqpn, leaf.msn, leaf.pmtu = epsn, pd, dqpn, msn, pmtu
        leaf.rnr_timer = rnr_timer
        leaf.metaroce = int(metaroce)
        leaf.integrity = int(integrity)     # INT_ICRC 0, INT_CSUM 1 (spec 5.7)
        if peer_ip is not None:
            leaf.peer_set = 1
            leaf.peer_ip[:] = list(peer_ip.ljust(16, b"\0"))
        if sq_psn is not None:
            leaf.una = sq_psn
            if qpn not in self._sq_slots:
                if not self._sq_free:
                    raise MetaroceError(f"no requester slot left ({len(self._sq_slots)} QPs)")
                self._sq_slots[qpn] = self._sq_free.pop()
            leaf.sq_slot, leaf.sq_open = self._sq_slots[qpn], 1
            self.set_sq_psn(qpn, sq_psn)
        if self.steering:              # its CPU before its state: no frame of it runs elsewhere
            self.steering.assign(qpn)
        self._qps[self._qps.Key(qpn)] = leaf

    def qp_cpu(self, qpn: int) -> int | None:
        """The CPU the QP's frames are handed to (receive steering), or None."""
        return self.steering.qp_cpu.get(qpn) if self.steering else None

    def sq_slot(self, qpn: int) -> int:
        """The QP's entry in sq_psns (its next PSN), set by set_qp with sq_psn."""
        return self._sq_slots[qpn]

    def set_qp_error(self, qpn: int) -> None:
        """The responder side of the QP to ERR, as after a fatal NAK: every request is dropped
        (counted qp_error). ERR is final, so a concurrent update by the program is moot."""
        key = self._qps.Key(qpn)
        try:
            leaf = self._qps[key]
        except KeyError:
            return                             # never connected: nothing in the kernel
        leaf.state = QP_RX_ERROR
        self._qps[key] = leaf

    def set_sq_psn(self, qpn: int, psn: int) -> None:
        """The next PSN the requester will send: ACKs beyond it are forged (RESP-12). On every
        post's path, so a store into the mmap-ed sq_psns array, no system call (the packets
        that use it leave through a system call, which orders the store before them)."""
        struct.pack_into("=Q", self._sq_mm, 8 * self._sq_slots[qpn], psn & 0xFFFFFFFF)

    def set_credit(self, qpn: int, share: int) -> None:
        """CC-8: the XDP responder grants this QP's sender `share` packets past its cumulative
        PSN in every SACK (flag C); 0 ends credit mode (SACKs without flag C)."""
        key = struct.pack("=I", qpn)
        if share:
            libbpf.map_update_raw(self._credit_fd, key, struct.pack("=I", share))
        else:
            libbpf.map_delete_raw(self._credit_fd, key, missing_ok=True)

    def qp_epsn(self, qpn: int) -> int | None:
        """One field, the responder's expected PSN (it moves with every in-order request)."""
        try:
            return self._qps[self._qps.Key(qpn)].epsn
        except KeyError:
            return None

    def del_qp(self, qpn: int) -> None:
        key = struct.pack("=I", qpn)
        if not self._tearing_down:
            for fd in (self._qps_fd, self._credit_fd):
                libbpf.map_delete_raw(fd, key, missing_ok=True)
        if self.steering:
            self.steering.release(qpn, not self._tearing_down)
        slot = self._sq_slots.pop(qpn, None)
        if slot is not None:                   # the QP's entry is gone: its slot is free
            self._sq_free.append(slot)
        self.del_rq(qpn)
        if self._tearing_down:
            return
        for fd, depth in ((self._rd_fd, RD_DEPTH), (self._atomic_fd, RD_DEPTH)):
            for slot in range(depth):          # slots never used were never created
                libbpf.map_delete_raw(fd, struct.pack("=Q", qpn << 32 | slot), missing_ok=True)

    def post_recv(self, qpn: int, seq: int, wr_id: int, addr: int, lkey: int, length: int) -> None:
        """Receive WQE number seq of the QP, into its ring (for tools and tests driving the
        data path directly; the caller posts in order and keeps seq - consumed < entries)."""
        ring = self.rqs.get(qpn) or self.create_rq(qpn)
        ring.post(seq, wr_id, addr, lkey, length)

    def set_rd_slot(self, qpn: int, idx: int, *, wr_id: int, addr: int, length: int, lkey: int,
                    first_psn: int, kind: int) -> None:
        """Where the response to outstanding READ/ATOMIC number idx of the QP lands."""
        libbpf.map_update_raw(self._rd_fd, struct.pack("=Q", qpn << 32 | idx % RD_DEPTH),
                              _RD_SLOT.pack(wr_id, addr, length, lkey, first_psn, kind, idx))

    def qp_state(self, qpn: int) -> dict:
        raw = self._qps[self._qps.Key(qpn)]
        return {f: getattr(raw, f) for f, *_ in raw._fields_
                if f not in ("peer_ip", "pad", "pad2")}

    def reg_mr(self, length: int, pd: int, access: int, addr: int | None = None) -> MemoryRegion:
        """Register `length` bytes of new memory; the rkey is random (unpredictable)."""
        if length <= 0:
            raise MetaroceError("MR length must be positive")
        chunks = -(-length // MR_CHUNK)
        fd = libbpf.map_create(libbpf.BPF_MAP_TYPE_ARRAY, "mr", 4, MR_CHUNK, chunks,
                               libbpf.BPF_F_MMAPABLE | libbpf.BPF_F_INNER_MAP)
        mm = mmap.mmap(fd, chunks * MR_CHUNK)
        rkey = secrets.randbits(32)
        while rkey in self.mrs or rkey == 0:
            rkey = secrets.randbits(32)
        addr = addr if addr is not None else secrets.randbits(47) & ~0xFFF
        libbpf.map_update_raw(self._info_fd, struct.pack("=I", rkey),
                              _MR_INFO.pack(addr, length, access, pd))
        libbpf.map_update_raw(self._mrs_fd, struct.pack("=I", rkey), struct.pack("=I", fd))
        mr = MemoryRegion(rkey, addr, length, access, pd, fd, memoryview(mm)[:length], mm)
        self.mrs[rkey] = mr
        return mr

    def dereg_mr(self, mr: MemoryRegion) -> None:
        """Invalidate the rkey at once (the kernel stops placing), then release the memory."""
        key = struct.pack("=I", mr.rkey)
        if not self._tearing_down:
            libbpf.map_delete_raw(self._mrs_fd, key)
            libbpf.map_delete_raw(self._info_fd, key)
        self.mrs.pop(mr.rkey, None)
        mr.buf.release()
        mr._mm.close()
        os.close(mr.fd)

    def counters(self) -> dict:
        """Receive verdicts by reason, and replies sent (`tx_*`), summed over CPUs."""
        rx, tx = self.bpf[b"rx_counters"], self.bpf[b"tx_counters"]
        out = {name: sum(rx[rx.Key(i)]) for i, name in enumerate(RX_REASONS)}
        out.update({f"tx_{name}": sum(tx[tx.Key(i)]) for i, name in enumerate(TX_COUNTERS)})
        return out

    def port_counters(self) -> dict:
        """Every RoCE frame received and every reply sent by the program, whatever the QP or
        the verdict (frames and bytes), summed over CPUs."""
        pc = self.bpf[b"port_counters"]
        return {name: sum(pc[pc.Key(i)]) for i, name in enumerate(PORT_COUNTERS)}

    def steering_status(self) -> dict | str:
        """Receive steering as `metaroce status` shows it: its CPUs and QPs per CPU, and per
        CPU the RoCE frames the NIC program handled there (rcv_packets) and those nic_steer
        handed from there to a QP's CPU (rcv_steered); "off" without steering."""
        if not self.steering:
            return "off"
        pc = self.bpf[b"port_counters"]
        n = os.cpu_count() or 1
        per_cpu = {name: [int(v) for v in pc[pc.Key(PORT_COUNTERS.index(name))]][:n]
                   for name in ("rcv_packets", "rcv_steered")}
        return {**self.steering.describe(),
                **{f"{name}_per_cpu": v for name, v in per_cpu.items()}}

    def event_counters(self) -> dict:
        ev = self.bpf[b"ev_counters"]
        return {"events": sum(ev[ev.Key(0)]), "events_lost": sum(ev[ev.Key(1)])}

    def run(self, packet: bytes, repeat: int = 1,
            linear: int | None = None) -> tuple[int, bytes, int]:
        return libbpf.prog_test_run(self.prog_fd, packet, repeat, linear)
