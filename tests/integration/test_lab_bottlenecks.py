"""A rate-limited link delivers its rate (±20 %) and marks CE only under overload."""


import pytest

from metaroce.lab import core
from metaroce.lab.traffic import run_flow

RATE = 100_000_000        # low enough that a Python sender overloads it on a busy 2-vCPU machine
SIZE = 1400
WIRE = SIZE + 8 + 20 + 14          # UDP, IPv4, Ethernet: what htb counts


@pytest.fixture(scope="module")
def shaped(module_lab_name):
    core.up(module_lab_name, "pair", rate=f"{RATE}bit", ecn_threshold=30_000)
    return core.LabView(module_lab_name)


def _h2(view):
    return view.plan.node("h2").iface("eth0").ipv4.split("/")[0]


def test_rate_limited_link_delivers_its_rate(shaped):
    h1, h2 = shaped.plan.node("h1"), shaped.plan.node("h2")
    res = run_flow(h1.netns, h2.netns, _h2(shaped), 0, size=SIZE, burst=0, duration_s=1.5, flush=4)
    wire_bps = res.received * WIRE * 8 / res.duration_s
    offered_bps = res.sent * WIRE * 8 / 1.5
    assert offered_bps > 1.5 * RATE, f"sender too slow to overload the link: {offered_bps:.3g}"
    assert 0.8 * RATE <= wire_bps <= 1.2 * RATE, f"delivered {wire_bps:.4g} bit/s for {RATE}"
    link = {l["name"]: l for l in shaped.status()["links"]}["h2-sw1"]["counters"]["b-a"]
    assert link["queue_drops"] > 0, "overload must overflow the shaped queue"


def test_ecn_marks_under_overload_only(shaped):
    h1, h2 = shaped.plan.node("h1"), shaped.plan.node("h2")
    before = {l["name"]: l for l in shaped.status()["links"]}["h2-sw1"]["counters"]["b-a"]["ecn_marked"]
    # well under the rate: 8 frames per ~4 ms gap, about 23 % of 100 Mbit/s
    calm = run_flow(h1.netns, h2.netns, _h2(shaped), 2000, size=SIZE, tos=0x02, burst=8, gap_s=0.004)
    assert calm.unique == 2000 and calm.ce == 0, calm
    # overload with ECT(0) frames: the virtual queue exceeds its threshold, frames leave with CE
    hot = run_flow(h1.netns, h2.netns, _h2(shaped), 0, size=SIZE, tos=0x02, burst=0, duration_s=1.0)
    assert hot.ce > 0.5 * hot.received, hot
    after = {l["name"]: l for l in shaped.status()["links"]}["h2-sw1"]["counters"]["b-a"]["ecn_marked"]
    assert after - before >= hot.ce
    # not-ECT traffic is never marked
    plain = run_flow(h1.netns, h2.netns, _h2(shaped), 0, size=SIZE, burst=0, duration_s=0.5)
    assert plain.ce == 0
