"""The lab is not the bottleneck (issue 21): a switch forwards a frame between two ports in
XDP (a devmap redirect) when neither the arrival side nor the departure side duplicates,
reorders or is shaped — loss alone is drawn in XDP, in both directions — and through the Linux
bridge and tc otherwise; TCP takes the same path intact; the bridge's static entries keep
frames of the stack's path from flooding other ports."""

import hashlib
import os
import socket
import subprocess
import threading
import time

import pytest
from _deps import require_tool

from metaroce.lab import core
from metaroce.lab.impair import Impairment, lost_draws
from metaroce.lab.traffic import MAGIC, Receiver, run_flow, tcp_socket, udp_socket


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
    core.up(module_lab_name, "star", 3, steer=True)     # every test here holds with steering
    return core.LabView(module_lab_name)


def _ip(view, host, family=socket.AF_INET):
    itf = view.plan.node(host).iface("eth0")
    return (itf.ipv4 if family == socket.AF_INET else itf.ipv6).split("/")[0]


def _link(view, name="h1-sw1"):
    return {l["name"]: l for l in view.status()["links"]}[name]


def _impair_stats(view, direction, name="h1-sw1"):
    return _link(view, name)["counters"][direction]["impair"]


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


N = 20_000
FLUSH = 1       # _flow's trailing frame: impaired too, never counted as data


def _binomial_ok(k, n, p, sigmas=5):
    return abs(k - n * p) <= sigmas * (n * p * (1 - p)) ** 0.5


@pytest.mark.parametrize("all_traffic", [False, True], ids=["roce", "all-traffic"])
@pytest.mark.parametrize("direction", ["a-b", "b-a"])
def test_loss_only_keeps_xdp_forwarding(star, direction, all_traffic):
    """A loss-only direction keeps the XDP path: arriving frames lose their draw in the port's
    XDP program, leaving ones where the frame is redirected to the port. The loss is the asked
    one within binomial bounds, and exactly the seed's draws (matched/lost counters included);
    cleared, nothing is lost or counted any more."""
    sw = star.plan.node("sw1").netns
    src, dst = ("h1", "h2") if direction == "a-b" else ("h2", "h1")
    port = 4791 if not all_traffic else 5000
    p = 0.1
    star.impair("h1-sw1", direction,
                Impairment(loss=p, seed=23, all_traffic=all_traffic).validate())
    try:
        fwd = _link(star)["forwarding"]
        assert fwd == {"a-b": "xdp", "b-a": "xdp"}, fwd
        before, red = _impair_stats(star, direction), _redirects(sw, src)
        res = _flow(star, src, dst, N, port=port)
        after = _impair_stats(star, direction)
        assert _redirects(sw, src) - red >= res.unique     # every frame that arrived: in XDP
        # every frame (data and flush) drawn once, no more; with --all-traffic the hosts' own
        # IP frames (IPv6 MLD reports, one was seen) may be drawn too
        matched = after["matched"] - before["matched"]
        assert N + FLUSH <= matched <= N + FLUSH + (16 if all_traffic else 0), matched
        assert after["duplicated"] == before["duplicated"]
        assert res.sent == N and res.duplicates == 0 and res.late == 0, res
        assert _binomial_ok(res.lost, N, p), res
        if not all_traffic:     # nothing else is UDP 4791: the draws are the frames, in order
            assert sorted(set(range(N)) - res.seen) == lost_draws(23, p, N)
            assert after["lost"] - before["lost"] == len(lost_draws(23, p, N + FLUSH))
        else:
            assert res.lost <= after["lost"] - before["lost"] <= res.lost + FLUSH
    finally:
        star.impair("h1-sw1", direction, None)
    before, red = _impair_stats(star, direction), _redirects(sw, src)
    res = _flow(star, src, dst, 2000, port=port)
    assert res.unique == 2000 and res.lost == 0
    assert _impair_stats(star, direction) == before
    assert _redirects(sw, src) - red >= 2000
    assert _link(star)["forwarding"] == {"a-b": "xdp", "b-a": "xdp"}


def _broadcast(src_ns, dst_ns, count, port=4791):
    """Send `count` sequenced UDP datagrams to 255.255.255.255 from src (the bridge floods
    them: the stack's path); what dst received."""
    rx = udp_socket(dst_ns, socket.AF_INET, ("", port), rcvbuf=16 << 20)
    tx = udp_socket(src_ns, socket.AF_INET)
    tx.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
    tx.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, b"eth0")
    recv = Receiver(rx, socket.AF_INET)
    recv.start()
    recv.ready.wait()
    try:
        for seq in range(count):
            tx.sendto(MAGIC.to_bytes(4, "big") + seq.to_bytes(8, "big") + bytes(52),
                      ("255.255.255.255", port))
            if seq % 64 == 63:
                time.sleep(0.0005)
        recv.join(timeout=10)
    finally:
        tx.close()
        rx.close()
    recv.result.sent = count
    return recv.result


@pytest.mark.parametrize("direction", ["a-b", "b-a"])
def test_loss_is_drawn_once_on_either_path(star, direction):
    """Frames of a loss-only direction that still cross the bridge (broadcast) are drawn by
    the tc path (b-a) or already were in XDP (a-b): each frame of the direction exactly once,
    whichever path it takes."""
    p = 0.1
    star.impair("h1-sw1", direction, Impairment(loss=p, seed=4).validate())
    try:
        before = _impair_stats(star, direction)
        if direction == "a-b":      # h1's frames arrive at sw1: unicast to h2, broadcast to all
            uni = _flow(star, "h1", "h2", 4000)
            bc = _broadcast(star.plan.node("h1").netns, star.plan.node("h3").netns, 2000)
        else:                       # frames leaving toward h1: redirected from h2, flooded from h3
            uni = _flow(star, "h2", "h1", 4000)
            bc = _broadcast(star.plan.node("h3").netns, star.plan.node("h1").netns, 2000)
        after = _impair_stats(star, direction)
    finally:
        star.impair("h1-sw1", direction, None)
    assert after["matched"] - before["matched"] == 4000 + FLUSH + 2000
    lost = after["lost"] - before["lost"]
    assert uni.lost + bc.lost <= lost <= uni.lost + bc.lost + FLUSH
    assert uni.duplicates == 0 and bc.duplicates == 0
    assert _binomial_ok(uni.lost, 4000, p) and _binomial_ok(bc.lost, 2000, p), (uni, bc)


def test_tcp_over_a_lossy_link_stays_in_xdp(star):
    """TCP in the comparisons takes the same path: an all-traffic loss on both directions of
    h1's link keeps it in XDP, and TCP recovers every byte."""
    sw = star.plan.node("sw1").netns
    star.impair("h1-sw1", "both", Impairment(loss=0.01, seed=3, all_traffic=True).validate())
    try:
        before = _impair_stats(star, "a-b")
        r1, r3 = _redirects(sw, "h1"), _redirects(sw, "h3")
        sent, received = _tcp_transfer(star, "h1", "h3", socket.AF_INET, 4 << 20)
        assert sent == received
        assert _impair_stats(star, "a-b")["lost"] > before["lost"]
        assert _redirects(sw, "h1") - r1 > 4 * 1024 * 1024 / 1500 / 2
        assert _redirects(sw, "h3") - r3 > 100       # the ACKs, toward the lossy egress
    finally:
        star.impair("h1-sw1", "both", None)


def _neigh(ns, family, addr):
    out = subprocess.run(["ip", "netns", "exec", ns, "ip", family, "neigh", "show", addr,
                          "dev", "eth0"], capture_output=True, text=True, check=True).stdout
    return out.strip()


@pytest.mark.parametrize("family", [socket.AF_INET, socket.AF_INET6], ids=["arp", "nd"])
def test_neighbour_discovery_crosses_a_lossy_link(star, family):
    """ARP and IPv6 neighbour discovery are never impaired, also with every IP frame lost on
    both directions: h1 resolves h2 while its pings are all dropped."""
    ns = star.plan.node("h1").netns
    fam = "-4" if family == socket.AF_INET else "-6"
    addr = _ip(star, "h2", family)
    mac = star.plan.node("h2").iface("eth0").mac
    star.impair("h1-sw1", "both", Impairment(loss=1.0, seed=1, all_traffic=True).validate())
    try:
        subprocess.run(["ip", "netns", "exec", ns, "ip", fam, "neigh", "del", addr, "dev", "eth0"],
                       check=True)
        ping = subprocess.run(["ip", "netns", "exec", ns, "ping", fam, "-c", "2", "-W", "1", addr],
                              capture_output=True, text=True)
        assert ping.returncode != 0, "every echo request should have been dropped"
        entry = _neigh(ns, fam, addr)
        assert mac.lower() in entry.lower() and "FAILED" not in entry, entry
    finally:
        star.impair("h1-sw1", "both", None)
        subprocess.run(["ip", "netns", "exec", ns, "ip", fam, "neigh", "replace", addr, "lladdr",
                        mac, "dev", "eth0", "nud", "permanent"], check=True)
    assert "PERMANENT" in _neigh(ns, fam, addr)
    assert subprocess.run(["ip", "netns", "exec", ns, "ping", fam, "-c", "1", "-W", "2", addr],
                          capture_output=True).returncode == 0


@pytest.mark.parametrize("kind", ["dup", "loss+dup", "loss+reorder"])
@pytest.mark.parametrize("direction", ["a-b", "b-a"])
def test_dup_or_reorder_takes_the_stack_then_xdp_again(star, direction, kind):
    """Duplication and reordering live in tc: while h1's link duplicates or reorders in a
    direction, every frame of that direction (RoCE or not) goes through the bridge and tc, and
    loss set with them is still drawn once per frame; cleared, XDP again."""
    sw = star.plan.node("sw1").netns
    src, dst = ("h1", "h2") if direction == "a-b" else ("h2", "h1")
    port = src                     # the switch port the frames arrive on
    loss = 0.1 if "loss" in kind else 0.0
    dup = 0.3 if "dup" in kind else 0.0
    reorder = 0.1 if "reorder" in kind else 0.0
    star.impair("h1-sw1", direction,
                Impairment(loss=loss, dup=dup, reorder=reorder, seed=5).validate())
    try:
        assert _link(star)["forwarding"][direction] == "stack"
        before, red = _impair_stats(star, direction), _redirects(sw, port)
        roce = _flow(star, src, dst, 1000)
        other = _flow(star, src, dst, 200, port=5000)
        after = _impair_stats(star, direction)
        assert _redirects(sw, port) == red
        assert after["matched"] - before["matched"] == 1000 + FLUSH
        assert abs(roce.duplicates / 1000 - dup * (1 - loss)) < 0.1, roce
        assert abs(roce.lost / 1000 - loss) < 0.05, roce
        if reorder:
            assert abs(roce.late / 1000 - reorder * (1 - loss)) < 0.05, roce
        assert other.unique == 200 and other.duplicates == 0
    finally:
        star.impair("h1-sw1", direction, None)
    assert _link(star)["forwarding"][direction] == "xdp"
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


def _steer(view) -> dict:
    from metaroce.lab import fabric
    with fabric.Fabric(view.name) as fab:
        return fab.steer_stats()


def _on_cpu(cpu, fn):
    """fn() in a thread pinned to one CPU (the sender's CPU is where veth runs XDP)."""
    out = {}

    def body():
        os.sched_setaffinity(0, {cpu})            # this thread only
        out["r"] = fn()
    t = threading.Thread(target=body)
    t.start()
    t.join(120)
    return out["r"]


def test_a_switch_forwards_on_the_next_cpu(star):
    """Issue 21 items 3 and 5: on veth, XDP runs on the CPU that transmits, so without steering
    the sender's CPU also ran the switch and the receiving host for every frame. A switch
    port hands each frame it forwards in XDP to the next CPU (cpumap), which sends it on:
    frames sent from CPU 0 are forwarded by CPU 1, and every one arrives."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: nothing to steer to")
    assert star.status()["steering"]["cpus"] >= 2
    before = _steer(star)
    res = _on_cpu(0, lambda: _flow(star, "h1", "h2", n=2000, port=4998))
    after = _steer(star)
    handed = [a - b for a, b in zip(after["handed"], before["handed"])]
    forwarded = [a - b for a, b in zip(after["forwarded"], before["forwarded"])]
    assert res.unique == 2000 and res.duplicates == 0
    assert handed[0] >= 2000 and forwarded[1] >= 2000, (handed, forwarded)


def test_no_steer_keeps_forwarding_on_the_arrival_cpu(lab_name):
    core.up(lab_name, "pair")                      # the default
    view = core.LabView(lab_name)
    assert view.status()["steering"] == "off" and view.record["forwarding"] == "xdp"
    res = run_flow(view.plan.node("h1").netns, view.plan.node("h2").netns, _ip(view, "h2"), 300,
                   flush=1)
    assert res.unique == 300
    st = _steer(view)
    assert sum(st["handed"]) == sum(st["forwarded"]) == 0
