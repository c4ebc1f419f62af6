"""Faults (issue 9, part 2) on a real three-host star lab (h1, h2, h3 on one switch), daemons
offering MetaRoCE mode (so a QP may speak either mode):

- the cable of h2 pulled for 2 s in the middle of a 48 MiB WRITE: it completes and verifies,
  in both modes, and the outage really hit it (retransmission timeouts);
- the cable pulled for longer than a QP's retry budget: that QP ends RETRY_EXC_ERR and in ERR
  within its budget (no hang), the later WQEs are flushed; a QP on the same link with a longer
  budget survives, and a QP to h3 keeps working during the outage;
- h3's daemon killed: every h1 QP with work outstanding to it errors within its timeout;
- the killed daemon's device: `metaroce down` cleans up (no XDP program on the interface, no
  socket or pid file, the daemon's program, link and maps gone from the kernel, nothing pinned),
  `up` works again; `up` twice and `down` twice give one clear line and a non-zero exit;
- an application killed (SIGKILL) mid-operation: its QPs and MRs are reclaimed (the daemon's
  status and the kernel say so) while another application's transfer on the same device goes on.
"""

import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from verbs_util import End, connect, daemons, ip_of

from metaroce import procbpf
from metaroce.lab import core, fabric
from metaroce.lab.netdev import ifindex, ipr_in
from metaroce.nic import daemon as d
from metaroce.verbs import (IBV_WC_RETRY_EXC_ERR, IBV_WC_SUCCESS, IBV_WC_WR_FLUSH_ERR,
                            IBV_WR_RDMA_READ, IBV_WR_RDMA_WRITE, IBV_WR_SEND, Context, RecvWR,
                            SendWR)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, HERE])}
MiB = 1 << 20


def cli(*args):
    return subprocess.run([sys.executable, "-m", "metaroce.cli", *args], capture_output=True,
                          text=True, env=ENV, timeout=120)


@pytest.fixture(scope="module")
def star(module_lab_name):
    core.up(module_lab_name, "star", hosts=3)
    view = core.LabView(module_lab_name)
    try:
        with daemons(view, hosts=("h1", "h2", "h3"), mode="metaroce"):
            ctxs = {h: Context("eth0", view.plan.node(h).netns) for h in ("h1", "h2", "h3")}
            yield view, ctxs
            for c in ctxs.values():
                c.close()
    finally:
        core.down(module_lab_name)


def cable(view, host: str, up: bool) -> None:
    """Pull (or plug back) host's cable at the switch: the switch port goes down, the host's
    eth0 loses carrier (it stays administratively up, as with a real unplugged cable)."""
    sw = view.plan.node("sw1")
    with ipr_in(sw.netns) as ipr:
        ipr.link("set", index=ifindex(ipr, host), state="up" if up else "down")


def pair(view, ctxs, x, y, mode, mr_bytes, **attr):
    a, b = End(ctxs[x], mr_bytes), End(ctxs[y], mr_bytes)
    connect(a, b, ip_of(view, x), ip_of(view, y), mode=mode, **attr)
    return a, b


def close(*ends):
    for e in ends:
        e.qp.close()
        e.mr.close()


def wait_sending(qp, timeout_s=5.0):
    """Until the QP has put packets on the wire (the transfer is under way)."""
    deadline = time.monotonic() + timeout_s
    while qp.query()["sent_packets"] == 0:
        assert time.monotonic() < deadline, "the transfer never started"
        time.sleep(0.005)


@pytest.mark.parametrize("mode", ["roce", "metaroce"])
def test_link_down_for_2s_mid_transfer_completes_and_verifies(star, mode):
    view, ctxs = star
    size = 48 * MiB
    # a 0.54 s ACK timeout and 7 retries: a budget of ~4.3 s, longer than the outage
    a, b = pair(view, ctxs, "h1", "h2", mode, 2 * size, timeout=17, retry_cnt=7)
    assert a.qp.query()["mode"] == mode
    data = os.urandom(size)
    a.mr.write(data)
    b.qp.post_recv([RecvWR(wr_id=100 + i, sg_list=[b.mr.sge(size + i * 8192, 8192)])
                    for i in range(8)])
    a.qp.post_send(SendWR(IBV_WR_RDMA_WRITE, wr_id=1, sg_list=[a.mr.sge(0, size)],
                          remote_addr=b.mr.addr, rkey=b.mr.rkey))
    a.qp.post_send([SendWR(IBV_WR_SEND, wr_id=10 + i, sg_list=[a.mr.sge(i * 8192, 8192)])
                    for i in range(8)])
    a.qp.post_send(SendWR(IBV_WR_RDMA_READ, wr_id=2, sg_list=[a.mr.sge(size, 4 * MiB)],
                          remote_addr=b.mr.addr + 3 * MiB, rkey=b.mr.rkey))
    wait_sending(a.qp)
    cable(view, "h2", up=False)
    t_down = time.monotonic()
    try:
        time.sleep(2.0)
        assert a.cq.poll(16) == [], "the transfer finished before the outage: not a fault test"
    finally:
        cable(view, "h2", up=True)
    outage = time.monotonic() - t_down
    wcs = a.cq.wait(10, timeout_s=60)
    assert [(w.wr_id, w.status) for w in wcs] == \
        [(1, IBV_WC_SUCCESS)] + [(10 + i, IBV_WC_SUCCESS) for i in range(8)] + [(2, IBV_WC_SUCCESS)]
    got = b.cq.wait(8, timeout_s=30)
    assert [(w.wr_id, w.status, w.byte_len) for w in got] == [(100 + i, 0, 8192) for i in range(8)]
    assert hashlib.sha256(b.mr.read(size)).digest() == hashlib.sha256(data).digest()
    assert b.mr.read(8 * 8192, size) == data[:8 * 8192]
    assert a.mr.read(4 * MiB, size) == data[3 * MiB:7 * MiB]
    st = a.qp.query()
    assert outage >= 2.0
    assert st["state"] == "RTS" and st["local_ack_timeout_err"] >= 1, st   # the outage hit it
    assert st["retransmitted_packets"] > 0
    close(a, b)


def test_link_down_past_the_retry_budget(star):
    """A 67 ms timeout with 2 retries gives up after ~0.2 s: RETRY_EXC_ERR, ERR, later WQEs
    flushed, well within a bound (no hang). A QP on the same cable with a ~8.6 s budget rides
    the outage out; a QP from h1 to h3 works during it."""
    view, ctxs = star
    short, _ = short_b = pair(view, ctxs, "h1", "h2", "roce", 8 * MiB, timeout=14, retry_cnt=2)
    long_, long_b = pair(view, ctxs, "h1", "h2", "metaroce", 8 * MiB, timeout=18, retry_cnt=7)
    other, other_b = pair(view, ctxs, "h1", "h3", "roce", 8 * MiB)
    data = os.urandom(8 * MiB)
    for e in (short, long_, other):
        e.mr.write(data)
    cable(view, "h2", up=False)
    try:
        t0 = time.monotonic()
        short.qp.post_send([SendWR(IBV_WR_RDMA_WRITE, wr_id=1, sg_list=[short.mr.sge(0, 4 * MiB)],
                                   remote_addr=short_b[1].mr.addr, rkey=short_b[1].mr.rkey),
                            SendWR(IBV_WR_RDMA_WRITE, wr_id=2, sg_list=[short.mr.sge(0, 4096)],
                                   remote_addr=short_b[1].mr.addr, rkey=short_b[1].mr.rkey)])
        long_.qp.post_send(SendWR(IBV_WR_RDMA_WRITE, wr_id=3, sg_list=[long_.mr.sge()],
                                  remote_addr=long_b.mr.addr, rkey=long_b.mr.rkey))
        wcs = short.cq.wait(2, timeout_s=10)
        failed_after = time.monotonic() - t0
        assert [(w.wr_id, w.status) for w in wcs] == [(1, IBV_WC_RETRY_EXC_ERR),
                                                      (2, IBV_WC_WR_FLUSH_ERR)]
        q = short.qp.query()
        assert q["state"] == "ERR" and q["local_ack_timeout_err"] == 3      # 1 + retry_cnt
        assert 0.15 < failed_after < 2.0, failed_after          # 3 x 67 ms, with slack for load
        # during the outage, h1 -> h3 works and verifies
        other.qp.post_send(SendWR(IBV_WR_RDMA_WRITE, wr_id=4, sg_list=[other.mr.sge()],
                                  remote_addr=other_b.mr.addr, rkey=other_b.mr.rkey))
        assert [(w.wr_id, w.status) for w in other.cq.wait(1, timeout_s=30)] == [(4, 0)]
        assert other_b.mr.read(8 * MiB) == data
        assert long_.cq.poll() == []                             # still trying
        time.sleep(max(0.0, 1.5 - (time.monotonic() - t0)))
    finally:
        cable(view, "h2", up=True)
    assert [(w.wr_id, w.status) for w in long_.cq.wait(1, timeout_s=30)] == [(3, IBV_WC_SUCCESS)]
    assert long_b.mr.read(8 * MiB) == data
    assert long_.qp.query()["state"] == "RTS" and other.qp.query()["state"] == "RTS"
    close(short, short_b[1], long_, long_b, other, other_b)


def _wait(pred, timeout_s=20.0, what="condition"):   # the kernel frees BPF objects lazily (RCU)
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _bpffs_entries() -> set[str]:
    out = set()
    for top, dirs, files in os.walk("/sys/fs/bpf"):
        if top.startswith(fabric.PIN_ROOT):      # labs' own pins (other labs may come and go)
            dirs[:] = []
            continue
        out.update(os.path.join(top, f) for f in files + dirs)
    return out


def test_remote_daemon_killed_then_local_down_and_up_clean(star):
    """h3's daemon is SIGKILLed: h1's QPs with work outstanding to h3 end RETRY_EXC_ERR within
    their budget, h1's QP to h2 is unaffected. Then on h3: `down` cleans the stale files and
    nothing of the daemon stays in the kernel; `up` / `up` again / `down` / `down` again."""
    view, ctxs = star
    h3 = view.plan.node("h3")
    dev3 = d.DeviceId("eth0", h3.netns)
    pins_before = _bpffs_entries()
    pid = d.request(dev3, {"op": "status"})[0]["pid"]
    held = procbpf.bpf_objects(pid)
    assert held["progs"] and held["links"] and held["maps"]
    with open(dev3.restore_path) as f:                # what the daemon displaced: the lab's
        lab_prog = {"mode": "native", "prog_id": json.load(f)["prog_id"]}
    assert lab_prog["prog_id"] not in held["progs"]
    mr_ids = set()
    ends = []
    for i, mode in enumerate(("roce", "metaroce", "roce", "metaroce")):
        a, b = pair(view, ctxs, "h1", "h3", mode, 4 * MiB, timeout=14, retry_cnt=3)
        ends.append((a, b))
    mr_ids = set(procbpf.mr_maps(pid))
    assert len(mr_ids) >= 4
    keep, keep_b = pair(view, ctxs, "h1", "h2", "roce", 4 * MiB)

    os.kill(pid, signal.SIGKILL)
    _wait(lambda: fabric.xdp_attached(h3.netns, "eth0") is None, what="the XDP link to go")
    t0 = time.monotonic()
    for i, (a, b) in enumerate(ends):
        a.qp.post_send(SendWR(IBV_WR_RDMA_WRITE, wr_id=i, sg_list=[a.mr.sge()],
                              remote_addr=b.mr.addr, rkey=b.mr.rkey))
    for i, (a, _) in enumerate(ends):
        wc = a.cq.wait(1, timeout_s=10)[0]
        assert (wc.wr_id, wc.status) == (i, IBV_WC_RETRY_EXC_ERR)
        assert a.qp.query()["state"] == "ERR"
    elapsed = time.monotonic() - t0
    assert elapsed < 2.0, elapsed                 # budget: 4 x 67 ms each, run side by side
    keep.mr.write(b"unaffected" * 1000)
    keep.qp.post_send(SendWR(IBV_WR_RDMA_WRITE, wr_id=9, sg_list=[keep.mr.sge(0, 10000)],
                             remote_addr=keep_b.mr.addr, rkey=keep_b.mr.rkey))
    assert keep.cq.wait(1)[0].status == IBV_WC_SUCCESS
    assert keep_b.mr.read(10000) == b"unaffected" * 1000
    for a, _ in ends:
        a.qp.close()
        a.mr.close()
    close(keep, keep_b)

    # the application on h3 still maps its MRs; once it lets go, nothing of the daemon is left
    ctxs["h3"].close()
    for _, b in ends:
        b.mr.close()
    assert os.path.exists(dev3.sock_path) and os.path.exists(dev3.pid_path)   # stale files
    down = cli("down", "--dev", "eth0", "--netns", h3.netns, "--json")
    assert down.returncode == 0, down.stderr
    assert json.loads(down.stdout)["cleaned_stale"] is True
    assert not os.path.exists(dev3.sock_path) and not os.path.exists(dev3.pid_path)
    assert fabric.xdp_attached(h3.netns, "eth0") == lab_prog       # the lab's program is back
    ip_link = subprocess.run(["ip", "-n", h3.netns, "-d", "link", "show", "eth0"],
                             capture_output=True, text=True, check=True).stdout
    assert f"prog/xdp id {lab_prog['prog_id']}" in ip_link, ip_link
    _wait(lambda: not any(procbpf.prog_exists(p) for p in held["progs"]), what="program freed")
    _wait(lambda: not any(procbpf.map_exists(m["id"]) for m in held["maps"]), what="maps freed")
    _wait(lambda: not any(procbpf.map_exists(m) for m in mr_ids), what="MR maps freed")
    assert _bpffs_entries() == pins_before                        # nothing pinned

    up = cli("up", "--dev", "eth0", "--netns", h3.netns, "--mode", "metaroce", "--json")
    assert up.returncode == 0, up.stderr
    new_pid = json.loads(up.stdout)["pid"]
    try:
        assert fabric.xdp_attached(h3.netns, "eth0") is not None
        again = cli("up", "--dev", "eth0", "--netns", h3.netns)
        assert again.returncode != 0
        assert again.stderr.strip().count("\n") == 0, again.stderr            # one line
        assert f"already runs on eth0 in netns {h3.netns} (pid {new_pid})" in again.stderr, \
            again.stderr
        # the device works after the restart
        ctxs["h3"] = Context("eth0", h3.netns)
        a, b = pair(view, ctxs, "h1", "h3", "metaroce", MiB)
        a.mr.write(b"after restart")
        a.qp.post_send(SendWR(IBV_WR_RDMA_WRITE, wr_id=1, sg_list=[a.mr.sge(0, 13)],
                              remote_addr=b.mr.addr, rkey=b.mr.rkey))
        assert a.cq.wait(1)[0].status == IBV_WC_SUCCESS and b.mr.read(13) == b"after restart"
        close(a, b)
        ctxs["h3"].close()
    finally:
        first = cli("down", "--dev", "eth0", "--netns", h3.netns)
    assert first.returncode == 0, first.stderr
    assert d.running_pid(dev3) is None and fabric.xdp_attached(h3.netns, "eth0") == lab_prog
    second = cli("down", "--dev", "eth0", "--netns", h3.netns)
    assert second.returncode != 0
    assert second.stderr.strip().count("\n") == 0, second.stderr
    assert "no MetaRoCE daemon runs on eth0" in second.stderr, second.stderr
    # restart it for the module's teardown (and the following tests)
    assert cli("up", "--dev", "eth0", "--netns", h3.netns, "--mode", "metaroce").returncode == 0
    ctxs["h3"] = Context("eth0", h3.netns)


FAULT_APP = os.path.join(HERE, "fault_app.py")


def test_application_killed_mid_operation_is_reclaimed(star):
    """An application on h2 (its own process) with 4 QPs and 5 MRs, WRITEs in flight both ways,
    is SIGKILLed: the daemon reclaims its QPs and MRs (status, and the MR maps are freed in the
    kernel); another application's 32 MiB transfer on the same device, running meanwhile,
    completes and verifies; h1's QPs towards the dead one end in RETRY_EXC_ERR."""
    view, ctxs = star
    h2 = view.plan.node("h2")
    dev2 = d.DeviceId("eth0", h2.netns)
    mine, mine_a = End(ctxs["h2"], 32 * MiB), End(ctxs["h1"], 32 * MiB)   # the other application
    connect(mine_a, mine, ip_of(view, "h1"), ip_of(view, "h2"))
    st0 = d.request(dev2, {"op": "status"})[0]
    pid = st0["pid"]
    mrs0, qps0 = st0["mrs"], {q["qpn"] for q in st0["qps"]}
    maps0 = set(procbpf.mr_maps(pid))

    peers = [End(ctxs["h1"], 4 * MiB) for _ in range(4)]
    app = subprocess.Popen([sys.executable, FAULT_APP, "eth0", h2.netns, str(4 * MiB), "4"],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        remote = [json.loads(app.stdout.readline()) for _ in range(4)]
        for p, r in zip(peers, remote):
            p.qp.connect({"qpn": r["qpn"], "psn": r["psn"], "ip": ip_of(view, "h2"),
                          "mode": "metaroce"}, timeout=14, retry_cnt=3)
        app.stdin.write(json.dumps([{"qpn": p.qp.qp_num, "psn": p.qp.psn, "ip": ip_of(view, "h1"),
                                     "rkey": p.mr.rkey, "addr": p.mr.addr} for p in peers]) + "\n")
        app.stdin.flush()
        assert app.stdout.readline().strip() == "busy"
        st = d.request(dev2, {"op": "status"})[0]
        app_qps = {r["qpn"] for r in remote}
        assert app_qps <= {q["qpn"] for q in st["qps"]} and st["mrs"] == mrs0 + 5
        app_maps = set(procbpf.mr_maps(pid)) - maps0
        assert len(app_maps) == 5

        # another application on h2 (this process) is transferring when the kill happens
        data = os.urandom(32 * MiB)
        mine.mr.write(data)
        mine.qp.post_send(SendWR(IBV_WR_RDMA_WRITE, wr_id=7, sg_list=[mine.mr.sge()],
                                 remote_addr=mine_a.mr.addr, rkey=mine_a.mr.rkey))
        wait_sending(mine.qp)
        for p, r in zip(peers, remote):              # and h1 writes into the dying application
            p.qp.post_send(SendWR(IBV_WR_RDMA_WRITE, wr_id=1, sg_list=[p.mr.sge()],
                                  remote_addr=r["addr"], rkey=r["rkey"]))
        app.kill()
        app.wait(timeout=10)
        _wait(lambda: d.request(dev2, {"op": "status"})[0]["mrs"] == mrs0, what="MRs reclaimed")
        st = d.request(dev2, {"op": "status"})[0]
        assert not app_qps & {q["qpn"] for q in st["qps"]}
        assert {q["qpn"] for q in st["qps"]} >= qps0
        assert not app_maps & set(procbpf.mr_maps(pid))           # the daemon let go
        _wait(lambda: not any(procbpf.map_exists(m) for m in app_maps), what="MR maps freed")
        assert [(w.wr_id, w.status) for w in mine.cq.wait(1, timeout_s=30)] == [(7, 0)]
        assert hashlib.sha256(mine_a.mr.read(32 * MiB)).digest() == hashlib.sha256(data).digest()
        for p in peers:                      # the dead application's QPs answer no more
            w = p.cq.wait(1, timeout_s=10)[0]
            assert w.status in (IBV_WC_SUCCESS, IBV_WC_RETRY_EXC_ERR)
        for p, r in zip(peers, remote):
            if p.qp.query()["state"] == "RTS":
                p.qp.post_send(SendWR(IBV_WR_RDMA_WRITE, wr_id=2, sg_list=[p.mr.sge(0, 64)],
                                      remote_addr=r["addr"], rkey=r["rkey"]))
                assert p.cq.wait(1, timeout_s=10)[0].status == IBV_WC_RETRY_EXC_ERR
            assert p.qp.query()["state"] == "ERR"
        st = d.request(dev2, {"op": "status"})[0]
        assert st["counters"]["unknown_qp"] > st0["counters"]["unknown_qp"]
        close(mine, mine_a, *peers)
    finally:
        if app.poll() is None:
            app.kill()
            app.wait()
