"""`metaroce qp create | connect | show | list | destroy`: endpoints (PD + MR + CQ + RC QP) that
the daemon holds on its own, so that any RoCEv2 RC peer described by a file can be connected to
one: `metaroce qp create --json > mine.json`, give mine.json to the peer, get its file back,
`metaroce qp connect QPN --remote theirs.json`."""

import ipaddress
import json

import click

from ..errors import MetaroceError
from ..system import require_root
from .nic import _dev, dev_option, netns_option
from .output import emit_json, json_option

ACCESS_FLAGS = {"local_write": 1, "remote_write": 2, "remote_read": 4, "remote_atomic": 8}
PMTUS = (256, 512, 1024, 2048, 4096)


def _access(text: str) -> int:
    bits = 0
    for name in filter(None, (t.strip() for t in text.split(","))):
        if name not in ACCESS_FLAGS:
            raise click.BadParameter(f"unknown access flag {name!r} (one of "
                                     f"{', '.join(ACCESS_FLAGS)})", param_hint="--access")
        bits |= ACCESS_FLAGS[name]
    return bits


def _request(dev, netns, req: dict) -> dict:
    from ..nic import daemon as d  # noqa: PLC0415
    rep, fds = d.request(_dev(dev, netns), {**req, "persistent": True})
    import os  # noqa: PLC0415
    for fd in fds:                      # the endpoint's memory stays with the daemon
        os.close(fd)
    if "error" in rep:
        raise MetaroceError(rep["error"])
    return rep


def read_remote(path: str) -> dict:
    """A peer's attributes from a file: qpn, psn, ip (or gid); mtu, mac optional; numbers may be
    decimal or "0x…" strings. Every problem is one clear message."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as exc:
        raise MetaroceError(f"cannot read {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise MetaroceError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(doc, dict):
        raise MetaroceError(f"{path}: expected a JSON object with qpn, psn and ip")

    def number(key: str, bits: int) -> int:
        v = doc.get(key)
        try:
            n = int(v, 0) if isinstance(v, str) else int(v)
        except (TypeError, ValueError):
            raise MetaroceError(f"{path}: {key} must be a number, got {v!r}") from None
        if not 0 <= n < (1 << bits):
            raise MetaroceError(f"{path}: {key} must fit in {bits} bits")
        return n
    out = {"qpn": number("qpn", 24), "psn": number("psn", 24)}
    ip = doc.get("ip") or doc.get("gid")
    try:
        ip = str(ipaddress.ip_address(str(ip)))
    except ValueError:
        raise MetaroceError(f"{path}: ip (or gid) must be an IPv4 or IPv6 address, "
                            f"got {ip!r}") from None
    out["ip"] = ip
    if "mtu" in doc:
        mtu = number("mtu", 16)
        if mtu not in PMTUS:
            raise MetaroceError(f"{path}: mtu must be one of {PMTUS}")
        out["mtu"] = mtu
    return out


@click.group()
def qp():
    """Endpoints the daemon holds: create one, connect it to a peer described by a file."""


@qp.command()
@dev_option
@netns_option
@click.option("--mr-size", type=click.IntRange(1, 1 << 34), default=1 << 20, show_default=True,
              help="Bytes of the endpoint's memory region.")
@click.option("--access", default="local_write,remote_write,remote_read,remote_atomic",
              show_default=True, help="Comma-separated MR access flags.")
@click.option("--max-send-wr", type=click.IntRange(1, 4096), default=1024, show_default=True)
@json_option
def create(dev, netns, mr_size, access, max_send_wr, as_json):
    """Create an endpoint; print its QP and MR attributes (what a peer needs)."""
    require_root("metaroce qp create")
    bits = _access(access)
    rep = _request(dev, netns, {"op": "create_endpoint", "mr_bytes": mr_size, "access": bits,
                                "cap": {"max_send_wr": max_send_wr}})
    doc = {"dev": dev, "netns": netns, "qpn": rep["qpn"], "psn": rep["psn"], "ip": rep["gid"],
           "gid": rep["gid"], "addrs": rep["addrs"], "mac": rep["mac"], "mtu": rep["mtu"],
           "mode": rep["mode"], "rkey": rep["rkey"], "lkey": rep["lkey"], "addr": rep["addr"],
           "length": rep["length"], "access": rep["access"]}
    if as_json:
        emit_json(doc)
        return
    click.echo(f"qpn 0x{doc['qpn']:06x} ({doc['qpn']}) psn {doc['psn']} ip {doc['ip']} "
               f"mac {doc['mac']} mtu {doc['mtu']} mode {doc['mode']}")
    click.echo(f"mr rkey 0x{doc['rkey']:08x} addr 0x{doc['addr']:x} length {doc['length']} "
               f"access {access}")


@qp.command()
@click.argument("qpn", type=int)
@dev_option
@netns_option
@click.option("--remote", "remote_file", required=True, type=click.Path(dir_okay=False),
              help="JSON file of the peer: qpn, psn, ip (or gid), optionally mtu.")
@click.option("--timeout", type=click.IntRange(0, 31), default=14, show_default=True,
              help="Local ACK timeout code (4.096 us * 2^code; 0 = infinite).")
@click.option("--retry-cnt", type=click.IntRange(0, 7), default=7, show_default=True)
@click.option("--rnr-retry", type=click.IntRange(0, 7), default=7, show_default=True)
@json_option
def connect(qpn, dev, netns, remote_file, timeout, retry_cnt, rnr_retry, as_json):
    """Connect endpoint QPN (INIT -> RTR -> RTS) to the peer described by --remote."""
    require_root("metaroce qp connect")
    remote = read_remote(remote_file)
    rep = _request(dev, netns, {"op": "connect_qp", "qpn": qpn, "remote": remote,
                                "attr": {"timeout": timeout, "retry_cnt": retry_cnt,
                                         "rnr_retry": rnr_retry}})
    if as_json:
        emit_json(rep)
        return
    click.echo(f"qpn 0x{rep['qpn']:06x} {rep['state']} -> 0x{remote['qpn']:06x} at {remote['ip']} "
               f"(mtu {rep['mtu']}, next hop {rep['path']['next_hop']}, dmac {rep['path']['dmac']})")


def _endpoints(dev, netns) -> list[dict]:
    return _request(dev, netns, {"op": "list_endpoints"})["endpoints"]


@qp.command(name="list")
@dev_option
@netns_option
@json_option
def list_(dev, netns, as_json):
    """The endpoints the daemon holds."""
    require_root("metaroce qp list")
    eps = _endpoints(dev, netns)
    if as_json:
        emit_json({"dev": dev, "endpoints": eps})
        return
    for e in eps:
        peer = e.get("remote") or {}
        click.echo(f"qpn 0x{e['qpn']:06x} {e['state']} mode {e['mode']} rkey 0x{e['rkey']:08x} "
                   f"length {e['length']} peer {peer.get('ip', '-')} completions {e['completions']}")


@qp.command()
@click.argument("qpn", type=int)
@dev_option
@netns_option
@json_option
def show(qpn, dev, netns, as_json):
    """One endpoint: QP state, counters and its last completions."""
    require_root("metaroce qp show")
    for e in _endpoints(dev, netns):
        if e["qpn"] == qpn:
            if as_json:
                emit_json(e)
            else:
                for k, v in e.items():
                    click.echo(f"{k:<24} {v}")
            return
    raise MetaroceError(f"no endpoint with QP {qpn} (0x{qpn:06x}) on {dev}")


@qp.command()
@click.argument("qpn", type=int)
@dev_option
@netns_option
@json_option
def destroy(qpn, dev, netns, as_json):
    """Destroy endpoint QPN with its MR, CQ and PD."""
    require_root("metaroce qp destroy")
    _request(dev, netns, {"op": "destroy_endpoint", "qpn": qpn})
    if as_json:
        emit_json({"destroyed": qpn})
