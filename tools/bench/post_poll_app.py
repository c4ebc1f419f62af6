#!/usr/bin/env python3
"""The application post_syscalls.py traces: on a device it makes a PD, an MR, a CQ and a QP,
prints the QP's attributes and its MR's (one JSON line), reads its peer's (qpn, psn, ip, addr,
rkey) from stdin, connects, prints "ready"; then for each line "go MODE N" it posts N
signalled 64-byte RDMA WRITEs one at a time, each waited for before the next (MODE poll: by
spinning on CQ.poll; MODE wait: by CQ.wait), GAP_US apart if the line says "go MODE N GAP_US",
and prints one JSON line: the post -> completion times' p50/p99 in microseconds and the
doorbells it rang. A line "quit" ends it."""

import json
import sys
import time

from metaroce.verbs import (CQ, MR, PD, QP, IBV_ACCESS_LOCAL_WRITE, IBV_WR_RDMA_WRITE, Context,
                            QPCap, QPInitAttr, SendWR)


def main() -> None:
    ctx = Context(sys.argv[1], sys.argv[2])
    pd = PD(ctx)
    mr = MR(pd, 4096, IBV_ACCESS_LOCAL_WRITE)
    cq = CQ(ctx, 256)
    qp = QP(pd, QPInitAttr(cq, cq, QPCap(max_send_wr=256)))
    print(json.dumps(qp.attrs), flush=True)
    peer = json.loads(sys.stdin.readline())
    qp.connect(peer)
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() == "quit":
            break
        _, mode, n, *gap = line.split()
        gap_s = float(gap[0]) / 1e6 if gap else 0.0
        wr = SendWR(IBV_WR_RDMA_WRITE, wr_id=1, sg_list=[mr.sge(0, 64)],
                    remote_addr=peer["addr"], rkey=peer["rkey"])
        bells0 = qp._sq.doorbells
        ts = []
        for _ in range(int(n)):
            t0 = time.perf_counter()
            qp.post_send(wr)
            if mode == "poll":
                while not cq.poll():
                    pass
            else:
                cq.wait(1)
            ts.append(time.perf_counter() - t0)
            if gap_s:
                time.sleep(gap_s)
        ts.sort()
        print(json.dumps({"p50_us": ts[len(ts) // 2] * 1e6, "p99_us": ts[int(len(ts) * 0.99)] * 1e6,
                          "doorbells": qp._sq.doorbells - bells0}), flush=True)
    qp.close()
    ctx.close()


if __name__ == "__main__":
    main()
