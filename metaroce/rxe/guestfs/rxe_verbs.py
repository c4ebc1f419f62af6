"""Verbs on the guest's rxe0 for the host (runs inside the guest with Debian's pyverbs).

One JSON request per line on stdin, one JSON reply per line on stdout. Endpoints are RC QPs,
each with its own PD, memory region and CQ, named by QPN:

- create  {mr_bytes, access, local_bytes?}          -> {qpn, psn, rkey, addr, length, gid}
  (the QP allows every remote operation; the region's access flags are ``access``; with
  local_bytes a second, local-only region holds what the endpoint's own requests send or read)
- connect {qpn, remote: {qpn, psn, ip}, mtu?, timeout?, retry_cnt?, rnr_retry?, min_rnr_timer?,
           max_rd_atomic?}                           -> {ok}
- post_send {qpn, opcode, wr_id, offset, length, remote_addr?, rkey?, compare_add?, swap?,
             imm_data?, local?}                      -> {ok}   (local: from the local region)
- post_recv {qpn, wr_id, offset, length}             -> {ok}
- poll    {qpn, n, timeout}                          -> {wcs: [{wr_id, status, opcode, byte_len,
                                                        imm_data}]}
- read    {qpn, offset, length, local?}              -> {data (hex)}
- write   {qpn, offset, data (hex), local?}          -> {ok}
- query   {qpn}                                      -> {state}
- destroy {qpn}                                      -> {ok}

Errors are {"error": "..."}.
"""

import ipaddress
import json
import random
import socket
import sys
import time

import pyverbs.enums as e
from pyverbs.addr import GID, AHAttr, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, RecvWR, SendWR

GID_INDEX = 1
MTU = {256: e.IBV_MTU_256, 512: e.IBV_MTU_512, 1024: e.IBV_MTU_1024, 2048: e.IBV_MTU_2048,
       4096: e.IBV_MTU_4096}
OPS = {"RDMA_WRITE": e.IBV_WR_RDMA_WRITE, "RDMA_WRITE_WITH_IMM": e.IBV_WR_RDMA_WRITE_WITH_IMM,
       "SEND": e.IBV_WR_SEND, "SEND_WITH_IMM": e.IBV_WR_SEND_WITH_IMM,
       "RDMA_READ": e.IBV_WR_RDMA_READ, "ATOMIC_CMP_AND_SWP": e.IBV_WR_ATOMIC_CMP_AND_SWP,
       "ATOMIC_FETCH_AND_ADD": e.IBV_WR_ATOMIC_FETCH_AND_ADD}
WC_OPS = {e.IBV_WC_SEND: "SEND", e.IBV_WC_RDMA_WRITE: "RDMA_WRITE",
          e.IBV_WC_RDMA_READ: "RDMA_READ", e.IBV_WC_COMP_SWAP: "COMP_SWAP",
          e.IBV_WC_FETCH_ADD: "FETCH_ADD", e.IBV_WC_RECV: "RECV",
          e.IBV_WC_RECV_RDMA_WITH_IMM: "RECV_RDMA_WITH_IMM"}
STATES = {e.IBV_QPS_RESET: "RESET", e.IBV_QPS_INIT: "INIT", e.IBV_QPS_RTR: "RTR",
          e.IBV_QPS_RTS: "RTS", e.IBV_QPS_SQD: "SQD", e.IBV_QPS_SQE: "SQE",
          e.IBV_QPS_ERR: "ERR"}

ctx = Context(name="rxe0")
EPS = {}


REMOTE_ALL = e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_REMOTE_ATOMIC


class Ep:
    def __init__(self, mr_bytes, access, local_bytes=0):
        self.pd = PD(ctx)
        self.mr = MR(self.pd, mr_bytes, access)
        self.local = MR(self.pd, local_bytes, e.IBV_ACCESS_LOCAL_WRITE) if local_bytes else None
        self.cq = CQ(ctx, 4096)
        cap = QPCap(max_send_wr=1024, max_recv_wr=1024, max_send_sge=1, max_recv_sge=1)
        self.qp = QP(self.pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap))
        self.psn = random.getrandbits(24)
        attr = QPAttr()
        attr.qp_access_flags = REMOTE_ALL     # the region's flags decide (SEC-4)
        attr.pkey_index = 0
        attr.port_num = 1
        self.qp.to_init(attr)


def gid_text():
    raw = open(f"/sys/class/infiniband/rxe0/ports/1/gids/{GID_INDEX}").read().strip()
    return raw


def handle(r):
    op = r["op"]
    if op == "create":
        ep = Ep(int(r.get("mr_bytes", 1 << 20)), int(r.get("access", 15)),
                int(r.get("local_bytes", 0)))
        EPS[ep.qp.qp_num] = ep
        return {"qpn": ep.qp.qp_num, "psn": ep.psn, "rkey": ep.mr.rkey, "addr": ep.mr.buf,
                "length": ep.mr.length, "lkey": ep.mr.lkey, "gid": gid_text()}
    ep = EPS.get(r.get("qpn"))
    if ep is None:
        return {"error": f"no endpoint with QPN {r.get('qpn')}"}
    if op == "connect":
        rem = r["remote"]
        ip = ipaddress.ip_address(rem["ip"])
        dgid = ipaddress.IPv6Address(f"::ffff:{ip}" if ip.version == 4 else str(ip)).exploded
        gr = GlobalRoute(dgid=GID(dgid), sgid_index=GID_INDEX, hop_limit=64)
        attr = QPAttr()
        attr.path_mtu = MTU[int(r.get("mtu", 1024))]
        attr.dest_qp_num = int(rem["qpn"])
        attr.rq_psn = int(rem["psn"])
        attr.max_dest_rd_atomic = int(r.get("max_dest_rd_atomic", 16))
        attr.min_rnr_timer = int(r.get("min_rnr_timer", 12))
        attr.ah_attr = AHAttr(gr=gr, is_global=1, port_num=1)
        attr.timeout = int(r.get("timeout", 14))
        attr.retry_cnt = int(r.get("retry_cnt", 7))
        attr.rnr_retry = int(r.get("rnr_retry", 7))
        attr.sq_psn = ep.psn
        attr.max_rd_atomic = int(r.get("max_rd_atomic", 16))
        ep.qp.to_rts(attr)
        return {"ok": True}
    if op == "post_send":
        n = int(r.get("length", 0))
        mr = ep.local if r.get("local") else ep.mr
        sge = SGE(mr.buf + int(r.get("offset", 0)), n, mr.lkey)
        wr = SendWR(wr_id=int(r.get("wr_id", 0)), opcode=OPS[r["opcode"]], num_sge=1, sg=[sge],
                    send_flags=e.IBV_SEND_SIGNALED,
                    imm_data=socket.htonl(int(r.get("imm_data", 0))))   # a __be32
        if r["opcode"].startswith("ATOMIC"):
            wr.set_wr_atomic(int(r["rkey"]), int(r["remote_addr"]), int(r.get("compare_add", 0)),
                             int(r.get("swap", 0)))
        elif r["opcode"].startswith("RDMA"):
            wr.set_wr_rdma(int(r["rkey"]), int(r["remote_addr"]))
        ep.qp.post_send(wr)
        return {"ok": True}
    if op == "post_recv":
        sge = SGE(ep.mr.buf + int(r.get("offset", 0)), int(r["length"]), ep.mr.lkey)
        ep.qp.post_recv(RecvWR(wr_id=int(r.get("wr_id", 0)), num_sge=1, sg=[sge]))
        return {"ok": True}
    if op == "poll":
        want, deadline = int(r.get("n", 1)), time.monotonic() + float(r.get("timeout", 10))
        out = []
        while len(out) < want:
            n, wcs = ep.cq.poll(want - len(out))
            for w in wcs[:n]:
                out.append({"wr_id": w.wr_id, "status": w.status,
                            "opcode": WC_OPS.get(w.opcode, str(w.opcode)),
                            "byte_len": w.byte_len, "imm_data": socket.ntohl(w.imm_data)})
            if len(out) < want:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.0005)
        return {"wcs": out}
    if op == "read":
        mr = ep.local if r.get("local") else ep.mr
        return {"data": mr.read(int(r["length"]), int(r.get("offset", 0))).hex()}
    if op == "write":
        data = bytes.fromhex(r["data"])
        mr = ep.local if r.get("local") else ep.mr
        mr.write(data, len(data), int(r.get("offset", 0)))
        return {"ok": True}
    if op == "query":
        attr, _ = ep.qp.query(e.IBV_QP_STATE)
        return {"state": STATES.get(attr.qp_state, str(attr.qp_state))}
    if op == "destroy":
        EPS.pop(ep.qp.qp_num)
        for o in (ep.qp, ep.cq, ep.mr, ep.local, ep.pd):
            if o is None:
                continue
            o.close()
        return {"ok": True}
    return {"error": f"unknown op {op!r}"}


def main():
    print(json.dumps({"ready": True, "gid": gid_text()}), flush=True)
    for line in sys.stdin:
        try:
            rep = handle(json.loads(line))
        except Exception as exc:  # noqa: BLE001 (report, keep serving)
            rep = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(rep), flush=True)


if __name__ == "__main__":
    main()
