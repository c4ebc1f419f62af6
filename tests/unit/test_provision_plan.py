"""Plan diffing: the desired state against a host snapshot, without root."""

import pytest

from metaroce.errors import MetaroceError
from metaroce.provision import config as C
from metaroce.provision.plan import (HostState, LinkState, RouteState, desired_files,
                                     desired_sysctls, format_plan, make_plan, sysctl_name,
                                     sysctl_path)

TEXT = """\
config_dir = "/etc/metaroce"
[sysctl]
fib_multipath_hash_policy = 1
rp_filter = "loose"
[interfaces.eth1]
mtu = 9000
addresses = ["192.168.77.11/24", "fd00:77::11/64"]
routes = [{ to = "10.2.0.0/16", via = "192.168.77.1", metric = 100 },
          { to = "fd00:2::/48", via = "fd00:77::1" }]
[interfaces.eth1.metaroce]
mode = "metaroce"
"""


@pytest.fixture
def cfg(tmp_path):
    p = tmp_path / "p.toml"
    p.write_text(TEXT)
    return C.load(str(p))


def fresh() -> HostState:
    return HostState(
        links={"eth1": LinkState("eth1", 3, 1500, False, ["fe80::1/64"])},
        routes=[RouteState("192.168.77.0/24", 254, 0, None, "eth1")],
        sysctls={"net/ipv4/fib_multipath_hash_policy": "0",
                 "net/ipv6/fib_multipath_hash_policy": "0",
                 "net/ipv4/conf/all/rp_filter": "1", "net/ipv4/conf/default/rp_filter": "1"},
        files={"/etc/metaroce/eth1.toml": None})


def converged(cfg) -> HostState:
    st = fresh()
    st.links["eth1"] = LinkState("eth1", 3, 9000, True,
                                 ["192.168.77.11/24", "fd00:77::11/64", "fe80::1/64"])
    st.routes += [RouteState("10.2.0.0/16", 254, 100, "192.168.77.1", "eth1"),
                  RouteState("fd00:2::/48", 254, 1024, "fd00:77::1", "eth1")]
    st.sysctls.update({k: v for k, v in desired_sysctls(cfg).items()})
    st.files.update(desired_files(cfg))
    return st


def test_fresh_host_gets_every_change_in_order(cfg):
    changes, warnings = make_plan(cfg, fresh())
    assert [c.text for c in changes] == [
        "eth1: mtu 1500 -> 9000",
        "eth1: set up",
        "eth1: add address 192.168.77.11/24",
        "eth1: add address fd00:77::11/64",
        "eth1: add route 10.2.0.0/16 via 192.168.77.1 metric 100 dev eth1",
        "eth1: add route fd00:2::/48 via fd00:77::1 metric 1024 dev eth1",
        "sysctl net.ipv4.fib_multipath_hash_policy: 0 -> 1",
        "sysctl net.ipv6.fib_multipath_hash_policy: 0 -> 1",
        "sysctl net.ipv4.conf.all.rp_filter: 1 -> 2",
        "sysctl net.ipv4.conf.default.rp_filter: 1 -> 2",
        "write /etc/metaroce/eth1.toml (create)",
    ]
    assert warnings == []
    lines = format_plan(changes, warnings, dry_run=True)
    assert lines[-1] == "11 changes would be applied (dry run)"
    assert "    +mode = \"metaroce\"" in lines          # the file's diff is shown


def test_converged_host_needs_nothing(cfg):
    changes, _ = make_plan(cfg, converged(cfg))
    assert changes == []
    assert format_plan([], [], dry_run=True) == [
        "no changes: the host already matches the configuration"]


def test_only_the_differences(cfg):
    st = converged(cfg)
    st.links["eth1"].mtu = 1500
    st.routes[1] = RouteState("10.2.0.0/16", 254, 100, "192.168.77.254", "eth1")
    st.sysctls["net/ipv4/conf/all/rp_filter"] = "1"
    st.files["/etc/metaroce/eth1.toml"] = st.files["/etc/metaroce/eth1.toml"].replace(
        "metaroce\"", "roce\"")
    changes, _ = make_plan(cfg, st)
    assert [c.kind for c in changes] == ["mtu", "route-replace", "sysctl", "file"]
    assert changes[1].text == ("eth1: replace route 10.2.0.0/16 via 192.168.77.254 dev eth1 "
                               "with 10.2.0.0/16 via 192.168.77.1 metric 100 dev eth1")
    assert changes[3].text == "write /etc/metaroce/eth1.toml (update)"
    diff = changes[3].to_dict()["diff"]
    assert '-mode = "roce"' in diff and '+mode = "metaroce"' in diff


def test_route_with_other_metric_or_table_is_another_route(cfg):
    st = converged(cfg)
    st.routes[1] = RouteState("10.2.0.0/16", 254, 5, "192.168.77.254", "eth1")
    changes, _ = make_plan(cfg, st)
    assert [c.kind for c in changes] == ["route-add"]


def test_replace_addresses_keeps_link_local(tmp_path):
    p = tmp_path / "p.toml"
    p.write_text('[interfaces.eth1]\naddresses = ["10.0.0.1/24"]\nreplace_addresses = true\n'
                 "up = false\n")
    st = HostState(links={"eth1": LinkState("eth1", 3, 1500, False,
                                            ["10.0.0.9/24", "10.0.0.1/24", "fe80::1/64"])})
    changes, _ = make_plan(C.load(str(p)), st)
    assert [c.text for c in changes] == ["eth1: remove address 10.0.0.9/24 (not listed)"]


def test_interface_rp_filter_below_all_warns(tmp_path):
    p = tmp_path / "p.toml"
    p.write_text("[interfaces.eth1]\nrp_filter = \"off\"\n")
    st = HostState(links={"eth1": LinkState("eth1", 3, 1500, True)},
                   sysctls={"net/ipv4/conf/eth1/rp_filter": "0", "net/ipv4/conf/all/rp_filter": "1"})
    changes, warnings = make_plan(C.load(str(p)), st)
    assert changes == [] and "raised to 1" in warnings[0]


def test_missing_interface_and_sysctl(cfg, tmp_path):
    with pytest.raises(MetaroceError, match="no interface eth1"):
        make_plan(cfg, HostState(sysctls=fresh().sysctls))
    p = tmp_path / "p.toml"
    p.write_text('[sysctl.extra]\n"net.ipv4.no_such" = 1\n')
    with pytest.raises(MetaroceError, match="net.ipv4.no_such does not exist"):
        make_plan(C.load(str(p)), HostState(sysctls={"net/ipv4/no_such": None}))


def test_marking_the_data_path_cannot_apply_warns(tmp_path):
    p = tmp_path / "p.toml"
    p.write_text("[interfaces.eth1.metaroce]\ndscp = 46\n")
    st = HostState(links={"eth1": LinkState("eth1", 3, 1500, True)},
                   files={"/etc/metaroce/eth1.toml": None})
    changes, warnings = make_plan(C.load(str(p)), st)
    assert [c.kind for c in changes] == ["file"] and "dscp = 46" in changes[0].new
    assert "dscp 46 / ecn ect0 requested" in warnings[0]


def test_sysctl_names_with_dotted_interfaces():
    assert sysctl_path("net.ipv4.conf.eth1/100.rp_filter") == "net/ipv4/conf/eth1.100/rp_filter"
    assert sysctl_name("net/ipv4/conf/eth1.100/rp_filter") == "net.ipv4.conf.eth1/100.rp_filter"


def test_values_compare_by_words(tmp_path):
    p = tmp_path / "p.toml"
    p.write_text('[sysctl.extra]\n"net.ipv4.tcp_rmem" = "4096 131072 6291456"\n')
    st = HostState(sysctls={"net/ipv4/tcp_rmem": "4096\t131072\t6291456"})
    assert make_plan(C.load(str(p)), st)[0] == []
