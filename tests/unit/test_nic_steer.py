"""Receive steering's pure parts (metaroce/nic/steer.py): what --rx-cpus means, and which CPU
a new QP gets."""

import os

import pytest

from metaroce.errors import MetaroceError, UsageError
from metaroce.lab.plan import plan_lab
from metaroce.nic.steer import choose_cpu, parse_rx_cpus

MINE = sorted(os.sched_getaffinity(0))


def test_off_is_none_and_auto_needs_several_queues():
    assert parse_rx_cpus("off", 8) is None
    assert parse_rx_cpus("auto", 1) is None          # one queue: one NAPI context already
    many = MINE if len(MINE) > 1 else None
    assert parse_rx_cpus("auto", 2) == many
    assert parse_rx_cpus(" ALL ") == many


def test_lists_and_ranges():
    assert parse_rx_cpus(str(MINE[0])) == [MINE[0]]
    if len(MINE) > 1:
        a, b = MINE[0], MINE[1]
        assert parse_rx_cpus(f"{b},{a}") == [a, b]
        assert parse_rx_cpus(f"{a}-{b}") == list(range(a, b + 1))


@pytest.mark.parametrize("bad", ["x", "1-", "3-1", "", ",", "1.5", "-1"])
def test_bad_lists_are_one_clear_error(bad):
    with pytest.raises(MetaroceError, match="--rx-cpus"):
        parse_rx_cpus(bad)


def test_cpus_this_process_may_not_run_on_are_refused():
    with pytest.raises(MetaroceError, match="not one this process may run on"):
        parse_rx_cpus(str(max(MINE) + 1))
    with pytest.raises(MetaroceError, match="not one this process may run on"):
        parse_rx_cpus("64")


def test_the_least_loaded_cpu_the_highest_on_a_tie():
    assert choose_cpu({0: 0, 1: 0}) == 1
    assert choose_cpu({0: 0, 1: 1}) == 0
    assert choose_cpu({0: 2, 1: 2, 2: 2, 3: 1}) == 3
    load = {0: 0, 1: 0, 2: 0}
    order = []
    for _ in range(7):
        c = choose_cpu(load)
        load[c] += 1
        order.append(c)
    assert order == [2, 1, 0, 2, 1, 0, 2]


def test_lab_queues_are_checked():
    assert plan_lab("q", "pair", queues=2).queues == 2
    assert plan_lab("q", "pair").queues == 1
    for bad in (0, 17):
        with pytest.raises(UsageError, match="--queues"):
            plan_lab("q", "pair", queues=bad)
