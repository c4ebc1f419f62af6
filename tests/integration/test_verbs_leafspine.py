"""Every operation across a routed leaf-spine lab (h1 under leaf1, h4 under leaf2, two spines,
ECMP): the data path takes its destination MAC from the kernel's route and neighbour tables, so
frames go to the leaf router, not to the peer. IPv4 and IPv6, RoCEv2 and MetaRoCE mode (the
devices offer MetaRoCE; each connection asks for one mode); data verified byte for byte."""

import os

import pytest
from verbs_util import End, connect, ip_of, leaf_spine

from metaroce.verbs import (IBV_WC_SUCCESS, IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_WR_RDMA_READ,
                            IBV_WR_RDMA_WRITE, IBV_WR_SEND_WITH_IMM, RecvWR, SendWR)

MiB = 1 << 20


@pytest.fixture(scope="module")
def fabric(module_lab_name):
    with leaf_spine(module_lab_name) as fab:
        yield fab


@pytest.mark.parametrize("mode", ["roce", "metaroce"])
@pytest.mark.parametrize("v6", [False, True], ids=["ipv4", "ipv6"])
def test_all_operations_across_the_fabric(fabric, v6, mode):
    view, c1, c4 = fabric
    a, b = End(c1, 4 * MiB), End(c4, 4 * MiB)
    connect(a, b, ip_of(view, "h1", v6), ip_of(view, "h4", v6), mode=mode)
    assert a.qp.query()["mode"] == b.qp.query()["mode"] == mode
    assert a.qp.path["path"]["next_hop"] != ip_of(view, "h4", v6)     # routed, not on-link

    data = os.urandom(MiB + 77)
    a.mr.write(data)
    a.qp.post_send(SendWR(IBV_WR_RDMA_WRITE, wr_id=1, sg_list=[a.mr.sge(0, len(data))],
                          remote_addr=b.mr.addr, rkey=b.mr.rkey))
    a.qp.post_send(SendWR(IBV_WR_RDMA_READ, wr_id=2, sg_list=[a.mr.sge(2 * MiB, len(data))],
                          remote_addr=b.mr.addr, rkey=b.mr.rkey))
    wcs = a.cq.wait(2, timeout_s=30)
    assert [(w.wr_id, w.status) for w in wcs] == [(1, IBV_WC_SUCCESS), (2, IBV_WC_SUCCESS)]
    assert b.mr.read(len(data)) == data and a.mr.read(len(data), 2 * MiB) == data

    b.qp.post_recv(RecvWR(wr_id=9, sg_list=[b.mr.sge(3 * MiB, 65536)]))
    a.qp.post_send(SendWR(IBV_WR_SEND_WITH_IMM, wr_id=3, imm_data=0xABCD,
                          sg_list=[a.mr.sge(0, 65536)]))
    assert a.cq.wait(1)[0].status == IBV_WC_SUCCESS
    r = b.cq.wait(1)[0]
    assert (r.wr_id, r.status, r.imm_data, r.byte_len) == (9, IBV_WC_SUCCESS, 0xABCD, 65536)
    assert b.mr.read(65536, 3 * MiB) == data[:65536]

    word = 3 * MiB + 65536
    b.mr.write((5).to_bytes(8, "little"), word)
    a.qp.post_send(SendWR(IBV_WR_ATOMIC_FETCH_AND_ADD, wr_id=4, compare_add=10,
                          sg_list=[a.mr.sge(8, 8)], remote_addr=b.mr.addr + word, rkey=b.mr.rkey))
    assert a.cq.wait(1)[0].status == IBV_WC_SUCCESS
    assert a.mr.read(8, 8) == (5).to_bytes(8, "little")
    assert b.mr.read(8, word) == (15).to_bytes(8, "little")
    st = a.qp.query()
    if mode == "roce":
        assert st["retransmitted_packets"] == 0          # a clean path loses nothing
    else:   # MetaRoCE's tail RTO is ~2 SRTT (RTO-3): a loaded machine may fire it spuriously
        assert st["retransmitted_packets"] <= 0.02 * st["sent_packets"], st
    for end in (a, b):
        end.qp.close()
        end.mr.close()
