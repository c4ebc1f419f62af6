"""Every topology comes up, its hosts reach each other over IPv4 and IPv6, ECMP spreads flows
over both spines, and `down` leaves nothing behind."""

import os
import socket

import pytest

from metaroce.lab import core, fabric, netdev, state
from metaroce.lab.traffic import run_flow


def _addr(view, host, family):
    itf = view.plan.node(host).iface("eth0")
    return (itf.ipv4 if family == socket.AF_INET else itf.ipv6).split("/")[0]


def _echo(view, a, b, family):
    res = run_flow(view.plan.node(a).netns, view.plan.node(b).netns, _addr(view, b, family), 50,
                   family=family, flush=2)
    assert res.unique == 50, f"{a}->{b} IPv{4 if family == socket.AF_INET else 6}: {res}"


@pytest.mark.parametrize("topology,hosts", [("pair", None), ("star", 4), ("leaf-spine", 4)])
def test_topology_up_reach_down(lab_name, topology, hosts):
    rec = core.up(lab_name, topology, hosts)
    view = core.LabView(lab_name)
    doc = view.status()
    assert doc["name"] == lab_name and doc["topology"] == topology
    names = [h["name"] for h in doc["hosts"] if h["role"] == "host"]
    assert len(names) == (hosts or 2)
    roles = {h["role"] for h in doc["hosts"]}
    assert roles == ({"host", "switch"} if topology != "leaf-spine" else {"host", "leaf", "spine"})
    for h in doc["hosts"]:
        for i in h["ifaces"]:
            assert set(i) >= {"name", "mac", "ipv4", "ipv6", "mtu"}
    for l in doc["links"]:
        assert set(l) >= {"name", "a", "b", "rate", "impair"}
    # every link end carries an XDP program (XDP_TX/redirect on veth needs one on the peer)
    for n in view.plan.nodes:
        for itf in n.ifaces:
            att = fabric.xdp_attached(n.netns, itf.name)
            assert att and att["mode"] == rec["xdp_mode"] == "native", (n.name, itf.name, att)
    pairs = [(names[0], names[-1]), (names[-1], names[0])]
    if len(names) > 2:
        pairs.append((names[1], names[2]))
    for family in (socket.AF_INET, socket.AF_INET6):
        for a, b in pairs:
            _echo(view, a, b, family)
    # switch-side counters saw the traffic
    first = view.plan.link(names[0])
    c = view.status()["links"][[l.name for l in view.plan.links].index(first.name)]["counters"]
    assert c["a-b"]["rx_packets"] >= 100 and c["b-a"]["tx_packets"] >= 100

    namespaces = [n.netns for n in view.plan.nodes]
    core.down(lab_name)
    left = set(netdev.list_netns()) & set(namespaces)
    assert not left, f"namespaces left behind: {left}"
    assert not os.path.exists(fabric.pin_dir(lab_name))
    assert lab_name not in state.names()


def test_leaf_spine_ecmp_uses_both_spines(lab_name):
    core.up(lab_name, "leaf-spine", 4)
    view = core.LabView(lab_name)
    h1, h4 = view.plan.node("h1"), view.plan.node("h4")
    assert view.plan.link("h1").b[0] == "leaf1" and view.plan.link("h4").b[0] == "leaf2"
    for sport in range(40000, 40016):
        res = run_flow(h1.netns, h4.netns, _addr(view, "h4", socket.AF_INET), 20, sport=sport, flush=1)
        assert res.unique == 20
    links = {l["name"]: l["counters"] for l in view.status()["links"]}
    up1 = links["leaf1-spine1"]["a-b"]["rx_packets"]
    up2 = links["leaf1-spine2"]["a-b"]["rx_packets"]
    assert up1 >= 20 and up2 >= 20, f"16 source ports hashed onto one spine: {up1} vs {up2}"
    assert up1 + up2 >= 16 * 21


def test_down_cleans_up_after_a_half_built_lab(lab_name):
    from metaroce.lab.plan import netns_name
    from pyroute2 import netns
    for node in ("h1", "sw1", "build"):
        netns.create(netns_name(lab_name, node))
    os.makedirs(fabric.pin_dir(lab_name), exist_ok=True)
    out = core.down(lab_name)
    assert len(out["removed_netns"]) == 3
    assert not [ns for ns in netdev.list_netns() if ns.startswith(f"mr-{lab_name}-")]
    assert not os.path.exists(fabric.pin_dir(lab_name))

