"""The RNIC daemon's life: `metaroce up` attaches the XDP NIC through a BPF link it holds; an
application in another process registers memory and a QP through the verbs API; the NIC keeps
working in the kernel while that application and the daemon are frozen (SIGSTOP), and stops
acknowledging the moment the daemon dies (SIGKILL), so the requester ends in RETRY_EXC_ERR."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import time

from verbs_util import End, daemons, ip_of, lab_pair

from metaroce.lab import fabric
from metaroce.nic import daemon as d
from metaroce.verbs import (IBV_WC_RETRY_EXC_ERR, IBV_WC_SUCCESS, IBV_WR_RDMA_WRITE, Context,
                            SendWR)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, HERE])}
SIZE = 64 << 20


def cli(*args):
    return subprocess.run([sys.executable, "-m", "metaroce.cli", *args], capture_output=True,
                          text=True, env=ENV, timeout=120)


def test_frozen_responder_completes_and_a_killed_one_times_out(lab_name):
    """The kernel does the work: with the responder's daemon and application frozen (SIGSTOP),
    a 64 MiB WRITE from h1 completes and verifies. When the responder's daemon dies its BPF
    link goes with it: no more ACKs, and the requester's QP ends in RETRY_EXC_ERR."""
    view = lab_pair(lab_name)
    h1, h2 = view.plan.node("h1"), view.plan.node("h2")
    dev2 = d.DeviceId("eth0", h2.netns)
    lab_prog = fabric.xdp_attached(h2.netns, "eth0")       # the lab's host-port program
    up = cli("up", "--dev", "eth0", "--netns", h2.netns, "--json")
    assert up.returncode == 0, up.stderr
    st = json.loads(up.stdout)
    pid = st["pid"]
    app = None
    try:
        assert st["xdp_mode"] == "native" and st["mode"] == "roce"
        att = fabric.xdp_attached(h2.netns, "eth0")
        assert att and att["mode"] == "native"
        again = cli("up", "--dev", "eth0", "--netns", h2.netns)
        assert again.returncode == 1 and "already runs" in again.stderr
        with daemons(view, hosts=("h1",)):
            app = subprocess.Popen([sys.executable, os.path.join(HERE, "verbs_app.py"), "eth0",
                                    h2.netns, str(SIZE)], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True, env=ENV)
            remote = json.loads(app.stdout.readline())
            ctx = Context("eth0", h1.netns)
            a = End(ctx, SIZE)
            a.qp.connect({"qpn": remote["qpn"], "psn": remote["psn"], "ip": ip_of(view, "h2")},
                         timeout=12, retry_cnt=3)
            app.stdin.write(json.dumps({"qpn": a.qp.qp_num, "psn": a.qp.psn,
                                        "ip": ip_of(view, "h1")}) + "\n")
            app.stdin.flush()
            assert app.stdout.readline().strip() == "ready"
            data = os.urandom(SIZE)
            a.mr.write(data)

            os.kill(app.pid, signal.SIGSTOP)          # application and daemon frozen:
            os.kill(pid, signal.SIGSTOP)              # only the kernel works on h2
            try:
                a.qp.post_send(SendWR(IBV_WR_RDMA_WRITE, wr_id=1, sg_list=[a.mr.sge()],
                                      remote_addr=remote["addr"], rkey=remote["rkey"]))
                wc = a.cq.wait(1, timeout_s=120)[0]
                assert wc.status == IBV_WC_SUCCESS, wc
            finally:
                os.kill(pid, signal.SIGCONT)
                os.kill(app.pid, signal.SIGCONT)
            app.stdin.write("hash\n")
            app.stdin.flush()
            assert app.stdout.readline().strip() == hashlib.sha256(data).hexdigest()

            acks = a.qp.query()["acks_received"]
            os.kill(pid, signal.SIGKILL)              # the daemon dies: its BPF link goes with it
            deadline = time.time() + 5
            while fabric.xdp_attached(h2.netns, "eth0") and time.time() < deadline:
                time.sleep(0.05)
            assert fabric.xdp_attached(h2.netns, "eth0") is None
            a.qp.post_send(SendWR(IBV_WR_RDMA_WRITE, wr_id=2, sg_list=[a.mr.sge(0, 4096)],
                                  remote_addr=remote["addr"], rkey=remote["rkey"]))
            wc = a.cq.wait(1, timeout_s=10)[0]
            assert (wc.wr_id, wc.status) == (2, IBV_WC_RETRY_EXC_ERR)
            q = a.qp.query()
            assert q["state"] == "ERR" and q["acks_received"] == acks
            assert q["local_ack_timeout_err"] == 4       # 1 + retry_cnt transmissions (RESP-9)
            ctx.close()
        down = cli("down", "--dev", "eth0", "--netns", h2.netns, "--json")   # cleans the stale files
        assert down.returncode == 0 and json.loads(down.stdout)["cleaned_stale"] is True
        assert not os.path.exists(dev2.sock_path) and not os.path.exists(dev2.pid_path)
        assert fabric.xdp_attached(h2.netns, "eth0") == lab_prog   # put back by down
        up2 = cli("up", "--dev", "eth0", "--netns", h2.netns, "--json")      # and up again
        assert up2.returncode == 0, up2.stderr
        pid = json.loads(up2.stdout)["pid"]
        assert cli("down", "--dev", "eth0", "--netns", h2.netns).returncode == 0
        assert fabric.xdp_attached(h2.netns, "eth0") == lab_prog
    finally:
        if app is not None:
            app.kill()
            app.wait()
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        d.clean_stale(dev2)


def test_status_without_a_daemon_is_a_clear_error():
    p = cli("status", "--dev", "nosuchdev0", "--json")
    assert p.returncode == 1 and "no MetaRoCE device" in json.loads(p.stdout)["error"]
    p = cli("up", "--dev", "eth0", "--mode", "metaroce", "--netns", "nosuchns")
    assert p.returncode == 1 and "no network namespace" in p.stderr
