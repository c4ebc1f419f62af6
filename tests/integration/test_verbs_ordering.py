"""A READ and a later WRITE or atomic to the same remote bytes, posted together on one QP: the
READ returns the bytes as they were before the WRITE (the responder executes in PSN order,
RESP-10), in both modes. The responder's kernel places a WRITE on arrival while its daemon
builds READ responses from memory later, so the requester holds a WR whose remote bytes overlap
an outstanding READ's until the READ has its data. test_control_fuzz found it (READ 124 bytes
from X, then WRITE 1 byte at X + 117: byte 117 of the READ came back as the WRITE's)."""

import os
import struct

import pytest
from verbs_util import ALL_ACCESS, End, connect, daemons, ip_of, lab_pair

from metaroce.lab import core
from metaroce.verbs import (IBV_WC_SUCCESS, IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_WR_RDMA_READ,
                            IBV_WR_RDMA_WRITE, Context, SendWR)

ROUNDS = 20


@pytest.mark.parametrize("mode", ["roce", "metaroce"])
def test_a_read_returns_the_bytes_from_before_a_later_write(lab_name, mode):
    view = lab_pair(lab_name)
    try:
        with daemons(view, mode=mode):
            c1, c2 = (Context("eth0", view.plan.node(h).netns) for h in ("h1", "h2"))
            try:
                a, b = End(c1, 1 << 16, ALL_ACCESS), End(c2, 1 << 16, ALL_ACCESS)
                connect(a, b, ip_of(view, "h1"), ip_of(view, "h2"), mode=mode)
                for rnd in range(ROUNDS):
                    size = 128 if rnd % 2 else 8192        # one packet, and several
                    before = os.urandom(size)
                    b.mr.write(before, 0)
                    a.mr.write(bytes(size) + os.urandom(size), 0)
                    wrs = [SendWR(IBV_WR_RDMA_READ, wr_id=1, sg_list=[a.mr.sge(0, size)],
                                  remote_addr=b.mr.addr, rkey=b.mr.rkey),
                           SendWR(IBV_WR_RDMA_WRITE, wr_id=2, sg_list=[a.mr.sge(size, size)],
                                  remote_addr=b.mr.addr, rkey=b.mr.rkey),
                           SendWR(IBV_WR_ATOMIC_FETCH_AND_ADD, wr_id=3,
                                  sg_list=[a.mr.sge(2 * size, 8)],
                                  remote_addr=b.mr.addr + size - 8, rkey=b.mr.rkey,
                                  compare_add=1)]
                    a.qp.post_send(wrs)
                    wcs = a.cq.wait(3, timeout_s=20)
                    assert [(w.wr_id, w.status) for w in wcs] == \
                        [(1, IBV_WC_SUCCESS), (2, IBV_WC_SUCCESS), (3, IBV_WC_SUCCESS)], wcs
                    got = a.mr.read(size, 0)
                    diff = next((i for i in range(size) if got[i] != before[i]), None)
                    assert diff is None, f"{mode} round {rnd}: READ byte {diff} is the WRITE's"
                    written = a.mr.read(size, size)
                    # the atomic, after the WRITE: it saw the WRITE's last 8 bytes and added 1
                    assert a.mr.read(8, 2 * size) == written[size - 8:]
                    old = struct.unpack("<Q", written[size - 8:])[0]
                    assert b.mr.read(size, 0) == \
                        written[:size - 8] + struct.pack("<Q", (old + 1) & (2**64 - 1))
            finally:
                c1.close()
                c2.close()
    finally:
        core.down(lab_name)
