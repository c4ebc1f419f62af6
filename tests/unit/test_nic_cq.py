"""CQ accounting as in verbs: cqe entries (at least what was asked), the owner's consumer
index, overrun when a completion would leave more than cqe unconsumed. (A CQ whose consumer
index is a shared ring's: tests/unit/test_vq_rings.py.)"""

import pytest

from metaroce.errors import MetaroceError
from metaroce.nic.cq import MAX_CQE, Cq, checked_cqe, ring_entries


def test_a_cq_that_is_not_consumed_overruns_at_cqe():
    cq = Cq(1, None, 16)
    assert cq.cqe == 16
    assert all(cq.produce({"wr_id": i}) for i in range(cq.cqe))
    assert not cq.overrun
    assert not cq.produce({"wr_id": "one too many"})
    assert cq.overrun and cq.produced == cq.cqe and cq.dropped == 1
    assert not cq.produce({"wr_id": "later"})        # in error: nothing more is queued
    assert len(cq.take()) == cq.cqe and cq.dropped == 2


@pytest.mark.parametrize("requested", [1, 2, 16, 1000, MAX_CQE])
def test_an_owner_that_consumes_as_it_goes_never_overruns(requested):
    cq = Cq(1, None, requested)
    for _ in range(3 * requested + 7):
        while cq.produced - cq.consumed < requested:   # the device produces all it may
            assert cq.produce({})
        cq.set_consumer_index(cq.consumed + 1)         # the owner consumes one
    assert not cq.overrun


def test_the_consumer_index_only_moves_forward_and_never_past_the_producer():
    cq = Cq(1, None, 8)
    for _ in range(5):
        cq.produce({})
    cq.set_consumer_index(4)
    cq.set_consumer_index(2)
    assert cq.consumed == 4
    with pytest.raises(MetaroceError, match="beyond"):
        cq.set_consumer_index(6)


def test_cqe_bounds():
    assert checked_cqe(1) == 1 and checked_cqe(MAX_CQE) == MAX_CQE
    assert [ring_entries(n) for n in (1, 2, 3, 16, 17, 1000, MAX_CQE)] == \
        [1, 2, 4, 16, 32, 1024, MAX_CQE]
    for bad in (0, -1, MAX_CQE + 1):
        with pytest.raises(MetaroceError, match="max_cqe"):
            checked_cqe(bad)
