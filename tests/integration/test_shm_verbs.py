"""The data path of the verbs API is shared memory (issue 19), on a lab pair:

- signalled posts and polls make no socket system call (counted by a BCC program on the
  sys_enter raw tracepoint for this process): the control socket carries control verbs only;
- completion channels: CQ.wait sleeps on its channel (no CPU burned while nothing comes) and
  wakes when the completion arrives; a CompChannel shared by two CQs reports which one fired;
  req_notify(solicited_only=True) fires for a SEND with IBV_SEND_SOLICITED (the SE bit, carried
  by the NIC's receive event) and not for one without;
- a receive posted just before the peer's SEND is seen by the NIC at once (it reads the
  receive ring itself): no RNR, no retransmission.
"""

import os
import threading
import time

import pytest
from verbs_util import End, connect, daemons, ip_of, lab_pair

from metaroce.lab import core
from metaroce.syscount import SOCKET, WAITS, SyscallCounter
from metaroce.verbs import (CQ, MR, PD, QP, IBV_SEND_SIGNALED, IBV_SEND_SOLICITED, IBV_WC_SUCCESS,
                            IBV_WR_RDMA_WRITE, IBV_WR_SEND, CompChannel, Context, QPInitAttr,
                            RecvWR, SendWR)

@pytest.fixture(scope="module")
def lab(module_lab_name):
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


def pair(lab, **attr):
    view, c1, c2 = lab
    a, b = End(c1, 1 << 20), End(c2, 1 << 20)
    connect(a, b, ip_of(view, "h1"), ip_of(view, "h2"), **attr)
    return a, b


def test_posting_and_polling_make_no_socket_system_call(lab):
    a, b = pair(lab)
    wr = SendWR(IBV_WR_RDMA_WRITE, wr_id=1, sg_list=[a.mr.sge(0, 64)], remote_addr=b.mr.addr,
                rkey=b.mr.rkey)
    tracer = SyscallCounter(os.getpid())
    try:
        for _ in range(20):                         # warm up
            a.qp.post_send(wr)
            while not a.cq.poll():
                pass
        tracer.clear()
        for _ in range(500):
            a.qp.post_send(wr)
            while not (wcs := a.cq.poll()):
                pass
            assert wcs[0].status == IBV_WC_SUCCESS
        seen = tracer.by_name()
    finally:
        tracer.close()
    socket_calls = {k: v for k, v in seen.items() if k in SOCKET | WAITS}
    assert socket_calls == {}, socket_calls
    # what remains is the doorbell (an eventfd write) when the daemon had gone to sleep
    assert sum(seen.values()) <= 500 + 10, seen


def test_cq_wait_sleeps_on_its_channel_until_the_completion(lab):
    a, b = pair(lab)
    got = []

    def later():
        time.sleep(0.5)
        a.qp.post_send(SendWR(IBV_WR_RDMA_WRITE, wr_id=5, sg_list=[a.mr.sge(0, 64)],
                              remote_addr=b.mr.addr, rkey=b.mr.rkey))

    t = threading.Thread(target=later)
    cpu0, t0 = time.process_time(), time.monotonic()
    t.start()
    got = a.cq.wait(1, timeout_s=10)
    waited, cpu = time.monotonic() - t0, time.process_time() - cpu0
    t.join()
    assert [(w.wr_id, w.status) for w in got] == [(5, IBV_WC_SUCCESS)]
    assert waited >= 0.45
    assert cpu < 0.25 * waited, (cpu, waited)      # it slept, it did not spin


def test_a_shared_channel_reports_which_cq_fired_and_solicited_only_waits_for_se(lab):
    view, c1, c2 = lab
    chan = CompChannel(c2)
    scq, rcq = CQ(c2, 64, channel=chan), CQ(c2, 64, channel=chan)
    pd = PD(c2)
    mr = MR(pd, 1 << 20, 15)
    qp = QP(pd, QPInitAttr(scq, rcq))
    peer = End(c1, 1 << 20)
    qp.connect({"qpn": peer.qp.qp_num, "psn": peer.qp.psn, "ip": ip_of(view, "h1")})
    peer.qp.connect({"qpn": qp.qp_num, "psn": qp.psn, "ip": ip_of(view, "h2")})

    # a WRITE completes on the send CQ: the channel says so
    scq.req_notify()
    rcq.req_notify()
    qp.post_send(SendWR(IBV_WR_RDMA_WRITE, wr_id=1, sg_list=[mr.sge(0, 64)],
                        remote_addr=peer.mr.addr, rkey=peer.mr.rkey))
    assert chan.get_cq_event(timeout_s=10) is scq
    assert [w.wr_id for w in scq.poll(4)] == [1]
    assert chan.get_cq_event(timeout_s=0.2) is None          # the receive CQ did not fire

    # solicited-only: a plain SEND completes a receive without an event, one with SE fires
    qp.post_recv([RecvWR(wr_id=10 + i, sg_list=[mr.sge(4096 * i, 4096)]) for i in range(2)])
    rcq.req_notify(solicited_only=True)
    peer.qp.post_send(SendWR(IBV_WR_SEND, wr_id=2, sg_list=[peer.mr.sge(0, 64)]))
    assert peer.cq.wait(1)[0].status == IBV_WC_SUCCESS
    assert chan.get_cq_event(timeout_s=0.3) is None
    assert [w.wr_id for w in rcq.poll(4)] == [10]
    peer.qp.post_send(SendWR(IBV_WR_SEND, wr_id=3, sg_list=[peer.mr.sge(0, 64)],
                             send_flags=IBV_SEND_SIGNALED | IBV_SEND_SOLICITED))
    assert chan.get_cq_event(timeout_s=10) is rcq
    assert [w.wr_id for w in rcq.poll(4)] == [11]
    for x in (qp, peer.qp):
        x.close()
    for c in (scq, rcq):
        c.close()
    chan.close()


def test_a_receive_posted_just_before_the_send_needs_no_retry(lab):
    """The NIC's program takes receive WQEs from the ring the application writes: one posted
    the moment before the peer sends is there (an RNR NAK and its retry would show in the
    counters)."""
    a, b = pair(lab, min_rnr_timer=1, rnr_retry=0)
    for i in range(200):
        b.qp.post_recv(RecvWR(wr_id=i, sg_list=[b.mr.sge(0, 64)]))
        a.qp.post_send(SendWR(IBV_WR_SEND, wr_id=i, sg_list=[a.mr.sge(0, 64)]))
        assert (a.cq.wait(1)[0].status, b.cq.wait(1)[0].wr_id) == (IBV_WC_SUCCESS, i)
    q = a.qp.query()
    assert q["rnr_nak_received"] == 0 and q["retransmitted_packets"] == 0, q
