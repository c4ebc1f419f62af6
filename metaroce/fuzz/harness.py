"""Fuzz the NIC's fast path: the real XDP program (RxPath), real MRs and QPs (responder and
requester sides: posted receives, outstanding READ/ATOMIC slots, PSNs in flight), packets from
`gen.Generator` run one by one through BPF_PROG_TEST_RUN.

Invariants:
  * no crash: every test run returns; every return code is XDP_DROP, XDP_PASS or XDP_TX;
  * every packet is accounted for: after each packet exactly one receive reason has moved, by
    exactly one; a reply counter moves by one exactly when it returns XDP_TX; XDP_PASS exactly
    when the reason is not_roce; the per-packet attribution equals RxPath.counters()'s deltas
    over the run; packets = accepted + passed + tx + dropped + unaccounted, unaccounted == 0;
  * memory changes only where an accepted packet could legitimately write (its RETH range in a
    region of its QP's PD with remote-write access, the rest of a WRITE whose FIRST was
    accepted, 8 bytes of an executed atomic, the QP's own receive buffers for a SEND, its own
    READ/ATOMIC response buffers for a response), never in the guard bytes past a region's
    length inside its map, never in a region its QP's PD cannot reach; checked per batch by
    comparing each region with a shadow copy that only accepted packets' ranges may update;
  * replies (XDP_TX) carry a valid ICRC; packets that are not RoCE pass untouched;
  * at the end the program still places a valid WRITE, exactly where it was aimed;
  * the program sees every byte of every frame it parses as RoCE: per batch, its port counter of
    received bytes (bpf_xdp_get_buff_len) moves by the sum of those frames' lengths, and its
    count of multi-buffer frames by the number of them the test run handed over in fragments.

QP 0x15 is a MetaRoCE-mode QP (MR_QPS): its requests are mostly MR_* opcodes with a PETH
(placement by offset, receive WQEs by RSN, the selective-repeat window), at the fitted path MTU
(CM-14; 8064 at 9000, the default run's 256 otherwise); a MetaRoCE WRITE names its range in
every packet's RETH, so the memory model is the same.

Jumbo frames (`mtu`, the CLI's --mtu): QPs at the path MTU the link MTU allows (4096 at 9000),
frames up to the link MTU plus the Ethernet header (a few past it), receive and response buffers
that hold multi-packet messages at that MTU. A frame longer than the linear part of a test run
(PAGE_SIZE - XDP_PACKET_HEADROOM - skb_shared_info: 3520 bytes here) reaches the program as a
multi-buffer xdp_buff: the kernel puts the rest into page fragments, because the program is
loaded frags-aware (BPF_F_XDP_HAS_FRAGS). Half of the frames also get a linear part of the
harness's choosing (an xdp_md context in, `data_end` < the frame's length: kernels from 6.18),
at or near a header edge (Ethernet, IP, UDP, BTH, extension headers, payload, ICRC) or anywhere,
so headers, payloads and the ICRC straddle the boundary between the linear part and the
fragments, and frames of any size arrive in fragments.

Speed: one BPF_PROG_TEST_RUN per packet (~3 us) and one batched per-CPU counter lookup per
packet (~5 us); the generator dominates. `repeat` is never used: on this kernel every test run
with repeat > 1 swaps the XDP dispatcher in and out (bpf_prog_change_xdp, an RCU grace
period), ~16 ms per call whatever the repeat count — that alone made the first version of this
harness run at ~420 packets/s.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import random
import struct
import time

from ..errors import MetaroceError
from ..kern import libbpf
from ..nic import rx as rxmod
from ..wire import consts as C
from ..wire.packet import udp_checksum_ok
from . import frames as F
from .gen import (ATOMIC_OPS, CONT_WRITE_OPS, MR_CHUNK, RD_ATOMIC, RD_READ, RESPONSE_OPS,
                  RETH_WRITE_OPS, Generator, Qp, Region, Target)

XDP_ABORTED, XDP_DROP, XDP_PASS, XDP_TX = 0, 1, 2, 3
ACCESS_LOCAL_WRITE, ACCESS_REMOTE_WRITE, ACCESS_REMOTE_READ, ACCESS_REMOTE_ATOMIC = 1, 2, 4, 8
# receive reasons that mean "the NIC took the packet and did what it asked"
ACCEPT_REASONS = ("placed", "read_request", "atomic", "ack", "cnp", "received", "executed")
# the checks behind the ICRC (and the ICRC itself): each must be reached, many times
DEEP_REASONS = ("bad_rkey", "mr_bounds", "mr_access", "psn_out_of_order", "bad_opcode_seq",
                "bad_icrc", "bad_csum", "malformed", "invalid_request", "rnr", "wrong_source", "qp_error",
                "duplicate", "unexpected_response")
# (length, pd, access): lengths that are not multiples of the chunk leave guard bytes in the map
REGIONS = ((3 * MR_CHUNK + 1000, 1, ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE),
           (5000, 1, ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ | ACCESS_REMOTE_ATOMIC),
           (MR_CHUNK, 1, ACCESS_REMOTE_READ),
           (MR_CHUNK + 7, 2, ACCESS_REMOTE_WRITE | ACCESS_REMOTE_ATOMIC),
           (4097, 3, ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ | ACCESS_REMOTE_ATOMIC),
           (1, 2, ACCESS_REMOTE_WRITE),
           (2 * MR_CHUNK - 3, 2, ACCESS_REMOTE_READ | ACCESS_REMOTE_ATOMIC | ACCESS_LOCAL_WRITE))
# (qpn, pd, epsn, dqpn, peer): PSNs that wrap soon, a QP that accepts one source address only,
# a QP whose PD owns no region
QPS = ((0x000011, 1, 100, 0x000101, None), (0x000012, 2, 0xFFFFF0, 0x000102, None),
       (0x000013, 1, 0, 0x000103, F.V4_SRC), (0x000014, 4, 0x7FFFFF, 0x000104, None),
       (0x000015, 1, 0xFFFF80, 0x000105, None))
# QPs in MetaRoCE mode (selective repeat, placement by PETH, spec section 5) at the fitted path
# MTU (CM-14: 8064 at a 9000-byte link), their requests mostly in MR_* opcodes
MR_QPS = frozenset({0x000015})
# QPs that negotiated CSUM (spec 5.7): the IPv4/UDP checksums are their check, not the ICRC
CSUM_QPS = frozenset({0x000012})
# receive buffers (region index, offset, length), used in turn by each QP's receive WQEs:
# good ones, one straddling a chunk edge, one running past its region, one in a region without
# local-write access, one in another PD's region
RECV_BUFS = {0x000011: ((0, 0x20000, 3000), (0, MR_CHUNK - 700, 2000),
                        (0, 3 * MR_CHUNK + 600, 1000)),
             0x000012: ((6, 100, 1500), (3, 0, 1000), (6, 2 * MR_CHUNK - 600, 2000)),
             0x000013: ((0, 0x28000, 600), (2, 0, 1000), (6, 0, 1000)),   # 0x14: none (RNR)
             0x000015: ((0, 0x4000, 3000), (0, 0xA000, 700), (3, 0, 1000))}
RQ_AHEAD = 4                # receive WQEs kept posted per QP
LAZY_ERRORS = 8            # packets the lazy QP refuses in ERR before it is re-armed
# outstanding READ / ATOMIC slots of the requester side: (kind, region, offset, length)
RD_BUFS = {0x000011: ((RD_READ, 0, 0x2A000, 700), (RD_ATOMIC, 0, 0x2B000, 8),
                      (RD_READ, 0, 3 * MR_CHUNK + 800, 600), (RD_READ, 2, 0, 300)),
           0x000012: ((RD_READ, 6, 4096, 1000), (RD_ATOMIC, 6, 8192 + 3, 8)),
           0x000013: ((RD_ATOMIC, 0, 0x2C000, 8), (RD_READ, 0, 0x2D000, 256))}
RD_AHEAD = 4
SQ_SPAN = 200               # PSNs "in flight" on each requester
BATCH = 512                 # packets between memory checks, QP resyncs and refills
# jumbo frames (PMTU 4096): receive buffers and READ/ATOMIC slots that hold multi-packet
# messages, laid out so that no two overlap (region 0 ends at 0x303E8); the same bad ones too
RECV_BUFS_JUMBO = {0x000011: ((0, 0x20000, 16384), (0, MR_CHUNK - 700, 9000),
                              (0, 3 * MR_CHUNK + 600, 1000)),
                   0x000012: ((6, 100, 12000), (3, 0, 1000), (6, 2 * MR_CHUNK - 600, 2000)),
                   0x000013: ((0, 0x28000, 8192), (2, 0, 1000), (6, 0, 1000)),
                   0x000015: ((0, 0x4000, 24000), (0, 0xA000, 8000), (3, 0, 1000))}
RD_BUFS_JUMBO = {0x000011: ((RD_READ, 0, 0x2A000, 10000), (RD_ATOMIC, 0, 0x24800, 8),
                            (RD_READ, 0, 3 * MR_CHUNK + 800, 600), (RD_READ, 2, 0, 300)),
                 0x000012: ((RD_READ, 6, 16384, 9000), (RD_ATOMIC, 6, 40000 + 3, 8)),
                 0x000013: ((RD_ATOMIC, 0, 0x25000, 8), (RD_READ, 0, 0x2D000, 5000))}
# the linear part of a BPF_PROG_TEST_RUN frame (the rest goes into page fragments):
# PAGE_SIZE - XDP_PACKET_HEADROOM (256) - SKB_DATA_ALIGN(sizeof(struct skb_shared_info)) (320)
LINEAR_MAX = mmap.PAGESIZE - 256 - 320
SPLIT_SHARE = 0.5           # jumbo: frames whose linear part the harness chooses
FATAL_TX = ("nak_inv_req", "nak_rem_access", "nak_rem_op")
FAULTS = ("guard", "region", "lose_count", "extra_count", "bad_reply", "pass_modified",
          "short_view")


def _pattern(idx: int, n: int, guard: bool = False) -> bytes:
    unit = bytes(((idx * 29 + k * 7) ^ (0xA5 if guard else 0x00)) & 0xFF for k in range(251))
    return (unit * (n // 251 + 1))[:n]


class _Runner:
    """BPF_PROG_TEST_RUN with preallocated options and output buffer (RxPath.run does the
    same call; this one avoids allocating per packet). `linear` (jumbo mode) sets the length
    of the frame's linear part through an xdp_md context; the kernel puts the rest into page
    fragments (kernels from 6.18 take data_end < data_size_in; older ones refuse: EINVAL)."""

    class _Opts(ctypes.Structure):
        _fields_ = [(n, ctypes.c_char_p if n == "data_in" else t)
                    for n, t in libbpf._TestRunOpts._fields_]

    def __init__(self, prog_fd: int, out_size: int = 1 << 17):
        self.fd = prog_fd
        self.out = ctypes.create_string_buffer(out_size)
        self.o = self._Opts(sz=ctypes.sizeof(self._Opts), data_out=ctypes.addressof(self.out),
                            repeat=1)
        self.ref = ctypes.byref(self.o)
        self.call = libbpf.lib().bpf_prog_test_run_opts
        self.size = out_size
        self.ctx = libbpf.XdpMd()
        self.ctx_addr, self.ctx_size = ctypes.addressof(self.ctx), ctypes.sizeof(self.ctx)

    def run(self, frame: bytes, linear: int | None = None) -> int:
        o = self.o
        o.data_in = frame
        o.data_size_in = len(frame)
        o.data_size_out = self.size
        if linear is not None:
            self.ctx.data_end = linear
            o.ctx_in, o.ctx_size_in = self.ctx_addr, self.ctx_size
        elif o.ctx_size_in:
            o.ctx_in, o.ctx_size_in = None, 0
        if self.call(self.fd, self.ref) < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"bpf_prog_test_run_opts: {os.strerror(err)}")
        return o.retval

    def output(self) -> bytes:
        return self.out.raw[:self.o.data_size_out]


class _BatchOpts(ctypes.Structure):
    _fields_ = [("sz", ctypes.c_size_t), ("elem_flags", ctypes.c_uint64),
                ("flags", ctypes.c_uint64)]


class _Counters:
    """A per-CPU counter array read with one batch lookup (RxPath.counters() walks it key by
    key, ~100 us). `read` gives the column of one CPU (the fuzzer runs pinned: a test run
    executes the program on the calling CPU) or the sums."""

    def __init__(self, rx, name: str, n: int):
        self.n, self.ncpu = n, libbpf.possible_cpus()
        self.fd = rx.bpf[name.encode()].map_fd
        self.keys = (ctypes.c_uint32 * n)()
        self.vals = (ctypes.c_uint64 * (n * self.ncpu))()
        self.cnt, self.out = ctypes.c_uint32(), ctypes.c_uint32()
        self.opts = _BatchOpts(sz=ctypes.sizeof(_BatchOpts))
        lib = libbpf.lib()
        lib.bpf_map_lookup_batch.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                             ctypes.c_void_p, ctypes.c_void_p,
                                             ctypes.POINTER(ctypes.c_uint32), ctypes.c_void_p]
        self.call = lib.bpf_map_lookup_batch
        self.args = (self.fd, None, ctypes.byref(self.out), self.keys, self.vals,
                     ctypes.byref(self.cnt), ctypes.byref(self.opts))
        self.cpu = None

    def read(self) -> list[int]:
        self.cnt.value = self.n
        rv = self.call(*self.args)
        if rv < 0 and ctypes.get_errno() != 2 or self.cnt.value != self.n:   # ENOENT: the end
            raise OSError(ctypes.get_errno(), "bpf_map_lookup_batch on the counters")
        v, c = self.vals, self.ncpu
        if c == 1:
            return v[:]
        if self.cpu is not None:
            return v[self.cpu::c]
        return [sum(v[i * c:(i + 1) * c]) for i in range(self.n)]

    def add(self, key: int, delta: int) -> None:
        """Change one CPU's count behind the program's back (fault injection only)."""
        self.read()
        c = self.ncpu
        vals = list(self.vals[key * c:(key + 1) * c])
        vals[self.cpu or 0] += delta
        libbpf.map_update_raw(self.fd, struct.pack("=I", key), struct.pack(f"={c}Q", *vals))


class FastPathFuzzer:
    def __init__(self, seed: int = 1, rx=None, batch: int = BATCH, mtu: int | None = None):
        self.seed = seed
        self.mtu = mtu                     # None: small frames at PMTU 256 (the default)
        self.batch = max(int(batch), 1)
        self.own_rx = rx is None
        self.rx = rx or rxmod.RxPath(max_qps=64, max_mrs=64)
        self.reasons = tuple(rxmod.RX_REASONS)
        self.txnames = tuple(rxmod.TX_COUNTERS)
        self.accept = frozenset(i for i, n in enumerate(self.reasons) if n in ACCEPT_REASONS)
        self.runner = _Runner(self.rx.prog_fd)
        self.rxc = _Counters(self.rx, "rx_counters", len(self.reasons))
        self.txc = _Counters(self.rx, "tx_counters", len(self.txnames))
        self.pcnames = tuple(rxmod.PORT_COUNTERS)
        self.pcc = _Counters(self.rx, "port_counters", len(self.pcnames))
        if mtu is None:
            self.pmtu = self.mr_pmtu = 256     # small packets: more of them per second
            self.max_frame = None
            recv_bufs, rd_bufs = RECV_BUFS, RD_BUFS
        else:                              # jumbo: the path MTU the link MTU allows
            from ..nic.device import largest_fitted_pmtu, largest_pmtu  # noqa: PLC0415
            self.pmtu = largest_pmtu(mtu, 2 * 4096)   # 4096 at 9000 (two AF_XDP chunks)
            self.mr_pmtu = largest_fitted_pmtu(mtu, 2 * 4096)   # 8064 at 9000
            self.max_frame = mtu + F.ETH_LEN
            recv_bufs, rd_bufs = RECV_BUFS_JUMBO, RD_BUFS_JUMBO
        self.recv_bufs, self.rd_bufs = recv_bufs, rd_bufs
        self.srng = random.Random(seed * 7919 + 17)   # the linear parts chosen (jumbo)
        self.regions, self.maps = [], []
        for i, (length, pd, access) in enumerate(REGIONS):
            mr = self.rx.reg_mr(length, pd, access)
            full = mmap.mmap(mr.fd, -(-length // MR_CHUNK) * MR_CHUNK)   # region + guard tail
            full[:length] = _pattern(i, length)
            full[length:] = _pattern(i, len(full) - length, guard=True)
            self.regions.append(Region(i, mr.rkey, mr.addr, length, access, pd))
            self.maps.append(full)
        self.shadow = [bytearray(m[:g.length]) for m, g in zip(self.maps, self.regions)]
        self.guards = [bytes(m[g.length:]) for m, g in zip(self.maps, self.regions)]
        self.by_rkey = {g.rkey: g for g in self.regions}
        self.qps: dict[int, Qp] = {}
        self.peer = {}
        self.rq_posted: dict[int, int] = {}     # qpn -> receive WQEs posted since it was armed
        self.rd_posted: dict[int, int] = {}
        self.rq_live = {q[0]: {} for q in QPS}  # qpn -> {RQ slot: seq} believed in the map
        self.rd_live = {q[0]: {} for q in QPS}  # qpn -> {RD slot: (idx, first, kind, length)}
        self._qps_fd = self.rx.bpf[b"qps"].map_fd
        self._qkey = ctypes.c_uint32()
        self._qleaf = self.rx.bpf[b"qps"].Leaf()
        self._lookup = libbpf.lib().bpf_map_lookup_elem
        self.open_write: dict[int, tuple] = {}  # qpn -> (region, lo, hi) of the WRITE in progress
        # where each QP's SENDs and responses may legitimately land: region -> [(lo, hi)]
        self.recv_spans = {q: self._spans(q, ((b[0], b[1], b[2]) for b in recv_bufs.get(q, ())),
                                          ACCESS_LOCAL_WRITE) for q, *_ in QPS}
        self.resp_spans = {q: self._spans(q, ((b[1], b[2], b[3]) for b in rd_bufs.get(q, ())),
                                          ACCESS_LOCAL_WRITE) for q, *_ in QPS}
        for qpn, pd, epsn, dqpn, peer in QPS:
            mr = qpn in MR_QPS
            self.qps[qpn] = Qp(qpn, pd, dqpn, epsn, una=(epsn + 0x1000) & C.PSN_MASK,
                               pmtu=self.mr_pmtu if mr else 0, metaroce=mr)
            self.peer[qpn] = peer
            self._arm(qpn)
        dead = [(g.rkey + 0x10001) & 0xFFFFFFFF for g in self.regions]
        self.target = Target(self.regions, list(self.qps.values()),
                             [k for k in dead if k not in self.by_rkey], pmtu=self.pmtu,
                             max_frame=self.max_frame, oversize=self.max_frame is not None)
        self.faults: dict[int, str] = {}
        self.can_split = mtu is not None and self._probe_split()

    def _probe_split(self) -> bool:
        """Does this kernel's test run take a linear part shorter than the frame (6.18+)?"""
        try:
            self.runner.run(F.ETH_DST + F.ETH_SRC + b"\x88\xb5" + bytes(300), 100)
            return True
        except OSError:
            return False

    def _spans(self, qpn: int, bufs, need: int) -> dict:
        pd = next(q[1] for q in QPS if q[0] == qpn)
        out: dict = {}
        for idx, off, length in bufs:
            g = self.regions[idx]
            if g.pd == pd and g.access & need:
                out.setdefault(idx, []).append((off, off + length))
        return out

    # -- QP state -------------------------------------------------------------------------------
    def _arm(self, qpn: int) -> None:
        """(Re)start a QP in RTR/RTS at the PSNs it expects, with fresh receive WQEs and
        outstanding READ/ATOMIC slots; after a fatal NAK it sits in ERR until this runs."""
        q = self.qps[qpn]
        q.rd_head = 0
        self.rx.set_qp(qpn, q.epsn, q.pd, q.dqpn, pmtu=q.pmtu or self.pmtu, sq_psn=q.una,
                       peer_ip=self.peer[qpn], integrity=1 if qpn in CSUM_QPS else 0,
                       metaroce=q.metaroce)
        q.sq_psn = (q.una + SQ_SPAN) & C.PSN_MASK
        self.rx.set_sq_psn(qpn, q.sq_psn)
        self.open_write.pop(qpn, None)
        self.rq_posted[qpn] = 0
        self.rd_posted[qpn] = 0
        # the receives it consumed stay consumed (set_qp keeps the ring's head): post from
        # there, or it would see none (RNR) until the batch ends
        st = self._qp_raw(qpn)
        self._refill(qpn, st.rq_head if st is not None else 0, 0)

    def _refill(self, qpn: int, rq_head: int, rd_head: int) -> None:
        """Keep RQ_AHEAD receive WQEs and RD_AHEAD outstanding requests posted past the heads."""
        bufs = self.recv_bufs.get(qpn, ())
        if bufs:
            seq = max(self.rq_posted[qpn], rq_head)
            live = self.rq_live[qpn]
            while seq < rq_head + RQ_AHEAD:
                slot = seq % rxmod.RQ_DEPTH
                if live.get(slot) != seq:       # not posted since the QP was armed, or consumed
                    idx, off, length = bufs[seq % len(bufs)]
                    g = self.regions[idx]
                    self.rx.post_recv(qpn, seq, wr_id=seq, addr=g.addr + off, lkey=g.rkey,
                                      length=length)
                    live[slot] = seq
                seq += 1
            self.rq_posted[qpn] = seq
        slots = self.rd_bufs.get(qpn, ())
        if slots:
            q = self.qps[qpn]
            i = max(self.rd_posted[qpn], rd_head)
            live = self.rd_live[qpn]
            while i < rd_head + RD_AHEAD:
                slot = i % rxmod.RD_DEPTH
                if slot not in live or live[slot][0] != i:   # slots stay until overwritten
                    kind, idx, off, length = slots[i % len(slots)]
                    g = self.regions[idx]
                    first = (q.una + 16 * (i % RD_AHEAD)) & C.PSN_MASK
                    self.rx.set_rd_slot(qpn, i, wr_id=i, addr=g.addr + off, length=length,
                                        lkey=g.rkey, first_psn=first, kind=kind)
                    live[slot] = (i, first, kind, length)
                i += 1
            q.slots = [live[j % rxmod.RD_DEPTH][1:] for j in range(rd_head, rd_head + RD_AHEAD)]
            self.rd_posted[qpn] = i

    def _qp_raw(self, qpn: int):
        """The QP's map entry (struct nic_qp, BCC's ctypes layout), one syscall."""
        self._qkey.value = qpn
        if self._lookup(self._qps_fd, ctypes.byref(self._qkey), ctypes.byref(self._qleaf)) < 0:
            return None
        return self._qleaf

    def _resync(self, qpn: int):
        st = self._qp_raw(qpn)
        if st is None:
            return None
        q = self.qps[qpn]
        q.epsn = st.epsn & C.PSN_MASK
        q.una = st.una & C.PSN_MASK
        q.rd_head = st.rd_head
        gone = self.rq_live[qpn]
        for slot in [s for s, seq in gone.items() if seq < st.rq_head]:
            del gone[slot]                  # consumed: the program deleted it
        return st

    def _batch_end(self) -> None:
        for qpn in self.qps:
            st = self._resync(qpn)
            if st is not None:
                self._refill(qpn, st.rq_head, st.rd_head)

    # -- the memory model -------------------------------------------------------------------------
    def _allow(self, allowed: dict, frame: bytes, b: tuple) -> None:
        """Record where an accepted packet may have written."""
        bth, op, qpn, _psn = b
        q = self.qps.get(qpn)
        if q is None:
            return
        offs = F.header_offsets(op)
        h = bth + F.BTH_LEN
        if op in RETH_WRITE_OPS and "RETH" in offs:
            va, rkey, dma = struct.unpack_from("!QII", frame, h + offs["RETH"])
            g = self.by_rkey.get(rkey)
            if g and g.pd == q.pd and g.access & ACCESS_REMOTE_WRITE:
                lo = va - g.addr
                hi = lo + max(dma, len(frame))
                allowed.setdefault(g.idx, []).append((lo, hi))
                self.open_write[qpn] = (g.idx, lo, hi)
        elif op in CONT_WRITE_OPS and qpn in self.open_write:
            idx, lo, hi = self.open_write[qpn]
            allowed.setdefault(idx, []).append((lo, hi))
        elif op in ATOMIC_OPS and "AtomicETH" in offs:
            va, rkey = struct.unpack_from("!QI", frame, h + offs["AtomicETH"])
            g = self.by_rkey.get(rkey)
            if g and g.pd == q.pd and g.access & ACCESS_REMOTE_ATOMIC:
                allowed.setdefault(g.idx, []).append((va - g.addr, va - g.addr + 8))
        if "SEND" in C.OPCODE_NAMES.get(op, ""):
            for idx, spans in self.recv_spans[qpn].items():
                allowed.setdefault(idx, []).extend(spans)
        elif op in RESPONSE_OPS:
            for idx, spans in self.resp_spans[qpn].items():
                allowed.setdefault(idx, []).extend(spans)

    def _check_memory(self, allowed: dict, stats: dict) -> None:
        for g, m, shadow, guard in zip(self.regions, self.maps, self.shadow, self.guards):
            if m[g.length:] != guard:
                cur = m[g.length:]
                n = sum(1 for a, b in zip(cur, guard) if a != b)
                stats["guard_bytes_changed"] += n
                stats["out_of_region_writes"] += n
                self._fail(stats, f"region {g.idx}: {n} guard bytes past length {g.length} changed")
                m[g.length:] = guard
            if m[:g.length] == shadow:
                continue
            spans = sorted((max(lo, 0), min(hi, g.length)) for lo, hi in allowed.get(g.idx, ())
                           if hi > 0 and lo < g.length)
            pos = 0
            for lo, hi in spans + [(g.length, g.length)]:
                if lo > pos and m[pos:lo] != shadow[pos:lo]:
                    cur = m[pos:lo]
                    bad = [pos + i for i, (a, b) in enumerate(zip(cur, shadow[pos:lo])) if a != b]
                    stats["out_of_region_writes"] += len(bad)
                    self._fail(stats, f"region {g.idx} (pd {g.pd}, access {g.access}): "
                                      f"{len(bad)} bytes changed outside any accepted packet's "
                                      f"target, first at offset {bad[0]}")
                    shadow[pos:lo] = cur
                pos = max(pos, hi)
            for lo, hi in spans:
                shadow[lo:hi] = m[lo:hi]
        allowed.clear()

    @staticmethod
    def _fail(stats: dict, msg: str) -> None:
        stats["violations"] += 1
        if len(stats["failures"]) < 20:
            stats["failures"].append(msg)

    def _inject(self, kind: str, frame_reason: int | None) -> None:
        """Deliberate damage, to prove the checks see it (tests only)."""
        if kind == "guard":
            g = next(g for g, m in zip(self.regions, self.maps) if len(m) > g.length)
            self.maps[g.idx][g.length + 5] ^= 0x5A
        elif kind == "region":                         # a region nobody may write remotely
            g = next(g for g in self.regions if not g.access & (ACCESS_REMOTE_WRITE |
                                                                ACCESS_LOCAL_WRITE |
                                                                ACCESS_REMOTE_ATOMIC))
            self.maps[g.idx][g.length // 2] ^= 0x3C
        elif kind == "lose_count":
            self.rxc.add(frame_reason if frame_reason is not None else 0, -1)
        elif kind == "extra_count":
            self.rxc.add(self.reasons.index("not_roce"), 1)
        elif kind == "short_view":                     # the program "saw" a byte less
            self.pcc.add(self.pcnames.index("rcv_bytes"), -1)
        else:
            raise ValueError(f"unknown fault {kind!r} (one of {', '.join(FAULTS)})")

    def _split(self, frame: bytes) -> int | None:
        """The linear part of the frame's xdp_buff (jumbo mode): None for the kernel's own
        (min(length, LINEAR_MAX)), else at or near a header edge, or anywhere."""
        r = self.srng
        n = len(frame)
        if n <= F.ETH_LEN or r.random() >= SPLIT_SHARE:
            return None
        b = F.l4_bounds(frame)
        if b is not None and r.random() < 0.75:
            _v, bth, end = b
            pay = bth + F.BTH_LEN + F.header_offsets(frame[bth])["_end"]
            if r.random() < 0.35:          # a header straddles (the program must refuse it)
                edge = r.choice((F.ETH_LEN, bth - F.UDP_LEN, bth, bth + F.BTH_LEN, pay))
            else:                          # the payload, an ICRC chunk or the ICRC straddles
                edge = r.choice((end - F.ICRC_LEN, end, 128, 256, pay + 256 * r.randrange(1, 17)))
            at = edge + r.choice((0, 0, 0, -1, 1, -2, 2, -3, 3, -4, 4, -8, 8, 64, 1000))
        else:
            at = r.randrange(F.ETH_LEN, n + 1)
        return max(F.ETH_LEN, min(at, n, LINEAR_MAX))

    def _check_views(self, pc_prev: list, view: dict, st: dict) -> list:
        """The program's port counters against what it was handed since pc_prev: the bytes of
        the frames it parsed as RoCE and how many of them came in fragments."""
        now = self.pcc.read()
        names = self.pcnames
        got = now[names.index("rcv_bytes")] - pc_prev[names.index("rcv_bytes")]
        if view["dirty"]:
            pass                           # a packet with no single reason: reported already
        elif got != view["bytes"]:
            st["short_views"] += 1
            self._fail(st, f"the program saw {got} bytes of the RoCE frames it was handed, "
                           f"they were {view['bytes']} bytes long")
        if "rcv_multi_buf" in names:
            i = names.index("rcv_multi_buf")
            got = now[i] - pc_prev[i]
            st["multi_seen"] += got
            if not view["dirty"] and got != view["multi"]:
                st["short_views"] += 1
                self._fail(st, f"the program counted {got} multi-buffer frames, "
                               f"{view['multi']} were handed over in fragments")
        view.update(bytes=0, multi=0, dirty=False)
        return now

    # -- the run ----------------------------------------------------------------------------------
    def run(self, packets: int, time_limit_s: float | None = None, progress=None,
            faults: dict[int, str] | None = None) -> dict:
        """Run `packets` packets; `progress(done, elapsed)` is called every few thousand;
        `faults` maps a packet number to a deliberate fault applied right after it (tests)."""
        reasons, txnames, accept = self.reasons, self.txnames, self.accept
        nr, nt = len(reasons), len(txnames)
        faults = dict(faults or {})
        by_reason = [0] * nr
        tx_by = [0] * nt
        actions: dict = {}
        st = {"out_of_region_writes": 0, "guard_bytes_changed": 0, "violations": 0,
              "failures": [], "crashes": 0, "bad_retval": 0, "unaccounted": 0,
              "double_counted": 0, "bad_replies": 0, "pass_modified": 0, "pass_mismatch": 0,
              "rearms": 0, "short_views": 0, "multi_seen": 0}
        # jumbo: frames handed over in fragments (whatever the verdict), those accepted, passed
        mb = {"frames": 0, "accepted": 0, "passed": 0, "split": 0, "largest": 0}
        mb_work: dict = {}                     # accepted multi-buffer frames by kind of work
        mr_work: dict = {}                     # MetaRoCE QPs' accepted MR_* packets, by work
        mr_big = 0                             # ... of them with payloads past the IB enum's 4096
        view = {"bytes": 0, "multi": 0, "dirty": False}   # since the last port-counter check
        jumbo = self.max_frame is not None
        split = self._split if self.can_split else (lambda _f: None)
        cat = {"accepted": 0, "passed": 0, "tx": 0, "dropped": 0}
        refused = [[0, 0] for _ in range(nr)]       # per reason: [dropped, answered]
        start_totals = self.rx.counters()
        old_affinity = os.sched_getaffinity(0)
        cpu = min(old_affinity)
        os.sched_setaffinity(0, {cpu})
        self.rxc.cpu = self.txc.cpu = self.pcc.cpu = cpu
        done = 0
        t0 = time.perf_counter()
        try:
            rx_prev, tx_prev = self.rxc.read(), self.txc.read()
            pc_prev = self.pcc.read()
            allowed: dict = {}
            gen = iter(Generator(self.target, self.seed))
            run, output, rxread, txread = self.runner.run, self.runner.output, self.rxc.read, \
                self.txc.read
            not_roce = reasons.index("not_roce")
            fatal_tx = frozenset(i for i, n in enumerate(txnames) if n in FATAL_TX)
            bth_fields, icrc_valid = F.bth_fields, F.icrc_valid
            qps = self.qps
            rng = range(nr)
            lazy_qp = QPS[-1][0]                # left in ERR for a while after a fatal NAK
            lazy_errors = 0
            corrupt = None                      # fault injection: damage the next such output
            qp_error = reasons.index("qp_error")
            resync_ops = frozenset(RESPONSE_OPS) | {C.Opcode.RC_RDMA_READ_REQUEST}
            resp_reasons = frozenset(reasons.index(r) for r in ("mr_bounds", "mr_access",
                                                                 "bad_rkey", "invalid_request")
                                     if r in reasons)
            next_check = min(self.batch, packets)
            next_progress = 50000
            while done < packets:
                frame = next(gen)
                done += 1
                linear = split(frame) if jumbo else None
                try:
                    rc = run(frame, linear)
                except OSError as exc:
                    st["crashes"] += 1
                    st["unaccounted"] += 1
                    self._fail(st, f"test run failed on a {len(frame)}-byte frame: {exc}")
                    continue
                if faults and done in faults and faults[done] in ("lose_count", "extra_count"):
                    now = rxread()
                    moved_now = [i for i in rng if now[i] != rx_prev[i]]
                    self._inject(faults.pop(done), moved_now[0] if moved_now else None)
                rx_now = rxread()
                moved = [i for i in rng if rx_now[i] != rx_prev[i]]
                if len(moved) == 1 and rx_now[moved[0]] - rx_prev[moved[0]] == 1:
                    reason = moved[0]
                else:
                    total = sum(rx_now[i] - rx_prev[i] for i in moved)
                    st["unaccounted"] += 1
                    if total > 1:
                        st["double_counted"] += 1
                    self._fail(st, f"{total} receive counts ({[reasons[i] for i in moved]}) for "
                                   f"one packet, return code {rc}: {frame.hex()[:120]}")
                    for i in moved:
                        by_reason[i] += rx_now[i] - rx_prev[i]
                    rx_prev = rx_now
                    view["dirty"] = True
                    continue
                rx_prev = rx_now
                by_reason[reason] += 1
                n = len(frame)
                multi = n > (min(n, LINEAR_MAX) if linear is None else linear)
                if reason != not_roce:         # parsed as RoCE: the program counts its bytes
                    view["bytes"] += n
                    view["multi"] += multi
                if multi:
                    mb["frames"] += 1
                    mb["accepted"] += reason in accept
                    mb["passed"] += rc == XDP_PASS
                mb["split"] += linear is not None and linear < n
                if n > mb["largest"]:
                    mb["largest"] = n
                key = (reason, rc)
                actions[key] = actions.get(key, 0) + 1
                fatal = False
                if rc == XDP_TX:
                    tx_now = txread()
                    tmoved = [i for i in range(nt) if tx_now[i] != tx_prev[i]]
                    if len(tmoved) != 1 or tx_now[tmoved[0]] - tx_prev[tmoved[0]] != 1:
                        st["unaccounted"] += 1
                        self._fail(st, f"XDP_TX ({reasons[reason]}) but reply counters moved: "
                                       f"{[txnames[i] for i in tmoved]}")
                    for i in tmoved:
                        tx_by[i] += tx_now[i] - tx_prev[i]
                        fatal = fatal or i in fatal_tx
                    tx_prev = tx_now
                    out = output()
                    if corrupt == XDP_TX:             # fault injection: a damaged reply
                        out, corrupt = _flip(out), None
                    if not icrc_valid(out):
                        st["bad_replies"] += 1
                        self._fail(st, f"reply with a bad ICRC: {out.hex()[:160]} to a "
                                       f"{len(frame)}-byte frame (linear part {linear}): "
                                       f"{frame.hex()[:240]}")
                    else:
                        to = bth_fields(frame)
                        if to is not None and to[2] in CSUM_QPS and \
                                udp_checksum_ok(out) is not True:
                            st["bad_replies"] += 1    # INT-2: a CSUM QP's replies carry both
                            self._fail(st, f"a CSUM QP's reply without valid IPv4/UDP "
                                           f"checksums: {out.hex()[:160]}")
                elif rc == XDP_PASS:
                    if reason != not_roce:
                        st["pass_mismatch"] += 1
                        self._fail(st, f"XDP_PASS counted as {reasons[reason]}")
                    elif (_flip(output()) if corrupt == XDP_PASS else output()) != frame:
                        corrupt = None
                        st["pass_modified"] += 1
                        self._fail(st, "a frame that is not RoCE was changed on its way to "
                                       "the stack")
                elif rc != XDP_DROP:
                    st["bad_retval"] += 1
                    self._fail(st, f"return code {rc} ({reasons[reason]}) on {frame.hex()[:120]}")
                if rc != XDP_PASS and reason == not_roce:
                    st["pass_mismatch"] += 1
                    self._fail(st, f"not_roce counted but return code {rc}")
                if reason in accept:
                    cat["accepted"] += 1
                    b = bth_fields(frame)
                    if multi and b:                    # which work came in fragments
                        k = _work(b[1])
                        mb_work[k] = mb_work.get(k, 0) + 1
                    if b and b[2] in MR_QPS and b[1] >= 0xC0:
                        k = _work(b[1])
                        mr_work[k] = mr_work.get(k, 0) + 1
                        mr_big += (F.payload_len(frame) or 0) > 4096
                    if b and b[2] in qps:
                        self._allow(allowed, frame, b)
                        if b[1] in resync_ops:               # READ: epsn moves by its packets
                            self._resync(b[2])
                        else:
                            qps[b[2]].epsn = (b[3] + 1) & C.PSN_MASK
                elif rc == XDP_PASS:
                    cat["passed"] += 1
                else:
                    if rc == XDP_TX:
                        cat["tx"] += 1
                        refused[reason][1] += 1
                    else:
                        cat["dropped"] += 1
                        refused[reason][0] += 1
                    if fatal or reason == qp_error or rc == XDP_DROP and reason in resp_reasons:
                        b = bth_fields(frame)
                        if b and b[2] in qps:
                            if reason == qp_error:            # only the lazy QP stays in ERR
                                lazy_errors += 1
                                if lazy_errors >= LAZY_ERRORS:
                                    lazy_errors = 0
                                    self._resync(b[2])
                                    self._arm(b[2])
                                    st["rearms"] += 1
                            elif fatal and b[2] != lazy_qp:
                                self._resync(b[2])
                                self._arm(b[2])
                                st["rearms"] += 1
                            elif b[1] in RESPONSE_OPS:       # a failed response ends its slot
                                self._resync(b[2])
                if faults and done in faults:
                    kind = faults.pop(done)
                    if kind in ("bad_reply", "pass_modified"):   # the next reply / passed frame
                        corrupt = XDP_TX if kind == "bad_reply" else XDP_PASS
                    else:
                        self._inject(kind, reason)
                if done >= next_check:
                    next_check = min(next_check + self.batch, packets)
                    self._check_memory(allowed, st)
                    pc_prev = self._check_views(pc_prev, view, st)
                    tx_now = txread()
                    if tx_now != tx_prev:
                        st["unaccounted"] += 1
                        self._fail(st, "reply counters moved on packets that were not XDP_TX")
                        tx_by = [a + n - p for a, n, p in zip(tx_by, tx_now, tx_prev)]
                    tx_prev = tx_now
                    self._batch_end()
                    if progress and done >= next_progress:
                        next_progress += 50000
                        progress(done, time.perf_counter() - t0)
                    if time_limit_s and time.perf_counter() - t0 > time_limit_s:
                        break
            elapsed = time.perf_counter() - t0
        finally:
            os.sched_setaffinity(0, old_affinity)
            self.rxc.cpu = self.txc.cpu = self.pcc.cpu = None
        self._check_memory(allowed, st)
        end_totals = self.rx.counters()
        # the per-packet attribution must add up to what RxPath.counters() says
        for i, name in enumerate(reasons):
            d = end_totals.get(name, 0) - start_totals.get(name, 0)
            if d != by_reason[i]:
                self._fail(st, f"counter {name}: RxPath.counters() moved {d}, packets "
                               f"attributed {by_reason[i]}")
        for i, name in enumerate(txnames):
            d = end_totals.get(f"tx_{name}", 0) - start_totals.get(f"tx_{name}", 0)
            if d != tx_by[i]:
                self._fail(st, f"counter tx_{name}: moved {d}, replies attributed {tx_by[i]}")
        final_ok = self._final_write(st)
        for qpn in self.qps:                       # leave every QP usable for another run
            self._resync(qpn)
            self._arm(qpn)
        refused_by = {reasons[i]: sum(refused[i]) for i in range(nr) if sum(refused[i])}
        deep_hits = {r: refused_by.get(r, 0) for r in DEEP_REASONS if r in reasons}
        res = {
            "ok": False,
            "packets": done,
            "accepted": cat["accepted"], "passed": cat["passed"], "tx": cat["tx"],
            "dropped": cat["dropped"],
            "unaccounted": st["unaccounted"],
            "out_of_region_writes": st["out_of_region_writes"],
            "guard_bytes_changed": st["guard_bytes_changed"],
            "crashes": st["crashes"],
            "bad_retval": st["bad_retval"],
            "bad_replies": st["bad_replies"],
            "pass_modified": st["pass_modified"],
            "pass_mismatch": st["pass_mismatch"],
            "double_counted": st["double_counted"],
            "violations": st["violations"],
            "final_write_ok": final_ok,
            "mtu": self.mtu, "pmtu": self.pmtu, "max_frame": self.max_frame,
            # the MetaRoCE-mode QP (fitted path MTU, CM-14): its MR_* requests accepted
            "pmtu_metaroce": self.mr_pmtu,
            "metaroce_accepted_by_work": _desc(mr_work),
            "metaroce_accepted_past_4096": mr_big,
            # frames longer than their linear part: the program got them in fragments
            "multi_buffer_frames": mb["frames"],
            "multi_buffer_accepted": mb["accepted"], "multi_buffer_passed": mb["passed"],
            "multi_buffer_accepted_by_work": _desc(mb_work),
            # ... as the program counted them (port counter rcv_multi_buf)
            "multi_buffer_seen": st["multi_seen"] if "rcv_multi_buf" in self.pcnames else None,
            "linear_splits": mb["split"] if self.can_split or not jumbo else None,
            "largest_frame": mb["largest"],
            "short_views": st["short_views"],
            # silently dropped packets by reason (sums to `dropped`)
            "drops_by_reason": _desc({reasons[i]: refused[i][0] for i in range(nr)}),
            # refused packets answered with a NAK / RNR NAK / re-ACK / CNP (sums to `tx`)
            "tx_by_reason": _desc({reasons[i]: refused[i][1] for i in range(nr)}),
            "refused_by_reason": _desc(refused_by),
            "accepted_by_reason": _desc({reasons[i]: by_reason[i] for i in accept}),
            "replies": _desc({txnames[i]: tx_by[i] for i in range(nt)}),
            "actions_by_reason": _actions(actions, reasons),
            "deep_reasons": deep_hits,
            "deep_reasons_missing": [r for r, n in deep_hits.items() if n == 0],
            "qp_rearms": st["rearms"],
            "seed": self.seed,
            "elapsed_s": round(elapsed, 3),
            "packets_per_s": round(done / elapsed) if elapsed else 0,
            "regions": [{"length": g.length, "pd": g.pd, "access": g.access,
                         "guard_bytes": len(m) - g.length}
                        for g, m in zip(self.regions, self.maps)],
            "failures": st["failures"],
        }
        total = res["accepted"] + res["passed"] + res["tx"] + res["dropped"] + res["unaccounted"]
        if total != done:
            self._fail(st, f"{done} packets but {total} accounted for")
            res["failures"] = st["failures"]
        res["violations"] = st["violations"]
        if self.max_frame is not None and done >= 1000 and not (mb["frames"] and mb["accepted"]):
            self._fail(st, f"jumbo frames but {mb['frames']} multi-buffer frames "
                           f"({mb['accepted']} accepted): the fragments path did not run")
            res["failures"] = st["failures"]
        res["ok"] = total == done and st["unaccounted"] == 0 and st["violations"] == 0 and final_ok
        return res

    def _final_write(self, stats: dict) -> bool:
        """A valid WRITE_ONLY after everything: placed, and exactly where it was aimed."""
        g = self.regions[0]
        qpn = QPS[0][0]
        self._resync(qpn)
        self._arm(qpn)
        q = self.qps[qpn]
        n = 200 if self.max_frame is None else self.pmtu   # jumbo: a multi-buffer frame
        data = bytes((i * 13 + 5) & 0xFF for i in range(n))
        off = 4096 + 3
        frame = bytes(F.assemble(False, C.Opcode.RC_RDMA_WRITE_ONLY, qpn, q.epsn,
                                 struct.pack("!QII", g.addr + off, g.rkey, len(data)), data,
                                 ackreq=1))
        before = self.rx.counters()
        rc, out, _ = self.rx.run(frame)
        after = self.rx.counters()
        delta = {k: after[k] - before[k] for k in after if after[k] != before[k]}
        m = self.maps[0]
        changed = bytes(m[:g.length]) != bytes(self.shadow[0][:off]) + data + \
            bytes(self.shadow[0][off + n:])
        ok = (rc == XDP_TX and delta == {"placed": 1, "tx_ack": 1} and not changed
              and F.icrc_valid(out))
        if not ok:
            self._fail(stats, f"the final valid WRITE was not placed exactly: rc {rc}, "
                              f"counters {delta}, other bytes changed: {changed}")
        self.shadow[0][off:off + n] = data
        q.epsn = (q.epsn + 1) & C.PSN_MASK
        return ok

    def close(self) -> None:
        for m in self.maps:
            m.close()
        self.maps = []
        if self.own_rx:
            self.rx.close()


def _work(op: int) -> str:
    """What an accepted packet of opcode op did: write, send, read_response, atomic, ..."""
    name = C.OPCODE_NAMES.get(op, "")
    for key, kind in (("READ_RESPONSE", "read_response"), ("READ_REQUEST", "read_request"),
                      ("WRITE", "write"), ("SEND", "send"), ("ATOMIC_ACK", "atomic_ack"),
                      ("ACK", "ack"), ("CNP", "cnp")):
        if key in name:
            return kind
    return "atomic" if op in ATOMIC_OPS else name.lower() or f"0x{op:02x}"


def _flip(b: bytes) -> bytes:
    return b[:-1] + bytes([b[-1] ^ 0x01]) if b else b"\x01"


def _desc(d: dict) -> dict:
    return dict(sorted(((k, v) for k, v in d.items() if v), key=lambda kv: -kv[1]))


def _actions(actions: dict, reasons) -> dict:
    names = {XDP_DROP: "drop", XDP_PASS: "pass", XDP_TX: "tx"}
    out: dict = {}
    for (reason, rc), n in sorted(actions.items()):
        out.setdefault(reasons[reason], {})[names.get(rc, str(rc))] = n
    return out


def load_fuzzer(seed: int = 1, retries: int = 3, retry_wait_s: float = 20.0,
                mtu: int | None = None) -> FastPathFuzzer:
    """Load the program (retrying while it does not compile: bpf/ may be mid-edit)."""
    last = None
    for attempt in range(retries):
        try:
            return FastPathFuzzer(seed, mtu=mtu)
        except Exception as exc:  # noqa: BLE001 (BCC raises plain Exception on compile errors)
            last = exc
            if attempt + 1 < retries:
                time.sleep(retry_wait_s)
    raise MetaroceError(f"the NIC program does not load: {' '.join(str(last).split())[:300]}")


def fuzz_fastpath(packets: int, seed: int = 1, time_limit_s: float | None = None,
                  progress=None, faults: dict[int, str] | None = None, retries: int = 3,
                  mtu: int | None = None) -> dict:
    """Load the program, fuzz it with `packets` packets (jumbo frames with `mtu`), return the
    report."""
    fz = load_fuzzer(seed, retries, mtu=mtu)
    try:
        return fz.run(packets, time_limit_s, progress, faults)
    finally:
        fz.close()
