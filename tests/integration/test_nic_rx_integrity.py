"""The negotiated integrity check in the kernel (spec 5.7, INT-2, INT-3, INT-5), through the loaded
XDP program with BPF_PROG_TEST_RUN: a QP that negotiated CSUM takes packets whose IPv4 header and
UDP checksums hold and refuses (bad_csum) every other, whatever their ICRC; a QP with the ICRC
refuses a bad ICRC whatever the checksums; both on linear and multi-buffer frames (a 4 KiB
payload); the replies of a CSUM QP carry both checksums and the ICRC; the port counters say
which check ran."""

import os
import random
import struct

import pytest

from metaroce.conformance.tester import reicrc
from metaroce.fuzz.frames import fix_udp
from metaroce.nic.rx import ACCESS_LOCAL_WRITE, ACCESS_REMOTE_READ, ACCESS_REMOTE_WRITE
from metaroce.wire import consts as C
from metaroce.wire.headers import BTH, PETH, RETH
from metaroce.wire.packet import UDP, Ethernet, IPv4, IPv6, RocePacket, parse_frame, \
    udp_checksum_ok

XDP_DROP, XDP_PASS, XDP_TX = 1, 2, 3
QPN, PD, PEER = 0x000a11, 5, 0x000b22
INT_ICRC, INT_CSUM = 0, 1
O = C.Opcode
ALL = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ


@pytest.fixture
def mr(rx):
    m = rx.reg_mr(64 * 1024, PD, ALL)
    yield m
    rx.dereg_mr(m)
    rx.del_qp(QPN)


def arm(rx, integrity, epsn=100):
    rx.del_qp(QPN)
    rx.set_qp(QPN, epsn=epsn, pd=PD, dqpn=PEER, pmtu=4096, metaroce=True, integrity=integrity)


def write(mr, psn, payload, off=0, v6=False, csum=True, ack=1):
    ip = IPv6(src="fd00::1", dst="fd00::2") if v6 else IPv4(src="10.7.0.1", dst="10.7.0.2")
    return RocePacket(ip=ip, bth=BTH(opcode=O.MR_RDMA_WRITE_ONLY, dest_qp=QPN, psn=psn,
                                     ack_req=ack),
                      headers=(PETH(path_id=0, ssn=1, offset=0),
                               RETH(va=mr.addr + off, rkey=mr.rkey, dma_len=len(payload))),
                      payload=payload, udp=UDP(sport=0xC001),
                      eth=Ethernet(dst="02:00:00:00:00:02", src="02:00:00:00:00:01"),
                      udp_checksum=csum).to_bytes()


def run(rx, f):
    before, pb = rx.counters(), rx.port_counters()
    rc, out, _ = rx.run(f)
    after, pa = rx.counters(), rx.port_counters()
    d = {k: after[k] - before[k] for k in after if after[k] != before[k]}
    d.update({k: pa[k] - pb[k] for k in ("rcv_icrc_checked", "rcv_csum_checked")
              if pa[k] != pb[k]})
    return rc, out, d


def flip(f: bytes, byte: int, mask: int = 1) -> bytes:
    b = bytearray(f)
    b[byte] ^= mask
    return bytes(b)


@pytest.mark.parametrize("v6", [False, True], ids=["ipv4", "ipv6"])
@pytest.mark.parametrize("size", [64, 1024, 4096])
def test_csum_qp_takes_valid_and_refuses_corrupt(rx, mr, v6, size):
    arm(rx, INT_CSUM)
    data = os.urandom(size)
    rc, out, d = run(rx, write(mr, 100, data, v6=v6))
    assert rc == XDP_TX and d == {"placed": 1, "tx_sack": 1, "rcv_csum_checked": 1}, d
    assert bytes(mr.buf[:size]) == data
    reply = parse_frame(out)                      # the SACK's ICRC is valid (INT-2) ...
    assert reply.bth.opcode == O.MR_SACK and udp_checksum_ok(out) is True   # ... and checksums
    before = bytes(mr.buf)
    good = write(mr, 101, os.urandom(size), off=8192, v6=v6)
    corrupt = [reicrc(flip(good, len(good) - 40)),           # a payload bit, the ICRC follows
               reicrc(flip(good, 14 + (40 if v6 else 20) + 8 + 11))]  # a BTH bit (the PSN's)
    if not v6:
        corrupt.append(good[:14 + 26] + b"\0\0" + good[14 + 28:])     # no UDP checksum
        corrupt.append(reicrc(flip(good, 14 + 8)))                       # TTL: IPv4 header sum
    for f in corrupt:
        rc, out, d = run(rx, f)
        assert rc == XDP_DROP and d == {"bad_csum": 1, "rcv_csum_checked": 1}, d
    # a damaged IP version (no checksum covers IPv6's) is no IP packet: not RoCE, to the stack
    rc, out, d = run(rx, flip(good, 14, 0x10))
    assert rc == XDP_PASS and d == {"not_roce": 1}, d
    assert bytes(mr.buf) == before and rx.qp_state(QPN)["epsn"] == 101
    # a wrong ICRC is not this QP's business (INT-3 checks the checksums in its place)
    wrong_icrc = good[:-4] + bytes(b ^ 0x5A for b in good[-4:])
    fixed = _fix_csum(wrong_icrc)
    rc, out, d = run(rx, fixed)
    assert d.get("placed") == 1 and "bad_icrc" not in d, d


def _fix_csum(f: bytes) -> bytes:
    """The frame with its UDP checksum recomputed over what it holds (IPv4 or IPv6)."""
    b = bytearray(f)
    assert fix_udp(b)
    return bytes(b)


def test_icrc_qp_ignores_the_checksum_and_checks_the_icrc(rx, mr):
    """A QP without CSUM checks the ICRC (ICRC-1); a wrong UDP checksum with a valid ICRC is
    accepted (WIRE-15); a payload bit flipped with the checksum fixed is refused as bad_icrc."""
    arm(rx, INT_ICRC)
    data = os.urandom(256)
    rc, out, d = run(rx, write(mr, 100, data))
    assert d == {"placed": 1, "tx_sack": 1, "rcv_icrc_checked": 1}, d
    out_udp = struct.unpack_from("!H", out, 14 + 20 + 6)[0]
    assert out_udp == 0                                   # an ICRC QP's IPv4 replies: WIRE-7
    f = write(mr, 101, os.urandom(256), csum=True)
    bad_sum = f[:14 + 26] + b"\x12\x34" + f[14 + 28:]
    assert run(rx, bad_sum)[2].get("placed") == 1
    flipped = _fix_csum(flip(write(mr, 102, os.urandom(256), off=4096), 200))
    rc, out, d = run(rx, flipped)
    assert rc == XDP_DROP and d == {"bad_icrc": 1, "rcv_icrc_checked": 1}, d


def test_random_bit_errors_never_reach_memory(rx, mr):
    """300 frames with 1-15 adjacent bits flipped at random places after the Ethernet header
    (the ICRC recomputed each time): every one refused, nothing written, ePSN unmoved."""
    arm(rx, INT_CSUM, epsn=500)
    rnd = random.Random(11)
    before = bytes(mr.buf)
    for i in range(300):
        f = bytearray(write(mr, 500, bytes(rnd.randrange(256) for _ in range(512)), off=1024))
        n = rnd.randint(1, 15)
        start = rnd.randrange(14 * 8, (len(f) - 4) * 8 - n)   # not the ICRC: it is refitted
        for k in range(n):
            if k in (0, n - 1) or rnd.getrandbits(1):
                bit = start + k
                f[bit // 8] ^= 0x80 >> (bit % 8)
        try:
            f = reicrc(bytes(f))
        except ValueError:                        # the IP version was hit: nothing to refit
            f = bytes(f)
        rc, out, d = run(rx, f)
        assert rc != XDP_TX and "placed" not in d, (i, start, n, d)
    assert bytes(mr.buf) == before and rx.qp_state(QPN)["epsn"] == 500
