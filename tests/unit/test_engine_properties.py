"""Property tests: random workloads over random loss / duplication / reordering, both modes.

Properties: every byte placed exactly as sent; requester completions in posting order and
only after the effect is visible (acknowledged); receive completions in order; atomics applied
exactly once, in order; the responder's MSN counts every message. Starting PSNs near 2^24
exercise the wrap-around.
"""

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metaroce.engine import Mode
from metaroce.sim.channel import Impairment
from tests.unit.engine_harness import build, finish, random_ops

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])

impairments = st.builds(
    Impairment,
    delay_ns=st.integers(500, 5_000),
    jitter_ns=st.sampled_from([0, 0, 300, 3_000]),
    loss=st.sampled_from([0.0, 0.02, 0.08, 0.15]),
    dup=st.sampled_from([0.0, 0.05, 0.2]),
)
start_psn = st.one_of(st.integers(0xFFFFFF - 40, 0xFFFFFF), st.integers(0, 0xFFFFFF))


def scenario(mode, seed, nops, imp_ab, imp_ba, psn_a, psn_b, breaks=None):
    ops = random_ops(random.Random(seed), nops)
    return finish(build(mode, ops, seed, imp_ab, imp_ba, psn_a, psn_b, breaks))


@pytest.mark.parametrize("mode", list(Mode))
@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), nops=st.integers(1, 20), imp_ab=impairments,
       imp_ba=impairments, psn_a=start_psn, psn_b=start_psn)
def test_reliable_delivery_properties(mode, seed, nops, imp_ab, imp_ba, psn_a, psn_b):
    assert scenario(mode, seed, nops, imp_ab, imp_ba, psn_a, psn_b) == []


def test_wraparound_is_crossed():
    """The wrap scenarios really cross 2^24: PSNs after the run are small again."""
    from tests.unit.engine_harness import build as b
    run = b(Mode.METAROCE, random_ops(random.Random(3), 10), 3, Impairment(loss=0.1),
            Impairment(), 0xFFFFF8, 0xFFFFFA)
    assert finish(run) == []
    assert run.a.req.nxt < 0x1000 and run.b.resp.state.epsn < 0x1000


LOSSY = Impairment(delay_ns=2_000, jitter_ns=3_000, loss=0.1, dup=0.2)
BREAKS = [
    (Mode.COMPAT, "complete_before_ack"),
    (Mode.METAROCE, "complete_before_ack"),
    (Mode.METAROCE, "no_hole_retransmit"),
    (Mode.COMPAT, "atomic_reexecute"),
    (Mode.METAROCE, "atomic_reexecute"),
]


@pytest.mark.parametrize("mode,brk", BREAKS)
def test_properties_catch_a_broken_engine(mode, brk):
    """The same checks FAIL against a deliberately broken engine (so they can fail at all),
    while the healthy engine passes every one of these seeds."""
    caught = 0
    for seed in range(6):
        ops = random_ops(random.Random(seed), 12)
        if brk == "atomic_reexecute":
            ops = ops[:6] + [type(ops[0])("fadd", 8)] * 6
        args = (ops, seed, LOSSY, LOSSY, 0xFFFFF0, 0xFFFFF4)
        assert finish(build(mode, *args)) == [], f"healthy engine failed seed {seed}"
        caught += bool(finish(build(mode, *args, breaks=brk)))
    assert caught >= 3, f"{brk} escaped the property checks"
