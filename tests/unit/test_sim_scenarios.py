"""Scenario expectations on the packet-level simulator running the real engine (the C engine,
metaroce.cengine).

Sizes are written in each test; every number asserted is simulator output (simulated time,
never wall-clock). Each expectation is also shown to FAIL against a deliberately broken
component (a test-only break switch of the C engine, or a broken switch model), so the checks
can fail at all.

Clauses: SACK-1, SACK-4, SACK-5, CC-1, CC-3, CC-8, MP-1, MP-3, MP-4, MP-5, RTO-2, COMPAT-2.
"""

import pytest

from metaroce.sim import net as N
from metaroce.sim import scenarios as S

LOSS = dict(rate_gbps=100, size_mib=8, msg_kib=1024)  # one QP, 8 MiB, 1 MiB WRITEs, 100G
INCAST = dict(rate_gbps=100, size_kib=512, msg_kib=256)  # 32 QPs x 512 KiB into one 100G link
MP = dict(host_gbps=400, fabric_gbps=100, size_mib=16, msg_kib=1024)  # 400G hosts, 100G spines


def test_one_percent_loss_metaroce_keeps_goodput_compat_collapses():
    """SACK-4/SACK-5: at 1 % random loss MetaRoCE keeps >= 90 % of its lossless goodput;
    compat go-back-N (COMPAT-2) falls below half of its own."""
    mr = S.run_loss(0.01, "metaroce", seed=1, **LOSS)
    gbn = S.run_loss(0.01, "roce", seed=1, **LOSS)
    assert mr["drops"] > 0 and mr["app_errors"] == 0 and gbn["app_errors"] == 0
    assert mr["goodput_ratio"] >= 0.90
    assert mr["lossless_goodput_bps"] >= 90e9  # near line rate without loss
    assert gbn["goodput_ratio"] < 0.5
    assert gbn["goodput_bps"] < 0.5 * mr["goodput_bps"]
    assert mr["retransmissions"] <= 2 * mr["drops"]  # holes only, not windows
    assert gbn["retransmissions"] > 10 * gbn["drops"]  # go-back-N resends whole windows


def test_loss_is_seeded_and_reproducible():
    a = S.run_loss(0.02, "metaroce", seed=7, baseline=False, **LOSS)
    b = S.run_loss(0.02, "metaroce", seed=7, baseline=False, **LOSS)
    c = S.run_loss(0.02, "metaroce", seed=8, baseline=False, **LOSS)
    assert a == b and a != c


def test_incast_with_credits_bounds_queue_and_is_fair():
    """CC-8: 32-to-1 incast with receiver credits: no drop, the bottleneck queue stays below
    the sum of the initial credits plus one BDP (far below the 1 MiB buffer), Jain >= 0.95.
    Without credits the line-rate start overflows the buffer."""
    cr = S.run_incast(32, True, "metaroce", seed=1, **INCAST)
    bdp = 100e9 * S.base_rtt_ns([100e9] * 2, 1_000) / 8e9
    bound = 32 * 2 * (S.MTU + 200) + bdp
    assert cr["app_errors"] == 0 and cr["completed_flows"] == 32
    assert cr["drops"] == 0 and cr["max_queue_bytes"] <= bound < S.Fabric().buffer_bytes / 2
    assert cr["jain_fairness"] >= 0.95 and cr["goodput_bps"] >= 90e9
    assert cr["credit_grants"] >= 32
    free = S.run_incast(32, False, "metaroce", seed=1, **INCAST)
    assert free["drops"] > 0 and free["max_queue_bytes"] > 2 * bound


def test_incast_shares_keep_the_link_full():
    """Rules decided (docs/engine.md): shares of ceil(BDP / senders) keep one BDP in flight.
    8 senders on a 14-packet BDP: 8 x 2 packets, the link stays near line rate (BDP // 8 = 1
    packet each left 43 % of it idle: 56 Gbit/s)."""
    r = S.run_incast(8, True, "metaroce", seed=1, **INCAST)
    assert r["drops"] == 0 and r["app_errors"] == 0 and r["goodput_bps"] >= 90e9
    assert r["max_queue_bytes"] < S.Fabric().buffer_bytes / 4


def test_incast_checks_fail_when_senders_ignore_credit():
    """The queue-bound expectation fails against a sender that ignores its credit limit."""
    broken = S.run_incast(32, True, "metaroce", seed=1, _test_break="ignore_credit", **INCAST)
    bdp = 100e9 * S.base_rtt_ns([100e9] * 2, 1_000) / 8e9
    assert broken["max_queue_bytes"] > 32 * 2 * (S.MTU + 200) + bdp


def test_leaf_spine_four_paths_triple_single_path():
    """MP-1/MP-3: spraying over 4 equal-cost paths (100G each, 400G hosts) reaches >= 3x the
    goodput of the same flow over one path; compat mode stays on one path."""
    one = S.run_multipath(1, None, "metaroce", seed=1, **MP)
    four = S.run_multipath(4, None, "metaroce", seed=1, **MP)
    roce = S.run_multipath(4, None, "roce", seed=1, **MP)
    assert one["app_errors"] == four["app_errors"] == 0
    assert one["goodput_bps"] <= 100e9
    assert four["goodput_bps"] >= 3 * one["goodput_bps"]
    assert roce["goodput_bps"] <= 100e9
    used = {p["sport"] for p in four["path_stats"] if p["sent"]}
    assert len(used) == four["entropies"] == 16


def test_multipath_check_fails_without_spraying():
    """The 3x expectation fails when the sender pins every packet to path 0."""
    four = S.run_multipath(4, None, "metaroce", seed=1, _test_break="no_spray", **MP)
    assert four["goodput_bps"] < 2 * 100e9  # far from 3x one path (evictions move path 0)


def test_path_failure_recovers_without_application_error():
    """MP-4/MP-5, SACK-5, RTO-2: the spine0 — leaf1 link fails mid-transfer; the sender
    attributes the losses to the paths through it, evicts them (new source ports) and the
    transfer completes with no application-visible error, back near the surviving capacity
    within 200 us of simulated time."""
    r = S.run_multipath(4, 100e-6, "metaroce", seed=1, **MP)
    assert r["app_errors"] == 0 and r["completed_flows"] == 1
    assert r["drops"] > 0 and r["path_evictions"] > 0
    assert r["recovery_s"] is not None and r["recovery_s"] <= 200e-6
    assert r["goodput_bps"] >= 150e9


def test_broken_switch_is_caught():
    """A test-only broken switch that forgets tail drop lets the queue grow past its buffer:
    the max_queue_bytes measurement sees it (and the healthy one never exceeds the cap)."""
    sim = N.Sim(1)
    p = N.Port(sim, "x", 10e9, 1_000, cap_bytes=10_000)
    sink = type("Sink", (), {"receive": lambda self, f, via, e: None})()
    p.peer = sink
    for _ in range(20):
        p.send(N.Frame(None, 0, 1, 1_500))
    assert p.max_q <= 10_000 and p.tail_drops == 14
    broken = N.Port(sim, "y", 10e9, 1_000, cap_bytes=None)
    broken.peer = sink
    for _ in range(20):
        broken.send(N.Frame(None, 0, 1, 1_500))
    assert broken.max_q > 10_000


def test_port_marks_ecn_fails_link_and_hashes_stably():
    sim = N.Sim(2)
    got = []
    sink = type("Sink", (), {"receive": lambda self, f, via, e: got.append((f, e))})()
    p = N.Port(sim, "x", 10e9, 1_000, ecn_bytes=3_000)
    p.peer = sink
    frames = [N.Frame(None, 0, 1, 1_500) for _ in range(5)]
    for f in frames:
        p.send(f)
    assert [f.ce for f in frames] == [False, False, False, True, True]
    p.fail()
    p.send(N.Frame(None, 0, 1, 1_500))
    assert p.down_drops == 5 + 1 and not p.up
    assert N.ecmp_hash(1, 2, 0xC001, 7) == N.ecmp_hash(1, 2, 0xC001, 7)
    assert len({N.ecmp_hash(1, 2, s, 7) % 4 for s in range(0xC000, 0xC040)}) == 4


def test_many_qps():
    """Scale: 1024 connections (2048 QPs; 32 senders x 32 QPs, 16 KiB each) into one 100G
    link at packet level. MetaRoCE with credits completes every byte; compat mode on the same
    lossy fabric loses flows to retry-exceeded (an application-visible error) after tail
    drops."""
    r = S.run_incast(32, True, "metaroce", seed=3, rate_gbps=100, size_kib=16, msg_kib=16,
                     qps=32)
    assert r["qps"] == 2048 and r["completed_flows"] == 1024 and r["app_errors"] == 0
    assert r["bytes_delivered"] == 1024 * 16 * 1024
    g = S.run_incast(32, True, "roce", seed=3, rate_gbps=100, size_kib=16, msg_kib=16, qps=32)
    assert g["completed_flows"] + g["app_errors"] == 1024 and g["app_errors"] > 0
    assert g["drops"] > 0 and g["timeouts"] > 0
