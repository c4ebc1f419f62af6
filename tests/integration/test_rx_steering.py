"""Receive steering (issue 21 item 3; metaroce/nic/steer.py): on a device with several
receive queues, or with `--rx-cpus`, the device runs nic_steer, which hands each RoCE frame
through a cpumap to the CPU of its destination QP, where nic_rx_cpu (the NIC program built for
a cpumap) checks, places and answers it. Real lab, real daemons, data verified byte for byte;
the per-CPU counters show where the program ran."""

import os

import pytest
from verbs_util import End, connect, daemons, ip_of

from metaroce.lab import core
from metaroce.nic import daemon as d
from metaroce.verbs import (IBV_WC_SUCCESS, IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_WR_RDMA_READ,
                            IBV_WR_RDMA_WRITE, IBV_WR_SEND_WITH_IMM, Context, RecvWR, SendWR)

MiB = 1 << 20
pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2,
                                reason="receive steering needs two CPUs to steer between")


def status(view, host):
    return d.request(d.DeviceId("eth0", view.plan.node(host).netns), {"op": "status"})[0]


def ok(wcs, ids):
    assert [(w.wr_id, w.status) for w in wcs] == [(i, IBV_WC_SUCCESS) for i in ids], wcs


def pin_to_cpu0(dev):
    """Every thread of dev's daemon (its engine thread sends) onto CPU 0."""
    pid = d.running_pid(dev)
    for tid in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(tid), {0})


def run_ops(view, mode):
    """WRITE + READ back 3 MiB, a SEND with immediate, a fetch-and-add; every byte checked.
    Returns h2's QP number (the responder's)."""
    c1 = Context("eth0", view.plan.node("h1").netns)
    c2 = Context("eth0", view.plan.node("h2").netns)
    try:
        a, b = End(c1, 8 * MiB), End(c2, 8 * MiB)
        connect(a, b, ip_of(view, "h1"), ip_of(view, "h2"), mode=mode)
        data = os.urandom(3 * MiB + 517)
        a.mr.write(data)
        a.qp.post_send([SendWR(IBV_WR_RDMA_WRITE, wr_id=1, sg_list=[a.mr.sge(0, len(data))],
                               remote_addr=b.mr.addr + 100, rkey=b.mr.rkey),
                        SendWR(IBV_WR_RDMA_READ, wr_id=2, sg_list=[a.mr.sge(4 * MiB, len(data))],
                               remote_addr=b.mr.addr + 100, rkey=b.mr.rkey)])
        ok(a.cq.wait(2, timeout_s=30), [1, 2])
        assert b.mr.read(len(data), 100) == data and a.mr.read(len(data), 4 * MiB) == data
        b.qp.post_recv([RecvWR(wr_id=10, sg_list=[b.mr.sge(7 * MiB, 65536)])])
        a.qp.post_send(SendWR(IBV_WR_SEND_WITH_IMM, wr_id=20, imm_data=0xCAFE,
                              sg_list=[a.mr.sge(0, 65536)]))
        ok(a.cq.wait(1), [20])
        r = b.cq.wait(1)
        assert [(w.wr_id, w.status, w.byte_len, w.imm_data) for w in r] == \
            [(10, 0, 65536, 0xCAFE)]
        assert b.mr.read(65536, 7 * MiB) == data[:65536]
        word = 7 * MiB + 65536
        b.mr.write((100).to_bytes(8, "little"), word)
        a.qp.post_send(SendWR(IBV_WR_ATOMIC_FETCH_AND_ADD, wr_id=30, compare_add=5,
                              sg_list=[a.mr.sge(8, 8)], remote_addr=b.mr.addr + word,
                              rkey=b.mr.rkey))
        ok(a.cq.wait(1), [30])
        assert a.mr.read(8, 8) == (100).to_bytes(8, "little")
        assert b.mr.read(8, word) == (105).to_bytes(8, "little")
        q = b.qp.query()
        return b.qp.qp_num, q
    finally:
        c1.close()
        c2.close()


def test_two_queues_steer_by_qp_and_every_operation_is_correct(lab_name):
    """Two queues per veth: a frame forwarded in XDP lands on the queue of the CPU that
    forwarded it, so without steering a QP's frames could be received on two CPUs at once;
    `--rx-cpus auto` (the default) steers such a device, and the QP's CPU does all its work."""
    core.up(lab_name, "pair", queues=2)
    view = core.LabView(lab_name)
    try:
        with daemons(view, mode="metaroce"):
            qpn, q = run_ops(view, "metaroce")
            assert q["mode"] == "metaroce"
            st = status(view, "h2")
            steer = st["rx_steering"]
            assert isinstance(steer, dict), steer
            cpu = q["rx_cpu"]
            assert cpu in steer["cpus"]
            per_cpu = steer["rcv_packets_per_cpu"]
            # every RoCE frame was handled by the NIC program on a steering CPU, and this
            # lab's one QP's frames (all but a few before it existed) on its own CPU
            assert sum(per_cpu) == st["port"]["rcv_packets"] > 3000
            assert per_cpu[cpu] >= sum(per_cpu) - 10, per_cpu
            assert sum(steer["rcv_steered_per_cpu"]) == st["port"]["rcv_steered"] >= \
                st["port"]["rcv_packets"]
            assert st["counters"]["bad_icrc"] == 0 and st["counters"]["malformed"] == 0
    finally:
        core.down(lab_name)


def test_one_queue_is_not_steered_unless_asked_and_compat_order_survives(lab_name):
    """One queue: auto leaves steering off (one NAPI context already serialises a QP). With
    --rx-cpus 1 every frame goes to CPU 1 whatever CPU it arrived on, and a RoCEv2 QP's frames
    keep their order through the hand-over (go-back-N would NAK a gap: no out-of-sequence
    request at the responder)."""
    core.up(lab_name, "pair")
    view = core.LabView(lab_name)
    try:
        with daemons(view, mode="roce"):
            st = status(view, "h1")
            assert st["rx_steering"] == "off"
            plain = st["bpf_build"]["verified_insns"]
        with daemons(view, mode="roce", rx_cpus="1") as devs:
            # nic_rx_cpu is nic_rx with one redirect after every path has returned: the
            # verifier's walk of it must not grow (the budget is 1,000,000, and nearly used)
            build = status(view, "h1")["bpf_build"]
            assert plain and build["verified_insns"] <= plain + 1000 <= build["verifier_budget"]
            pin_to_cpu0(devs[0])          # h1 sends from CPU 0: its frames reach h2 there
            qpn, q = run_ops(view, "roce")
            assert q["rx_cpu"] == 1
            steered = status(view, "h2")["rx_steering"]["rcv_steered_per_cpu"]
            assert steered[0] > 1000, steered     # arrived on CPU 0, handled on CPU 1 (below)
            for host in ("h1", "h2"):
                st = status(view, host)
                per_cpu = st["rx_steering"]["rcv_packets_per_cpu"]
                assert per_cpu[1] == sum(per_cpu) == st["port"]["rcv_packets"] > 0, per_cpu
                assert st["rx_steering"]["cpus"] == [1]
            assert q["out_of_sequence"] == 0 and q["packet_seq_err"] == 0, q
            assert status(view, "h2")["counters"]["psn_out_of_order"] == 0
    finally:
        core.down(lab_name)


def test_bad_rx_cpus_is_one_clear_error(lab_name):
    core.up(lab_name, "pair")
    view = core.LabView(lab_name)
    dev = d.DeviceId("eth0", view.plan.node("h1").netns)
    try:
        for bad, why in (("9999", "not one this process may run on"), ("x", "must be auto"),
                         ("3-1", "must be auto")):
            with pytest.raises(Exception, match=why):
                d.start_background(dev, "metaroce", rx_cpus=bad)
            assert d.running_pid(dev) is None
    finally:
        core.down(lab_name)
