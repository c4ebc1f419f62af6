"""An application that attacks its own shared-memory queues. On a device it creates one QP (with
its own CQ) per case, prints their attributes (one JSON line: a list), reads its peers' (qpn,
psn, ip) and the other application's region (lkey, addr) from stdin, connects, prints "ready"
and waits for "go". Then, in its own rings only:

  random_wqes      random bytes in send queue slots, published with a valid producer index
  bad_index        a send queue producer index past the ring
  index_backwards  the producer index moved back behind what the daemon already took
  scribbler        a thread rewrites the send ring (slots and header) at random while the main
                   thread posts valid WRITEs through the library
  foreign_lkey     a well-formed WRITE whose SGE is the other application's region
  random_recvs     random bytes in receive queue slots, published (the peer then SENDs)
  recv_bad_index   a receive queue producer index past the ring (the peer then SENDs)
  cq_index         its CQ's consumer index moved past the producer (a WRITE then completes)

It prints "sent" when the receive cases are armed (the test then makes the peers SEND), then,
after a line "collect", what it polled and the async events it got (one JSON line) and stays
alive until stdin closes: its QPs must still exist when the test asks the daemon about them."""

import json
import os
import random
import sys
import threading
import time

from verbs_util import ALL_ACCESS

from metaroce.errors import MetaroceError
from metaroce.fastpath.vqlayout import HDR_SIZE, SEND_WQE, SGE, WQE_DATA
from metaroce.verbs import (CQ, MR, PD, QP, IBV_WR_RDMA_WRITE, Context, QPCap, QPInitAttr,
                            SendWR)

CASES = ("random_wqes", "bad_index", "index_backwards", "scribbler", "foreign_lkey",
         "random_recvs", "recv_bad_index", "cq_index")
PROD, CONS = 64, 128                     # offsets in a ring header (bpf/nic/nic_vq.h)


def u32(mm, off: int, value: int | None = None) -> int:
    if value is not None:
        mm[off:off + 4] = (value & 0xFFFFFFFF).to_bytes(4, "little")
    return int.from_bytes(mm[off:off + 4], "little")


def main() -> None:
    dev, netns = sys.argv[1], sys.argv[2]
    rng = random.Random(int(sys.argv[3]) if len(sys.argv) > 3 else 19)
    ctx = Context(dev, netns)
    pd = PD(ctx)
    mr = MR(pd, 1 << 20, ALL_ACCESS)
    qps, cqs = {}, {}
    for case in CASES:
        cqs[case] = CQ(ctx, 64)
        qps[case] = QP(pd, QPInitAttr(cqs[case], cqs[case], QPCap(max_send_wr=64, max_recv_wr=8)))
    print(json.dumps([{**qps[c].attrs, "case": c, "rkey": mr.rkey, "addr": mr.addr}
                      for c in CASES]), flush=True)
    peers = json.loads(sys.stdin.readline())
    for c in CASES:
        qps[c].connect(peers["qps"][c])
    print("ready", flush=True)
    assert sys.stdin.readline().strip() == "go"

    def write(c, wr_id, length=64):
        p = peers["qps"][c]
        return SendWR(IBV_WR_RDMA_WRITE, wr_id=wr_id, sg_list=[mr.sge(0, length)],
                      remote_addr=p["addr"], rkey=p["rkey"])

    def sq(c):
        q = qps[c]
        return q._mem.mm, q._sq.stride, q._sq.q

    # random bytes in send WQEs, published properly
    mm, stride, view = sq("random_wqes")
    for i in range(4):
        off = HDR_SIZE + ((view.head + i) % 64) * stride
        mm[off:off + stride] = rng.randbytes(stride)
    view.head += 4
    u32(mm, PROD, view.head)

    # a producer index past the ring
    mm, stride, view = sq("bad_index")
    u32(mm, PROD, u32(mm, CONS) + 64 + 7)

    # the producer index moved back behind what the daemon already took
    q = qps["index_backwards"]
    q.post_send([write("index_backwards", i) for i in range(8)])
    time.sleep(0.2)
    mm, stride, view = sq("index_backwards")
    u32(mm, PROD, view.head - 6)

    # a thread scribbles the send ring while valid WRITEs are posted through the library
    mm, stride, view = sq("scribbler")
    stop = threading.Event()

    def scribble():                      # the slots for half a second, then the header too
        r = random.Random(rng.random())
        t_start = time.monotonic()
        while not stop.is_set():
            lo = HDR_SIZE if time.monotonic() - t_start < 0.5 else 0
            off = r.randrange(lo, HDR_SIZE + 64 * stride - 8)
            mm[off:off + 8] = r.randbytes(8)
            time.sleep(0)

    t = threading.Thread(target=scribble)
    t.start()
    t0 = time.monotonic()
    posted = 0
    early = []                           # what it polled while posting (as an application does)
    while time.monotonic() - t0 < 1.0:
        try:
            qps["scribbler"].post_send(write("scribbler", posted))
            posted += 1
        except MetaroceError:
            time.sleep(0.001)            # full, or its QP is in ERR already
        try:
            early += [[w.wr_id, w.status, w.opcode] for w in cqs["scribbler"].poll(64)]
        except MetaroceError:
            pass
    stop.set()
    t.join()

    # a well-formed WRITE of the other application's memory
    mm, stride, view = sq("foreign_lkey")
    other = peers["foreign"]
    off = HDR_SIZE + (view.head % 64) * stride
    p = peers["qps"]["foreign_lkey"]
    SEND_WQE.pack_into(mm, off, 77, 0, 2, 1, 0, p["addr"], p["rkey"], 0, 0, 0)
    SGE.pack_into(mm, off + WQE_DATA, other["addr"], 4096, other["lkey"])
    view.head += 1
    u32(mm, PROD, view.head)

    # receive queues: random slots published, and an impossible producer index
    rq = qps["random_recvs"]
    rmm = rq._rq_mem.mm
    rstride = rq._rq.stride
    for i in range(3):
        o = HDR_SIZE + i * rstride
        rmm[o:o + rstride] = rng.randbytes(rstride)
    u32(rmm, PROD, 3)
    bad = qps["recv_bad_index"]._rq_mem.mm
    u32(bad, PROD, 1000)

    # the CQ's consumer index moved past its producer, then a completion comes
    cmm = cqs["cq_index"]._ring.mapping.mm
    u32(cmm, CONS, u32(cmm, PROD) + 5)
    qps["cq_index"].post_send(write("cq_index", 1))
    print("sent", flush=True)

    assert sys.stdin.readline().strip() == "collect"
    out = {}
    for c in CASES:
        wcs = early if c == "scribbler" else []
        try:
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                got = cqs[c].poll(64)
                wcs += [[w.wr_id, w.status, w.opcode] for w in got]
                if not got and wcs:
                    break
                time.sleep(0.01)
            err = None
        except MetaroceError as exc:
            err = str(exc)
        out[c] = {"wcs": wcs, "error": err}
    events = []
    while (ev := ctx.get_async_event(timeout_s=0.5)) is not None:
        events.append([ev.event_type, ev.cq, ev.qp_num])
    print(json.dumps({"cases": out, "events": events, "qpns": {c: qps[c].qp_num for c in CASES},
                      "cqs": {c: cqs[c].handle for c in CASES}, "scribbler_posts": posted}),
          flush=True)
    sys.stdin.readline()                 # until the test is done with us
    os._exit(0)


if __name__ == "__main__":
    main()
