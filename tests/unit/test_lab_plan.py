"""Topology planning: names, links, address plans, routes, neighbours, argument checks."""

import ipaddress

import pytest

from metaroce.errors import UsageError
from metaroce.lab.impair import Impairment, threshold
from metaroce.lab.plan import LabPlan, parse_rate, plan_lab


def _all_ifaces(plan):
    return [(n, i) for n in plan.nodes for i in n.ifaces]


def test_pair_is_two_hosts_through_one_switch():
    p = plan_lab("x", "pair")
    assert [(n.name, n.role) for n in p.nodes] == [("h1", "host"), ("h2", "host"), ("sw1", "switch")]
    assert [(l.name, l.a, l.b) for l in p.links] == [
        ("h1-sw1", ("h1", "eth0"), ("sw1", "h1")), ("h2-sw1", ("h2", "eth0"), ("sw1", "h2"))]
    assert p.node("h1").iface("eth0").ipv4 == "10.0.0.1/24"
    assert p.node("h2").iface("eth0").ipv6 == "fd00:4d52::2/64"
    assert all(i.bridge == "br0" for i in p.node("sw1").ifaces)
    assert p.node("h1").netns == "mr-x-h1"


def test_star_neighbours_are_static_and_complete():
    p = plan_lab("s", "star", hosts=5)
    for h in p.hosts:
        ips = {nb.ip for nb in h.neighbours}
        others = [o for o in p.hosts if o is not h]
        assert len(ips) == 2 * len(others)
        for o in others:
            assert o.iface("eth0").ipv4.split("/")[0] in ips


@pytest.mark.parametrize("k", [2, 3, 4, 7])
def test_leaf_spine_plan(k):
    p = plan_lab("ls", "leaf-spine", hosts=k)
    roles = [n.role for n in p.nodes]
    assert roles.count("host") == k and roles.count("leaf") == 2 and roles.count("spine") == 2
    assert len(p.links) == k + 4
    for L in (1, 2):
        leaf = p.node(f"leaf{L}")
        ecmp = [r for r in leaf.routes if len(r.gateways) == 2]
        assert {r.family for r in ecmp} == {4, 6}
        for r in ecmp:   # both gateways are the two spines' ends of this leaf's uplinks
            spine_ips = {p.node(f"spine{S}").iface(leaf.name).ipv4.split("/")[0] for S in (1, 2)} | \
                        {p.node(f"spine{S}").iface(leaf.name).ipv6.split("/")[0] for S in (1, 2)}
            assert set(r.gateways) <= spine_ips
    # a host's gateway is its leaf's bridge, on its own subnet
    for h in p.hosts:
        leaf = p.node(p.link(h.name).b[0])
        net = ipaddress.ip_interface(h.iface("eth0").ipv4).network
        gw = [r for r in h.routes if r.family == 4][0].gateways[0]
        assert ipaddress.ip_address(gw) in net and leaf.bridges[0].ipv4.startswith(gw)


@pytest.mark.parametrize("topo,k", [("pair", 2), ("star", 6), ("leaf-spine", 6)])
def test_addresses_and_macs_unique(topo, k):
    p = plan_lab("u", topo, hosts=k)
    macs = [i.mac for _, i in _all_ifaces(p)] + [b.mac for n in p.nodes for b in n.bridges]
    assert len(macs) == len(set(macs))
    addrs = [a for _, i in _all_ifaces(p) for a in (i.ipv4, i.ipv6) if a]
    addrs += [a for n in p.nodes for b in n.bridges for a in (b.ipv4, b.ipv6) if a]
    assert len(addrs) == len(set(addrs))
    for a in addrs:
        ipaddress.ip_interface(a)
    for n in p.nodes:   # interface names fit IFNAMSIZ
        assert all(len(i.name) <= 15 for i in n.ifaces)
        assert len({i.name for i in n.ifaces}) == len(n.ifaces)


def test_stations_are_the_hosts_behind_each_bridge_port():
    """What the bridge's static entries and the fabric's XDP forwarding table hold."""
    p = plan_lab("s", "star", hosts=3)
    assert p.stations() == [("sw1", h, p.node(h).iface("eth0").mac) for h in ("h1", "h2", "h3")]
    assert p.switch_domain("sw1") == 4 and p.switch_domain("h1") == 0
    ls = plan_lab("l", "leaf-spine", hosts=4)
    assert sorted((sw, port) for sw, port, _ in ls.stations()) == [
        ("leaf1", "h1"), ("leaf1", "h2"), ("leaf2", "h3"), ("leaf2", "h4")]   # no spine link
    assert ls.switch_domain("leaf1") != ls.switch_domain("leaf2")
    assert ls.switch_domain("spine1") == 0
    with pytest.raises(KeyError):
        ls.switch_domain("sw9")


def test_round_trip_through_the_state_record():
    p = plan_lab("rt", "leaf-spine", hosts=3, rate="1gbit")
    assert LabPlan.from_dict(p.to_dict()) == p


def test_link_lookup_by_name_or_host():
    p = plan_lab("x", "pair")
    assert p.link("h2").name == "h2-sw1"
    assert p.link("h1-sw1").b == ("sw1", "h1")
    with pytest.raises(UsageError, match="no link"):
        p.link("sw1")           # a switch has several links: ambiguous


@pytest.mark.parametrize("text,bps", [("1gbit", 10**9), ("500mbit", 5 * 10**8), ("10g", 10**10),
                                      ("2500000", 2_500_000), ("1.5Gbit", 1_500_000_000)])
def test_parse_rate(text, bps):
    assert parse_rate(text) == bps


@pytest.mark.parametrize("kwargs,msg", [
    ({"topology": "ring"}, "unknown topology"),
    ({"topology": "pair", "hosts": 3}, "exactly 2"),
    ({"topology": "star", "hosts": 1}, "between 2"),
    ({"mtu": 100}, "--mtu"),
    ({"rate": "fast"}, "bad rate"),
    ({"ecn_threshold": 1000}, "needs --rate"),
    ({"name": "Bad_Name"}, "bad lab name"),
])
def test_bad_arguments_are_usage_errors(kwargs, msg):
    with pytest.raises(UsageError, match=msg):
        plan_lab(**kwargs)


def test_ecn_threshold_defaults_with_rate():
    assert plan_lab("e", rate="1gbit").ecn_threshold == 65536
    assert plan_lab("e").ecn_threshold is None


def test_impairment_encoding():
    assert threshold(0.0) == 0 and threshold(1.0) == 2**32 - 1
    assert threshold(0.5) == 2**31
    cfg = Impairment(loss=0.1, seed=9, all_traffic=True).validate().to_cfg()
    assert cfg["flags"] == 0b11 and cfg["seed"] == 9 and cfg["dup"] == 0
    assert Impairment().to_cfg()["flags"] == 0
    with pytest.raises(UsageError):
        Impairment(dup=-0.1).validate()
    with pytest.raises(UsageError):
        Impairment(reorder_depth=0).validate()


def test_steering_is_asked_for_and_survives_a_round_trip():
    """Switches forward on the next CPU only when asked (lab up --steer); a record written
    before steering existed reads as a lab without it."""
    p = plan_lab("st", "pair", steer=True)
    assert plan_lab("st", "pair").steer is False
    assert LabPlan.from_dict(p.to_dict()).steer is True
    old = p.to_dict()
    del old["steer"]
    assert LabPlan.from_dict(old).steer is False
