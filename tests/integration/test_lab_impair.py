"""Impairment on the switch side of a link: loss (XDP on arrival; on departure XDP for the
frames a switch redirects, tc for those the bridge sends),
duplication (tc clone-redirect) and reordering (tc hold-and-release), each within ±30 % of
the asked fraction over 20,000 frames with a fixed seed; only UDP 4791 unless --all-traffic."""

import json
import os
import socket
import subprocess
import sys

import pytest

from metaroce.lab import core
from metaroce.lab.impair import Impairment, lost_draws
from metaroce.lab.traffic import run_flow

N = 20_000
P = 0.10
FLUSH = 32      # trailing frames of run_flow: impaired too, not counted by the receiver


@pytest.fixture(scope="module")
def pair(module_lab_name):
    core.up(module_lab_name, "pair")
    return core.LabView(module_lab_name)


def _flow(view, direction, count=N, port=4791, family=socket.AF_INET):
    # link h1-sw1: a = h1, b = sw1. a-b = h1 -> h2 arriving at sw1; b-a = h2 -> h1 leaving sw1.
    src, dst = ("h1", "h2") if direction == "a-b" else ("h2", "h1")
    itf = view.plan.node(dst).iface("eth0")
    addr = (itf.ipv4 if family == socket.AF_INET else itf.ipv6).split("/")[0]
    return run_flow(view.plan.node(src).netns, view.plan.node(dst).netns, addr, count,
                    port=port, family=family)


def _stats(view, direction):
    link = {l["name"]: l for l in view.status()["links"]}["h1-sw1"]
    return link["counters"][direction]["impair"]


def _within(measured, expected, tol=0.30):
    return abs(measured - expected) <= tol * expected


@pytest.mark.parametrize("direction", ["a-b", "b-a"])
@pytest.mark.parametrize("kind", ["loss", "dup", "reorder"])
def test_impairment_fraction(pair, kind, direction):
    before = _stats(pair, direction)
    pair.impair("h1-sw1", direction, Impairment(**{kind: P, "seed": 42}).validate())
    try:
        res = _flow(pair, direction)
    finally:
        pair.impair("h1-sw1", direction, None)
    after = _stats(pair, direction)
    delta = {k: after[k] - before[k] for k in after}
    assert res.sent == N
    if kind == "loss":
        assert res.duplicates == 0 and res.late == 0
        assert _within(res.lost / N, P), res
        assert res.lost <= delta["lost"] <= res.lost + FLUSH, (delta, res)
    elif kind == "dup":
        assert res.lost == 0, res
        assert _within(res.duplicates / N, P), res
        assert res.duplicates <= delta["duplicated"] <= res.duplicates + FLUSH, (delta, res)
    else:
        assert res.lost == 0 and res.duplicates == 0, res
        assert _within(res.late / N, P), res
        assert res.late <= delta["reordered"] <= res.late + FLUSH, (delta, res)


@pytest.mark.parametrize("direction", ["a-b", "b-a"])
def test_same_seed_same_losses(pair, direction):
    """Setting an impairment starts its draw sequence over, so the same seed drops the same
    frames of the same traffic: exactly the ones the fabric's splitmix64 draws predict,
    whichever path (XDP on arrival, XDP redirect or tc on departure) draws them."""
    patterns = []
    for seed in (7, 7, 8):
        pair.impair("h1-sw1", direction, Impairment(loss=0.2, seed=seed).validate())
        try:
            res = _flow(pair, direction, count=2000)
        finally:
            pair.impair("h1-sw1", direction, None)
        assert res.sent == 2000 and res.duplicates == 0
        patterns.append(sorted(set(range(2000)) - res.seen))
    assert patterns[0] == patterns[1] == lost_draws(7, 0.2, 2000)
    assert patterns[2] == lost_draws(8, 0.2, 2000) != patterns[0]
    assert _within(len(patterns[0]) / 2000, 0.2)


def test_only_roce_unless_all_traffic(pair):
    pair.impair("h1-sw1", "both", Impairment(loss=0.5, seed=1).validate())
    try:
        other = _flow(pair, "a-b", count=2000, port=5000)
        assert other.lost == 0, "non-RoCE traffic must pass untouched by default"
        v6 = _flow(pair, "a-b", count=2000, family=socket.AF_INET6)
        assert _within(v6.lost / 2000, 0.5), v6
    finally:
        pair.impair("h1-sw1", "both", None)
    pair.impair("h1-sw1", "a-b", Impairment(loss=0.5, seed=1, all_traffic=True).validate())
    try:
        other = _flow(pair, "a-b", count=2000, port=5000)
        assert _within(other.lost / 2000, 0.5), other
    finally:
        pair.impair("h1-sw1", "a-b", None)


def _cli(*args):
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.dirname(__file__)))}
    return subprocess.run([sys.executable, "-m", "metaroce.cli", *args], capture_output=True,
                          text=True, env=env, timeout=60)


def _impair_of(view, link="h1-sw1"):
    """What the lab's record says now (another process changed it)."""
    links = core.LabView(view.name).status(counters=False)["links"]
    return {l["name"]: l for l in links}[link]["impair"]


def test_cli_needs_an_impairment_or_clear_and_says_what_it_set(pair):
    """`lab impair h1` with no impairment flag silently cleared the link's impairment, and
    its success output was a Python dict on stderr."""
    name = pair.name
    set_ = _cli("lab", "impair", "--name", name, "h1", "--loss", "0.05", "--dup", "0.01",
                "--seed", "3")
    try:
        assert set_.returncode == 0 and set_.stdout == "", set_.stderr
        assert set_.stderr == ("link h1-sw1: a-b: loss 5% duplicate 1% seed 3; "
                               "b-a: loss 5% duplicate 1% seed 3\n"), set_.stderr
        before = _impair_of(pair)
        assert before["a-b"]["loss"] == 0.05

        for args in ([], ["--dir", "a-b"], ["--seed", "9"], ["--reorder-depth", "4"]):
            p = _cli("lab", "impair", "--name", name, "h1", *args)
            assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
            assert "no impairment given" in p.stderr and "--clear" in p.stderr
            pj = _cli("lab", "impair", "--name", name, "h1", *args, "--json")
            assert pj.returncode == 2 and "no impairment given" in json.loads(pj.stdout)["error"]
        p = _cli("lab", "impair", "--name", name, "h1", "--clear", "--loss", "0.2")
        assert p.returncode == 2 and "--clear takes no impairment options" in p.stderr
        assert _impair_of(pair) == before              # none of these touched the link

        half = _cli("lab", "impair", "--name", name, "h1", "--clear", "--dir", "b-a", "--json")
        assert half.returncode == 0 and half.stderr == ""
        doc = json.loads(half.stdout)                  # one JSON document on stdout
        assert doc["link"] == "h1-sw1" and set(doc["impair"]) == {"a-b"}
    finally:
        clear = _cli("lab", "impair", "--name", name, "h1", "--clear")
    assert clear.returncode == 0 and clear.stderr == "link h1-sw1: no impairment\n"
    assert _impair_of(pair) == {}
