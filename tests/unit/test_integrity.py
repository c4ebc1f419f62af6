"""The option CSUM (spec 5.7, INT-1..3) without a network: what connection management offers
and accepts, the codec's UDP checksum (scapy agrees, the ICRC stays valid), what the check
catches (every single-bit error, every burst of 15 bits or fewer) and what it cannot (a
16-bit word turned from 0x0000 into 0xFFFF), and the C fast path's checksum and frames."""

import random

import pytest
from _deps import require
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from metaroce.cm import negotiate as N
from metaroce.wire import consts as C
from metaroce.wire.headers import BTH, CMETH, PETH, RETH
from metaroce.wire.packet import IPv4, IPv6, RocePacket, inet_checksum, parse_frame, udp_checksum_ok

Cap = C.Cap
MR_PAIR = int(Cap.SACK | Cap.PLACEMENT)


def req(caps):
    return CMETH(cm_type=C.CmType.CONNECT_REQ, txn_id=7, qpn=0x12, start_psn=5, mtu=3,
                 window_pkts=128, caps=caps, max_paths=1)


@pytest.mark.parametrize("mine", ["icrc", "csum"])
@pytest.mark.parametrize("theirs", ["icrc", "csum"])
@pytest.mark.parametrize("mode", ["roce", "metaroce"])
def test_csum_only_when_both_devices_take_it(mine, theirs, mode):
    """INT-1: offered only by a device configured for it, accepted only by one configured for
    it, and meaningless outside MetaRoCE mode; the ICRC otherwise."""
    offer = N.offer(mode, paths=0, integrity=mine)
    assert bool(offer & Cap.CSUM) == (mode == "metaroce" and mine == "csum")
    answer = N.accept(req(offer), "metaroce", integrity=theirs)
    want = "csum" if mode == "metaroce" and mine == theirs == "csum" else "icrc"
    assert N.integrity_of(answer) == want
    # a compat-only target never takes it
    assert N.integrity_of(N.accept(req(offer), "roce", integrity=theirs)) == "icrc"


def test_csum_without_the_pair_means_nothing():
    """CM-5: an option bit without SACK + PLACEMENT is compat mode: the ICRC."""
    assert N.accept(req(int(Cap.CSUM)), "metaroce", integrity="csum") == 0
    assert N.integrity_of(int(Cap.CSUM)) == "icrc"
    assert N.integrity_of(MR_PAIR | Cap.CSUM) == "csum"


def frame(ip, payload=b"metaroce" * 8, csum=True):
    pkt = RocePacket(ip=ip, bth=BTH(opcode=C.Opcode.MR_RDMA_WRITE_ONLY, dest_qp=0x11, psn=5),
                     headers=(PETH(path_id=1, ssn=2, offset=0), RETH(va=0x1000, rkey=7,
                                                                   dma_len=len(payload))),
                     payload=payload, udp_checksum=csum)
    return pkt.to_bytes()


V4 = IPv4(src="10.0.0.1", dst="10.0.0.2")
V6 = IPv6(src="fd00::1", dst="fd00::2")


@pytest.mark.parametrize("ip", [V4, V6], ids=["ipv4", "ipv6"])
def test_codec_fills_the_udp_checksum_and_keeps_the_icrc(ip):
    """INT-2: a CSUM packet carries a valid non-zero UDP checksum and still its ICRC."""
    f = frame(ip)
    assert udp_checksum_ok(f) is True
    parse_frame(f)                                     # raises on a wrong ICRC
    if ip is V4:
        s = Ether(f)
        assert s[UDP].chksum != 0
        fresh = Ether(f)
        del fresh[UDP].chksum
        assert Ether(bytes(fresh))[UDP].chksum == s[UDP].chksum    # scapy agrees
        assert IP(bytes(s[IP])).chksum == s[IP].chksum
        # without the option, IPv4 RoCE sends no UDP checksum (WIRE-7): not a CSUM packet
        assert udp_checksum_ok(frame(ip, csum=False)) is False


def covered(f: bytes, bit: int) -> bool:
    """Bits an end-to-end check must protect: after the Ethernet header (the FCS's), except
    IPv6's traffic class, flow label and hop limit, which change in flight (the ICRC masks
    them too)."""
    if bit < 14 * 8:
        return False
    if f[12:14] == b"\x86\xdd":
        rel = bit - 14 * 8
        return not (4 <= rel < 32 or 56 <= rel < 64)
    return True


def flip_bits(f: bytes, start_bit: int, pattern: int, length: int) -> bytes:
    b = bytearray(f)
    for i in range(length):
        if pattern >> i & 1:
            bit = start_bit + i
            b[bit // 8] ^= 0x80 >> (bit % 8)
    return bytes(b)


@pytest.mark.parametrize("ip", [V4, V6], ids=["ipv4", "ipv6"])
def test_every_single_bit_error_is_caught(ip):
    """INT-3 / spec 5.7: every bit of the IP header, UDP header and UDP payload, flipped alone,
    fails the check (the Ethernet header is the FCS's)."""
    f = frame(ip, payload=bytes(range(256)))
    for bit in range(14 * 8, len(f) * 8):
        if covered(f, bit):
            assert udp_checksum_ok(flip_bits(f, bit, 1, 1)) is not True, bit


@pytest.mark.parametrize("ip", [V4, V6], ids=["ipv4", "ipv6"])
def test_every_burst_of_15_bits_or_fewer_is_caught(ip):
    """Bursts of 2..15 bits (first and last bit flipped, any pattern between) anywhere after the
    Ethernet header: 4,000 drawn at random, plus every burst of 15 ones."""
    f = frame(ip, payload=bytes(random.Random(1).randrange(256) for _ in range(300)))
    rnd = random.Random(7)
    lo, hi = 14 * 8, len(f) * 8
    tried = 0
    while tried < 4000:
        n = rnd.randint(2, 15)
        start = rnd.randrange(lo, hi - n)
        if not all(covered(f, start + i) for i in range(n)):
            continue
        tried += 1
        pattern = 1 | 1 << (n - 1) | rnd.getrandbits(n)
        assert udp_checksum_ok(flip_bits(f, start, pattern, n)) is not True, (start, n, pattern)
    for start in range(lo, hi - 15):
        if all(covered(f, start + i) for i in range(15)):
            assert udp_checksum_ok(flip_bits(f, start, (1 << 15) - 1, 15)) is not True, start


def test_what_the_sum_cannot_see():
    """The weaker check's known blind spot (spec 5.7): a 16-bit word of zeros turned into ones
    keeps the ones' complement sum. The ICRC catches it."""
    payload = bytes(64)
    f = frame(V4, payload=payload)
    off = len(f) - 4 - 64 + 16                         # an aligned zero word of the payload
    assert (off - 14 - 20) % 2 == 0 and f[off:off + 2] == b"\0\0"
    bad = f[:off] + b"\xff\xff" + f[off + 2:]
    assert udp_checksum_ok(bad) is True
    with pytest.raises(Exception):
        parse_frame(bad)


# ---- the C fast path ------------------------------------------------------------------------

_xsk = require("metaroce.fastpath._xsk", "the fast path's C helpers are not built: run make setup")
ffi, lib = _xsk.ffi, _xsk.lib


def test_c_sum_equals_rfc_1071():
    rnd = random.Random(3)
    for n in list(range(0, 70)) + [1023, 1024, 4096, 4097, 9000]:
        data = bytes(rnd.randrange(256) for _ in range(n))
        seed = rnd.randrange(1 << 16)
        got = lib.mr_csum16(data, n, seed)
        want = ~inet_checksum(data) & 0xFFFF                 # the folded sum, not complemented
        total = want + seed
        while total >> 16:
            total = (total & 0xFFFF) + (total >> 16)
        assert got == total or (got, total) in ((0, 0xFFFF), (0xFFFF, 0)), n


@pytest.mark.parametrize("v6", [False, True], ids=["ipv4", "ipv6"])
@pytest.mark.parametrize("csum", [0, 1])
@pytest.mark.parametrize("n", [0, 1, 1023, 4096])
def test_c_frames_carry_the_checksum_when_asked(v6, csum, n):
    """A flow with csum set (a CSUM connection, INT-2) sends a valid UDP checksum over IPv4
    too; without it IPv4 frames keep 0 (IPv6 always has one). The ICRC is valid either way."""
    f = ffi.new("struct mr_roce_flow *")
    f.dmac, f.smac = bytes.fromhex("020000000002"), bytes.fromhex("020000000001")
    f.ipv6, f.csum = int(v6), csum
    if v6:
        f.src_ip = bytes.fromhex("fd00" + "0" * 27 + "1")
        f.dst_ip = bytes.fromhex("fd00" + "0" * 27 + "2")
    else:
        f.src_ip, f.dst_ip = bytes([10, 0, 0, 1]).ljust(16, b"\0"), bytes([10, 0, 0, 2]).ljust(16, b"\0")
    f.tos, f.ttl, f.pkey = 26 << 2 | 2, 64, 0xFFFF
    p = ffi.new("struct mre_pkt *")
    p.opcode, p.has = 0xC0 | 0x0A, lib.MRE_H_PETH | lib.MRE_H_RETH
    p.dest_qp, p.psn, p.sport, p.reth_len = 0x123, 9, 0xC001, n
    data = bytes((i * 7) & 0xFF for i in range(n))
    buf = ffi.from_buffer(data) if n else ffi.NULL
    p.data, p.len = buf, n
    out = ffi.new("uint8_t[]", 9216)
    got = bytes(ffi.buffer(out, lib.mr_build_pkt(out, 9216, f, p)))
    parse_frame(got)
    assert udp_checksum_ok(got) is (True if v6 or csum else False)


def test_c_copy_sum_copies_and_sums_in_one_pass():
    """mr_copy_sum (the sender's payload copy) leaves the bytes where they go and returns the
    sum mr_csum16 gives, at every length and alignment the vector and the word loops meet."""
    rnd = random.Random(5)
    for n in list(range(0, 130)) + [1344, 4095, 8000, 9001]:
        for shift in (0, 1, 3):
            data = bytes(rnd.randrange(256) for _ in range(n + shift))[shift:]
            dst = ffi.new("uint8_t[]", n + 8)
            got = lib.mr_copy_sum(dst + 1, data, n)
            assert bytes(ffi.buffer(dst, n + 8)) == b"\0" + data + bytes(7), n
            want = ~inet_checksum(data) & 0xFFFF
            assert got == want or (got, want) in ((0, 0xFFFF), (0xFFFF, 0)), (n, shift)
