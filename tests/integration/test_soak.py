"""The soak (issue 9, part 4; `make soak` runs the long one): mixed operations over 16 QPs of
both modes with 1 % loss and 1 % reordering each way, every byte checked, QPs drained, no map
entry, MR map or RSS left behind. The checks are shown to fire (a flipped byte is reported).

The quick full-mix soak (READ and atomics too) under 1 % loss and reordering must pass: it found
the three requester recovery defects fixed in the daemon (missed ACK events, re-reads dropped as
acknowledged, go-back-N resuming past an unanswered READ)."""

import json
import os
import subprocess
import sys

import pytest
from verbs_util import End, connect, daemons, ip_of, lab_pair

from metaroce.lab import core
from metaroce.verbs import (IBV_WC_SUCCESS, IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_WR_RDMA_READ,
                            Context, SendWR)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = {**os.environ, "PYTHONPATH": ROOT}


def soak(*args):
    p = subprocess.run([sys.executable, "-m", "metaroce.soak", "--json", *args],
                       capture_output=True, text=True, env=ENV, timeout=300)
    assert p.stdout, p.stderr
    return p.returncode, json.loads(p.stdout)


def test_quick_soak_write_send_under_loss_and_reordering():
    code, r = soak("--quick", "--ops", "write,send")
    assert code == 0 and r["ok"], r["errors"]
    assert r["qps"] == 16 and r["modes"] == {"roce": 8, "metaroce": 8}
    assert r["bytes_corrupted"] == 0 and r["bytes_lost"] == 0 and r["wc_errors"] == 0
    assert r["bytes_verified"] > 50 << 20 and r["ops"]["send"] > 1000
    assert r["drained"] is True
    for h in ("h1", "h2"):
        assert r["leaks"][h] == {"map_entries": 0, "mr_maps": 0, "rq_maps": 0}
        assert r["daemons"][h]["end"]["map_entries"] > r["daemons"][h]["before"]["map_entries"]
        assert r["rss_growth_kib"][h] <= r["rss_growth_limit_kib"]
    imp = r["impairment"]
    assert imp["a-b"]["lost"] > 0 and imp["b-a"]["lost"] > 0 and imp["a-b"]["reordered"] > 0
    assert r["qp_totals"]["retransmitted_packets"] > 0 and r["qp_totals"]["selective_retransmits"] > 0


def test_the_soak_reports_a_corrupted_byte():
    code, r = soak("--seconds", "3", "--qps", "2", "--loss", "0", "--reorder", "0",
                   "--ops", "write,send", "--inject-corruption")
    assert code == 1 and not r["ok"]
    assert r["bytes_corrupted"] == 1 and any("1 B differ" in e for e in r["errors"])


def test_quick_soak_full_mix_under_loss():
    code, r = soak("--seconds", "8", "--qps", "4")
    assert code == 0 and r["ok"], r["errors"][:4]


def test_read_then_two_atomics_in_flight(lab_name):
    """Found by the soak: the responder answers READs from user space and atomics in the kernel,
    so the atomics' ACKs arrive before the READ's data; the requester now takes them ahead of
    the head slot (and the responder keeps RD_DEPTH saved results, RESP-4)."""
    view = lab_pair(lab_name)
    with daemons(view):
        c1 = Context("eth0", view.plan.node("h1").netns)
        c2 = Context("eth0", view.plan.node("h2").netns)
        a, b = End(c1, 1 << 20), End(c2, 1 << 20)
        connect(a, b, ip_of(view, "h1"), ip_of(view, "h2"), timeout=14, retry_cnt=3)
        a.qp.post_send([SendWR(IBV_WR_RDMA_READ, wr_id=1, sg_list=[a.mr.sge(0, 1000)],
                               remote_addr=b.mr.addr + 8192, rkey=b.mr.rkey)] +
                       [SendWR(IBV_WR_ATOMIC_FETCH_AND_ADD, wr_id=2 + i,
                               sg_list=[a.mr.sge(4096 + 8 * i, 8)], remote_addr=b.mr.addr,
                               rkey=b.mr.rkey, compare_add=1) for i in range(2)])
        wcs = a.cq.wait(3, timeout_s=10)
        c1.close()
        c2.close()
    assert [(w.wr_id, w.status) for w in wcs] == [(1, IBV_WC_SUCCESS), (2, IBV_WC_SUCCESS),
                                                  (3, IBV_WC_SUCCESS)]
