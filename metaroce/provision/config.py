"""The provisioning file: load TOML (or YAML when PyYAML is installed), validate it, and say
exactly where a mistake is (`FILE:LINE: key.path: what is wrong`).

    config_dir = "/etc/metaroce"          # where the daemon configs go (optional)

    [sysctl]
    fib_multipath_hash_policy = 1         # 0 L3, 1 L4 (5-tuple: UDP source ports spread), 2, 3
    rp_filter = "loose"                   # off | strict | loose (or 0 | 1 | 2): conf.all + default
    [sysctl.extra]                        # any other sysctl by its full name
    "net.core.rmem_max" = 67108864

    [interfaces.eth1]
    mtu = 9000
    up = true                             # bring the link up (default)
    addresses = ["192.168.77.11/24", "fd00:77::11/64"]
    replace_addresses = false             # true: remove global addresses not listed
    rp_filter = "loose"                   # conf.eth1.rp_filter
    routes = [{ to = "10.2.0.0/16", via = "192.168.77.1", metric = 100 }]
    [interfaces.eth1.metaroce]            # present: write config_dir/eth1.toml for the daemon
    mode = "metaroce"                     # roce | metaroce
    dscp = 26                             # 0..63
    ecn = "ect0"                          # ect0 | ect1 | off
"""

from __future__ import annotations

import ipaddress
import os
import re
import tomllib
from dataclasses import dataclass, field

from ..errors import MetaroceError
from .tomlpos import line_of, locate

DEFAULT_CONFIG_DIR = "/etc/metaroce"
RP_FILTER = {"off": 0, "strict": 1, "loose": 2}
ECN_CHOICES = ("ect0", "ect1", "off")
MODES = ("roce", "metaroce")
# what the data path marks today (metaroce.fastpath.xsk: DSCP 26, ECT(0))
DATAPATH_DSCP, DATAPATH_ECN = 26, "ect0"
_IFNAME = re.compile(r"^[^/\s:]{1,15}$")
# sysctl(8) names: dots separate, a dot inside an interface name is written "/"
_SYSCTL = re.compile(r"^[a-z0-9_]+(\.[A-Za-z0-9_:@/-]+)+$")


class ConfigError(MetaroceError):
    """An invalid file: every message carries FILE:LINE."""

    exit_code = 2

    def __init__(self, errors: list[str]):
        self.errors = errors
        more = f" (and {len(errors) - 1} more: {'; '.join(errors[1:])})" if len(errors) > 1 else ""
        super().__init__(errors[0] + more)


@dataclass(frozen=True)
class Route:
    to: str                       # "default" or a network in CIDR form
    via: str | None = None
    metric: int | None = None
    table: int = 254
    src: str | None = None
    onlink: bool = False

    @property
    def family(self) -> int:
        if self.to in ("default", "default6"):      # validation made it default6 for a v6 gateway
            return 6 if self.to == "default6" else 4
        return ipaddress.ip_network(self.to, strict=False).version

    @property
    def network(self) -> str:
        """The destination as the kernel states it: 0.0.0.0/0 or ::/0 for a default route."""
        if self.to in ("default", "default6"):
            return "::/0" if self.family == 6 else "0.0.0.0/0"
        return str(ipaddress.ip_network(self.to, strict=False))

    @property
    def kernel_metric(self) -> int:
        """The metric the kernel gives a route added without one."""
        if self.metric is not None:
            return self.metric
        return 1024 if self.family == 6 else 0

    def describe(self) -> str:
        s = "default" if self.network in ("0.0.0.0/0", "::/0") else self.network
        if self.via:
            s += f" via {self.via}"
        if self.src:
            s += f" src {self.src}"
        if self.onlink:
            s += " onlink"
        s += f" metric {self.kernel_metric}"
        if self.table != 254:
            s += f" table {self.table}"
        return s


@dataclass(frozen=True)
class DaemonSettings:
    mode: str = "roce"
    dscp: int = DATAPATH_DSCP
    ecn: str = DATAPATH_ECN


@dataclass(frozen=True)
class Interface:
    name: str
    mtu: int | None = None
    up: bool = True
    addresses: tuple[str, ...] = ()
    replace_addresses: bool = False
    rp_filter: int | None = None
    routes: tuple[Route, ...] = ()
    daemon: DaemonSettings | None = None


@dataclass(frozen=True)
class ProvisionConfig:
    source: str
    config_dir: str = DEFAULT_CONFIG_DIR
    multipath_hash_policy: int | None = None
    rp_filter: int | None = None
    extra_sysctls: tuple[tuple[str, str], ...] = ()
    interfaces: tuple[Interface, ...] = field(default_factory=tuple)


# --- loading ----------------------------------------------------------------------------------

def parse_text(text: str, source: str, fmt: str = "toml") -> tuple[dict, dict]:
    """(document, {path: line}) of a TOML or YAML text; syntax errors as ConfigError."""
    if fmt == "yaml":
        return _parse_yaml(text, source)
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = re.search(r"\(at line (\d+), column (\d+)\)", str(exc))
        msg = re.sub(r"\s*\(at line \d+, column \d+\)", "", str(exc))
        where = f"{source}:{m.group(1)}:{m.group(2)}" if m else source
        raise ConfigError([f"{where}: TOML syntax: {msg}"]) from None
    return doc, locate(text)


def _parse_yaml(text: str, source: str) -> tuple[dict, dict]:
    try:
        import yaml  # noqa: PLC0415 (optional)
    except ImportError:
        raise ConfigError([f"{source}: YAML needs PyYAML (pip install pyyaml), or write the "
                           "file in TOML"]) from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError([f"{where}: YAML syntax: {problem}"]) from None
    loc: dict = {}

    def walk(n, path):
        loc.setdefault(path, n.start_mark.line + 1)
        if isinstance(n, yaml.MappingNode):
            for k, v in n.value:
                key = k.value
                loc.setdefault(path + (key,), k.start_mark.line + 1)
                walk(v, path + (key,))
        elif isinstance(n, yaml.SequenceNode):
            for i, v in enumerate(n.value):
                walk(v, path + (i,))
    if node is not None:
        walk(node, ())
    return ({} if doc is None else doc), loc


def load(path: str, config_dir: str | None = None) -> ProvisionConfig:
    """Read and validate a provisioning file; config_dir overrides the file's."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise MetaroceError(f"cannot read {path}: {exc.strerror}") from None
    fmt = "yaml" if path.endswith((".yaml", ".yml")) else "toml"
    doc, loc = parse_text(text, path, fmt)
    return validate(doc, loc, os.path.abspath(path), config_dir)


# --- validation -------------------------------------------------------------------------------

class _V:
    """Collects errors with their lines."""

    def __init__(self, source: str, loc: dict):
        self.source, self.loc, self._errors = source, loc, []

    @property
    def errors(self) -> list[str]:
        """In the file's order."""
        return [m for _, m in sorted(self._errors, key=lambda e: e[0])]

    def err(self, path: tuple, msg: str) -> None:
        line = line_of(self.loc, path)
        where = f"{self.source}:{line}" if line else self.source
        name = ".".join(str(p) if isinstance(p, str) else f"[{p}]" for p in path).replace(".[", "[")
        self._errors.append((line or 0, f"{where}: {name + ': ' if name else ''}{msg}"))

    def table(self, v, path) -> dict:
        if not isinstance(v, dict):
            self.err(path, f"must be a table, not {_kind(v)}")
            return {}
        return v

    def keys(self, d: dict, path: tuple, allowed: tuple[str, ...]) -> None:
        for k in d:
            if k not in allowed:
                self.err(path + (k,), f"unknown key (known: {', '.join(allowed)})")

    def int_(self, v, path, lo, hi):
        if isinstance(v, bool) or not isinstance(v, int):
            self.err(path, f"must be an integer, not {_kind(v)}")
            return None
        if not lo <= v <= hi:
            self.err(path, f"{v} is out of range {lo}..{hi}")
            return None
        return v

    def bool_(self, v, path):
        if not isinstance(v, bool):
            self.err(path, f"must be true or false, not {_kind(v)}")
            return None
        return v

    def choice(self, v, path, choices):
        if v not in choices:
            self.err(path, f"must be one of {', '.join(map(str, choices))}, not {v!r}")
            return None
        return v

    def rp_filter(self, v, path):
        if isinstance(v, str):
            return RP_FILTER[v] if self.choice(v, path, tuple(RP_FILTER)) else None
        return self.int_(v, path, 0, 2)

    def ip(self, v, path):
        if not isinstance(v, str):
            self.err(path, f"must be an IP address string, not {_kind(v)}")
            return None
        try:
            return str(ipaddress.ip_address(v))
        except ValueError:
            self.err(path, f"{v!r} is not an IP address")
            return None


def _kind(v) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "an array", dict: "a table"}.get(type(v), type(v).__name__)


def validate(doc: dict, loc: dict, source: str, config_dir: str | None = None) -> ProvisionConfig:
    v = _V(source, loc)
    if not isinstance(doc, dict):
        raise ConfigError([f"{source}:1: the document must be a table (mapping)"])
    v.keys(doc, (), ("config_dir", "sysctl", "interfaces"))
    cdir = doc.get("config_dir", DEFAULT_CONFIG_DIR)
    if not isinstance(cdir, str) or not os.path.isabs(cdir):
        v.err(("config_dir",), f"must be an absolute directory path, not {cdir!r}")
    hash_policy = rp = None
    extra: list[tuple[str, str]] = []
    if "sysctl" in doc:
        sc = v.table(doc["sysctl"], ("sysctl",))
        v.keys(sc, ("sysctl",), ("fib_multipath_hash_policy", "rp_filter", "extra"))
        if "fib_multipath_hash_policy" in sc:
            hash_policy = v.int_(sc["fib_multipath_hash_policy"],
                                 ("sysctl", "fib_multipath_hash_policy"), 0, 3)
        if "rp_filter" in sc:
            rp = v.rp_filter(sc["rp_filter"], ("sysctl", "rp_filter"))
        if "extra" in sc:
            for name, val in v.table(sc["extra"], ("sysctl", "extra")).items():
                p = ("sysctl", "extra", name)
                if not _SYSCTL.match(name):
                    v.err(p, "not a sysctl name (e.g. net.core.rmem_max)")
                elif isinstance(val, bool) or not isinstance(val, (int, str)):
                    v.err(p, f"must be an integer or a string, not {_kind(val)}")
                else:
                    extra.append((name, str(val)))
    ifaces = []
    if "interfaces" in doc:
        for name, body in v.table(doc["interfaces"], ("interfaces",)).items():
            itf = _interface(v, name, body)
            if itf:
                ifaces.append(itf)
    if not ifaces and not v.errors and hash_policy is None and rp is None and not extra:
        v.err((), "nothing to provision: add an [interfaces.NAME] table or [sysctl] settings")
    if v.errors:
        raise ConfigError(v.errors)
    return ProvisionConfig(source=source, config_dir=config_dir or cdir,
                           multipath_hash_policy=hash_policy, rp_filter=rp,
                           extra_sysctls=tuple(extra), interfaces=tuple(ifaces))


def _interface(v: _V, name: str, body) -> Interface | None:
    base = ("interfaces", name)
    nerr = len(v._errors)
    if not _IFNAME.match(name):
        v.err(base, "not an interface name (1..15 characters, no '/', ':' or spaces)")
    t = v.table(body, base)
    v.keys(t, base, ("mtu", "up", "addresses", "replace_addresses", "rp_filter", "routes",
                     "metaroce"))
    mtu = v.int_(t["mtu"], base + ("mtu",), 68, 65535) if "mtu" in t else None
    up = v.bool_(t.get("up", True), base + ("up",))
    replace = v.bool_(t.get("replace_addresses", False), base + ("replace_addresses",))
    rp = v.rp_filter(t["rp_filter"], base + ("rp_filter",)) if "rp_filter" in t else None
    addrs: list[str] = []
    raw = t.get("addresses", [])
    if not isinstance(raw, list):
        v.err(base + ("addresses",), f"must be an array of CIDR strings, not {_kind(raw)}")
        raw = []
    for i, a in enumerate(raw):
        p = base + ("addresses", i)
        if not isinstance(a, str) or "/" not in a:
            v.err(p, f"must be an address with its prefix length (e.g. 10.0.0.1/24), not {a!r}")
            continue
        try:
            ai = ipaddress.ip_interface(a)
        except ValueError:
            v.err(p, f"{a!r} is not an address with a prefix length")
            continue
        norm = f"{ai.ip}/{ai.network.prefixlen}"
        if norm in addrs:
            v.err(p, f"{norm} is listed twice")
        addrs.append(norm)
    routes = []
    raw = t.get("routes", [])
    if not isinstance(raw, list):
        v.err(base + ("routes",), f"must be an array of tables, not {_kind(raw)}")
        raw = []
    for i, r in enumerate(raw):
        route = _route(v, base + ("routes", i), r)
        if route:
            routes.append(route)
    keys = [(r.network, r.table, r.kernel_metric) for r in routes]
    for i, k in enumerate(keys):
        if k in keys[:i]:
            v.err(base + ("routes", i), f"a route to {k[0]} with metric {k[2]} in table {k[1]} "
                  "is listed twice")
    daemon = None
    if "metaroce" in t:
        p = base + ("metaroce",)
        m = v.table(t["metaroce"], p)
        v.keys(m, p, ("mode", "dscp", "ecn"))
        daemon = DaemonSettings(mode=v.choice(m.get("mode", "roce"), p + ("mode",), MODES),
                                dscp=v.int_(m.get("dscp", DATAPATH_DSCP), p + ("dscp",), 0, 63),
                                ecn=v.choice(m.get("ecn", DATAPATH_ECN), p + ("ecn",), ECN_CHOICES))
    if len(v._errors) > nerr:
        return None
    return Interface(name=name, mtu=mtu, up=up, addresses=tuple(addrs), replace_addresses=replace,
                     rp_filter=rp, routes=tuple(routes), daemon=daemon)


def _route(v: _V, p: tuple, r) -> Route | None:
    nerr = len(v._errors)
    r = v.table(r, p)
    v.keys(r, p, ("to", "via", "metric", "table", "src", "onlink"))
    to = r.get("to")
    fam = None
    if to is None:
        v.err(p, "a route needs `to` (a network in CIDR form, or \"default\")")
    elif not isinstance(to, str):
        v.err(p + ("to",), f"must be a string, not {_kind(to)}")
    elif to != "default":
        try:
            net = ipaddress.ip_network(to, strict=False)
            fam = net.version
            if str(net) != to and "/" in to:
                v.err(p + ("to",), f"{to!r} has host bits set (did you mean {net}?)")
            elif "/" not in to:
                v.err(p + ("to",), f"{to!r} needs a prefix length (e.g. {net})")
        except ValueError:
            v.err(p + ("to",), f"{to!r} is not a network (CIDR) or \"default\"")
    via = v.ip(r["via"], p + ("via",)) if "via" in r else None
    src = v.ip(r["src"], p + ("src",)) if "src" in r else None
    for key, addr in (("via", via), ("src", src)):
        if addr and fam and ipaddress.ip_address(addr).version != fam:
            v.err(p + (key,), f"{addr} is not of the destination's address family")
    if to == "default" and not via:
        v.err(p, "a default route needs `via` (its family comes from the gateway)")
    if via and src and ipaddress.ip_address(via).version != ipaddress.ip_address(src).version:
        v.err(p + ("src",), f"{src} is not of the gateway's address family")
    metric = v.int_(r["metric"], p + ("metric",), 0, 2**32 - 1) if "metric" in r else None
    table = v.int_(r.get("table", 254), p + ("table",), 1, 2**32 - 1)
    onlink = v.bool_(r.get("onlink", False), p + ("onlink",))
    if onlink and not via:
        v.err(p + ("onlink",), "onlink needs `via`")
    if len(v._errors) > nerr:
        return None
    if to == "default" and via and ":" in via:
        to = "default6"
    return Route(to=to, via=via, metric=metric, table=table, src=src, onlink=bool(onlink))
