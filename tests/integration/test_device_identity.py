"""A device is its interface in its network namespace, the namespace identified by itself
(issue 18 §2, §3): `lab exec`, `ip netns exec`, `--netns NAME` and `--netns /proc/PID/ns/net`
reach the same daemon and never another namespace's; hints name the device the way the caller
must type it; `metaroce down` puts back what the daemon displaced on the interface; `lab down`
ends every process of the lab."""

import json
import os
import subprocess
import sys
import time

import pytest

from metaroce.lab import core, fabric, procs
from metaroce.nic import daemon as d
from metaroce.nic.devid import RUN_DIR, DeviceId

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = {**os.environ, "PYTHONPATH": ROOT}
CLI = [sys.executable, "-m", "metaroce.cli"]


def run(*args, netns=None, check=True):
    cmd = CLI + list(args)
    if netns:
        cmd = ["ip", "netns", "exec", netns] + cmd
    p = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=120)
    if check:
        assert p.returncode == 0, (cmd, p.stdout, p.stderr)
    return p


def lab_exec(lab, host, *args, check=True):
    return run("lab", "exec", "--name", lab, host, "--", sys.executable, "-m", "metaroce.cli",
               *args, check=check)


@pytest.fixture
def pair(lab_name):
    core.up(lab_name, "pair")
    view = core.LabView(lab_name)
    yield view
    if core.namespaces_of(lab_name):
        core.down(lab_name)


def test_every_way_into_a_namespace_finds_its_own_device(pair):
    lab = pair.name
    ns1, ns2 = (pair.plan.node(h).netns for h in ("h1", "h2"))
    # the same command in two namespaces: two devices (main refused the second: "already runs")
    lab_exec(lab, "h1", "up", "--dev", "eth0")
    lab_exec(lab, "h2", "up", "--dev", "eth0", "--mode", "metaroce")
    pid1 = json.loads(lab_exec(lab, "h1", "status", "--dev", "eth0", "--json").stdout)["pid"]
    st2 = json.loads(run("status", "--dev", "eth0", "--json", netns=ns2).stdout)
    assert st2["pid"] != pid1 and st2["mode"] == "metaroce" and st2["netns"] == ns2
    for how in (dict(netns=ns1), dict(args=("--netns", ns1)),
                dict(args=("--netns", f"/proc/{pid1}/ns/net"))):
        p = run("status", "--dev", "eth0", "--json", *how.get("args", ()), netns=how.get("netns"))
        doc = json.loads(p.stdout)
        assert doc["pid"] == pid1 and doc["mode"] == "roce", how
        assert doc["netns_inode"] == os.stat(f"/var/run/netns/{ns1}").st_ino
    # the root namespace's eth0 is another device: no daemon of the lab answers for it
    p = run("status", "--dev", "eth0", check=False)
    assert p.returncode != 0 and "no MetaRoCE device on eth0 " in p.stderr
    assert str(pid1) not in p.stdout + p.stderr
    # hints name the device as the caller must type it
    p = run("up", "--dev", "eth0", "--netns", ns1, check=False)
    assert p.returncode != 0
    assert f"metaroce down --dev eth0 --netns {ns1}" in p.stderr, p.stderr
    p = lab_exec(lab, "h1", "up", "--dev", "eth0", check=False)
    assert p.returncode != 0 and "metaroce down --dev eth0\n" in p.stderr, p.stderr
    p = run("down", "--dev", "eth0", netns=ns2)
    assert "is down" in p.stderr
    p = run("status", "--dev", "eth0", "--netns", ns2, check=False)
    assert p.returncode != 0
    assert f"metaroce up --dev eth0 --netns {ns2}" in p.stderr, p.stderr
    run("status", "--dev", "eth0", "--netns", ns1)        # h1's is untouched


def test_a_pid_file_is_trusted_only_for_a_process_in_the_namespace(pair):
    ns1 = pair.plan.node("h1").netns
    dev = DeviceId("eth0", ns1)
    os.makedirs(RUN_DIR, exist_ok=True)
    with open(dev.pid_path, "w") as f:
        f.write(str(os.getpid()))          # alive, but in the root namespace: not the daemon
    try:
        assert d.running_pid(dev) is None
        lab_exec(pair.name, "h1", "up", "--dev", "eth0")   # the stale file does not block it
        assert d.running_pid(dev) not in (None, os.getpid())
    finally:
        d.stop(dev)
    assert not os.path.exists(dev.pid_path) and not os.path.exists(dev.sock_path)


def test_down_puts_back_what_was_attached_and_the_lab_counts_again(pair):
    ns1 = pair.plan.node("h1").netns
    before = fabric.xdp_attached(ns1, "eth0")
    assert before is not None                  # the lab's host-port program
    run("up", "--dev", "eth0", "--netns", ns1)
    during = fabric.xdp_attached(ns1, "eth0")
    assert during["prog_id"] != before["prog_id"]
    run("down", "--dev", "eth0", "--netns", ns1)
    assert fabric.xdp_attached(ns1, "eth0") == before
    # the lab's counters for h1 -> sw1 move again (they froze while the slot was empty)
    c0 = pair.status()["links"][0]["counters"]["a-b"]["rx_packets"]
    subprocess.run(["ip", "netns", "exec", ns1, "ping", "-c", "3", "-i", "0.2", "10.0.0.2"],
                   check=True, capture_output=True, timeout=30)
    c1 = pair.status()["links"][0]["counters"]["a-b"]["rx_packets"]
    assert c1 >= c0 + 3, (c0, c1)


def test_a_killed_daemon_is_cleaned_and_the_slot_given_back_by_down(pair):
    ns1 = pair.plan.node("h1").netns
    before = fabric.xdp_attached(ns1, "eth0")
    run("up", "--dev", "eth0", "--netns", ns1)
    dev = DeviceId("eth0", ns1)
    os.kill(d.running_pid(dev), 9)
    deadline = time.monotonic() + 5
    while d.running_pid(dev) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    p = run("down", "--dev", "eth0", "--netns", ns1, "--json")
    assert json.loads(p.stdout)["cleaned_stale"] is True
    assert fabric.xdp_attached(ns1, "eth0") == before
    assert not os.path.exists(dev.restore_path) and not os.path.exists(dev.pid_path)


def test_lab_down_ends_every_process_of_the_lab(pair):
    lab = pair.name
    ns1, ns2 = (pair.plan.node(h).netns for h in ("h1", "h2"))
    inodes = procs.namespace_inodes(core.namespaces_of(lab))
    lab_exec(lab, "h1", "up", "--dev", "eth0")
    run("up", "--dev", "eth0", "--netns", ns2)
    app = subprocess.Popen(CLI + ["lab", "exec", "--name", lab, "h2", "--", "sleep", "600"],
                           env=ENV)
    stubborn = subprocess.Popen(["ip", "netns", "exec", ns1, "bash", "-c",
                                 "trap '' TERM; sleep 600"])
    deadline = time.monotonic() + 5
    while len(procs.pids_in(inodes)) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(procs.pids_in(inodes)) >= 4
    p = run("lab", "down", "--name", lab, "--json")
    doc = json.loads(p.stdout)["removed"][0]
    assert {x["netns"] for x in doc["stopped_daemons"]} == {ns1, ns2}
    assert app.wait(timeout=10) is not None and stubborn.wait(timeout=10) is not None
    assert procs.pids_in(inodes) == []
    left = [f for f in os.listdir(RUN_DIR) if any(f"net{i}--" in f for i in inodes)
            and not f.endswith(".log")]
    assert left == []
