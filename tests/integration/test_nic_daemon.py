"""The RNIC daemon's life: `metaroce up` attaches the XDP NIC through a BPF link it holds,
hands an MR to its application as a map fd, keeps working in the kernel while the daemon is
frozen (SIGSTOP), and stops acknowledging the moment the daemon dies (SIGKILL)."""

import hashlib
import json
import mmap
import os
import signal
import socket
import subprocess
import sys
import time

from roce_util import lab_write, parse_ack

from metaroce.lab import core, fabric
from metaroce.lab.traffic import udp_socket
from metaroce.nic import daemon as d
from metaroce.nic.rx import ACCESS_REMOTE_WRITE
from metaroce.wire import consts as C

QPN, PEER_QPN, PD, PSN0 = 0x31, 0x32, 1, 1000


def cli(*args):
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.dirname(__file__)))}
    return subprocess.run([sys.executable, "-m", "metaroce.cli", *args], capture_output=True,
                          text=True, env=env, timeout=120)


def test_daemon_lifecycle_frozen_and_killed(lab_name):
    core.up(lab_name, "pair")
    view = core.LabView(lab_name)
    h1, h2 = view.plan.node("h1"), view.plan.node("h2")
    dev = d.DeviceId("eth0", h2.netns)
    up = cli("up", "--dev", "eth0", "--netns", h2.netns, "--json")
    assert up.returncode == 0, up.stderr
    st = json.loads(up.stdout)
    pid = st["pid"]
    try:
        assert st["xdp_mode"] == "native" and st["mode"] == "roce"
        att = fabric.xdp_attached(h2.netns, "eth0")
        assert att and att["mode"] == "native"
        again = cli("up", "--dev", "eth0", "--netns", h2.netns)
        assert again.returncode == 1 and "already runs" in again.stderr

        # the application: registers 1 MiB, gets the region as an fd, maps it
        rep, fds = d.request(dev, {"op": "reg_mr", "length": 1 << 20, "access": ACCESS_REMOTE_WRITE,
                                   "pd": PD})
        assert len(fds) == 1 and rep["length"] == 1 << 20
        region = mmap.mmap(fds[0], rep["map_bytes"])
        d.request(dev, {"op": "set_qp", "qpn": QPN, "epsn": PSN0, "pd": PD, "dqpn": PEER_QPN})

        acks = udp_socket(h1.netns, bind=("", C.ROCEV2_UDP_PORT))
        acks.settimeout(2.0)
        os.kill(pid, signal.SIGSTOP)              # the daemon is frozen: only the kernel works
        try:
            data = os.urandom(1 << 20)
            n = lab_write(view, "h1", "h2", rep["rkey"], rep["addr"], data, QPN, PSN0)
            bth, aeth = parse_ack(acks.recvfrom(2048)[0])
            assert bth.psn == PSN0 + n - 1 and aeth.syndrome == 0x1F
            assert hashlib.sha256(region[:1 << 20]).digest() == hashlib.sha256(data).digest()
        finally:
            os.kill(pid, signal.SIGCONT)

        os.kill(pid, signal.SIGKILL)              # the daemon dies: its BPF link goes with it
        deadline = time.time() + 5
        while fabric.xdp_attached(h2.netns, "eth0") and time.time() < deadline:
            time.sleep(0.05)
        assert fabric.xdp_attached(h2.netns, "eth0") is None
        lab_write(view, "h1", "h2", rep["rkey"], rep["addr"], b"\0" * 4096, QPN, PSN0 + n)
        try:
            acks.recvfrom(2048)
            raise AssertionError("a dead daemon's NIC must not acknowledge")
        except socket.timeout:
            pass
        region.close()
        os.close(fds[0])
        down = cli("down", "--dev", "eth0", "--netns", h2.netns, "--json")   # cleans the stale files
        assert down.returncode == 0 and json.loads(down.stdout)["cleaned_stale"] is True
        assert not os.path.exists(dev.sock_path) and not os.path.exists(dev.pid_path)
        # and it comes up again
        up2 = cli("up", "--dev", "eth0", "--netns", h2.netns, "--json")
        assert up2.returncode == 0, up2.stderr
        pid = json.loads(up2.stdout)["pid"]
        assert cli("down", "--dev", "eth0", "--netns", h2.netns).returncode == 0
        assert fabric.xdp_attached(h2.netns, "eth0") is None
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        d.clean_stale(dev)


def test_status_without_a_daemon_is_a_clear_error():
    p = cli("status", "--dev", "nosuchdev0", "--json")
    assert p.returncode == 1 and "no MetaRoCE device" in json.loads(p.stdout)["error"]
    p = cli("up", "--dev", "eth0", "--mode", "metaroce", "--netns", "nosuchns")
    assert p.returncode == 1 and "no network namespace" in p.stderr
