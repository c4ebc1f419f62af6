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
from metaroce.engine import psn as psnm
from metaroce.engine.verdict import PktFields, RespState, Verdict, responder_verdict
from metaroce.nic.rx import (ACCESS_LOCAL_WRITE, ACCESS_REMOTE_ATOMIC, ACCESS_REMOTE_READ,
                             ACCESS_REMOTE_WRITE, RQ_DEPTH)
from metaroce.wire import consts as C
from metaroce.wire.headers import BTH as BTH_, PETH, RETH, AtomicETH, ImmDt
from metaroce.wire.packet import UDP as UDP_, Ethernet, IPv4, RocePacket

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
    assert set(d) <= {"psn_out_of_order", "bad_opcode_seq", "qp_error", "beyond_window",
                      "wrong_mode"}, d
    return Verdict.DROP


def post_receives(st, upto):
    """Post the stream's receives numbered st.posted .. upto - 1 (3 MTUs each, into its first
    MR) in the kernel's ring and in the engine's state."""
    recv = dict(st.s.recv)
    while st.posted < upto:
        st.rx.post_recv(QPN, st.posted, st.posted, st.mrs[0].addr, st.mrs[0].rkey, 3 * MTU)
        recv[st.posted] = 3 * MTU
        st.posted += 1
    st.s = replace(st.s, recv=recv)


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
        post_receives(self, self.s.recv_head + (RQ_SLOTS if self.rng.random() < 0.8 else 0))

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


ALL_ACCESS = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ | ACCESS_REMOTE_ATOMIC


@pytest.fixture
def mrs(rx):
    """The regions every stream aims at: one for everything, one without READ/atomic, one read
    only, one of another PD; its teardown also deletes the QP the test's streams created."""
    regs = [rx.reg_mr(64 * 1024, PD, ALL_ACCESS),
            rx.reg_mr(5000, PD, ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE),
            rx.reg_mr(4096, PD, ACCESS_REMOTE_READ),
            rx.reg_mr(8192, PD + 1, ALL_ACCESS)]
    yield regs
    for m in regs:
        rx.dereg_mr(m)
    rx.del_qp(QPN)


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_kernel_decides_like_the_engine(rx, mrs, seed):
    st = Stream(rx, random.Random(seed), mrs)
    trace = []
    for _ in range(400):
        st.step(trace)
    seen = {t[2] for t in trace}
    assert {"ACCEPT", "DUPLICATE", "NAK_SEQ", "NAK_ACCESS", "NAK_INVALID"} <= seen, seen


# ---- MetaRoCE mode: reordered, duplicated and refused packets against the receive window -----

MR_W = 128                                  # SACK-1's W of the XDP responder (nic_consts.h)
O = C.Opcode


def mr_frame(op, psn, headers, payload=b""):
    return RocePacket(ip=IPv4(src="10.9.0.1", dst="10.9.0.2"),
                      bth=BTH_(opcode=op, dest_qp=QPN, psn=psn & 0xFFFFFF), headers=headers,
                      payload=payload, udp=UDP_(sport=0xC001),
                      eth=Ethernet(dst="02:00:00:00:00:02", src="02:00:00:00:00:01")).to_bytes()


def kernel_bitmap(kstate) -> set[int]:
    """The distances d from ePSN of the PSNs the kernel recorded (wire order: d = 1 is bit 63
    of rbm_hi, d = 65 bit 63 of rbm_lo)."""
    hi, lo = kstate["rbm_hi"], kstate["rbm_lo"]
    return {d for d in range(1, MR_W) if (hi >> (64 - d) if d <= 64 else lo >> (128 - d)) & 1}


def engine_bitmap(state) -> set[int]:
    return {d for d in range(1, MR_W) if state.bitmap >> d & 1}


class MrStream:
    """MetaRoCE request messages whose packets arrive in random order, some twice, some refused
    and sent again (a lossy, multipath fabric with a requester that repairs), against one QP;
    after every packet the kernel's verdict, ePSN and receive bitmap equal the engine's."""

    def __init__(self, rx, rng, mrs, faults=True):
        self.rx, self.rng, self.mrs, self.faults = rx, rng, mrs, faults
        self.reset(rng.choice([0, 1000, 0xFFFFC0]))

    def reset(self, epsn):
        self.rx.del_qp(QPN)
        self.rx.set_qp(QPN, epsn=epsn, pd=PD, dqpn=PEER, pmtu=MTU, metaroce=True)
        engine_mrs = {m.rkey: (m.addr, m.length, m.access) for m in self.mrs if m.pd == PD}
        self.s = RespState(metaroce=True, epsn=epsn, mtu=MTU, window=MR_W, mrs=engine_mrs)
        self.next, self.ssn, self.rsn, self.posted = epsn, 1, 0, 0
        self.pending: list[tuple[bytes, PktFields]] = []     # made, not yet recorded
        self.held, self.hold = None, 0       # a lost packet whose repair comes much later
        self.sent: list[tuple[bytes, PktFields]] = []
        self.refill()

    def refill(self):
        """Receives posted for the RSNs the stream has used and a few beyond, most of the time
        (the rest: SENDs meet RNR until a later refill). In MetaRoCE mode the kernel never
        consumes a WQE itself (user space completes it once ePSN passes), so RSN n is WQE n."""
        if self.rng.random() >= 0.3:
            post_receives(self, min(self.rsn + 2, RQ_DEPTH))

    def message(self):
        """The packets of one request message at the next PSNs, valid or with one fault."""
        r = self.rng
        kind = r.choice(["write", "write", "write_imm", "send", "read", "atomic"])
        mr = self.mrs[0] if r.random() < 0.85 or not self.faults else r.choice(self.mrs)
        fault = r.choice([None] * 16 + ["rkey", "bounds", "range", "offset", "length",
                                        "oversize", "misalign", "mode"]) if self.faults else None
        rkey = mr.rkey ^ 0x5A5A if fault == "rkey" else mr.rkey
        psn, ssn = self.next, self.ssn
        self.ssn += 1
        out = []
        if kind in ("write", "write_imm", "send"):
            n = r.choice([1, 1, 2, 3, 5])
            length = (n - 1) * MTU + (MTU + 4 if fault == "oversize" else r.randint(1, MTU))
            va = mr.addr + r.randrange(0, max(1, mr.length - length))
            if fault == "bounds":                      # the last bytes lie past the MR
                va = mr.addr + mr.length - length + r.randint(1, 64)
            if fault == "range":                       # PLACE-2: the RETH's range is checked
                length += mr.length
            imm = kind == "write_imm" or (kind == "send" and r.random() < 0.3)
            consumes = kind != "write"
            rsn = self.rsn
            if consumes:
                self.rsn += 1
            nmsg = n if fault == "oversize" else -(-length // MTU)   # oversize: the last
            # packet carries more than the MTU
            ops = P.segment_opcodes("send" if kind == "send" else "write", nmsg, imm)
            for i, rc_op in enumerate(ops):
                op = P.to_mode(rc_op, True)
                off = i * MTU
                size = length - off if i == nmsg - 1 else MTU
                if fault == "offset" and i == nmsg - 1:
                    off += 8                            # a packet at the wrong place
                if fault == "length" and i == 0 and nmsg > 1:
                    size -= 1                           # a FIRST shorter than the MTU
                payload = bytes([r.randrange(256)]) * size
                hdrs = [PETH(path_id=0, ssn=ssn, offset=off, rsn=rsn)]
                reth = None
                if kind != "send":
                    reth = P.Reth(va, rkey, length)
                    hdrs.append(RETH(va=va, rkey=rkey, dma_len=length))
                if rc_op in P.WITH_IMM:
                    hdrs.append(ImmDt(0x1234))
                f = PktFields(op, (psn + i) & 0xFFFFFF, size, reth=reth,
                              place=P.Placement(ssn, rsn, off))
                out.append((mr_frame(op, psn + i, tuple(hdrs), payload), f))
                if fault == "mode" and i == 0:          # the other mode's opcode (EXT-2) first
                    out.insert(0, (frame(int(rc_op), psn, payload),
                                   replace(f, opcode=int(rc_op))))
            self.next = (psn + len(ops)) & 0xFFFFFF
            return out
        pl = P.Placement(ssn, self.rsn, 0)
        if kind == "read":
            length = r.randint(1, 6 * MTU)
            va = mr.addr + r.randrange(0, max(1, mr.length - length))
            if fault == "bounds":
                va = mr.addr + mr.length - length + 8
            hdrs = (PETH(path_id=0, ssn=ssn, offset=0, rsn=self.rsn),
                    RETH(va=va, rkey=rkey, dma_len=length))
            op = int(O.MR_RDMA_READ_REQUEST)
            f = PktFields(op, psn, 0, reth=P.Reth(va, rkey, length), place=pl)
            self.next = (psn + P.npackets(length, MTU)) & 0xFFFFFF
            return [(mr_frame(op, psn, hdrs), f)]
        op = int(r.choice([O.MR_COMPARE_SWAP, O.MR_FETCH_ADD]))
        va = mr.addr + 8 * r.randrange(0, mr.length // 8)
        if fault == "misalign":
            va += r.randint(1, 7)
        if fault == "bounds":
            va = mr.addr + mr.length
        hdrs = (PETH(path_id=0, ssn=ssn, offset=0, rsn=self.rsn),
                AtomicETH(va=va, rkey=rkey, swap_add=1, compare=0))
        f = PktFields(op, psn, 0, atomic=P.AtomicEth(va, rkey, 1, 0), place=pl)
        self.next = (psn + 1) & 0xFFFFFF
        return [(mr_frame(op, psn, hdrs), f)]

    def step(self, trace):
        r = self.rng
        # keep up to a window and a bit more of PSNs made: the far ones meet SACK-1's edge
        while not self.pending or (r.random() < 0.35 and
                                   psnm.diff(self.next, self.s.epsn) < MR_W + 24):
            self.pending += self.message()
        if self.held is None and r.random() < 0.03:
            self.held, self.hold = self.pending.pop(0), r.randint(40, 300)
            if not self.pending:
                self.pending += self.message()
        elif self.held is not None:
            self.hold -= 1
            if not self.hold:
                self.pending.insert(0, self.held)
                self.held = None
        if r.random() < 0.1 and self.sent:
            raw, f = r.choice(self.sent[-16:])                # a duplicate
            recorded = True
        else:
            i = 0 if r.random() < 0.4 else r.randrange(len(self.pending))
            raw, f = self.pending.pop(i)
            recorded = False
        before = self.rx.counters()
        self.rx.run(raw)
        got = kernel_verdict(self.rx, before)
        want = responder_verdict(self.s, f)
        kstate = self.rx.qp_state(QPN)
        trace.append((hex(f.opcode), f.psn, want.verdict.name, got.name, want.state.epsn,
                      kstate["epsn"], psnm.diff(f.psn, self.s.epsn)))
        assert got == want.verdict, trace[-12:]
        assert kstate["epsn"] == want.state.epsn, trace[-12:]
        assert kernel_bitmap(kstate) == engine_bitmap(want.state), trace[-12:]
        self.s = want.state
        v = want.verdict
        if v in (Verdict.NAK_INVALID, Verdict.NAK_ACCESS):
            self.reset(r.choice([7, 0xFFFFFE, 500000]))       # fatal: the QP is re-armed
            return
        if v is Verdict.ACCEPT:
            self.sent.append((raw, f))
        elif not recorded and v in (Verdict.DROP, Verdict.RNR) and \
                f.opcode >= 0xC0:                             # refused: the requester resends
            self.pending.append((raw, f))
        self.refill()


def test_kernel_decides_like_the_engine_in_metaroce_mode(rx, mrs):
    """Issue 20 (5): the contract in MetaRoCE mode (SACK-1, SACK-3, SACK-6, SACK-7, SACK-9,
    PLACE-2, PLACE-5, EXT-2, RESP-15): seeded streams of WRITE, WRITE with immediate, SEND by
    RSN, READ and atomics, their packets in random order, duplicated, past the window edge and
    with faults, through the loaded program and the engine's responder side by side."""
    seen, trace = set(), []
    for seed in (11, 12, 13, 14):           # two streams with faults, two without (whose
        # holes stay open long enough to fill the window to its edge)
        st = MrStream(rx, random.Random(seed), mrs, faults=seed < 13)
        for _ in range(500):
            st.step(trace)
        seen |= {t[2] for t in trace}
    assert {"ACCEPT", "DUPLICATE", "DROP", "RNR", "NAK_ACCESS", "NAK_INVALID"} <= seen, seen
    ahead = max(t[6] for t in trace if t[2] == "ACCEPT")
    beyond = [t for t in trace if t[6] >= MR_W]
    assert ahead >= MR_W - 16, f"packets were recorded at most {ahead} PSNs ahead of ePSN"
    assert beyond and {t[2] for t in beyond} == {"DROP"}, "SACK-1's edge was not met"


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
        regs = [VMR(pd, 64 * 1024, ALL_ACCESS), VMR(pd, 5000, ACCESS_LOCAL_WRITE |
                ACCESS_REMOTE_WRITE), VMR(pd, 4096, ACCESS_REMOTE_READ),
                VMR(other, 8192, ALL_ACCESS)]
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
