"""Frames the C fast path builds from one transport-engine packet descriptor (struct mre_pkt,
metaroce/cengine/mre.h; mr_build_pkt in metaroce/fastpath/roce_tx.c): every descriptor kind the
engine emits, in both modes and both IP versions, decodes with our codec (ICRC and header shapes
verified) into exactly the descriptor's fields, and scapy recomputes the same ICRC, IPv4 header
checksum and IPv6 UDP checksum. Malformed descriptors and frames that do not fit are refused,
and a WRITE built from a descriptor is byte for byte what the message builder sends."""

import pytest
from _deps import require
from scapy.contrib.roce import BTH as ScapyBTH
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether

from metaroce.wire import consts as C
from metaroce.wire.headers import AETH, PETH, RETH, AtomicETH, ImmDt
from metaroce.wire.layout import LAYOUTS
from metaroce.wire.packet import IPv4 as WireIPv4
from metaroce.wire.packet import parse_frame

_xsk = require("metaroce.fastpath._xsk", "the fast path's C helpers are not built: run make setup")
ffi, lib = _xsk.ffi, _xsk.lib

CAP = 9216
LENGTHS = [0, 1, 3, 1024, 4096]
ACK_REQ, RETX = lib.MRE_PF_ACK_REQ, lib.MRE_PF_RETX
H_PETH, H_RETH, H_ATOMIC, H_AETH, H_IMM = (lib.MRE_H_PETH, lib.MRE_H_RETH, lib.MRE_H_ATOMIC,
                                          lib.MRE_H_AETH, lib.MRE_H_IMM)
ACK_SYNDROME = 0x1F                      # ACK, credits invalid (what the engine puts in an AETH)

# (name, RC opcode, headers in compat mode, in MetaRoCE mode (without the PETH), payload)
KINDS = [
    ("SEND_FIRST", 0x00, 0, 0, True),
    ("SEND_MIDDLE", 0x01, 0, 0, True),
    ("SEND_LAST", 0x02, 0, 0, True),
    ("SEND_LAST_IMM", 0x03, H_IMM, H_IMM, True),
    ("SEND_ONLY", 0x04, 0, 0, True),
    ("SEND_ONLY_IMM", 0x05, H_IMM, H_IMM, True),
    ("WRITE_FIRST", 0x06, H_RETH, H_RETH, True),
    ("WRITE_MIDDLE", 0x07, 0, H_RETH, True),
    ("WRITE_LAST", 0x08, 0, H_RETH, True),
    ("WRITE_LAST_IMM", 0x09, H_IMM, H_RETH | H_IMM, True),
    ("WRITE_ONLY", 0x0A, H_RETH, H_RETH, True),
    ("WRITE_ONLY_IMM", 0x0B, H_RETH | H_IMM, H_RETH | H_IMM, True),
    ("READ_REQ", 0x0C, H_RETH, H_RETH, False),
    ("READ_RESP_FIRST", 0x0D, H_AETH, 0, True),
    ("READ_RESP_MIDDLE", 0x0E, 0, 0, True),
    ("READ_RESP_LAST", 0x0F, H_AETH, 0, True),
    ("READ_RESP_ONLY", 0x10, H_AETH, 0, True),
    ("CMP_SWAP", 0x13, H_ATOMIC, H_ATOMIC, False),
    ("FETCH_ADD", 0x14, H_ATOMIC, H_ATOMIC, False),
]
COMPAT_ONLY = [("ACK", 0x11, H_AETH, None, False)]
SEND_LAST_OR_ONLY = {0x02, 0x03, 0x04, 0x05}
READ_RESP = {0x0D, 0x0E, 0x0F, 0x10}
FLAG_SETS = [0, ACK_REQ, RETX, ACK_REQ | RETX]


def flow(v6):
    f = ffi.new("struct mr_roce_flow *")
    f.dmac, f.smac = bytes.fromhex("020000000002"), bytes.fromhex("020000000001")
    f.ipv6 = int(v6)
    if v6:
        f.src_ip = bytes.fromhex("fd00" + "0" * 27 + "1")
        f.dst_ip = bytes.fromhex("fd00" + "0" * 27 + "2")
    else:
        f.src_ip, f.dst_ip = bytes([10, 0, 0, 1]).ljust(16, b"\0"), bytes([10, 0, 0, 2]).ljust(16, b"\0")
    # sport, npaths, sports, dqpn: what mr_build_pkt must NOT use (the descriptor says)
    f.tos, f.ttl, f.sport, f.pkey, f.dqpn = 26 << 2 | 2, 61, 0xC0DE, 0x8123, 0xABCDE
    f.npaths, f.sports = 4, [0x1111, 0x2222, 0x3333, 0x4444, 0, 0, 0, 0]
    return f


def payload(n, seed=0):
    return bytes((i * 13 + 7 + seed) & 0xFF for i in range(n))


def desc(opcode, has, data=b"", **kw):
    """A descriptor as the engine fills it; returns (descriptor, the payload buffer it points at)."""
    p = ffi.new("struct mre_pkt *")
    p.opcode, p.has = opcode, has
    fields = dict(qp=3, dest_qp=0x123456, psn=0xFFFFFE, flags=ACK_REQ, path=5, sport=0xC123,
                  ts=0xDEADBEEF, syndrome=ACK_SYNDROME, msn=0x654321, imm=0x89ABCDEF,
                  ssn=0x00A0B1, rsn=0x00C0D2, offset=0x12345, reth_va=0x7F00_1234_5678_9ABC,
                  reth_rkey=0xFEDC_BA98, reth_len=0x0001_0000, atomic_va=0x1000_2000_3000_4008,
                  atomic_rkey=0x1357_9BDF, swap_add=0x0102_0304_0506_0708,
                  compare=0xF1F2_F3F4_F5F6_F7F8, wr_id=99, wqe=7)
    fields.update(kw)
    for k, v in fields.items():
        setattr(p, k, v)
    buf = ffi.from_buffer(data) if data else ffi.NULL
    p.data, p.len = buf, len(data)
    return p, buf


def build(f, p, cap=CAP):
    out = ffi.new("uint8_t[]", max(cap, 1))
    n = lib.mr_build_pkt(out, cap, f, p)
    return bytes(ffi.buffer(out, n))


def scapy_checks(frame, v6, sport):
    """scapy, independently: the ICRC, the IPv4 header checksum (IPv4 UDP checksum 0) or the
    IPv6 UDP checksum recomputed equal the frame's, and the UDP source port."""
    s = Ether(frame)
    assert s[UDP].sport == sport and s[UDP].dport == 4791
    fresh = Ether(frame)
    fresh[ScapyBTH].icrc = None                     # scapy computes it from the packet
    assert bytes(fresh)[-4:] == frame[-4:]
    if v6:
        ip = s[IPv6].copy()
        ip[UDP].chksum = None
        assert IPv6(bytes(ip))[UDP].chksum == s[UDP].chksum != 0
    else:
        ip = s[IP].copy()
        ip.chksum = None
        assert IP(bytes(ip)).chksum == s[IP].chksum and s[UDP].chksum == 0
        assert s[IP].flags == "DF" and s[IP].tos == 26 << 2 | 2 and s[IP].ttl == 61


def cases():
    for mr in (False, True):
        for name, op, hc, hm, pay in KINDS + (COMPAT_ONLY if not mr else []):
            for n in (LENGTHS if pay else [0]):
                yield pytest.param(mr, name, op, hc, hm, n, id=f"{'mr' if mr else 'rc'}-{name}-{n}")


@pytest.mark.parametrize("v6", [False, True], ids=["ipv4", "ipv6"])
@pytest.mark.parametrize("mr,name,op,hc,hm,n", list(cases()))
def test_descriptor_frame_carries_the_descriptor(mr, name, op, hc, hm, n, v6):
    opcode = 0xC0 | op if mr else op
    has = (H_PETH | hm) if mr else hc
    if mr and op in (0x0D, 0x0F, 0x10):
        has |= H_AETH                               # the engine names one; the wire has none
    flags = FLAG_SETS[(op + LENGTHS.index(n)) % 4]
    se = (op + n + v6) & 1 or op in SEND_LAST_OR_ONLY and n == 3
    data = payload(n, op)
    p, _keep = desc(opcode, has, data, flags=flags, se=se)
    f = flow(v6)
    frame = build(f, p)
    assert frame, "refused a well-formed descriptor"

    pkt = parse_frame(frame)                        # raises on a bad ICRC or header shape
    b = pkt.bth
    assert b.opcode == opcode and b.psn == p.psn & C.PSN_MASK and b.dest_qp == p.dest_qp
    assert b.pkey == f.pkey and b.tver == 0 and b.migreq == 0 and b.pad_count == -n % 4
    assert b.ack_req == int(bool(flags & ACK_REQ))
    assert b.se == int(bool(se) and op in SEND_LAST_OR_ONLY)
    want = tuple(cls for bit, cls in ((H_PETH, PETH), (H_RETH, RETH), (H_ATOMIC, AtomicETH),
                                      (H_AETH, AETH), (H_IMM, ImmDt))
                 if (hm if mr else hc) & bit or (mr and bit == H_PETH))
    assert tuple(type(h) for h in pkt.headers) == want == LAYOUTS[opcode].headers
    if mr:
        assert pkt.get(PETH) == PETH(
            path_id=5, ssn=p.ssn, rsn=p.rsn, offset=p.offset, ts=0xDEADBEEF,
            flags=(C.PETH_F_RETX if flags & RETX else 0)
            | (C.PETH_F_ACK_NOW if flags & (ACK_REQ | RETX) else 0))
    if RETH in want:
        assert pkt.get(RETH) == RETH(va=p.reth_va, rkey=p.reth_rkey, dma_len=p.reth_len)
    if AtomicETH in want:
        assert pkt.get(AtomicETH) == AtomicETH(va=p.atomic_va, rkey=p.atomic_rkey,
                                               swap_add=p.swap_add, compare=p.compare)
    if AETH in want:
        assert pkt.get(AETH) == AETH(syndrome=ACK_SYNDROME, msn=0x654321)
    if ImmDt in want:
        assert pkt.get(ImmDt) == ImmDt(0x89ABCDEF)
        imm_at = len(frame) - 4 - (n + -n % 4) - 4
        assert frame[imm_at:imm_at + 4] == bytes.fromhex("89abcdef")     # big-endian
    assert pkt.payload == data
    assert pkt.udp.sport == 0xC123 and pkt.eth.dst == "02:00:00:00:00:02"
    assert isinstance(pkt.ip, WireIPv4) != v6 and pkt.ip.dscp == 26 and pkt.ip.ecn == 2
    ihl = 40 if v6 else 20
    assert len(frame) == 14 + ihl + 8 + 12 + sum(h.SIZE for h in want) + n + -n % 4 + 4
    scapy_checks(frame, v6, 0xC123)
    assert list(f.path_pkts) == [0, 0, 0, 0, 0, 1, 0, 0]


@pytest.mark.parametrize("v6", [False, True], ids=["ipv4", "ipv6"])
@pytest.mark.parametrize("mr", [False, True], ids=["rc", "mr"])
def test_peth_flags_se_and_field_masks(mr, v6):
    base = 0xC0 if mr else 0
    peth = H_PETH if mr else 0
    for flags in FLAG_SETS + [ACK_REQ | RETX | lib.MRE_PF_CE]:
        for op in (0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x0A, 0x0B):
            has = peth | {0x03: H_IMM, 0x05: H_IMM, 0x0A: H_RETH, 0x0B: H_RETH | H_IMM}.get(op, 0)
            for se in (0, 1, 2, 3):
                p, _k = desc(base | op, has, b"xyz", flags=flags, se=se, psn=0x7F123456,
                             dest_qp=0xFF654321, ssn=0xFFABCDEF, rsn=0x11FEDCBA, path=0x0D)
                f = flow(v6)
                pkt = parse_frame(build(f, p))
                assert pkt.bth.psn == 0x123456 and pkt.bth.dest_qp == 0x654321
                assert pkt.bth.ack_req == int(bool(flags & ACK_REQ))
                # SE: bit 0 of p->se, on SEND LAST/ONLY only (not on WRITE with immediate)
                assert pkt.bth.se == int(bool(se & 1) and op in SEND_LAST_OR_ONLY)
                assert f.path_pkts[5] == 1 and sum(f.path_pkts) == 1    # 0x0D & 7
                if mr:
                    h = pkt.get(PETH)
                    assert (h.path_id, h.ssn, h.rsn) == (0x0D, 0xABCDEF, 0xFEDCBA)
                    assert h.flags == ((C.PETH_F_RETX if flags & RETX else 0)
                                       | (C.PETH_F_ACK_NOW if flags & (ACK_REQ | RETX) else 0))


def test_aeth_syndrome_and_msn_masks():
    for syn in (0x00, 0x1F, 0x60, 0x61, 0x20 | 5):      # ACK, NAK PSN error, invalid, RNR
        p, _k = desc(0x11, H_AETH, syndrome=0x100 | syn, msn=0xAB000001)
        pkt = parse_frame(build(flow(False), p))
        assert pkt.get(AETH) == AETH(syndrome=syn, msn=1)


def test_path_counter_accumulates_and_ignores_the_flows_ports():
    f = flow(False)
    for i in range(20):
        p, _k = desc(0xC4, H_PETH, b"a", path=i, sport=0x9000 + i)
        frame = build(f, p)
        assert parse_frame(frame).udp.sport == 0x9000 + i
    assert list(f.path_pkts) == [3, 3, 3, 3, 2, 2, 2, 2]


@pytest.mark.parametrize("v6", [False, True], ids=["ipv4", "ipv6"])
def test_cap_too_small_refused(v6):
    data = payload(1024)
    p, _k = desc(0xCA, H_PETH | H_RETH, data)
    f = flow(v6)
    need = len(build(f, p))
    assert need == 14 + (40 if v6 else 20) + 8 + 12 + 20 + 16 + 1024 + 4
    assert list(f.path_pkts)[5] == 1
    assert build(f, p, cap=need - 1) == b"" and build(f, p, cap=0) == b""
    assert len(build(f, p, cap=need)) == need
    assert f.path_pkts[5] == 2                      # a refused frame is not counted


def test_malformed_descriptors_refused():
    f = flow(False)
    p, _k = desc(0x04, 0, b"abcd")
    p.data = ffi.NULL                                          # data NULL, len 4
    bad = [p]
    keep = []
    for opcode, has, data in [
        (0x0A, 0, b"abc"),                                     # WRITE ONLY without its RETH
        (0x07, H_RETH, b"abc"),                                # compat WRITE MIDDLE with a RETH
        (0xC7, H_PETH, b"abc"),                                # MetaRoCE WRITE without RETH
        (0xC4, 0, b"abc"),                                     # MetaRoCE without its PETH
        (0x04, H_PETH, b"abc"),                                # compat with a PETH
        (0x0E, H_AETH, b"abc"),                                # READ RESP MIDDLE with AETH
        (0x10, 0, b"abc"),                                     # compat READ RESP ONLY, no AETH
        (0x10, H_AETH | H_RETH, b"abc"),                       # a READ response with a RETH
        (0x05, 0, b"abc"),                                     # SEND ONLY IMM without ImmDt
        (0x04, H_IMM, b"abc"),                                 # ImmDt on a plain SEND
        (0x0C, H_RETH, b"abc"),                                # a payload on a READ request
        (0x13, H_ATOMIC, b"12345678"),                         # a payload on an atomic
        (0x13, H_RETH, b""),                                   # an atomic with a RETH
        (0x11, H_AETH, b"abcd"),                               # a payload on an ACK
        (0xD1, H_AETH | lib.MRE_H_SACK, b""),                  # MR_SACK: not built here
        (0x12, H_AETH | lib.MRE_H_ATOMIC_ACK, b""),            # ATOMIC ACKNOWLEDGE: neither
        (0xE0, lib.MRE_H_GRANT, b""),                          # MR_CREDIT
        (0x15, 0, b""), (0x1C, 0, b""), (0x64, 0, b""), (0xFF, 0, b""),   # not RC opcodes
    ]:
        q, k = desc(opcode, has, data)
        bad.append(q)
        keep.append(k)
    for q in bad:
        assert build(f, q) == b"", (hex(q.opcode), q.has, q.len)
    assert sum(f.path_pkts) == 0
    # data NULL is fine without a payload
    q, _k = desc(0x04, 0, b"")
    assert parse_frame(build(f, q)).payload == b""


@pytest.mark.parametrize("v6", [False, True], ids=["ipv4", "ipv6"])
def test_too_long_for_the_ip_or_udp_length_refused(v6):
    # IPv4 total length / IPv6 payload length (= the UDP length) are 16 bits
    most = 65535 - (0 if v6 else 20) - 8 - 12 - 4        # payload + pad, a multiple of 4
    most -= most % 4
    p, _k = desc(0x04, 0, payload(most + 1))
    assert build(flow(v6), p, cap=70000) == b""
    p, _k = desc(0x04, 0, payload(most))
    frame = build(flow(v6), p, cap=70000)
    assert len(frame) == 14 + (40 if v6 else 20) + 8 + 12 + most + 4
    assert parse_frame(frame).payload == payload(most)


@pytest.mark.parametrize("v6", [False, True], ids=["ipv4", "ipv6"])
@pytest.mark.parametrize("size", [0, 1, 1024, 1027, 3 * 1024 + 2])
def test_write_equals_the_message_builder(v6, size):
    """mr_build_pkt and mr_roce_build (compat WRITE) produce the same bytes: the refactored
    frame writer kept the wire format."""
    data = payload(size)
    pmtu, psn0, va, rkey = 1024, 0xFFFFFE, 0x1000, 77
    npk = max(1, -(-size // pmtu))
    buf = ffi.new("uint8_t[]", 4096)
    for idx in range(npk):
        f_old = flow(v6)
        f_old.npaths = 0
        flen = lib.mr_roce_build_write(buf, 4096, f_old, data, size, pmtu, psn0, va, rkey, idx)
        old = bytes(ffi.buffer(buf, flen))
        first, last = idx == 0, idx == npk - 1
        op = 0x0A if first and last else 0x06 if first else 0x08 if last else 0x07
        chunk = data[idx * pmtu:(idx + 1) * pmtu]
        p, _k = desc(op, H_RETH if first else 0, chunk, dest_qp=f_old.dqpn,
                     psn=(psn0 + idx) & C.PSN_MASK, flags=ACK_REQ if last else 0,
                     sport=f_old.sport, reth_va=va, reth_rkey=rkey, reth_len=size, path=0)
        assert build(flow(v6), p) == old


def test_send_pkts_is_exported():
    # mr_send_pkts needs an AF_XDP socket (root; tests/integration): its declaration is here
    assert ffi.typeof(lib.mr_send_pkts).cname == (     # (cffi drops the consts)
        "uint32_t(*)(struct mr_xsk *, struct mr_roce_flow * *, struct mre_pkt *, uint32_t, "
        "uint32_t *)")
    assert ffi.sizeof("struct mre_pkt") % 8 == 0


def test_descriptor_layout_is_the_engines():
    """The fast path and the engine were compiled against the same struct mre_pkt (a stale
    build of either would misread the other's descriptors)."""
    mre = require("metaroce.cengine._mre", "the transport engine is not built: run make setup")
    ours, theirs = ffi.typeof("struct mre_pkt"), mre.ffi.typeof("struct mre_pkt")
    assert ffi.sizeof(ours) == mre.ffi.sizeof(theirs)
    assert [(n, ffi.offsetof(ours, n), ffi.sizeof(f.type)) for n, f in ours.fields] == \
           [(n, mre.ffi.offsetof(theirs, n), mre.ffi.sizeof(f.type)) for n, f in theirs.fields]
    for name in ("MRE_H_PETH", "MRE_H_RETH", "MRE_H_ATOMIC", "MRE_H_AETH", "MRE_H_IMM",
                 "MRE_PF_ACK_REQ", "MRE_PF_RETX"):
        assert getattr(lib, name) == getattr(mre.lib, name)
