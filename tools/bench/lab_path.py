"""What the lab's own path carries: iperf3 between the two hosts of a pair lab (no MetaRoCE
daemon; the lab's host-port programs on both eth0), one TCP stream and one unlimited UDP
stream of MTU-sized datagrams, client on CPU 0 and server on CPU 1 (as vs_tcp.py), at each MTU.

    sudo .venv/bin/python tools/bench/lab_path.py [--mtus 1500,9000] [--runs 3] [--seconds 5]
                                                  [--compare-stack] [--label NAME] [--name LAB]

With --compare-stack every run is made twice on the same lab, alternating: with the switch
forwarding in XDP, and with XDP forwarding turned off (every port's domain 0 in the fabric's
port_cfg map, read per frame), so frames take the bridge and tc as on an impaired link: what
XDP forwarding gains on the same native programs at the same moment. For UDP, besides what
iperf3's server read, the fabric's host-end counter says how many of the datagrams sent the
lab delivered to the receiving host (the rest the receiving socket dropped). Results go into
results/lab_path.json under --label, so runs of two checkouts (before/after) sit side by side."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from benchlab import RESULTS, fresh_lab, header, load, save, summary  # noqa: E402
from metaroce.lab import core  # noqa: E402

LAB = "benchpath"
SERVER_CPU, CLIENT_CPU = 1, 0
PORT = 5301


def _in_ns(ns: str, cmd: list[str], cpu: int) -> list[str]:
    return ["ip", "netns", "exec", ns, "taskset", "-c", str(cpu)] + cmd


def _host_rx_packets(view) -> int:
    """Frames the lab delivered to h2 (its host-end XDP program's counter)."""
    link = {l["name"]: l for l in view.status()["links"]}["h2-sw1"]
    return link["counters"]["b-a"]["rx_packets"]


def iperf3(view, seconds: int, udp_len: int | None) -> dict:
    """One iperf3 run from h1 to h2: received bit/s (UDP: also sent, lost, delivered)."""
    ns1, ns2 = (view.plan.node(h).netns for h in ("h1", "h2"))
    ip = view.plan.node("h2").iface("eth0").ipv4.split("/")[0]
    srv = subprocess.Popen(_in_ns(ns2, ["iperf3", "-s", "-1", "-p", str(PORT)], SERVER_CPU),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.4)
    extra = ["-u", "-b", "0", "-l", str(udp_len)] if udp_len else []
    rx0 = _host_rx_packets(view)
    try:
        p = subprocess.run(_in_ns(ns1, ["iperf3", "-c", ip, "-p", str(PORT), "-t", str(seconds),
                                        "-J", *extra], CLIENT_CPU),
                           capture_output=True, text=True, timeout=seconds + 30)
        end = json.loads(p.stdout)["end"]
    finally:
        srv.wait(timeout=15)
    if not udp_len:
        return {"bps": end["sum_received"]["bits_per_second"]}
    sent = end["sum"]["packets"]
    delivered = _host_rx_packets(view) - rx0
    return {"bps": end["sum_received"]["bits_per_second"],
            "sent_bps": end["sum_sent"]["bits_per_second"],
            "lost_percent": end["sum"]["lost_percent"],
            "lab_delivered_percent": min(100.0, 100.0 * delivered / sent) if sent else None}


def set_forwarding(view, xdp: bool) -> None:
    """Turn the switch's XDP forwarding on (the domains lab up set) or off (domain 0)."""
    from metaroce.lab.fabric import Fabric  # noqa: PLC0415
    with Fabric(view.name) as fab:
        for (node, _iface), port in view.ports.items():
            if view.plan.node(node).role != "host":
                fab.set_port(port, view.plan.switch_domain(node) if xdp else 0, shaped=False)


def _row(view, mtu, forwarding, tcp, udp) -> dict:
    return {"mtu": mtu, "xdp_mode": view.record["xdp_mode"], "forwarding": forwarding,
            "tcp_bps": summary([r["bps"] for r in tcp]),
            "udp_bps": summary([r["bps"] for r in udp]),
            "udp_sent_bps": summary([r["sent_bps"] for r in udp]),
            "udp_lost_percent": summary([r["lost_percent"] for r in udp]),
            "udp_lab_delivered_percent": summary([r.get("lab_delivered_percent") for r in udp])}


def measure(lab: str, mtu: int, runs: int, seconds: int, compare_stack: bool) -> list[dict]:
    view = fresh_lab(lab, "pair", mtu=mtu)
    own = view.record.get("forwarding", "stack")
    paths = [own, "stack"] if compare_stack and own == "xdp" else [own]
    tcp = {p: [] for p in paths}
    udp = {p: [] for p in paths}
    try:
        for _ in range(runs):                 # alternate, so drifting load hits every path alike
            for path in paths:
                if compare_stack and own == "xdp":
                    set_forwarding(view, path == "xdp")
                tcp[path].append(iperf3(view, seconds, None))
                udp[path].append(iperf3(view, seconds, mtu - 28))
        return [_row(view, mtu, p, tcp[p], udp[p]) for p in paths]
    finally:
        core.down(lab)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mtus", default="1500,9000")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--compare-stack", action="store_true",
                    help="also forward through the bridge and tc, alternating with XDP")
    ap.add_argument("--label", default=None)
    ap.add_argument("--name", default=LAB, help="the lab's name")
    args = ap.parse_args()
    doc = header("lab_path")
    results = [r for m in args.mtus.split(",")
               for r in measure(args.name, int(m), args.runs, args.seconds, args.compare_stack)]
    label = args.label or f"{results[0]['xdp_mode']} XDP at every MTU"
    path = os.path.join(RESULTS, "lab_path.json")
    try:
        with open(path) as f:
            old = json.load(f)
    except (OSError, ValueError):
        old = {"benchmark": "lab_path", "variants": {}}
    doc["load_end"] = load()
    old["variants"][label] = {**doc, "runs": args.runs, "seconds": args.seconds,
                              "results": results}
    print(json.dumps(old["variants"][label], indent=1))
    print(save(old, "lab_path"), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
