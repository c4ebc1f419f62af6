"""An application that writes anything into its own shared-memory queues (issue 19): random
WQEs, impossible and backwards producer indices, a thread rewriting its send ring while it posts,
another application's lkey, random receive slots and indices the NIC's program reads, a CQ
consumer index past the producer (tests/integration/hostile_app.py). Only its QPs end in ERR,
with error completions (or, for the CQ, IBV_EVENT_CQ_ERR); the daemon lives; another
application on the same device moves 64 MiB by WRITE and reads it back by READ meanwhile,
verified, and sees no error at all."""

import hashlib
import json
import os
import select
import subprocess
import sys
import time

import pytest
from verbs_util import ALL_ACCESS, End, connect, daemons, ip_of, lab_pair

from metaroce.engine.wr import WcStatus
from metaroce.lab import core
from metaroce.nic import daemon as d
from metaroce.verbs import (IBV_EVENT_CQ_ERR, IBV_EVENT_QP_FATAL, IBV_WR_RDMA_READ,
                            IBV_WR_RDMA_WRITE, IBV_WR_SEND, Context, SendWR)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, HERE])}
HOSTILE = os.path.join(HERE, "hostile_app.py")
MiB = 1 << 20
SIZE = 64 * MiB
LOCAL_ERRORS = {WcStatus.LOC_QP_OP_ERR, WcStatus.LOC_PROT_ERR, WcStatus.LOC_LEN_ERR}
# a slot rewritten after it was posted can still be a well-formed WQE, whose rewritten remote
# address, rkey or length only the responder can refuse: the scribbler's QP may fail remotely
REMOTE_ERRORS = {WcStatus.REM_ACCESS_ERR, WcStatus.REM_INV_REQ_ERR, WcStatus.REM_OP_ERR}


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


def _line(proc, timeout_s: float = 30) -> str:
    r, _, _ = select.select([proc.stdout], [], [], timeout_s)
    assert r, "the hostile application said nothing in time"
    return proc.stdout.readline().strip()


def _say(proc, text: str) -> None:
    proc.stdin.write(text + "\n")
    proc.stdin.flush()


@pytest.mark.parametrize("seed", [19, 4242])
def test_a_hostile_application_breaks_only_its_own_qps(lab, seed):
    view, c1, c2, (dev1, dev2) = lab
    ip1, ip2 = ip_of(view, "h1"), ip_of(view, "h2")
    pid = d.request(dev2, {"op": "status"})[0]["pid"]
    good, far = End(c2, 2 * SIZE), End(c1, SIZE)            # the other application, on h2
    connect(good, far, ip2, ip1)
    data = os.urandom(SIZE)
    good.mr.write(data)

    app = subprocess.Popen([sys.executable, HOSTILE, "eth0", view.plan.node("h2").netns,
                            str(seed)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           text=True, env=ENV)
    try:
        attrs = json.loads(_line(app))
        peers = {a["case"]: End(c1, MiB) for a in attrs}
        for a in attrs:
            peers[a["case"]].qp.connect({"qpn": a["qpn"], "psn": a["psn"], "ip": ip2},
                                        timeout=12, retry_cnt=2)
        _say(app, json.dumps({
            "qps": {c: {"qpn": p.qp.qp_num, "psn": p.qp.psn, "ip": ip1, "addr": p.mr.addr,
                        "rkey": p.mr.rkey} for c, p in peers.items()},
            "foreign": {"lkey": good.mr.lkey, "addr": good.mr.addr}}))
        assert _line(app) == "ready"

        # the other application's transfer is under way when the attack starts
        good.qp.post_send(SendWR(IBV_WR_RDMA_WRITE, wr_id=1, sg_list=[good.mr.sge(0, SIZE)],
                                 remote_addr=far.mr.addr, rkey=far.mr.rkey))
        _say(app, "go")
        assert _line(app, 60) == "sent"
        for case in ("random_recvs", "recv_bad_index"):     # the NIC reads the bad receive rings
            p = peers[case]
            p.qp.post_send(SendWR(IBV_WR_SEND, wr_id=9, sg_list=[p.mr.sge(0, 64)]))
            w = p.cq.wait(1, timeout_s=10)[0]
            assert w.status == WcStatus.REM_OP_ERR, (case, w)
        _say(app, "collect")
        got = json.loads(_line(app, 60))

        # the other application finishes, verified, without an error of any kind
        assert [(w.wr_id, w.status) for w in good.cq.wait(1, timeout_s=120)] == [(1, 0)]
        good.qp.post_send(SendWR(IBV_WR_RDMA_READ, wr_id=2, sg_list=[good.mr.sge(SIZE, SIZE)],
                                 remote_addr=far.mr.addr, rkey=far.mr.rkey))
        assert [(w.wr_id, w.status) for w in good.cq.wait(1, timeout_s=120)] == [(2, 0)]
        want = hashlib.sha256(data).digest()
        assert hashlib.sha256(far.mr.read(SIZE)).digest() == want
        assert hashlib.sha256(good.mr.read(SIZE, SIZE)).digest() == want
        assert good.qp.query()["state"] == "RTS" and c2.get_async_event(timeout_s=0) is None

        # the daemon lives; every attacked QP, and only those, is in ERR
        st = d.request(dev2, {"op": "status"})[0]
        assert st["pid"] == pid and d.running_pid(dev2) == pid
        states = {q["qpn"]: q["state"] for q in st["qps"]}
        for case, qpn in got["qpns"].items():
            assert states[qpn] == "ERR", (case, states[qpn])
        assert states[good.qp.qp_num] == "RTS"

        # each with an error completion (what made it fail, then the flushes) ...
        for case, res in got["cases"].items():
            if case == "cq_index":
                continue
            statuses = [s for _, s, _ in res["wcs"]]
            errors = LOCAL_ERRORS | (REMOTE_ERRORS if case == "scribbler" else set())
            assert res["error"] is None and statuses, (case, res)
            assert errors & set(statuses), (case, res)
            assert set(statuses) <= errors | {WcStatus.WR_FLUSH_ERR, WcStatus.SUCCESS}, (case, res)
        assert got["scribbler_posts"] > 0        # the rewrites raced with real posts
        assert any(s == WcStatus.LOC_PROT_ERR and i == 77
                   for i, s, _ in got["cases"]["foreign_lkey"]["wcs"])
        assert peers["foreign_lkey"].mr.read(MiB) == bytes(MiB)     # nothing of the other's
        # ... or, for the CQ whose consumer index was impossible, the CQ's error
        assert "overran" in got["cases"]["cq_index"]["error"]
        assert [IBV_EVENT_CQ_ERR, got["cqs"]["cq_index"], None] in got["events"]
        assert [IBV_EVENT_QP_FATAL, got["cqs"]["cq_index"], got["qpns"]["cq_index"]] in \
            got["events"]
        cq = {c["cq"]: c for c in st["cqs"]}[got["cqs"]["cq_index"]]
        assert cq["state"] == "ERR" and cq["bad_consumer_index"], cq
        log = open(dev2.log_path).read()
        assert "impossible send queue producer index" in log
        print(f"hostile {seed}: " + ", ".join(
            f"{c} {sorted({WcStatus(s).name for _, s, _ in r['wcs']})}"
            for c, r in got["cases"].items()) + f"; scribbler posted {got['scribbler_posts']}")
    finally:
        if app.poll() is None:
            app.stdin.close()
            app.wait(timeout=10)
    deadline = time.monotonic() + 10                   # its exit reclaims everything
    while set(got["qpns"].values()) & {q["qpn"] for q in d.request(dev2, {"op": "status"})[0]["qps"]}:
        assert time.monotonic() < deadline, "the hostile application's QPs outlived it"
        time.sleep(0.05)
    for e in (good, far, *peers.values()):
        e.qp.close()
        e.mr.close()
