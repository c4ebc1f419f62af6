"""Interoperability with an independent RoCEv2 implementation: Linux Soft-RoCE (rdma_rxe) with
Debian's rdma-core in a QEMU guest on the lab's switch, our device (compat mode) on h1.

- The stock tools, through their own connection exchanges, both directions: ibv_rc_pingpong
  (SEND/RECV, the echo checked byte for byte), perftest ib_write_bw, ib_read_bw, ib_atomic_bw.
- Every RC operation with its data checked (pyverbs on rxe0), our requester against rxe's
  responder and rxe's requester against ours, with 1 % of RoCEv2 frames lost each way on the
  link (the lab's impairment): every completion successful, every packet's ICRC valid to
  scapy.contrib.roce, and no NAK other than a PSN sequence error (the loss's).
"""

import os
import struct
import time

import pytest

from metaroce.lab.impair import Impairment
from metaroce.rxe import capture, guest, interop
from metaroce.verbs import (IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WR_ATOMIC_FETCH_AND_ADD,
                            IBV_WR_RDMA_READ, IBV_WR_RDMA_WRITE, IBV_WR_SEND, RecvWR, SendWR)

pytestmark = pytest.mark.root


def _run_with_guest(g, argv, ours):
    """Start a stock tool in the guest, run our side, then collect the tool's result."""
    with guest.Agent(g) as a:
        a.spawn("tool", argv)
        try:
            res = ours()
        finally:
            out = a.wait("tool", 60)
    assert out["rc"] == 0, f"{argv[0]} failed ({out['rc']}): {out['out'][-800:]} {out['err'][-800:]}"
    return res, out


@pytest.mark.parametrize("role", ["client", "server"])
def test_ibv_rc_pingpong(rxe_lab, role):
    """SEND/RECV with ibv_rc_pingpong -c: our client's fresh message each round comes back
    intact from rxe's server; our server sees rxe's buffer exactly and echoes it."""
    view, g, ctx, ns, ip = rxe_lab
    argv = ["ibv_rc_pingpong", "-d", "rxe0", "-g", "1", "-m", "1024", "-s", "4096", "-n", "50",
            "-c"] + ([ip] if role == "server" else [])
    res, out = _run_with_guest(g, argv, lambda: interop.pingpong(
        ctx, ns, ip, role, g.ip, size=4096, iters=50))
    assert res["rounds"] == 50 and res["bytes_checked"] == 50 * 4096
    assert "invalid data" not in out["out"]
    assert "50 iters" in out["out"]


@pytest.mark.parametrize("role", ["client", "server"])
@pytest.mark.parametrize("test", ["write", "read", "atomic"])
def test_perftest(rxe_lab, test, role):
    """perftest's own exchange (versions, sizes, MTU, keys, handshakes, reports) with our side
    as the tool's peer; the requester ("client") drives 200 operations into the other's memory."""
    view, g, ctx, ns, ip = rxe_lab
    argv = [f"ib_{test}_bw", "-d", "rxe0", "-x", "1", "-n", "200", "-F"] + \
        ([] if test == "atomic" else ["-s", "65536"]) + ([ip] if role == "server" else [])
    res, out = _run_with_guest(g, argv, lambda: interop.perftest(
        ctx, ns, ip, test, role, g.ip, size=65536, iters=200))
    assert res["peer_version"] >= 5.70 and res["path_mtu"] == 1024
    assert res["iters"] == 200
    assert " 200 " in out["out"], out["out"][-600:]           # the tool's report line


N = 256 << 10


@pytest.fixture
def lossy_pair(rxe_lab):
    """One connected pair (ours on h1, a pyverbs QP on rxe0), 1 % loss each way on h1's link,
    and a capture on the guest's tap."""
    view, g, ctx, ns, ip = rxe_lab
    me = interop.Ours(ctx, ip, 3 * N)
    a = guest.Agent(g)
    a.open()
    rv = guest.RxeVerbs(a)
    try:
        ep = rv("create", mr_bytes=3 * N, access=15)
        rv("connect", qpn=ep["qpn"], remote={"qpn": me.qp.qp_num, "psn": me.qp.psn, "ip": ip},
           mtu=1024)
        me.connect(ep["qpn"], ep["psn"], g.ip, 1024)
        view.impair("h1-sw1", "both", Impairment(loss=0.01, seed=11))
        with capture.Capture(g.netns, g.tap) as cap:
            yield me, rv, ep, cap
    finally:
        view.impair("h1-sw1", "both", None)
        rv.close()
        a.close()
        me.close()


def _lost(view) -> int:
    link = next(l for l in view.status()["links"] if l["name"] == "h1-sw1")
    return sum(link["counters"][d]["impair"]["lost"] for d in ("a-b", "b-a"))


def _checked_capture(cap, g, view, lost_before):
    assert _lost(view) - lost_before >= 10, "the impairment lost (almost) nothing"
    time.sleep(0.2)
    c = cap.check(g.mac)
    assert c["frames"] > 100, c
    assert not c["bad_icrc"], c["bad_icrc"][:5]
    unexpected = {k: v for k, v in c["naks"].items() if not k.endswith(":0x60")}
    assert not unexpected, f"NAKs other than PSN sequence errors: {c['naks']}"
    return c


def test_our_requester_against_rxe_under_loss(rxe_lab, lossy_pair):
    """Our WRITE, READ (the issue's RETRY_EXC_ERR), SEND, FETCH_ADD and COMPARE_SWAP into rxe,
    1 % loss each way: all complete and rxe's memory or our buffer holds the right bytes."""
    view, g, ctx, ns, ip = rxe_lab
    me, rv, ep, cap = lossy_pair
    q, lost0 = ep["qpn"], _lost(view)
    for rnd in range(2):
        data = os.urandom(N)
        me.mr.write(data, 0)
        me.qp.post_send(SendWR(IBV_WR_RDMA_WRITE, wr_id=1, sg_list=[me.mr.sge(0, N)],
                               remote_addr=ep["addr"], rkey=ep["rkey"]))
        me.wait(1, 120)
        assert rv.read(q, 0, N) == data, f"round {rnd}: our WRITE landed wrong in rxe's memory"
        back = os.urandom(N)
        rv.write(q, N, back)
        me.qp.post_send(SendWR(IBV_WR_RDMA_READ, wr_id=2, sg_list=[me.mr.sge(N, N)],
                               remote_addr=ep["addr"] + N, rkey=ep["rkey"]))
        me.wait(1, 120)
        assert me.mr.read(N, N) == back, f"round {rnd}: our READ of rxe's memory differs"
    msg = os.urandom(64 << 10)
    rv("post_recv", qpn=q, wr_id=9, offset=2 * N, length=len(msg))
    me.mr.write(msg, 0)
    me.qp.post_send(SendWR(IBV_WR_SEND, wr_id=3, sg_list=[me.mr.sge(0, len(msg))]))
    me.wait(1, 120)
    wc = rv.poll(q, 1, 60)
    assert wc and wc[0]["status"] == 0 and wc[0]["byte_len"] == len(msg), wc
    assert rv.read(q, 2 * N, len(msg)) == msg
    rv.write(q, 0, struct.pack("<Q", 1000))
    me.qp.post_send(SendWR(IBV_WR_ATOMIC_FETCH_AND_ADD, wr_id=4, sg_list=[me.mr.sge(2 * N, 8)],
                           remote_addr=ep["addr"], rkey=ep["rkey"], compare_add=234))
    me.wait(1, 60)
    assert struct.unpack("<Q", me.mr.read(8, 2 * N))[0] == 1000
    me.qp.post_send(SendWR(IBV_WR_ATOMIC_CMP_AND_SWP, wr_id=5, sg_list=[me.mr.sge(2 * N + 8, 8)],
                           remote_addr=ep["addr"], rkey=ep["rkey"], compare_add=1234, swap=7))
    me.wait(1, 60)
    assert struct.unpack("<Q", me.mr.read(8, 2 * N + 8))[0] == 1234
    assert struct.unpack("<Q", rv.read(q, 0, 8))[0] == 7
    _checked_capture(cap, g, view, lost0)


def test_rxe_requester_against_ours_under_loss(rxe_lab, lossy_pair):
    """rxe's WRITE, READ, SEND, FETCH_ADD and COMPARE_SWAP into our memory, 1 % loss each way."""
    view, g, ctx, ns, ip = rxe_lab
    me, rv, ep, cap = lossy_pair
    q, lost0 = ep["qpn"], _lost(view)

    def done(wr_id):
        wc = rv.poll(q, 1, 120)
        assert wc and wc[0]["status"] == 0 and wc[0]["wr_id"] == wr_id, wc

    for rnd in range(2):
        data = os.urandom(N)
        rv.write(q, 0, data)
        rv("post_send", qpn=q, opcode="RDMA_WRITE", wr_id=1, offset=0, length=N,
           remote_addr=me.mr.addr, rkey=me.mr.rkey)
        done(1)
        assert me.mr.read(N, 0) == data, f"round {rnd}: rxe's WRITE landed wrong in our memory"
        back = os.urandom(N)
        me.mr.write(back, N)
        rv("post_send", qpn=q, opcode="RDMA_READ", wr_id=2, offset=N, length=N,
           remote_addr=me.mr.addr + N, rkey=me.mr.rkey)
        done(2)
        assert rv.read(q, N, N) == back, f"round {rnd}: rxe's READ of our memory differs"
    msg = os.urandom(64 << 10)
    me.qp.post_recv(RecvWR(wr_id=9, sg_list=[me.mr.sge(2 * N, len(msg))]))
    rv.write(q, 0, msg)
    rv("post_send", qpn=q, opcode="SEND", wr_id=3, offset=0, length=len(msg))
    done(3)
    wc = me.wait(1, 60)[0]
    assert wc.wr_id == 9 and wc.byte_len == len(msg)
    assert me.mr.read(len(msg), 2 * N) == msg
    me.mr.write(struct.pack("<Q", 50), 0)
    rv("post_send", qpn=q, opcode="ATOMIC_FETCH_AND_ADD", wr_id=4, offset=2 * N, length=8,
       remote_addr=me.mr.addr, rkey=me.mr.rkey, compare_add=5)
    done(4)
    assert struct.unpack("<Q", rv.read(q, 2 * N, 8))[0] == 50
    rv("post_send", qpn=q, opcode="ATOMIC_CMP_AND_SWP", wr_id=5, offset=2 * N + 8, length=8,
       remote_addr=me.mr.addr, rkey=me.mr.rkey, compare_add=55, swap=99)
    done(5)
    assert struct.unpack("<Q", rv.read(q, 2 * N + 8, 8))[0] == 55
    assert struct.unpack("<Q", me.mr.read(8, 0))[0] == 99
    _checked_capture(cap, g, view, lost0)
