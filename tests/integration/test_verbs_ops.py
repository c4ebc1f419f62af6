"""Every operation through the verbs API over a real lab pair (two daemons, XDP NICs, AF_XDP),
data verified byte for byte: WRITE (with immediate), READ, SEND (with immediate, inline,
gathered), atomics; and the error paths of the spec: RNR (RESP-6), remote access error
(RESP-5, ERR-1 flush), bad arguments, and isolation between applications."""

import hashlib
import os

import pytest
from verbs_util import End, connect, daemons, ip_of, lab_pair

from metaroce.errors import MetaroceError
from metaroce.verbs import (IBV_ACCESS_LOCAL_WRITE, IBV_SEND_INLINE, IBV_SEND_SIGNALED,
                            IBV_WC_REM_ACCESS_ERR, IBV_WC_RNR_RETRY_EXC_ERR, IBV_WC_SUCCESS,
                            IBV_WC_WR_FLUSH_ERR, IBV_WR_ATOMIC_CMP_AND_SWP,
                            IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_WR_RDMA_READ, IBV_WR_RDMA_WRITE,
                            IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_SEND, IBV_WR_SEND_WITH_IMM, MR, PD,
                            Context, RecvWR, SendWR)

MiB = 1 << 20


@pytest.fixture(scope="module")
def pair(module_lab_name):
    from metaroce.lab import core
    view = lab_pair(module_lab_name)
    try:
        with daemons(view):
            c1 = Context("eth0", view.plan.node("h1").netns)
            c2 = Context("eth0", view.plan.node("h2").netns)
            yield view, c1, c2
            c1.close()
            c2.close()
    finally:
        core.down(module_lab_name)


def ends(pair, mr_bytes=8 * MiB, **attr):
    view, c1, c2 = pair
    a, b = End(c1, mr_bytes), End(c2, mr_bytes)
    connect(a, b, ip_of(view, "h1"), ip_of(view, "h2"), **attr)
    return a, b


def one(cq):
    wc = cq.wait(1)[0]
    return wc


def test_write_read_send_atomics(pair):
    a, b = ends(pair)
    data = os.urandom(3 * MiB + 517)                 # not a multiple of the PMTU
    a.mr.write(data)
    a.qp.post_send(SendWR(IBV_WR_RDMA_WRITE, wr_id=1, sg_list=[a.mr.sge(0, len(data))],
                          remote_addr=b.mr.addr + 100, rkey=b.mr.rkey))
    wc = one(a.cq)
    assert (wc.wr_id, wc.status, wc.opcode, wc.byte_len) == (1, IBV_WC_SUCCESS, "RDMA_WRITE", len(data))
    assert hashlib.sha256(b.mr.read(len(data), 100)).digest() == hashlib.sha256(data).digest()

    # READ it back into the other half of a's region
    a.qp.post_send(SendWR(IBV_WR_RDMA_READ, wr_id=2, sg_list=[a.mr.sge(4 * MiB, len(data))],
                          remote_addr=b.mr.addr + 100, rkey=b.mr.rkey))
    wc = one(a.cq)
    assert (wc.wr_id, wc.status, wc.opcode) == (2, IBV_WC_SUCCESS, "RDMA_READ")
    assert a.mr.read(len(data), 4 * MiB) == data

    # WRITE with immediate consumes a receive on b and completes there with the immediate
    b.qp.post_recv(RecvWR(wr_id=70, sg_list=[b.mr.sge(0, 64)]))
    a.qp.post_send(SendWR(IBV_WR_RDMA_WRITE_WITH_IMM, wr_id=3, sg_list=[a.mr.sge(0, 5000)],
                          remote_addr=b.mr.addr + 6 * MiB, rkey=b.mr.rkey, imm_data=0xDEADBEEF))
    assert one(a.cq).status == IBV_WC_SUCCESS
    wc = one(b.cq)
    assert (wc.wr_id, wc.opcode, wc.imm_data, wc.byte_len) == (70, "RECV_RDMA_WITH_IMM", 0xDEADBEEF, 5000)
    assert b.mr.read(5000, 6 * MiB) == data[:5000]

    # SEND (multi-packet), SEND with immediate, inline SEND, a gathered SEND
    recv_at = [i * 100_000 for i in range(4)]
    b.qp.post_recv([RecvWR(wr_id=80 + i, sg_list=[b.mr.sge(off, 100_000)]) for i, off in enumerate(recv_at)])
    a.mr.write(b"head-", 7 * MiB)
    a.mr.write(b"-tail", 7 * MiB + 4096)
    a.qp.post_send([
        SendWR(IBV_WR_SEND, wr_id=4, sg_list=[a.mr.sge(0, 70_000)]),
        SendWR(IBV_WR_SEND_WITH_IMM, wr_id=5, sg_list=[a.mr.sge(1, 3)], imm_data=42),
        SendWR(IBV_WR_SEND, wr_id=6, send_flags=IBV_SEND_SIGNALED | IBV_SEND_INLINE,
               inline_data=b"inline!"),
        SendWR(IBV_WR_SEND, wr_id=7, sg_list=[a.mr.sge(7 * MiB, 5), a.mr.sge(7 * MiB + 4096, 5)]),
    ])
    assert [w.wr_id for w in a.cq.wait(4)] == [4, 5, 6, 7]          # posting order
    got = b.cq.wait(4)
    assert [(w.wr_id, w.opcode, w.byte_len) for w in got] == [
        (80, "RECV", 70_000), (81, "RECV", 3), (82, "RECV", 7), (83, "RECV", 10)]
    assert got[1].imm_data == 42 and got[0].imm_data is None
    assert b.mr.read(70_000, 0) == data[:70_000]
    assert b.mr.read(3, recv_at[1]) == data[1:4]
    assert b.mr.read(7, recv_at[2]) == b"inline!"
    assert b.mr.read(10, recv_at[3]) == b"head--tail"

    # atomics on an aligned word of b, the original value lands in a's buffer
    b.mr.buf[4096:4104] = (1000).to_bytes(8, "little")
    a.qp.post_send(SendWR(IBV_WR_ATOMIC_FETCH_AND_ADD, wr_id=8, sg_list=[a.mr.sge(64, 8)],
                          remote_addr=b.mr.addr + 4096, rkey=b.mr.rkey, compare_add=24))
    a.qp.post_send(SendWR(IBV_WR_ATOMIC_CMP_AND_SWP, wr_id=9, sg_list=[a.mr.sge(72, 8)],
                          remote_addr=b.mr.addr + 4096, rkey=b.mr.rkey, compare_add=1024, swap=7))
    a.qp.post_send(SendWR(IBV_WR_ATOMIC_CMP_AND_SWP, wr_id=10, sg_list=[a.mr.sge(80, 8)],
                          remote_addr=b.mr.addr + 4096, rkey=b.mr.rkey, compare_add=1024, swap=9))
    wcs = a.cq.wait(3)
    assert [(w.wr_id, w.opcode, w.status) for w in wcs] == [
        (8, "FETCH_ADD", 0), (9, "COMP_SWAP", 0), (10, "COMP_SWAP", 0)]
    orig = [int.from_bytes(a.mr.read(8, o), "little") for o in (64, 72, 80)]
    assert orig == [1000, 1024, 7]                   # the last compare failed: no swap
    assert int.from_bytes(b.mr.read(8, 4096), "little") == 7
    st = a.qp.query()
    assert st["state"] == "RTS" and st["retransmitted_packets"] == 0 and st["acks_received"] > 0


def test_atomic_results_land_at_any_local_alignment(pair):
    """Only the remote address of an atomic must be 8-byte aligned (HDR-10); its local result
    buffer may sit anywhere, across a 64 KiB chunk edge of the region too (5 + 3 and 1 + 7
    bytes), and the bytes around it stay as they were (test_control_fuzz found LOC_PROT_ERR
    at an odd offset)."""
    a, b = ends(pair, mr_bytes=1 * MiB)
    first = 0x0102030405060708
    b.mr.buf[0:8] = first.to_bytes(8, "little")
    edge = 64 * 1024
    spots = (3, 1001, edge - 5, 2 * edge - 1, edge + 45)    # windows of 32 bytes apart
    pattern = bytes((i * 37 + 11) & 0xFF for i in range(32))
    for off in spots:                             # 32 known bytes around each result
        a.mr.write(pattern, off - 12 if off >= 12 else 0)
    for i, off in enumerate(spots):
        a.qp.post_send(SendWR(IBV_WR_ATOMIC_FETCH_AND_ADD, wr_id=i, sg_list=[a.mr.sge(off, 8)],
                              remote_addr=b.mr.addr, rkey=b.mr.rkey, compare_add=1))
    wcs = a.cq.wait(len(spots))
    assert [(w.wr_id, w.status) for w in wcs] == [(i, IBV_WC_SUCCESS) for i in range(len(spots))]
    for i, off in enumerate(spots):
        base = off - 12 if off >= 12 else 0
        want = bytearray(pattern)
        want[off - base:off - base + 8] = (first + i).to_bytes(8, "little")
        assert a.mr.read(32, base) == bytes(want), off
    assert int.from_bytes(b.mr.read(8, 0), "little") == first + len(spots)


def test_unsignaled_writes_complete_silently_then_a_signaled_one(pair):
    a, b = ends(pair, MiB)
    a.mr.write(b"x" * 4096)
    a.qp.post_send([SendWR(IBV_WR_RDMA_WRITE, wr_id=i, send_flags=0, sg_list=[a.mr.sge(0, 4096)],
                           remote_addr=b.mr.addr + i * 4096, rkey=b.mr.rkey) for i in range(8)])
    a.qp.post_send(SendWR(IBV_WR_RDMA_WRITE, wr_id=99, sg_list=[a.mr.sge(0, 4096)],
                          remote_addr=b.mr.addr, rkey=b.mr.rkey))
    assert [w.wr_id for w in a.cq.wait(1)] == [99]
    assert a.cq.poll(10) == []
    assert b.mr.read(8 * 4096) == b"x" * 8 * 4096


def test_rnr_is_retried_until_a_receive_is_posted(pair):
    """RESP-6: no receive yet: RNR NAK, the requester waits the timer and resends."""
    a, b = ends(pair, MiB, min_rnr_timer=1, rnr_retry=7)
    a.mr.write(b"late receive")
    a.qp.post_send(SendWR(IBV_WR_SEND, wr_id=1, sg_list=[a.mr.sge(0, 12)]))
    import time
    time.sleep(0.05)
    assert a.cq.poll() == []
    b.qp.post_recv(RecvWR(wr_id=2, sg_list=[b.mr.sge(0, 64)]))
    assert one(a.cq).status == IBV_WC_SUCCESS
    assert one(b.cq).byte_len == 12 and b.mr.read(12) == b"late receive"
    assert a.qp.query()["rnr_nak_received"] >= 1


def test_rnr_retry_exceeded_then_flush(pair):
    a, b = ends(pair, MiB, min_rnr_timer=1, rnr_retry=1)
    a.qp.post_send([SendWR(IBV_WR_SEND, wr_id=1, sg_list=[a.mr.sge(0, 8)]),
                    SendWR(IBV_WR_SEND, wr_id=2, sg_list=[a.mr.sge(0, 8)])])
    wcs = a.cq.wait(2)
    assert [(w.wr_id, w.status) for w in wcs] == [(1, IBV_WC_RNR_RETRY_EXC_ERR), (2, IBV_WC_WR_FLUSH_ERR)]
    assert a.qp.query()["state"] == "ERR"


def test_remote_access_error_moves_both_to_err(pair):
    """RESP-5 / ERR-1: a bad rkey gets NAK 0x62; the WQE completes REM_ACCESS_ERR, the next is
    flushed; the responder's QP is in ERR and nothing was written."""
    a, b = ends(pair, MiB)
    a.qp.post_send([SendWR(IBV_WR_RDMA_WRITE, wr_id=1, sg_list=[a.mr.sge(0, 64)],
                           remote_addr=b.mr.addr, rkey=b.mr.rkey ^ 0x5A5A),
                    SendWR(IBV_WR_RDMA_WRITE, wr_id=2, sg_list=[a.mr.sge(0, 64)],
                           remote_addr=b.mr.addr, rkey=b.mr.rkey)])
    wcs = a.cq.wait(2)
    assert [(w.wr_id, w.status) for w in wcs] == [(1, IBV_WC_REM_ACCESS_ERR), (2, IBV_WC_WR_FLUSH_ERR)]
    assert b.qp.query()["state"] == "ERR" and a.qp.query()["state"] == "ERR"
    assert b.mr.read(64) == bytes(64)
    with pytest.raises(MetaroceError, match="post_send needs RTS"):
        a.qp.post_send(SendWR(IBV_WR_SEND, sg_list=[a.mr.sge(0, 8)]))


def test_bad_arguments_get_one_clear_error(pair):
    a, b = ends(pair, 65536)
    cases = [
        (SendWR("NOT_AN_OPCODE"), "unknown work request opcode"),
        (SendWR(IBV_WR_RDMA_WRITE, sg_list=[[a.mr.addr, 65537, a.mr.lkey]], rkey=1), "outside lkey"),
        (SendWR(IBV_WR_RDMA_WRITE, sg_list=[[a.mr.addr, 8, 12345]], rkey=1), "not a region"),
        (SendWR(IBV_WR_ATOMIC_FETCH_AND_ADD, sg_list=[a.mr.sge(0, 8)], remote_addr=b.mr.addr + 4,
                rkey=b.mr.rkey), "8-byte aligned"),
        (SendWR(IBV_WR_ATOMIC_FETCH_AND_ADD, sg_list=[a.mr.sge(0, 16)], remote_addr=b.mr.addr,
                rkey=b.mr.rkey), "8 bytes"),
    ]
    for wr, msg in cases:
        with pytest.raises(MetaroceError, match=msg):
            a.qp.post_send(wr)
    with pytest.raises(MetaroceError, match="existing buffer"):
        MR.from_buffer(a.pd, bytearray(10), IBV_ACCESS_LOCAL_WRITE)
    with pytest.raises(MetaroceError, match="positive|length"):
        MR(a.pd, 0, IBV_ACCESS_LOCAL_WRITE)
    assert a.qp.query()["state"] == "RTS"           # refused requests leave the QP usable


def test_an_application_cannot_use_another_applications_memory(pair):
    view, c1, _ = pair
    other = Context("eth0", view.plan.node("h1").netns)
    try:
        a, b = ends(pair, 65536)
        pd = PD(other)
        with pytest.raises(MetaroceError, match="not a region of this QP's PD"):
            a.qp.post_send(SendWR(IBV_WR_SEND, sg_list=[[0, 8, MR(pd, 4096, 1).lkey]]))
        with pytest.raises(MetaroceError, match="no memory region"):
            other.request("dereg_mr", key=a.mr.lkey)
        with pytest.raises(MetaroceError, match="no QP"):
            other.request("query_qp", qpn=a.qp.qp_num)
    finally:
        other.close()
    # the closed application's resources are reclaimed; ours still work
    a.mr.write(b"still fine")
    a.qp.post_send(SendWR(IBV_WR_RDMA_WRITE, wr_id=5, sg_list=[a.mr.sge(0, 10)],
                          remote_addr=b.mr.addr, rkey=b.mr.rkey))
    assert one(a.cq).status == IBV_WC_SUCCESS and b.mr.read(10) == b"still fine"
