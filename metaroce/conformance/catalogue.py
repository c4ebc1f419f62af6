"""The test catalogue, grouped by spec clause. Every test cites the clauses it checks; a
failure names the one clause whose requirement it saw violated (tester.check)."""

from __future__ import annotations

import os
import struct
import time
from dataclasses import dataclass

from ..wire import consts as C
from ..wire.consts import Opcode as O
from ..wire.headers import AETH, IETH, PETH, RETH, SACKETH
from ..wire.packet import udp_checksum_ok
from .adapters import ACCESS_LOCAL_WRITE, ACCESS_REMOTE_READ, ALL_ACCESS
from .tester import (READ_RESP, SILENCE_S, Skip, check, describe, fix_ipv4_checksum,
                     is_ack_like, is_nak, is_plain_ack, is_rnr, psn_add, reicrc, syndrome)


@dataclass(frozen=True)
class Case:
    id: str
    group: str
    clauses: tuple
    modes: tuple
    title: str
    fn: object


CASES: list[Case] = []
GROUPS = {
    "hdr": "Header validation and silent discard (HDR, ICRC, WIRE, ERR-2, SEC-3, VER-1)",
    "psn": "PSN rules, acknowledgement and coalescing (PSN, RESP-1..4, COMPAT-2, SACK-1..3)",
    "rnr": "Receiver not ready (RESP-6, SACK-6)",
    "access": "Remote access and length errors, fatal NAKs, QP error and flush (RESP-5, RESP-15, SEC-4, SACK-7, SACK-11, QP-1, ERR-1, EM-1)",
    "read": "READ responses: segmentation, MTU, duplicates, the window (SEQ-4, QP-4, RESP-4, SACK-9)",
    "atomic": "Atomics, exactly once (HDR-10, SEQ-5, RESP-4)",
    "imm": "SEND, immediate data and invalidate (SEQ-2, SEQ-3, HDR-9, HDR-15, EXT-8)",
    "cc": "Congestion notification (COMPAT-4, COMPAT-7, CC-7, CC-14, HDR-11, HDR-12, WIRE-8)",
    "neg": "Negotiated mode: opcode spaces, registries, reserved bits (COMPAT-1, CM-7, EXT-1, EXT-2, EXT-6, REG-1, VER-3)",
    "mp": "Multipath and reordering in MetaRoCE mode (SACK-1, PLACE-1..5, MP-2, WIRE-16, SM-5)",
    "int": "Negotiated integrity: the IPv4/UDP checksums in place of the ICRC (INT-1..3, option CSUM)",
    "req": "The DUT as requester (SEQ-1, RESP-1, COMPAT-3, SACK-4, SACK-10, RESP-12, WIRE-2, SM-2, SM-4, EM-2)",
}

BOTH, ROCE, MR = ("roce", "metaroce"), ("roce",), ("metaroce",)


def case(cid: str, clauses: str, modes=BOTH, title: str = ""):
    def deco(fn):
        CASES.append(Case(cid, cid.split(".")[0], tuple(clauses.split()), tuple(modes),
                          title or (fn.__doc__ or "").strip().split("\n")[0], fn))
        return fn
    return deco


# ---- helpers shared by tests ---------------------------------------------------------------

def pattern(n: int, seed: int = 0) -> bytes:
    return bytes((i * 7 + seed * 13 + (i >> 8)) & 0xFF for i in range(n))


def dut_bytes(t, peer, offset: int, length: int) -> bytes:
    """Region bytes: from the adapter's memory view, else READ back through the protocol."""
    if "memory" in t.adapter.caps:
        return t.adapter.read_mem(peer.ep, offset, length)
    data, _ = peer.read(offset, length, clause="SEQ-4")
    return data


def seed_bytes(t, peer, offset: int, data: bytes) -> None:
    if "memory" in t.adapter.caps:
        t.adapter.write_mem(peer.ep, offset, data)
    else:
        peer.write(offset, data)


def untouched(t, peer, offset: int, before: bytes, clause: str, what: str) -> None:
    after = dut_bytes(t, peer, offset, len(before))
    check(after == before, clause, f"{what}: region bytes at +{offset} changed")


def drops_before(t):
    return t.adapter.drops() if "counters" in t.adapter.caps else None


def counted(t, before, clause: str, what: str) -> None:
    if before is None:
        return
    after = t.adapter.drops()
    check(sum(after.values()) > sum(before.values()), clause,
          f"{what}: dropped but not counted (drop counters unchanged)")


def still_works(peer, clause: str, what: str) -> None:
    """The connection continues: a valid WRITE at the expected PSN is acknowledged with the
    expected MSN (no state changed)."""
    ack = peer.write(64, b"ok after " + what.encode()[:48].ljust(48, b"."), clause=clause)
    a = ack.get(AETH)
    check(a.msn == peer.msn, "HDR-7", f"after {what}: ACK MSN {a.msn}, expected {peer.msn}")


def fatal_reply(t, peer, got, code: int, psn: int, clause: str, what: str) -> None:
    """A fatal NAK (compat) or MR_SACK with the NAK syndrome and a zero bitmap (MetaRoCE)."""
    naks = [p for p in got if is_nak(p)]
    check(naks, clause, f"{what}: expected NAK 0x{0x60 | code:02x}, got {describe(got)}")
    n = naks[0]
    check(syndrome(n) == 0x60 | code, clause,
          f"{what}: NAK syndrome 0x{syndrome(n):02x}, expected 0x{0x60 | code:02x}")
    check(n.bth.psn == psn, "RESP-14", f"{what}: NAK PSN {n.bth.psn}, offending PSN {psn}")
    if t.metaroce:
        check(n.bth.opcode == O.MR_SACK, "SACK-7", f"{what}: fatal NAK not an MR_SACK")
        check(n.get(SACKETH).bitmap == 0, "SACK-7", f"{what}: fatal SACK with a non-zero bitmap")
    t.adapter.consumed(peer.ep)
    peer.broken = True


def after_error(t, peer, clause: str, what: str) -> None:
    """QP-1, SM-1: in ERR the QP discards everything and sends nothing."""
    frames = peer.write_frames(peer.ep.addr + 128, b"E" * 32)
    peer.silence(frames, "QP-1", f"a valid WRITE after {what} (QP in ERR)")


def sack_of(p):
    return p.get(SACKETH) if p.bth.opcode == O.MR_SACK else None


# ---- header validation -----------------------------------------------------------------------

def _probe_write(t, peer, offset=256, n=64, **kw):
    data = os.urandom(n)
    return peer.write_frames(peer.ep.addr + offset, data, **kw), data


def _silent_drop(t, peer, frame: bytes, clause: str, what: str, offset=256, n=64,
                 count=True):
    before_mem = dut_bytes(t, peer, offset, n)      # (a protocol READ moves the PSN: build after)
    before = drops_before(t) if count else None
    peer.silence(frame() if callable(frame) else frame, clause, what)
    counted(t, before, "ERR-2", what)
    untouched(t, peer, offset, before_mem, clause, what)
    still_works(peer, clause, what)


@case("hdr.icrc", "ICRC-1 WIRE-11 ERR-2 SEC-6")
def t_icrc(t):
    """A request with a wrong ICRC is dropped silently, writes nothing, changes no state."""
    peer = t.peer()

    def bad_icrc():
        [f], _ = _probe_write(t, peer)
        return f[:-4] + bytes(b ^ 0x5A for b in f[-4:])
    _silent_drop(t, peer, bad_icrc, "ICRC-1", "WRITE with a wrong ICRC")

    def flipped():                  # a flipped payload bit with the original ICRC
        [f], _ = _probe_write(t, peer)
        body = bytearray(f)
        body[-10] ^= 0x01
        return bytes(body)
    _silent_drop(t, peer, flipped, "ICRC-1", "WRITE with a payload bit flipped")


@case("hdr.tver", "HDR-1 ERR-2 VER-1")
def t_tver(t):
    """A request with TVer != 0 is dropped silently."""
    peer = t.peer()

    def build():
        [f], _ = _probe_write(t, peer)
        b = bytearray(f)
        b[14 + 20 + 8 + 1] |= 0x01
        return reicrc(bytes(b))
    _silent_drop(t, peer, build, "HDR-1", "WRITE with TVer 1")


@case("hdr.pkey", "HDR-2 ERR-2")
def t_pkey(t):
    """P_Key 0x7FFE on a 0xFFFF QP is dropped; the limited-member 0x7FFF is accepted."""
    peer = t.peer()
    bth = 14 + 20 + 8

    def build():
        [f], _ = _probe_write(t, peer)
        b = bytearray(f)
        b[bth + 2:bth + 4] = struct.pack("!H", 0x7FFE)
        return reicrc(bytes(b))
    _silent_drop(t, peer, build, "HDR-2", "WRITE with P_Key 0x7FFE")
    frames = peer.write_frames(peer.ep.addr + 512, b"limited member ok".ljust(32, b"."))
    b = bytearray(frames[0])
    b[bth + 2:bth + 4] = struct.pack("!H", 0x7FFF)
    got = peer.exchange(reicrc(bytes(b)), until=lambda ps: peer.covering_ack(ps, peer.psn))
    check(peer.covering_ack(got, peer.psn), "HDR-2",
          f"WRITE with P_Key 0x7FFF (matches ignoring membership): no ACK, got {describe(got)}")
    peer.advance(1)


@case("hdr.opcode", "HDR-4 ERR-2 EXT-1 REG-1 REG-3")
def t_opcode(t):
    """Unknown, reserved and other-transport opcodes are dropped without state change."""
    peer = t.peer()
    for op in (0x15, 0x1C, 0x24, 0x64, 0xD5, 0xE3, 0xFF):
        def build(op=op):
            [f], _ = _probe_write(t, peer)
            b = bytearray(f)
            b[14 + 20 + 8] = op
            return reicrc(bytes(b))
        _silent_drop(t, peer, build, "HDR-4", f"opcode 0x{op:02x}")


@case("hdr.pad", "WIRE-10 ERR-2")
def t_pad(t):
    """PadCnt larger than the data, non-zero on a header-only opcode, or a length that is not
    a multiple of 4: dropped silently."""
    peer = t.peer()
    bth = 14 + 20 + 8

    def read_pad():                 # READ request (no payload) with PadCnt 2
        b = bytearray(peer.read_frame(peer.ep.addr, 8))
        b[bth + 1] |= 0x20
        return reicrc(bytes(b))
    _silent_drop(t, peer, read_pad, "WIRE-10", "READ request with PadCnt 2")

    def empty_pad():                # WRITE_ONLY of 0 bytes claiming PadCnt 3
        [f] = peer.write_frames(peer.ep.addr + 256, b"", dma_len=0)
        b = bytearray(f)
        b[bth + 1] |= 0x30
        return reicrc(bytes(b))
    _silent_drop(t, peer, empty_pad, "WIRE-10", "WRITE_ONLY without data, PadCnt 3")

    def unaligned():                # WRITE_ONLY whose data after the headers is 6 bytes
        # (its DMA Length says 6 too: only the alignment is wrong, not RESP-15's lengths)
        [f], _ = _probe_write(t, peer, n=8, dma_len=6)
        l3 = bytearray(f[14:-4])[:-2]                     # drop 2 payload bytes
        struct.pack_into("!H", l3, 2, len(l3) + 4)        # IPv4 total length
        struct.pack_into("!H", l3, 24, len(l3) + 4 - 20)  # UDP length
        return reicrc(fix_ipv4_checksum(bytes(f[:14] + l3 + b"\0\0\0\0")))
    if t.metaroce:
        _silent_drop(t, peer, unaligned, "WIRE-10", "WRITE_ONLY with 6 data bytes", n=8)
        return
    # compat: silent, or (a permission WIRE-10 takes from IBTA's length errors) NAK 0x61, fatal
    before = dut_bytes(t, peer, 256, 8)
    e = peer.psn
    got = peer.exchange(unaligned(), until=lambda ps: bool(ps), timeout=SILENCE_S)
    if not got:
        untouched(t, peer, 256, before, "WIRE-10", "WRITE_ONLY with 6 data bytes")
        still_works(peer, "WIRE-10", "WRITE_ONLY with 6 data bytes")
        return
    fatal_reply(t, peer, got, 1, e, "WIRE-10", "WRITE_ONLY with 6 data bytes (answered)")
    t.note("WIRE-10: a WRITE_ONLY with 6 data bytes was answered NAK 0x61 (fatal), the "
           "permitted alternative to a silent drop")


@case("hdr.truncated", "WIRE-6 SEC-5 ERR-2")
def t_truncated(t):
    """Truncated headers and lengths that exceed the frame are dropped silently."""
    peer = t.peer()

    def cut_reth():                 # BTH (+PETH) + half a RETH
        [f], _ = _probe_write(t, peer, n=16)
        cut = 14 + 20 + 8 + 12 + (20 if t.metaroce else 0) + 8
        l3 = bytearray(f[14:cut])
        struct.pack_into("!H", l3, 2, len(l3) + 4)
        struct.pack_into("!H", l3, 24, len(l3) + 4 - 20)
        return reicrc(fix_ipv4_checksum(bytes(f[:14] + l3 + b"\0\0\0\0")))
    _silent_drop(t, peer, cut_reth, "SEC-5", "WRITE_ONLY cut inside its RETH", n=16)

    def too_long():                 # IP and UDP lengths 64 bytes beyond the frame
        [f], _ = _probe_write(t, peer, n=16)
        b = bytearray(f)
        struct.pack_into("!H", b, 16, struct.unpack_from("!H", b, 16)[0] + 64)
        struct.pack_into("!H", b, 38, struct.unpack_from("!H", b, 38)[0] + 64)
        return fix_ipv4_checksum(bytes(b))
    # (not required to be counted by the DUT: a switch on the path may discard it first)
    _silent_drop(t, peer, too_long, "WIRE-6", "IP/UDP lengths beyond the frame", n=16,
                 count=False)


@case("hdr.qpn", "ERR-2 SEC-5")
def t_wrong_qpn(t):
    """A request to a QPN that does not exist is dropped silently."""
    peer = t.peer()
    def build():
        return peer.frame(peer.op(O.RC_RDMA_WRITE_ONLY), peer.psn,
                          [RETH(va=peer.ep.addr + 256, rkey=peer.ep.rkey, dma_len=32)],
                          b"x" * 32, ack_req=1, dest_qp=peer.ep.qpn ^ 0x5A5A5A)
    _silent_drop(t, peer, build, "ERR-2", "WRITE to an unknown QPN", n=32)


@case("hdr.source", "SEC-3 ERR-2")
def t_source(t):
    """A valid request from another source address is dropped silently."""
    peer = t.peer()
    other = ".".join(peer.my_ip.split(".")[:3] + [str((int(peer.my_ip.split(".")[3]) + 77) % 250 + 2)]) \
        if ":" not in peer.my_ip else peer.my_ip[:-1] + "9"
    def build():
        return peer.frame(peer.op(O.RC_RDMA_WRITE_ONLY), peer.psn,
                          [RETH(va=peer.ep.addr + 256, rkey=peer.ep.rkey, dma_len=64)],
                          os.urandom(64), ack_req=1, ip_kw={"src": other})
    _silent_drop(t, peer, build, "SEC-3", f"WRITE from {other} (not the connected peer)")


@case("hdr.udp_checksum", "WIRE-15 WIRE-7 ICRC-2")
def t_udp_checksum(t):
    """A wrong (non-zero) UDP checksum with a valid ICRC is accepted (a SHOULD: Linux drops
    it before rxe sees it)."""
    peer = t.peer()
    data = pattern(64, 3)
    [f] = peer.write_frames(peer.ep.addr + 1024, data)
    b = bytearray(f)
    struct.pack_into("!H", b, 14 + 20 + 6, 0x1234)
    got = peer.exchange(bytes(b), until=lambda ps: peer.covering_ack(ps, peer.psn))
    check(peer.covering_ack(got, peer.psn), "WIRE-15",
          f"WRITE with UDP checksum 0x1234: not acknowledged, got {describe(got)}")
    peer.advance(1)
    check(dut_bytes(t, peer, 1024, 64) == data, "WIRE-15", "WRITE with a UDP checksum not placed")


@case("hdr.sport", "WIRE-3 MP-2")
def t_sport(t):
    """One message whose packets use different UDP source ports completes."""
    peer = t.peer()
    data = pattern(3 * peer.mtu, 5)
    peer.write(2048, data, clause="WIRE-3", sports=[0xC001, 0xE777, 0xFFFE])
    check(dut_bytes(t, peer, 2048, len(data)) == data, "WIRE-3",
          "WRITE over three source ports: region differs")


@case("hdr.fragment", "WIRE-5")
def t_fragment(t):
    """An IPv4 fragment (MF set) is not delivered."""
    peer = t.peer()
    before = dut_bytes(t, peer, 4096, 64)
    [f], data = _probe_write(t, peer, offset=4096, n=64)
    b = bytearray(f)
    struct.pack_into("!H", b, 14 + 6, 0x2000)           # MF, offset 0, DF clear
    peer.silence(fix_ipv4_checksum(bytes(b)), "WIRE-5", "first fragment of a WRITE")
    untouched(t, peer, 4096, before, "WIRE-5", "IPv4 fragment")
    still_works(peer, "WIRE-5", "an IPv4 fragment")


# ---- PSN rules and acknowledgements ---------------------------------------------------------

@case("psn.ack", "RESP-1 HDR-7 SEQ-3")
def t_ack(t):
    """Each AckReq is acknowledged with its PSN; the MSN counts completed messages; data lands."""
    peer = t.peer()
    for i, n in enumerate((1, 60, peer.mtu, peer.mtu + 1, 5 * peer.mtu)):
        data = pattern(n, i)
        first = peer.psn
        ack = peer.write(8192 + i * 8192, data, clause="RESP-1")
        check(ack.bth.psn == psn_add(first, max(1, -(-n // peer.mtu)) - 1), "RESP-1",
              f"ACK PSN {ack.bth.psn} for a message ending at "
              f"{psn_add(first, max(1, -(-n // peer.mtu)) - 1)}")
        check(ack.get(AETH).msn == peer.msn, "HDR-7",
              f"after {i + 1} messages the ACK MSN is {ack.get(AETH).msn}, expected {peer.msn}")
        check(dut_bytes(t, peer, 8192 + i * 8192, n) == data, "SEQ-3",
              f"WRITE of {n} B: region differs")


@case("psn.coalesce", "RESP-2 RESP-1")
def t_coalesce(t):
    """16 WRITE_ONLY with AckReq only on the last: acknowledged together, MSN +16."""
    peer = t.peer()
    frames = []
    for i in range(16):
        frames += peer.write_frames(peer.ep.addr + 65536 + i * 64, pattern(64, i),
                                    psn=psn_add(peer.psn, i), ack=i == 15)
    last = psn_add(peer.psn, 15)
    got = peer.exchange(frames, until=lambda ps: peer.covering_ack(ps, last))
    ack = peer.covering_ack(got, last)
    check(ack is not None, "RESP-1", f"no ACK covering PSN {last}: {describe(got)}")
    check(not [p for p in got if is_nak(p) or is_rnr(p)], "RESP-2", f"NAK in {describe(got)}")
    peer.advance(16, messages=16)
    check(ack.get(AETH).msn == peer.msn, "RESP-2",
          f"the covering ACK has MSN {ack.get(AETH).msn}, expected {peer.msn} (retires all 16)")
    for i in range(16):
        check(dut_bytes(t, peer, 65536 + i * 64, 64) == pattern(64, i), "SEQ-3",
              f"message {i} of 16 not placed")


@case("psn.duplicate", "RESP-4 PSN-3 SACK-3 EM-1")
def t_duplicate(t):
    """A duplicate WRITE is acknowledged again with the current MSN and not executed."""
    peer = t.peer()
    data = pattern(128, 9)
    first = peer.psn
    peer.write(3072, data)
    peer.write(3072 + 512, pattern(64, 1))
    dup = peer.write_frames(peer.ep.addr + 3072, b"\xEE" * 128, psn=first)
    got = peer.exchange(dup, until=lambda ps: any(is_ack_like(p) for p in ps))
    acks = [p for p in got if is_plain_ack(p)]
    check(acks, "RESP-4" if not t.metaroce else "SACK-3",
          f"duplicate WRITE (PSN {first}) with AckReq: no acknowledgement, got {describe(got)}")
    a = acks[0]
    want = psn_add(peer.psn, -1)
    check(a.bth.psn == want, "RESP-4",
          f"duplicate re-ACK PSN {a.bth.psn}, expected the last completed PSN {want}")
    check(a.get(AETH).msn == peer.msn, "RESP-4",
          f"duplicate re-ACK MSN {a.get(AETH).msn}, expected {peer.msn}")
    check(dut_bytes(t, peer, 3072, 128) == data, "RESP-4", "the duplicate WRITE was executed")
    # far below ePSN (half the PSN space back): a duplicate too
    dup = peer.write_frames(peer.ep.addr + 3072, b"\xDD" * 128,
                            psn=psn_add(peer.psn, -C.PSN_HALF))
    got = peer.exchange(dup, until=lambda ps: any(is_ack_like(p) for p in ps))
    check(not [p for p in got if is_nak(p)], "PSN-3",
          f"PSN ePSN-2^23 is a duplicate, but got {describe(got)}")
    check(dut_bytes(t, peer, 3072, 128) == data, "PSN-3", "a duplicate at ePSN-2^23 was executed")
    still_works(peer, "PSN-3", "duplicates")


@case("psn.gap_nak", "COMPAT-2 PSN-3 SEC-6 RESP-14 SM-3 EM-1", modes=ROCE)
def t_gap_nak(t):
    """A gap gets exactly one NAK 0x60 with ePSN; later ahead packets are dropped silently."""
    peer = t.peer()
    before = dut_bytes(t, peer, 5000, 164)
    e = peer.psn
    d1, d2 = pattern(64, 21), pattern(64, 22)
    f1 = peer.write_frames(peer.ep.addr + 5000, d1, psn=psn_add(e, 1))
    f2 = peer.write_frames(peer.ep.addr + 5100, d2, psn=psn_add(e, 2))
    got = peer.exchange(f1, until=lambda ps: bool(ps))
    naks = [p for p in got if is_nak(p, 0)]
    check(naks and naks[0].bth.psn == e, "COMPAT-2",
          f"first packet after a gap (PSN {psn_add(e, 1)}, ePSN {e}): expected NAK 0x60 with "
          f"PSN {e}, got {describe(got)}")
    peer.silence(f2, "COMPAT-2", "a second packet after the gap (the NAK is sent once)")
    peer.silence(f1, "COMPAT-2", "the first ahead packet again (the NAK is sent once)")
    untouched(t, peer, 5000, before, "SEC-6", "packets ahead of ePSN")
    # the expected PSN arrives, then the resent tail: all accepted
    peer.write(4000, pattern(32, 2))
    peer.write(5000, d1)
    peer.write(5100, d2)
    check(dut_bytes(t, peer, 5000, 64) == d1, "COMPAT-2", "resent tail not placed")


@case("psn.gap_sack", "SACK-1 SACK-2 PSN-3 EXT-6 SM-5", modes=MR)
def t_gap_sack(t):
    """Out-of-order packets are placed and reported in the bitmap (flag O); no 0x60 NAK."""
    peer = t.peer()
    e = peer.psn
    d1 = pattern(64, 31)
    f1 = peer.write_frames(peer.ep.addr + 5000, d1, psn=psn_add(e, 1), ack=False)
    peer.ssn += 1
    got = peer.exchange(f1, until=lambda ps: bool(ps))
    sacks = [p for p in got if p.bth.opcode == O.MR_SACK]
    check(sacks, "SACK-2", f"first out-of-order arrival: expected an MR_SACK, got {describe(got)}")
    s = sacks[0]
    check(not is_nak(s, 0), "EXT-6", "NAK 0x60 in MetaRoCE mode")
    check(is_plain_ack(s), "SACK-2", f"out-of-order SACK has syndrome 0x{syndrome(s):02x}")
    check(s.bth.psn == psn_add(e, -1), "SACK-2",
          f"SACK cumulative PSN {s.bth.psn}, expected {psn_add(e, -1)} (below the hole)")
    sk = s.get(SACKETH)
    check(sk.flags & C.SACK_F_OOO, "SACK-2", "out-of-order SACK without flag O")
    check(psn_add(e, 1) in sk.sacked(s.bth.psn), "SACK-1",
          f"PSN {psn_add(e, 1)} not in the bitmap {sk.bitmap:032x}")
    check(dut_bytes(t, peer, 5000, 64) == d1, "PLACE-1", "out-of-order WRITE not placed on arrival")
    # fill the hole: the cumulative PSN jumps over both
    f0 = peer.write_frames(peer.ep.addr + 4000, pattern(32, 3), psn=e, ssn=peer.ssn - 1)
    got = peer.exchange(f0, until=lambda ps: peer.covering_ack(ps, psn_add(e, 1)))
    a = peer.covering_ack(got, psn_add(e, 1))
    check(a is not None, "SACK-1", f"hole filled: no SACK covering PSN {psn_add(e, 1)}: "
          f"{describe(got)}")
    peer.psn = psn_add(e, 2)
    peer.msn = (peer.msn + 2) & C.MSN_MASK
    check(a.get(AETH).msn == peer.msn, "HDR-7", f"SACK MSN {a.get(AETH).msn}, expected {peer.msn}")


@case("psn.window", "PSN-3 SEC-6 COMPAT-2", modes=ROCE)
def t_window_compat(t):
    """PSN ePSN+2^23-1 is ahead (NAK 0x60, nothing written)."""
    peer = t.peer()
    before = dut_bytes(t, peer, 7000, 64)
    e = peer.psn
    f = peer.write_frames(peer.ep.addr + 7000, pattern(64, 44), psn=psn_add(e, C.PSN_HALF - 1))
    got = peer.exchange(f, until=lambda ps: bool(ps))
    check([p for p in got if is_nak(p, 0) and p.bth.psn == e], "PSN-3",
          f"PSN ePSN+2^23-1 is ahead: expected NAK 0x60 PSN {e}, got {describe(got)}")
    untouched(t, peer, 7000, before, "SEC-6", "a packet 2^23-1 ahead")
    still_works(peer, "PSN-3", "a far-ahead packet")


@case("psn.window_edge", "SACK-1 PLACE-6 SEC-6", modes=MR)
def t_window_edge(t):
    """PSN ePSN+W-1 is recorded and placed; ePSN+W and ePSN+2^23-1 write nothing."""
    peer = t.peer()
    w = peer.ep.window
    if not w:
        raise Skip("the description gives no MetaRoCE window (\"window\")")
    base = 9000
    before = dut_bytes(t, peer, base, 3 * 64)
    e = peer.psn
    inside = pattern(64, 51)
    f_in = [peer.frame(peer.op(O.RC_RDMA_WRITE_ONLY), psn_add(e, w - 1),
                       [RETH(va=peer.ep.addr + base, rkey=peer.ep.rkey, dma_len=64)], inside,
                       peth_flags=C.PETH_F_ACK_NOW, ssn=peer.ssn + w - 1)]
    got = peer.exchange(f_in, until=lambda ps: bool(ps))
    s = [p for p in got if p.bth.opcode == O.MR_SACK]
    check(s and psn_add(e, w - 1) in s[0].get(SACKETH).sacked(s[0].bth.psn), "SACK-1",
          f"PSN ePSN+{w - 1} (inside the window) not reported: {describe(got)}")
    check(dut_bytes(t, peer, base, 64) == inside, "SACK-1", f"PSN ePSN+{w - 1} not placed")
    for k, off in ((w, 64), (C.PSN_HALF - 1, 128)):
        f = peer.frame(peer.op(O.RC_RDMA_WRITE_ONLY), psn_add(e, k),
                       [RETH(va=peer.ep.addr + base + off, rkey=peer.ep.rkey, dma_len=64)],
                       pattern(64, 52), peth_flags=C.PETH_F_ACK_NOW)
        got = peer.exchange(f, timeout=SILENCE_S)
        for p in got:
            sk = sack_of(p)
            check(sk is None or psn_add(e, k) not in sk.sacked(p.bth.psn), "SACK-1",
                  f"PSN ePSN+{k} (outside the window) was recorded")
        untouched(t, peer, base + off, before[off:off + 64], "SACK-1",
                  f"a packet at ePSN+{k} (outside the window)")
    # fill everything up to ePSN+W-1 so the connection is in order again
    frames = []
    for i in range(w - 1):
        frames += peer.write_frames(peer.ep.addr + 131072 + (i % 64) * 64, pattern(64, i),
                                    psn=psn_add(e, i), ack=i == w - 2)
        peer.ssn += 1
    got = peer.exchange(frames, until=lambda ps: peer.covering_ack(ps, psn_add(e, w - 1)))
    check(peer.covering_ack(got, psn_add(e, w - 1)), "SACK-1",
          f"after filling the window the cumulative PSN did not reach ePSN+{w - 1}: "
          f"{describe(got[-3:])}")
    peer.psn = psn_add(e, w)
    peer.msn = (peer.msn + w) & C.MSN_MASK


@case("psn.wrap", "PSN-1")
def t_wrap(t):
    """A sequence crossing 0xFFFFFF -> 0x000000 is accepted and acknowledged."""
    peer = t.peer(tester_psn=C.PSN_MASK - 2)
    if ((peer.psn - (C.PSN_MASK - 64)) & C.PSN_MASK) > 64:
        raise Skip("needs an endpoint whose tester PSN is within 64 of 2^24")
    data = pattern(6 * peer.mtu, 61)
    peer.write(16384, data, clause="PSN-1")
    check(peer.psn < 64, "PSN-1", "PSN did not wrap")
    check(dut_bytes(t, peer, 16384, len(data)) == data, "PSN-1", "WRITE across the wrap differs")
    peer.write(0, b"after wrap".ljust(16, b"."), clause="PSN-1")


# ---- RNR ------------------------------------------------------------------------------------

@case("rnr.nak", "RESP-6 SACK-6 SACK-10 RESP-17 SEQ-2 EM-1")
def t_rnr(t):
    """A SEND with no receive posted gets an RNR NAK with its PSN and is not executed; once a
    receive is posted the resent SEND completes."""
    peer = t.peer(fresh=True)
    e = peer.psn
    data = pattern(100, 71)
    f = peer.send_frames(data)
    got = peer.exchange(f, until=lambda ps: bool(ps))
    rnr = [p for p in got if is_rnr(p)]
    check(rnr, "SACK-6" if t.metaroce else "RESP-6",
          f"SEND without a posted receive: expected an RNR NAK, got {describe(got)}")
    check(rnr[0].bth.psn == (psn_add(e, -1) if t.metaroce else e),
          "SACK-10" if t.metaroce else "RESP-14",
          f"RNR NAK PSN {rnr[0].bth.psn} (SEND at {e}; MetaRoCE: the cumulative PSN)")
    if t.metaroce:
        check(rnr[0].bth.opcode == O.MR_SACK, "SACK-10", "the RNR answer is not an MR_SACK")
    else:
        # the RNR NAK counts as the gap's NAK: a later packet is dropped without NAK 0x60
        f2 = peer.write_frames(peer.ep.addr + 256, b"z" * 16, psn=psn_add(e, 1))
        peer.silence(f2, "RESP-17", "a packet after an RNR NAK (ePSN unchanged, no second NAK)")
    if "recv" not in t.adapter.caps:
        raise Skip("RNR NAK checked; posting a receive needs the reference adapter")
    t.adapter.post_recv(peer.ep, 77, 200000, 4096)
    got = peer.exchange(peer.send_frames(data, psn=e),
                        until=lambda ps: peer.covering_ack(ps, e))
    check(peer.covering_ack(got, e), "RESP-6",
          f"SEND resent after posting a receive: not acknowledged, {describe(got)}")
    peer.advance(1, recv=True)
    wc = t.adapter.completions(peer.ep, 1)[0]
    check(wc.status == 0 and wc.byte_len == 100 and wc.wr_id == 77, "SEQ-2",
          f"receive completion {wc}")
    check(t.adapter.read_mem(peer.ep, 200000, 100) == data, "SEQ-2", "SEND payload not placed")


# ---- remote access errors, QP error and flush -----------------------------------------------

def _fatal_case(t, what, build, code, clause, access=ALL_ACCESS):
    peer = t.peer(fresh=True, access=access)
    frame, mem = build(peer)
    before = dut_bytes(t, peer, *mem) if mem and "memory" in t.adapter.caps else None
    e = peer.psn
    got = peer.exchange(frame, until=lambda ps: bool(ps))
    fatal_reply(t, peer, got, code, e, clause, what)
    if before is not None:
        check(dut_bytes(t, peer, *mem) == before, "SEC-4", f"{what}: memory was written")
    after_error(t, peer, clause, what)
    return peer


@case("access.flush", "ERR-1 QP-1 RESP-5 SM-1 EM-1")
def t_flush(t):
    """After a fatal responder error the posted receive completes with a flush error."""
    t.adapter.need("recv", "post receives and see completions")
    peer = t.peer(fresh=True)
    t.adapter.post_recv(peer.ep, 4242, 100000, 256)
    e = peer.psn
    got = peer.exchange(peer.write_frames(peer.ep.addr, b"f" * 16, rkey=peer.ep.rkey ^ 0x10),
                        until=lambda ps: bool(ps))
    fatal_reply(t, peer, got, 2, e, "RESP-5", "WRITE with a bad R_Key")
    try:
        wcs = t.adapter.completions(peer.ep, 1, timeout=0.5)
    except Exception:  # noqa: BLE001 (no completion at all)
        wcs = []
    check(wcs and wcs[0].wr_id == 4242 and wcs[0].status == 5, "ERR-1",
          f"the posted receive was not flushed after the QP entered ERR (completions {wcs})")


@case("access.rkey", "RESP-5 RESP-14 SEC-4 SACK-7 QP-1 EM-1")
def t_bad_rkey(t):
    """A WRITE with an invalid R_Key gets NAK 0x62; the QP goes to ERR and flushes."""
    def build(p):
        return p.write_frames(p.ep.addr + 512, pattern(64, 1), rkey=p.ep.rkey ^ 0x00A50001), \
            (512, 64)
    _fatal_case(t, "WRITE with a bad R_Key", build, 2, "SEC-4")


@case("access.bounds", "RESP-5 RESP-14 SEC-4 SACK-7 QP-1 EM-1")
def t_bounds(t):
    """A WRITE one byte past the region's end gets NAK 0x62 and writes nothing."""
    def build(p):
        n = 64
        return p.write_frames(p.ep.addr + p.ep.length - n + 1, pattern(n, 2)), \
            (p.ep.length - n, n)
    _fatal_case(t, "WRITE one byte beyond the region", build, 2, "SEC-4")


@case("access.read_bounds", "RESP-5 SEC-4 QP-1 EM-1")
def t_read_bounds(t):
    """A READ reaching past the region gets NAK 0x62."""
    def build(p):
        return p.read_frame(p.ep.addr + p.ep.length - 8, 16), None
    _fatal_case(t, "READ beyond the region", build, 2, "SEC-4")


@case("access.flags", "RESP-5 SEC-4 QP-1 EM-1")
def t_access_flags(t):
    """A WRITE into a region without REMOTE_WRITE gets NAK 0x62 and writes nothing."""
    def build(p):
        return p.write_frames(p.ep.addr + 64, pattern(32, 3)), (64, 32)
    _fatal_case(t, "WRITE to a region without remote write access", build, 2, "SEC-4",
                access=ACCESS_LOCAL_WRITE | ACCESS_REMOTE_READ)


@case("access.atomic_align", "HDR-10 RESP-5 QP-1 EM-1")
def t_atomic_align(t):
    """A FETCH_ADD at a VA that is not 8-byte aligned gets NAK 0x61."""
    def build(p):
        return p.atomic_frame(True, p.ep.addr + 4, 1), (0, 16)
    _fatal_case(t, "FETCH_ADD at a misaligned VA", build, 1, "HDR-10")


@case("access.length", "RESP-5 RESP-15 PLACE-2 QP-1 EM-1")
def t_length(t):
    """A WRITE_ONLY whose payload exceeds RETH.DMA Length gets NAK 0x61."""
    def build(p):
        return p.write_frames(p.ep.addr + 64, pattern(64, 4), dma_len=32), (64, 64)
    _fatal_case(t, "WRITE with more payload than its DMA length", build, 1, "RESP-5")


@case("access.sequence", "SEQ-6 RESP-5 QP-1 SM-3 EM-1", modes=ROCE)
def t_sequence(t):
    """WRITE_FIRST followed by SEND_MIDDLE is an invalid request (NAK 0x61)."""
    peer = t.peer(fresh=True)
    first = peer.write_frames(peer.ep.addr, pattern(2 * peer.mtu, 5))[0]
    peer.silence(first, "SEQ-6", "WRITE_FIRST without AckReq")
    e = psn_add(peer.psn, 1)
    bad = peer.frame(O.RC_SEND_MIDDLE, e, (), pattern(peer.mtu, 6), ack_req=1)
    got = peer.exchange(bad, until=lambda ps: bool(ps))
    fatal_reply(t, peer, got, 1, e, "SEQ-6", "SEND_MIDDLE inside a WRITE")
    after_error(t, peer, "QP-1", "an opcode sequence error")


@case("access.segment", "RESP-15 PLACE-2 QP-1 EM-1")
def t_segment(t):
    """A WRITE_MIDDLE shorter than the path MTU is an invalid request (NAK 0x61, fatal), as
    Linux rxe answers it."""
    peer = t.peer(fresh=True)
    m = peer.mtu
    data = pattern(3 * m, 7)
    first, middle, _ = peer.write_frames(peer.ep.addr, data)
    peer.send(first)                                   # (a MetaRoCE DUT may SACK it later)
    time.sleep(0.05)
    peer.wire.drain()
    e = psn_add(peer.psn, 1)
    short = peer.frame(peer.op(O.RC_RDMA_WRITE_MIDDLE), e,
                       [RETH(va=peer.ep.addr, rkey=peer.ep.rkey, dma_len=len(data))]
                       if t.metaroce else [], data[m:m + m // 2], ack_req=1, offset=m)
    got = peer.exchange(short, until=lambda ps: bool(ps))
    fatal_reply(t, peer, got, 1, e, "RESP-15", f"a WRITE_MIDDLE of {m // 2} B (MTU {m})")
    after_error(t, peer, "QP-1", "a segmentation error")


@case("access.ahead", "SACK-11 SACK-7 EM-1", modes=MR)
def t_fatal_ahead(t):
    """A fatal error on a packet ahead of a hole: the fatal SACK names that packet's PSN with a
    zero bitmap, and the QP then accepts nothing, not even the missing PSN."""
    peer = t.peer(fresh=True)
    e = peer.psn
    bad = peer.frame(peer.op(O.RC_RDMA_WRITE_ONLY), psn_add(e, 1),
                     [RETH(va=peer.ep.addr + 512, rkey=peer.ep.rkey ^ 0x00A50001, dma_len=32)],
                     pattern(32, 8), ack_req=1, ssn=peer.ssn + 1)
    got = peer.exchange(bad, until=lambda ps: bool(ps))
    fatal_reply(t, peer, got, 2, psn_add(e, 1), "SACK-11",
                "a WRITE with a bad R_Key one PSN ahead of a hole")
    hole = peer.write_frames(peer.ep.addr + 256, pattern(32, 9), psn=e)
    peer.silence(hole, "SACK-11", "the missing PSN after a fatal SACK (the QP is in ERR)")


# ---- READ -----------------------------------------------------------------------------------

@case("read.segments", "SEQ-4 QP-4 RESP-2 HDR-7")
def t_read_segments(t):
    """A 3*MTU+1 READ returns FIRST, MIDDLE, MIDDLE, LAST with PSNs P..P+3 and the data; the
    next request uses P+4."""
    peer = t.peer()
    n = 3 * peer.mtu + 1
    data = pattern(n, 81)
    seed_bytes(t, peer, 20000, data)
    first = peer.psn
    got, resp = peer.read(20000, n)
    check(got == data, "SEQ-4", "READ data differs from the region")
    ops = [p.bth.opcode & 0x3F for p in resp]
    check(ops == [O.RC_RDMA_READ_RESPONSE_FIRST, O.RC_RDMA_READ_RESPONSE_MIDDLE,
                  O.RC_RDMA_READ_RESPONSE_MIDDLE, O.RC_RDMA_READ_RESPONSE_LAST], "SEQ-4",
          f"READ response opcodes {[hex(o) for o in ops]}")
    check([len(p.payload) for p in resp] == [peer.mtu] * 3 + [1], "QP-4",
          f"READ response payloads {[len(p.payload) for p in resp]}, MTU {peer.mtu}")
    if not t.metaroce:
        check(all(p.get(AETH) is not None for p in (resp[0], resp[3])) and
              resp[1].get(AETH) is None, "SEQ-4", "AETH must be on FIRST and LAST, not MIDDLE")
        check(resp[3].get(AETH).msn == peer.msn, "HDR-7",
              f"READ LAST MSN {resp[3].get(AETH).msn}, expected {peer.msn}")
    else:
        for i, p in enumerate(resp):
            pe = p.get(PETH)
            check(pe.offset == i * peer.mtu, "EXT-5", f"READ response {i} PETH.Offset {pe.offset}")
            check(pe.ssn == (peer.ssn - 1) & C.PSN_MASK, "EXT-5",
                  f"READ response SSN {pe.ssn}, request SSN {peer.ssn - 1}")
    check(peer.psn == psn_add(first, 4), "SEQ-4", "PSN bookkeeping")
    peer.write(0, b"next after read", clause="SEQ-4")


@case("read.beyond_window", "SACK-9 SEQ-4", modes=MR)
def t_read_window(t):
    """A READ whose responses need more PSNs than the receive window W is answered in full, and
    the next request (W + 4 PSNs later) is accepted."""
    peer = t.peer()
    w = peer.ep.window
    if not w:
        raise Skip("the description gives no MetaRoCE window (\"window\")")
    n = w + 4
    if n * peer.mtu + 4096 > peer.ep.length:
        raise Skip(f"a READ of {n} MTUs needs a region of {n * peer.mtu + 4096} B")
    first = peer.psn
    frame = peer.read_frame(peer.ep.addr, n * peer.mtu)
    last = psn_add(first, n - 1)
    got = peer.exchange(frame, timeout=3.0, until=lambda ps: any(
        p.bth.psn == last and p.bth.opcode in READ_RESP for p in ps))
    psns = {p.bth.psn for p in got if p.bth.opcode in READ_RESP}
    missing = [i for i in range(n) if psn_add(first, i) not in psns]
    check(not missing, "SACK-9", f"a READ of {n} PSNs (window {w}): responses "
          f"{len(psns)} of {n}, first missing +{missing[0] if missing else 0}")
    peer.advance(n)
    peer.write(0, b"after a READ wider than the window", clause="SACK-9")


@case("read.only", "SEQ-4 RESP-10")
def t_read_only(t):
    """A small READ returns one READ_RESPONSE_ONLY with the request's PSN."""
    peer = t.peer()
    data = pattern(40, 82)
    seed_bytes(t, peer, 30000, data)
    first = peer.psn
    got, resp = peer.read(30000, 40)
    check(got == data, "SEQ-4", "READ data differs")
    check(resp[0].bth.opcode & 0x3F == O.RC_RDMA_READ_RESPONSE_ONLY and resp[0].bth.psn == first,
          "SEQ-4", f"expected READ_RESPONSE_ONLY at PSN {first}, got {describe(resp)}")


@case("read.duplicate", "RESP-4 SACK-3")
def t_read_duplicate(t):
    """A duplicate READ request is answered again with the same data."""
    peer = t.peer()
    n = 2 * peer.mtu
    data = pattern(n, 83)
    seed_bytes(t, peer, 40000, data)
    first, ssn = peer.psn, peer.ssn
    got1, _ = peer.read(40000, n)
    peer.write(0, b"in between".ljust(16, b"."))
    f = peer.frame(peer.op(O.RC_RDMA_READ_REQUEST), first,
                   [RETH(va=peer.ep.addr + 40000, rkey=peer.ep.rkey, dma_len=n)], ack_req=1,
                   ssn=ssn)
    last = psn_add(first, 1)
    got = peer.exchange(f, until=lambda ps: any(p.bth.psn == last and p.bth.opcode in READ_RESP
                                                for p in ps))
    resp = {p.bth.psn: p for p in got if p.bth.opcode in READ_RESP}
    check(first in resp and last in resp, "RESP-4",
          f"duplicate READ at PSN {first}: expected responses {first}, {last}, got {describe(got)}")
    check(resp[first].payload + resp[last].payload == data == got1, "RESP-4",
          "duplicate READ returned different data")
    still_works(peer, "RESP-4", "a duplicate READ")


# ---- atomics --------------------------------------------------------------------------------

@case("atomic.ops", "HDR-10 SEQ-5")
def t_atomics(t):
    """FETCH_ADD returns the old value and adds; COMPARE_SWAP swaps only on a match."""
    peer = t.peer()
    seed_bytes(t, peer, 4096, struct.pack("<Q", 1000))
    old, _ = peer.atomic(True, 4096, 234)
    check(old == 1000, "HDR-10", f"FETCH_ADD returned {old}, memory held 1000")
    old, _ = peer.atomic(False, 4096, swap_add=7, compare=999)
    check(old == 1234, "HDR-10", f"COMPARE_SWAP (no match) returned {old}, expected 1234")
    old, _ = peer.atomic(False, 4096, swap_add=7, compare=1234)
    check(old == 1234, "HDR-10", f"COMPARE_SWAP (match) returned {old}, expected 1234")
    val = struct.unpack("<Q", dut_bytes(t, peer, 4096, 8))[0]
    check(val == 7, "HDR-10", f"after FETCH_ADD 234 and a matching swap to 7 memory holds {val}")


@case("atomic.duplicate", "RESP-4 SEQ-5")
def t_atomic_dup(t):
    """A duplicate FETCH_ADD returns the saved original value and is not executed again."""
    peer = t.peer()
    seed_bytes(t, peer, 8192, struct.pack("<Q", 50))
    at = peer.psn
    old, _ = peer.atomic(True, 8192, 5)
    check(old == 50, "HDR-10", f"FETCH_ADD returned {old}, expected 50")
    again, _ = peer.atomic(True, 8192, 5, psn=at)
    check(again == 50, "RESP-4", f"the duplicate FETCH_ADD returned {again}, not the saved 50")
    val = struct.unpack("<Q", dut_bytes(t, peer, 8192, 8))[0]
    check(val == 55, "RESP-4", f"memory holds {val} after one FETCH_ADD of 5 and its duplicate")
    still_works(peer, "RESP-4", "a duplicate atomic")


# ---- SEND and immediate data ----------------------------------------------------------------

@case("imm.write", "SEQ-3 HDR-9 SEQ-2 PLACE-3")
def t_imm(t):
    """WRITE_WITH_IMMEDIATE and SEND_WITH_IMMEDIATE complete a receive with the immediate."""
    t.adapter.need("recv", "post receives and see completions")
    peer = t.peer()
    t.adapter.post_recv(peer.ep, 1, 300000, 8192)
    t.adapter.post_recv(peer.ep, 2, 310000, 8192)
    data = pattern(2 * peer.mtu + 7, 91)
    first = peer.psn
    frames = peer.write_frames(peer.ep.addr + 50000, data, imm=0xC0FFEE01)
    got = peer.exchange(frames, until=lambda ps: peer.covering_ack(ps, psn_add(first, 2)))
    check(peer.covering_ack(got, psn_add(first, 2)), "SEQ-3",
          f"WRITE_WITH_IMMEDIATE not acknowledged: {describe(got)}")
    peer.advance(3, recv=True)
    sdata = pattern(peer.mtu + 3, 92)
    frames = peer.send_frames(sdata, imm=0x12345678)
    got = peer.exchange(frames, until=lambda ps: peer.covering_ack(ps, psn_add(peer.psn, 1)))
    check(peer.covering_ack(got, psn_add(peer.psn, 1)), "SEQ-2",
          f"SEND_WITH_IMMEDIATE not acknowledged: {describe(got)}")
    peer.advance(2, recv=True)
    wcs = t.adapter.completions(peer.ep, 2)
    check(wcs[0].wr_id == 1 and wcs[0].imm_data == 0xC0FFEE01 and wcs[0].byte_len == len(data),
          "HDR-9", f"WRITE_WITH_IMMEDIATE completion {wcs[0]}")
    check(wcs[1].wr_id == 2 and wcs[1].imm_data == 0x12345678 and wcs[1].byte_len == len(sdata),
          "HDR-9", f"SEND_WITH_IMMEDIATE completion {wcs[1]}")
    check(t.adapter.read_mem(peer.ep, 50000, len(data)) == data, "SEQ-3", "WRITE data differs")
    check(t.adapter.read_mem(peer.ep, 310000, len(sdata)) == sdata, "SEQ-2", "SEND data differs")


@case("imm.oversize", "SEQ-2 RESP-5 ERR-1")
def t_send_oversize(t):
    """A SEND longer than the receive buffer is an invalid request (NAK 0x61)."""
    t.adapter.need("recv", "post receives")
    peer = t.peer(fresh=True)
    t.adapter.post_recv(peer.ep, 9, 300000, 64)
    e = peer.psn
    got = peer.exchange(peer.send_frames(pattern(200, 1)), until=lambda ps: bool(ps))
    fatal_reply(t, peer, got, 1, e, "SEQ-2", "SEND of 200 B into a 64 B receive")
    wcs = t.adapter.completions(peer.ep, 1, timeout=1.0)
    check(wcs[0].wr_id == 9 and wcs[0].status != 0, "ERR-1",
          f"the receive completed with {wcs[0]} after an oversize SEND")


@case("imm.invalidate", "HDR-15 HDR-14 EXT-8 EM-1")
def t_invalidate(t):
    """A SEND with invalidate either completes with its key invalidated (the key then fails
    with NAK 0x62) or, on a device without the optional feature, gets NAK 0x61 and the QP goes
    to ERR; it is never silently dropped."""
    peer = t.peer(fresh=True)
    if "recv" in t.adapter.caps:
        t.adapter.post_recv(peer.ep, 88, 300000, 4096)
    e = peer.psn
    f = peer.frame(peer.op(O.RC_SEND_ONLY_WITH_INVALIDATE), e, [IETH(peer.ep.rkey)],
                   pattern(48, 10), ack_req=1)
    got = peer.exchange(f, until=lambda ps: bool(ps))
    if any(is_rnr(p) for p in got):
        raise Skip("the DUT implements send with invalidate but has no receive posted")
    if peer.covering_ack(got, e):                                    # implemented
        peer.advance(1, recv=True)
        wc = None
        if "recv" in t.adapter.caps:
            wc = t.adapter.completions(peer.ep, 1, timeout=1.0)[0]
        after = peer.write_frames(peer.ep.addr, b"key gone?".ljust(16, b"."))
        if wc is not None and wc.status != 0:     # IBTA class J: acknowledged, then ERR
            peer.silence(after, "HDR-15", f"a WRITE after a SEND with invalidate whose "
                         f"receive completed with status {wc.status} (the QP is in ERR)")
            t.adapter.consumed(peer.ep)
            peer.broken = True
            t.note(f"HDR-15: the key was not invalidated; the SEND was acknowledged, its receive "
                   f"completed with status {wc.status} and the QP entered ERR (class J)")
            return
        got = peer.exchange(after, until=lambda ps: bool(ps))
        fatal_reply(t, peer, got, 2, peer.psn, "HDR-15", "a WRITE with the invalidated key")
        return
    check(got, "HDR-15", "a SEND with invalidate was silently dropped (a device without the "
          "feature answers NAK 0x61)")
    fatal_reply(t, peer, got, 1, e, "HDR-15" if not t.metaroce else "EXT-8",
                "a SEND with invalidate on a device without it")
    after_error(t, peer, "QP-1", "an unimplemented SEND with invalidate")


# ---- congestion notification ----------------------------------------------------------------

@case("cc.cnp_gen", "COMPAT-7 COMPAT-4 WIRE-8 HDR-11", modes=ROCE)
def t_cnp_gen(t):
    """A CE-marked request is accepted and answered by a CNP to the sender's QP, also when the
    request is acknowledged too (a reply does not replace the CNP)."""
    peer = t.peer()
    data = pattern(64, 101)
    f = peer.frame(O.RC_RDMA_WRITE_ONLY, peer.psn,
                   [RETH(va=peer.ep.addr + 60000, rkey=peer.ep.rkey, dma_len=64)], data,
                   ip_kw={"ecn": C.ECN_CE})
    got = peer.exchange(f, until=lambda ps: bool(ps))
    peer.advance(1)
    cnps = [p for p in got if p.bth.opcode == O.CNP]
    check(dut_bytes(t, peer, 60000, 64) == data, "WIRE-8", "a CE-marked WRITE was not placed")
    if not cnps:
        raise Skip("the DUT generates no CNP (COMPAT-4 makes it optional)")
    c = cnps[0]
    check(c.bth.dest_qp == peer.ep.tester_qpn and c.bth.becn == 1, "HDR-11",
          f"CNP DestQP 0x{c.bth.dest_qp:06x} BECN {c.bth.becn}, expected the tester's QP "
          f"0x{peer.ep.tester_qpn:06x} and BECN 1")
    time.sleep(0.002)                                # well past the CNP interval (50 us)
    f = peer.frame(O.RC_RDMA_WRITE_ONLY, peer.psn,
                   [RETH(va=peer.ep.addr + 60100, rkey=peer.ep.rkey, dma_len=8)], b"ce-ackrq",
                   ack_req=1, ip_kw={"ecn": C.ECN_CE})
    got = peer.exchange(f, until=lambda ps: peer.covering_ack(ps, peer.psn) and
                        any(p.bth.opcode == O.CNP for p in ps))
    check(peer.covering_ack(got, peer.psn), "WIRE-8",
          f"CE-marked WRITE with AckReq not acknowledged: {describe(got)}")
    peer.advance(1)
    if not any(p.bth.opcode == O.CNP for p in got):    # one answer per packet: the CNP may come
        nxt = peer.frame(O.RC_RDMA_WRITE_ONLY, peer.psn,  # with the next request (COMPAT-7)
                         [RETH(va=peer.ep.addr + 60200, rkey=peer.ep.rkey, dma_len=8)], b"after-ce")
        got += peer.exchange(nxt, until=lambda ps: any(p.bth.opcode == O.CNP for p in ps))
        peer.advance(1)
    check(any(p.bth.opcode == O.CNP for p in got), "COMPAT-7",
          f"a CE-marked WRITE that is also ACKed got no CNP, not even with the next request: "
          f"{describe(got)}")


@case("cc.ce_echo", "CC-7 CC-14 WIRE-8 SACK-2", modes=MR)
def t_ce_echo(t):
    """A CE-marked packet is accepted; the SACK carries flag E and a growing CE count."""
    peer = t.peer()
    counts = []
    for i in range(2):
        f = peer.frame(peer.op(O.RC_RDMA_WRITE_ONLY), peer.psn,
                       [RETH(va=peer.ep.addr + 60000 + 64 * i, rkey=peer.ep.rkey, dma_len=64)],
                       pattern(64, i), ack_req=1, ip_kw={"ecn": C.ECN_CE})
        got = peer.exchange(f, until=lambda ps: peer.covering_ack(ps, peer.psn))
        a = peer.covering_ack(got, peer.psn)
        check(a is not None, "WIRE-8", f"CE-marked WRITE not acknowledged: {describe(got)}")
        peer.advance(1)
        sk = a.get(SACKETH)
        check(sk.flags & C.SACK_F_ECE, "CC-7", "SACK for a CE-marked packet without flag E")
        check(not any(p.bth.opcode == O.CNP for p in got), "CC-14",
              "a CNP on a MetaRoCE connection that did not accept CNP_EXT")
        counts.append(sk.ce_count)
    check(counts[1] > counts[0] >= 1, "CC-7", f"SACKETH CE count did not grow: {counts}")


@case("cc.cnp_rx", "HDR-11 HDR-12 COMPAT-8 CC-7")
def t_cnp_rx(t):
    """A CNP to the DUT's QP is never answered, and is taken whatever its P_Key (counted by the
    reference)."""
    peer = t.peer()
    for pkey, clause in ((C.DEFAULT_PKEY, "CC-7" if t.metaroce else "COMPAT-8"),
                         (0x1234, "HDR-12")):
        before = t.adapter.qp_info(peer.ep) if "counters" in t.adapter.caps else None
        peer.silence(peer.cnp_frame(pkey), "HDR-11", f"a CNP with P_Key 0x{pkey:04x}")
        if before is not None:
            after = t.adapter.qp_info(peer.ep)
            check(after.get("rp_cnp_handled", 0) > before.get("rp_cnp_handled", 0), clause,
                  f"a CNP with P_Key 0x{pkey:04x} was not taken as a congestion signal "
                  f"(rp_cnp_handled unchanged)")
    still_works(peer, "HDR-11", "a CNP")


# ---- negotiation: opcode spaces -------------------------------------------------------------

@case("neg.foreign_opcodes", "CM-7 EXT-2 HDR-4 COMPAT-1")
def t_foreign(t):
    """The other mode's opcodes are discarded: MetaRoCE opcodes on a compat QP (CM-7), RC
    opcodes on a MetaRoCE QP (EXT-2)."""
    peer = t.peer()
    data = pattern(64, 111)

    def build():
        reth = RETH(va=peer.ep.addr + 256, rkey=peer.ep.rkey, dma_len=64)
        if t.metaroce:
            return peer.frame(O.RC_RDMA_WRITE_ONLY, peer.psn, [reth], data, ack_req=1)
        return peer.frame(O.MR_RDMA_WRITE_ONLY, peer.psn,
                          [PETH(path_id=0, ssn=0, offset=0), reth], data, ack_req=1)
    clause = "EXT-2" if t.metaroce else "CM-7"
    _silent_drop(t, peer, build, clause, "a WRITE_ONLY in the other mode's opcode space")


@case("neg.reserved_peth", "EXT-4 VER-3 REG-6", modes=MR)
def t_peth_reserved(t):
    """A PETH with a reserved bit set is discarded."""
    peer = t.peer()

    def build():
        [f], _ = _probe_write(t, peer)
        b = bytearray(f)
        b[14 + 20 + 8 + 12 + 1] |= 0x01              # an undefined PETH flag bit
        return reicrc(bytes(b))
    _silent_drop(t, peer, build, "EXT-4", "PETH with an undefined flag bit")


# ---- multipath and reordering (MetaRoCE) -----------------------------------------------------

@case("mp.reverse", "SACK-1 PLACE-1 PLACE-2 MP-2 SACK-2 WIRE-16 SM-5", modes=MR)
def t_reverse(t):
    """A 12-packet WRITE delivered in reverse order over four source ports is placed once,
    fully acknowledged, and each SACK echoes the triggering packet's PathID and timestamp."""
    peer = t.peer()
    n = 12
    data = pattern(n * peer.mtu, 121)
    sports = [0xC100, 0xD200, 0xE300, 0xF400]
    frames = peer.write_frames(peer.ep.addr + 100000, data, sports=sports)
    last = psn_add(peer.psn, n - 1)
    got = peer.exchange(list(reversed(frames)), timeout=0.3)
    for p in got:
        check(not is_nak(p) and not is_rnr(p), "SACK-1", f"NAK during reordering: {describe([p])}")
        sk = sack_of(p)
        check(sk is not None, "EXT-2", f"a non-SACK reply to requests: {describe([p])}")
        check(sk.path_id < len(sports), "MP-2", f"SACK PathID {sk.path_id} was never sent")
    oo = [p for p in got if sack_of(p) and sack_of(p).flags & C.SACK_F_OOO]
    check(oo, "SACK-2", f"reversed arrivals: no SACK with flag O, got {describe(got)}")
    # the requester's tail probe: the last packet again with ACK_NOW
    probe = peer.frame(peer.op(O.RC_RDMA_WRITE_LAST), last,
                       [RETH(va=peer.ep.addr + 100000, rkey=peer.ep.rkey, dma_len=len(data))],
                       data[(n - 1) * peer.mtu:], peth_flags=C.PETH_F_ACK_NOW | C.PETH_F_RETX,
                       offset=(n - 1) * peer.mtu, path=3, sport=sports[3])
    got = peer.exchange(probe, until=lambda ps: peer.covering_ack(ps, last))
    a = peer.covering_ack(got, last)
    check(a is not None, "SACK-1",
          f"reversed WRITE: no SACK covering PSN {last} after a tail probe: {describe(got)}")
    check(a.get(SACKETH).path_id == 3, "MP-2",
          f"SACK PathID {a.get(SACKETH).path_id}, the triggering packet's was 3")
    check(a.udp.sport == sports[3], "WIRE-16",
          f"SACK source port 0x{a.udp.sport:04x}, the triggering packet's was 0x{sports[3]:04x}")
    check(a.get(SACKETH).ts_echo == peer.ts, "SACK-2",
          f"SACK timestamp echo {a.get(SACKETH).ts_echo}, the packet's was {peer.ts}")
    peer.advance(n)
    check(dut_bytes(t, peer, 100000, len(data)) == data, "PLACE-2",
          "reversed WRITE: region differs")


@case("mp.duplicate_in_window", "SACK-3 PLACE-1", modes=MR)
def t_dup_in_window(t):
    """A packet already recorded beyond a hole is not placed again and is SACKed."""
    peer = t.peer()
    e = peer.psn
    d2 = pattern(64, 131)
    f2 = peer.frame(peer.op(O.RC_RDMA_WRITE_ONLY), psn_add(e, 1),
                    [RETH(va=peer.ep.addr + 70000, rkey=peer.ep.rkey, dma_len=64)], d2,
                    ssn=peer.ssn + 1, peth_flags=C.PETH_F_ACK_NOW)
    peer.exchange(f2, until=lambda ps: bool(ps))
    f2b = peer.frame(peer.op(O.RC_RDMA_WRITE_ONLY), psn_add(e, 1),
                     [RETH(va=peer.ep.addr + 70000, rkey=peer.ep.rkey, dma_len=64)],
                     b"\xAB" * 64, ssn=peer.ssn + 1, peth_flags=C.PETH_F_ACK_NOW)
    got = peer.exchange(f2b, until=lambda ps: bool(ps))
    s = [p for p in got if p.bth.opcode == O.MR_SACK]
    check(s and psn_add(e, 1) in s[0].get(SACKETH).sacked(s[0].bth.psn), "SACK-3",
          f"duplicate inside the window with ACK_NOW: expected a SACK reporting it, "
          f"got {describe(got)}")
    check(dut_bytes(t, peer, 70000, 64) == d2, "SACK-3", "a recorded PSN was placed again")
    f0 = peer.write_frames(peer.ep.addr + 70100, pattern(16, 2), psn=e)
    got = peer.exchange(f0, until=lambda ps: peer.covering_ack(ps, psn_add(e, 1)))
    check(peer.covering_ack(got, psn_add(e, 1)), "SACK-1",
          f"hole filled: cumulative PSN did not pass the recorded packet: {describe(got)}")
    peer.psn = psn_add(e, 2)
    peer.ssn += 2
    peer.msn = (peer.msn + 2) & C.MSN_MASK


@case("mp.read_waits", "PLACE-5 SEQ-7", modes=MR)
def t_read_waits(t):
    """A READ that arrives before an earlier WRITE is executed only after it: it returns the
    written data."""
    peer = t.peer()
    seed_bytes(t, peer, 80000, b"\0" * 64)
    e = peer.psn
    new = pattern(64, 141)
    w = peer.write_frames(peer.ep.addr + 80000, new, psn=e, ack=False)
    r = peer.frame(peer.op(O.RC_RDMA_READ_REQUEST), psn_add(e, 1),
                   [RETH(va=peer.ep.addr + 80000, rkey=peer.ep.rkey, dma_len=64)], ack_req=1,
                   ssn=peer.ssn + 1)
    early = peer.exchange(r, timeout=SILENCE_S)
    stale = [p for p in early if p.bth.opcode in READ_RESP]
    check(all(p.payload == new for p in stale), "PLACE-5",
          "a READ was executed before the earlier WRITE arrived (returned old data)")
    got = peer.exchange(w + [r], until=lambda ps: any(p.bth.opcode in READ_RESP for p in ps))
    resp = [p for p in got if p.bth.opcode in READ_RESP]
    check(resp and resp[-1].payload == new, "PLACE-5",
          f"READ after the WRITE: expected the written data, got {describe(got)}")
    peer.psn = psn_add(e, 2)
    peer.ssn += 2
    peer.msn = (peer.msn + 2) & C.MSN_MASK


# ---- the DUT as requester (reference: post_send) ---------------------------------------------

def _requests(t, peer, wr, n_expected, timeout=1.5):
    t.adapter.post_send(peer.ep, wr)
    got = peer.wire.collect(timeout, until=lambda ps: len([p for p in ps if p.bth.opcode not in
                                                           (O.RC_ACKNOWLEDGE, O.MR_SACK)])
                            >= n_expected)
    return [p for p in got if p.bth.dest_qp == peer.ep.tester_qpn]


@case("req.segmentation", "SEQ-1 QP-4 RESP-1 WIRE-2 COMPAT-5 EXT-5 PLACE-2 COMPAT-1")
def t_req_segments(t):
    """The DUT sends a 3*MTU+1 WRITE as FIRST, MIDDLE, MIDDLE, LAST with consecutive PSNs,
    AckReq on the last, one source port in 0xC000-0xFFFF; the ACK completes it."""
    t.adapter.need("post_send", "make the DUT send requests")
    from ..verbs import IBV_WR_RDMA_WRITE, SendWR  # noqa: PLC0415
    peer = t.peer()
    peer.wire.drain()
    n = 3 * peer.mtu + 1
    local = peer.ep.handle["local"]
    local.write(pattern(n, 151))
    pk = _requests(t, peer, SendWR(IBV_WR_RDMA_WRITE, wr_id=5, sg_list=[local.sge(0, n)],
                                   remote_addr=0x1000, rkey=0xABCD), 4)
    check(len(pk) == 4, "SEQ-1", f"expected 4 WRITE packets, got {describe(pk)}")
    ops = [p.bth.opcode & 0x3F for p in pk]
    check(ops == [O.RC_RDMA_WRITE_FIRST, O.RC_RDMA_WRITE_MIDDLE, O.RC_RDMA_WRITE_MIDDLE,
                  O.RC_RDMA_WRITE_LAST], "SEQ-1", f"opcodes {[hex(o) for o in ops]}")
    check(all(p.bth.opcode >= 0xC0 for p in pk) == t.metaroce, "COMPAT-1" if not t.metaroce
          else "EXT-2", "requests in the wrong mode's opcode space")
    check([len(p.payload) for p in pk] == [peer.mtu] * 3 + [1], "QP-4",
          f"payloads {[len(p.payload) for p in pk]}, MTU {peer.mtu}")
    check([p.bth.psn for p in pk] == [psn_add(peer.ep.psn, i) for i in range(4)], "SEQ-1",
          f"PSNs {[p.bth.psn for p in pk]} from start PSN {peer.ep.psn}")
    check(pk[-1].bth.ack_req == 1, "RESP-1", "no AckReq on the last packet of the message")
    ports = {p.udp.sport for p in pk}
    check(all(0xC000 <= s <= 0xFFFF for s in ports), "WIRE-2", f"source ports {ports}")
    if not t.metaroce:
        check(len(ports) == 1, "COMPAT-5", f"a compat QP used source ports {ports}")
    else:
        for i, p in enumerate(pk):
            pe, reth = p.get(PETH), p.get(RETH)
            check(pe is not None and pe.offset == i * peer.mtu, "EXT-5", f"packet {i} PETH {pe}")
            check(reth is not None and reth.dma_len == n, "PLACE-2", f"packet {i} RETH {reth}")
    check(b"".join(p.payload for p in pk) == pattern(n, 151), "SEQ-1", "payload differs")
    peer.send(peer.ack_frame(pk[-1].bth.psn, msn=1))
    wcs = t.adapter.completions(peer.ep, 1)
    check(wcs[0].wr_id == 5 and wcs[0].status == 0, "RESP-2", f"completion {wcs[0]}")


@case("req.forged_ack", "RESP-12 SEC-8 COMPAT-3 SACK-4 SM-2 SM-4 EM-2")
def t_req_forged(t):
    """An ACK beyond what the DUT sent completes nothing; a NAK 0x60 (compat) or a SACK with a
    hole (MetaRoCE) makes it resend only what is missing."""
    t.adapter.need("post_send", "make the DUT send requests")
    from ..verbs import IBV_WR_RDMA_WRITE, SendWR  # noqa: PLC0415
    peer = t.peer()
    peer.wire.drain()
    n = 4 * peer.mtu
    local = peer.ep.handle["local"]
    local.write(pattern(n, 161))
    pk = _requests(t, peer, SendWR(IBV_WR_RDMA_WRITE, wr_id=6, sg_list=[local.sge(0, n)],
                                   remote_addr=0x2000, rkey=0xABCD), 4)
    check(len(pk) == 4, "SEQ-1", f"expected 4 WRITE packets, got {describe(pk)}")
    p0 = pk[0].bth.psn
    peer.send(peer.ack_frame(psn_add(p0, 40), msn=1))       # beyond anything sent
    time.sleep(0.2)
    check(not t.adapter.poll(peer.ep), "RESP-12", "an ACK for unsent PSNs completed the WRITE")
    peer.wire.drain()
    if t.metaroce:
        peer.send(peer.sack_frame(p0, [psn_add(p0, 2), psn_add(p0, 3)]))
        clause = "SACK-4"
    else:
        peer.send(peer.ack_frame(psn_add(p0, 1), syn=0x60, msn=0))
        clause = "COMPAT-3"
    got = peer.wire.collect(1.0, until=lambda ps: any(p.bth.psn == psn_add(p0, 1) for p in ps))
    re = [p for p in got if p.bth.dest_qp == peer.ep.tester_qpn and not is_ack_like(p)]
    check(re and re[0].bth.psn == psn_add(p0, 1), clause,
          f"after loss of PSN {psn_add(p0, 1)}: resend from it expected, got {describe(re)}")
    if t.metaroce:
        check(all(p.bth.psn == psn_add(p0, 1) for p in re), "SACK-4",
              f"SACKed PSNs were retransmitted: {describe(re)}")
        check(re[0].get(PETH).flags & C.PETH_F_RETX, "EXT-5", "retransmission without PETH.R")
    peer.send(peer.ack_frame(psn_add(p0, 3), msn=1))
    wcs = t.adapter.completions(peer.ep, 1)
    check(wcs[0].wr_id == 6 and wcs[0].status == 0, "RESP-2", f"completion {wcs[0]}")


@case("req.rnr_wait", "RESP-6 SACK-6 SACK-10 EM-2")
def t_req_rnr(t):
    """After an RNR NAK with timer code 18 (5.12 ms) the DUT waits at least that long before
    resending the SEND."""
    t.adapter.need("post_send", "make the DUT send requests")
    from ..verbs import IBV_WR_SEND, SendWR  # noqa: PLC0415
    peer = t.peer()
    peer.wire.drain()
    local = peer.ep.handle["local"]
    local.write(b"rnr-test" * 8)
    pk = _requests(t, peer, SendWR(IBV_WR_SEND, wr_id=7, sg_list=[local.sge(0, 64)]), 1)
    check(pk, "SEQ-2", "the DUT sent no SEND")
    p = pk[0].bth.psn
    t0 = time.monotonic()
    if t.metaroce:
        peer.send(peer.frame(O.MR_SACK, psn_add(p, -1), [AETH(0x20 | 18, 0), SACKETH()]))
    else:
        peer.send(peer.ack_frame(p, syn=0x20 | 18))
    got = peer.wire.collect(1.0, until=lambda ps: any(q.bth.psn == p and not is_ack_like(q)
                                                      for q in ps))
    again = [q for q in got if q.bth.psn == p and not is_ack_like(q)]
    check(again, "RESP-6", "the SEND was not resent after the RNR NAK")
    first_t = next(s.t for s in peer.wire.log if s.pkt is again[0])
    check(first_t - t0 >= 0.00512, "RESP-6",
          f"resent {1000 * (first_t - t0):.2f} ms after an RNR NAK of 5.12 ms")
    peer.send(peer.ack_frame(p, msn=1))
    wcs = t.adapter.completions(peer.ep, 1)
    check(wcs[0].wr_id == 7 and wcs[0].status == 0, "RESP-6", f"completion {wcs[0]}")


# ---- negotiated integrity (option CSUM) -----------------------------------------------------

@case("int.csum", "INT-3 INT-2 INT-1 ICRC-1 ERR-2", modes=MR)
def t_csum(t):
    """On a connection that negotiated CSUM the IPv4/UDP checksums are checked in place of the
    ICRC: a valid WRITE is placed and acknowledged by packets that carry both checksums and the
    ICRC; a flipped payload bit (ICRC recomputed, so only the checksum can catch it), a zero
    UDP checksum and a wrong IPv4 header checksum are each discarded, write nothing and change
    no state."""
    peer = t.peer(csum=True)
    mark = len(t.wire.log)
    data = pattern(64, 11)
    peer.write(1024, data, clause="INT-3")
    check(dut_bytes(t, peer, 1024, 64) == data, "INT-3", "a valid WRITE on a CSUM connection "
          "was not placed")
    for s in t.wire.log[mark:]:
        check(udp_checksum_ok(s.raw) is True, "INT-2", f"the DUT sent opcode "
              f"0x{s.pkt.bth.opcode:02x} on a CSUM connection without valid IPv4/UDP checksums")

    def flipped():                  # the ICRC follows the flip: only the checksum can see it
        [f], _ = _probe_write(t, peer)
        b = bytearray(f)
        b[-10] ^= 0x01
        return reicrc(bytes(b))
    _silent_drop(t, peer, flipped, "INT-3", "WRITE with a payload bit flipped (ICRC valid)")

    def no_checksum():
        [f], _ = _probe_write(t, peer)
        b = bytearray(f)
        b[14 + 20 + 6:14 + 20 + 8] = b"\0\0"
        return bytes(b)
    if not peer.ep.ip.count(":"):
        _silent_drop(t, peer, no_checksum, "INT-3", "WRITE without a UDP checksum")

        def bad_ip_header():        # TTL changed without fixing the header checksum
            [f], _ = _probe_write(t, peer)
            b = bytearray(f)
            b[14 + 8] ^= 0x01
            return bytes(b)
        _silent_drop(t, peer, bad_ip_header, "INT-3", "WRITE with a wrong IPv4 header checksum")


# ---- the whole run's capture (runs last) -----------------------------------------------------

@case("neg.audit", "COMPAT-1 CM-7 EXT-2 EXT-6 ICRC-1 ICRC-2 ICRC-5 ICRC-6 WIRE-1 WIRE-4 HDR-3 HDR-5 HDR-6 EXT-3 EXT-4 REG-1 REG-3 REG-7")
def t_audit(t):
    """Every frame the DUT sent during the run parses (ICRC, layout, syndromes, reserved
    fields) and uses only its mode's opcodes; no NAK 0x60 in MetaRoCE mode."""
    frames = t.wire.log
    check(frames, "WIRE-1", "the DUT sent nothing during the run")
    for s in frames:
        check(s.pkt is not None, "ICRC-1", f"a DUT frame does not parse: {s.error}")
        op = s.pkt.bth.opcode
        if t.metaroce:
            check(op >= 0xC0 or op == O.CNP, "EXT-2", f"RC opcode 0x{op:02x} on a MetaRoCE QP")
            check(not is_nak(s.pkt, 0), "EXT-6", "NAK 0x60 in MetaRoCE mode")
        else:
            check(op < 0xC0, "COMPAT-1", f"opcode 0x{op:02x} sent to a compat-mode peer")
        check(s.pkt.udp.dport == C.ROCEV2_UDP_PORT, "WIRE-1", "destination port not 4791")


ORDER_LAST = ("neg.audit",)


def cases() -> list[Case]:
    return sorted(CASES, key=lambda c: c.id in ORDER_LAST)


