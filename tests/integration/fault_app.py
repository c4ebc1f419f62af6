"""An application to kill mid-operation: on a device it registers N MRs (plus one it never
uses) and N QPs in one PD, prints each QP's attributes (one JSON line each), reads its peers
(a JSON list: qpn, psn, ip, rkey, addr) from stdin, connects, posts receives and a WRITE of its
whole region to each peer, prints "busy" and waits to be killed."""

import json
import os
import sys
import time

from verbs_util import ALL_ACCESS

from metaroce.verbs import CQ, MR, PD, QP, IBV_WR_RDMA_WRITE, Context, QPInitAttr, RecvWR, SendWR


def main() -> None:
    dev, netns, size, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    ctx = Context(dev, netns)
    pd = PD(ctx)
    cq = CQ(ctx)
    mrs = [MR(pd, size, ALL_ACCESS) for _ in range(n)]
    MR(pd, 65536, ALL_ACCESS)
    qps = [QP(pd, QPInitAttr(cq, cq)) for _ in range(n)]
    for mr, qp in zip(mrs, qps):
        mr.write(os.urandom(size))
        print(json.dumps({**qp.attrs, "rkey": mr.rkey, "addr": mr.addr}), flush=True)
    peers = json.loads(sys.stdin.readline())
    for mr, qp, peer in zip(mrs, qps, peers):
        qp.connect({**peer, "mode": "metaroce"})
        qp.post_recv([RecvWR(wr_id=i, sg_list=[mr.sge(i * 4096, 4096)]) for i in range(64)])
        qp.post_send(SendWR(IBV_WR_RDMA_WRITE, wr_id=1, sg_list=[mr.sge()],
                            remote_addr=peer["addr"], rkey=peer["rkey"]))
    print("busy", flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()
