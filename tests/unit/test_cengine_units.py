"""The C engine's parts through cffi: RTO estimator, window CC, DCQCN, pacer, multipath, credits
(clauses RTO-1..3, CC-1..9, MP-1..5, COMPAT-4/5), the READ responder's go-back (RESP-4) with
a transmit path that cannot keep up, and the wire-side interface (events in, descriptors out)."""

import pytest

from metaroce.cengine.qp import _mod
from metaroce.engine.multipath import flow_label_sport

M = _mod()
ffi, lib = M.ffi, M.lib


def rto(initial=1_000_000, lo=1_000, hi=10**9, g=1):
    r = ffi.new("struct mre_rto *")
    lib.mre_rto_init(r, initial, lo, hi, g)
    return r


def test_rfc6298_estimator_and_backoff():
    e = rto()
    assert lib.mre_rto_ns(e) == 1_000_000
    lib.mre_rto_sample(e, 100_000)
    assert e.srtt == 100_000 and e.rttvar == 50_000 and lib.mre_rto_ns(e) == 300_000
    lib.mre_rto_sample(e, 200_000)
    assert e.rttvar == pytest.approx(0.75 * 50_000 + 0.25 * 100_000)
    assert e.srtt == pytest.approx(0.875 * 100_000 + 0.125 * 200_000)
    base = lib.mre_rto_ns(e)
    e.backoff = 2
    assert lib.mre_rto_ns(e) == 4 * base
    e.backoff = 40                          # doubling stops at RTO_max
    assert lib.mre_rto_ns(e) == 10**9
    assert lib.mre_rto_ns(rto(initial=1, lo=50)) == 50 and e.min_rtt == 100_000


def wcc(mtu=1024, enabled=True):
    c = ffi.new("struct mre_wcc *")
    lib.mre_wcc_init(c, 100e9, 8_000, 10_000, 1.25, 1.0, 0.8, 0.5, enabled, mtu)
    return c


def test_window_starts_at_the_bdp_cap_and_stays_in_bounds():
    """CC-1: initial cwnd = max_cwnd = 1.25 x BDP; never below one MTU."""
    c = wcc()
    assert c.max_cwnd == pytest.approx(1.25 * 100e9 * 8e-6 / 8) and c.cwnd == c.max_cwnd
    for t in range(50):
        lib.mre_wcc_on_ack(c, t * 100_000, 1024, 60_000, 1, 20_000.0)
    assert c.cwnd == 1024
    for t in range(2000):
        lib.mre_wcc_on_ack(c, 10**7 + t * 1000, 1024, 8_000, 0, 8_000.0)
    assert c.cwnd == c.max_cwnd


def test_window_quadrants_and_loss():
    """CC-3 quadrants; CC-4 loss cut once per SRTT and RTO reset."""
    c = wcc()
    c.cwnd = 50_000.0
    lib.mre_wcc_on_ack(c, 0, 4096, 9_000, 0, 9_000.0)
    assert c.cwnd == pytest.approx(50_000 + 4096 * (18_000 - 9_000) / 18_000)
    c.cwnd = 50_000.0
    lib.mre_wcc_on_ack(c, 0, 4096, 30_000, 0, 30_000.0)
    assert c.cwnd == pytest.approx(50_000 + 1024 * 4096 / 50_000)
    c.cwnd = 50_000.0
    lib.mre_wcc_on_ack(c, 1_000_000, 4096, 36_000, 1, 20_000.0)
    cut = 50_000 * max(1 - 0.8 * (36_000 - 18_000) / 36_000, 0.5)
    assert c.cwnd == pytest.approx(cut)
    lib.mre_wcc_on_ack(c, 1_010_000, 4096, 36_000, 1, 20_000.0)   # within one SRTT
    assert c.cwnd == pytest.approx(cut)
    c.cwnd = 50_000.0
    assert lib.mre_wcc_on_ack(c, 2_000_000, 4096, 9_000, 1, 9_000.0) == 1 and c.cwnd == 50_000
    top = c.cwnd
    lib.mre_wcc_on_loss(c, 3_000_000, 4000, 10_000.0)
    lib.mre_wcc_on_loss(c, 3_005_000, 4000, 10_000.0)
    assert c.cwnd == top - 4000
    lib.mre_wcc_on_rto(c, 3_010_000)
    assert c.cwnd == 1024 and c.rto_resets == 1
    off = wcc(enabled=False)
    lib.mre_wcc_on_rto(off, 0)
    assert off.cwnd == off.max_cwnd


def test_dcqcn_cuts_on_cnp_and_recovers_and_pacer_spacing():
    d = ffi.new("struct mre_dcqcn *")
    lib.mre_dcqcn_init(d, 100e9, 1, 1 / 256, 55_000, 55_000, 10 << 20, 5, 40e6, 400e6, 100e6)
    lib.mre_dcqcn_on_cnp(d, 0)
    assert d.rc == pytest.approx(50e9)
    lib.mre_dcqcn_on_cnp(d, 1_000)
    low = d.rc
    assert low < 50e9
    lib.mre_dcqcn_advance(d, 2_000_000)
    assert low < d.rc < d.line
    lib.mre_dcqcn_advance(d, 10**9)
    assert d.rc == d.line and d.alpha_t == -1
    p = ffi.new("struct mre_pacer *")
    lib.mre_pacer_sent(p, 0, 1250, 10e9)     # 1 us per 1250 bytes at 10 Gbit/s
    assert p.next_ns == 1000


def pathset(n, lq=0x11, rq=0x22, seed=3):
    s = ffi.new("struct mre_pathset *")
    assert lib.mre_paths_init(s, n, lq, rq, seed) == 0
    return ffi.gc(s, lib.mre_paths_free)


def test_path_set_entropy_wrr_and_eviction():
    """MP-1 ports, COMPAT-5 path 0, MP-3 weighted round robin, MP-5 eviction rules."""
    s = pathset(8)
    ports = [s.p[k].sport for k in range(8)]
    assert len(set(ports)) == 8 and all(0xC000 <= p <= 0xFFFF for p in ports)
    assert ports[0] == flow_label_sport(0x11, 0x22) == lib.mre_flow_label_sport(0x11, 0x22)
    picks = [lib.mre_paths_pick(s, -1) for _ in range(80)]
    assert all(picks.count(k) == 10 for k in range(8))
    lib.mre_paths_congested(s, 3)
    picks = [lib.mre_paths_pick(s, -1) for _ in range(800)]
    assert picks.count(3) < 60
    assert all(lib.mre_paths_pick(s, k) != k for k in range(8))
    assert lib.mre_paths_on_loss(s, 5, 0, 10_000.0) == 0
    assert lib.mre_paths_on_loss(s, 5, 50_000, 10_000.0) == 1     # 2 losses within 8 SRTT
    assert s.p[5].sport not in ports and s.p[5].evictions == 1
    assert s.p[5].weight == pytest.approx(1 / 8) and s.p[5].lost == 2
    lib.mre_paths_on_loss(s, 6, 0, 1_000.0)
    assert lib.mre_paths_on_loss(s, 6, 100_000, 1_000.0) == 0      # far apart
    lib.mre_paths_on_rto(s, 7, 1)
    assert s.p[7].rtos == 1 and s.p[7].evictions == 1 and s.evictions == 2
    m = pathset(4, 1, 2)
    old = m.p[2].sport
    for t in range(64):                       # mostly marked while the others are clean
        for k in range(4):
            lib.mre_paths_on_ack(m, k, 10_000, int(k == 2), t)
    assert m.p[2].sport != old and all(m.p[k].evictions == 0 for k in (0, 1, 3))
    one = pathset(1)
    lib.mre_paths_on_rto(one, 0, 0)
    assert one.p[0].evictions == 0            # nowhere else to go


def test_credit_gate_and_manager():
    """CC-8: share = max(1, BDP packets / active senders); stale grants ignored; limits only
    move forward; A=0 ends credit mode."""
    g = ffi.new("struct mre_credit_gate *")
    lib.mre_gate_init(g, 0xFFFFFE, 2)
    assert lib.mre_gate_allows(g, 0xFFFFFF) and not lib.mre_gate_allows(g, 0)
    assert lib.mre_gate_on_grant(g, 5, 1, 10, 0, 1)
    assert lib.mre_gate_allows(g, 9) and not lib.mre_gate_allows(g, 10)
    assert not lib.mre_gate_on_grant(g, 4, 0, 0, 0, 2)
    lib.mre_gate_refresh(g, 8, 3)
    assert g.limit == 10
    lib.mre_gate_refresh(g, 12, 3)
    assert g.limit == 12
    assert lib.mre_gate_on_grant(g, 6, 0, 0, 0, 4) and lib.mre_gate_allows(g, 10**6 & 0xFFFFFF)
    m = ffi.new("struct mre_credit_mgr *")
    assert lib.mre_credit_mgr_init(m, 64, 100e9, 8_000, 4096, 2, 20_000, 2, 4, 0) == 0
    try:
        assert lib.mre_credit_bdp_pkts(m) == 24
        lib.mre_credit_touch(m, 1, 0)
        assert lib.mre_credit_share(m, 0) == -1
        for k in range(2, 5):
            lib.mre_credit_touch(m, k, 100)
        assert lib.mre_credit_share(m, 100) == 6
        for k in range(5, 60):
            lib.mre_credit_touch(m, k, 200)
        assert lib.mre_credit_share(m, 200) == 1 and m.max_active == 59
        lib.mre_credit_touch(m, 1, 50_000)
        assert lib.mre_credit_share(m, 50_000) == -1     # the others went idle
    finally:
        lib.mre_credit_mgr_free(m)


# --- the engine through its C interface --------------------------------------------------------

def engine(**cfg):
    c = ffi.new("struct mre_engine_cfg *")
    c.max_qps, c.max_mrs, c.out_cap, c.cq_cap = 8, 4, 256, 256
    for k, v in cfg.items():
        setattr(c, k, v)
    return ffi.gc(lib.mre_engine_new(c), lib.mre_engine_free)


def qp(e, qpn, peer, mode, psn_send, psn_recv, window=64, mtu=256):
    c = ffi.new("struct mre_qp_cfg *")
    c.qpn, c.mode, c.paths, c.sq_cap, c.rq_cap, c.min_rto_ns = qpn, mode, 1, 64, 64, 10_000
    h = lib.mre_qp_new(e, c)
    a = ffi.new("struct mre_qp_attr *")
    a.dest_qpn, a.sq_psn, a.rq_psn, a.path_mtu, a.timeout = peer, psn_send, psn_recv, mtu, 14
    a.retry_cnt = a.rnr_retry = 7
    a.min_rnr_timer, a.max_rd_atomic, a.max_dest_rd_atomic, a.window = 1, 16, 16, window
    for st in (1, 2, 3):                      # INIT, RTR, RTS
        assert lib.mre_qp_modify(e, h, st, a) == 0
    return h


def take(e, n=256, now=0):
    out = ffi.new("struct mre_pkt[]", n)
    k = lib.mre_take_tx(e, out, n, now)
    return [out[i] for i in range(k)], out


def read_request(psn, va, length, dest=0x22):
    p = ffi.new("struct mre_pkt *")
    p.opcode, p.psn, p.dest_qp, p.flags, p.has = 0x0C, psn, dest, 1, 1   # RC READ, AckReq, RETH
    p.reth_va, p.reth_rkey, p.reth_len = va, 7, length
    return p


def test_read_responder_goes_back_only_for_what_was_sent():
    """RESP-4 as the wire does it: with a transmit path that takes 3 packets at a time, a
    re-read of a PSN still queued changes nothing; a re-read of one already sent puts the
    response from there ahead of the queued rest, whose stream is dropped (no response PSN
    is sent twice by the queue, none is skipped)."""
    e = engine()
    mem = bytearray(range(256)) * 32
    buf = ffi.from_buffer(mem)
    assert lib.mre_mr_reg(e, 7, 0x10000, len(mem), 4, buf) == 0
    b = qp(e, 0x22, 0x11, 0, 500, 100)
    lib.mre_rx(e, b, read_request(100, 0x10000, 8 * 256), 1)       # PSNs 100..107
    got, keep = take(e, 3)
    assert [p.psn for p in got] == [100, 101, 102]
    lib.mre_rx(e, b, read_request(105, 0x10000 + 5 * 256, 3 * 256), 2)   # not sent yet
    got, keep = take(e, 3)
    assert [p.psn for p in got] == [103, 104, 105]
    info = ffi.new("struct mre_qp_info *")
    lib.mre_qp_info(e, b, info)
    assert info.read_pending == 1 and info.read_go_backs == 0
    lib.mre_rx(e, b, read_request(101, 0x10000 + 256, 7 * 256), 3)       # 101 was sent
    got, keep = take(e, 64)
    assert [p.psn for p in got] == list(range(101, 108))                # from 101, once
    assert [bytes(ffi.buffer(p.data, p.len)) for p in got] == \
        [bytes(mem[i * 256:(i + 1) * 256]) for i in range(1, 8)]
    assert got[0].opcode == 0x0D and got[-1].opcode == 0x0F and got[-1].has & 2   # AETH
    lib.mre_qp_info(e, b, info)
    assert info.read_go_backs == 1


def test_wire_interface_sack_event_to_retransmission_descriptor():
    """The wire's path: WQE in, packet descriptors out (payload named by the WQE's buffer);
    a SACK event (cumulative PSN + bitmap, as the XDP program reports it) declares the hole
    lost (SACK-5 a) and the next descriptor retransmits exactly it, flagged RETX."""
    e = engine()
    a = qp(e, 0x11, 0x22, 1, 1000, 2000)
    payload = bytes(range(256)) * 8
    src = ffi.from_buffer(payload)
    w = ffi.new("struct mre_wqe *")
    w.wr_id, w.opcode, w.send_flags, w.length = 77, 0, 2, len(payload)
    w.remote_addr, w.rkey, w.local = 0x5000, 9, int(ffi.cast("uintptr_t", src))
    assert lib.mre_post_send(e, a, w, 10_000) == 0
    sent, keep = take(e)
    assert [p.psn for p in sent] == list(range(1000, 1008))
    assert [p.opcode for p in sent] == [0xC6] + [0xC7] * 6 + [0xC8]
    assert all(p.wr_id == 77 and p.has & 64 and p.offset == i * 256 and p.len == 256 and
               int(ffi.cast("uintptr_t", p.data)) == w.local + i * 256
               for i, p in enumerate(sent))
    ev = ffi.new("struct mre_event *")
    ev.type, ev.psn, ev.syndrome, ev.ts_echo = 2, 1001, 0x1F, 10_000     # cum 1001
    ev.sack[0] = sum(1 << (p - 1001 - 2) for p in range(1003, 1008))  # 1002 missing
    lib.mre_event(e, a, ev, 30_000)
    retx, keep = take(e, now=30_000)
    assert [(p.psn, bool(p.flags & 2), p.offset) for p in retx] == [(1002, True, 512)]
    info = ffi.new("struct mre_qp_info *")
    lib.mre_qp_info(e, a, info)
    assert info.lost_a == 1 and info.una == 1002 and info.rto_samples == 1
    ev.psn, ev.sack[0] = 1007, 0
    lib.mre_event(e, a, ev, 40_000)
    cq = ffi.new("struct mre_cqe[]", 4)
    assert lib.mre_take_cqes(e, cq, 4) == 1 and cq[0].wr_id == 77 and cq[0].status == 0
    assert lib.mre_qp_deadline(e, a) == -1          # nothing outstanding: no timer


def test_wire_read_gap_rereads_from_the_gap_and_read_done_completes():
    """The wire reports READ progress, not packets: a gap at PSN p (earlier responses placed)
    re-reads from p with VA and length moved (SACK-8, RESP-4); done up to the last PSN
    completes the READ."""
    e = engine()
    a = qp(e, 0x11, 0x22, 1, 1000, 2000)
    dst = bytearray(8 * 256)
    w = ffi.new("struct mre_wqe *")
    w.wr_id, w.opcode, w.send_flags, w.length = 5, 4, 2, len(dst)
    w.remote_addr, w.rkey = 0x8000, 9
    w.local = int(ffi.cast("uintptr_t", ffi.from_buffer(dst)))
    assert lib.mre_post_send(e, a, w, 0) == 0
    req, keep = take(e)
    assert [(p.opcode, p.psn, p.reth_len) for p in req] == [(0xCC, 1000, 2048)]
    ev = ffi.new("struct mre_event *")
    ev.type, ev.psn = 8, 1003                      # 1000..1002 placed, 1003 missing
    lib.mre_event(e, a, ev, 20_000)
    rr, keep = take(e, now=20_000)
    assert [(p.psn, p.reth_va, p.reth_len, p.offset, bool(p.flags & 2)) for p in rr] == \
        [(1003, 0x8000 + 3 * 256, 5 * 256, 3 * 256, True)]
    ev.type, ev.psn = 7, 1007
    lib.mre_event(e, a, ev, 30_000)
    cq = ffi.new("struct mre_cqe[]", 4)
    assert lib.mre_take_cqes(e, cq, 4) == 1 and (cq[0].wr_id, cq[0].opcode) == (5, 2)


def test_wire_receives_complete_in_rsn_order_once_the_cumulative_psn_passed():
    """PLACE-5 on the wire: the data path completes receives as their last packet lands (out
    of order in MetaRoCE mode); the engine hands them to the CQ in RSN order, each only when
    the cumulative PSN passed its last PSN."""
    e = engine()
    b = qp(e, 0x22, 0x11, 1, 7, 5)
    ev = ffi.new("struct mre_event *")
    cq = ffi.new("struct mre_cqe[]", 4)

    def recv(rsn, last, imm=None):
        ev.type, ev.rsn, ev.psn, ev.wr_id, ev.len = 9, rsn, last, 100 + rsn, 10 * rsn
        ev.wc_opcode, ev.flags = 128, 0
        ev.imm, ev.wc_flags = (imm or 0), (2 if imm is not None else 0)
        lib.mre_event(e, b, ev, 0)

    def epsn(p):
        ev.type, ev.psn = 10, p
        lib.mre_event(e, b, ev, 0)

    recv(1, 20, imm=0xABCD)
    recv(0, 10)
    assert lib.mre_take_cqes(e, cq, 4) == 0
    epsn(15)
    assert lib.mre_take_cqes(e, cq, 4) == 1 and cq[0].wr_id == 100
    epsn(20)
    assert lib.mre_take_cqes(e, cq, 4) == 0          # PSN 20 not passed yet
    epsn(21)
    assert lib.mre_take_cqes(e, cq, 4) == 1
    assert (cq[0].wr_id, cq[0].byte_len, cq[0].imm, cq[0].wc_flags) == (101, 10, 0xABCD, 2)


def test_a_full_output_ring_stalls_no_qp():
    """Eight QPs post more than the output ring holds (32 packets, 16 per WQE: a QP can fill
    it exactly without blocking); taking the ring empty again and again sends every packet of
    every QP, each once, in the order the QPs waited."""
    e = engine(out_cap=32)
    payload = bytes(16 * 256)
    src = ffi.from_buffer(payload)
    hs = [qp(e, 0x100 + i, 0x200 + i, 1, 1000, 2000) for i in range(8)]
    w = ffi.new("struct mre_wqe *")
    w.opcode, w.send_flags, w.length, w.rkey = 0, 2, len(payload), 9
    w.local = int(ffi.cast("uintptr_t", src))
    for h in hs:
        for k in range(2):
            w.wr_id = k
            assert lib.mre_post_send(e, h, w, 0) == 0
    sent, order = [], []
    for _ in range(64):
        got, keep = take(e, 256)
        if not got:
            break
        sent += [(p.qp, p.psn) for p in got]
        order += [p.qp for p in got if p.offset == 0]
    assert len(sent) == len(set(sent)) == 8 * 2 * 16
    assert list(dict.fromkeys(order)) == hs
