"""The tester: plays the remote RC peer of a device under test (DUT) with packets built by
``metaroce.wire``, sent and received on a raw AF_PACKET socket inside the tester's network
namespace. Everything the DUT sends to the tester is parsed and logged, so that a test can wait
for a reply (with a timeout), assert silence, and a run can audit every frame afterwards."""

from __future__ import annotations

import ipaddress
import select
import socket
import struct
import time
from dataclasses import dataclass, field

from ..wire import consts as C
from ..wire import icrc as _icrc
from ..wire.consts import Opcode as O
from ..wire.errors import ParseError
from ..wire.headers import (AETH, BTH, PETH, RETH, SACKETH, AtomicAckETH, AtomicETH, CNPPad,
                            ImmDt)
from ..wire.layout import LAYOUTS
from ..wire.packet import UDP, Ethernet, IPv4, IPv6, RocePacket, parse_frame

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4
REPLY_WAIT_S = 0.5       # how long a required reply may take (RESP-3 is far below this)
SILENCE_S = 0.2          # how long "no reply" is watched


class Failure(AssertionError):
    """A conformance failure, attributed to the clause whose requirement was violated."""

    def __init__(self, clause: str, message: str):
        super().__init__(f"{clause}: {message}")
        self.clause, self.message = clause, message


class Skip(Exception):
    """The test does not apply to this DUT (a capability or description field is missing)."""


def check(cond, clause: str, message: str) -> None:
    if not cond:
        raise Failure(clause, message)


def psn_add(p: int, n: int) -> int:
    return (p + n) & C.PSN_MASK


def reicrc(frame: bytes) -> bytes:
    """Recompute the ICRC of a frame whose bytes were patched (IPv4 or IPv6, no VLAN)."""
    ethertype = struct.unpack_from("!H", frame, 12)[0]
    l3 = frame[14:]
    if ethertype == C.ETH_P_IPV4:
        end = 14 + struct.unpack_from("!H", l3, 2)[0]
    else:
        end = 14 + C.IPV6_LEN + struct.unpack_from("!H", l3, 4)[0]
    crc = _icrc.compute(frame[14:end - 4])
    return frame[:end - 4] + _icrc.encode(crc) + frame[end:]


def fix_ipv4_checksum(frame: bytes) -> bytes:
    from ..wire.packet import inet_checksum  # noqa: PLC0415
    hlen = (frame[14] & 0xF) * 4
    h = bytearray(frame[14:14 + hlen])
    h[10:12] = b"\0\0"
    h[10:12] = struct.pack("!H", inet_checksum(bytes(h)))
    return frame[:14] + bytes(h) + frame[14 + hlen:]


@dataclass
class Seen:
    """One frame the DUT sent to the tester."""
    t: float
    raw: bytes
    pkt: RocePacket | None
    error: str = ""


class Wire:
    """Raw socket on the tester's interface: send frames, capture what the DUT sends back."""

    def __init__(self, netns: str | None, iface: str, dut_ip: str):
        from ..lab import netdev  # noqa: PLC0415
        self.dut_ip = str(ipaddress.ip_address(dut_ip))
        self.log: list[Seen] = []
        self._pending: list[Seen] = []
        ctx = netdev.in_netns(netns) if netns else _null()
        with ctx:
            self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
            self.sock.bind((iface, 0))
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
            # a UDP socket on 4791 keeps the tester's kernel from answering the DUT's packets
            # with ICMP port unreachable; what it receives is discarded
            fam = socket.AF_INET6 if ":" in self.dut_ip else socket.AF_INET
            self.sink = socket.socket(fam, socket.SOCK_DGRAM)
            self.sink.bind(("", C.ROCEV2_UDP_PORT))
            self.sink.setblocking(False)
        self.sent = 0

    def close(self) -> None:
        self.sock.close()
        self.sink.close()

    def send(self, frame: bytes) -> None:
        self.sock.send(frame)
        self.sent += 1

    def _read(self, timeout: float) -> bool:
        r, _, _ = select.select([self.sock], [], [], max(0.0, timeout))
        if not r:
            return False
        while True:
            try:
                raw, addr = self.sock.recvfrom(65536, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            if addr[2] == PACKET_OUTGOING:
                continue
            self._keep(raw)
        try:
            while True:
                self.sink.recv(65536)
        except (BlockingIOError, OSError):
            pass
        return True

    def _keep(self, raw: bytes) -> None:
        et = struct.unpack_from("!H", raw, 12)[0] if len(raw) >= 14 else 0
        if et not in (C.ETH_P_IPV4, C.ETH_P_IPV6, C.ETH_P_8021Q):
            return
        try:
            pkt = parse_frame(raw)
            if pkt.ip.src != self.dut_ip:
                return
            seen = Seen(time.monotonic(), raw, pkt)
        except ParseError as exc:
            if exc.reason.value in ("not_roce", "not_udp", "not_ip"):
                return
            src = _src_of(raw)
            if src != self.dut_ip:
                return
            seen = Seen(time.monotonic(), raw, None, f"{exc.reason.value}: {exc}")
        self.log.append(seen)
        self._pending.append(seen)

    def drain(self, quiet_s: float = 0.02) -> list[Seen]:
        """Forget what arrived so far (after a short quiet period); returns it."""
        while self._read(quiet_s):
            pass
        out, self._pending = self._pending, []
        return out

    def collect(self, timeout: float = REPLY_WAIT_S, until=None) -> list[RocePacket]:
        """Packets from the DUT within timeout; stops early once until(packets) is true."""
        deadline = time.monotonic() + timeout
        while True:
            good = [s.pkt for s in self._pending if s.pkt is not None]
            if until is not None and until(good):
                break
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._read(min(left, 0.05))
        bad = [s for s in self._pending if s.pkt is None]
        self._pending = []
        if bad:
            raise Failure("ICRC-1", f"the DUT sent a frame that does not parse: {bad[0].error}")
        return good


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def _src_of(raw: bytes) -> str | None:
    try:
        if raw[14] >> 4 == 4:
            return str(ipaddress.IPv4Address(raw[26:30]))
        return str(ipaddress.IPv6Address(raw[22:38]))
    except (IndexError, ValueError):
        return None


# ---- reply classification ----------------------------------------------------------------

def aeth(p: RocePacket) -> AETH | None:
    return p.get(AETH)


def is_ack_like(p: RocePacket) -> bool:
    return p.bth.opcode in (O.RC_ACKNOWLEDGE, O.MR_SACK)


def syndrome(p: RocePacket) -> int | None:
    a = aeth(p)
    return None if a is None else a.syndrome


def is_plain_ack(p: RocePacket) -> bool:
    return is_ack_like(p) and syndrome(p) is not None and syndrome(p) & 0x60 == 0


def is_nak(p: RocePacket, code: int | None = None) -> bool:
    s = syndrome(p)
    if not is_ack_like(p) or s is None or s & 0x60 != 0x60:
        return False
    return code is None or s == 0x60 | code


def is_rnr(p: RocePacket) -> bool:
    s = syndrome(p)
    return is_ack_like(p) and s is not None and s & 0x60 == 0x20


def describe(pkts) -> str:
    out = []
    for p in pkts:
        s = syndrome(p)
        extra = f" syn=0x{s:02x} msn={aeth(p).msn}" if s is not None else ""
        sk = p.get(SACKETH)
        if sk is not None:
            extra += f" sack[flags=0x{sk.flags:02x} bm={sk.bitmap:032x}]"
        out.append(f"{C.OPCODE_NAMES.get(p.bth.opcode, hex(p.bth.opcode))}(psn={p.bth.psn}"
                   f"{extra}, {len(p.payload)}B)")
    return "[" + ", ".join(out) + "]" if out else "nothing"


# ---- the peer of one DUT endpoint ----------------------------------------------------------

READ_RESP = {O.RC_RDMA_READ_RESPONSE_FIRST, O.RC_RDMA_READ_RESPONSE_MIDDLE,
             O.RC_RDMA_READ_RESPONSE_LAST, O.RC_RDMA_READ_RESPONSE_ONLY,
             O.MR_RDMA_READ_RESPONSE_FIRST, O.MR_RDMA_READ_RESPONSE_MIDDLE,
             O.MR_RDMA_READ_RESPONSE_LAST, O.MR_RDMA_READ_RESPONSE_ONLY}


@dataclass
class Peer:
    """The tester's side of one connection with a DUT endpoint: addresses, the next request
    PSN the DUT expects (its ePSN), the message counts the DUT's MSN must follow, and builders
    for every request in the connection's mode."""

    wire: Wire
    ep: object                       # adapters.Endpoint
    my_mac: str
    my_ip: str
    metaroce: bool
    psn: int = 0                     # next request PSN (the DUT's ePSN)
    msn: int = 0                     # request messages the DUT has completed (HDR-7)
    ssn: int = 0
    rsn: int = 0
    sport: int = 0xC2A5
    ts: int = 1000
    broken: bool = False             # the QP was driven to ERR
    extra: dict = field(default_factory=dict)
    csum: bool = False               # the connection negotiated CSUM: UDP checksums (INT-2)

    def __post_init__(self):
        self.psn = self.ep.tester_psn

    # -- framing --
    @property
    def mtu(self) -> int:
        return int(self.ep.mtu)

    def ip(self, **kw):
        cls = IPv6 if ":" in self.ep.ip else IPv4
        return cls(src=kw.pop("src", self.my_ip), dst=self.ep.ip, **kw)

    def op(self, rc_opcode: int) -> int:
        return rc_opcode | 0xC0 if self.metaroce else rc_opcode

    def frame(self, opcode: int, psn: int, headers=(), payload=b"", *, ack_req=0, sport=None,
              dest_qp=None, ip_kw=None, path=0, offset=0, peth_flags=0, ssn=None, rsn=None,
              **bth_kw) -> bytes:
        """One request frame. In MetaRoCE mode a PETH is prepended for MR opcodes."""
        hdrs = tuple(headers)
        lay = LAYOUTS.get(opcode)
        if self.metaroce and lay is not None and lay.headers[:1] == (PETH,) and \
                opcode != O.MR_PROBE:
            self.ts = (self.ts + 1000) & 0xFFFFFFFF
            hdrs = (PETH(path_id=path, ssn=self.ssn if ssn is None else ssn, offset=offset,
                         rsn=self.rsn if rsn is None else rsn, ts=self.ts,
                         flags=peth_flags),) + hdrs
        bth = BTH(opcode=opcode, dest_qp=self.ep.qpn if dest_qp is None else dest_qp,
                  psn=psn & C.PSN_MASK, ack_req=ack_req, **bth_kw)
        pkt = RocePacket(ip=self.ip(**(ip_kw or {})), bth=bth, headers=hdrs, payload=payload,
                         udp=UDP(sport=self.sport if sport is None else sport),
                         eth=Ethernet(dst=self.ep.mac, src=self.my_mac),
                         udp_checksum=self.csum)
        return pkt.to_bytes()

    def write_frames(self, va: int, data: bytes, *, rkey=None, psn=None, ack=True, imm=None,
                     dma_len=None, sports=None, ack_every=False, ssn=None) -> list[bytes]:
        """The packets of one WRITE (FIRST/MIDDLE/LAST or ONLY), AckReq on the last."""
        rkey = self.ep.rkey if rkey is None else rkey
        psn = self.psn if psn is None else psn
        m = self.mtu
        n = max(1, -(-len(data) // m))
        reth = RETH(va=va, rkey=rkey, dma_len=len(data) if dma_len is None else dma_len)
        out = []
        for i in range(n):
            chunk = data[i * m:(i + 1) * m]
            last = i == n - 1
            if n == 1:
                op = O.RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE if imm is not None else O.RC_RDMA_WRITE_ONLY
            elif i == 0:
                op = O.RC_RDMA_WRITE_FIRST
            elif last:
                op = O.RC_RDMA_WRITE_LAST_WITH_IMMEDIATE if imm is not None else O.RC_RDMA_WRITE_LAST
            else:
                op = O.RC_RDMA_WRITE_MIDDLE
            hdrs = []
            if i == 0 or self.metaroce:
                hdrs.append(reth)
            if last and imm is not None:
                hdrs.append(ImmDt(imm))
            out.append(self.frame(self.op(op), psn + i, hdrs, chunk,
                                  ack_req=int((ack and last) or ack_every),
                                  sport=None if sports is None else sports[i % len(sports)],
                                  path=0 if sports is None else i % len(sports), offset=i * m,
                                  ssn=ssn))
        return out

    def send_frames(self, data: bytes, *, psn=None, imm=None, ack=True) -> list[bytes]:
        psn = self.psn if psn is None else psn
        m = self.mtu
        n = max(1, -(-len(data) // m))
        out = []
        for i in range(n):
            last = i == n - 1
            if n == 1:
                op = O.RC_SEND_ONLY_WITH_IMMEDIATE if imm is not None else O.RC_SEND_ONLY
            elif i == 0:
                op = O.RC_SEND_FIRST
            elif last:
                op = O.RC_SEND_LAST_WITH_IMMEDIATE if imm is not None else O.RC_SEND_LAST
            else:
                op = O.RC_SEND_MIDDLE
            hdrs = [ImmDt(imm)] if last and imm is not None else []
            out.append(self.frame(self.op(op), psn + i, hdrs, data[i * m:(i + 1) * m],
                                  ack_req=int(ack and last), offset=i * m))
        return out

    def read_frame(self, va: int, length: int, *, rkey=None, psn=None) -> bytes:
        rkey = self.ep.rkey if rkey is None else rkey
        return self.frame(self.op(O.RC_RDMA_READ_REQUEST), self.psn if psn is None else psn,
                          [RETH(va=va, rkey=rkey, dma_len=length)], ack_req=1)

    def atomic_frame(self, fetch_add: bool, va: int, swap_add: int, compare: int = 0, *,
                     rkey=None, psn=None) -> bytes:
        rkey = self.ep.rkey if rkey is None else rkey
        op = O.RC_FETCH_ADD if fetch_add else O.RC_COMPARE_SWAP
        return self.frame(self.op(op), self.psn if psn is None else psn,
                          [AtomicETH(va=va, rkey=rkey, swap_add=swap_add, compare=compare)],
                          ack_req=1)

    def cnp_frame(self, pkey: int = C.DEFAULT_PKEY) -> bytes:
        bth = BTH(opcode=O.CNP, dest_qp=self.ep.qpn, psn=0, becn=1, pkey=pkey)
        return RocePacket(ip=self.ip(ecn=0), bth=bth, headers=(CNPPad(),),
                          udp=UDP(sport=self.sport),
                          eth=Ethernet(dst=self.ep.mac, src=self.my_mac),
                          udp_checksum=self.csum).to_bytes()

    def ack_frame(self, psn: int, syn: int = 0x1F, msn: int = 0) -> bytes:
        """An ACK (compat) or MR_SACK (MetaRoCE) the tester sends as the DUT's responder."""
        if self.metaroce:
            return self.frame(O.MR_SACK, psn, [AETH(syn, msn), SACKETH()])
        return self.frame(O.RC_ACKNOWLEDGE, psn, [AETH(syn, msn)])

    def sack_frame(self, cum: int, received, syn: int = 0x1F, msn: int = 0) -> bytes:
        return self.frame(O.MR_SACK, cum, [AETH(syn, msn),
                                           SACKETH(bitmap=SACKETH.bitmap_for(cum, received))])

    # -- conversations --
    def send(self, frames) -> None:
        for f in frames if isinstance(frames, list) else [frames]:
            self.wire.send(f)

    def exchange(self, frames, until=None, timeout: float = REPLY_WAIT_S) -> list[RocePacket]:
        self.wire.drain(0.0)
        self.send(frames)
        return self.wire.collect(timeout, until)

    def silence(self, frames, clause: str, what: str, watch: float = SILENCE_S) -> None:
        got = self.exchange(frames, timeout=watch)
        check(not got, clause, f"{what}: expected no response, got {describe(got)}")

    def covering_ack(self, pkts, psn: int):
        for p in pkts:
            if is_plain_ack(p) and ((p.bth.psn - psn) & C.PSN_MASK) < C.PSN_HALF:
                return p
        return None

    def write(self, offset: int, data: bytes, clause: str = "SEQ-3", **kw) -> RocePacket:
        """A WRITE at the region's offset that must be acknowledged; advances the PSN."""
        frames = self.write_frames(self.ep.addr + offset, data, **kw)
        last = psn_add(self.psn, len(frames) - 1)
        got = self.exchange(frames, until=lambda ps: self.covering_ack(ps, last) is not None)
        ack = self.covering_ack(got, last)
        check(ack is not None, clause, f"WRITE of {len(data)} B at PSN {self.psn}..{last}: "
              f"no ACK covering PSN {last}, got {describe(got)}")
        self.advance(len(frames))
        return ack

    def resync(self) -> bool:
        """After a failed test the DUT and the tester may disagree on the next PSN: ask the DUT
        with a zero-length duplicate WRITE (AckReq, far behind) whose re-ACK carries its last
        completed PSN and MSN (RESP-4 / SACK-3). True when the DUT answered."""
        probe = self.write_frames(self.ep.addr, b"", psn=psn_add(self.psn, -(1 << 22)),
                                  dma_len=0)
        got = self.exchange(probe, until=lambda ps: any(is_plain_ack(p) for p in ps),
                            timeout=SILENCE_S)
        acks = [p for p in got if is_plain_ack(p)]
        if not acks:
            return False
        self.psn = psn_add(acks[-1].bth.psn, 1)
        self.msn = acks[-1].get(AETH).msn
        return True

    def advance(self, npsn: int, messages: int = 1, recv: bool = False) -> None:
        self.psn = psn_add(self.psn, npsn)
        self.msn = (self.msn + messages) & C.MSN_MASK
        self.ssn = (self.ssn + messages) & C.PSN_MASK
        if recv:
            self.rsn = (self.rsn + 1) & C.PSN_MASK

    def read(self, offset: int, length: int, clause: str = "SEQ-4", **kw):
        """A READ; returns (data, responses). Advances the PSN by the responses' count."""
        n = max(1, -(-length // self.mtu))
        last = psn_add(self.psn, n - 1)
        first = self.psn
        frame = self.read_frame(self.ep.addr + offset, length, **kw)

        def done(ps):
            return any(p.bth.psn == last and p.bth.opcode in READ_RESP for p in ps) or \
                any(is_nak(p) for p in ps)
        got = self.exchange(frame, until=done)
        resp = [p for p in got if p.bth.opcode in READ_RESP]
        naks = [p for p in got if is_nak(p) or is_rnr(p)]
        check(not naks, clause, f"READ of {length} B at PSN {first}: NAK {describe(naks)}")
        psns = {}
        for p in resp:
            psns.setdefault(p.bth.psn, p)
        want = [psn_add(first, i) for i in range(n)]
        check(all(w in psns for w in want), clause,
              f"READ of {length} B at PSN {first}: responses for PSNs {want} expected, got "
              f"{describe(resp)}")
        data = b"".join(psns[w].payload for w in want)
        self.advance(n)
        return data, [psns[w] for w in want]

    def atomic(self, fetch_add: bool, offset: int, swap_add: int, compare: int = 0,
               clause: str = "HDR-10", psn=None):
        """An atomic; returns (original value, reply)."""
        at = self.psn if psn is None else psn
        frame = self.atomic_frame(fetch_add, self.ep.addr + offset, swap_add, compare, psn=at)
        ack_ops = (O.RC_ATOMIC_ACKNOWLEDGE, O.MR_ATOMIC_ACKNOWLEDGE)
        got = self.exchange(frame, until=lambda ps: any(p.bth.opcode in ack_ops for p in ps))
        acks = [p for p in got if p.bth.opcode in ack_ops]
        check(acks, clause, f"{'FETCH_ADD' if fetch_add else 'COMPARE_SWAP'} at PSN {at}: no "
              f"atomic acknowledge, got {describe(got)}")
        a = acks[0]
        check(a.bth.psn == at, "SEQ-5", f"atomic ACK PSN {a.bth.psn}, request PSN {at}")
        if psn is None:
            self.advance(1)
        return a.get(AtomicAckETH).orig, a

