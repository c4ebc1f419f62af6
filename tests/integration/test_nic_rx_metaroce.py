"""MetaRoCE mode in the kernel (spec section 5), through the loaded XDP program with
BPF_PROG_TEST_RUN; packets built and replies parsed with our codec (which scapy and tshark
cross-check elsewhere): WRITE packets placed on arrival in any order (PLACE-1, PLACE-2), the
receive bitmap and cumulative PSN (SACK-1), SACKs when SACK-2 says (AckReq, out of order, every
16), duplicates inside and below the window (SACK-3), SENDs by RSN and offset with completions
reported for in-order delivery (PLACE-3, PLACE-5), RNR as a SACK (SACK-6), fatal errors as a
SACK with the NAK syndrome (SACK-7), READ/ATOMIC only at the cumulative PSN, the other mode's
opcodes refused (EXT-2), and the requester consuming SACKs (SACK-4)."""

import os

import pytest
from scapy.layers.inet import IP, UDP as SUDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from metaroce.nic.rx import ACCESS_LOCAL_WRITE, ACCESS_REMOTE_ATOMIC, ACCESS_REMOTE_READ, \
    ACCESS_REMOTE_WRITE
from metaroce.wire import consts as C
from metaroce.wire.headers import AETH, BTH, PETH, RETH, SACKETH, AtomicETH, ImmDt
from metaroce.wire.packet import UDP, Ethernet, IPv4, IPv6, RocePacket, parse_frame

XDP_DROP, XDP_PASS, XDP_TX = 1, 2, 3
QPN, PD, PEER = 0x000777, 3, 0x000888
MTU = 256
O = C.Opcode
ALL = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ | ACCESS_REMOTE_ATOMIC


@pytest.fixture
def qp(rx):
    rx.del_qp(QPN)
    rx.set_qp(QPN, epsn=0xFFFFF0, pd=PD, dqpn=PEER, pmtu=MTU, sq_psn=5000, metaroce=True)
    mr = rx.reg_mr(64 * 1024, PD, ALL)
    yield mr
    rx.dereg_mr(mr)
    rx.del_qp(QPN)


def frame(op, psn, headers, payload=b"", v6=False, ackreq=0, ce=False):
    ecn = C.ECN_CE if ce else C.ECN_ECT0
    ip = (IPv6(src="fd00::1", dst="fd00::2", ecn=ecn) if v6 else
          IPv4(src="10.7.0.1", dst="10.7.0.2", ecn=ecn))
    return RocePacket(ip=ip, bth=BTH(opcode=op, dest_qp=QPN, psn=psn & 0xFFFFFF, ack_req=ackreq),
                      headers=headers, payload=payload, udp=UDP(sport=0xC001),
                      eth=Ethernet(dst="02:00:00:00:00:02", src="02:00:00:00:00:01")).to_bytes()


def write_pkts(mr, psn0, data, va_off=0, ssn=1, imm=None, rsn=0):
    n = -(-len(data) // MTU)
    out = []
    for i in range(n):
        if n == 1:
            op = O.MR_RDMA_WRITE_ONLY_WITH_IMMEDIATE if imm is not None else O.MR_RDMA_WRITE_ONLY
        elif i == 0:
            op = O.MR_RDMA_WRITE_FIRST
        elif i == n - 1:
            op = O.MR_RDMA_WRITE_LAST_WITH_IMMEDIATE if imm is not None else O.MR_RDMA_WRITE_LAST
        else:
            op = O.MR_RDMA_WRITE_MIDDLE
        hdrs = (PETH(path_id=0, ssn=ssn, offset=i * MTU, rsn=rsn),
                RETH(va=mr.addr + va_off, rkey=mr.rkey, dma_len=len(data)))
        if imm is not None and i == n - 1:
            hdrs += (ImmDt(imm),)
        out.append(frame(op, psn0 + i, hdrs, data[i * MTU:(i + 1) * MTU], ackreq=int(i == n - 1)))
    return out


def run(rx, f):
    before = rx.counters()
    rc, out, _ = rx.run(f)
    after = rx.counters()
    return rc, out, {k: after[k] - before[k] for k in after if after[k] != before[k]}


def sack_of(out):
    p = parse_frame(out)
    assert p.bth.opcode == O.MR_SACK and p.bth.dest_qp == PEER
    return p.bth.psn, p.get(AETH), p.get(SACKETH)


def test_reversed_write_is_placed_on_arrival_and_sacked(rx, qp):
    data = os.urandom(8 * MTU)
    pkts = write_pkts(qp, 0xFFFFF0, data, va_off=100)           # PSNs wrap past 2^24
    rc, out, d = run(rx, pkts[-1])                               # the LAST first: out of order
    assert rc == XDP_TX and d == {"placed": 1, "tx_sack": 1}
    cum, aeth, sk = sack_of(out)
    assert cum == 0xFFFFEF and aeth.syndrome == 0x1F and sk.flags & C.SACK_F_OOO
    assert sk.sacked(cum) == [0xFFFFF7]
    for f in reversed(pkts[1:-1]):                               # MIDDLEs, reversed
        rc, out, d = run(rx, f)
        assert d.get("placed") == 1
    st = rx.qp_state(QPN)
    assert st["epsn"] == 0xFFFFF0 and st["out_of_sequence"] == 7
    assert bytes(qp.buf[100 + MTU:100 + 8 * MTU]) == data[MTU:]  # placed before the FIRST
    rc, out, d = run(rx, pkts[0])                                # the hole fills
    st = rx.qp_state(QPN)
    assert st["epsn"] == 0xFFFFF8 and st["msn"] == 1 and st["rbm_hi"] == st["rbm_lo"] == 0
    assert bytes(qp.buf[100:100 + 8 * MTU]) == data
    # the filled hole is reported (EV_EPSN) so user space can complete what waited for it
    rc, out, d = run(rx, pkts[3])                                # a duplicate below ePSN
    assert rc == XDP_DROP and d == {"duplicate": 1}
    rc, out, d = run(rx, pkts[-1])                               # AckReq duplicate: SACKed
    assert rc == XDP_TX and d == {"duplicate": 1, "tx_sack": 1}
    assert sack_of(out)[0] == 0xFFFFF7


def test_sack_every_sixteen_and_bitmap_edges(rx, qp):
    data = os.urandom(40 * MTU)
    pkts = write_pkts(qp, 0xFFFFF0, data)
    sacks = []
    for i, f in enumerate(pkts[:-1]):                            # in order, no AckReq
        rc, out, d = run(rx, f)
        if rc == XDP_TX:
            sacks.append(i)
    assert sacks == [15, 31]                                     # SACK-2 (e)
    rx.del_qp(QPN)
    rx.set_qp(QPN, epsn=100, pd=PD, dqpn=PEER, pmtu=MTU, metaroce=True)
    pk = write_pkts(qp, 100, os.urandom(200 * MTU))
    assert run(rx, pk[127])[2] == {"placed": 1, "tx_sack": 1}    # d = 127: the window's edge
    assert run(rx, pk[128])[2] == {"beyond_window": 1}           # d = 128: not recorded
    rc, out, d = run(rx, pk[64])
    assert d == {"placed": 1}                                    # 2nd OOO arrival: no SACK yet
    assert rx.qp_state(QPN)["rbm_hi"] == 1 and rx.qp_state(QPN)["rbm_lo"] == 2


def test_send_by_rsn_out_of_order_and_rnr(rx, qp):
    rx.post_recv(QPN, 0, 0xAB, qp.addr + 4096, qp.rkey, 3 * MTU)
    data = os.urandom(2 * MTU + 10)
    ops = (O.MR_SEND_FIRST, O.MR_SEND_MIDDLE, O.MR_SEND_LAST_WITH_IMMEDIATE)
    pk = [frame(op, 0xFFFFF0 + i, (PETH(path_id=1, ssn=0, offset=i * MTU, rsn=0),) +
                ((ImmDt(0x01020304),) if i == 2 else ()), data[i * MTU:(i + 1) * MTU],
                ackreq=int(i == 2)) for i, op in enumerate(ops)]
    rc, out, d = run(rx, pk[2])
    assert rc == XDP_TX and d == {"placed": 1, "tx_sack": 1}
    rc, out, d = run(rx, pk[1])
    rc, out, d = run(rx, pk[0])
    assert rx.qp_state(QPN)["epsn"] == 0xFFFFF3 and rx.qp_state(QPN)["msn"] == 1
    assert bytes(qp.buf[4096:4096 + len(data)]) == data
    # RSN 1 was never posted: RNR, not recorded (SACK-6)
    f = frame(O.MR_SEND_ONLY, 0xFFFFF3, (PETH(path_id=0, ssn=1, offset=0, rsn=1),), b"x" * 8)
    rc, out, d = run(rx, f)
    cum, aeth, sk = sack_of(out)
    assert d == {"rnr": 1, "tx_nak_rnr": 1} and aeth.syndrome >> 5 == 1 and cum == 0xFFFFF2
    assert rx.qp_state(QPN)["epsn"] == 0xFFFFF3


def test_fatal_errors_are_sacks_with_the_nak_code(rx, qp):
    f = frame(O.MR_RDMA_WRITE_ONLY, 0xFFFFF2,
              (PETH(path_id=0, ssn=1, offset=0), RETH(va=qp.addr, rkey=qp.rkey ^ 1, dma_len=8)),
              b"y" * 8)
    rc, out, d = run(rx, f)                                      # out of order, bad rkey
    cum, aeth, sk = sack_of(out)
    assert d == {"bad_rkey": 1, "tx_nak_rem_access": 1}
    assert cum == 0xFFFFF2 and aeth.syndrome == 0x62 and sk.bitmap == 0   # SACK-7
    rc, out, d = run(rx, frame(O.MR_RDMA_WRITE_ONLY, 0xFFFFF0, (PETH(path_id=0, ssn=0, offset=0),
                     RETH(va=qp.addr, rkey=qp.rkey, dma_len=8)), b"z" * 8))
    assert d == {"qp_error": 1}


def test_read_and_atomic_only_at_the_cumulative_psn(rx, qp):
    qp.buf[8:16] = (41).to_bytes(8, "little")
    at = frame(O.MR_FETCH_ADD, 0xFFFFF1, (PETH(path_id=2, ssn=7, offset=0, ts=0xABCD),
               AtomicETH(va=qp.addr + 8, rkey=qp.rkey, swap_add=1, compare=0)), ackreq=1)
    assert run(rx, at)[2] == {"beyond_window": 1}                # ahead: not executed
    w = write_pkts(qp, 0xFFFFF0, b"w" * 16, va_off=1024)
    run(rx, w[0])
    rc, out, d = run(rx, at)
    assert rc == XDP_TX and d == {"atomic": 1, "tx_atomic_ack": 1}
    p = parse_frame(out)
    assert p.bth.opcode == O.MR_ATOMIC_ACKNOWLEDGE and p.get(PETH).ssn == 7
    assert p.get(PETH).ts == 0xABCD and p.get(PETH).path_id == 2
    assert int.from_bytes(qp.buf[8:16], "little") == 42
    rc, out, d = run(rx, at)                                     # duplicate: the saved result
    assert rc == XDP_TX and d == {"duplicate": 1, "tx_atomic_ack": 1}
    assert int.from_bytes(qp.buf[8:16], "little") == 42
    rd = frame(O.MR_RDMA_READ_REQUEST, 0xFFFFF2, (PETH(path_id=0, ssn=8, offset=0),
               RETH(va=qp.addr, rkey=qp.rkey, dma_len=3 * MTU)), ackreq=1)
    rc, out, d = run(rx, rd)
    assert d == {"read_request": 1} and rx.qp_state(QPN)["epsn"] == 0xFFFFF5


def test_wrong_mode_and_reserved_bits(rx, qp):
    rc_write = frame(O.RC_RDMA_WRITE_ONLY, 0xFFFFF0, (RETH(va=qp.addr, rkey=qp.rkey, dma_len=4),),
                     b"abcd")
    assert run(rx, rc_write)[2] == {"wrong_mode": 1}
    raw = bytearray(write_pkts(qp, 0xFFFFF0, b"q" * 8)[0])
    raw[14 + 20 + 8 + 12 + 2] = 1                                # PETH reserved byte (EXT-4)
    from metaroce.fuzz.frames import fix_icrc
    fix_icrc(raw)
    assert run(rx, bytes(raw))[2] == {"malformed": 1}


@pytest.mark.parametrize("v6", [False, True], ids=["ipv4", "ipv6"])
def test_requester_consumes_sacks(rx, qp, v6):
    rx.set_sq_psn(QPN, 5100)                                     # PSNs 5000 .. 5099 sent
    bm = SACKETH.bitmap_for(5009, [5011, 5012, 5050])
    f = frame(O.MR_SACK, 5009, (AETH(syndrome=0x1F, msn=3), SACKETH(flags=C.SACK_F_OOO,
              bitmap=bm)), v6=v6)
    rc, out, d = run(rx, f)
    st = rx.qp_state(QPN)
    assert rc == XDP_DROP and d == {"ack": 1}
    assert st["una"] == 5010 and st["sack_cum"] == 5009
    assert (st["sbm_hi"] << 64 | st["sbm_lo"]) == bm
    forged = frame(O.MR_SACK, 5200, (AETH(syndrome=0x1F, msn=3), SACKETH()), v6=v6)
    assert run(rx, forged)[2] == {"unexpected_response": 1}     # beyond what was sent
    rx.set_qp(QPN, epsn=0xFFFFF0, pd=PD, dqpn=PEER, pmtu=MTU, sq_psn=5000, metaroce=True)


def test_multi_buffer_frames_are_checked_and_placed_whole(rx):
    """Issue 21: the program is frags-aware (BPF_F_XDP_HAS_FRAGS), so frames larger than a page
    reach it as multi-buffer xdp_buffs (BPF_PROG_TEST_RUN builds them as veth does at MTU 9000).
    Two 4 KiB WRITE packets at PMTU 4096 pass the ICRC and are placed byte for byte across the
    fragments; a 9 KiB packet is dropped (longer than any path MTU: its ICRC is not
    verified) and writes nothing; a 9 KB
    frame that is not RoCE passes to the stack."""
    qpn, pmtu = 0x000779, 4096
    rx.del_qp(qpn)
    rx.set_qp(qpn, epsn=100, pd=PD, dqpn=PEER, pmtu=pmtu, metaroce=True)
    mr = rx.reg_mr(64 * 1024, PD, ALL)
    try:
        data = os.urandom(2 * pmtu)

        def pkt(op, psn, off, payload, length):
            hdrs = (PETH(path_id=0, ssn=1, offset=off, rsn=0),
                    RETH(va=mr.addr + 512, rkey=mr.rkey, dma_len=length))
            return RocePacket(ip=IPv4(src="10.7.0.1", dst="10.7.0.2"),
                              bth=BTH(opcode=op, dest_qp=qpn, psn=psn, ack_req=1), headers=hdrs,
                              payload=payload, udp=UDP(sport=0xC001),
                              eth=Ethernet(dst="02:00:00:00:00:02",
                                           src="02:00:00:00:00:01")).to_bytes()
        last = pkt(O.MR_RDMA_WRITE_LAST, 101, pmtu, data[pmtu:], len(data))
        assert len(last) > 4096                      # more than a page with XDP's headroom
        rc, out, d = run(rx, last)                   # out of order: the LAST first
        assert rc == XDP_TX and d == {"placed": 1, "tx_sack": 1}, d
        rc, out, d = run(rx, pkt(O.MR_RDMA_WRITE_FIRST, 100, 0, data[:pmtu], len(data)))
        assert d.get("placed") == 1, d
        assert bytes(mr.buf[512:512 + len(data)]) == data
        assert rx.qp_state(qpn)["epsn"] == 102
        before = bytes(mr.buf)
        big = pkt(O.MR_RDMA_WRITE_ONLY, 102, 0, os.urandom(9216), 9216)
        rc, out, d = run(rx, big)
        # longer than any path MTU (MAX_PAYLOAD, 8192: a fitted one, CM-14): the ICRC loop
        # covers MAX_PAYLOAD, so it is dropped as unverifiable before any state is read
        assert rc == XDP_DROP and d == {"bad_icrc": 1}, d
        assert bytes(mr.buf) == before and rx.qp_state(qpn)["epsn"] == 102
        jumbo = bytes(Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02") /
                      IP(src="10.7.0.1", dst="10.7.0.2") / SUDP(sport=5000, dport=5001) /
                      Raw(os.urandom(8964)))
        rc, out, d = run(rx, jumbo)
        assert rc == XDP_PASS and d == {"not_roce": 1}, d
    finally:
        rx.dereg_mr(mr)
        rx.del_qp(qpn)


def test_fitted_mtu_payloads_of_8000_bytes_are_placed_and_bounded(rx):
    """CM-14 at MTU 9000: a MetaRoCE QP at the fitted path MTU 8000 (MAX_PAYLOAD is 8192) takes
    8000-byte packets whole across the frame's fragments and a region's 64 KiB chunk edge; one
    that would run 1 byte past its region's end is refused (mr_bounds, fatal) and writes
    nothing, in the region or behind it."""
    qpn, pmtu = 0x00077A, 8000
    rx.del_qp(qpn)
    rx.set_qp(qpn, epsn=10, pd=PD, dqpn=PEER, pmtu=pmtu, metaroce=True)
    mr = rx.reg_mr(3 * 65536 - 5000, PD, ALL)        # its end inside the third chunk
    full = rx.mrs[mr.rkey]._mm
    try:
        data = os.urandom(2 * pmtu + 999)

        def pkt(op, psn, off, payload, length, va):
            hdrs = (PETH(path_id=0, ssn=1, offset=off, rsn=0),
                    RETH(va=va, rkey=mr.rkey, dma_len=length))
            return RocePacket(ip=IPv4(src="10.7.0.1", dst="10.7.0.2"),
                              bth=BTH(opcode=op, dest_qp=qpn, psn=psn, ack_req=1), headers=hdrs,
                              payload=payload, udp=UDP(sport=0xC001),
                              eth=Ethernet(dst="02:00:00:00:00:02",
                                           src="02:00:00:00:00:01")).to_bytes()
        va = mr.addr + 65536 - 3000                   # the first packet straddles a chunk edge
        for i, op in enumerate((O.MR_RDMA_WRITE_FIRST, O.MR_RDMA_WRITE_MIDDLE,
                                O.MR_RDMA_WRITE_LAST)):
            part = data[i * pmtu:(i + 1) * pmtu]
            rc, out, d = run(rx, pkt(op, 10 + i, i * pmtu, part, len(data), va))
            assert d.get("placed") == 1, (i, d)
        assert bytes(mr.buf[65536 - 3000:65536 - 3000 + len(data)]) == data
        assert rx.qp_state(qpn)["epsn"] == 13
        before = bytes(full)
        end = mr.addr + mr.length
        rc, out, d = run(rx, pkt(O.MR_RDMA_WRITE_ONLY, 13, 0, os.urandom(pmtu), pmtu,
                                 end - pmtu + 1))
        assert rc == XDP_TX and d.get("mr_bounds") == 1, d
        assert bytes(full) == before                  # nothing in the region, nothing behind it
    finally:
        rx.dereg_mr(mr)
        rx.del_qp(qpn)
