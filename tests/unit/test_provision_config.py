"""Provisioning files: TOML positions, validation with the line of each mistake, YAML too."""

import pytest
from _deps import require

from metaroce.provision import config as C
from metaroce.provision import daemon_config as D
from metaroce.provision.tomlpos import line_of, locate

GOOD = """\
config_dir = "/etc/metaroce"

[sysctl]
fib_multipath_hash_policy = 1
rp_filter = "loose"
[sysctl.extra]
"net.core.rmem_max" = 67108864

[interfaces.eth1]
mtu = 9000
addresses = ["192.168.77.11/24", "fd00:77::11/64"]
rp_filter = 2
routes = [
  { to = "10.2.0.0/16", via = "192.168.77.1", metric = 100 },
  { to = "default", via = "fd00:77::1" },
]
[interfaces.eth1.metaroce]
mode = "metaroce"
"""


def write(tmp_path, text, name="p.toml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def errors_of(tmp_path, text, name="p.toml"):
    with pytest.raises(C.ConfigError) as ei:
        C.load(write(tmp_path, text, name))
    return ei.value.errors


def test_good_file(tmp_path):
    cfg = C.load(write(tmp_path, GOOD))
    assert cfg.multipath_hash_policy == 1 and cfg.rp_filter == 2
    assert cfg.extra_sysctls == (("net.core.rmem_max", "67108864"),)
    (itf,) = cfg.interfaces
    assert itf.mtu == 9000 and itf.rp_filter == 2 and itf.up
    assert itf.addresses == ("192.168.77.11/24", "fd00:77::11/64")
    r1, r2 = itf.routes
    assert (r1.network, r1.kernel_metric, r1.family) == ("10.2.0.0/16", 100, 4)
    assert (r2.network, r2.kernel_metric, r2.family) == ("::/0", 1024, 6)
    assert r2.describe() == "default via fd00:77::1 metric 1024"
    assert itf.daemon == C.DaemonSettings("metaroce", 26, "ect0")


def test_config_dir_override(tmp_path):
    assert C.load(write(tmp_path, GOOD), config_dir="/tmp/x").config_dir == "/tmp/x"


@pytest.mark.parametrize("text,line,needle", [
    ("[interfaces.eth1]\nmtu = 9000\nmut = 1\n", 3, "interfaces.eth1.mut: unknown key"),
    ("[interfaces.eth1]\n\nmtu = 70000\n", 3, "interfaces.eth1.mtu: 70000 is out of range"),
    ("[interfaces.eth1]\nmtu = \"big\"\n", 2, "must be an integer, not a string"),
    ("[interfaces.eth1]\naddresses = [\n  \"10.0.0.1/24\",\n  \"10.0.0.300/24\",\n]\n", 4,
     "interfaces.eth1.addresses[1]: '10.0.0.300/24' is not an address"),
    ("[interfaces.eth1]\naddresses = [\"10.0.0.1\"]\n", 2, "with its prefix length"),
    ("[interfaces.eth1]\nroutes = [\n  { to = \"10.2.0.0/16\" },\n  { to = \"10.2.0.1/16\" },\n]\n",
     4, "has host bits set (did you mean 10.2.0.0/16?)"),
    ("[interfaces.eth1]\nroutes = [\n\n  { to = \"default\" },\n]\n", 4, "needs `via`"),
    ("[interfaces.eth1]\nroutes = [{ to = \"10.2.0.0/16\", via = \"fd00::1\" }]\n", 2,
     "not of the destination's address family"),
    ("[interfaces.eth1]\nroutes = [{ to = \"10.2.0.0/16\", gw = \"10.0.0.1\" }]\n", 2,
     "routes[0].gw: unknown key"),
    ("[sysctl]\nrp_filter = \"medium\"\n", 2, "must be one of off, strict, loose"),
    ("[sysctl]\nfib_multipath_hash_policy = 4\n", 2, "4 is out of range 0..3"),
    ("[sysctl.extra]\n\"net..x\" = 1\n", 2, "not a sysctl name"),
    ("[interfaces.eth1]\nmtu = 1500\n[interfaces.eth1.metaroce]\nmode = \"rocev3\"\n", 4,
     "interfaces.eth1.metaroce.mode: must be one of roce, metaroce"),
    ("[interfaces.eth1.metaroce]\ndscp = 64\n", 2, "64 is out of range 0..63"),
    ("config_dir = \"relative\"\n[interfaces.eth1]\n", 1, "absolute directory path"),
    ("[interfaces.\"a/b\"]\nmtu = 1500\n", 1, "not an interface name"),
    ("[interfaces.eth1]\nup = \"yes\"\n", 2, "must be true or false"),
])
def test_errors_name_their_line(tmp_path, text, line, needle):
    errs = errors_of(tmp_path, text)
    assert any(e.startswith(f"{tmp_path}/p.toml:{line}: ") and needle in e for e in errs), errs


def test_every_error_is_reported(tmp_path):
    errs = errors_of(tmp_path, "[interfaces.eth1]\nmtu = 1\nup = 3\n[sysctl]\nrp_filter = 9\n")
    assert [e.split(": ")[0].rsplit(":", 1)[1] for e in errs] == ["2", "3", "5"]
    with pytest.raises(C.ConfigError) as ei:
        C.load(write(tmp_path, "[interfaces.eth1]\nmtu = 1\nup = 3\n"))
    assert "(and 1 more:" in str(ei.value)


def test_syntax_error_has_line_and_column(tmp_path):
    (e,) = errors_of(tmp_path, "[interfaces.eth1]\nmtu = = 3\n")
    assert e.startswith(f"{tmp_path}/p.toml:2:") and "TOML syntax" in e


def test_empty_file_says_what_is_missing(tmp_path):
    (e,) = errors_of(tmp_path, "# nothing\n")
    assert "nothing to provision" in e


def test_duplicate_routes_and_addresses(tmp_path):
    errs = errors_of(tmp_path, "[interfaces.eth1]\naddresses = [\"10.0.0.1/24\",\n"
                     "  \"10.0.0.1/24\"]\nroutes = [{ to = \"10.2.0.0/16\" },\n"
                     "  { to = \"10.2.0.0/16\", via = \"10.0.0.2\" }]\n")
    assert any(":3: " in e and "listed twice" in e for e in errs)
    assert any(":5: " in e and "listed twice" in e for e in errs)


def test_missing_file(tmp_path):
    with pytest.raises(C.MetaroceError, match="cannot read"):
        C.load(str(tmp_path / "nope.toml"))


def test_locate_follows_strings_arrays_and_tables():
    text = ('a = """x\n]\n[not.a.table]\n"""\n'         # multi-line string with brackets
            "b = 'lit # not a comment'\n"
            "[t]\nc.d = [1, [2,\n 3]]\n"
            "[[arr]]\nx = 1\n[[arr]]\ny = { z = \"q\\\"\" }\n[arr.sub]\nw = 2\n")
    loc = locate(text)
    assert loc[("a",)] == 1 and loc[("b",)] == 5
    assert ("not", "a", "table") not in loc
    assert loc[("t", "c", "d")] == 7 and loc[("t", "c", "d", 1, 1)] == 8
    assert loc[("arr", 0)] == 9 and loc[("arr", 0, "x")] == 10 and loc[("arr", 1)] == 11
    assert loc[("arr", 1, "y", "z")] == 12 and loc[("arr", 1, "sub", "w")] == 14
    assert line_of(loc, ("arr", 1, "y", "z", "deeper")) == 12


def test_yaml(tmp_path):
    require("yaml", "PyYAML (the test extra) parses YAML configs")
    text = ("sysctl:\n  rp_filter: loose\ninterfaces:\n  eth1:\n    mtu: 9000\n"
            "    routes:\n      - to: 10.2.0.0/16\n        via: 10.0.0.1\n      - to: 10.3.0.0/16\n"
            "        via: 10.0.0.300\n")
    errs = errors_of(tmp_path, text, "p.yaml")
    assert len(errs) == 1 and errs[0].startswith(f"{tmp_path}/p.yaml:10: ") and "via" in errs[0]
    cfg = C.load(write(tmp_path, text.replace("10.0.0.300", "10.0.0.3"), "p.yaml"))
    assert cfg.rp_filter == 2 and len(cfg.interfaces[0].routes) == 2


def test_daemon_config_round_trip(tmp_path):
    text = D.render("eth1", C.DaemonSettings("metaroce", 26, "ect0"), "/etc/metaroce/p.toml")
    p = write(tmp_path, text, "eth1.toml")
    cfg = D.load(p)
    assert cfg == D.DaemonConfig("eth1", "metaroce", 26, "ect0")
    assert cfg.unsupported_marking() is None
    warned = []
    assert D.load_for(p, "eth1", None, warned.append) == "metaroce"
    assert D.load_for(p, "eth1", "roce", warned.append) == "roce"      # --mode wins
    assert not warned
    with pytest.raises(C.MetaroceError, match="configures eth1, not eth2"):
        D.load_for(p, "eth2", None, warned.append)


def test_daemon_config_errors_and_marking(tmp_path):
    p = write(tmp_path, 'dev = "eth1"\nmode = "x"\n', "eth1.toml")
    with pytest.raises(C.ConfigError, match=r"eth1.toml:2: mode: must be one of"):
        D.load(p)
    p = write(tmp_path, 'dev = "eth1"\ndscp = 10\necn = "off"\n', "eth1.toml")
    warned = []
    assert D.load_for(p, "eth1", None, warned.append) == "roce"
    assert len(warned) == 1 and "dscp 10 / ecn off requested" in warned[0]
