"""Fuzzing the control socket (issue 9, parts 1 and 5): bad requests to a running daemon —
bytes that are not JSON, JSON that is not an object, deep nesting, every op with fields of the
wrong type or range — each get an error reply with their id (or none when they have no id), and
the daemon keeps serving. Work requests of any shape, posted through the library into the QP's
shared-memory rings (issue 19: they no longer travel on the control socket), are checked against
what verbs says they must do (wr_model.py), on a QP pair that is replaced whenever one took it
to ERR, so that every example checks something. (What an application writes into its rings
directly, bypassing the library: tests/integration/test_hostile_app.py.)"""

import base64
import json
import os
import socket
import time

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from verbs_util import ALL_ACCESS, End, connect, daemons, ip_of, lab_pair
from wr_model import OPCODES as WR_OPCODES
from wr_model import RECV_BYTES, Memory, Model, Refused

from metaroce.errors import MetaroceError
from metaroce.lab import core
from metaroce.nic import daemon as d
from metaroce.verbs import (CQ, IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_REMOTE_READ, IBV_SEND_FENCE,
                            IBV_SEND_INLINE, IBV_SEND_SIGNALED, IBV_SEND_SOLICITED,
                            IBV_WC_SUCCESS, IBV_WC_WR_FLUSH_ERR, IBV_WR_RDMA_READ,
                            IBV_WR_RDMA_WRITE, MR, PD, QP,
                            Context, QPInitAttr, RecvWR, SendWR)

OPS = ["status", "query_device", "alloc_pd", "reg_mr", "dereg_mr", "create_cq", "destroy_cq",
       "create_comp_channel", "destroy_comp_channel", "create_qp", "connect_qp", "query_qp",
       "destroy_qp", "post_send", "post_recv", "set_qp", "create_endpoint", "destroy_endpoint",
       "list_endpoints", "nonsense", None]
FIELDS = ["pd", "length", "access", "key", "depth", "send_cq", "recv_cq", "cap", "qpn", "remote",
          "attr", "wrs", "epsn", "dqpn", "mr_bytes", "persistent", "cq", "cqe", "channel"]
INTS = st.one_of(st.integers(-2**70, 2**70), st.sampled_from([0, 1, -1, 2**31, 2**32, 2**63,
                                                               2**64, 0xFFFFFF]))
SCALARS = st.one_of(st.none(), st.booleans(), INTS, st.floats(allow_nan=True),
                    st.text(max_size=20))
VALUES = st.recursive(SCALARS, lambda c: st.one_of(st.lists(c, max_size=4),
                                                  st.dictionaries(st.text(max_size=8), c,
                                                                  max_size=4)), max_leaves=12)
WR_KEYS = ["opcode", "wr_id", "sg_list", "send_flags", "remote_addr", "rkey", "imm_data",
           "compare_add", "swap", "inline"]
OPCODES = st.sampled_from([*WR_OPCODES, "X"])


@pytest.fixture(scope="module")
def dev(module_lab_name):
    view = lab_pair(module_lab_name)
    try:
        with daemons(view) as devs:
            c1 = Context("eth0", devs[0].netns)
            c2 = Context("eth0", devs[1].netns)
            a, b = End(c1, 65536), End(c2, 65536)
            connect(a, b, ip_of(view, "h1"), ip_of(view, "h2"))
            yield devs[0], a, b
            c1.close()
            c2.close()
    finally:
        core.down(module_lab_name)


class Raw:
    def __init__(self, dev):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(10)
        self.s.connect(dev.sock_path)
        self.buf = b""

    def ask(self, line: bytes) -> dict:
        self.s.sendall(line + b"\n")
        while b"\n" not in self.buf:
            chunk = self.s.recv(1 << 16)
            assert chunk, "the daemon closed the connection"
            self.buf += chunk
        out, self.buf = self.buf.split(b"\n", 1)
        return json.loads(out)


def alive_and_serving(dev, a, b):
    assert d.running_pid(dev) is not None
    assert "counters" in d.request(dev, {"op": "status"})[0]


_ids = iter(range(10**9))


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(op=st.sampled_from(OPS), fields=st.dictionaries(st.sampled_from(FIELDS), VALUES,
                                                        max_size=5))
def test_random_requests_get_an_error_not_a_crash(dev, op, fields):
    device, a, b = dev
    r = Raw(device)
    rid = next(_ids)
    if op in ("reg_mr", "create_endpoint"):      # never a legitimately huge registration
        for k in ("length", "mr_bytes"):
            if isinstance(fields.get(k), int) and 0 < fields[k] <= 1 << 34:
                fields[k] = fields[k] % (1 << 20) + 1
    rep = r.ask(json.dumps({"op": op, "id": rid, **fields}).encode())
    assert rep["id"] == rid
    r.s.close()


class Rig:
    """The work-request fuzz's two ends, on the module's two devices: long-lived PDs, regions
    and CQs (registering a region costs ~25 ms), and a QP pair that is replaced after a work
    request took it to ERR (~13 ms). Region names and roles are wr_model's."""

    def __init__(self, ca: Context, cb: Context, ip_a: str, ip_b: str):
        self.ca, self.cb, self.ip_a, self.ip_b = ca, cb, ip_a, ip_b
        self.pa, self.pb = PD(ca), PD(cb)
        self.mrs = {"a.src": MR(self.pa, 16384, ALL_ACCESS), "a.ro": MR(self.pa, 4096, 0),
                    "a.alien": MR(PD(ca), 4096, ALL_ACCESS),
                    "a.guard": MR(self.pa, 4096, ALL_ACCESS),
                    "b.mr": MR(self.pb, 16384, ALL_ACCESS),
                    "b.ro": MR(self.pb, 4096, IBV_ACCESS_REMOTE_READ),
                    "b.rx": MR(self.pb, 8 * RECV_BYTES, IBV_ACCESS_LOCAL_WRITE),
                    "b.alien": MR(PD(cb), 4096, ALL_ACCESS),
                    "b.guard": MR(self.pb, 4096, ALL_ACCESS)}
        named = {n: m for n, m in self.mrs.items() if not n.endswith(".guard")}
        self.model = Model({n: (m.addr, m.length, m.lkey, m.rkey, m.pd.handle, m.access)
                            for n, m in named.items()}, {n: n[0] for n in named},
                           self.pa.handle, self.pb.handle)
        self.scq, self.rcq, self.bcq = CQ(ca), CQ(ca), CQ(cb)
        self.qa = self.qb = None
        self._ids = iter(range(1, 1 << 62))
        self._slot = 0
        self.stale = True

    def next_id(self) -> int:
        return next(self._ids)

    def ready(self) -> None:
        """An RTS pair (a new one when the last example left it in ERR or unknown), with four
        receives posted at b."""
        if self.stale:
            for q in (self.qa, self.qb):
                if q is not None:
                    q.close()                              # flushes what it still held
            self.ca.status(), self.cb.status()             # every completion sent is read
            for cq in (self.scq, self.rcq, self.bcq):      # what the old pair left behind
                while cq.poll(1024):
                    pass
            self.qa = QP(self.pa, QPInitAttr(self.scq, self.rcq))
            self.qb = QP(self.pb, QPInitAttr(self.bcq, self.bcq))
            self.qa.connect({"qpn": self.qb.qp_num, "psn": self.qb.psn, "ip": self.ip_b})
            self.qb.connect({"qpn": self.qa.qp_num, "psn": self.qa.psn, "ip": self.ip_a})
            self.a_recvs: list[int] = []
            self.b_recvs: list[tuple[int, int]] = []
            self.stale = False
        rx, new = self.mrs["b.rx"], []
        while len(self.b_recvs) + len(new) < 4:
            new.append((self.next_id(), self._slot * RECV_BYTES))
            self._slot = (self._slot + 1) % 8
        if new:
            self.qb.post_recv([RecvWR(wr_id=i, sg_list=[rx.sge(off, RECV_BYTES)]) for i, off in new])
            self.b_recvs += new

    def fill(self) -> Memory:
        """Fresh contents in every region; what they hold now."""
        mem = Memory({})
        for name, m in self.mrs.items():
            data = os.urandom(m.length)
            m.write(data)
            mem.data[name] = bytearray(data)
        return mem

    def check_memory(self, mem: Memory) -> None:
        for name, m in self.mrs.items():
            got, want = bytearray(m.read(m.length)), mem.data[name]
            for i in mem.unknown.get(name, ()):
                got[i] = want[i]
            if got != want:
                i = next(i for i in range(len(got)) if got[i] != want[i])
                raise AssertionError(f"{name} differs from what verbs allows at byte {i}")

    def states(self) -> tuple[str, str]:
        return self.qa.query()["state"], self.qb.query()["state"]

    def settle(self, timeout_s: float = 10.0) -> None:
        """Until the requester's send queue is empty (every WR acknowledged or flushed)."""
        deadline = time.monotonic() + timeout_s
        while self.qa.query()["sq_outstanding"] and time.monotonic() < deadline:
            time.sleep(0.002)
        assert self.qa.query()["sq_outstanding"] == 0, "work requests neither completed nor failed"


def _offsets(length: int):
    return st.one_of(st.sampled_from([-1, 0, 1, 8, length - 8, length - 1, length, length + 1]),
                     st.integers(0, length // 8).map(lambda x: 8 * x),
                     st.integers(0, length))


def _lengths(length: int):
    return st.one_of(st.sampled_from([0, 1, 8, RECV_BYTES - 1, RECV_BYTES, RECV_BYTES + 1,
                                      length, length + 1]),
                     st.integers(0, 2048), st.integers(0, length))


SIZES = st.one_of(st.sampled_from([0, 1, 8, RECV_BYTES - 1, RECV_BYTES, RECV_BYTES + 1]),
                  st.integers(0, 3000))


@st.composite
def _sge(draw, rig: Rig, regions: list[str], atomic: bool = False):
    """Mostly an SGE inside a region (8 aligned bytes for an atomic); else one at or beyond a
    bound, of a region the WR may not use (read-only, another PD) or of no region at all."""
    if draw(st.integers(0, 5)):
        m = rig.mrs[draw(st.sampled_from(regions[:1] * 3 + regions[1:2]))]
        n = 8 if atomic else min(draw(SIZES), m.length)
        off = draw(st.integers(0, (m.length - n) // 8).map(lambda x: 8 * x) if atomic
                   else st.integers(0, m.length - n))
        return [m.addr + off, n, m.lkey]
    name = draw(st.sampled_from(regions + ["rand"]))
    if name == "rand":
        return [draw(INTS), draw(INTS), draw(st.one_of(INTS, st.integers(0, 2**32 - 1)))]
    m = rig.mrs[name]
    return [m.addr + draw(_offsets(m.length)), draw(_lengths(m.length)), m.lkey]


@st.composite
def _remote(draw, rig: Rig, n: int, atomic: bool):
    """(remote_addr, rkey): mostly inside the peer's region; else at or beyond its bounds, in
    its read-only region, another PD's, or anything."""
    if draw(st.integers(0, 1)):
        m = rig.mrs["b.mr"]
        n = 8 if atomic else min(n, m.length)
        return m.addr + (draw(st.integers(0, (m.length - n) // 8)) * 8 if atomic
                         else draw(st.integers(0, m.length - n))), m.rkey
    name = draw(st.sampled_from(["b.mr", "b.ro", "b.alien", "rand"]))
    if name == "rand":
        return draw(INTS), draw(st.one_of(INTS, st.integers(0, 2**32 - 1)))
    m = rig.mrs[name]
    return m.addr + draw(_offsets(m.length)), m.rkey


LOCAL = ["a.src", "a.ro", "a.alien"]


@st.composite
def _garbled(draw, wr: dict):
    """A WR one field of which is anything (or missing), or anything instead of a WR."""
    how = draw(st.sampled_from(["value", "field", "drop"]))
    if how == "value":
        return draw(VALUES)
    key = draw(st.sampled_from(WR_KEYS[:1] + WR_KEYS[2:]))        # never wr_id: it names WRs
    wr = dict(wr)
    if how == "field":
        wr[key] = draw(VALUES)
    else:
        wr.pop(key, None)
    return wr


@st.composite
def send_wrs(draw, rig: Rig):
    """(work requests, whether the model knows what they must do): WRs of every opcode, mostly
    well formed, naming the rig's regions inside, at and beyond their bounds; some garbled."""
    wrs, known = [], True
    for _ in range(draw(st.sampled_from([0, 1, 1, 1, 2, 2, 3]))):
        op = draw(OPCODES)
        atomic = op.startswith("ATOMIC")
        wr = {"opcode": op, "wr_id": rig.next_id(),
              "send_flags": draw(st.sampled_from([IBV_SEND_SIGNALED] * 3 + [
                  0, IBV_SEND_SIGNALED | IBV_SEND_SOLICITED, IBV_SEND_SIGNALED | IBV_SEND_FENCE]))}
        if op in ("RDMA_WRITE", "RDMA_WRITE_WITH_IMM", "SEND", "SEND_WITH_IMM") and \
                draw(st.integers(0, 4)) == 0:
            wr["inline"] = base64.b64encode(draw(st.binary(max_size=300))).decode()
            wr["send_flags"] |= IBV_SEND_INLINE
        else:
            n = draw(st.sampled_from([1, 1, 1, 1, 1, 0, 2]))
            wr["sg_list"] = [draw(_sge(rig, LOCAL, atomic)) for _ in range(n)]
        if not op.startswith("SEND"):
            size = sum(max(0, s[1]) for s in wr.get("sg_list", []) if isinstance(s[1], int))
            wr["remote_addr"], wr["rkey"] = draw(_remote(rig, size, atomic))
        if op.endswith("_IMM"):
            wr["imm_data"] = draw(INTS)
        if atomic:
            wr["compare_add"], wr["swap"] = draw(INTS), draw(INTS)
        if draw(st.integers(0, 11)) == 0:
            wr, known = draw(_garbled(wr)), False
        wrs.append(wr)
    return wrs, known


@st.composite
def recv_wrs(draw, rig: Rig):
    wrs, known = [], True
    for _ in range(draw(st.integers(1, 3))):
        wr = {"wr_id": rig.next_id(),
              "sg_list": [draw(_sge(rig, LOCAL)) for _ in range(draw(st.sampled_from([1] * 5 + [0, 2])))]}
        if draw(st.integers(0, 11)) == 0:
            wr, known = draw(_garbled(wr)), False
        wrs.append(wr)
    return wrs, known


@pytest.fixture(scope="module")
def rig(dev, module_lab_name):
    device, a, b = dev
    view = core.LabView(module_lab_name)
    return Rig(a.ctx, b.ctx, ip_of(view, "h1"), ip_of(view, "h2"))


def _wr(wr, recv: bool):
    """A generated work request as the library's object (anything else as it is: the
    library must refuse it)."""
    if not isinstance(wr, dict) or set(wr) - set(WR_KEYS):
        return wr                      # not a work request at all
    if recv:
        return RecvWR(**{k: v for k, v in wr.items() if k in ("wr_id", "sg_list")})
    fields = {k: v for k, v in wr.items() if k != "inline"}
    if "inline" in wr:
        try:
            fields["inline_data"] = base64.b64decode(wr["inline"], validate=True)
        except (TypeError, ValueError):
            fields["inline_data"] = wr["inline"]     # not bytes: the library must refuse it
    return SendWR(**{"opcode": None, **fields})


def _post(rig: Rig, op: str, wrs) -> str | None:
    """The library's refusal, or None when it took the post."""
    recv = op == "post_recv"
    try:
        objs = [_wr(w, recv) for w in wrs] if isinstance(wrs, list) else wrs
        (rig.qa.post_recv if recv else rig.qa.post_send)(objs)
    except MetaroceError as exc:
        assert "closed the connection" not in str(exc), exc
        return str(exc)
    return None


def _wcs(cq) -> list:
    return [(w.wr_id, w.status) for w in cq.poll(1024)]


def _serving(rig: Rig) -> None:
    """Both daemons answer status (and every completion they sent before it is read)."""
    assert "counters" in rig.ca.status() and "counters" in rig.cb.status()


def _nothing_happened(rig: Rig, mem: Memory) -> None:
    _serving(rig)
    assert (_wcs(rig.scq), _wcs(rig.rcq), _wcs(rig.bcq)) == ([], [], [])
    assert rig.states() == ("RTS", "RTS")
    rig.check_memory(mem)


def _as_modelled(rig: Rig, mem: Memory, parsed: list[dict]) -> None:
    """A taken post did what wr_model says: completions, the peer's receives, states, memory."""
    want = rig.model.run(parsed, mem, rig.b_recvs)
    got = [(w.wr_id, w.status) for w in rig.scq.wait(len(want.send_wcs))]
    rig.settle()
    got += _wcs(rig.scq)
    assert got == want.send_wcs
    rwcs = [(w.wr_id, w.status, w.byte_len if w.status == IBV_WC_SUCCESS else None)
            for w in rig.bcq.wait(len(want.recv_wcs))]
    assert rwcs == [(i, st_, n if st_ == IBV_WC_SUCCESS else None)
                    for i, st_, n in want.recv_wcs]
    if want.a_err:                                          # a's receives are flushed too
        assert [(w.wr_id, w.status) for w in rig.rcq.wait(len(rig.a_recvs))] == \
            [(i, IBV_WC_WR_FLUSH_ERR) for i in rig.a_recvs]
    _serving(rig)
    assert (_wcs(rig.scq), _wcs(rig.rcq), _wcs(rig.bcq)) == ([], [], [])
    assert rig.states() == ("ERR" if want.a_err else "RTS", "ERR" if want.b_err else "RTS")
    rig.check_memory(mem)
    del rig.b_recvs[:len(want.recv_wcs)]
    rig.stale = want.a_err or want.b_err


def _post_modelled(rig: Rig, wrs: list[dict]) -> None:
    rig.ready()
    rig.stale = True
    mem = rig.fill()
    assert _post(rig, "post_send", wrs) is None
    _as_modelled(rig, mem, rig.model.check_post_send(wrs))


def test_a_read_before_a_failing_write_completes(rig):
    """The peer executed the READ before NAKing the WRITE after it: the READ completes with its
    data, the WRITE with its remote access error, nothing else changes (ERR-1, RESP-10). The
    peer's daemon sends READ responses and its kernel the NAK, so the NAK may come first."""
    src, dst = rig.mrs["a.src"], rig.mrs["b.mr"]
    for n in (0, 8, 4096):
        _post_modelled(rig, [
            {"opcode": "RDMA_READ", "wr_id": 1, "sg_list": [src.sge(64, n)],
             "remote_addr": dst.addr + 100, "rkey": dst.rkey},
            {"opcode": "RDMA_WRITE", "wr_id": 2, "sg_list": [src.sge(0, 8)],
             "remote_addr": dst.addr - 1, "rkey": dst.rkey}])
        assert rig.stale                                     # both QPs went to ERR


def test_a_zero_length_read_names_no_memory(rig):
    """No R_Key is checked for a zero-length READ (as in InfiniBand): it completes."""
    src = rig.mrs["a.src"]
    for rkey in (0, rig.mrs["b.alien"].rkey, 2**32 - 1):
        _post_modelled(rig, [{"opcode": "RDMA_READ", "wr_id": 1, "sg_list": [src.sge(0, 0)],
                              "remote_addr": 0, "rkey": rkey}])
        assert not rig.stale


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data(), recv=st.sampled_from([False, False, False, True]))
def test_random_work_requests_on_a_live_qp(dev, rig, data, recv):
    """Work requests of any shape on an application's own RTS QP, each checked against what
    verbs says must happen (wr_model): the post refused or taken, each WR's completion status,
    the receives it consumed at the peer, which QPs end in ERR (a bad WR taking the pair to ERR
    is correct; the next example gets a new pair), and that no byte of any region changed that
    the WRs may not change. The daemon serves after every one."""
    device = dev[0]
    rig.ready()
    rig.stale = True                      # until this example has passed: then as it leaves it
    mem = rig.fill()
    op = "post_recv" if recv else "post_send"
    wrs, known = data.draw(recv_wrs(rig) if recv else send_wrs(rig))
    refused = _post(rig, op, wrs)
    event(f"{op} {'modelled' if known else 'garbled'}: {'refused' if refused else 'taken'}")
    if recv:
        if known:
            posted, refuse = rig.model.check_post_recv(wrs)
            assert (refused is not None) == refuse, refused
            rig.a_recvs += posted
        else:
            rig.stale = True                                # how many it posted is unknown
        _nothing_happened(rig, mem)                          # b never sends
        rig.stale = not known or len(rig.a_recvs) > 128
    elif known:
        try:
            parsed = rig.model.check_post_send(wrs)
        except Refused:
            parsed = None
        if parsed is None:
            assert refused is not None, "the device took a post verbs says it must refuse"
            _nothing_happened(rig, mem)
            rig.stale = False
        else:
            assert refused is None, refused
            _as_modelled(rig, mem, parsed)
            event(f"post_send taken: {len(parsed)} WRs, " + (
                "pair to ERR" if rig.stale else "all succeeded"))
    elif refused is not None:
        _nothing_happened(rig, mem)
        rig.stale = False
    else:                                                   # taken, and not modelled
        rig.settle()
        _serving(rig)
        got = _wcs(rig.scq)
        posted = [w["wr_id"] for w in wrs]
        assert [i for i, _ in got] == [i for i in posted if i in {j for j, _ in got}]
        errors = [s for _, s in got if s != IBV_WC_SUCCESS]
        assert (rig.states()[0] == "ERR") == bool(errors), (got, rig.states())
        for name in ("a.guard", "b.guard", "a.ro", "b.ro", "a.alien", "b.alien"):
            m = rig.mrs[name]
            assert m.read(m.length) == bytes(mem.data[name]), name
    assert d.running_pid(device) is not None           # and it answered status just now


@pytest.mark.parametrize("line", [b"", b"{", b"[" * 100000, b"{\"op\": " * 50000, b"\xff\xfe",
                                  b"null", b"[1, 2]", b"\"status\"", b"1e999999",
                                  b"{\"op\": \"status\", \"id\": [1]}", b"x" * (1 << 20)])
def test_malformed_lines(dev, line):
    device, a, b = dev
    r = Raw(device)
    rep = r.ask(line)
    assert "error" in rep or rep.get("counters") is not None
    r.s.close()
    alive_and_serving(device, a, b)


def test_still_serving_after_the_fuzz(dev, module_lab_name):
    """The daemon that took all of the above still moves data."""
    device, a, b = dev
    alive_and_serving(device, a, b)
    view = core.LabView(module_lab_name)
    x, y = End(a.ctx, 65536), End(b.ctx, 65536)
    connect(x, y, ip_of(view, "h1"), ip_of(view, "h2"))
    x.mr.write(b"after the fuzz")
    x.qp.post_send(SendWR(IBV_WR_RDMA_WRITE, wr_id=1, sg_list=[x.mr.sge(0, 14)],
                          remote_addr=y.mr.addr, rkey=y.mr.rkey))
    assert x.cq.wait(1)[0].status == IBV_WC_SUCCESS and y.mr.read(14) == b"after the fuzz"


@pytest.mark.parametrize("wr_id", [-1, 2**64, 2**70])
def test_out_of_range_wr_ids_on_valid_work_requests(dev, module_lab_name, wr_id):
    """Valid SGEs and keys, a wr_id no 64-bit field can hold: a READ (whose slot the daemon
    writes into a BPF map when it is sent), a receive: refused, nothing posted."""
    device, a, b = dev
    view = core.LabView(module_lab_name)
    x, y = End(a.ctx, 65536), End(b.ctx, 65536)
    connect(x, y, ip_of(view, "h1"), ip_of(view, "h2"))
    sge = x.mr.sge(0, 64)
    for post in (lambda: x.qp.post_recv(RecvWR(wr_id=wr_id, sg_list=[sge])),
                 lambda: x.qp.post_send(SendWR(IBV_WR_RDMA_READ, wr_id=wr_id, sg_list=[sge],
                                               remote_addr=y.mr.addr, rkey=y.mr.rkey))):
        with pytest.raises(MetaroceError, match="wr_id must fit 64 bits"):
            post()
        assert x.cq.poll(8) == []
        alive_and_serving(device, a, b)
    assert x.qp.query()["state"] == "RTS"
