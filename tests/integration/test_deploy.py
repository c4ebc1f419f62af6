"""Deployment on a lab pair: `metaroce provision` inside h1's namespace (dry run, apply, apply
again changes nothing), the systemd unit verified and its exact ExecStart line run in h2's
namespace (READY after attach, SIGTERM detaches XDP), and the exporter scraped over loopback
while that daemon runs."""

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from _deps import require_tool

from metaroce.lab import core

pytestmark = pytest.mark.root
METAROCE = os.path.join(os.path.dirname(sys.executable), "metaroce")


def run(*args, env=None, check=True):
    r = subprocess.run([METAROCE, *args], capture_output=True, text=True, env=env, timeout=120)
    if check and r.returncode != 0:
        raise AssertionError(f"metaroce {' '.join(args)}: {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r


def ip(*args) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def lab(module_lab_name):
    core.up(module_lab_name, "pair")
    return core.LabView(module_lab_name)


CONFIG = """\
[sysctl]
fib_multipath_hash_policy = 1
rp_filter = "loose"

[interfaces.eth0]
mtu = 3000
addresses = ["10.0.0.1/24", "10.9.0.1/24", "fd00:9::1/64"]
rp_filter = "loose"
routes = [
  { to = "10.50.0.0/16", via = "10.0.0.2", metric = 7 },
  { to = "fd00:50::/48", via = "fd00:4d52::2" },
]
[interfaces.eth0.metaroce]
mode = "metaroce"
"""


def test_provision_in_a_lab_host(lab, tmp_path):
    ns = lab.plan.node("h1").netns
    cfg = tmp_path / "provision.toml"
    cfg.write_text(CONFIG)
    args = ["provision", "--config", str(cfg), "--netns", ns, "--config-dir", str(tmp_path / "etc")]
    dry = run(*args, "--dry-run").stdout
    assert "~ eth0: mtu 1500 -> 3000" in dry and "~ eth0: add address 10.9.0.1/24" in dry
    assert "~ eth0: add route 10.50.0.0/16 via 10.0.0.2 metric 7 dev eth0" in dry
    assert "~ sysctl net.ipv4.conf.all.rp_filter: 0 -> 2" in dry
    assert "+mode = \"metaroce\"" in dry and dry.rstrip().endswith("(dry run)")
    assert "10.9.0.1" not in ip("-n", ns, "addr")                # nothing changed
    assert not (tmp_path / "etc").exists()

    first = json.loads(run(*args, "--json").stdout)
    assert first["applied"] == len(first["changes"]) == 11 and first["warnings"] == []
    assert "mtu 3000" in ip("-n", ns, "link", "show", "eth0")
    addrs = ip("-n", ns, "addr", "show", "eth0")
    assert "10.9.0.1/24" in addrs and "fd00:9::1/64" in addrs
    assert "10.50.0.0/16 via 10.0.0.2 dev eth0 proto static metric 7" in ip("-n", ns, "route")
    assert "fd00:50::/48 via fd00:4d52::2" in ip("-n", ns, "-6", "route")
    sysctl = subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-n",
                             "net.ipv4.fib_multipath_hash_policy", "net.ipv4.conf.eth0.rp_filter"],
                            capture_output=True, text=True, check=True).stdout.split()
    assert sysctl == ["1", "2"]
    assert 'mode = "metaroce"' in (tmp_path / "etc" / "eth0.toml").read_text()

    second = json.loads(run(*args, "--json").stdout)
    assert second["changes"] == [] and second["applied"] == 0
    assert "no changes" in run(*args, "--dry-run").stdout

    bad = tmp_path / "bad.toml"
    bad.write_text(CONFIG.replace('mode = "metaroce"', 'mode = "rocev3"'))
    r = run("provision", "--config", str(bad), "--netns", ns, check=False)
    assert r.returncode == 2
    line = CONFIG.splitlines().index('mode = "metaroce"') + 1
    assert r.stderr.strip().startswith(f"metaroce: error: {bad}:{line}: interfaces.eth0.metaroce.mode")


def _xdp_prog(ns: str) -> str | None:
    m = re.search(r"prog/xdp id \d+ name (\S+)", ip("-n", ns, "-d", "link", "show", "eth0"))
    return m.group(1) if m else None


def _send_unknown_qp(ns: str, dst: str) -> None:
    """One well-formed RoCEv2 WRITE_ONLY to a QP that does not exist."""
    bth = bytes([0x0A, 0x40, 0xFF, 0xFF, 0, 0x12, 0x34, 0x56, 0x80, 0, 0, 1])
    reth = (0).to_bytes(8, "big") + (1).to_bytes(4, "big") + (64).to_bytes(4, "big")
    pkt = bth + reth + bytes(64) + bytes(4)
    code = (f"import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
            f"s.sendto({pkt!r}, ({dst!r}, 4791))")
    subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", code], check=True)


def test_unit_execstart_and_exporter(lab, tmp_path):
    require_tool("systemd-analyze", "Debian's systemd (make setup installs it)")
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "eth0.toml").write_text('dev = "eth0"\nmode = "metaroce"\n')
    res = json.loads(run("install", "--systemd", "--prefix", str(tmp_path / "root"),
                         "--config-dir", str(etc), "--verify", "--json").stdout)
    assert res["action"] == "created" and res["verify"] == {"ok": True, "output": ""}
    again = json.loads(run("install", "--systemd", "--prefix", str(tmp_path / "root"),
                           "--config-dir", str(etc), "--json").stdout)
    assert again["action"] == "unchanged"
    unit = open(res["unit"]).read()
    assert "Restart=on-failure" in unit and "Type=notify" in unit
    line = re.search(r"^ExecStart=(.*)$", unit, re.M).group(1)
    assert line == f"{METAROCE} up --dev %i --foreground --config {etc}/%i.toml"
    # an instance verifies too (the template's %i resolved)
    inst = tmp_path / "metaroce@eth0.service"
    inst.write_text(unit)
    r = subprocess.run(["systemd-analyze", "verify", str(inst)], capture_output=True, text=True)
    assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), r.stdout + r.stderr

    ns = lab.plan.node("h2").netns
    run_dir = tmp_path / "run"
    notify = tmp_path / "notify.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(str(notify))
    s.settimeout(90)
    env = dict(os.environ, NOTIFY_SOCKET=str(notify), METAROCE_RUN_DIR=str(run_dir))
    daemon = subprocess.Popen(["ip", "netns", "exec", ns, *shlex.split(line.replace("%i", "eth0"))],
                              env=env, stderr=subprocess.PIPE, text=True)
    exporter = None
    try:
        ready = s.recv(4096).decode()
        assert ready.startswith("READY=1\n") and "metaroce mode" in ready
        assert _xdp_prog(ns) == "nic_rx"
        # a persistent endpoint gives the exporter a QP; a stray packet gives it a drop
        qpn = _endpoint(run_dir, ns)
        _send_unknown_qp(lab.plan.node("h1").netns, "10.0.0.2")

        exporter = subprocess.Popen([METAROCE, "exporter", "--listen", "127.0.0.1:0", "--json"],
                                    env=dict(os.environ, METAROCE_RUN_DIR=str(run_dir)),
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        url = json.loads(exporter.stdout.readline())["url"]
        from prometheus_client.parser import text_string_to_metric_families
        deadline = time.time() + 5
        while True:
            with urllib.request.urlopen(url, timeout=5) as resp:
                ctype = resp.headers["Content-Type"]
                fams = {f.name: f for f in text_string_to_metric_families(resp.read().decode())}
            drops = {x.labels["reason"]: x.value for x in fams["metaroce_rx_drops"].samples}
            if drops["unknown_qp"] >= 1 or time.time() > deadline:
                break
            time.sleep(0.1)
        assert ctype.startswith("text/plain; version=0.0.4")
        # the unit ran in ns through `ip netns exec`: the exporter, in the root namespace, names
        # the daemon's namespace all the same (the device is identified by the namespace)
        assert fams["metaroce_device_up"].samples[0].labels == {"dev": "eth0", "netns": ns}
        assert fams["metaroce_device_up"].samples[0].value == 1
        assert fams["metaroce_device_info"].samples[0].labels["mode"] == "metaroce"
        assert drops["unknown_qp"] == 1 and drops["bad_icrc"] == 0
        info = [x.labels for x in fams["metaroce_qp_info"].samples]
        assert [i["qpn"] for i in info] == [str(qpn)]
        assert fams["metaroce_qp_rx_packets"].type == "counter"
        assert {x.labels["qpn"] for x in fams["metaroce_qp_rx_packets"].samples} == {str(qpn)}
        assert fams["metaroce_retransmitted_packets"].samples[0].value == 0
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(url.replace("/metrics", "/nope"), timeout=5)
        # labels come from the daemon's status, not from its socket's file name: the same
        # daemon found under a name that says nothing of its namespace (inode 1 is none)
        other = tmp_path / "other-run"
        other.mkdir()
        inode = os.stat(f"/var/run/netns/{ns}").st_ino
        (other / "net1--eth0.sock").symlink_to(run_dir / f"net{inode}--eth0.sock")
        once = run("exporter", "--once", env=dict(os.environ, METAROCE_RUN_DIR=str(other)))
        fams = {f.name: f for f in text_string_to_metric_families(once.stdout)}
        assert [(x.labels, x.value) for x in fams["metaroce_device_up"].samples] == \
            [({"dev": "eth0", "netns": ns}, 1)]
        assert {x.labels["qpn"] for x in fams["metaroce_qp_info"].samples} == {str(qpn)}
    finally:
        if exporter:
            exporter.send_signal(signal.SIGTERM)
            assert exporter.wait(10) == 0
        daemon.send_signal(signal.SIGTERM)
        rc = daemon.wait(20)
        s.close()
    assert rc == 0, daemon.stderr.read()
    assert _xdp_prog(ns) == "fabric_host_xdp"          # SIGTERM detached the NIC and put the
                                                       # lab's own program back
    assert not list(run_dir.iterdir())                 # socket and pid file removed


def _endpoint(run_dir, ns: str) -> int:
    """Create a daemon-held QP through the socket in run_dir of the daemon for eth0 in ns (the
    unit ran in ns, so its files carry ns's inode)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(str(run_dir / f"net{os.stat(f'/var/run/netns/{ns}').st_ino}--eth0.sock"))
    sock.sendall(b'{"op": "create_endpoint", "mr_bytes": 65536, "id": 1}\n')
    data = b""
    while not data.endswith(b"\n"):
        data += sock.recv(65536)
    sock.close()
    rep = json.loads(data)
    assert "error" not in rep, rep
    return rep["qpn"]


def test_vagrant_provisioning_steps_in_a_lab_host(lab, tmp_path):
    """vagrant/provision.sh's network and service steps, as the VMs run them, inside h2."""
    ns = lab.plan.node("h2").netns
    script = os.path.join(os.path.dirname(__file__), "..", "..", "vagrant", "provision.sh")
    env = dict(os.environ, NETNS=ns, IFACE="eth0", ADDRESS="10.0.8.2/24", MTU="2000",
               MODE="roce", ETC=str(tmp_path / "etc"), PREFIX=str(tmp_path / "root"),
               METAROCE=METAROCE)
    r = subprocess.run(["bash", script, "network", "service"], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "~ eth0: mtu " in r.stdout and "-> 2000" in r.stdout          # the dry run first
    assert "mtu 2000" in ip("-n", ns, "link", "show", "eth0")
    assert "10.0.8.2/24" in ip("-n", ns, "addr", "show", "eth0")
    assert 'mode = "roce"' in (tmp_path / "etc" / "eth0.toml").read_text()
    assert "systemd-analyze verify: ok" in r.stderr
    assert "unit installed, not started" in r.stderr
    assert (tmp_path / "root" / "etc/systemd/system/metaroce@.service").exists()
    # run again: nothing changes
    r = subprocess.run(["bash", script, "network"], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "no changes" in r.stdout, r.stdout + r.stderr
    # the final step says what it skips when perf or conformance do not exist (older installs)
    r = subprocess.run(["bash", script, "check"], env=dict(env, METAROCE="/bin/false"),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "skipped: metaroce perf is not available" in r.stderr
    assert "skipped: metaroce conformance is not available" in r.stderr
