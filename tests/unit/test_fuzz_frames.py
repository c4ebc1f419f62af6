"""The fuzzer's fast frame surgery agrees with the wire codec (which scapy and tshark cross-check):
assembled frames of every opcode parse with a valid ICRC, fix_icrc makes a patched frame valid
again, and the generator is deterministic for a seed."""

import struct

import pytest

from metaroce.fuzz import frames as F
from metaroce.fuzz.gen import OPCODES, Generator, Qp, Region, Target
from metaroce.wire import consts as C
from metaroce.wire.layout import LAYOUTS
from metaroce.wire.packet import parse_frame
from metaroce.wire.samples import sample_packet


@pytest.mark.parametrize("v6", [False, True])
@pytest.mark.parametrize("op", OPCODES)
def test_assemble_agrees_with_the_codec(op, v6):
    sp = sample_packet(op, 6 if v6 else 4, 1)
    hdrs = b"".join(h.pack() for h in sp.headers)
    payload = bytes(range(37)) if LAYOUTS[op].payload else b""
    f = F.assemble(v6, op, 0x000123, 0x00ABCD, hdrs, payload, ackreq=1)
    pkt = parse_frame(bytes(f))                        # raises on a bad ICRC or length
    assert pkt.bth.opcode == op and pkt.bth.dest_qp == 0x000123 and pkt.bth.psn == 0x00ABCD
    assert pkt.bth.ack_req == 1 and pkt.payload == payload
    assert F.icrc_valid(f)
    b = F.bth_fields(f)
    assert b == (F.BTH_OFF6 if v6 else F.BTH_OFF4, op, 0x000123, 0x00ABCD)


def test_fix_icrc_after_a_patch_and_icrc_valid_catches_a_flip():
    f = F.assemble(False, C.Opcode.RC_RDMA_WRITE_ONLY, 0x11, 5,
                   struct.pack("!QII", 0x1000, 0xABCD, 8), b"12345678")
    f[F.BTH_OFF4 + 11] ^= 0x01                          # the PSN
    assert not F.icrc_valid(f)
    assert F.fix_icrc(f) and F.icrc_valid(f)
    assert parse_frame(bytes(f)).bth.psn == 4


def _target():
    regions = [Region(0, 0x1111, 0x10000, 5000, 2 | 8, 1), Region(1, 0x2222, 0x90000, 70000, 4, 1)]
    qps = [Qp(0x11, 1, 0x10, 100, una=7, sq_psn=20, slots=[(7, 1, 600)]), Qp(0x12, 2, 0x20, 0)]
    return Target(regions, qps, [0x3333], pmtu=256)


def test_the_generator_is_deterministic_and_varied():
    a, b = iter(Generator(_target(), 5)), iter(Generator(_target(), 5))
    fa, fb = [next(a) for _ in range(3000)], [next(b) for _ in range(3000)]
    assert fa == fb
    c = iter(Generator(_target(), 6))
    assert [next(c) for _ in range(3000)] != fa
    ops = {f[F.BTH_OFF4] for f in fa if f[12:14] == b"\x08\x00" and len(f) > F.BTH_OFF4}
    assert len(ops & set(OPCODES)) > 20                 # most opcodes appear
    valid = sum(1 for f in fa if F.icrc_valid(f))
    assert 0.3 * len(fa) < valid < 0.95 * len(fa)       # mostly valid ICRCs, not all
    assert any(len(f) < F.BTH_OFF4 for f in fa)         # truncations
    assert any(f[12:14] not in (b"\x08\x00", b"\x86\xdd") for f in fa)   # not IP at all


def test_the_jumbo_generator_reaches_the_frame_limit_and_a_little_past_it():
    t = _target()
    t.pmtu, t.max_frame = 4096, 9014
    frames = [f for f, _ in zip(iter(Generator(t, 3)), range(6000))]
    assert max(map(len, frames)) <= 9014                 # oversize only when asked
    big = [f for f in frames if len(f) > 3520]           # past a test run's linear part
    assert len(big) > 0.2 * len(frames)
    full = [f for f in frames if F.icrc_valid(f) and F.l4_bounds(f)[2] - F.l4_bounds(f)[1]
            >= F.BTH_LEN + 4096 + F.ICRC_LEN]            # 4 KiB payloads with a valid ICRC
    assert len(full) > 0.05 * len(frames)
    assert any(len(f) > 8000 for f in frames)
    # UDP and IP lengths that disagree with each other (IPv4)
    v4 = [f for f in big if f[12:14] == b"\x08\x00"]
    assert any(int.from_bytes(f[16:18], "big") != 20 + int.from_bytes(f[38:40], "big")
               for f in v4)
    t.oversize = True
    assert any(len(f) > 9014 for f, _ in zip(iter(Generator(t, 3)), range(6000)))
