"""Shared workload + invariant checker for the engine property tests (not a test module).

``impl`` picks the engine: "c" (metaroce.cengine, the one engine the simulator runs) or "py"
(metaroce.engine, the reference model the differential tests compare with)."""

import random
from dataclasses import dataclass, field, replace

from metaroce import cengine
from metaroce import engine as pyengine
from metaroce.engine import Access, MRTable, QPState, RecvWR, SendWR, WcStatus, WrOpcode
from metaroce.sim.channel import EventLoop, Pair

IMPLS = {"c": cengine.QueuePair, "py": pyengine.QueuePair}
DEFAULT_IMPL = "c"

MTU = 256
RKEY, BASE = 0x1234, 0x10_0000
REGION = 4 * MTU  # every WRITE / READ gets its own region of the remote MR
COUNTER_OFF = 0  # one shared 8-byte counter for all atomics (first bytes of the MR)


def connect(mode, psn_a, psn_b, breaks=None, timeout=4, retry_cnt=7, rnr_retry=7, window=64,
            mtu=MTU, impl=None, qp_seed=0, **qpkw):
    qp = IMPLS[impl or DEFAULT_IMPL]
    qpkw["seed"] = qp_seed
    a = qp(0x11, mode, MRTable(), _test_break=breaks, **qpkw)
    b = qp(0x22, mode, MRTable(), _test_break=breaks, **qpkw)
    for q, peer, sq, rq in ((a, 0x22, psn_a, psn_b), (b, 0x11, psn_b, psn_a)):
        q.modify(QPState.INIT)
        q.modify(QPState.RTR, dest_qpn=peer, rq_psn=rq, path_mtu=mtu, window=window)
        q.modify(QPState.RTS, sq_psn=sq, timeout=timeout, retry_cnt=retry_cnt,
                 rnr_retry=rnr_retry)
    return a, b


@dataclass
class Op:
    kind: str  # write, write_imm, send, send_imm, read, fadd, cas
    length: int


@dataclass
class Run:
    a: object
    b: object
    loop: EventLoop
    pair: Pair
    ops: list
    wrs: list = field(default_factory=list)
    expect_remote: bytearray = None
    remote: bytearray = None
    recvs: list = field(default_factory=list)
    req_done: list = field(default_factory=list)
    resp_done: list = field(default_factory=list)
    violations: list = field(default_factory=list)


def random_ops(rng: random.Random, n: int) -> list[Op]:
    kinds = ["write", "write_imm", "send", "send_imm", "read", "fadd", "cas"]
    return [Op(rng.choice(kinds), rng.randint(0, 3 * MTU + 7)) for _ in range(n)]


def build(mode, ops, seed, imp_ab, imp_ba, psn_a, psn_b, breaks=None, region_size=REGION,
          **kw) -> Run:
    a, b = connect(mode, psn_a, psn_b, breaks, **kw)
    rng = random.Random(seed ^ 0x5EED)
    remote = bytearray(rng.randbytes(region_size * (len(ops) + 1)))
    remote[COUNTER_OFF:COUNTER_OFF + 8] = (0).to_bytes(8, "little")
    b.mrs.register(RKEY, BASE, remote, Access.ALL_REMOTE)
    loop = EventLoop(seed)
    pair = Pair(loop, a, b, imp_ab, imp_ba)
    run = Run(a, b, loop, pair, ops, expect_remote=bytearray(remote), remote=remote)
    for i, op in enumerate(ops):
        region = BASE + region_size * (i + 1)
        data = rng.randbytes(op.length)
        imm = i if op.kind.endswith("imm") else None
        if op.kind.startswith("write"):
            wr = SendWR(i, WrOpcode.RDMA_WRITE_WITH_IMM if imm is not None else WrOpcode.RDMA_WRITE,
                        data, 0, op.length, region, RKEY, imm=imm)
            off = region - BASE
            run.expect_remote[off:off + op.length] = data
        elif op.kind.startswith("send"):
            wr = SendWR(i, WrOpcode.SEND_WITH_IMM if imm is not None else WrOpcode.SEND, data, 0,
                        op.length, imm=imm)
        elif op.kind == "read":
            wr = SendWR(i, WrOpcode.RDMA_READ, bytearray(op.length), 0, op.length, region, RKEY)
        elif op.kind == "fadd":
            wr = SendWR(i, WrOpcode.ATOMIC_FETCH_AND_ADD, bytearray(8), 0, 8,
                        BASE + COUNTER_OFF, RKEY, compare_add=i + 1)
        else:  # cas: swap in i+1000 if the counter is still what the model says it is
            wr = SendWR(i, WrOpcode.ATOMIC_CMP_AND_SWP, bytearray(8), 0, 8, BASE + COUNTER_OFF,
                        RKEY, compare_add=0, swap=0)
        run.wrs.append((op, wr, data))
        if op.kind in ("send", "send_imm", "write_imm"):
            buf = bytearray(3 * MTU + 16)
            run.recvs.append((i, buf))
            pair.post_recv(b, RecvWR(i, buf))
    # the model of the shared counter: atomics execute in posting order, exactly once
    counter = 0
    for op, wr, _ in run.wrs:
        if op.kind == "fadd":
            wr.expect = counter
            counter += wr.compare_add
        elif op.kind == "cas":
            wr.compare_add, wr.swap = counter, counter + 1000
            wr.expect = counter
            counter += 1000
    run.expect_remote[COUNTER_OFF:COUNTER_OFF + 8] = counter.to_bytes(8, "little")
    loop.after_event.append(lambda: _check_new_completions(run))
    for _, wr, _ in run.wrs:
        pair.post_send(a, wr)
    return run


def _check_new_completions(run: Run) -> None:
    """At the instant a completion appears, the effect it reports must already be visible."""
    for c in run.a.poll_cq():
        run.req_done.append(c)
        if c.status is not WcStatus.SUCCESS:
            continue
        op, wr, data = run.wrs[c.wr_id]
        if op.kind.startswith("write"):
            off = wr.remote_addr - BASE
            if bytes(run.remote[off:off + wr.length]) != data:
                run.violations.append(f"WRITE {c.wr_id} completed before its data was placed")
        elif op.kind.startswith("send"):
            done = {r.wr_id for r in run.resp_done} | {r.wr_id for r in run.b.cq}
            if c.wr_id not in done:
                run.violations.append(f"SEND {c.wr_id} completed before the receive completed")
        elif op.kind == "read":
            off = wr.remote_addr - BASE
            if bytes(wr.local) != bytes(run.expect_remote[off:off + wr.length]):
                run.violations.append(f"READ {c.wr_id} completed with wrong data")
        elif int.from_bytes(wr.local[:8], "little") != wr.expect:
            run.violations.append(f"ATOMIC {c.wr_id} returned a wrong original value")
    run.resp_done.extend(run.b.poll_cq())


def finish(run: Run, until=5 * 10**9) -> list[str]:
    """Run to quiescence and return every violated property (empty = all hold)."""
    n = len(run.ops)
    run.loop.run(until=until, stop=lambda: len(run.req_done) >= n)
    _check_new_completions(run)
    errs = list(run.violations)
    ids = [c.wr_id for c in run.req_done]
    if ids != list(range(n)):
        errs.append(f"requester completions {ids[:20]} not all, or not in posting order")
    bad = [(c.wr_id, c.status.name) for c in run.req_done if c.status is not WcStatus.SUCCESS]
    if bad:
        errs.append(f"failed completions {bad[:5]}")
    if run.remote != run.expect_remote:
        diff = [i for i in range(len(run.remote)) if run.remote[i] != run.expect_remote[i]]
        errs.append(f"remote memory differs at {len(diff)} bytes from {diff[:1]}")
    rids = [c.wr_id for c in run.resp_done]
    want = [i for i, _ in run.recvs]
    if rids != want:
        errs.append(f"receive completions {rids} != {want}")
    for c in run.resp_done:
        op, wr, data = run.wrs[c.wr_id]
        if op.kind.startswith("send"):
            buf = dict(run.recvs)[c.wr_id]
            if c.byte_len != len(data) or bytes(buf[:len(data)]) != data:
                errs.append(f"SEND {c.wr_id} placed wrongly")
            if c.imm != (c.wr_id if op.kind == "send_imm" else None):
                errs.append(f"SEND {c.wr_id} immediate {c.imm}")
        elif c.imm != c.wr_id:
            errs.append(f"WRITE_WITH_IMM {c.wr_id} immediate {c.imm}")
    if run.b.resp.msn != n:
        errs.append(f"responder MSN {run.b.resp.msn} != {n} messages")
    return errs


# --- differential testing: the C engine with the Python reference model in lockstep -----------

def _norm(pkt) -> tuple:
    """A packet as compared: every field, timestamps as the wire carries them (mod 2^32)."""
    return (pkt.opcode, pkt.psn, pkt.dest_qp, pkt.ack_req, pkt.reth, pkt.aeth, pkt.immdt,
            pkt.atomic, pkt.atomic_ack, pkt.sack, pkt.place, pkt.retx, pkt.ts & 0xFFFFFFFF,
            pkt.payload, pkt.path, pkt.sport, pkt.ce, pkt.ecn_echo, pkt.ce_count,
            pkt.ts_echo & 0xFFFFFFFF, pkt.credit_limit, pkt.probe_reply, pkt.grant)


class _TwinMRs:
    """Memory registered with both engines: the reference model gets its own copy (an atomic
    must not be applied twice to the same bytes)."""

    def __init__(self, c: MRTable, py: MRTable):
        self.c, self.py = c, py

    def register(self, rkey, addr, buf, access):
        self.py.register(rkey, addr, bytearray(buf), access)
        return self.c.register(rkey, addr, buf, access)


class Shadowed:
    """A C engine QP whose every input is also given to the Python reference model. Only the C
    engine's output is used; `mismatches` lists each call where the two disagreed. Within one
    call, packets are compared as a multiset (the C READ responder sends its responses after
    the acknowledgement of the same event, the model before)."""

    def __init__(self, qpn, mode, mrs=None, _test_break=None, _c_break=None, **kw):
        """_c_break: a break of the C engine only (to show the comparison can fail)."""
        brk = {b for b in (_test_break, _c_break) if b}
        self.c = cengine.QueuePair(qpn, mode, MRTable(), _test_break=brk, **kw)
        self.py = pyengine.QueuePair(qpn, mode, MRTable(), _test_break=_test_break,
                                     **{k: v for k, v in kw.items() if k != "engine"})
        self.mrs = _TwinMRs(self.c.mrs, self.py.mrs)
        self.mismatches: list[str] = []
        self.calls = 0
        self._local_twins: list = []       # (C-side buffer, model-side copy) of READ/atomics

    def __getattr__(self, name):
        return getattr(self.c, name)

    @property
    def attr(self):
        return self.c.attr

    @property
    def cq(self):
        return self.c.cq

    @property
    def state(self):
        return self.c.state

    def _check(self, what: str, now) -> None:
        self.calls += 1
        if self.c.state is not self.py.state:
            self._bad(what, now, f"state C {self.c.state} model {self.py.state}")
        dc, dp = self.c.next_deadline(), self.py.next_deadline()
        if dc != dp:
            self._bad(what, now, f"deadline C {dc} model {dp}")
        cp, pp = self.c._out, self.py._out
        if sorted(map(_norm, cp), key=repr) != sorted(map(_norm, pp), key=repr):
            self._bad(what, now, f"packets\n  C     {[_norm(p)[:12] for p in cp]}\n"
                                 f"  model {[_norm(p)[:12] for p in pp]}")
        self.py._out = []
        cc, pc = self.c.cq, self.py.cq
        if cc != pc[:len(cc)] or len(pc) != len(cc):
            self._bad(what, now, f"completions C {cc} model {pc}")
        self.py.cq = []

    def _bad(self, what, now, msg) -> None:
        if len(self.mismatches) < 5:
            self.mismatches.append(f"call {self.calls} {what} at {now}: {msg}")

    def modify(self, new, **attrs):
        self.c.modify(new, **attrs)
        self.py.modify(new, **attrs)

    def post_send(self, wr, now=0):
        twin = wr
        if wr.opcode in (WrOpcode.RDMA_READ, WrOpcode.ATOMIC_CMP_AND_SWP,
                         WrOpcode.ATOMIC_FETCH_AND_ADD):
            twin = replace(wr, local=bytearray(wr.local))
            self._local_twins.append((wr.local, twin.local))
        self.c.post_send(wr, now)
        self.py.post_send(twin, now)
        self._check(f"post_send {wr.wr_id}", now)

    def post_recv(self, wr):
        self.c.post_recv(wr)
        self.py.post_recv(RecvWR(wr.wr_id, bytearray(len(wr.buf)), wr.offset, wr.length))
        self._check(f"post_recv {wr.wr_id}", None)

    def receive(self, pkt, now):
        self.c.receive(pkt, now)
        self.py.receive(pkt, now)
        self._check(f"receive op {pkt.opcode:#x} psn {pkt.psn}", now)

    def on_timer(self, now):
        self.c.on_timer(now)
        self.py.on_timer(now)
        self._check("timer", now)

    def poll_cq(self):
        return self.c.poll_cq()

    def take_packets(self):
        return self.c.take_packets()

    def memory_differs(self) -> list[str]:
        """Registered memory and READ/atomic destinations: C engine vs model."""
        out = []
        for rkey, m in self.c.mrs._mrs.items():
            if bytes(m.buf) != bytes(self.py.mrs._mrs[rkey].buf):
                out.append(f"MR {rkey:#x}")
        for i, (c, p) in enumerate(self._local_twins):
            if bytes(c) != bytes(p):
                out.append(f"local buffer {i}")
        return out


IMPLS["diff"] = Shadowed
