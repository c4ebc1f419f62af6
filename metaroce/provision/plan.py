"""What provisioning would change: the desired state from a ProvisionConfig against a snapshot
of the host (links, addresses, routes, sysctls, files), as an ordered list of changes. Pure, so
the diff is tested without root; `metaroce.provision.apply` takes the snapshot and applies."""

from __future__ import annotations

import difflib
import ipaddress
from dataclasses import asdict, dataclass, field

from ..errors import MetaroceError
from . import daemon_config
from .config import ProvisionConfig, Route


@dataclass
class LinkState:
    name: str
    index: int
    mtu: int
    up: bool
    addresses: list[str] = field(default_factory=list)   # "addr/plen", scope global/host only


@dataclass
class RouteState:
    network: str          # "10.2.0.0/16", "0.0.0.0/0"
    table: int
    metric: int
    via: str | None
    dev: str | None
    src: str | None = None
    onlink: bool = False


@dataclass
class HostState:
    links: dict[str, LinkState] = field(default_factory=dict)
    routes: list[RouteState] = field(default_factory=list)
    sysctls: dict[str, str | None] = field(default_factory=dict)   # proc path -> value / absent
    files: dict[str, str | None] = field(default_factory=dict)     # path -> content / absent


@dataclass
class Change:
    kind: str            # mtu | link-up | addr-add | addr-del | route-add | route-replace |
    #                      sysctl | file
    target: str          # interface, sysctl name or file path
    old: object
    new: object
    text: str            # one line, what happens
    detail: dict = field(default_factory=dict)   # what the applier needs

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("detail")
        if self.kind == "file":
            d["diff"] = file_diff(self.target, self.old, self.new)
            d["old"] = None if self.old is None else "(current content)"
            d["new"] = "(new content)"
        return d


def sysctl_path(name: str) -> str:
    """net.ipv4.conf.eth1/100.rp_filter -> net/ipv4/conf/eth1.100/rp_filter (under /proc/sys):
    sysctl(8) writes a dot inside a name as "/"."""
    return "/".join(part.replace("/", ".") for part in name.split("."))


def sysctl_name(path: str) -> str:
    return ".".join(part.replace(".", "/") for part in path.split("/"))


def desired_sysctls(cfg: ProvisionConfig) -> dict[str, str]:
    """{/proc/sys-relative path: value}; per-interface keys keep a dotted interface name intact."""
    out: dict[str, str] = {}
    if cfg.multipath_hash_policy is not None:
        out["net/ipv4/fib_multipath_hash_policy"] = str(cfg.multipath_hash_policy)
        out["net/ipv6/fib_multipath_hash_policy"] = str(cfg.multipath_hash_policy)
    if cfg.rp_filter is not None:
        out["net/ipv4/conf/all/rp_filter"] = str(cfg.rp_filter)
        out["net/ipv4/conf/default/rp_filter"] = str(cfg.rp_filter)
    for itf in cfg.interfaces:
        if itf.rp_filter is not None:
            out[f"net/ipv4/conf/{itf.name}/rp_filter"] = str(itf.rp_filter)
    for name, val in cfg.extra_sysctls:
        out[sysctl_path(name)] = val
    return out


def desired_files(cfg: ProvisionConfig) -> dict[str, str]:
    return {daemon_config.path_for(cfg.config_dir, itf.name):
            daemon_config.render(itf.name, itf.daemon, cfg.source)
            for itf in cfg.interfaces if itf.daemon is not None}


def _norm(v: str | None) -> str | None:
    return None if v is None else " ".join(v.split())


def _display(path: str) -> str:
    return sysctl_name(path)


def file_diff(path: str, old: str | None, new: str) -> list[str]:
    return [ln.rstrip("\n") for ln in difflib.unified_diff(
        [] if old is None else old.splitlines(True), new.splitlines(True),
        fromfile="/dev/null" if old is None else path, tofile=path)]


def _route_matches(r: RouteState, want: Route, dev: str) -> bool:
    return (r.via == want.via and r.dev == dev and (want.src is None or r.src == want.src)
            and r.onlink == want.onlink)


def make_plan(cfg: ProvisionConfig, state: HostState) -> tuple[list[Change], list[str]]:
    """(changes in the order they are applied, warnings)."""
    changes: list[Change] = []
    warnings: list[str] = []
    for itf in cfg.interfaces:
        link = state.links.get(itf.name)
        if link is None:
            raise MetaroceError(f"no interface {itf.name} (named in {cfg.source})")
        if itf.mtu is not None and link.mtu != itf.mtu:
            changes.append(Change("mtu", itf.name, link.mtu, itf.mtu,
                                  f"{itf.name}: mtu {link.mtu} -> {itf.mtu}"))
        if itf.up and not link.up:
            changes.append(Change("link-up", itf.name, "down", "up", f"{itf.name}: set up"))
        have = set(link.addresses)
        for a in itf.addresses:
            if a not in have:
                changes.append(Change("addr-add", itf.name, None, a, f"{itf.name}: add address {a}"))
        if itf.replace_addresses:
            for a in link.addresses:
                if a not in itf.addresses and not ipaddress.ip_interface(a).ip.is_link_local:
                    changes.append(Change("addr-del", itf.name, a, None,
                                          f"{itf.name}: remove address {a} (not listed)"))
        for want in itf.routes:
            same = [r for r in state.routes if r.network == want.network and r.table == want.table
                    and r.metric == want.kernel_metric]
            if any(_route_matches(r, want, itf.name) for r in same):
                continue
            detail = {"route": want, "dev": itf.name}
            if same:
                old = same[0]
                was = f"{old.network} via {old.via} dev {old.dev}" if old.via else \
                      f"{old.network} dev {old.dev}"
                changes.append(Change("route-replace", itf.name, was, want.describe(),
                                      f"{itf.name}: replace route {was} with "
                                      f"{want.describe()} dev {itf.name}", detail))
            else:
                changes.append(Change("route-add", itf.name, None, want.describe(),
                                      f"{itf.name}: add route {want.describe()} dev {itf.name}",
                                      detail))
    for path, val in desired_sysctls(cfg).items():
        if path not in state.sysctls:
            raise AssertionError(f"sysctl {path} was not read")
        cur = state.sysctls[path]
        if cur is None:
            raise MetaroceError(f"sysctl {_display(path)} does not exist on this kernel "
                                f"(set in {cfg.source})")
        if _norm(cur) != _norm(val):
            changes.append(Change("sysctl", _display(path), _norm(cur), val,
                                  f"sysctl {_display(path)}: {_norm(cur)} -> {val}",
                                  {"path": path}))
    for itf in cfg.interfaces:
        want = itf.rp_filter
        if want is None:
            continue
        all_v = desired_sysctls(cfg).get("net/ipv4/conf/all/rp_filter") or \
            state.sysctls.get("net/ipv4/conf/all/rp_filter")
        if all_v is not None and int(all_v) > want:
            warnings.append(f"{itf.name}: rp_filter {want} is raised to {all_v} by "
                            "net.ipv4.conf.all.rp_filter (the kernel uses the larger): set "
                            "[sysctl] rp_filter too")
    for path, content in desired_files(cfg).items():
        cur = state.files.get(path)
        if cur != content:
            changes.append(Change("file", path, cur, content,
                                  f"write {path} ({'create' if cur is None else 'update'})",
                                  {"path": path}))
    for itf in cfg.interfaces:
        if itf.daemon is not None:
            dc = daemon_config.DaemonConfig(itf.name, itf.daemon.mode, itf.daemon.dscp,
                                            itf.daemon.ecn)
            why = dc.unsupported_marking()
            if why:
                warnings.append(f"{itf.name}: {why}")
    return changes, warnings


def format_plan(changes: list[Change], warnings: list[str], dry_run: bool) -> list[str]:
    """Human lines: each change (with a file's diff when dry), then the warnings."""
    lines = []
    if not changes:
        lines.append("no changes: the host already matches the configuration")
    for c in changes:
        lines.append(("~ " if dry_run else "+ ") + c.text)
        if dry_run and c.kind == "file":
            lines.extend("    " + ln for ln in file_diff(c.target, c.old, c.new))
    if changes:
        n = f"{len(changes)} change{'s' if len(changes) != 1 else ''}"
        lines.append(f"{n} would be applied (dry run)" if dry_run else f"{n} applied")
    lines.extend(f"warning: {w}" for w in warnings)
    return lines
