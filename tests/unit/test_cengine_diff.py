"""Differential tests: the C engine (metaroce.cengine) against the Python reference model
(metaroce.engine) on seeded event streams.

Both engines take every input in lockstep (engine_harness.Shadowed): work requests, every packet
the simulated channel delivers, every timer. Only the C engine's output goes on the wire; after
each call the two must have produced the same packets (every field, the UDP source port of
each path included), the same completions, the same next deadline and the same QP state, and at
the end the same memory. A break of the C engine alone makes them disagree (the comparison can
fail)."""

import random
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metaroce.engine import Mode, QPState
from metaroce.engine.cc import CCConfig
from metaroce.engine.credits import CreditConfig, CreditManager
from metaroce.engine.psn import diff as psn_diff
from metaroce.sim.channel import Impairment, Pair
from metaroce.wire.consts import Opcode as O
from tests.unit.engine_harness import MTU, Op, build, finish, random_ops

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])
impairments = st.builds(Impairment, delay_ns=st.integers(500, 5_000),
                        jitter_ns=st.sampled_from([0, 300, 3_000]),
                        loss=st.sampled_from([0.0, 0.05, 0.15]), dup=st.sampled_from([0.0, 0.1]))
LOSSY = Impairment(delay_ns=2_000, jitter_ns=3_000, loss=0.08, dup=0.1)


class MarkingPair(Pair):
    """A channel that also CE-marks a seeded fraction of the packets it delivers, and counts
    the SEND/WRITE packets without AckReq that reach a responder as duplicates (RESP-16)."""

    ce = 0.0
    dup_no_ackreq = 0

    def _deliver(self, qp, pkt):
        if self.ce and self._ce_rng.random() < self.ce:
            pkt = replace(pkt, ce=True)
        resp, op = qp.py.resp.state, pkt.opcode & ~0xC0 if pkt.opcode >= 0xC0 else pkt.opcode
        if resp is not None and op <= O.RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE and not pkt.ack_req \
                and psn_diff(pkt.psn, resp.epsn) < 0:
            MarkingPair.dup_no_ackreq += 1
        super()._deliver(qp, pkt)


def run(mode, wseed, nops=16, ab=LOSSY, ba=LOSSY, psn=(0xFFFFF0, 0xFFFFF4), ce=0.0, ops=None,
        until=5 * 10**9, silent_until=0, **kw):
    """One seeded workload in lockstep; returns (property violations, disagreements, run).
    silent_until: the a -> b link loses everything before this time (ns)."""
    seed = wseed
    clock = []
    if silent_until:
        ab = replace(ab, drop=lambda p, i: not clock or clock[0].now < silent_until)
    ops = ops or random_ops(random.Random(seed), nops)
    import tests.unit.engine_harness as H
    pair_cls = H.Pair
    MarkingPair.ce = ce
    MarkingPair._ce_rng = random.Random(seed ^ 0xCE)
    MarkingPair.dup_no_ackreq = 0
    H.Pair = MarkingPair
    try:
        r = build(mode, ops, seed, ab, ba, *psn, impl="diff", **kw)
    finally:
        H.Pair = pair_cls
    clock.append(r.loop)
    errs = finish(r, until)
    disagree = r.a.mismatches + r.b.mismatches + r.a.memory_differs() + r.b.memory_differs()
    return errs, disagree, r


@pytest.mark.parametrize("mode", list(Mode))
@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), nops=st.integers(1, 20), ab=impairments, ba=impairments,
       psn_a=st.integers(0, 0xFFFFFF), psn_b=st.one_of(st.integers(0xFFFFD0, 0xFFFFFF),
                                                       st.integers(0, 0xFFFFFF)))
def test_random_workloads_agree_with_the_reference(mode, seed, nops, ab, ba, psn_a, psn_b):
    errs, disagree, _ = run(mode, seed, nops, ab, ba, (psn_a, psn_b))
    assert errs == [] and disagree == []


CC = CCConfig(line_rate_bps=10e9, base_rtt_ns=10_000, target_qdelay_ns=5_000)


@pytest.mark.parametrize("mode", list(Mode))
@pytest.mark.parametrize("seed", range(6))
def test_congestion_control_agrees_under_ecn_and_loss(mode, seed):
    """Window CC (MetaRoCE: ECN and delay, loss cuts, RTO reset, pacing) and DCQCN (compat:
    CNPs from CE marks, rate cuts and recovery, pacing) decide the same packets at the same
    times in both engines."""
    errs, disagree, r = run(mode, seed, 20, ce=0.2, cc=CC, min_rto_ns=20_000)
    assert errs == [] and disagree == []
    st = r.a.req.stats
    assert st["cnp"] > 0 if mode is Mode.COMPAT else st["rtt_samples"] > 0


@pytest.mark.parametrize("seed", range(6))
def test_multipath_agrees(seed):
    """Spraying over 8 paths, per-path loss attribution (SACK-5 a/b), eviction to fresh source
    ports (MP-5): the same path and the same port for every packet."""
    errs, disagree, r = run(Mode.METAROCE, seed, 20, ce=0.1, cc=CC, paths=8, qp_seed=seed)
    assert errs == [] and disagree == []
    assert len({p["sport"] for p in r.a.req.paths.stats()}) == 8


@pytest.mark.parametrize("seed", range(4))
def test_bulk_transfers_over_reordering_paths_agree(seed):
    """40-packet WRITEs and READs sprayed over 4 paths whose packets are reordered (jitter
    beyond the spacing) and lost: loss detection by SACK-5 (a) and (b), READ-response repair
    (SACK-8), window CC with delay and ECN."""
    rng = random.Random(seed)
    ops = [Op(rng.choice(["write", "write", "read", "write_imm"]), 40 * MTU - rng.randint(0, 9))
           for _ in range(8)]
    jitter = Impairment(delay_ns=2_000, jitter_ns=4_000, loss=0.02, spacing_ns=50)
    errs, disagree, r = run(Mode.METAROCE, seed, ops=ops, ab=jitter, ba=jitter, ce=0.05,
                            cc=CCConfig(line_rate_bps=100e9, base_rtt_ns=5_000), paths=4,
                            qp_seed=seed, region_size=40 * MTU, window=256, min_rto_ns=30_000)
    assert errs == [] and disagree == []
    st = r.a.req.stats
    assert st["lost_a"] > 0 and st["lost_b"] > 0 and r.a.req.paths.evictions > 0


@pytest.mark.parametrize("drop_grants", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_receiver_credits_agree(seed, drop_grants):
    """Credit mode (CC-8): one sender counted as incast (min_senders 1) gets grants in MR_CREDIT
    and SACK flag C; a lone sender whose every MR_CREDIT (A=0) is lost stays at its initial
    credit and probes its way out (CC-9)."""
    cfg = CreditConfig(link_rate_bps=10e9, base_rtt_ns=10_000, mtu=256,
                       min_senders=2 if drop_grants else 1)
    mgr = CreditManager(cfg)
    ba = Impairment(delay_ns=2_000, drop=lambda p, i: drop_grants and p.opcode == O.MR_CREDIT)
    errs, disagree, r = run(Mode.METAROCE, seed, 12, ab=Impairment(delay_ns=2_000), ba=ba,
                            cc=CC, credits=mgr, min_rto_ns=20_000)
    assert errs == [] and disagree == []
    assert r.b.resp.stats["grants"] > 0
    assert (r.a.req.stats["probes"] > 0) == drop_grants


@pytest.mark.parametrize("seed", range(4))
def test_every_duplicate_send_and_write_is_re_acked_alike(seed):
    """RESP-16: compat-mode duplicates of SEND/WRITE packets without AckReq (the first and
    middle packets of messages the channel duplicates, in order) are re-ACKed by both engines,
    with some of the ACKs lost."""
    rng = random.Random(seed)
    ops = [Op(rng.choice(["write", "write", "send", "write_imm"]), rng.randint(2 * MTU, 3 * MTU))
           for _ in range(12)]
    errs, disagree, r = run(Mode.COMPAT, seed, ops=ops, ab=Impairment(delay_ns=2_000, dup=0.4),
                            ba=Impairment(delay_ns=2_000, loss=0.1))
    assert errs == [] and disagree == []
    assert MarkingPair.dup_no_ackreq > 0


@pytest.mark.parametrize("mode", list(Mode))
def test_an_infinite_timeout_never_fails_alike(mode):
    """RESP-8 / RTO-4: timeout 0, retry_cnt 1 and a responder that hears nothing for 3.5 s.
    MetaRoCE: the RTO still runs (RTO_max 1 s: a retransmission a second) and its expiries
    consume no retry_cnt, so the QP completes everything once the link is back. Compat: no
    retransmission timer at all; the QP neither retransmits nor fails."""
    ops = [Op("write", 3 * MTU), Op("read", 2 * MTU), Op("send", MTU)]
    errs, disagree, r = run(mode, 1, ops=ops, ab=Impairment(delay_ns=2_000),
                            ba=Impairment(delay_ns=2_000), silent_until=3_500_000_000,
                            until=8 * 10**9, timeout=0, retry_cnt=1)
    assert disagree == []
    if mode is Mode.METAROCE:
        assert errs == [] and r.a.req.stats["timeouts"] == 4 and r.a.req.rto.max == 10**9
    else:
        assert r.a.req.stats["timeouts"] == 0 and r.req_done == []
        assert r.a.state is QPState.RTS and r.a.next_deadline() is None


@pytest.mark.parametrize("seed", range(3))
def test_the_rto_granularity_floor_agrees(seed):
    """RTO-1: RTO = SRTT + max(4 RTTVAR, G) with G = 5 us. With a 1 us RTO_min and round
    trips that differ by a few hundred ns at first, 4 RTTVAR is below G and G decides the
    retransmission deadlines (a C engine with the old G of 1 us disagrees at the first SACKs)."""
    steady = Impairment(delay_ns=2_000, loss=0.05)
    errs, disagree, r = run(Mode.METAROCE, seed, 20, ab=steady, ba=steady, cc=CC,
                            min_rto_ns=1_000)
    assert errs == [] and disagree == []
    assert r.a.req.rto.min == 1_000 and r.a.req.rto.samples >= 16


@pytest.mark.parametrize("mode", list(Mode))
@pytest.mark.parametrize("seed", range(3))
def test_reads_larger_than_the_window_agree(mode, seed):
    """SACK-9: READs of up to 5 W MTUs among WRITEs and SENDs, window 32, over a lossy channel
    with duplicates: only a request's PSN must lie in the window, a READ at ePSN is accepted
    whatever its length and one ahead whose responses do not fit is dropped. The READ of 5 W,
    posted while the first WRITE is in flight, grows the C engine's scoreboard (it refused any
    READ of more than W MTUs at post time)."""
    w, rng = 32, random.Random(seed)
    kinds = [rng.choice(["read", "read", "write", "send"]) for _ in range(6)]
    ops = [Op("write", 3 * MTU), Op("read", 5 * w * MTU)] + \
          [Op(k, rng.randint(MTU, 3 * (MTU if k == "send" else w * MTU))) for k in kinds]
    errs, disagree, r = run(mode, seed, ops=ops, window=w, region_size=5 * w * MTU)
    assert errs == [] and disagree == []
    assert r.a.req.stats["retx"] > 0


@pytest.mark.parametrize("brk,mode", [("complete_before_ack", Mode.COMPAT),
                                      ("no_hole_retransmit", Mode.METAROCE),
                                      ("atomic_reexecute", Mode.METAROCE)])
def test_a_broken_c_engine_disagrees(brk, mode):
    """The comparison can fail: the same workloads with a break in the C engine only."""
    caught = sum(bool(run(mode, seed, 12, _c_break=brk)[1]) for seed in range(4))
    assert caught >= 3
