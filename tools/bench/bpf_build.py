#!/usr/bin/env python3
"""What the BPF build cache saves: the NIC program (bpf/nic) and the lab fabric (bpf/lab) built
by BCC/clang into an empty cache, then loaded again from it; and `metaroce up` on a lab host
with an empty cache and with a filled one. Each --runs times with a fresh temporary cache
directory (the machine's own cache is not touched); median (min, max).

    sudo .venv/bin/python tools/bench/bpf_build.py [--runs N] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

from benchlab import fresh_lab, header, save, summary
from metaroce.kern.bcc_loader import build_program
from metaroce.lab import core
from metaroce.lab.fabric import MAX_PORTS, PROGRAMS
from metaroce.nic import daemon as d
from metaroce.nic.rx import RxPath

LAB = "benchbpf"


def _fabric():
    return build_program("lab/fabric.bpf.c", {"MAX_PORTS": MAX_PORTS}, dict(PROGRAMS.values()))


def one_build(make, close) -> dict:
    """Seconds to build into an empty cache, then from it."""
    out = {}
    for source in ("compiled", "cache"):
        t0 = time.monotonic()
        prog = make()
        out[source] = time.monotonic() - t0
        info = prog.build_info
        close(prog)
        if info["source"] != source:
            raise RuntimeError(f"expected a {source} build, got {info}")
    return out


def one_up(dev) -> dict:
    out = {}
    for source in ("compiled", "cache"):
        t0 = time.monotonic()
        d.start_background(dev, "metaroce")
        out[source] = time.monotonic() - t0
        d.stop(dev)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    raw = {"nic": [], "fabric": [], "metaroce_up": []}
    saved = os.environ.get("METAROCE_BPF_CACHE")
    view = fresh_lab(LAB, "pair")
    dev = d.DeviceId("eth0", view.plan.node("h1").netns)
    try:
        for r in range(a.runs):
            for what in raw:
                print(f"bpf_build: run {r + 1}/{a.runs} {what}", file=sys.stderr)
                tmp = tempfile.mkdtemp(prefix="mr-bpfcache-")      # 0700, ours (root)
                os.environ["METAROCE_BPF_CACHE"] = tmp
                try:
                    if what == "nic":
                        raw[what].append(one_build(RxPath, lambda rx: rx.close()))
                    elif what == "fabric":
                        raw[what].append(one_build(_fabric, lambda b: b.cleanup()))
                    else:
                        raw[what].append(one_up(dev))
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
    finally:
        if saved is None:
            os.environ.pop("METAROCE_BPF_CACHE", None)
        else:
            os.environ["METAROCE_BPF_CACHE"] = saved
        core.down(LAB)
    doc = {**header("bpf_build"), "runs": a.runs,
           "results": {w: {s: summary([x[s] for x in rs]) for s in ("compiled", "cache")}
                       for w, rs in raw.items()}}
    save(doc, "bpf_build")
    if a.json:
        print(json.dumps(doc))
        return 0
    print(f"{'what':<12} {'compiled s':>10} {'from cache s':>12}")
    for w, r in doc["results"].items():
        print(f"{w:<12} {r['compiled']['median']:>10.2f} {r['cache']['median']:>12.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
