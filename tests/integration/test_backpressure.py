"""One application cannot stall a device for everyone (issue 18, section 4), on a real pair lab
(daemons on h1 and h2):

- an application on h2 that stops reading its control socket while it keeps posting WRITEs into
  its send queue and sending requests (their replies pile up unread; its CQ, never polled,
  overruns) is cut off once the daemon holds more than
  MAX_OUTPUT_BYTES for it: its QP, CQ and MRs are reclaimed, its peer sees what it sees when an
  application dies, the daemon lives; meanwhile another application pair on the same two
  devices moves 256 MiB by WRITE and reads it back by READ (SHA-256 compared) in about the
  time it takes alone;
- CQ overrun as in verbs: a CQ polled as completions come never overruns, however many more
  than its cqe pass through it (including an application that only polls: the daemon reads its
  consumer index in the shared ring); a CQ left unpolled overruns at cqe: IBV_EVENT_CQ_ERR and
  IBV_EVENT_QP_FATAL, its QP in ERR (the responder drops requests too), nothing queued beyond
  cqe, poll raises.
"""

import hashlib
import json
import os
import select
import subprocess
import sys
import time

import pytest
from verbs_util import ALL_ACCESS, End, connect, daemons, ip_of, lab_pair

from metaroce.errors import MetaroceError
from metaroce.lab import core
from metaroce.nic import daemon as d
from metaroce.nic.clients import MAX_OUTPUT_BYTES
from metaroce.verbs import (CQ, MR, PD, QP, IBV_EVENT_CQ_ERR, IBV_EVENT_QP_FATAL,
                            IBV_WC_RETRY_EXC_ERR, IBV_WC_SUCCESS, IBV_WR_RDMA_READ,
                            IBV_WR_RDMA_WRITE, IBV_WR_SEND, Context, QPCap, QPInitAttr, RecvWR,
                            SendWR)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, HERE])}
STUCK_APP = os.path.join(HERE, "stuck_app.py")
MiB = 1 << 20
SIZE = 256 * MiB


@pytest.fixture(scope="module")
def lab(module_lab_name):
    view = lab_pair(module_lab_name)
    try:
        with daemons(view) as devs:
            c1 = Context("eth0", view.plan.node("h1").netns)
            c2 = Context("eth0", view.plan.node("h2").netns)
            yield view, c1, c2, devs
            c1.close()
            c2.close()
    finally:
        core.down(module_lab_name)


def _status(dev) -> dict:
    return d.request(dev, {"op": "status"})[0]


def _readline(proc, timeout_s: float) -> str:
    r, _, _ = select.select([proc.stdout], [], [], timeout_s)
    assert r, "the application said nothing in time"
    return proc.stdout.readline().strip()


def _write_and_read_back(a: End, b: End, data: bytes, timeout_s: float, started=None) -> float:
    """a WRITEs data into b's region, READs it back into its own second half; both copies are
    compared by SHA-256. Returns the seconds it took."""
    t0 = time.monotonic()
    a.qp.post_send(SendWR(IBV_WR_RDMA_WRITE, wr_id=1, sg_list=[a.mr.sge(0, SIZE)],
                          remote_addr=b.mr.addr, rkey=b.mr.rkey))
    if started is not None:
        started()
    assert [(w.wr_id, w.status) for w in a.cq.wait(1, timeout_s=timeout_s)] == [(1, 0)]
    a.qp.post_send(SendWR(IBV_WR_RDMA_READ, wr_id=2, sg_list=[a.mr.sge(SIZE, SIZE)],
                          remote_addr=b.mr.addr, rkey=b.mr.rkey))
    assert [(w.wr_id, w.status) for w in a.cq.wait(1, timeout_s=timeout_s)] == [(2, 0)]
    took = time.monotonic() - t0
    want = hashlib.sha256(data).digest()
    assert hashlib.sha256(b.mr.read(SIZE)).digest() == want
    assert hashlib.sha256(a.mr.read(SIZE, SIZE)).digest() == want
    return took


def test_an_application_that_stops_reading_is_cut_off_and_others_go_on(lab):
    view, c1, c2, (dev1, dev2) = lab
    ip1, ip2 = ip_of(view, "h1"), ip_of(view, "h2")
    a, b = End(c2, 2 * SIZE), End(c1, SIZE)          # the working pair: h2 moves the data
    connect(a, b, ip2, ip1)
    data = os.urandom(SIZE)
    a.mr.write(data)
    alone = _write_and_read_back(a, b, data, timeout_s=120)

    st0 = _status(dev2)
    pid, mrs0 = st0["pid"], st0["mrs"]
    peer = End(c1, MiB)                                # the stuck application's peer on h1
    app = subprocess.Popen([sys.executable, STUCK_APP, "eth0", view.plan.node("h2").netns],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        attrs = json.loads(_readline(app, 30))
        peer.qp.connect({"qpn": attrs["qpn"], "psn": attrs["psn"], "ip": ip2}, timeout=14,
                        retry_cnt=3)
        app.stdin.write(json.dumps({"qpn": peer.qp.qp_num, "psn": peer.qp.psn, "ip": ip1,
                                    "rkey": peer.mr.rkey, "addr": peer.mr.addr}) + "\n")
        app.stdin.flush()
        assert _readline(app, 30) == "ready"
        st = _status(dev2)
        assert attrs["qpn"] in {q["qpn"] for q in st["qps"]} and st["mrs"] == mrs0 + 1

        def unleash():                   # once the pair's WRITE is under way
            app.stdin.write("go\n")
            app.stdin.flush()

        b.mr.write(bytes(SIZE))
        a.mr.write(bytes(SIZE), SIZE)
        took = _write_and_read_back(a, b, data, timeout_s=max(60.0, 10 * alone), started=unleash)
        said = _readline(app, 30)
        assert said.startswith("cut off"), said
        assert app.poll() is None                      # the daemon cut it, it did not exit
        # reclaimed: the daemon lives (same pid) and holds nothing of it any more
        st = _status(dev2)
        assert st["pid"] == pid and d.running_pid(dev2) == pid
        assert st["clients"]["cut_off"] == st0["clients"]["cut_off"] + 1
        assert st["clients"]["max_output_bytes"] == MAX_OUTPUT_BYTES
        assert attrs["qpn"] not in {q["qpn"] for q in st["qps"]}
        assert st["mrs"] == mrs0
        assert len(st["cqs"]) == len(st0["cqs"])
        log = open(dev2.log_path).read()
        assert f"application pid {app.pid} cut off: more than" in log, log
        # its peer sees what it sees when an application dies
        peer.qp.post_send(SendWR(IBV_WR_RDMA_WRITE, wr_id=5, sg_list=[peer.mr.sge(0, 64)],
                                 remote_addr=attrs["addr"], rkey=attrs["rkey"]))
        assert peer.cq.wait(1, timeout_s=10)[0].status == IBV_WC_RETRY_EXC_ERR
        # and the pair did not wait on it: about the time it takes alone (the stuck
        # application's flood of WRITEs shares the device and the two vCPUs until it is cut
        # off, a few seconds); before, the pair never finished
        assert took < 3 * alone + 10, (took, alone)
        print(f"256 MiB WRITE + READ back: {alone:.2f} s alone, {took:.2f} s with the stuck "
              f"application ({said})")
    finally:
        if app.poll() is None:
            app.kill()
        app.wait()
    for e in (a, b, peer):
        e.qp.close()
        e.mr.close()


def _qp(ctx: Context, send_cq: CQ, recv_cq: CQ, mr_bytes: int = MiB, **cap):
    pd = PD(ctx)
    mr = MR(pd, mr_bytes, ALL_ACCESS)
    return pd, mr, QP(pd, QPInitAttr(send_cq, recv_cq, QPCap(**cap)))


def _connect(x: QP, y: QP, ip_x: str, ip_y: str, **attr) -> None:
    x.connect({"qpn": y.qp_num, "psn": y.psn, "ip": ip_y}, **attr)
    y.connect({"qpn": x.qp_num, "psn": x.psn, "ip": ip_x}, **attr)


def test_cq_overrun_as_in_verbs(lab):
    view, c1, c2, (dev1, dev2) = lab
    ip1, ip2 = ip_of(view, "h1"), ip_of(view, "h2")
    far_cq = CQ(c1)

    # polled as the completions come: 64 rounds of 16 WRITEs through a 16-entry CQ
    cq = CQ(c2, 16)
    assert cq.cqe >= 16
    _, mr, qp = _qp(c2, cq, cq)
    _, far_mr, far_qp = _qp(c1, far_cq, far_cq)
    _connect(qp, far_qp, ip2, ip1)
    for r in range(64):
        qp.post_send([SendWR(IBV_WR_RDMA_WRITE, wr_id=r << 8 | i, sg_list=[mr.sge(i * 4096, 4096)],
                             remote_addr=far_mr.addr + i * 4096, rkey=far_mr.rkey)
                      for i in range(16)])
        for i in range(16):
            w = cq.wait(1)[0]
            assert (w.wr_id, w.status) == (r << 8 | i, IBV_WC_SUCCESS)
    assert qp.query()["state"] == "RTS"

    # an application that only polls (it makes no request at all): 256 receives
    # completed one at a time through a 16-entry CQ
    rcq = CQ(c2, 16)
    _, rmr, rqp = _qp(c2, cq, rcq, max_recv_wr=256)
    _, smr, sqp = _qp(c1, far_cq, far_cq)
    _connect(rqp, sqp, ip2, ip1)
    rqp.post_recv([RecvWR(wr_id=i, sg_list=[rmr.sge(i * 64, 64)]) for i in range(256)])
    for i in range(256):
        sqp.post_send(SendWR(IBV_WR_SEND, wr_id=i, sg_list=[smr.sge(0, 64)]))
        assert far_cq.wait(1)[0].status == IBV_WC_SUCCESS
        w = rcq.wait(1)[0]
        assert (w.wr_id, w.status) == (i, IBV_WC_SUCCESS)
    assert rqp.query()["state"] == "RTS" and qp.query()["state"] == "RTS"
    assert c2.get_async_event(timeout_s=0) is None
    mine = {c["cq"]: c for c in _status(dev2)["cqs"]}
    assert mine[rcq.handle]["produced"] == 256 and mine[rcq.handle]["state"] == "OK"
    assert mine[cq.handle]["produced"] == 64 * 16 and mine[cq.handle]["state"] == "OK"

    # never polled: 64 signaled WRITEs into a 16-entry CQ overrun it
    ocq = CQ(c2, 16)
    _, omr, oqp = _qp(c2, ocq, ocq)
    _, far2_mr, far2_qp = _qp(c1, far_cq, far_cq)
    _connect(oqp, far2_qp, ip2, ip1, timeout=14, retry_cnt=3)
    qp_error0 = _status(dev2)["counters"]["qp_error"]
    oqp.post_send([SendWR(IBV_WR_RDMA_WRITE, wr_id=i, sg_list=[omr.sge(i * 4096, 4096)],
                          remote_addr=far2_mr.addr + i * 4096, rkey=far2_mr.rkey)
                   for i in range(64)])
    ev = c2.get_async_event(timeout_s=10)
    assert (ev.event_type, ev.cq) == (IBV_EVENT_CQ_ERR, ocq.handle), ev
    ev = c2.get_async_event(timeout_s=10)
    assert (ev.event_type, ev.qp_num) == (IBV_EVENT_QP_FATAL, oqp.qp_num), ev
    assert oqp.query()["state"] == "ERR"
    with pytest.raises(MetaroceError, match=f"CQ {ocq.handle} overran"):
        ocq.poll()
    with pytest.raises(MetaroceError, match="overran"):
        ocq.wait(1)
    st = {c["cq"]: c for c in _status(dev2)["cqs"]}[ocq.handle]
    assert st["state"] == "ERR" and st["produced"] == ocq.cqe and st["consumed"] == 0, st
    assert st["dropped"] > 0, st                       # nothing queued beyond cqe
    # the QP's responder is in ERR too: a WRITE to it is dropped, never acknowledged
    far2_qp.post_send(SendWR(IBV_WR_RDMA_WRITE, wr_id=9, sg_list=[far2_mr.sge(0, 64)],
                             remote_addr=omr.addr, rkey=omr.rkey))
    assert far_cq.wait(1, timeout_s=10)[0].status == IBV_WC_RETRY_EXC_ERR
    assert _status(dev2)["counters"]["qp_error"] > qp_error0
    # the other CQs and QPs of the application are unaffected
    assert qp.query()["state"] == "RTS" and rqp.query()["state"] == "RTS"
    qp.post_send(SendWR(IBV_WR_RDMA_WRITE, wr_id=7, sg_list=[mr.sge(0, 4096)],
                        remote_addr=far_mr.addr, rkey=far_mr.rkey))
    assert [(w.wr_id, w.status) for w in cq.wait(1)] == [(7, IBV_WC_SUCCESS)]
    for q in (qp, far_qp, rqp, sqp, oqp, far2_qp):
        q.close()
