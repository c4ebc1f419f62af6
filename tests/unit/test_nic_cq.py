"""A CQ's size as in verbs: at least what was asked (a power of two), at most max_cqe. (The
accounting against the owner's consumer index, and the overrun, are the data path thread's:
tests/integration/test_backpressure.py and test_hostile_app.py drive them.)"""

import pytest

from metaroce.errors import MetaroceError
from metaroce.nic.cq import MAX_CQE, Cq, checked_cqe, ring_entries


def test_cqe_bounds():
    assert checked_cqe(1) == 1 and checked_cqe(MAX_CQE) == MAX_CQE
    assert [ring_entries(n) for n in (1, 2, 3, 16, 17, 1000, MAX_CQE)] == \
        [1, 2, 4, 16, 32, 1024, MAX_CQE]
    for bad in (0, -1, MAX_CQE + 1):
        with pytest.raises(MetaroceError, match="max_cqe"):
            checked_cqe(bad)


def test_a_ring_less_cq_counts_what_was_asked():
    assert Cq(1, None, 16).cqe == 16
