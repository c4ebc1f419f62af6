"""`metaroce demo`: the embedded default run on this machine (a two-host lab)."""

import socket
import time

import click

from ..lab import core, fabric
from ..lab.traffic import udp_socket
from .output import emit_json, json_option, log

DEMO_LAB = "demo"
PROBES = 16
ROCE_PORT = 4791


def _probe(view, src: str, dst: str, family: int) -> dict:
    """Send UDP probes src -> dst; count them in dst's XDP program and at dst's socket."""
    s_node, d_node = view.plan.node(src), view.plan.node(dst)
    d_if = d_node.iface("eth0")
    addr = (d_if.ipv4 if family == socket.AF_INET else d_if.ipv6).split("/")[0]
    d_port = view.ports[(dst, "eth0")]
    rx = udp_socket(d_node.netns, family, ("", ROCE_PORT))
    tx = udp_socket(s_node.netns, family)
    rx.settimeout(1.0)
    with fabric.Fabric(view.name) as fab:
        before = fab.port_stats(d_port)["rx_packets"]
        for i in range(PROBES):
            tx.sendto(f"metaroce probe {i}".encode(), (addr, ROCE_PORT))
        got = 0
        try:
            while got < PROBES:
                rx.recv(2048)
                got += 1
        except socket.timeout:
            pass
        seen = fab.port_stats(d_port)["rx_packets"] - before
    rx.close()
    tx.close()
    return {"from": src, "to": dst, "ip_version": 4 if family == socket.AF_INET else 6,
            "sent": PROBES, "xdp_counted": seen, "received": got,
            "ok": got == PROBES and seen >= PROBES}


@click.command()
@json_option
def demo(as_json):
    """Bring up a two-host lab, prove the XDP data path sees traffic on both hosts, tear down."""
    core.preflight()
    if DEMO_LAB in core.state.names() or core.namespaces_of(DEMO_LAB):
        log("demo: removing a demo lab left by an earlier run")
        core.down(DEMO_LAB)
    t0 = time.monotonic()
    rec = core.up(DEMO_LAB, "pair")
    up_s = time.monotonic() - t0
    try:
        view = core.LabView(DEMO_LAB)
        probes = [_probe(view, a, b, fam) for fam in (socket.AF_INET, socket.AF_INET6)
                  for a, b in (("h1", "h2"), ("h2", "h1"))]
        attached = {h: fabric.xdp_attached(view.plan.node(h).netns, "eth0") for h in ("h1", "h2")}
    finally:
        core.down(DEMO_LAB)
    ok = all(p["ok"] for p in probes) and all(attached.values())
    doc = {"ok": ok, "xdp_mode": rec["xdp_mode"], "lab_up_s": round(up_s, 3),
           "hosts": {h: a for h, a in attached.items()}, "probes": probes}
    if as_json:
        emit_json(doc)
    else:
        click.echo(f"MetaRoCE demo: two-host lab up in {up_s:.2f} s, XDP {rec['xdp_mode']} on both hosts")
        for p in probes:
            click.echo(f"  IPv{p['ip_version']} {p['from']} -> {p['to']}: sent {p['sent']}, "
                       f"XDP counted {p['xdp_counted']}, socket received {p['received']}"
                       f"  {'ok' if p['ok'] else 'FAILED'}")
        click.echo("demo: " + ("ok" if ok else "FAILED"))
    return 0 if ok else 1
