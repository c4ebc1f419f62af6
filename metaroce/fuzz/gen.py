"""Packet generator and mutator for fuzzing the NIC's fast path.

Valid packets of every opcode the codec knows are built against the fuzzer's live QPs and
registered regions, then mutated: header fields (opcode, QPN, PSN, pad, flags, P_Key), RETH and
AtomicETH (rkey, VA, DMA length) with an eye on region and chunk edges, payload and UDP/IP
lengths (truncations, length lies, trailing bytes), random byte flips, and frames that are not
RoCE at all. Most mutants get their ICRC recomputed so they reach the checks behind it (PSN
window, opcode sequence, rkey, PD, access, bounds); some keep a valid rkey and the expected PSN
and lie only about lengths or offsets near region edges.

With a frame limit (`Target.max_frame`, jumbo frames: the fuzzers' --mtu) frames grow to it:
random frames, trailing bytes and payload changes scale with it, and a `jumbo` kind adds frames
only a large MTU carries (payloads past the path MTU, a full-MTU datagram padded to the frame
limit, UDP and IP lengths that disagree with each other or with the frame, and with
`Target.oversize` frames past the limit)."""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass, field

from ..wire import consts as C
from ..wire.headers import PETH, AtomicETH, RETH
from ..wire.layout import LAYOUTS
from ..wire.samples import sample_packet
from . import frames as F

MR_CHUNK = 65536
ACCESS_REMOTE_WRITE, ACCESS_REMOTE_ATOMIC = 2, 8
O = C.Opcode
OPCODES = tuple(sorted(LAYOUTS))
WRITE_OPS = (O.RC_RDMA_WRITE_FIRST, O.RC_RDMA_WRITE_MIDDLE, O.RC_RDMA_WRITE_LAST,
             O.RC_RDMA_WRITE_LAST_WITH_IMMEDIATE, O.RC_RDMA_WRITE_ONLY,
             O.RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE)
SEND_OPS = (O.RC_SEND_FIRST, O.RC_SEND_MIDDLE, O.RC_SEND_LAST, O.RC_SEND_LAST_WITH_IMMEDIATE,
            O.RC_SEND_ONLY, O.RC_SEND_ONLY_WITH_IMMEDIATE, O.RC_SEND_LAST_WITH_INVALIDATE,
            O.RC_SEND_ONLY_WITH_INVALIDATE)
ATOMIC_OPS = (O.RC_COMPARE_SWAP, O.RC_FETCH_ADD, O.MR_COMPARE_SWAP, O.MR_FETCH_ADD)
# opcodes whose RETH (if any) names where the payload goes; MetaRoCE ones carry it in every packet
RETH_WRITE_OPS = frozenset(op for op in OPCODES if "RDMA_WRITE" in C.OPCODE_NAMES[op] and
                           "RETH" in F.header_offsets(op))
CONT_WRITE_OPS = (frozenset(op for op in OPCODES if "RDMA_WRITE" in C.OPCODE_NAMES[op])
                  - RETH_WRITE_OPS)
# a compat request opcode -> its MetaRoCE twin (PETH first, PLACE-1); requests carry a PETH
# the generator fills per packet (responses keep the sample's)
_MR_OF = {op: op | 0xC0 for op in OPCODES if op < 0x20 and (op | 0xC0) in LAYOUTS and
          "RESPONSE" not in C.OPCODE_NAMES[op] and "ACKNOWLEDGE" not in C.OPCODE_NAMES[op]}
MR_REQUEST_OPS = frozenset(_MR_OF.values())


@dataclass
class Region:
    idx: int
    rkey: int
    addr: int
    length: int
    access: int
    pd: int


@dataclass
class Qp:
    qpn: int
    pd: int
    dqpn: int
    epsn: int
    una: int = 0                      # requester side: oldest PSN not acknowledged
    sq_psn: int = 0                   # requester side: next PSN it would send
    rd_head: int = 0                  # outstanding READ/ATOMIC the next response answers
    slots: list = field(default_factory=list)   # (first_psn, kind, length) per RD slot
    pmtu: int = 0                     # its path MTU (0: the target's); a MetaRoCE QP's may be
                                      # a fitted one (CM-14), beyond the IB enum's 4096
    metaroce: bool = False            # MetaRoCE mode: most of its requests are MR_* opcodes
    rsn: int = 0                      # MetaRoCE: the first receive WQE number its SENDs may
                                      # name (the ring's consumer index: nothing completes
                                      # receives in the fuzzers, so it stays where it began)


@dataclass
class Target:
    """What a generator knows about the NIC it feeds: regions, QPs (with the PSN each
    expects next, kept current by the harness), rkeys that name nothing, the path MTU."""
    regions: list[Region]
    qps: list[Qp]
    dead_rkeys: list[int]
    pmtu: int = 1024
    unknown_qpns: list[int] = field(default_factory=lambda: [0, 0x3FF, 0xFFFFFF, 0x000777])
    max_frame: int | None = None      # jumbo: the largest frame (link MTU + Ethernet header)
    oversize: bool = False            # jumbo: some frames past max_frame (BPF_PROG_TEST_RUN only)


MR_SHARE = 0.9            # a MetaRoCE QP's requests in MetaRoCE opcodes (the rest: wrong mode)

# weights of the kinds of packet in the stream
KINDS = (("valid", 12), ("sequence", 6), ("field", 34), ("edge", 18), ("flip_no_icrc", 8),
         ("truncate", 8), ("random", 5), ("not_roce", 7), ("response", 6))
JUMBO_KINDS = KINDS + (("jumbo", 10),)
RESPONSE_OPS = (O.RC_RDMA_READ_RESPONSE_FIRST, O.RC_RDMA_READ_RESPONSE_MIDDLE,
                O.RC_RDMA_READ_RESPONSE_LAST, O.RC_RDMA_READ_RESPONSE_ONLY,
                O.RC_ACKNOWLEDGE, O.RC_ATOMIC_ACKNOWLEDGE)
RD_READ, RD_ATOMIC = 1, 2


class Generator:
    """An endless stream of frames (bytes); deterministic for a seed and the verdicts fed back
    (the PSNs it uses follow the QPs' state, which the harness keeps current)."""

    def __init__(self, target: Target, seed: int):
        self.t = target
        self.rng = random.Random(seed)
        r = self.rng
        self.noise = bytes(r.getrandbits(8) for _ in range(1 << 16)) * 2   # payload pool
        self.fixed = {}       # opcode -> packed headers other than RETH/AtomicETH/a request's PETH
        for op in OPCODES:
            sp = sample_packet(op, 4, 1)
            self.fixed[op] = [None if isinstance(h, (RETH, AtomicETH)) else
                              PETH if isinstance(h, PETH) and op in MR_REQUEST_OPS else h.pack()
                              for h in sp.headers]
        self.big = target.max_frame or 1600        # the largest frame a random one may be
        kinds, weights = zip(*(JUMBO_KINDS if target.max_frame else KINDS))
        self._kind_pool = r.choices(kinds, weights, k=4096)
        self._ki = 0
        self.writable = [g for g in target.regions if g.access & ACCESS_REMOTE_WRITE]
        self._deltas = (-1, -3, -4, -8, 1, 3, 4, 8, 64, -64) + \
            ((-1024, 1024, -4096, 4096, 4097, -4093) if target.max_frame else ())

    # -- pieces ------------------------------------------------------------------------------
    def _payload(self, n: int) -> bytes:
        o = self.rng.randrange(0, 1 << 16)
        return self.noise[o:o + n] if n <= 1 << 16 else bytes(n)

    def _region_for(self, qp: Qp, need: int) -> Region:
        r = self.rng
        good = [g for g in self.t.regions if g.pd == qp.pd and g.access & need]
        if good and r.random() < 0.8:
            return r.choice(good)
        return r.choice(self.t.regions)

    def _edge_offset(self, g: Region) -> int:
        """An offset into (or just around) a region where bounds checks are easy to get wrong."""
        r = self.rng
        pts = [0, g.length, g.length - 1, max(g.length - 64, 0)]
        pts += [k * MR_CHUNK for k in range(1, g.length // MR_CHUNK + 1)]
        base = r.choice(pts)
        return base + r.choice((0, 0, -1, 1, -3, -4, -8, 4, 8, -16, 16, -256, -1024,
                                r.randrange(-2048, 2048)))

    def _reth(self, qp: Qp, op: int, length: int, edge: bool = False) -> bytes:
        r = self.rng
        read = op in (O.RC_RDMA_READ_REQUEST, O.MR_RDMA_READ_REQUEST)
        g = self._region_for(qp, 4 if read else ACCESS_REMOTE_WRITE)
        if edge:
            off = self._edge_offset(g)
        else:
            span = max(g.length - length, 0)
            off = r.randrange(0, span + 1) if r.random() < 0.5 else min(r.randrange(0, 4096), span)
        rkey = g.rkey
        if edge and self.t.dead_rkeys and r.random() < 0.15:   # a key that names nothing
            rkey = r.choice(self.t.dead_rkeys)
        return struct.pack("!QII", (g.addr + off) & (2**64 - 1), rkey, length & 0xFFFFFFFF)

    def _atomic(self, qp: Qp, edge: bool = False) -> bytes:
        r = self.rng
        g = self._region_for(qp, ACCESS_REMOTE_ATOMIC)
        off = self._edge_offset(g) if edge else r.randrange(0, max(g.length - 8, 0) + 1) & ~7
        return struct.pack("!QIQQ", (g.addr + off) & (2**64 - 1), g.rkey, r.getrandbits(64),
                           r.getrandbits(64))

    def _mtu(self, qp: Qp) -> int:
        return qp.pmtu or self.t.pmtu

    def _peth(self, qp: Qp, offset: int) -> bytes:
        """A request's PETH: the payload's offset in its message (PLACE-1), a receive WQE
        number near the QP's next (PLACE-3: posted ones, and some that are not: RNR), and path,
        flags, SSN and timestamp as any sender's."""
        r = self.rng
        rsn = (qp.rsn + r.choice((0, 0, 0, 1, 2, 3, 4, 9, -1))) & 0xFFFFFF
        flags = r.choice((0, 0, 0, C.PETH_F_RETX, C.PETH_F_ACK_NOW))
        return struct.pack("!BBHIIII", r.randrange(4), flags, 0, r.getrandbits(24), rsn,
                           offset & 0xFFFFFFFF, r.getrandbits(32))

    def mode_op(self, qp: Qp, op: int) -> int:
        """op as qp's mode sends it: a MetaRoCE QP's requests mostly in MR_* opcodes."""
        if qp.metaroce and op in _MR_OF and self.rng.random() < MR_SHARE:
            return _MR_OF[op]
        return op

    def build(self, op: int, qp: Qp, *, psn: int | None = None, length: int | None = None,
              edge: bool = False, v6: bool | None = None, dma_len: int | None = None,
              ackreq: int | None = None, offset: int = 0, mode: bool = True) -> bytearray:
        """A valid (or, with edge/dma_len, deliberately out-of-bounds) packet of opcode op (in
        qp's mode unless mode=False: mode_op); offset: a MetaRoCE request's PETH.Offset."""
        r = self.rng
        if mode:
            op = self.mode_op(qp, op)
        lay = LAYOUTS[op]
        name = C.OPCODE_NAMES[op]
        if length is None:
            if not lay.payload:
                length = 0
            elif name.endswith(("_FIRST", "_MIDDLE")):
                length = self._mtu(qp)
            else:
                length = r.choice((0, 1, 2, 3, 4, 5, 8, 31, 64, 100, 255, 256, 512,
                                   self._mtu(qp) - 1, self._mtu(qp)))
        payload = self._payload(length) if lay.payload else b""
        if dma_len is None:
            if op in (O.RC_RDMA_WRITE_FIRST, O.MR_RDMA_WRITE_FIRST):
                m = self._mtu(qp)
                dma_len = length + m * r.randrange(1, 4) - r.randrange(0, m)
            elif op in (O.RC_RDMA_READ_REQUEST, O.MR_RDMA_READ_REQUEST):
                dma_len = r.choice((0, 1, 8, 64, 1024, 3000))
            else:
                dma_len = length
        hdrs = []
        for packed in self.fixed[op]:
            if packed is PETH:
                hdrs.append(self._peth(qp, offset))
            elif packed is not None:
                hdrs.append(packed)
            elif op in ATOMIC_OPS:
                hdrs.append(self._atomic(qp, edge))
            else:
                hdrs.append(self._reth(qp, op, dma_len, edge))
        if psn is None:
            psn = self._resp_psn(qp, op) if op in RESPONSE_OPS else qp.epsn
        return F.assemble(r.random() < 0.3 if v6 is None else v6, op, qp.qpn, psn,
                          b"".join(hdrs), payload,
                          ackreq=r.getrandbits(1) if ackreq is None else ackreq)

    def _resp_psn(self, qp: Qp, op: int) -> int:
        """A PSN a requester could be waiting for: inside [una, sq_psn) for ACKs, the first PSN
        of the outstanding READ/ATOMIC for responses, or nearby."""
        r = self.rng
        if op == O.RC_ACKNOWLEDGE:
            span = (qp.sq_psn - qp.una) & C.PSN_MASK
            base = qp.una + (r.randrange(span) if span and r.random() < 0.7 else
                             r.choice((-1, 0, span, span + 1, -1000)))
        elif qp.slots:
            base = qp.slots[qp.rd_head % len(qp.slots)][0] + r.choice((0, 0, 0, 1, 2, -1, 7))
        else:
            base = qp.una
        return base & C.PSN_MASK

    # -- the stream -------------------------------------------------------------------------
    def __iter__(self):
        while True:
            kind = self._kind_pool[self._ki]
            self._ki = (self._ki + 1) & 4095
            if kind == "sequence":
                yield from self._sequence()
            elif kind == "response":
                yield from self._response()
            else:
                yield bytes(getattr(self, "_k_" + kind)())

    def _qp(self) -> Qp:
        return self.rng.choice(self.t.qps)

    def _op(self) -> int:
        r = self.rng
        x = r.random()
        if x < 0.45:
            return r.choice(WRITE_OPS)
        if x < 0.6:
            return r.choice(SEND_OPS)
        if x < 0.7:
            return r.choice((O.RC_RDMA_READ_REQUEST,) + ATOMIC_OPS[:2])
        return r.choice(OPCODES)

    def _k_valid(self):
        return self.build(self._op(), self._qp())

    def _sequence(self):
        """A multi-packet WRITE or SEND, each packet built when it is due (so it carries the
        PSN the QP expects then); one in four packets is mutated, dropped or repeated."""
        r = self.rng
        qp = self._qp()
        write = r.random() < 0.75
        n = r.randrange(2, 6)
        tail = r.randrange(0, self._mtu(qp) + 1)
        ops = ([O.RC_RDMA_WRITE_FIRST] + [O.RC_RDMA_WRITE_MIDDLE] * (n - 2) +
               [r.choice((O.RC_RDMA_WRITE_LAST, O.RC_RDMA_WRITE_LAST_WITH_IMMEDIATE))]) if write \
            else ([O.RC_SEND_FIRST] + [O.RC_SEND_MIDDLE] * (n - 2) + [O.RC_SEND_LAST])
        if self.mode_op(qp, ops[0]) != ops[0]:            # one message, one mode
            ops = [_MR_OF[op] for op in ops]
        total = self._mtu(qp) * (n - 1) + tail
        for i, op in enumerate(ops):
            last = i == n - 1
            f = self.build(op, qp, length=tail if last else self._mtu(qp), dma_len=total,
                           v6=False, ackreq=int(last), offset=i * self._mtu(qp), mode=False)
            x = r.random()
            if x < 0.06:
                continue                                   # lost
            if x < 0.25:
                f = self._mutate(f)
            yield bytes(f)
            if x > 0.95:
                yield bytes(f)                             # duplicated

    def _response(self):
        """Requester side: the responses to the QP's outstanding READ or ATOMIC (READ responses
        FIRST/MIDDLE/LAST at its PSNs, filling exactly its length, or an atomic ACK), or ACKs
        and NAKs inside and just outside the PSNs in flight; one in five mutated."""
        r = self.rng
        qp = r.choice([q for q in self.t.qps if q.slots] or self.t.qps)
        frames = []
        if qp.slots and r.random() < 0.75:
            first, kind, length = qp.slots[qp.rd_head % len(qp.slots)]
            if kind == RD_ATOMIC:
                frames.append(self.build(O.RC_ATOMIC_ACKNOWLEDGE, qp, psn=first))
            else:
                n = max(-(-length // self._mtu(qp)), 1)
                for i in range(n):
                    op = (O.RC_RDMA_READ_RESPONSE_ONLY if n == 1 else
                          O.RC_RDMA_READ_RESPONSE_FIRST if i == 0 else
                          O.RC_RDMA_READ_RESPONSE_LAST if i == n - 1 else
                          O.RC_RDMA_READ_RESPONSE_MIDDLE)
                    size = self._mtu(qp) if i < n - 1 else length - self._mtu(qp) * (n - 1)
                    frames.append(self.build(op, qp, psn=first + i, length=size, v6=False))
        else:
            frames.append(self.build(O.RC_ACKNOWLEDGE, qp))
        for f in frames:
            x = r.random()
            if x < 0.05:
                continue
            yield bytes(self._mutate(f) if x < 0.2 else f)

    def _k_field(self):
        f = self.build(self._op(), self._qp(), edge=self.rng.random() < 0.2)
        return self._mutate(f, self.rng.randrange(1, 4))

    def _k_edge(self):
        """Valid rkey and PSN, lengths and offsets that lie near region edges."""
        r = self.rng
        qp = self._qp()
        op = r.choice((O.RC_RDMA_WRITE_ONLY, O.RC_RDMA_WRITE_ONLY,
                       O.RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
                       O.RC_RDMA_WRITE_FIRST, O.RC_RDMA_READ_REQUEST, O.RC_COMPARE_SWAP,
                       O.RC_FETCH_ADD))
        length = r.choice((0, 1, 2, 3, 4, 7, 8, 9, 15, 16, 17, 63, 64, 65, 255, 256, 1000,
                           self._mtu(qp)))
        if op == O.RC_RDMA_WRITE_FIRST:
            length = self._mtu(qp)
        dma = length
        x = r.random()
        if x < 0.3:                                        # the DMA length lies
            dma = r.choice((0, length + 1, max(length - 1, 0), length + 4096, 0xFFFFFFFF,
                            0x80000000, 0x7FFFFFFF, 65536, r.getrandbits(32)))
        f = self.build(op, qp, length=length, edge=True, dma_len=dma)
        if r.random() < 0.15:                              # the payload lies instead
            f = self._resize_payload(f, r.choice((-4, -1, 1, 4, 8)))
        return f

    def _k_flip_no_icrc(self):
        f = self.build(self._op(), self._qp())
        r = self.rng
        for _ in range(r.randrange(1, 4)):
            i = r.randrange(F.ETH_LEN, len(f))
            f[i] ^= 1 << r.randrange(8)
        return f

    def _k_truncate(self):
        r = self.rng
        f = self.build(self._op(), self._qp())
        cut = r.randrange(0, len(f))
        f = f[:max(cut, F.ETH_LEN)]
        x = r.random()
        if x < 0.4 and len(f) > F.BTH_OFF4:               # a shorter, honest frame
            udp = F.ETH_LEN + (F.IP6_LEN if f[12:14] == b"\x86\xdd" else F.IP4_LEN)
            F.set_udp_len(f, len(f) - udp)
            F.fix_icrc(f)
        elif x < 0.6:                                      # lie: the UDP length is longer
            F.set_udp_len(f, len(f) + r.randrange(1, 64))
        return f

    def _k_random(self):
        r = self.rng
        if r.random() < 0.5:
            return bytearray(self._payload(r.randrange(F.ETH_LEN, self.big)))
        f = self.build(self._op(), self._qp())              # RoCE headers, random transport
        start = r.randrange(F.BTH_OFF6 if f[12:14] == b"\x86\xdd" else F.BTH_OFF4, len(f))
        f[start:] = self._payload(len(f) - start)
        F.fix_icrc(f)
        return f

    def _k_not_roce(self):
        r = self.rng
        f = self.build(r.choice(WRITE_OPS), self._qp(), v6=r.random() < 0.5)
        x = r.randrange(8)
        if x == 0:
            return bytearray(F.ETH_DST + F.ETH_SRC + b"\x08\x06" + self._payload(28))   # ARP
        if x == 1:                                         # another UDP port
            udp = 14 + (40 if f[12:14] == b"\x86\xdd" else 20)
            f[udp + 2:udp + 4] = r.choice((4790, 4792, 53, 0, 65535)).to_bytes(2, "big")
        elif x == 2:                                       # VLAN-tagged RoCE
            f = f[:12] + b"\x81\x00\x00\x05" + f[12:]
        elif x == 3 and f[12:14] == b"\x08\x00":           # IPv4 fragment
            f[20:22] = r.choice((b"\x20\x00", b"\x00\x10", b"\x3f\xff"))
        elif x == 4 and f[12:14] == b"\x08\x00":           # IPv4 with an option
            f = f[:34] + b"\x01\x01\x01\x00" + f[34:]
            f[14] = 0x46
        elif x == 5:                                       # TCP / another protocol
            f[23 if f[12:14] == b"\x08\x00" else 20] = r.choice((6, 0, 17 ^ 1, 58))
        elif x == 6:                                       # an ethertype nobody knows
            f[12:14] = r.getrandbits(16).to_bytes(2, "big")
        else:                                              # a runt frame
            f = f[:r.randrange(F.ETH_LEN, 42)]
        return f

    def _k_jumbo(self):
        """Frames only a large MTU carries, most of them against a live QP at its expected PSN
        with a valid ICRC, so that they reach the length checks behind it."""
        r = self.rng
        qp = self._qp()
        pmtu, big = self._mtu(qp), self.t.max_frame
        x = r.randrange(7)
        if x == 0:                                 # a payload past the path MTU, up to the frame
            op = r.choice((O.RC_RDMA_WRITE_ONLY, O.RC_SEND_ONLY, O.RC_RDMA_WRITE_FIRST,
                           O.RC_RDMA_WRITE_MIDDLE, O.RC_RDMA_READ_RESPONSE_MIDDLE,
                           O.RC_RDMA_READ_RESPONSE_ONLY, O.MR_RDMA_WRITE_ONLY))
            room = max(big - 120, pmtu + 1)
            n = r.choice((pmtu + 1, pmtu + 4, 2 * pmtu, room, r.randrange(pmtu + 1, room + 1)))
            return self.build(op, qp, length=n, v6=r.random() < 0.3)
        if x == 1:                                 # a full-MTU packet, the frame padded behind it
            f = self.build(r.choice(WRITE_OPS + SEND_OPS), qp, length=pmtu)
            return f + self._payload(r.randrange(1, max(big - len(f), 2)))
        if x in (2, 3):                            # UDP and IP lengths that disagree
            f = self.build(r.choice(WRITE_OPS + SEND_OPS + RESPONSE_OPS[:4]), qp, length=pmtu)
            v6 = f[12:14] == b"\x86\xdd"
            udp = F.ETH_LEN + (F.IP6_LEN if v6 else F.IP4_LEN)
            ulen = int.from_bytes(f[udp + 4:udp + 6], "big")
            new = r.choice((ulen - 4096, ulen - pmtu // 2, ulen + 4096, 9000, big - F.ETH_LEN,
                            ulen - 1, ulen + 1, len(f) - udp, r.randrange(20, 0x10000)))
            new &= 0xFFFF
            if x == 2:                             # both say the same, the frame disagrees
                F.set_udp_len(f, new)
                if r.random() < 0.6:
                    F.fix_icrc(f)                  # an ICRC where the new length puts it
            elif r.random() < 0.5:                 # only the UDP length moves
                f[udp + 4:udp + 6] = new.to_bytes(2, "big")
                F.fix_icrc(f)
            else:                                  # only the IP length moves
                if v6:
                    f[18:20] = new.to_bytes(2, "big")
                else:
                    f[16:18] = ((new + F.IP4_LEN) & 0xFFFF).to_bytes(2, "big")
                    F.fix_icrc(f)
            return f
        if x == 4:                                 # honest big frames that end early
            f = self.build(r.choice(WRITE_OPS + SEND_OPS), qp, length=pmtu)
            return self._resize_payload(f, -r.randrange(1, pmtu))
        if x == 5 and self.t.oversize:             # past the link's frame limit
            f = self.build(r.choice((O.RC_RDMA_WRITE_ONLY, O.RC_SEND_ONLY)), qp, length=pmtu)
            return f + self._payload(r.randrange(big - len(f) + 1, big - len(f) + 8192))
        return self._mutate(self.build(self._op(), qp, length=pmtu), r.randrange(1, 3))

    # -- mutations --------------------------------------------------------------------------
    def _resize_payload(self, f: bytearray, delta: int) -> bytearray:
        """Grow or shrink the bytes before the ICRC by delta, keeping lengths honest."""
        b = F.l4_bounds(f)
        if b is None:
            return f
        _v, bth, end = b
        body_end = end - F.ICRC_LEN
        if delta < 0:
            delta = max(delta, bth + F.BTH_LEN - body_end)
            f = f[:body_end + delta] + f[body_end:]
        else:
            f = f[:body_end] + self._payload(delta) + f[body_end:]
        F.set_udp_len(f, end - (bth - F.UDP_LEN) + delta)
        F.fix_icrc(f)
        return f

    def _mutate(self, f: bytearray, n: int = 1) -> bytearray:
        r = self.rng
        for _ in range(n):
            b = F.l4_bounds(f)
            if b is None:
                break
            _v, bth, end = b
            op = f[bth]
            offs = F.header_offsets(op)
            m = r.randrange(14)
            if m == 0:                                     # opcode
                f[bth] = r.choice((r.getrandbits(8), r.choice(OPCODES), r.choice(WRITE_OPS),
                                   (op + r.choice((-1, 1))) & 0xFF))
            elif m == 1:                                   # destination QP
                qpn = r.choice([q.qpn for q in self.t.qps] + self.t.unknown_qpns)
                f[bth + 5:bth + 8] = qpn.to_bytes(3, "big")
            elif m in (2, 3):                              # PSN outside the window / duplicate
                psn = int.from_bytes(f[bth + 9:bth + 12], "big")
                psn += r.choice((1, 2, 3, 5, 100, -1, -2, -3, 1 << 23, (1 << 23) - 1,
                                 (1 << 23) + 1, r.getrandbits(24)))
                f[bth + 9:bth + 12] = (psn & C.PSN_MASK).to_bytes(3, "big")
            elif m == 4:                                   # SE / M / pad count / TVer
                f[bth + 1] = r.choice((r.getrandbits(8), f[bth + 1] ^ 0x30, f[bth + 1] ^ 0x10,
                                       f[bth + 1] | 0x0F))
            elif m == 5:                                   # P_Key, AckReq, reserved bits
                i = r.choice((2, 3, 4, 8))
                f[bth + i] = r.getrandbits(8)
            elif m in (6, 7) and ("RETH" in offs or "AtomicETH" in offs):
                h = bth + F.BTH_LEN + offs.get("RETH", offs.get("AtomicETH"))
                if h + 16 > end - F.ICRC_LEN:
                    continue
                va, rkey, dma = struct.unpack_from("!QII", f, h)
                w = r.randrange(5)
                if w == 0:                                 # another region's key, or none
                    rkey = r.choice([g.rkey for g in self.t.regions] + self.t.dead_rkeys +
                                    [rkey ^ 1, rkey ^ 0x80000000, 0, 0xFFFFFFFF])
                elif w == 1:
                    va = (va + r.choice((-1, 1, -8, 8, 1 << 16, -(1 << 16), 1 << 32, -(1 << 63),
                                         r.getrandbits(64)))) & (2**64 - 1)
                elif w == 2:
                    g = r.choice(self.t.regions)
                    va = (g.addr + self._edge_offset(g)) & (2**64 - 1)
                elif w == 3 and "RETH" in offs:
                    dma = r.choice((0, 1, dma + 1, max(dma - 1, 0), 0xFFFFFFFF, 1 << 31,
                                    r.getrandbits(32)))
                else:
                    g = r.choice(self.t.regions)
                    rkey, va = g.rkey, (g.addr + self._edge_offset(g)) & (2**64 - 1)
                struct.pack_into("!QII", f, h, va, rkey, dma & 0xFFFFFFFF)
            elif m == 8:                                   # the payload grows or shrinks
                delta = r.choice(self._deltas)             # (within the frame limit: past it
                if self.t.max_frame:                       # only as the jumbo kind's oversize)
                    delta = min(delta, self.big - len(f))
                f = self._resize_payload(f, delta)
            elif m == 9:                                   # the UDP length lies
                udp = bth - F.UDP_LEN
                ulen = int.from_bytes(f[udp + 4:udp + 6], "big")
                F.set_udp_len(f, r.choice((ulen - 1, ulen + 1, ulen - 4, ulen + 4, 0, 8, 20,
                                           23, 24, 0xFFFF, ulen - 12)))
            elif m == 10:                                  # trailing bytes after the datagram
                most = 64 if not self.t.max_frame or r.random() < 0.7 else \
                    max(self.big - len(f), 2)          # jumbo: up to the frame limit
                f = f + self._payload(r.randrange(1, most))
            elif m == 11:                                  # a random byte in the headers
                i = r.randrange(bth, min(bth + F.BTH_LEN + offs["_end"] + 1, end))
                f[i] = r.getrandbits(8)
            elif m == 12:                                  # ECN CE (a CNP is due) or DSCP
                if f[12:14] == b"\x08\x00":
                    f[15] = r.choice((f[15] | 3, r.getrandbits(8)))
                else:
                    f[15] |= 0x30
            else:                                          # a random byte anywhere after L2
                f[r.randrange(F.ETH_LEN, len(f))] = r.getrandbits(8)
        if self.rng.random() < 0.88:
            F.fix_icrc(f)
        return f
