"""Read the host's current state and apply a provisioning plan (pyroute2, /proc/sys, files),
optionally inside a network namespace."""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from ..errors import MetaroceError
from .config import ProvisionConfig
from .plan import Change, HostState, LinkState, RouteState, desired_files, desired_sysctls, make_plan

IFF_UP = 0x1
RTN_UNICAST = 1
RTNH_F_ONLINK = 0x4
PROC_SYS = "/proc/sys"


@contextlib.contextmanager
def _ipr(netns: str | None):
    if netns and not os.path.exists(f"/var/run/netns/{netns}"):
        raise MetaroceError(f"no network namespace {netns!r}")
    ipr = IPRoute(netns=netns) if netns else IPRoute()
    try:
        yield ipr
    finally:
        ipr.close()


@contextlib.contextmanager
def _in_netns(netns: str | None):
    """/proc/sys/net shows the namespace of the thread that opens it."""
    if not netns:
        yield
        return
    from pyroute2 import netns as pr_netns  # noqa: PLC0415
    pr_netns.pushns(netns)
    try:
        yield
    finally:
        pr_netns.popns()


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        return None


def snapshot(cfg: ProvisionConfig, netns: str | None = None) -> HostState:
    """What provisioning compares against: the configured links, their routes in the configured
    tables, the sysctls and files it would write."""
    st = HostState()
    tables = {r.table for itf in cfg.interfaces for r in itf.routes}
    with _ipr(netns) as ipr:
        names = {}
        for msg in ipr.get_links():
            names[msg["index"]] = msg.get_attr("IFLA_IFNAME")
        for itf in cfg.interfaces:
            found = ipr.link_lookup(ifname=itf.name)
            if not found:
                continue
            link = ipr.link("get", index=found[0])[0]
            addrs = []
            for a in ipr.get_addr(index=found[0]):
                addrs.append(f"{a.get_attr('IFA_ADDRESS')}/{a['prefixlen']}")
            st.links[itf.name] = LinkState(itf.name, found[0], link.get_attr("IFLA_MTU"),
                                           bool(link["flags"] & IFF_UP), addrs)
        for fam in (socket.AF_INET, socket.AF_INET6):
            if not tables:
                break
            for r in ipr.route("dump", family=fam):
                table = r.get_attr("RTA_TABLE") or r["table"]
                if table not in tables or r["type"] != RTN_UNICAST:
                    continue
                zero = "::" if fam == socket.AF_INET6 else "0.0.0.0"
                dst = f"{r.get_attr('RTA_DST') or zero}/{r['dst_len']}"
                oif = r.get_attr("RTA_OIF")
                via = r.get_attr("RTA_GATEWAY")
                if r.get_attr("RTA_MULTIPATH"):
                    via, oif = "multipath", None
                st.routes.append(RouteState(dst, table, r.get_attr("RTA_PRIORITY") or 0, via,
                                            names.get(oif), r.get_attr("RTA_PREFSRC"),
                                            bool(r["flags"] & RTNH_F_ONLINK)))
    with _in_netns(netns):
        for path in desired_sysctls(cfg):
            v = _read(os.path.join(PROC_SYS, path))
            st.sysctls[path] = None if v is None else v.strip()
    for path in desired_files(cfg):
        st.files[path] = _read(path)
    return st


def plan(cfg: ProvisionConfig, netns: str | None = None) -> tuple[list[Change], list[str]]:
    return make_plan(cfg, snapshot(cfg, netns))


def _write_file(path: str, content: str) -> None:
    d = os.path.dirname(path) or "."
    os.makedirs(d, mode=0o755, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".metaroce-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(content)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _apply_one(ipr: IPRoute, c: Change, netns: str | None) -> None:
    if c.kind == "sysctl":
        with _in_netns(netns), open(os.path.join(PROC_SYS, c.detail["path"]), "w") as f:
            f.write(str(c.new))
        return
    if c.kind == "file":
        _write_file(c.detail["path"], c.new)
        return
    idx = ipr.link_lookup(ifname=c.target)[0]
    if c.kind == "mtu":
        try:
            ipr.link("set", index=idx, mtu=c.new)
        except NetlinkError as exc:
            xdp = ipr.link("get", index=idx)[0].get_attr("IFLA_XDP")
            if exc.code == 22 and xdp and xdp.get_attr("IFLA_XDP_PROG_ID"):
                raise MetaroceError(
                    f"{c.text}: refused while an XDP program is attached to {c.target} (native "
                    "XDP takes frames of one page: MTU <= 3498): stop its MetaRoCE daemon "
                    f"(systemctl stop metaroce@{c.target}, or metaroce down --dev {c.target}), "
                    "provision, then start it again") from None
            raise
    elif c.kind == "link-up":
        ipr.link("set", index=idx, state="up")
    elif c.kind in ("addr-add", "addr-del"):
        addr, plen = (c.new if c.kind == "addr-add" else c.old).split("/")
        fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
        ipr.addr("add" if c.kind == "addr-add" else "del", index=idx, address=addr,
                 prefixlen=int(plen), family=fam)
    elif c.kind in ("route-add", "route-replace"):
        r = c.detail["route"]
        kw = {"dst": r.network, "oif": idx, "table": r.table, "priority": r.kernel_metric,
              "family": socket.AF_INET6 if r.family == 6 else socket.AF_INET}
        if r.via:
            kw["gateway"] = r.via
        if r.src:
            kw["prefsrc"] = r.src
        if r.onlink:
            kw["flags"] = RTNH_F_ONLINK
        ipr.route("replace" if c.kind == "route-replace" else "add", **kw)
    else:
        raise AssertionError(c.kind)


def apply(changes: list[Change], netns: str | None = None, on_change=None) -> list[Change]:
    """Apply changes in order; stop at the first failure with a clear error. Returns what was
    applied."""
    done = []
    with _ipr(netns) as ipr:
        for c in changes:
            try:
                _apply_one(ipr, c, netns)
            except NetlinkError as exc:
                msg = exc.args[1] if len(exc.args) > 1 else os.strerror(exc.code)
                raise MetaroceError(f"{c.text}: {msg} ({len(done)} of {len(changes)} changes "
                                    "were applied before this one)") from None
            except OSError as exc:
                raise MetaroceError(f"{c.text}: {exc.strerror or exc} ({len(done)} of "
                                    f"{len(changes)} changes were applied before this one)") from None
            done.append(c)
            if on_change:
                on_change(c)
    return done
