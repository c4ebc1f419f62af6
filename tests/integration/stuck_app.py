"""An application that stops reading its control socket. On a device it creates a PD, an MR, a
CQ of 65536 entries (max_cqe) and a QP, prints the QP's attributes (one JSON line), reads its peer's
(qpn, psn, ip, rkey, addr) from stdin, connects, prints "ready" and waits for a line "go".
Then, as fast as it can, it posts small signaled WRITEs into its send queue (shared memory;
it never polls, so its CQ overruns in time and its QP goes to ERR) and sends control requests
(query_qp) straight to the socket, never reading a reply, an event or a completion again. When
the daemon cuts it off (the socket breaks) it prints "cut off" and stays alive: what it held
must be freed by the daemon, not by its exit."""

import json
import sys
import time

from verbs_util import ALL_ACCESS

from metaroce.errors import MetaroceError
from metaroce.verbs import CQ, MR, PD, QP, IBV_WR_RDMA_WRITE, Context, QPCap, QPInitAttr, SendWR

WRS_PER_POST = 32


def main() -> None:
    dev, netns = sys.argv[1], sys.argv[2]
    ctx = Context(dev, netns)
    pd = PD(ctx)
    mr = MR(pd, 1 << 20, ALL_ACCESS)
    cq = CQ(ctx, 65536)
    qp = QP(pd, QPInitAttr(cq, cq, QPCap(max_send_wr=4096)))
    print(json.dumps({**qp.attrs, "rkey": mr.rkey, "addr": mr.addr}), flush=True)
    peer = json.loads(sys.stdin.readline())
    qp.connect(peer)
    print("ready", flush=True)
    assert sys.stdin.readline().strip() == "go"
    wrs = [SendWR(IBV_WR_RDMA_WRITE, wr_id=i, sg_list=[mr.sge(64 * i, 64)],
                  remote_addr=peer["addr"] + 64 * i, rkey=peer["rkey"])
           for i in range(WRS_PER_POST)]
    n = posts = 0
    t0 = time.monotonic()
    try:
        while True:                      # posts and requests only: never a read
            try:
                qp.post_send(wrs)
                posts += 1
            except MetaroceError:
                pass                     # its send queue is full, or its QP went to ERR
            n += 1
            ctx._s.sendall((json.dumps({"op": "query_qp", "id": 1 << 20 | n,
                                        "qpn": qp.qp_num}) + "\n").encode())
    except OSError as exc:
        print(f"cut off after {n} requests and {posts * WRS_PER_POST} WRITEs in "
              f"{time.monotonic() - t0:.2f} s ({type(exc).__name__})", flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()
