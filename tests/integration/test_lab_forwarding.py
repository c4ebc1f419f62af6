"""The lab is not the bottleneck (issue 21): a switch forwards a frame between two ports in
XDP (a devmap redirect) when neither the arrival side nor the departure side is impaired or
shaped, and through the Linux bridge and tc otherwise; TCP takes the same path intact; the
bridge's static entries keep frames of the stack's path from flooding other ports."""

import hashlib
import os
import socket
import subprocess
import threading

import pytest
from _deps import require_tool

from metaroce.lab import core
from metaroce.lab.impair import Impairment
from metaroce.lab.traffic import run_flow, tcp_socket


def _redirects(ns: str, iface: str) -> int:
    """Frames the interface's XDP program redirected (veth's per-queue counters)."""
    require_tool("ethtool", "veth's XDP counters")
    out = subprocess.run(["ip", "netns", "exec", ns, "ethtool", "-S", iface], capture_output=True,
                         text=True, timeout=30, check=True).stdout
    return sum(int(line.split(":")[1]) for line in out.splitlines()
               if line.strip().startswith("rx_queue_") and
               line.split(":")[0].endswith("_xdp_redirect"))


@pytest.fixture(scope="module")
def star(module_lab_name):
    core.up(module_lab_name, "star", 3)
    return core.LabView(module_lab_name)


def _ip(view, host, family=socket.AF_INET):
    itf = view.plan.node(host).iface("eth0")
    return (itf.ipv4 if family == socket.AF_INET else itf.ipv6).split("/")[0]


def _rx(view, host):
    link = {l["name"]: l for l in view.status()["links"]}[f"{host}-sw1"]
    return link["counters"]["b-a"]["rx_packets"]


def _flow(view, src, dst, n=400, **kw):
    return run_flow(view.plan.node(src).netns, view.plan.node(dst).netns, _ip(view, dst), n,
                    flush=1, **kw)


def test_unimpaired_ports_forward_in_xdp_and_nothing_floods(star):
    sw = star.plan.node("sw1").netns
    assert star.record["forwarding"] == "xdp"
    r1, r2, h3 = _redirects(sw, "h1"), _redirects(sw, "h2"), _rx(star, "h3")
    res = _flow(star, "h1", "h2")
    back = _flow(star, "h2", "h1", port=5000)
    assert res.unique == 400 and back.unique == 400
    assert _redirects(sw, "h1") - r1 >= 401 and _redirects(sw, "h2") - r2 >= 401
    # 800 unicast frames went between h1 and h2; h3 may see the hosts' own broadcast and
    # multicast meanwhile (ARP, IPv6 neighbour discovery and MLD: 5 were seen once), not a flood
    assert _rx(star, "h3") - h3 <= 16, "frames between h1 and h2 reached h3"


def _tcp_transfer(view, src, dst, family, nbytes=16 << 20) -> tuple[str, str]:
    """Send nbytes of random data over one TCP connection; (sent digest, received digest)."""
    data = os.urandom(nbytes)
    srv = tcp_socket(view.plan.node(dst).netns, family)
    srv.bind(("", 0))
    srv.listen(1)
    srv.settimeout(20)
    got = hashlib.sha256()

    def serve():
        conn, _ = srv.accept()
        conn.settimeout(20)
        with conn:
            while chunk := conn.recv(1 << 20):
                got.update(chunk)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    cli = tcp_socket(view.plan.node(src).netns, family)
    try:
        cli.settimeout(20)
        cli.connect((_ip(view, dst, family), srv.getsockname()[1]))
        cli.sendall(data)
    finally:
        cli.close()
        t.join(timeout=30)
        srv.close()
    return hashlib.sha256(data).hexdigest(), got.hexdigest()


@pytest.mark.parametrize("family", [socket.AF_INET, socket.AF_INET6])
def test_tcp_takes_the_xdp_path_intact(star, family):
    """A redirected frame travels as bytes: the sending host must have finished its checksum
    (the lab turns transmit checksum offload off on host ends), or TCP stalls."""
    sw = star.plan.node("sw1").netns
    before = _redirects(sw, "h1")
    sent, received = _tcp_transfer(star, "h1", "h3", family)
    assert sent == received
    assert _redirects(sw, "h1") - before > 16 * 1024 * 1024 / 1500 / 2


@pytest.mark.parametrize("direction", ["a-b", "b-a"])
def test_an_impaired_direction_takes_the_stack_then_xdp_again(star, direction):
    """Duplication and reordering live in tc: while h1's link is impaired in a direction, every
    frame of that direction (RoCE or not) goes through the bridge and tc; cleared, XDP again."""
    sw = star.plan.node("sw1").netns
    src, dst = ("h1", "h2") if direction == "a-b" else ("h2", "h1")
    port = src                     # the switch port the frames arrive on
    star.impair("h1-sw1", direction, Impairment(dup=0.3, seed=5).validate())
    try:
        before = _redirects(sw, port)
        roce = _flow(star, src, dst, 1000)
        other = _flow(star, src, dst, 200, port=5000)
        assert _redirects(sw, port) == before
        assert abs(roce.duplicates / 1000 - 0.3) < 0.1, roce
        assert other.unique == 200 and other.duplicates == 0
    finally:
        star.impair("h1-sw1", direction, None)
    before = _redirects(sw, port)
    res = _flow(star, src, dst, 200)
    assert res.unique == 200 and res.duplicates == 0
    assert _redirects(sw, port) - before >= 201


def test_a_shaped_lab_forwards_through_the_bridge(lab_name):
    core.up(lab_name, "pair", rate="1gbit")
    view = core.LabView(lab_name)
    assert view.record["forwarding"] == "stack"
    sw = view.plan.node("sw1").netns
    before = _redirects(sw, "h1")
    res = run_flow(view.plan.node("h1").netns, view.plan.node("h2").netns, _ip(view, "h2"), 200,
                   flush=1)
    assert res.unique == 200 and _redirects(sw, "h1") == before
