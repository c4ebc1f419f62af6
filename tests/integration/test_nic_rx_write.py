"""The NIC receive path places RDMA WRITE payloads straight into registered memory, in the
kernel, after QP / ICRC / PSN / opcode-sequence / rkey / PD / access / bounds checks, and
acknowledges them (XDP_TX) when asked; gaps are NAKed once, duplicates re-ACKed; everything
else is dropped and counted by reason, or passed on. Packets are built with scapy.contrib.roce (an
independent encoder, which also computes the ICRC) and run through the loaded program with
BPF_PROG_TEST_RUN."""

import struct

import pytest
from scapy.contrib.roce import BTH
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Raw

from metaroce.nic.rx import ACCESS_LOCAL_WRITE, ACCESS_REMOTE_READ, ACCESS_REMOTE_WRITE

XDP_DROP, XDP_PASS, XDP_TX = 1, 2, 3
QPN, PD, PEER_QPN = 0x000123, 7, 0x000456
WRITE_FIRST, WRITE_MIDDLE, WRITE_LAST, WRITE_ONLY, WRITE_ONLY_IMM = 0x06, 0x07, 0x08, 0x0A, 0x0B


@pytest.fixture(scope="module")
def rx(rx_path):
    return rx_path(max_qps=64, max_mrs=64)


def reth(va, rkey, length):
    return struct.pack("!QII", va, rkey, length)


def pkt(opcode, psn, body, qpn=QPN, v6=False, pad=0, ackreq=0):
    ip = IPv6(src="fd00::1", dst="fd00::2") if v6 else IP(src="10.0.0.1", dst="10.0.0.2")
    return bytes(Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02") / ip /
                 UDP(sport=49152, dport=4791) /
                 BTH(opcode=opcode, padcount=pad, dqpn=qpn, psn=psn, ackreq=ackreq) /
                 Raw(body + b"\0" * pad))


def delta(rx, before):
    after = rx.counters()
    return {k: after[k] - before[k] for k in after if after[k] != before[k]}


def test_write_only_is_placed_in_the_kernel(rx):
    mr = rx.reg_mr(1 << 20, PD, ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE)
    rx.set_qp(QPN, epsn=1000, pd=PD, pmtu=4096)       # an ONLY carries at most the MTU (RESP-15)
    data = bytes(range(256)) * 8
    before = rx.counters()
    rc, _, _ = rx.run(pkt(WRITE_ONLY, 1000, reth(mr.addr + 4096, mr.rkey, len(data)) + data))
    assert rc == XDP_DROP and delta(rx, before) == {"placed": 1}
    assert bytes(mr.buf[4096:4096 + len(data)]) == data
    assert rx.qp_state(QPN)["epsn"] == 1001
    rx.dereg_mr(mr)


@pytest.mark.parametrize("v6", [False, True])
def test_multi_packet_write_across_a_chunk_boundary(rx, v6):
    mr = rx.reg_mr(3 * 65536, PD, ACCESS_REMOTE_WRITE)
    rx.set_qp(QPN, epsn=0xFFFFFE, pd=PD, pmtu=4096)   # the PSN wraps at 2^24 mid-message
    msg = bytes((i * 7) & 0xFF for i in range(3 * 4096))
    start = 65536 - 5000                          # the 2nd packet straddles chunks 0 and 1
    psn = 0xFFFFFE
    parts = [(WRITE_FIRST, reth(mr.addr + start, mr.rkey, len(msg)) + msg[:4096]),
             (WRITE_MIDDLE, msg[4096:8192]), (WRITE_LAST, msg[8192:])]
    for op, body in parts:
        rc, _, _ = rx.run(pkt(op, psn, body, v6=v6))
        assert rc == XDP_DROP
        psn = (psn + 1) & 0xFFFFFF
    assert bytes(mr.buf[start:start + len(msg)]) == msg
    st = rx.qp_state(QPN)
    assert st["epsn"] == 1 and st["state"] == 0 and st["wr_left"] == 0
    rx.dereg_mr(mr)


def test_pad_count_and_immediate_are_excluded_from_the_payload(rx):
    mr = rx.reg_mr(8192, PD, ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE)
    rx.set_qp(QPN, epsn=5, pd=PD)
    rx.post_recv(QPN, 0, wr_id=99, addr=mr.addr + 4096, lkey=mr.rkey, length=16)
    data = b"xyz"
    body = reth(mr.addr, mr.rkey, 3) + struct.pack("!I", 0xCAFE) + data
    rc, _, _ = rx.run(pkt(WRITE_ONLY_IMM, 5, body, pad=1))
    assert rc == XDP_DROP
    assert bytes(mr.buf[:4]) == b"xyz\0"
    assert rx.qp_state(QPN)["rq_head"] == 1             # the immediate consumed the receive
    rx.dereg_mr(mr)


def test_write_with_immediate_and_no_receive_is_rnr_nacked(rx):
    """RESP-6: RNR NAK with the PSN and min_rnr_timer, nothing placed, ePSN kept."""
    mr = rx.reg_mr(8192, PD, ACCESS_REMOTE_WRITE)
    rx.set_qp(QPN, epsn=5, pd=PD, dqpn=PEER_QPN, rnr_timer=14)
    body = reth(mr.addr, mr.rkey, 4) + struct.pack("!I", 7) + b"abcd"
    before = rx.counters()
    rc, out, _ = rx.run(pkt(WRITE_ONLY_IMM, 5, body))
    assert rc == XDP_TX and delta(rx, before) == {"rnr": 1, "tx_nak_rnr": 1}
    nak, aeth, _ = _reply(out)
    assert aeth.syndrome == 0x20 | 14 and nak.bth.psn == 5
    assert rx.qp_state(QPN)["epsn"] == 5 and bytes(mr.buf[:4]) == bytes(4)
    rx.dereg_mr(mr)


def test_bad_packets_are_refused_by_reason_and_write_nothing(rx):
    """RESP-5 / ERR-2: access violations and bad requests get their fatal NAK (the QP moves to
    ERR); packets failing below the transport are silently dropped; nothing is written."""
    mr = rx.reg_mr(65536, PD, ACCESS_REMOTE_WRITE)
    ro = rx.reg_mr(65536, PD, ACCESS_REMOTE_READ)
    other_pd = rx.reg_mr(65536, PD + 1, ACCESS_REMOTE_WRITE)
    data = b"\xAA" * 512
    inv, acc = ("tx_nak_inv_req", 0x61), ("tx_nak_rem_access", 0x62)
    cases = [
        ("unknown_qp", None, pkt(WRITE_ONLY, 10, reth(mr.addr, mr.rkey, 512) + data, qpn=0x999)),
        ("bad_opcode_seq", inv, pkt(WRITE_MIDDLE, 10, data)),
        ("bad_rkey", acc, pkt(WRITE_ONLY, 10, reth(mr.addr, mr.rkey ^ 1, 512) + data)),
        ("mr_access", acc, pkt(WRITE_ONLY, 10, reth(ro.addr, ro.rkey, 512) + data)),
        ("mr_access", acc, pkt(WRITE_ONLY, 10, reth(other_pd.addr, other_pd.rkey, 512) + data)),
        ("mr_bounds", acc, pkt(WRITE_ONLY, 10, reth(mr.addr + 65536 - 100, mr.rkey, 512) + data)),
        ("mr_bounds", acc, pkt(WRITE_ONLY, 10, reth(mr.addr - 1, mr.rkey, 512) + data)),
        ("mr_bounds", acc, pkt(WRITE_ONLY, 10, reth(2**64 - 256, mr.rkey, 512) + data)),
        ("invalid_request", inv, pkt(WRITE_ONLY, 10, reth(mr.addr, mr.rkey, 100) + data)),
        ("malformed", None, pkt(WRITE_ONLY, 10, reth(mr.addr, mr.rkey, 512))[:60]),   # truncated
    ]
    for reason, nak, p in cases:
        rx.set_qp(QPN, epsn=10, pd=PD, dqpn=PEER_QPN)
        before = rx.counters()
        rc, out, _ = rx.run(p)
        if nak is None:
            assert rc == XDP_DROP and delta(rx, before) == {reason: 1}, (reason, delta(rx, before))
            continue
        assert rc == XDP_TX and delta(rx, before) == {reason: 1, nak[0]: 1}, (reason, delta(rx, before))
        reply, aeth, _ = _reply(out)
        assert aeth.syndrome == nak[1] and reply.bth.psn == 10
        assert rx.qp_state(QPN)["state"] == 3                 # ERR: everything else is dropped
        before = rx.counters()
        rc, _, _ = rx.run(pkt(WRITE_ONLY, 10, reth(mr.addr, mr.rkey, 512) + data))
        assert rc == XDP_DROP and delta(rx, before) == {"qp_error": 1}
    for region in (mr, ro, other_pd):
        assert bytes(region.buf) == bytes(len(region.buf)), "a refused packet wrote memory"
    for region in (mr, ro, other_pd):
        rx.dereg_mr(region)


def _reply(out):
    from metaroce.wire.headers import AETH
    from metaroce.wire.packet import parse_frame
    ack = parse_frame(out)                       # our codec: verifies the ICRC (raises if bad)
    s = Ether(out)                               # scapy: independent view of IP/UDP/BTH/ICRC
    assert s[BTH].icrc == BTH(bytes(s[BTH])).icrc
    return ack, ack.get(AETH), s


@pytest.mark.parametrize("v6", [False, True])
def test_ackreq_turns_the_request_into_its_ack(rx, v6):
    mr = rx.reg_mr(65536, PD, ACCESS_REMOTE_WRITE)
    rx.set_qp(QPN, epsn=77, pd=PD, dqpn=PEER_QPN, msn=41)
    data = b"\x42" * 1024
    req = pkt(WRITE_ONLY, 77, reth(mr.addr, mr.rkey, len(data)) + data, v6=v6, ackreq=1)
    before = rx.counters()
    rc, out, _ = rx.run(req)
    assert rc == XDP_TX and delta(rx, before) == {"placed": 1, "tx_ack": 1}
    assert bytes(mr.buf[:1024]) == data
    ack, aeth, s = _reply(out)
    assert ack.opcode_name == "RC_ACKNOWLEDGE" and ack.bth.dest_qp == PEER_QPN and ack.bth.psn == 77
    assert aeth.syndrome == 0x1F and aeth.msn == 42
    assert s.src == "02:00:00:00:00:02" and s.dst == "02:00:00:00:00:01"
    ipl = s[IPv6] if v6 else s[IP]
    assert (ipl.src, ipl.dst) == (("fd00::2", "fd00::1") if v6 else ("10.0.0.2", "10.0.0.1"))
    assert s[UDP].dport == 4791 and s[UDP].sport == 49152
    if not v6:   # scapy recomputes the header checksum when asked: ours must equal it
        fresh = s[IP].copy()
        fresh.chksum = None
        assert IP(bytes(fresh)).chksum == s[IP].chksum
    else:
        fresh = s[IPv6].copy()
        fresh[UDP].chksum = None
        assert IPv6(bytes(fresh))[UDP].chksum == s[UDP].chksum
    rx.dereg_mr(mr)


def test_gap_is_nacked_once_and_duplicates_are_reacked(rx):
    mr = rx.reg_mr(65536, PD, ACCESS_REMOTE_WRITE)
    rx.set_qp(QPN, epsn=10, pd=PD, dqpn=PEER_QPN, msn=5)
    w = lambda psn: pkt(WRITE_ONLY, psn, reth(mr.addr, mr.rkey, 64) + b"\x01" * 64)
    before = rx.counters()
    rc, out, _ = rx.run(w(12))                   # 10 and 11 were lost
    assert rc == XDP_TX and delta(rx, before) == {"psn_out_of_order": 1, "tx_nak_seq": 1}
    nak, aeth, _ = _reply(out)
    assert aeth.syndrome == 0x60 and nak.bth.psn == 10 and aeth.msn == 5
    before = rx.counters()
    rc, _, _ = rx.run(w(13))                     # the same gap: no second NAK
    assert rc == XDP_DROP and delta(rx, before) == {"psn_out_of_order": 1}
    before = rx.counters()
    rc, out, _ = rx.run(w(9))                    # a duplicate of something already received
    assert rc == XDP_TX and delta(rx, before) == {"duplicate": 1, "tx_ack": 1}
    ack, aeth, _ = _reply(out)
    assert ack.bth.psn == 9 and aeth.syndrome == 0x1F
    assert bytes(mr.buf[:64]) == bytes(64), "neither the gap nor the duplicate was placed"
    rc, _, _ = rx.run(w(10))                     # the retransmission fills the gap
    assert rc == XDP_DROP and rx.qp_state(QPN)["epsn"] == 11 and rx.qp_state(QPN)["nak_sent"] == 0
    assert rx.qp_state(QPN)["msn"] == 6
    rx.dereg_mr(mr)


@pytest.mark.parametrize("v6", [False, True])
def test_icrc_is_verified_before_placement(rx, v6):
    mr = rx.reg_mr(65536, PD, ACCESS_REMOTE_WRITE)
    rx.set_qp(QPN, epsn=0, pd=PD, pmtu=2048)
    data = bytes(range(200)) * 7                  # 1400 B: full ICRC chunks plus a tail
    good = bytearray(pkt(WRITE_ONLY, 0, reth(mr.addr, mr.rkey, len(data)) + data, v6=v6))
    for flip in (len(good) - 100, len(good) - 1, 14 + (40 if v6 else 20) + 8 + 11):
        bad = bytearray(good)
        bad[flip] ^= 0x01                         # payload, ICRC itself, BTH PSN
        before = rx.counters()
        rc, _, _ = rx.run(bytes(bad))
        assert rc == XDP_DROP and delta(rx, before) == {"bad_icrc": 1}, flip
    assert bytes(mr.buf) == bytes(len(mr.buf)), "a packet with a bad ICRC wrote memory"
    # fields the ICRC masks (TTL / hop limit, ECN) may change in flight
    masked = bytearray(good)
    masked[14 + (7 if v6 else 8)] -= 1
    masked[14 + 1] |= 0x03 if not v6 else 0x30
    if not v6:      # keep the IPv4 header checksum honest for the decrement and CE mark
        masked[14 + 10:14 + 12] = b"\0\0"
        from scapy.layers.inet import checksum
        masked[14 + 10:14 + 12] = checksum(bytes(masked[14:34])).to_bytes(2, "big")
    rx.set_qp(QPN, epsn=0, pd=PD, dqpn=PEER_QPN, pmtu=2048)   # fresh: no CNP sent recently
    rc, out, _ = rx.run(bytes(masked))
    assert bytes(mr.buf[:len(data)]) == data
    # the CE mark is answered with a CNP to the sender's QP (COMPAT-4, HDR-11)
    from metaroce.wire.packet import parse_frame
    assert rc == XDP_TX
    cnp = parse_frame(out)
    assert cnp.opcode_name == "CNP" and cnp.bth.dest_qp == PEER_QPN and cnp.bth.becn == 1
    rx.dereg_mr(mr)


@pytest.mark.parametrize("size", [0, 1, 7, 8, 255, 256, 257, 4096])
def test_icrc_every_length_class(rx, size):
    mr = rx.reg_mr(8192, PD, ACCESS_REMOTE_WRITE)
    rx.set_qp(QPN, epsn=0, pd=PD, pmtu=4096)
    data = bytes((i * 31) & 0xFF for i in range(size))
    before = rx.counters()
    pad = -size % 4                           # padded as WIRE-10 requires
    rc, _, _ = rx.run(pkt(WRITE_ONLY, 0, reth(mr.addr, mr.rkey, size) + data, pad=pad))
    assert rc == XDP_DROP and delta(rx, before) == {"placed": 1}
    assert bytes(mr.buf[:size]) == data
    if pad:                                   # unpadded, the same packet is refused
        rx.set_qp(QPN, epsn=1, pd=PD, pmtu=4096)
        before = rx.counters()
        rc, _, _ = rx.run(pkt(WRITE_ONLY, 1, reth(mr.addr, mr.rkey, size) + data))
        assert rc == XDP_DROP and delta(rx, before) == {"malformed": 1}
    rx.dereg_mr(mr)


def test_dereg_invalidates_the_rkey_at_once(rx):
    mr = rx.reg_mr(4096, PD, ACCESS_REMOTE_WRITE)
    rx.set_qp(QPN, epsn=0, pd=PD)
    rkey, addr = mr.rkey, mr.addr
    rx.dereg_mr(mr)
    before = rx.counters()
    rc, _, _ = rx.run(pkt(WRITE_ONLY, 0, reth(addr, rkey, 8) + b"12345678"))
    assert rc == XDP_TX and delta(rx, before) == {"bad_rkey": 1, "tx_nak_rem_access": 1}


def test_other_traffic_passes_untouched(rx):
    rx.set_qp(QPN, epsn=0, pd=PD)
    arp = bytes(Ether() / ARP())
    udp = bytes(Ether() / IP() / UDP(dport=5000) / Raw(b"hi"))
    for p, reason in ((arp, "not_roce"), (udp, "not_roce")):
        before = rx.counters()
        rc, out, _ = rx.run(p)
        assert rc == XDP_PASS and out == p and delta(rx, before) == {reason: 1}
    before = rx.counters()                        # a reserved opcode (0x15)
    rc, _, _ = rx.run(pkt(0x15, 0, bytes(4)))
    assert rc == XDP_DROP and delta(rx, before) == {"unsupported_opcode": 1}
    # send with invalidate is optional and not implemented: an invalid request, NAK 0x61 and
    # the QP to ERR, never a silent drop (HDR-14, HDR-15)
    before = rx.counters()
    rc, out, _ = rx.run(pkt(0x17, 0, struct.pack("!I", 0x1234) + b"send with invalidate"))
    assert rc == XDP_TX and delta(rx, before) == {"invalid_request": 1, "tx_nak_inv_req": 1}
    _, aeth, _ = _reply(out)
    assert aeth.syndrome == 0x61



def test_an_ack_beyond_what_each_qp_sent_completes_nothing(rx):
    """RESP-12 per QP: each requester's next PSN lives in its own slot of an mmap-able array the
    daemon stores into (no system call per post); an ACK beyond it is forged, whatever the
    other QPs sent. (A slot addressed with the wrong stride once let every QP but the first
    accept any ACK.)"""
    qps = [(0x000311 + i, 1000 * (i + 1)) for i in range(4)]
    for qpn, psn in qps:
        rx.del_qp(qpn)
        rx.set_qp(qpn, epsn=0, pd=PD, dqpn=PEER_QPN, sq_psn=psn)
        rx.set_sq_psn(qpn, psn + 4)                     # PSNs psn .. psn + 3 sent
    for qpn, psn in reversed(qps):
        before = rx.counters()
        rx.run(pkt(0x11, psn + 40, struct.pack("!I", 1), qpn=qpn))          # forged ACK
        assert delta(rx, before) == {"unexpected_response": 1}
        assert rx.qp_state(qpn)["una"] == psn
        before = rx.counters()
        rx.run(pkt(0x11, psn + 3, struct.pack("!I", 1), qpn=qpn))           # the real one
        assert delta(rx, before) == {"ack": 1} and rx.qp_state(qpn)["una"] == psn + 4
    for qpn, _ in qps:
        rx.del_qp(qpn)


@pytest.mark.parametrize("v6", [False, True])
@pytest.mark.parametrize("linear", [None, 3000, 200, 114, 113, 80, 66])
def test_multi_buffer_write_is_placed_whole_or_refused_before_it_changes_anything(rx, v6, linear):
    """A 4 KiB WRITE in a multi-buffer frame (the payload, and with a short linear part the
    RETH, in page fragments) is placed whole and ACKed from its linear part. A frame whose
    linear part cannot hold the longest reply (114 bytes) is refused as malformed before it is
    executed: found by `metaroce fuzz --mtu 9000`, such a WRITE was placed and took its PSN,
    then was counted malformed (no ACK) when the reply did not fit."""
    mr = rx.reg_mr(3 * 65536, PD, ACCESS_REMOTE_WRITE)
    rx.set_qp(QPN, epsn=500, pd=PD, pmtu=4096)
    data = bytes((i * 11 + 3) & 0xFF for i in range(4096))
    frame = pkt(WRITE_ONLY, 500, reth(mr.addr + 65536 - 100, mr.rkey, 4096) + data, v6=v6,
                ackreq=1)
    assert len(frame) > 4096 and (linear is None or linear < len(frame))
    before, pb = rx.counters(), rx.port_counters()
    rc, out, _ = rx.run(frame, linear=linear)
    d = delta(rx, before)
    assert rx.port_counters()["rcv_multi_buf"] - pb["rcv_multi_buf"] == 1
    assert rx.port_counters()["rcv_bytes"] - pb["rcv_bytes"] == len(frame)
    if linear is None or linear >= 114:
        assert rc == XDP_TX and d == {"placed": 1, "tx_ack": 1}, d
        assert bytes(mr.buf[65536 - 100:65536 - 100 + 4096]) == data   # across a chunk edge
        assert rx.qp_epsn(QPN) == 501
    else:
        assert rc == XDP_DROP and d == {"malformed": 1}, d
        assert bytes(mr.buf) == bytes(len(mr.buf)) and rx.qp_epsn(QPN) == 500
    rx.dereg_mr(mr)


@pytest.mark.parametrize("v6", [False, True])
def test_a_wrong_ip_version_is_not_roce(rx, v6):
    """An IPv4 ethertype over a header whose version is not 4 (or IPv6's not 6) is not an IP
    packet (the stack drops it too): it passes as not RoCE, nothing placed, no reply, whatever
    its valid-looking UDP 4791 and BTH behind it. The fuzzer found the NIC answering such a
    frame (2026-12-07)."""
    mr = rx.reg_mr(1 << 20, PD, ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE)
    rx.set_qp(QPN, epsn=2000, pd=PD, pmtu=4096)
    data = bytes(range(200))
    good = bytearray(pkt(WRITE_ONLY, 2000, reth(mr.addr, mr.rkey, len(data)) + data, v6=v6,
                         ackreq=1))
    for version in (0, 4 if v6 else 6, 7, 15):
        bad = bytearray(good)
        bad[14] = (version << 4) | (bad[14] & 0x0F)
        before = rx.counters()
        rc, _, _ = rx.run(bytes(bad))
        assert rc == XDP_PASS and delta(rx, before) == {"not_roce": 1}, (version, delta(rx, before))
    assert bytes(mr.buf[:len(data)]) == bytes(len(data)) and rx.qp_state(QPN)["epsn"] == 2000
    before = rx.counters()
    rc, _, _ = rx.run(bytes(good))                    # the same frame with its right version
    assert rc == XDP_TX and delta(rx, before) == {"placed": 1, "tx_ack": 1}
    assert bytes(mr.buf[:len(data)]) == data
    rx.dereg_mr(mr)
