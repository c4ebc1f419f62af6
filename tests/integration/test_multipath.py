"""MetaRoCE multipath in the real data path (spec 5.4) over a routed leaf-spine lab (h1 under
leaf1, h4 under leaf2, two spines, kernel ECMP hashed on UDP ports): packets sprayed over N
source ports (MP-1, MP-3), per-path statistics (MP-4), and a black-holed spine survived by
repathing (MP-5) while a single fixed port through it would fail; connection management
negotiates the number of paths (CM-5)."""

import os
import threading

import pytest
from prometheus_client.parser import text_string_to_metric_families
from verbs_util import End, connect, ip_of, leaf_spine

from metaroce.cm import connect as cm_connect
from metaroce.cm import Listener
from metaroce.deploy.exporter import Scrape, families
from metaroce.lab.impair import Impairment
from metaroce.nic.stats import device_stats, format_stats
from metaroce.verbs import CQ, IBV_WC_SUCCESS, IBV_WR_RDMA_WRITE, PD, SendWR

MiB = 1 << 20


@pytest.fixture(scope="module")
def fabric(module_lab_name):
    with leaf_spine(module_lab_name) as fab:
        yield fab


def _write(a: End, b: End, size: int, wr_id: int = 1, timeout_s: float = 60):
    data = os.urandom(size)
    a.mr.write(data)
    a.qp.post_send(SendWR(IBV_WR_RDMA_WRITE, wr_id=wr_id, sg_list=[a.mr.sge(0, size)],
                          remote_addr=b.mr.addr, rkey=b.mr.rkey))
    wc = a.cq.wait(1, timeout_s=timeout_s)[0]
    assert (wc.wr_id, wc.status) == (wr_id, IBV_WC_SUCCESS), wc
    assert b.mr.read(size) == data


def _close(*ends):
    for e in ends:
        e.qp.close()
        e.mr.close()


def _spine_rx(view) -> dict:
    links = {l["name"]: l["counters"] for l in view.status()["links"]}
    return {s: links[f"leaf1-spine{s}"]["a-b"]["rx_packets"] for s in (1, 2)}


def test_mp1_mp3_mp4_packets_sprayed_over_distinct_ports(fabric):
    """MP-1/MP-3: N = 4 paths, each its own source port, packets round-robin over them;
    MP-4: per-path counters in query_qp; a clean fabric evicts nothing."""
    view, c1, c4 = fabric
    a, b = End(c1, 8 * MiB), End(c4, 8 * MiB)
    connect(a, b, ip_of(view, "h1"), ip_of(view, "h4"), mode="metaroce", paths=4)
    _write(a, b, 8 * MiB)
    st = a.qp.query()
    assert st["mode"] == "metaroce" and st["paths"] == 4
    ps = st["path_stats"]
    assert [p["path"] for p in ps] == [0, 1, 2, 3]
    assert len({p["sport"] for p in ps}) == 4
    assert all(0xC000 <= p["sport"] <= 0xFFFF for p in ps)
    sent = [p["sent_packets"] for p in ps]
    assert sum(sent) >= st["sent_packets"] and min(sent) >= 0.2 * sum(sent), sent
    assert st["path_evictions"] == 0 or st["retransmitted_packets"] > 0, st
    # MP-4: exported by `metaroce stats` (a line per path) and the Prometheus exporter
    status = c1.status()
    ds = device_stats(status)
    q = next(q for q in ds["qps"] if q["qpn"] == a.qp.qp_num)
    assert [p["sport"] for p in q["paths"]] == [p["sport"] for p in ps]
    lines = format_stats("eth0", ds)
    assert sum(f"lqpn 0x{a.qp.qp_num:06x} path " in line for line in lines) == 4
    text = families([Scrape("eth0", None, status, 0.0)]).render()
    exported = {(s.labels["qpn"], s.labels["sport"]): s.value
                for f in text_string_to_metric_families(text)
                if f.name == "metaroce_qp_path_sent_packets"
                for s in f.samples}
    assert {sp: v for (qpn, sp), v in exported.items() if qpn == str(a.qp.qp_num)} == \
        {str(p["sport"]): p["sent_packets"] for p in
         next(x for x in status["qps"] if x["qpn"] == a.qp.qp_num)["path_stats"]}
    _close(a, b)


def test_mp5_black_holed_spine_is_routed_around(fabric):
    """MP-5: every RoCE frame through spine 1 (leaf1 <-> spine1, both ways) is dropped. Paths
    that hash onto it lose packets, get evicted and come back on new ports until they avoid
    it: a 16 MiB WRITE completes, verified, with no error completion. (Four random ports all
    avoid spine 1 with probability 1/16: then the test tries again with a new connection.)"""
    view, c1, c4 = fabric
    view.impair("leaf1-spine1", "both", Impairment(loss=1.0, seed=3).validate())
    try:
        for attempt in range(4):
            a, b = End(c1, 16 * MiB), End(c4, 16 * MiB)
            connect(a, b, ip_of(view, "h1"), ip_of(view, "h4"), mode="metaroce", paths=4,
                    retry_cnt=7, timeout=14)
            before = _spine_rx(view)
            _write(a, b, 16 * MiB, timeout_s=90)
            st = a.qp.query()
            dropped = _spine_rx(view)[1] - before[1]
            _close(a, b)
            if dropped:
                break
        assert dropped, "no path ever hashed onto spine 1"
        assert st["path_evictions"] >= 1 and st["retransmitted_packets"] >= 1, st
        assert sum(p["evictions"] for p in st["path_stats"]) == st["path_evictions"]
    finally:
        view.impair("leaf1-spine1", "both", None)


def test_cm_negotiates_paths(fabric):
    """CM-5 / MP-1: MULTIPATH is offered with max_paths; N = the smaller of both ends; an end
    that asks for 0 paths gets one fixed port (no MULTIPATH)."""
    view, c1, c4 = fabric
    for want_client, want_server, expect in ((6, 3, 3), (0, 4, 1)):
        pd1, pd4 = PD(c1), PD(c4)
        cq1, cq4 = CQ(c1), CQ(c4)
        with Listener(c4, port=0) as lst:
            got = {}
            t = threading.Thread(target=lambda: got.setdefault(
                "conn", lst.accept(pd=pd4, send_cq=cq4, timeout_s=10, paths=want_server)))
            t.start()
            conn = cm_connect(c1, ip_of(view, "h4"), lst.port, pd=pd1, send_cq=cq1,
                              mode="metaroce", paths=want_client)
            t.join(10)
            srv = got["conn"]
            assert conn.mode == srv.mode == "metaroce"
            assert conn.qp.query()["paths"] == srv.qp.query()["paths"] == expect
            conn.close()
            srv.close()

