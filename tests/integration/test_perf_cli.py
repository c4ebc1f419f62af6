"""`metaroce perf` as a user runs it: the same command on two lab hosts, the server without an
address, the client with one; perftest-shaped tables, one JSON object per side with --json,
every test of the family in both modes, and clear errors."""

import json
import os
import subprocess
import sys
import time

import pytest
from verbs_util import daemons, ip_of, lab_pair

METAROCE = [sys.executable, "-m", "metaroce.cli"]
ENV = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.dirname(__file__)))}


@pytest.fixture(scope="module")
def lab(module_lab_name):
    from metaroce.lab import core
    view = lab_pair(module_lab_name)
    try:
        with daemons(view, mode="metaroce"):
            yield view
    finally:
        core.down(module_lab_name)


def pair_run(view, test, *args, port=18700, server_args=()):
    ns1, ns2 = (view.plan.node(h).netns for h in ("h1", "h2"))
    srv = subprocess.Popen(METAROCE + ["perf", test, "--dev", "eth0", "--netns", ns2, "-p",
                                       str(port), *args, *server_args],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        time.sleep(0.8)                          # the server binds its port
        cli = subprocess.run(METAROCE + ["perf", test, ip_of(view, "h2"), "--dev", "eth0",
                                         "--netns", ns1, "-p", str(port), *args],
                             capture_output=True, text=True, env=ENV, timeout=120)
        out, err = srv.communicate(timeout=30)
    finally:
        srv.kill()
    return cli, subprocess.CompletedProcess(srv.args, srv.returncode, out, err)


@pytest.mark.parametrize("test,args", [
    ("write-bw", ["-s", "256k", "-n", "64"]), ("read-bw", ["-s", "64k", "-n", "64"]),
    ("send-bw", ["-s", "4k", "-n", "500", "-q", "2"]), ("write-lat", ["-s", "64", "-n", "100"]),
    ("read-lat", ["-s", "4k", "-n", "50"]), ("send-lat", ["-s", "64", "-n", "50"]),
    ("atomic-lat", ["-n", "50"])])
def test_every_test_json(lab, test, args):
    cli, srv = pair_run(lab, test, *args, "--json", port=18700 + hash(test) % 200)
    assert cli.returncode == 0 and srv.returncode == 0, cli.stderr + srv.stderr
    c, s = json.loads(cli.stdout), json.loads(srv.stdout)       # one document each
    assert c["role"] == "client" and s["role"] == "server" and c["mode"] == "metaroce"
    assert c["test"] == test and c["results"] and c["msg_rate"] > 0 and c["cpus"]
    if test.endswith("bw"):
        assert c["bw_avg_bps"] > 0 and c["bw_peak_bps"] >= c["bw_avg_bps"]
    else:
        assert 0 < c["lat_p50_us"] <= c["lat_p99_us"] <= c["lat_p999_us"] <= c["lat_max_us"]


def test_table_roce_mode_and_sizes(lab):
    cli, srv = pair_run(lab, "write-bw", "-a", "-n", "16", "--mode", "roce", port=18950)
    assert cli.returncode == 0, cli.stderr
    lines = cli.stdout.splitlines()
    assert any("RDMA_Write BW Test" in line for line in lines)
    assert any(line.startswith(" #bytes     #iterations    BW peak[Gb/sec]") for line in lines)
    rows = [line.split() for line in lines if line[:2].strip().isdigit()]
    assert [int(r[0]) for r in rows] == [1 << k for k in range(1, 24)]
    assert "Mode            : roce" in cli.stdout


def test_errors(lab):
    ns1 = lab.plan.node("h1").netns
    p = subprocess.run(METAROCE + ["perf", "write-bw", ip_of(lab, "h2"), "--dev", "eth0", "--netns",
                                   ns1, "-p", "18990", "--json"],
                       capture_output=True, text=True, env=ENV, timeout=60)
    assert p.returncode == 1 and "refused" in json.loads(p.stdout)["error"]
    p = subprocess.run(METAROCE + ["perf", "write-bw", "--dev", "eth0", "-s", "lots"],
                       capture_output=True, text=True, env=ENV, timeout=60)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "not a size" in p.stderr
    p = subprocess.run(METAROCE + ["perf", "write-lat", "--dev", "eth0", "-D", "3"],
                       capture_output=True, text=True, env=ENV, timeout=60)
    assert p.returncode == 2 and "-D" in p.stderr


def test_mtu_is_fitted_in_metaroce_mode_and_m_caps_it(lab):
    """CM-14: a MetaRoCE connection runs at the fitted path MTU (1408 at the lab's link MTU
    1500, over IPv4), RoCEv2 mode at the IB enum's 1024; perftest's -m caps what a side offers (the
    connection takes the smaller of both sides', so the client's -m alone suffices)."""
    for args, want in (((), 1408), (("-m", "1024"), 1024), (("-m", "1100"), 1088),
                       (("--mode", "roce"), 1024)):
        cli, srv = pair_run(lab, "write-bw", "-s", "64k", "-n", "32", "--json", *args,
                            port=18960 + want % 37)
        assert cli.returncode == 0 and srv.returncode == 0, cli.stderr + srv.stderr
        c, s = json.loads(cli.stdout), json.loads(srv.stdout)
        assert c["mtu"] == s["mtu"] == want, (args, c["mtu"], s["mtu"])
    p = subprocess.run(METAROCE + ["perf", "write-bw", "--dev", "eth0", "-m", "100"],
                       capture_output=True, text=True, env=ENV, timeout=60)
    assert p.returncode == 2 and "-m" in p.stderr and p.stderr.count("\n") <= 2
