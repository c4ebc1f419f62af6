"""The data-path contract (docs/engine.md): the XDP program's per-packet decisions equal the
engine's pure `responder_verdict` for the same packet in the same state. Seeded random
request streams in compat mode (WRITE FIRST/MIDDLE/LAST/ONLY, SEND into posted receives, READ,
atomics; in order, duplicated, with gaps, with bad rkeys, bounds, access and opcode sequence)
run through the loaded program with BPF_PROG_TEST_RUN and through the engine side by side;
after every packet the verdict (read from the kernel's reason and reply counters) and the
expected PSN must agree. Clauses: PSN-1..3, RESP-1..6, COMPAT-1..3."""

import random
import struct
import time
from dataclasses import replace
from types import SimpleNamespace

import pytest
from scapy.contrib.roce import BTH
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from metaroce.engine import packets as P
from metaroce.engine.verdict import PktFields, RespState, Verdict, responder_verdict
from metaroce.nic.rx import (ACCESS_LOCAL_WRITE, ACCESS_REMOTE_ATOMIC, ACCESS_REMOTE_READ,
                             ACCESS_REMOTE_WRITE, RxPath)

QPN, PD, PEER = 0x000321, 5, 0x000654
MTU = 256
SEND_F, SEND_M, SEND_L, SEND_O = 0x00, 0x01, 0x02, 0x04
WRITE_F, WRITE_M, WRITE_L, WRITE_O = 0x06, 0x07, 0x08, 0x0A
READ_REQ, CMP_SWAP, FETCH_ADD = 0x0C, 0x13, 0x14
RQ_SLOTS = 4

# what the kernel's counters say -> the engine's verdict
REASON_VERDICT = {"placed": Verdict.ACCEPT, "read_request": Verdict.ACCEPT,
                  "atomic": Verdict.ACCEPT, "duplicate": Verdict.DUPLICATE, "rnr": Verdict.RNR}
NAK_VERDICT = {"tx_nak_seq": Verdict.NAK_SEQ, "tx_nak_inv_req": Verdict.NAK_INVALID,
               "tx_nak_rem_access": Verdict.NAK_ACCESS}


def frame(op, psn, body):
    pad = -len(body) % 4                    # WIRE-10: pad to 4 bytes, PadCnt says how many
    return bytes(Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02") /
                 IP(src="10.9.0.1", dst="10.9.0.2") / UDP(sport=49200, dport=4791) /
                 BTH(opcode=op, dqpn=QPN, psn=psn & 0xFFFFFF, padcount=pad) /
                 Raw(body + bytes(pad)))


def kernel_verdict(rx, before) -> Verdict:
    after = rx.counters()
    d = {k: after[k] - before[k] for k in after if after[k] != before[k]}
    for k, v in NAK_VERDICT.items():
        if d.get(k):
            return v
    for k, v in REASON_VERDICT.items():
        if d.get(k):
            return v
    assert set(d) <= {"psn_out_of_order", "bad_opcode_seq", "qp_error"}, d
    return Verdict.DROP


class Stream:
    """One random request stream and the engine's state beside the kernel's."""

    def __init__(self, rx, rng, mrs, pd=PD, frame=None, sends=True):
        self.rx, self.rng, self.mrs, self.pd = rx, rng, mrs, pd
        self.frame = frame or globals()["frame"]
        self.kinds = ["write", "write", "send", "read", "atomic"] if sends else \
            ["write", "write", "read", "atomic"]
        self.sent: list[tuple[bytes, PktFields]] = []
        self.reset(rng.choice([0, 1000, 0xFFFFF0]))

    def reset(self, epsn):
        self.rx.del_qp(QPN)              # a fresh QP: no receive WQEs left from the last one
        self.rx.set_qp(QPN, epsn=epsn, pd=self.pd, dqpn=PEER, pmtu=MTU)
        self.posted = 0
        # the engine's table holds what this QP's PD may reach (another PD's rkey is invalid)
        engine_mrs = {m.rkey: (m.addr, m.length, m.access) for m in self.mrs if m.pd == self.pd}
        self.s = RespState(metaroce=False, epsn=epsn, mtu=MTU, mrs=engine_mrs)
        self.next = epsn
        self.sent.clear()
        self.refill()

    def refill(self):
        """Keep up to RQ_SLOTS receives posted (some streams leave them empty: RNR)."""
        if "send" not in self.kinds:
            return
        target = self.s.recv_head + (RQ_SLOTS if self.rng.random() < 0.8 else 0)
        recv = dict(self.s.recv)
        while self.posted < target:
            self.rx.post_recv(QPN, self.posted, self.posted, self.mrs[0].addr, self.mrs[0].rkey,
                              3 * MTU)
            recv[self.posted] = 3 * MTU
            self.posted += 1
        self.s = replace(self.s, recv=recv)

    def message(self):
        """Packets of one request message, valid or with one deliberate fault."""
        r = self.rng
        kind = r.choice(self.kinds)
        mr = r.choice(self.mrs)
        fault = r.choice([None] * 6 + ["rkey", "bounds", "access", "misalign", "seq"])
        rkey = mr.rkey ^ 0x5A5A if fault == "rkey" else mr.rkey
        if kind in ("write", "send"):
            n = r.choice([1, 1, 2, 3])
            length = (n - 1) * MTU + r.randint(1 if n > 1 else 0, MTU)
            va = mr.addr + r.randrange(0, max(1, mr.length - length))
            if fault == "bounds":
                va = mr.addr + mr.length - length + r.randint(1, 64)
            ops = ([WRITE_O] if n == 1 else [WRITE_F] + [WRITE_M] * (n - 2) + [WRITE_L]) \
                if kind == "write" else \
                ([SEND_O] if n == 1 else [SEND_F] + [SEND_M] * (n - 2) + [SEND_L])
            if fault == "seq":
                ops = ops[1:] or [WRITE_M if kind == "write" else SEND_M]
            out = []
            for i, op in enumerate(ops):
                size = MTU if op in (WRITE_F, WRITE_M, SEND_F, SEND_M) else length - (n - 1) * MTU
                payload = bytes([r.randrange(256)]) * size
                reth = P.Reth(va, rkey, length) if op in (WRITE_F, WRITE_O) else None
                body = (struct.pack("!QII", va, rkey, length) if reth else b"") + payload
                out.append((op, body, PktFields(op, 0, size, reth=reth)))
            return out
        if kind == "read":
            length = r.randint(1, 4 * MTU)
            va = mr.addr + r.randrange(0, max(1, mr.length - length))
            if fault == "bounds":
                va = mr.addr + mr.length - length + 8
            reth = P.Reth(va, rkey, length)
            return [(READ_REQ, struct.pack("!QII", va, rkey, length),
                     PktFields(READ_REQ, 0, 0, reth=reth))]
        op = r.choice([CMP_SWAP, FETCH_ADD])
        va = mr.addr + 8 * r.randrange(0, mr.length // 8)
        if fault == "misalign":
            va += r.randint(1, 7)
        if fault == "bounds":
            va = mr.addr + mr.length
        at = P.AtomicEth(va, rkey, 1, 0)
        return [(op, struct.pack("!QIQQ", va, rkey, 1, 0), PktFields(op, 0, 0, atomic=at))]

    def step(self, trace):
        r = self.rng
        choice = r.random()
        if choice < 0.12 and self.sent:                     # a duplicate of something sent
            raw, f = r.choice(self.sent[-8:])
            pkts = [(raw, f)]
        else:
            msg = self.message()
            psn = self.next
            if choice < 0.22:                               # a gap: the first packet is lost
                psn = (psn + r.randint(1, 3)) & 0xFFFFFF
            pkts = []
            for op, body, f in msg:
                f = replace(f, psn=psn)
                pkts.append((self.frame(op, psn, body), f))
                n = P.npackets(f.reth.length, MTU) if op == READ_REQ and f.reth else 1
                psn = (psn + n) & 0xFFFFFF
        for raw, f in pkts:
            before = self.rx.counters()
            self.rx.run(raw)
            got = kernel_verdict(self.rx, before)
            want = responder_verdict(self.s, f)
            kstate = self.rx.qp_state(QPN)
            trace.append((hex(f.opcode), f.psn, want.verdict.name, got.name, want.state.epsn,
                          kstate["epsn"]))
            assert got == want.verdict, trace[-12:]
            assert kstate["epsn"] == want.state.epsn, trace[-12:]
            self.sent.append((raw, f))
            s = want.state
            if want.verdict is Verdict.ACCEPT and want.target and want.target[0] == "recv" and \
                    P.base(f.opcode) in P.SEND_LAST | P.SEND_ONLY:
                recv = dict(s.recv)
                recv.pop(s.recv_head)
                s = replace(s, recv=recv, recv_head=s.recv_head + 1)
            self.s = s
            if want.verdict in (Verdict.NAK_INVALID, Verdict.NAK_ACCESS):
                self.reset(self.rng.choice([7, 0xFFFFFE, 500000]))   # fatal: the QP is re-armed
                return
            if want.verdict is Verdict.ACCEPT:
                self.next = s.epsn
            if want.verdict is not Verdict.ACCEPT:
                break                                        # the rest of the message is moot
        self.refill()


@pytest.fixture(scope="module")
def rx():
    path = RxPath(max_qps=16, max_mrs=16)
    yield path
    path.close()


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_kernel_decides_like_the_engine(rx, seed):
    rng = random.Random(seed)
    all_access = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ | \
        ACCESS_REMOTE_ATOMIC
    mrs = [rx.reg_mr(64 * 1024, PD, all_access),
           rx.reg_mr(5000, PD, ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE),      # no READ/atomic
           rx.reg_mr(4096, PD, ACCESS_REMOTE_READ),                           # read only
           rx.reg_mr(8192, PD + 1, all_access)]                               # another PD
    try:
        st = Stream(rx, rng, mrs)
        trace = []
        for _ in range(400):
            st.step(trace)
        seen = {t[2] for t in trace}
        assert {"ACCEPT", "DUPLICATE", "NAK_SEQ", "NAK_ACCESS", "NAK_INVALID"} <= seen, seen
    finally:
        for m in mrs:
            rx.dereg_mr(m)
        rx.del_qp(QPN)


# ---- the same streams over real veth: a lab pair, h2's daemon, frames from h1 -------------------

class WireNic:
    """The kernel of h2's running daemon, driven from h1 over the lab's veth links: frames go out
    of a raw socket in h1; verdicts are read from h2's counters; the QP is armed (and its kernel
    state read) through the daemon's raw-QP requests on the application's own connection."""

    def __init__(self, view, ctx):
        import socket
        from metaroce.lab import netdev
        self.ctx = ctx
        h1, h2 = view.plan.node("h1"), view.plan.node("h2")
        self.src_mac, self.dst_mac = h1.iface("eth0").mac, h2.iface("eth0").mac
        self.src_ip, self.dst_ip = (h.iface("eth0").ipv4.split("/")[0] for h in (h1, h2))
        with netdev.in_netns(h1.netns):
            self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
            self.sock.bind(("eth0", 0))

    def frame(self, op, psn, body):
        pad = -len(body) % 4
        return bytes(Ether(src=self.src_mac, dst=self.dst_mac) /
                     IP(src=self.src_ip, dst=self.dst_ip) / UDP(sport=49200, dport=4791) /
                     BTH(opcode=op, dqpn=QPN, psn=psn & 0xFFFFFF, padcount=pad) /
                     Raw(body + bytes(pad)))

    def set_qp(self, qpn, epsn, pd, dqpn, pmtu):
        self.ctx.request("set_qp", qpn=qpn, epsn=epsn, pd=pd, dqpn=dqpn, pmtu=pmtu)

    def del_qp(self, qpn):
        pass                                      # set_qp starts from a fresh state

    def qp_state(self, qpn):
        return self.ctx.request("raw_qp_state", qpn=qpn)[0]

    def counters(self):
        return self.ctx.status()["counters"]

    def run(self, raw):
        before = sum(self.counters().values())
        self.sock.send(raw)
        deadline = time.monotonic() + 2.0
        while sum(self.counters().values()) == before:     # until h2's kernel took it
            assert time.monotonic() < deadline, "the frame never reached h2's NIC"
            time.sleep(0.002)


@pytest.fixture(scope="module")
def wire(module_lab_name):
    from metaroce.lab import core
    from metaroce.nic import daemon as d
    from metaroce.verbs import MR as VMR, PD as VPD, Context
    core.up(module_lab_name, "pair")
    view = core.LabView(module_lab_name)
    dev = d.DeviceId("eth0", view.plan.node("h2").netns)
    try:
        d.start_background(dev, "roce")
        ctx = Context("eth0", dev.netns)
        pd, other = VPD(ctx), VPD(ctx)
        all_access = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ | \
            ACCESS_REMOTE_ATOMIC
        regs = [VMR(pd, 64 * 1024, all_access), VMR(pd, 5000, ACCESS_LOCAL_WRITE |
                ACCESS_REMOTE_WRITE), VMR(pd, 4096, ACCESS_REMOTE_READ),
                VMR(other, 8192, all_access)]
        mrs = [SimpleNamespace(rkey=m.rkey, addr=m.addr, length=m.length, access=m.access,
                               pd=m.pd.handle) for m in regs]
        yield WireNic(view, ctx), mrs, pd.handle
        ctx.close()
        d.stop(dev)
    finally:
        core.down(module_lab_name)


def test_the_same_decisions_over_veth(wire):
    """The contract holds on the wire too (issue 5: tables replayed over real veth)."""
    nic, mrs, pd = wire
    st = Stream(nic, random.Random(7), mrs, pd=pd, frame=nic.frame, sends=False)
    trace = []
    for _ in range(60):
        st.step(trace)
    seen = {t[2] for t in trace}
    assert {"ACCEPT", "DUPLICATE", "NAK_SEQ"} <= seen, seen
