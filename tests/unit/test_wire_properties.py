"""Property tests: pack/parse round trips, and arbitrary bytes only ever raise ParseError."""

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metaroce.wire import (AETH, BTH, CMETH, CNPPad, CREDITETH, IETH, PETH, RETH, SACKETH,
                           UDP, AtomicAckETH, AtomicETH, Ethernet, ImmDt, IPv4, IPv6, ParseError,
                           RocePacket, parse_frame)
from metaroce.wire import consts as C
from metaroce.wire.errors import Reason
from metaroce.wire.headers import syndrome_problem
from metaroce.wire.layout import LAYOUTS
from metaroce.wire.samples import sample_packets

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def u(bits):
    return st.integers(0, (1 << bits) - 1)


def flags(defined):
    return st.sampled_from([f for f in range(256) if not f & ~defined])


HEADERS = {
    BTH: st.builds(BTH, opcode=u(8), dest_qp=u(24), psn=u(24), se=u(1), migreq=u(1),
                   pad_count=u(2), tver=u(4), pkey=u(16), fecn=u(1), becn=u(1), resv6=u(6),
                   ack_req=u(1), resv7=u(7)),
    RETH: st.builds(RETH, u(64), u(32), u(32)),
    AETH: st.builds(AETH, syndrome=u(8).filter(lambda s: not syndrome_problem(s)), msn=u(24)),
    ImmDt: st.builds(ImmDt, u(32)),
    IETH: st.builds(IETH, u(32)),
    AtomicETH: st.builds(AtomicETH, u(64), u(32), u(64), u(64)),
    AtomicAckETH: st.builds(AtomicAckETH, u(64)),
    CNPPad: st.builds(CNPPad, st.binary(min_size=16, max_size=16)),
    PETH: st.builds(PETH, path_id=u(8), ssn=u(24), rsn=u(24), offset=u(32), ts=u(32),
                    flags=flags(C.PETH_FLAGS_DEFINED)),
    SACKETH: st.builds(SACKETH, path_id=u(8), flags=flags(C.SACK_FLAGS_DEFINED),
                       credit_limit_psn=u(24), ts_echo=u(32), ce_count=u(32), bitmap=u(128)),
    CREDITETH: st.builds(CREDITETH, flags=flags(C.CREDIT_FLAGS_DEFINED), limit_psn=u(24),
                         rate_mbps=u(32)),
    CMETH: st.builds(CMETH, cm_type=st.sampled_from(list(C.CmType)).map(int), txn_id=u(32),
                     qpn=u(24), start_psn=u(24), caps=u(32), mtu=u(8), max_paths=u(8),
                     timeout=u(5), retry_cnt=u(3), rnr_retry=u(3), max_rd_atomic=u(8),
                     max_dest_rd_atomic=u(8), min_rnr_timer=u(5), window_pkts=u(32),
                     gid=st.binary(min_size=16, max_size=16), version=st.just(C.CM_VERSION),
                     reject_reason=u(16)),
}


def test_every_header_class_has_a_strategy():
    from metaroce.wire.headers import ALL_HEADERS
    assert set(ALL_HEADERS) == set(HEADERS)


@SETTINGS
@given(st.sampled_from(sorted(HEADERS, key=lambda c: c.NAME)).flatmap(HEADERS.get),
       st.binary(max_size=8))
def test_header_round_trip(hdr, prefix):
    raw = hdr.pack()
    assert len(raw) == hdr.SIZE and hdr.SIZE % 4 == 0
    assert type(hdr).parse(prefix + raw, len(prefix)) == hdr


@st.composite
def packets(draw):
    opcode = draw(st.sampled_from(sorted(LAYOUTS)))
    lay = LAYOUTS[opcode]
    headers = tuple(draw(HEADERS[cls]) for cls in lay.headers)
    bth = dataclasses.replace(draw(HEADERS[BTH]), opcode=opcode, tver=0)
    payload = draw(st.binary(max_size=64)) if lay.payload else b""
    if draw(st.booleans()):
        ip = IPv4(draw(st.ip_addresses(v=4)).exploded, draw(st.ip_addresses(v=4)).exploded,
                  dscp=draw(u(6)), ecn=draw(u(2)), ttl=draw(u(8)), ident=draw(u(16)),
                  df=draw(u(1)), options=draw(st.sampled_from([b"", b"\x01\x01\x01\x00"])))
    else:
        ip = IPv6(draw(st.ip_addresses(v=6)).exploded, draw(st.ip_addresses(v=6)).exploded,
                  dscp=draw(u(6)), ecn=draw(u(2)), flow_label=draw(u(20)), hop_limit=draw(u(8)))
    eth = Ethernet(vlan_tci=draw(st.none() | u(16)))
    return RocePacket(ip=ip, bth=bth, headers=headers, payload=payload,
                      udp=UDP(sport=draw(u(16))), eth=eth)


@SETTINGS
@given(packets())
def test_packet_round_trip(pkt):
    raw = pkt.to_bytes()
    assert parse_frame(raw) == pkt
    assert parse_frame(raw + bytes(7)) == pkt  # Ethernet padding / FCS is ignored


def _parse_or_reason(data):
    try:
        parse_frame(data)
    except ParseError as exc:
        assert isinstance(exc.reason, Reason) and exc.reason.value
        return exc.reason
    return None


@SETTINGS
@given(st.binary(max_size=300))
def test_random_bytes_give_parse_error_only(data):
    _parse_or_reason(data)


GOLDEN = [p.to_bytes() for p in sample_packets()]


@SETTINGS
@given(st.sampled_from(GOLDEN), st.data())
def test_mutated_packets_give_parse_error_only(raw, data):
    buf = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["flip", "truncate", "extend", "set"]))
        if kind == "flip" and buf:
            i = data.draw(st.integers(0, len(buf) - 1))
            buf[i] ^= 1 << data.draw(st.integers(0, 7))
        elif kind == "truncate":
            del buf[data.draw(st.integers(0, len(buf))):]
        elif kind == "extend":
            buf += data.draw(st.binary(max_size=16))
        elif buf:
            buf[data.draw(st.integers(0, len(buf) - 1))] = data.draw(u(8))
    _parse_or_reason(bytes(buf))


@SETTINGS
@given(st.sampled_from(GOLDEN), st.data())
def test_any_single_bit_flip_in_the_invariant_part_is_detected(raw, data):
    """Flipping one bit of the UDP payload is always caught (ICRC, or a stricter check)."""
    l2 = 14
    udp_off = l2 + (20 if raw[12:14] == b"\x08\x00" else 40)
    i = data.draw(st.integers(udp_off + 8, len(raw) - 1))
    if i == udp_off + 8 + 4:
        return  # BTH byte 4 (FECN/BECN/resv6) is masked out of the ICRC by design
    buf = bytearray(raw)
    buf[i] ^= 1 << data.draw(st.integers(0, 7))
    assert _parse_or_reason(bytes(buf)) is not None
