"""Fuzzing the control socket (issue 9, parts 1 and 5): bad requests to a running daemon —
bytes that are not JSON, JSON that is not an object, deep nesting, every op with fields of the
wrong type or range — each get an error reply with their id (or none when they have no id),
and the daemon keeps serving. Work requests of any shape given to the verbs library get one
clear error or are posted, never a traceback (what an application writes into its rings
directly: tests/integration/test_hostile_app.py)."""

import json
import os
import socket

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from verbs_util import End, connect, daemons, ip_of, lab_pair

from metaroce.lab import core
from metaroce.nic import daemon as d
from metaroce.errors import MetaroceError
from metaroce.verbs import (IBV_WC_SUCCESS, IBV_WR_RDMA_READ, IBV_WR_RDMA_WRITE, Context, RecvWR,
                            SendWR)

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
OPCODES = st.sampled_from(["RDMA_WRITE", "RDMA_WRITE_WITH_IMM", "SEND", "SEND_WITH_IMM",
                           "RDMA_READ", "ATOMIC_CMP_AND_SWP", "ATOMIC_FETCH_AND_ADD", "X"])


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


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(wrs=st.lists(st.fixed_dictionaries({"opcode": st.one_of(OPCODES, VALUES)},
                                          optional={k: VALUES for k in WR_KEYS[1:]}),
                    max_size=3),
       recv=st.booleans())
def test_random_work_requests_on_a_live_qp(dev, wrs, recv):
    """Work requests with fields of any type and range, given to the library on the
    application's own QP: a MetaroceError (one clear message) or a post, nothing else; the
    daemon lives."""
    device, a, b = dev
    if a.qp.query()["state"] != "RTS":
        return
    fields = [{k.replace("inline", "inline_data"): v for k, v in w.items()} for w in wrs]
    try:
        if recv:
            a.qp.post_recv([RecvWR(wr_id=f.get("wr_id", 0), sg_list=f.get("sg_list", []))
                            for f in fields])
        else:
            a.qp.post_send([SendWR(**f) for f in fields])
    except MetaroceError as exc:
        assert "went away" not in str(exc) and "in time" not in str(exc), exc
    a.cq.poll(64)
    assert d.running_pid(device) is not None


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
    writes into a BPF map when it is sent), a receive, a WRITE."""
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
