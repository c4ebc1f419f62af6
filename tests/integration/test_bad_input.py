"""Bad input against real devices (issue 18, section 5): a number that is not finite never starts
a daemon; a start that fails at any point after the XDP program was attached leaves no process,
no attachment and no socket or pid file; the daemon refuses NaN in a request; `status` of a
daemon that answers an error exits non-zero; `exporter --once --json` is one JSON document."""

import contextlib
import io
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest
from pyroute2 import netns as pr_netns
from verbs_util import lab_pair

from metaroce.cli import main
from metaroce.errors import MetaroceError
from metaroce.fastpath.xsk import XskSocket
from metaroce.nic import daemon as d
from metaroce.nic import devid
from metaroce.nic.credit import CreditConfig

METAROCE = [sys.executable, "-m", "metaroce.cli"]
ENV = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.dirname(__file__)))}


def cli(*args):
    return subprocess.run(METAROCE + list(args), capture_output=True, text=True, env=ENV,
                          timeout=120)


@pytest.fixture(scope="module")
def lab(module_lab_name):
    from metaroce.lab import core
    view = lab_pair(module_lab_name)
    try:
        yield view
    finally:
        for h in ("h1", "h2"):                  # whatever a failing test left running
            dev = d.DeviceId("eth0", view.plan.node(h).netns)
            if d.running_pid(dev):
                d.stop(dev)
        core.down(module_lab_name)


def xdp_prog(ns: str) -> str | None:
    out = subprocess.run(["ip", "-n", ns, "-d", "link", "show", "eth0"], capture_output=True,
                         text=True, check=True).stdout
    m = re.search(r"prog/xdp id \d+ name (\S+)", out)
    return m.group(1) if m else None


def processes_in(ns: str) -> list[int]:
    """Every process whose network namespace is ns."""
    ino = os.stat(f"/run/netns/{ns}").st_ino
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat(f"/proc/{pid}/ns/net").st_ino == ino:
                out.append(int(pid))
        except OSError:
            pass
    return out


LAB_HOST_PROG = "fabric_host_xdp"      # what the lab attaches to a host's port


def assert_nothing_left(ns: str) -> None:
    """No process in the namespace, the NIC's program gone and the lab's put back, no
    socket, pid or restore file."""
    dev = d.DeviceId("eth0", ns)
    assert processes_in(ns) == [], "a process still runs in the device's namespace"
    assert xdp_prog(ns) == LAB_HOST_PROG, f"XDP on eth0: {xdp_prog(ns)}"
    assert d.running_pid(dev) is None
    for path in (dev.sock_path, dev.pid_path, dev.restore_path):
        assert not os.path.exists(path), path


@contextlib.contextmanager
def stopped_afterwards(dev):
    """Whatever the code under test did (old code left a daemon running), stop it."""
    try:
        yield
    finally:
        if d.running_pid(dev):
            d.stop(dev)


@pytest.mark.parametrize("args", [
    ["--mode", "metaroce", "--credit-rtt-us", "nan"], ["--credit-rtt-us", "inf"],
    ["--credit-rtt-us", "-inf"], ["--mode", "metaroce", "--link-rate", "1e400gbit"],
    ["--link-rate", "nan"]])
def test_up_with_a_number_that_is_not_finite_starts_nothing(lab, args):
    """`up --mode metaroce --credit-rtt-us nan` printed KeyError: 'xdp_mode' and left a daemon
    running with its program attached."""
    ns = lab.plan.node("h2").netns
    with stopped_afterwards(d.DeviceId("eth0", ns)):
        p = cli("up", "--dev", "eth0", "--netns", ns, *args)
        assert p.returncode == 2, p.stderr
        assert p.stderr.count("\n") == 1 and p.stderr.startswith("metaroce: error: "), p.stderr
        assert "KeyError" not in p.stderr and "Traceback" not in p.stderr
        pj = cli("up", "--dev", "eth0", "--netns", ns, *args, "--json")
        assert pj.returncode == 2 and list(json.loads(pj.stdout)) == ["error"]
        assert_nothing_left(ns)


def test_a_nan_credit_config_is_refused_before_anything_is_attached(lab):
    ns = lab.plan.node("h2").netns
    dev = d.DeviceId("eth0", ns)
    cfg = CreditConfig()
    cfg.base_rtt_s = math.nan               # a library caller, past the CLI's checks
    with stopped_afterwards(dev):
        with pytest.raises(MetaroceError, match="base_rtt_s"):
            d.start_background(dev, "metaroce", cfg)
        assert_nothing_left(ns)


def test_a_daemon_that_fails_after_attaching_is_stopped_and_cleaned_up(lab, monkeypatch):
    """start_background asks the fresh daemon for its status. When that fails (here the daemon
    is killed the moment it said it was ready, as a crash right after start would), the start
    fails and leaves nothing: the child reaped, the program gone and the lab's put back, no
    socket or pid file. (The NaN config once made this status fail.)"""
    ns = lab.plan.node("h2").netns
    dev = d.DeviceId("eth0", ns)
    real = d.request
    killed = []

    def crash_then_ask(target, req, *a, **kw):
        if req.get("op") == "status" and not killed:
            pid = d.running_pid(target)
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
            while os.path.exists(f"/proc/{pid}") and open(f"/proc/{pid}/stat").read().split()[2] != "Z":
                time.sleep(0.01)
        return real(target, req, *a, **kw)
    monkeypatch.setattr(d, "request", crash_then_ask)
    with stopped_afterwards(dev):
        with pytest.raises(MetaroceError, match="started but failed; it was stopped"):
            d.start_background(dev, "metaroce")
        assert killed and not os.path.exists(f"/proc/{killed[0]}"), "the child was not reaped"
        assert_nothing_left(ns)


def test_a_start_that_fails_inside_the_daemon_leaves_nothing(lab):
    """A failure in the daemon after its program is attached (here: another AF_XDP socket
    holds the device's queue 0, so the daemon's own bind fails with EBUSY) detaches it and
    removes whatever the start made."""
    ns = lab.plan.node("h2").netns
    dev = d.DeviceId("eth0", ns)
    holder = _hold_queue0(ns)
    try:
        with stopped_afterwards(dev):
            with pytest.raises(MetaroceError, match="AF_XDP socket .* busy"):
                d.start_background(dev, "roce")
            assert_nothing_left(ns)
    finally:
        holder.close()
    st = d.start_background(dev, "roce")        # the device itself is fine
    try:
        assert xdp_prog(ns) == "nic_rx" and st["pid"] in processes_in(ns)
    finally:
        d.stop(dev)


def _hold_queue0(ns: str) -> XskSocket:
    """An AF_XDP socket on the device's queue 0. The kernel releases the queue of a socket
    that was closed (a daemon that just stopped) a few milliseconds later: wait for that."""
    deadline = time.monotonic() + 5
    pr_netns.pushns(ns)
    try:
        while True:
            try:
                return XskSocket(socket.if_nametoindex("eth0"))
            except MetaroceError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
    finally:
        pr_netns.popns()


def _raw_request(dev, line: bytes) -> dict:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(dev.sock_path)
    s.sendall(line)
    data = b""
    while not data.endswith(b"\n"):
        data += s.recv(65536)
    s.close()
    return json.loads(data)


def test_the_daemon_refuses_nan_and_exporter_once_json_is_one_document(lab):
    ns = lab.plan.node("h1").netns
    dev = d.DeviceId("eth0", ns)
    d.start_background(dev, "metaroce")
    try:
        for const in ("NaN", "Infinity", "-Infinity"):
            rep = _raw_request(dev, b'{"op": "create_cq", "depth": %s, "id": 7}\n' % const.encode())
            assert rep["id"] == 7 and f"{const} is not a number a request may carry" in rep["error"]
        assert d.request(dev, {"op": "status"})[0]["dev"] == "eth0"      # still serving

        p = cli("exporter", "--once", "--json", "--dev", "eth0", "--netns", ns)
        assert p.returncode == 0, p.stderr
        doc = json.loads(p.stdout)                 # one document, not the text format
        fams = {f["name"]: f for f in doc["families"]}
        up = fams["metaroce_device_up"]
        assert up["type"] == "gauge" and up["samples"] == [
            {"name": "metaroce_device_up", "labels": {"dev": "eth0", "netns": ns}, "value": 1}]
        drops = fams["metaroce_rx_drops"]
        assert drops["type"] == "counter" and drops["help"]
        assert {s["labels"]["reason"] for s in drops["samples"]} >= {"bad_icrc", "unknown_qp"}
        assert all(s["name"] == "metaroce_rx_drops_total" and isinstance(s["value"], int)
                   for s in drops["samples"])
        text = cli("exporter", "--once", "--dev", "eth0", "--netns", ns)
        assert text.returncode == 0 and text.stdout.startswith("# HELP metaroce_")
    finally:
        d.stop(dev)


class OneErrorReply:
    """Where a daemon's socket would be, something that answers every request with an error
    (as the daemon did to `status` when a NaN config broke its status)."""

    def __init__(self, path: str):
        import threading  # noqa: PLC0415
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(4)
        threading.Thread(target=self._serve, daemon=True).start()

    def close(self):
        try:
            self.sock.shutdown(socket.SHUT_RDWR)        # wakes the accept() of the thread
        except OSError:
            pass
        self.sock.close()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                data = b""
                while not data.endswith(b"\n"):
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                conn.sendall(b'{"error": "cannot convert float NaN to integer"}\n')


@pytest.mark.parametrize("argv", [["status"], ["stats"], ["qp", "list"]])
def test_commands_exit_non_zero_when_the_daemon_answers_an_error(tmp_path, monkeypatch, argv):
    """`status` printed KeyError: 'dev'; `status --json` printed the daemon's error and exited
    0. Every command that asks a daemon now ends in one line (or {"error"}) and exit 1."""
    monkeypatch.setattr(devid, "RUN_DIR", str(tmp_path))
    srv = OneErrorReply(d.DeviceId("mrfz0", None).sock_path)
    try:
        for as_json in (False, True):
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = main(argv + ["--dev", "mrfz0"] + (["--json"] if as_json else []))
            assert code == 1
            if as_json:
                assert json.loads(out.getvalue()) == {
                    "error": f"{'list_endpoints' if argv[0] == 'qp' else 'status'} on mrfz0: "
                             "cannot convert float NaN to integer"}
            else:
                assert out.getvalue() == "" and err.getvalue().count("\n") == 1
                assert "cannot convert float NaN to integer" in err.getvalue()
                assert "KeyError" not in err.getvalue()
    finally:
        srv.close()
