#!/usr/bin/env python3
"""MetaRoCE against TCP on the same veth path, side by side in one run (issue 6's yardstick).

A two-host lab; both MetaRoCE daemons up; then, alternating within each repetition:
  - TCP throughput: iperf3, one stream, same duration;
  - RDMA WRITE 1 MiB, one QP: `metaroce perf write-bw` in MetaRoCE mode with each end-to-end
    check (the ICRC, and the IPv4/UDP checksums of the option CSUM, spec 5.7: both daemons run
    `--integrity csum`, and each connection asks for its check) and in RoCEv2 mode (ICRC);
    MetaRoCE connections take the fitted path MTU (spec CM-14: 1408 over the lab's IPv4 at MTU
    1500), and where that differs from the IB enum's, the CSUM run once more at the enum's
    (`perf -m`, so the fitted MTU's own effect is in the same run);
  - round trip of 64 bytes: sockperf ping-pong over TCP vs `metaroce perf write-lat`
    (MetaRoCE mode, CSUM);
  - CPU seconds per GiB moved, from the whole machine's /proc/stat over the transfer only (XDP
    runs in softirq and is charged to no single process, so per-process accounting would
    flatter MetaRoCE; process start-up is left out for both).
and TCP's best on this machine, the same iperf3 and sockperf on a bare veth pair (two namespaces,
no XDP, no switch: GSO/GRO). Medians of --runs repetitions, min and max, and the ratios
MetaRoCE / TCP against both. Every client runs on
CPU 0 and every server on CPU 1, TCP and MetaRoCE alike (the MetaRoCE daemons are not pinned:
they are the NIC); numbers are from a shared 2-vCPU VM: compare ratios.

With --rx-cpus all both daemons steer each QP's frames to one CPU (issue 21 item 3; the
results file then says so in its name).

    sudo .venv/bin/python tools/bench/vs_tcp.py [--quick | --full] [--mtu N] [--steer]
        [--rx-cpus all] [--json] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from benchlab import bare_veth, header, summary, two_hosts
from metaroce.perf.run import busy_cpu_s, busy_per_cpu_s

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PY = [sys.executable, "-m", "metaroce.cli"]
ENV = {**os.environ, "PYTHONPATH": ROOT}
LAB = "benchtcp"


SERVER_CPU, CLIENT_CPU = 1, 0   # the same placement for every contender


def in_ns(ns: str, cmd: list[str], cpu: int) -> list[str]:
    return ["ip", "netns", "exec", ns, "taskset", "-c", str(cpu)] + cmd


def timed(fn):
    c0, t0 = busy_cpu_s(), time.monotonic()
    out = fn()
    return out, busy_cpu_s() - c0, time.monotonic() - t0


def second_cpu_share(fn):
    """fn()'s result and the share of the machine's busy time (steal excluded) that fell on
    its less busy CPU while it ran (issue 21: the second CPU's part of the work)."""
    b0 = busy_per_cpu_s()
    out = fn()
    d = [b - a for a, b in zip(b0, busy_per_cpu_s())]
    return out, (min(d) / sum(d)) if sum(d) > 0 and len(d) > 1 else 0.0


def iperf(ns1, ns2, ip, seconds):
    srv = subprocess.Popen(in_ns(ns2, ["iperf3", "-s", "-1", "-p", "5299"], SERVER_CPU),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.4)
    try:
        p = subprocess.run(in_ns(ns1, ["iperf3", "-c", ip, "-p", "5299", "-t", str(seconds),
                                       "-J"], CLIENT_CPU),
                           capture_output=True, text=True, timeout=seconds + 30)
        doc = json.loads(p.stdout)
        end = doc["end"]["sum_received"]
        return {"bps": end["bits_per_second"], "bytes": end["bytes"]}
    finally:
        srv.wait(timeout=10)


def sockperf(ns1, ns2, ip, seconds):
    srv = subprocess.Popen(in_ns(ns2, ["sockperf", "server", "--tcp", "-i", ip, "-p", "5298"],
                                 SERVER_CPU),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.4)
    try:
        p = subprocess.run(in_ns(ns1, ["sockperf", "ping-pong", "--tcp", "-i", ip, "-p", "5298",
                                       "-m", "64", "-t", str(seconds), "--full-rtt"], CLIENT_CPU),
                           capture_output=True, text=True, timeout=seconds + 30)
        pct = {}
        for line in p.stdout.splitlines():       # "sockperf: ---> percentile 50.000 =   12.345"
            if "percentile" in line and "=" in line:
                k = float(line.split("percentile")[1].split("=")[0])
                pct[k] = float(line.split("=")[1])
        # --full-rtt reports round trips; perftest reports half round trips: halve to compare
        return {"lat_p50_us": pct[50.0] / 2, "lat_p99_us": pct[99.0] / 2,
                "lat_p999_us": pct[99.9] / 2}
    finally:
        srv.terminate()
        srv.wait(timeout=10)


def perf(ns1, ns2, ip, test, args, port):
    srv = subprocess.Popen(PY + ["perf", test, "--dev", "eth0", "--netns", ns2, "-p", str(port),
                                 "--cpu", str(SERVER_CPU), "--json", *args], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True, env=ENV)
    time.sleep(0.8)
    try:
        p = subprocess.run(PY + ["perf", test, ip, "--dev", "eth0", "--netns", ns1, "-p",
                                 str(port), "--cpu", str(CLIENT_CPU), "--json", *args],
                           capture_output=True, text=True, env=ENV, timeout=300)
        doc = json.loads(p.stdout)
        if "error" in doc:
            raise RuntimeError(f"metaroce perf {test}: {doc['error']}")
        return doc
    finally:
        srv.communicate(timeout=30)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", help="3 runs of 2 s (default)")
    g.add_argument("--full", action="store_true", help="7 runs of 5 s")
    ap.add_argument("--mtu", type=int, default=1500,
                    help="lab link MTU (3498 is the largest native XDP on veth takes: PMTU 2048)")
    ap.add_argument("--steer", action="store_true",
                    help="the lab's switches forward on the next CPU (lab up --steer)")
    ap.add_argument("--rx-cpus", default="auto",
                    help="the daemons' receive steering (metaroce up --rx-cpus): all hands each "
                         "QP's frames to one CPU through a cpumap (issue 21 item 3)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", default=None, help="default tools/bench/results/vs_tcp_mtuN.json")
    a = ap.parse_args()
    runs, secs = (7, 5) if a.full else (3, 2)
    from metaroce.nic.device import largest_fitted_pmtu, largest_pmtu  # noqa: PLC0415
    # the lab's addresses are IPv4: the fitted MTU of an IPv4 connection (CM-14)
    enum, fitted = largest_pmtu(a.mtu, 8192), largest_fitted_pmtu(a.mtu, 8192, ipv6=False)
    contenders = [("metaroce", "icrc", "mr", []), ("metaroce", "csum", "mr_csum", []),
                  ("roce", "icrc", "roce", [])]
    if fitted != enum:                 # the fitted MTU's own effect, side by side
        contenders.insert(2, ("metaroce", "csum", "mr_csum_enum", ["-m", str(enum)]))
    res = {k: [] for k in ("tcp_bps", "mr_bps", "mr_csum_bps", "roce_bps", "tcp_second_cpu_share",
                           "mr_csum_second_cpu_share", "tcp_cpu_s_per_gib",
                           "mr_cpu_s_per_gib", "mr_csum_cpu_s_per_gib", "roce_cpu_s_per_gib",
                           "tcp_lat_p50_us",
                           "tcp_lat_p99_us", "mr_lat_p50_us", "mr_lat_p99_us",
                           "bare_tcp_bps", "bare_tcp_lat_p50_us")}
    if fitted != enum:
        res.update({"mr_csum_enum_bps": [], "mr_csum_enum_cpu_s_per_gib": []})
    with two_hosts(LAB, mtu=a.mtu, integrity="csum", steer=a.steer, rx_cpus=a.rx_cpus) as lab, \
            bare_veth("benchbare", mtu=a.mtu) as bare:
        ns1, ns2, ip = lab.ns1, lab.ns2, lab.ip2
        gib = 1 << 30
        for r in range(runs):
            print(f"vs_tcp: run {r + 1}/{runs}", file=sys.stderr)
            (t, cpu, _), share = second_cpu_share(lambda: timed(lambda: iperf(ns1, ns2, ip, secs)))
            res["tcp_second_cpu_share"].append(share)
            res["tcp_bps"].append(t["bps"])
            res["tcp_cpu_s_per_gib"].append(cpu / (t["bytes"] / gib))
            for i, (mode, check, key, extra) in enumerate(contenders):
                doc, share = second_cpu_share(lambda: perf(
                    ns1, ns2, ip, "write-bw", ["-s", "1m", "-D", str(secs), "--mode", mode,
                                               "--integrity", check, *extra],
                    18800 + 4 * r + i))
                if key == "mr_csum":
                    res["mr_csum_second_cpu_share"].append(share)
                assert doc.get("integrity", check) == check, doc.get("integrity")
                want = fitted if mode == "metaroce" and not extra else enum
                assert doc.get("mtu", want) == want, (key, doc.get("mtu"), want)
                res[f"{key}_bps"].append(doc["bw_avg_bps"])
                res[f"{key}_cpu_s_per_gib"].append(doc["cpu_s_per_gib"])   # the timed loop only
            lat = sockperf(ns1, ns2, ip, secs)
            res["tcp_lat_p50_us"].append(lat["lat_p50_us"])
            res["tcp_lat_p99_us"].append(lat["lat_p99_us"])
            doc = perf(ns1, ns2, ip, "write-lat", ["-s", "64", "-n", "2000"], 18900 + r)
            res["mr_lat_p50_us"].append(doc["lat_p50_us"])
            res["mr_lat_p99_us"].append(doc["lat_p99_us"])
            res["bare_tcp_bps"].append(iperf(bare[0], bare[1], bare[2], secs)["bps"])
            res["bare_tcp_lat_p50_us"].append(sockperf(bare[0], bare[1], bare[2], secs)["lat_p50_us"])
    out = {k: summary(v) for k, v in res.items()}
    med = {k: v["median"] for k, v in out.items()}
    ratios = {"write_bw_metaroce_over_tcp": med["mr_bps"] / med["tcp_bps"],
              "write_bw_metaroce_csum_over_tcp": med["mr_csum_bps"] / med["tcp_bps"],
              "write_bw_roce_over_tcp": med["roce_bps"] / med["tcp_bps"],
              "lat_p50_metaroce_over_tcp": med["mr_lat_p50_us"] / med["tcp_lat_p50_us"],
              "cpu_per_gib_metaroce_over_tcp": med["mr_cpu_s_per_gib"] / med["tcp_cpu_s_per_gib"],
              "cpu_per_gib_metaroce_csum_over_tcp":
                  med["mr_csum_cpu_s_per_gib"] / med["tcp_cpu_s_per_gib"],
              "write_bw_metaroce_over_bare_veth_tcp": med["mr_bps"] / med["bare_tcp_bps"],
              "write_bw_metaroce_csum_over_bare_veth_tcp":
                  med["mr_csum_bps"] / med["bare_tcp_bps"],
              "lat_p50_metaroce_over_bare_veth_tcp":
                  med["mr_lat_p50_us"] / med["bare_tcp_lat_p50_us"]}
    if fitted != enum:
        ratios["write_bw_fitted_over_enum_pmtu_csum"] = med["mr_csum_bps"] / med["mr_csum_enum_bps"]
    doc = {**header("vs_tcp"), "runs": runs, "seconds": secs, "mtu": a.mtu,
           "pmtu": {"metaroce": fitted, "roce": enum},
           "steer": a.steer, "rx_cpus": a.rx_cpus, "results": out,
           "ratios": {k: round(v, 3) for k, v in ratios.items()}}
    a.out = a.out or os.path.join(HERE, "results", f"vs_tcp_mtu{a.mtu}"
                                  f"{'_steer' if a.steer else ''}"
                                  f"{'' if a.rx_cpus == 'auto' else '_rxcpus_' + a.rx_cpus}.json")
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1)
    if a.json:
        print(json.dumps(doc))
        return 0
    print(f"{'metric':<28}{'median':>14}{'min':>14}{'max':>14}")
    for k, v in out.items():
        print(f"{k:<28}{v['median']:>14.4g}{v['min']:>14.4g}{v['max']:>14.4g}")
    for k, v in doc["ratios"].items():
        print(f"{k:<34}{v:>8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
