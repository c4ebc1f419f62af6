"""The soak (issue 9, part 4): mixed RDMA operations over many QPs of both modes on a lab pair
with loss and reordering injected by the lab, for a bounded time, every byte checked.

Each QP runs rounds of: a WRITE of fresh random bytes (1 B .. 256 KiB) to a random place of the
peer's region, a READ of the same bytes back (RC ordering: it sees the WRITE), 1-4 SENDs into
posted receives, a FETCH_ADD and a COMPARE_SWAP on the QP's own counter word. A round is
verified as soon as its completions are in: the peer's memory, the READ's landing place, each
receive's bytes and length, the atomics' returned values. Rounds of different QPs overlap.

At the end every QP must be drained (nothing outstanding, still RTS), and after the QPs and MRs
are gone each daemon must hold as many map entries and memory-region maps as before the soak;
the daemons' resident memory is sampled after a warm-up and at the end of the traffic.

    python -m metaroce.soak --minutes 8 --json      (make soak)
    python -m metaroce.soak --quick --json          (20 s of traffic, ~30 s with setup)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
import zlib

from . import procbpf
from .errors import MetaroceError

MiB = 1 << 20
MR_BYTES = 1 * MiB
SRC = READ_AT = MR_BYTES // 4          # a: [0, 256K) source, [256K, 512K) READ landing place
RECV_AT, RECV_SLOT = MR_BYTES // 4, 16384   # b: [256K, 320K) receive buffers
COUNTER = MR_BYTES - 8                  # b: the QP's atomic counter word
ATOMIC_AT = MR_BYTES // 2               # a: atomic results


def _size(rng: random.Random) -> int:
    r = rng.random()
    if r < 0.5:
        return rng.randint(1, 4096)
    if r < 0.85:
        return rng.randint(4097, 65536)
    return rng.randint(65537, SRC)


class Lane:
    """One QP pair (a on h1 requests, b on h2 responds) and its round in flight."""

    def __init__(self, idx, a_qp, b_qp, a_mr, b_mr, mode):
        self.idx, self.a_qp, self.b_qp, self.a_mr, self.b_mr = idx, a_qp, b_qp, a_mr, b_mr
        self.mode = mode
        self.counter = 0
        self.round = None
        self.rounds = 0


class Soak:
    def __init__(self, seconds: float, qps: int = 32, loss: float = 0.01, reorder: float = 0.01,
                 seed: int = 1, inject_corruption: bool = False, log=None,
                 ops: tuple = ("write", "read", "send", "atomic")):
        self.kinds = set(ops)
        self.seconds, self.nqps, self.loss, self.reorder = seconds, qps, loss, reorder
        self.rng = random.Random(seed)
        self.seed = seed
        self.inject = inject_corruption
        self.log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.stats = {"rounds": 0, "ops": {"write": 0, "read": 0, "send": 0, "fetch_add": 0,
                                           "cmp_swap": 0},
                      "bytes_verified": 0, "bytes_corrupted": 0, "bytes_lost": 0,
                      "wc_errors": 0, "bad_atomics": 0}
        self.errors: list[str] = []

    # ---- one round -----------------------------------------------------------------------
    def _start(self, lane: Lane) -> None:
        from .verbs import (IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WR_ATOMIC_FETCH_AND_ADD,
                            IBV_WR_RDMA_READ, IBV_WR_RDMA_WRITE, IBV_WR_SEND, RecvWR, SendWR)
        rng = self.rng
        a, b = lane.a_mr, lane.b_mr
        n = _size(rng)
        data = rng.randbytes(n)
        a.buf[:n] = data
        dst = rng.randint(0, SRC - n) if n < SRC else 0
        sends = []
        for j in range(rng.randint(1, 4) if "send" in self.kinds else 0):
            s = rng.randint(0, RECV_SLOT)
            off = rng.randint(0, SRC - s)
            sends.append((off, s, zlib.crc32(bytes(a.buf[off:off + s]))))
        add = rng.getrandbits(32)
        new = rng.getrandbits(64)
        lane.b_qp.post_recv([RecvWR(wr_id=j, sg_list=[b.sge(RECV_AT + j * RECV_SLOT, RECV_SLOT)])
                             for j in range(len(sends))])
        wrs = [SendWR(IBV_WR_RDMA_WRITE, wr_id=1, sg_list=[a.sge(0, n)],
                      remote_addr=b.addr + dst, rkey=b.rkey)]
        if "read" in self.kinds:
            wrs.append(SendWR(IBV_WR_RDMA_READ, wr_id=2, sg_list=[a.sge(READ_AT, n)],
                              remote_addr=b.addr + dst, rkey=b.rkey))
        wrs += [SendWR(IBV_WR_SEND, wr_id=10 + j, sg_list=[a.sge(off, s)])
                for j, (off, s, _) in enumerate(sends)]
        # the atomics go in a second step, once the READ is complete: a READ followed by two
        # atomics in flight loses the first atomic's ACK (see the xfail in test_soak.py)
        atomics = [SendWR(IBV_WR_ATOMIC_FETCH_AND_ADD, wr_id=3, sg_list=[a.sge(ATOMIC_AT, 8)],
                          remote_addr=b.addr + COUNTER, rkey=b.rkey, compare_add=add),
                   SendWR(IBV_WR_ATOMIC_CMP_AND_SWP, wr_id=4, sg_list=[a.sge(ATOMIC_AT + 8, 8)],
                          remote_addr=b.addr + COUNTER, rkey=b.rkey,
                          compare_add=(lane.counter + add) & (2**64 - 1), swap=new)]
        lane.a_qp.post_send(wrs)
        lane.round = {"n": n, "data": data, "dst": dst, "sends": sends, "add": add, "new": new,
                      "a_wcs": [], "b_wcs": [], "need_a": len(wrs), "need_b": len(sends),
                      "atomics": atomics if "atomic" in self.kinds else None,
                      "t0": time.monotonic()}

    def _step(self, lane: Lane) -> bool:
        """The round's first step is complete: post its atomics (False), or it is over (True)."""
        r = lane.round
        if r["atomics"] and not any(w.status for w in r["a_wcs"] + r["b_wcs"]):
            lane.a_qp.post_send(r["atomics"])
            r["need_a"] += len(r["atomics"])
            r["atomics"] = None
            return False
        return True

    def _finish(self, lane: Lane) -> None:
        r, st = lane.round, self.stats
        a, b = lane.a_mr, lane.b_mr
        lane.round = None
        lane.rounds += 1
        st["rounds"] += 1
        bad = [w for w in r["a_wcs"] + r["b_wcs"] if w.status != 0]
        if bad:
            st["wc_errors"] += len(bad)
            st["bytes_lost"] += r["n"] * 2 + sum(s for _, s, _ in r["sends"])
            self.errors.append(f"QP {lane.idx} ({lane.mode}): {bad[:3]}")
            return
        n, data, dst = r["n"], r["data"], r["dst"]
        if self.inject and st["rounds"] == 3:          # a deliberate NIC fault: one byte flipped
            b.buf[dst] ^= 0x01
        checks = [(bytes(b.buf[dst:dst + n]), "WRITE")]
        if "read" in self.kinds:
            checks.append((bytes(a.buf[READ_AT:READ_AT + n]), "READ"))
        for got, what in checks:
            if got == data:
                st["bytes_verified"] += n
            else:
                diff = sum(x != y for x, y in zip(got, data))
                st["bytes_corrupted"] += diff
                self.errors.append(f"QP {lane.idx} ({lane.mode}): {what} of {n} B, {diff} B differ")
        st["ops"]["write"] += 1
        st["ops"]["read"] += "read" in self.kinds
        recvs = sorted(r["b_wcs"], key=lambda w: w.wr_id)
        for j, ((off, s, crc), w) in enumerate(zip(r["sends"], recvs)):
            got = bytes(b.buf[RECV_AT + j * RECV_SLOT:RECV_AT + j * RECV_SLOT + s])
            if w.wr_id == j and w.byte_len == s and zlib.crc32(got) == crc:
                st["bytes_verified"] += s
            else:
                st["bytes_corrupted"] += max(1, s)
                self.errors.append(f"QP {lane.idx} ({lane.mode}): SEND {j} of {s} B wrong")
            st["ops"]["send"] += 1
        if "atomic" not in self.kinds:
            return
        old_add = int.from_bytes(a.buf[ATOMIC_AT:ATOMIC_AT + 8], "little")
        old_cas = int.from_bytes(a.buf[ATOMIC_AT + 8:ATOMIC_AT + 16], "little")
        want_cas = (lane.counter + r["add"]) & (2**64 - 1)
        if old_add != lane.counter or old_cas != want_cas:
            st["bad_atomics"] += 1
            self.errors.append(f"QP {lane.idx} ({lane.mode}): atomics returned {old_add:#x}, "
                               f"{old_cas:#x}; expected {lane.counter:#x}, {want_cas:#x}")
        else:
            st["bytes_verified"] += 16
        lane.counter = r["new"]
        st["ops"]["fetch_add"] += 1
        st["ops"]["cmp_swap"] += 1

    # ---- the run -------------------------------------------------------------------------
    def run(self) -> dict:
        from .lab import core
        from .lab.impair import Impairment
        from .nic import daemon as d
        name = f"soak{os.getpid() % 10000}"
        t_setup = time.monotonic()
        core.up(name, "pair")
        try:
            view = core.LabView(name)
            devs = [d.DeviceId("eth0", view.plan.node(h).netns) for h in ("h1", "h2")]
            started = []
            try:
                for dev in devs:
                    d.start_background(dev, "metaroce")
                    started.append(dev)
                return self._run(view, devs, t_setup, Impairment)
            finally:
                for dev in started:
                    try:
                        d.stop(dev)
                    except MetaroceError:
                        d.clean_stale(dev)
        finally:
            core.down(name)

    def _kernel_state(self, pids) -> dict:
        return {h: {"rss_kib": procbpf.rss_kib(p), "rss_anon_kib": procbpf.rss_kib(p, "RssAnon"),
                    "rss_shmem_kib": procbpf.rss_kib(p, "RssShmem"),
                    "map_entries": procbpf.hash_entries(p)["total"],
                    "mr_maps": len(procbpf.mr_maps(p)), "rq_maps": len(procbpf.rq_maps(p))}
                for h, p in pids.items()}

    def _run(self, view, devs, t_setup, Impairment) -> dict:
        from .nic import daemon as d
        from .verbs import CQ, MR, PD, QP, Context, QPInitAttr, wait_for_completions
        from .verbs.api import QPCap
        pids = {h: d.request(dev, {"op": "status"})[0]["pid"] for h, dev in zip(("h1", "h2"), devs)}
        before = self._kernel_state(pids)
        ip = {h: view.plan.node(h).iface("eth0").ipv4.split("/")[0] for h in ("h1", "h2")}
        c1, c2 = Context("eth0", devs[0].netns), Context("eth0", devs[1].netns)
        access = 15
        cq1, cq2 = CQ(c1, 65536), CQ(c2, 65536)
        pd1, pd2 = PD(c1), PD(c2)
        lanes = []
        for i in range(self.nqps):
            mode = "roce" if i % 2 == 0 else "metaroce"
            a_mr, b_mr = MR(pd1, MR_BYTES, access), MR(pd2, MR_BYTES, access)
            cap = QPCap()
            a_qp, b_qp = QP(pd1, QPInitAttr(cq1, cq1, cap)), QP(pd2, QPInitAttr(cq2, cq2, cap))
            a_qp.connect({"qpn": b_qp.qp_num, "psn": b_qp.psn, "ip": ip["h2"], "mode": mode},
                         timeout=15, retry_cnt=7)
            b_qp.connect({"qpn": a_qp.qp_num, "psn": a_qp.psn, "ip": ip["h1"], "mode": mode},
                         timeout=15, retry_cnt=7)
            lanes.append(Lane(i, a_qp, b_qp, a_mr, b_mr, mode))
        by_a = {ln.a_qp.qp_num: ln for ln in lanes}
        by_b = {ln.b_qp.qp_num: ln for ln in lanes}
        imp = Impairment(loss=self.loss, reorder=self.reorder, seed=self.seed).validate()
        view.impair("h1-sw1", "both", imp)
        setup_s = time.monotonic() - t_setup
        self.log(f"soak: {self.nqps} QPs ({self.nqps - self.nqps // 2} RoCEv2, {self.nqps // 2} "
                 f"MetaRoCE), loss {self.loss:.1%} and reorder {self.reorder:.1%} both ways, "
                 f"{self.seconds:.0f} s")
        t0 = time.monotonic()
        end = t0 + self.seconds
        warm_at, mid = t0 + min(10.0, self.seconds / 5), None
        next_log = t0 + 30
        stalled = False
        for ln in lanes:
            self._start(ln)
        while any(ln.round for ln in lanes):
            now = time.monotonic()
            if mid is None and now >= warm_at:
                mid = self._kernel_state(pids)
            if now >= next_log:
                next_log += 30
                self.log(f"soak: {now - t0:.0f} s, {self.stats['rounds']} rounds, "
                         f"{self.stats['bytes_verified'] / MiB:.0f} MiB verified, "
                         f"{self.stats['bytes_corrupted']} B corrupted")
            got = False
            for cq, lanes_of, key in ((cq1, by_a, "a_wcs"), (cq2, by_b, "b_wcs")):
                for w in cq.poll(256):
                    got = True
                    ln = lanes_of.get(w.qp_num)
                    if ln is None or ln.round is None:
                        self.errors.append(f"stray completion {w}")
                        self.stats["wc_errors"] += w.status != 0
                        continue
                    ln.round[key].append(w)
            for ln in lanes:
                r = ln.round
                if r is None:
                    continue
                if len(r["a_wcs"]) >= r["need_a"] and len(r["b_wcs"]) >= r["need_b"]:
                    if not self._step(ln):
                        continue
                    self._finish(ln)
                    if time.monotonic() < end and ln.a_qp.query()["state"] == "RTS":
                        self._start(ln)
                elif now - r["t0"] > 60:
                    stalled = True
                    self.errors.append(f"QP {ln.idx} ({ln.mode}): round stalled for 60 s")
                    self.stats["bytes_lost"] += r["n"] * 2
                    ln.round = None
            if not got:
                wait_for_completions([cq1, cq2], 0.002)
        duration = time.monotonic() - t0
        end_state = self._kernel_state(pids)
        lab = view.status(counters=True)
        view.impair("h1-sw1", "both", None)
        drained = True
        qp_totals = {"retransmitted_packets": 0, "selective_retransmits": 0,
                     "local_ack_timeout_err": 0, "out_of_sequence": 0, "sent_packets": 0}
        for ln in lanes:
            for qp in (ln.a_qp, ln.b_qp):
                q = qp.query()
                if q["state"] != "RTS" or q["sq_outstanding"] or q["window_pkts"]:
                    drained = False
                    self.errors.append(f"QP {ln.idx} not drained: {q['state']}, "
                                       f"{q['sq_outstanding']} outstanding")
                for k in qp_totals:
                    qp_totals[k] += q.get(k, 0)
        if cq1.poll(16) or cq2.poll(16):
            drained = False
            self.errors.append("completions after the end")
        c1.close()
        c2.close()
        after = None
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:      # the daemons reclaim on the connection's close
            after = self._kernel_state(pids)
            if all(after[h][k] == before[h][k] for h in pids
                   for k in ("map_entries", "mr_maps", "rq_maps")):
                break
            time.sleep(0.1)
        link = next(l for l in lab["links"] if l["name"] == "h1-sw1")
        imp_stats = {d: link["counters"][d]["impair"] for d in ("a-b", "b-a")}
        mid = mid or end_state
        # a leak grows the daemon's heap; the shared rings' pages (RssShmem) become resident as
        # their indices first pass them, bounded by the rings' sizes, and go with their QPs
        rss_growth = {h: end_state[h]["rss_anon_kib"] - mid[h]["rss_anon_kib"] for h in pids}
        leaks = {h: {k: after[h][k] - before[h][k] for k in ("map_entries", "mr_maps", "rq_maps")}
                 for h in pids}
        st = self.stats
        ok = (st["bytes_corrupted"] == 0 and st["bytes_lost"] == 0 and st["wc_errors"] == 0
              and st["bad_atomics"] == 0 and drained and not stalled
              and all(v == 0 for lk in leaks.values() for v in lk.values())
              and all(g <= RSS_GROWTH_KIB for g in rss_growth.values()) and not self.errors)
        return {"ok": ok, "seconds": round(duration, 1), "setup_s": round(setup_s, 1),
                "qps": self.nqps, "modes": {"roce": self.nqps - self.nqps // 2,
                                            "metaroce": self.nqps // 2},
                "loss": self.loss, "reorder": self.reorder, "seed": self.seed,
                "op_kinds": sorted(self.kinds), **st,
                "bytes_per_s": round(st["bytes_verified"] / max(duration, 1e-9)),
                "drained": drained, "impairment": imp_stats, "qp_totals": qp_totals,
                "daemons": {h: {"before": before[h], "warm": mid[h], "end": end_state[h],
                                "after": after[h]} for h in pids},
                "rss_growth_kib": rss_growth, "rss_growth_limit_kib": RSS_GROWTH_KIB,
                "leaks": leaks, "errors": self.errors[:20]}


RSS_GROWTH_KIB = 4096       # heap (RssAnon), from the end of the warm-up to the end of the traffic


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m metaroce.soak", description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=8.0)
    p.add_argument("--seconds", type=float, default=None, help="overrides --minutes")
    p.add_argument("--quick", action="store_true", help="20 s, 16 QPs (for the test suite)")
    p.add_argument("--qps", type=int, default=None)
    p.add_argument("--loss", type=float, default=0.01)
    p.add_argument("--reorder", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--inject-corruption", action="store_true",
                   help="flip one byte of a completed WRITE's target (the checks must catch it)")
    p.add_argument("--ops", default="write,read,send,atomic",
                   help="operation kinds in each round (WRITE always)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    seconds = a.seconds if a.seconds is not None else (20.0 if a.quick else a.minutes * 60)
    qps = a.qps or (16 if a.quick else 32)
    if not 0 < seconds <= 600 or not 1 <= qps <= 256:
        p.error("--minutes/--seconds must be in (0, 10 min] and --qps in 1..256")
    if os.geteuid() != 0:
        print("metaroce soak: needs root (network namespaces, BPF)", file=sys.stderr)
        return 1
    try:
        ops = tuple(o for o in a.ops.split(",") if o)
        if not set(ops) <= {"write", "read", "send", "atomic"}:
            p.error("--ops takes write, read, send, atomic")
        res = Soak(seconds, qps, a.loss, a.reorder, a.seed, a.inject_corruption, ops=ops).run()
    except MetaroceError as exc:
        print(f"metaroce soak: {exc}", file=sys.stderr)
        return 1
    if a.json:
        print(json.dumps(res, indent=1))
    else:
        print(f"soak {'OK' if res['ok'] else 'FAILED'}: {res['seconds']} s, {res['qps']} QPs, "
              f"{res['rounds']} rounds, {res['bytes_verified']} B verified, "
              f"{res['bytes_corrupted']} B corrupted, {res['bytes_lost']} B lost, "
              f"RSS growth {res['rss_growth_kib']} KiB, leaks {res['leaks']}")
        for e in res["errors"]:
            print(f"  {e}")
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
