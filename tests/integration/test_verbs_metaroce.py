"""MetaRoCE mode end to end (spec section 5) over a real lab pair: two daemons offering
`--mode metaroce`, QPs that negotiate it, every operation with data verified byte for byte, and
selective repeat under loss injected by the lab's XDP impairment: lost packets are
retransmitted one by one (SACK-4/5) instead of going back N, and completions stay in order
(PLACE-5). A peer that does not ask for MetaRoCE gets RoCEv2 (CM-5)."""

import hashlib
import os
import time

import pytest
from verbs_util import End, connect, daemons, ip_of, lab_pair

from metaroce.lab.impair import Impairment
from metaroce.verbs import (IBV_WC_SUCCESS, IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WR_ATOMIC_FETCH_AND_ADD,
                            IBV_WR_RDMA_READ, IBV_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE_WITH_IMM,
                            IBV_WR_SEND, IBV_WR_SEND_WITH_IMM, Context, RecvWR, SendWR)

MiB = 1 << 20


@pytest.fixture(scope="module")
def pair(module_lab_name):
    from metaroce.lab import core
    view = lab_pair(module_lab_name)
    try:
        with daemons(view, mode="metaroce"):
            c1 = Context("eth0", view.plan.node("h1").netns)
            c2 = Context("eth0", view.plan.node("h2").netns)
            yield view, c1, c2
            c1.close()
            c2.close()
    finally:
        core.down(module_lab_name)


def ends(pair, mode="metaroce", mr_bytes=8 * MiB):
    view, c1, c2 = pair
    a, b = End(c1, mr_bytes), End(c2, mr_bytes)
    connect(a, b, ip_of(view, "h1"), ip_of(view, "h2"), mode=mode)
    return a, b


def close(*eps):
    for e in eps:
        e.qp.close()
        e.mr.close()


def ok(wcs, ids):
    assert [(w.wr_id, w.status) for w in wcs] == [(i, IBV_WC_SUCCESS) for i in ids], wcs


def test_every_operation_in_metaroce_mode(pair):
    a, b = ends(pair)
    assert a.qp.query()["mode"] == b.qp.query()["mode"] == "metaroce"
    data = os.urandom(3 * MiB + 517)
    a.mr.write(data)
    a.qp.post_send(SendWR(IBV_WR_RDMA_WRITE, wr_id=1, sg_list=[a.mr.sge(0, len(data))],
                          remote_addr=b.mr.addr + 100, rkey=b.mr.rkey))
    a.qp.post_send(SendWR(IBV_WR_RDMA_READ, wr_id=2, sg_list=[a.mr.sge(4 * MiB, len(data))],
                          remote_addr=b.mr.addr + 100, rkey=b.mr.rkey))
    ok(a.cq.wait(2, timeout_s=30), [1, 2])
    assert b.mr.read(len(data), 100) == data and a.mr.read(len(data), 4 * MiB) == data

    b.qp.post_recv([RecvWR(wr_id=10 + i, sg_list=[b.mr.sge(7 * MiB + i * 65536, 65536)])
                    for i in range(4)])
    a.qp.post_send([SendWR(IBV_WR_SEND_WITH_IMM, wr_id=20, imm_data=0xCAFE,
                           sg_list=[a.mr.sge(0, 65536)]),
                    SendWR(IBV_WR_SEND, wr_id=21, sg_list=[a.mr.sge(65536, 1000)]),
                    SendWR(IBV_WR_RDMA_WRITE_WITH_IMM, wr_id=22, imm_data=7,
                           sg_list=[a.mr.sge(0, 5000)], remote_addr=b.mr.addr + 6 * MiB,
                           rkey=b.mr.rkey)])
    ok(a.cq.wait(3), [20, 21, 22])
    r = b.cq.wait(3)
    assert [(w.wr_id, w.status, w.byte_len, w.imm_data) for w in r] == \
        [(10, 0, 65536, 0xCAFE), (11, 0, 1000, None), (12, 0, 5000, 7)]
    assert b.mr.read(65536, 7 * MiB) == data[:65536]
    assert b.mr.read(1000, 7 * MiB + 65536) == data[65536:66536]
    assert b.mr.read(5000, 6 * MiB) == data[:5000]

    word = 7 * MiB + 4 * 65536
    b.mr.write((100).to_bytes(8, "little"), word)
    a.qp.post_send([SendWR(IBV_WR_ATOMIC_FETCH_AND_ADD, wr_id=30, compare_add=5,
                           sg_list=[a.mr.sge(8, 8)], remote_addr=b.mr.addr + word, rkey=b.mr.rkey),
                    SendWR(IBV_WR_ATOMIC_CMP_AND_SWP, wr_id=31, compare_add=105, swap=1,
                           sg_list=[a.mr.sge(16, 8)], remote_addr=b.mr.addr + word,
                           rkey=b.mr.rkey)])
    ok(a.cq.wait(2), [30, 31])
    assert a.mr.read(8, 8) == (100).to_bytes(8, "little")
    assert a.mr.read(8, 16) == (105).to_bytes(8, "little")
    assert b.mr.read(8, word) == (1).to_bytes(8, "little")
    view, c1, c2 = pair
    hb = c2.status()["counters"]
    assert hb["tx_sack"] > 0 and hb["tx_ack"] == 0 and hb["tx_nak_seq"] == 0   # EXT-6
    close(a, b)


def test_selective_repeat_under_loss(pair):
    """2 % loss each way: everything arrives, only lost packets are resent (no go-back-N)."""
    view, c1, c2 = pair
    a, b = ends(pair)
    view.impair("h1-sw1", "both", Impairment(loss=0.02, seed=11).validate())
    try:
        data = os.urandom(4 * MiB)
        a.mr.write(data)
        for i in range(4):
            a.qp.post_send(SendWR(IBV_WR_RDMA_WRITE, wr_id=i, sg_list=[a.mr.sge(i * MiB, MiB)],
                                  remote_addr=b.mr.addr + i * MiB, rkey=b.mr.rkey))
        ok(a.cq.wait(4, timeout_s=60), [0, 1, 2, 3])
        b.qp.post_recv([RecvWR(wr_id=i, sg_list=[b.mr.sge(4 * MiB + i * 8192, 8192)])
                        for i in range(32)])
        a.qp.post_send([SendWR(IBV_WR_SEND, wr_id=100 + i, sg_list=[a.mr.sge(i * 8192, 8192)])
                        for i in range(32)])
        ok(a.cq.wait(32, timeout_s=60), [100 + i for i in range(32)])
        ok(b.cq.wait(32, timeout_s=60), list(range(32)))         # in order (PLACE-5)
    finally:
        view.impair("h1-sw1", "both", None)
    assert hashlib.sha256(b.mr.read(4 * MiB)).digest() == hashlib.sha256(data).digest()
    assert b.mr.read(32 * 8192, 4 * MiB) == data[:32 * 8192]
    st = a.qp.query()
    sent = 4 * MiB // 1024 + 32 * 8
    # about 2 % of the data (and of the SACKs) is lost; go-back-N would resend whole windows
    assert 0 < st["selective_retransmits"] and st["retransmitted_packets"] < 0.15 * sent, st
    assert b.qp.query()["out_of_sequence"] > 0
    close(a, b)


def test_a_peer_that_does_not_ask_gets_roce(pair):
    a, b = ends(pair, mode="roce")
    assert a.qp.query()["mode"] == b.qp.query()["mode"] == "roce"
    a.mr.write(b"x" * 4096)
    a.qp.post_send(SendWR(IBV_WR_RDMA_WRITE, wr_id=1, sg_list=[a.mr.sge(0, 4096)],
                          remote_addr=b.mr.addr, rkey=b.mr.rkey))
    ok(a.cq.wait(1), [1])
    assert b.mr.read(4096) == b"x" * 4096
    close(a, b)


def test_infinite_timeout_still_repairs_and_never_fails(pair):
    """RTO-4 (C9): with timeout 0 a MetaRoCE requester keeps retransmitting (RTO_max 1 s) while
    the peer is unreachable, never fails for it (retry_cnt 0), and completes once the path is
    back. Before, the data path ran no RTO at all with timeout 0: a lost packet was never
    repaired."""
    view, c1, c2 = pair
    a, b = End(c1, MiB), End(c2, MiB)
    connect(a, b, ip_of(view, "h1"), ip_of(view, "h2"), mode="metaroce", timeout=0, retry_cnt=0)
    view.impair("h1-sw1", "both", Impairment(loss=1.0, seed=3).validate())
    try:
        a.mr.write(b"patient" * 8)
        a.qp.post_send(SendWR(IBV_WR_RDMA_WRITE, wr_id=9, sg_list=[a.mr.sge(0, 56)],
                              remote_addr=b.mr.addr, rkey=b.mr.rkey))
        time.sleep(2.5)                                  # a silent peer ...
        assert a.cq.poll(1) == []                        # ... fails nothing (retry_cnt 0)
        assert a.qp.query()["retransmitted_packets"] >= 1
    finally:
        view.impair("h1-sw1", "both", None)
    ok(a.cq.wait(1, timeout_s=5), [9])
    assert b.mr.read(56) == b"patient" * 8
    close(a, b)
