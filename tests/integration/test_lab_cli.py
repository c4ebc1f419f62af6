"""The `metaroce lab` / `metaroce demo` command-line contract, run as a user would."""

import json
import os
import subprocess
import sys

import pytest

METAROCE = [sys.executable, "-m", "metaroce.cli"]


def run(*args, user=None, check=False):
    cmd = METAROCE + list(args)
    if user:
        cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups"] + cmd
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.dirname(__file__)))}
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    if check:
        assert p.returncode == 0, p.stderr
    return p


def test_lab_up_status_exec_down_via_cli(lab_name):
    up = run("lab", "up", "--name", lab_name, "--json", check=True)
    doc = json.loads(up.stdout)
    assert doc["name"] == lab_name and doc["topology"] == "pair"
    st = run("lab", "status", "--name", lab_name, "--json", check=True)
    doc = json.loads(st.stdout)        # exactly one JSON document
    assert [h["name"] for h in doc["hosts"]] == ["h1", "h2", "sw1"]
    h1 = doc["hosts"][0]
    assert h1["role"] == "host" and h1["netns"] == f"mr-{lab_name}-h1"
    assert h1["ifaces"][0]["ipv4"] == "10.0.0.1/24" and h1["ifaces"][0]["ipv6"].endswith("/64")
    assert {l["name"] for l in doc["links"]} == {"h1-sw1", "h2-sw1"}
    ex = run("lab", "exec", "--name", lab_name, "h1", "--", "cat", "/proc/net/dev", check=True)
    assert "eth0" in ex.stdout and "h1" not in ex.stdout.split("eth0")[0]
    imp = run("lab", "impair", "--name", lab_name, "h1", "--loss", "0.05", "--json", check=True)
    assert json.loads(imp.stdout)["impair"]["a-b"]["loss"] == 0.05
    bad = run("lab", "impair", "--name", lab_name, "h1", "--loss", "1.5", "--json")
    assert bad.returncode == 2 and "error" in json.loads(bad.stdout)
    down = run("lab", "down", "--name", lab_name, "--json", check=True)
    assert json.loads(down.stdout)["removed"][0]["name"] == lab_name


def test_errors_are_one_line_and_non_zero():
    p = run("lab", "status", "--name", "nosuchlab")
    assert p.returncode == 1 and p.stderr.count("\n") == 1 and "Traceback" not in p.stderr
    p = run("lab", "status", "--name", "nosuchlab", "--json")
    assert p.returncode == 1 and "no lab" in json.loads(p.stdout)["error"]
    p = run("lab", "up", "--topology", "ring")
    assert p.returncode == 2 and p.stderr.count("\n") == 1
    p = run("lab", "up", "--topology", "pair", "--hosts", "3", "--json")
    assert p.returncode == 2 and "exactly 2" in json.loads(p.stdout)["error"]


def test_not_root_says_sudo():
    p = run("lab", "up", "--name", "nobodylab", user=65534)
    assert p.returncode == 2, p.stderr
    assert "sudo" in p.stderr and p.stderr.count("\n") == 1


def test_demo_json():
    p = run("demo", "--json")
    doc = json.loads(p.stdout)          # exactly one JSON document; the progress bar is on stderr
    assert doc["ok"] is True and p.returncode == 0, p.stderr
    assert doc["xdp_mode"] == "native" and doc["mode"] == "metaroce"
    assert doc["write_ok"] and doc["read_ok"] and doc["send_ok"] and doc["atomic_ok"]
    # 256 MiB written and read back, 64 SENDs of 64 KiB, 101 atomics of 8 bytes
    assert doc["bytes_verified"] == 2 * (256 << 20) + 64 * 65536 + 8 * 101
    assert doc["write_bw_bps"] > 0 and doc["read_bw_bps"] > 0
    h1, h2 = doc["counters"]["h1"], doc["counters"]["h2"]
    assert h2["read_request"] == 256 and h2["atomic"] == h2["tx_atomic_ack"] == 101
    assert h1["bad_icrc"] == h2["bad_icrc"] == 0 and doc["nic_detached_after_down"]


@pytest.mark.parametrize("mode", ["metaroce", "roce"])
def test_demo_on_jumbo_frames(mode):
    """Issue 21: `metaroce demo --mtu 9000` — the NIC's frags-aware program runs natively on
    the 9000-byte lab (before: `bpf_link_create ... Device or resource busy`), both ends agree
    on the largest path MTU their devices take (RoCEv2: 4096, the IB enum's largest; MetaRoCE:
    the fitted 8064 over the lab's IPv4, CM-14; a frame of either leaves as two descriptors of
    4 KiB UMEM chunks, XDP_USE_SG) and every byte is verified: WRITE, SEND and READ-response packets of that
    payload arrive whole and are placed."""
    p = run("demo", "--mtu", "9000", "--mode", mode, "--json")
    doc = json.loads(p.stdout)
    assert doc["ok"] is True and p.returncode == 0, p.stderr
    assert doc["lab_mtu"] == 9000 and doc["xdp_mode"] == "native" and doc["mode"] == mode
    pm = 8064 if mode == "metaroce" else 4096
    assert doc["pmtu"] == pm
    assert doc["write_ok"] and doc["read_ok"] and doc["send_ok"] and doc["atomic_ok"]
    h1, h2 = doc["counters"]["h1"], doc["counters"]["h2"]
    assert h1["bad_icrc"] == h2["bad_icrc"] == h1["malformed"] == h2["malformed"] == 0
    # 256 MiB of WRITE (1 MiB messages) and 64 SENDs of 64 KiB placed at h2, 256 MiB of READ
    # responses (and the 101 atomic ACKs) at h1, in packets of the path MTU (retransmits are few)
    per_msg, per_send = -(-(1 << 20) // pm), -(-65536 // pm)
    for got, want in ((h2["placed"], 256 * per_msg + 64 * per_send),
                      (h1["placed"], 256 * per_msg + 101)):
        assert want <= got < want * 1.25, (got, want)
    x1, x2 = doc["xsk"]["h1"], doc["xsk"]["h2"]
    assert x1["sg"] and x1["frame_cap"] == 8192 and x1["kern_tx_invalid_descs"] == 0
    # frames of more than one 4 KiB chunk: every packet but a short last one of a message
    def multi(n):
        return n // pm + (n % pm > 4000)
    assert x1["tx_multi"] >= 256 * multi(1 << 20) + 64 * multi(65536)   # WRITEs, SENDs
    assert x2["tx_multi"] >= 256 * multi(1 << 20)                       # READ responses
    assert x1["tx_queued"] == x1["tx_completed"] and x2["tx_queued"] == x2["tx_completed"]
