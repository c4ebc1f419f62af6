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
from .output import emit_json, json_option, log
from ..numbers import parse_uint
from .params import QPN, fmt_qpn

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
        try:
            return parse_uint(doc.get(key), bits, key)
        except ValueError as exc:
            raise MetaroceError(f"{path}: {exc}") from None
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
    click.echo(f"qpn {fmt_qpn(doc['qpn'])} psn 0x{doc['psn']:06x} ip {doc['ip']} "
               f"mac {doc['mac']} mtu {doc['mtu']} mode {doc['mode']}")
    click.echo(f"mr rkey 0x{doc['rkey']:08x} addr 0x{doc['addr']:x} length {doc['length']} "
               f"access {access}")


@qp.command()
@click.argument("qpn", type=QPN)
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
    click.echo(f"qpn {fmt_qpn(rep['qpn'])} {rep['state']} -> {fmt_qpn(remote['qpn'])} at {remote['ip']} "
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
        click.echo(f"qpn {fmt_qpn(e['qpn'])} {e['state']} mode {e['mode']} rkey 0x{e['rkey']:08x} "
                   f"length {e['length']} peer {peer.get('ip', '-')} completions {e['completions']}")


@qp.command()
@click.argument("qpn", type=QPN)
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
                for k, v in _show_lines(e):
                    click.echo(f"{k:<24} {v}")
            return
    raise MetaroceError(f"no endpoint with QP {fmt_qpn(qpn)} on {dev}")


HEX_KEYS = {"qpn": fmt_qpn, "qp_num": fmt_qpn, "src_qp": fmt_qpn, "rkey": "0x{:08x}".format,
            "addr": "0x{:x}".format}


def _show_lines(doc: dict, prefix: str = ""):
    """An endpoint as `key value` pairs: nested objects as dotted keys, QP numbers and keys
    in hex (as rdma-core prints them), each completion on its own line."""
    for k, v in doc.items():
        name = prefix + k
        if isinstance(v, dict):
            yield from _show_lines(v, name + ".")
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            for i, x in enumerate(v):
                yield f"{name}[{i}]", " ".join(f"{a} {b}" for a, b in _show_lines(x))
        elif k in HEX_KEYS and isinstance(v, int) and not isinstance(v, bool):
            yield name, HEX_KEYS[k](v)
        else:
            yield name, "-" if v is None else v


@qp.command()
@click.argument("qpn", type=QPN)
@dev_option
@netns_option
@json_option
def destroy(qpn, dev, netns, as_json):
    """Destroy endpoint QPN with its MR, CQ and PD."""
    require_root("metaroce qp destroy")
    _request(dev, netns, {"op": "destroy_endpoint", "qpn": qpn})
    if as_json:
        emit_json({"destroyed": qpn})
    else:
        log(f"qpn {fmt_qpn(qpn)} destroyed")
