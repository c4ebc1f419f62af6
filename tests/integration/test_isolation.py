"""Isolation and hardening (issue 9, part 3) on a three-host star lab:

- rkeys, MR addresses, QP numbers and initial PSNs are unpredictable: drawn from `secrets`
  (metaroce/nic/rx.py `RxPath.reg_mr`, metaroce/nic/device.py `Qp.__init__` and
  `Device.create_qp`); hundreds of registrations show no repeat, balanced bits and no serial
  correlation;
- an MR is reachable only through a QP of its own PD and only with the access it was registered
  with (remote WRITE to a read-only MR, READ of a write-only MR, an atomic without atomic access,
  a range past the end, a QP of another PD, a deregistered key: REM_ACCESS_ERR and not one byte
  changed), and locally only through its own PD;
- a QP accepts packets only from its connected peer: a valid, correctly sequenced WRITE sent
  from h3 to h2's QP is dropped as wrong_source (the same frame from the peer's address is
  placed, so nothing else was wrong with it);
- the control socket refuses users who are neither root nor in its group;
- an application cannot read or write another application's memory, nor touch its QPs,
  through the API (including the raw `set_qp` request).
"""

import os
import socket
import subprocess
import sys
import time

import pytest
from verbs_util import ALL_ACCESS, End, connect, daemons, ip_of

from metaroce.errors import MetaroceError
from metaroce.fuzz.frames import assemble, fix_icrc, inet_checksum
from metaroce.lab import core
from metaroce.lab.netdev import in_netns
from metaroce.nic import daemon as d
from metaroce.verbs import (CQ, MR, PD, QP, IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_REMOTE_ATOMIC,
                            IBV_ACCESS_REMOTE_READ, IBV_ACCESS_REMOTE_WRITE,
                            IBV_WC_REM_ACCESS_ERR, IBV_WC_SUCCESS, IBV_WR_ATOMIC_FETCH_AND_ADD,
                            IBV_WR_RDMA_READ, IBV_WR_RDMA_WRITE, IBV_WR_SEND, Context, QPInitAttr,
                            RecvWR, SendWR)
from metaroce.wire import consts as C
from metaroce.wire.headers import RETH

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, HERE])}


@pytest.fixture(scope="module")
def star(module_lab_name):
    core.up(module_lab_name, "star", hosts=3)
    view = core.LabView(module_lab_name)
    try:
        with daemons(view, hosts=("h1", "h2")):
            ctxs = {h: Context("eth0", view.plan.node(h).netns) for h in ("h1", "h2")}
            yield view, ctxs
            for c in ctxs.values():
                c.close()
    finally:
        core.down(module_lab_name)


def counters(view, host):
    return d.request(d.DeviceId("eth0", view.plan.node(host).netns), {"op": "status"})[0]["counters"]


# ---- unpredictable keys --------------------------------------------------------------------

def bit_balance_ok(values, bits):
    """Every bit set in about half of the values (within 5 standard deviations)."""
    n = len(values)
    sd = (n / 4) ** 0.5
    return all(abs(sum(v >> b & 1 for v in values) - n / 2) < 5 * sd for b in range(bits))


def serial_corr(values):
    x, y = values[:-1], values[1:]
    mx, my = sum(x) / len(x), sum(y) / len(y)
    cov = sum((a - mx) * (b - my) for a, b in zip(x, y))
    vx = sum((a - mx) ** 2 for a in x) ** 0.5
    vy = sum((b - my) ** 2 for b in y) ** 0.5
    return cov / (vx * vy)


def test_rkeys_addresses_qpns_and_psns_are_unpredictable(star):
    view, ctxs = star
    n = 200
    pd = PD(ctxs["h2"])
    mrs = [MR(pd, 4096, IBV_ACCESS_LOCAL_WRITE) for _ in range(n)]
    other = [MR(PD(ctxs["h1"]), 4096, IBV_ACCESS_LOCAL_WRITE) for _ in range(30)]
    cq = CQ(ctxs["h2"])
    qps = [QP(pd, QPInitAttr(cq, cq)) for _ in range(n)]
    try:
        rkeys = [m.rkey for m in mrs]
        addrs = [m.addr >> 12 for m in mrs]              # page aligned by design
        psns = [q.psn for q in qps]
        qpns = [q.qp_num for q in qps]
        for vals, bits in ((rkeys, 32), (addrs, 35), (psns, 24), (qpns, 24)):
            assert len(set(vals)) == n                    # no repeat
            assert len({(b - a) % (1 << bits) for a, b in zip(vals, vals[1:])}) > n // 2  # no stride
            assert bit_balance_ok(vals, bits)
            assert abs(serial_corr(vals)) < 0.3           # ~4 sd for n = 200
        assert all(m.lkey == m.rkey for m in mrs)
        assert not {m.rkey for m in other} & set(rkeys)   # another device draws its own
    finally:
        for q in qps:
            q.close()
        for m in mrs + other:
            m.close()


# ---- memory protection across the wire -----------------------------------------------------

RO = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ
WO = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE


def fresh_pair(view, ctxs, access=ALL_ACCESS, mr_bytes=65536):
    a, b = End(ctxs["h1"], mr_bytes), End(ctxs["h2"], mr_bytes, access)
    connect(a, b, ip_of(view, "h1"), ip_of(view, "h2"))
    return a, b


def one(cq):
    return cq.wait(1, timeout_s=10)[0]


def test_remote_access_is_limited_to_the_registered_access(star):
    view, ctxs = star
    pattern = bytes(range(256)) * 256
    cases = [("write to a read-only MR", RO, IBV_WR_RDMA_WRITE, 0, 4096),
             ("read of a write-only MR", WO, IBV_WR_RDMA_READ, 0, 4096),
             ("atomic without atomic access", RO | IBV_ACCESS_REMOTE_WRITE,
              IBV_WR_ATOMIC_FETCH_AND_ADD, 64, 8),
             ("write past the end", ALL_ACCESS, IBV_WR_RDMA_WRITE, 65536 - 100, 4096),
             ("read before the start", ALL_ACCESS, IBV_WR_RDMA_READ, -8, 64)]
    before = counters(view, "h2")
    for what, access, op, off, length in cases:
        a, b = fresh_pair(view, ctxs, access)
        b.mr.write(pattern)
        a.mr.write(b"\xEE" * 65536)
        a.qp.post_send(SendWR(op, wr_id=1, sg_list=[a.mr.sge(0, length)],
                              remote_addr=b.mr.addr + off, rkey=b.mr.rkey, compare_add=1))
        wc = one(a.cq)
        assert wc.status == IBV_WC_REM_ACCESS_ERR, (what, wc)
        assert b.mr.read(65536) == pattern, what                   # not one byte changed
        assert a.mr.read(65536) == b"\xEE" * 65536, what           # nothing came back
        deadline = time.monotonic() + 2
        while b.qp.query()["state"] != "ERR" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert b.qp.query()["state"] == "ERR", (what, b.qp.query())
        # the same request within the registered access works (the case was only the access)
        a2, b2 = fresh_pair(view, ctxs, ALL_ACCESS)
        a2.qp.post_send(SendWR(op, wr_id=2, sg_list=[a2.mr.sge(0, length)],
                               remote_addr=b2.mr.addr + max(0, min(off, 65536 - length)),
                               rkey=b2.mr.rkey, compare_add=1))
        assert one(a2.cq).status == IBV_WC_SUCCESS, what
    after = counters(view, "h2")
    assert after["mr_access"] - before["mr_access"] >= 3
    assert after["mr_bounds"] - before["mr_bounds"] >= 2


def test_an_mr_is_reachable_only_through_a_qp_of_its_own_pd(star):
    view, ctxs = star
    c2 = ctxs["h2"]
    a, b = fresh_pair(view, ctxs)             # b: PD 1 with its MR and QP
    pd2 = PD(c2)
    foreign = MR(pd2, 65536, ALL_ACCESS)      # same application, another PD
    foreign.write(b"\x11" * 65536)
    before = counters(view, "h2")["bad_rkey"] + counters(view, "h2")["mr_access"]
    a.qp.post_send(SendWR(IBV_WR_RDMA_WRITE, wr_id=1, sg_list=[a.mr.sge(0, 1024)],
                          remote_addr=foreign.addr, rkey=foreign.rkey))
    assert one(a.cq).status == IBV_WC_REM_ACCESS_ERR
    assert foreign.read(65536) == b"\x11" * 65536
    assert counters(view, "h2")["bad_rkey"] + counters(view, "h2")["mr_access"] > before
    # locally: b's QP cannot gather from, scatter to or receive into the other PD's MR
    b2 = End(c2, 65536)
    a2 = End(ctxs["h1"], 65536)
    connect(a2, b2, ip_of(view, "h1"), ip_of(view, "h2"))
    for wr in (SendWR(IBV_WR_SEND, sg_list=[foreign.sge(0, 8)]),
               SendWR(IBV_WR_RDMA_READ, sg_list=[foreign.sge(0, 8)], remote_addr=a2.mr.addr,
                      rkey=a2.mr.rkey)):
        with pytest.raises(MetaroceError, match="not a region of this QP's PD"):
            b2.qp.post_send(wr)
    with pytest.raises(MetaroceError, match="not a region of this QP's PD"):
        b2.qp.post_recv(RecvWR(sg_list=[foreign.sge(0, 8)]))
    # a deregistered key is dead at once
    key, addr = b2.mr.rkey, b2.mr.addr
    b2.mr.close()
    a2.qp.post_send(SendWR(IBV_WR_RDMA_WRITE, wr_id=3, sg_list=[a2.mr.sge(0, 64)],
                           remote_addr=addr, rkey=key))
    assert one(a2.cq).status == IBV_WC_REM_ACCESS_ERR


# ---- packets only from the connected peer --------------------------------------------------

def _mac_bytes(mac: str) -> bytes:
    return bytes.fromhex(mac.replace(":", ""))


def test_a_qp_accepts_packets_only_from_its_peer(star):
    """A WRITE_ONLY with the right QPN, PSN, rkey and ICRC, sent from h3 (its own MAC and
    address) to h2's QP, is dropped as wrong_source; the same frame built with h1's addresses
    and sent from h1 (what the peer would send) is placed."""
    view, ctxs = star
    a, b = fresh_pair(view, ctxs)
    h1, h2, h3 = (view.plan.node(h) for h in ("h1", "h2", "h3"))
    payload = b"crafted by h3!!!" * 4

    def frame(src_node):
        f = assemble(False, C.Opcode.RC_RDMA_WRITE_ONLY, b.qp.qp_num, a.qp.psn,
                     RETH(b.mr.addr + 512, b.mr.rkey, len(payload)).pack(), payload, ackreq=1,
                     icrc=False)
        src = src_node.iface("eth0")
        f[0:6] = _mac_bytes(h2.iface("eth0").mac)
        f[6:12] = _mac_bytes(src.mac)
        ip = bytearray(f[14:34])
        ip[12:16] = socket.inet_aton(ip_of(view, src_node.name))
        ip[16:20] = socket.inet_aton(ip_of(view, "h2"))
        ip[10:12] = b"\0\0"
        ip[10:12] = inet_checksum(ip).to_bytes(2, "big")
        f[14:34] = ip
        fix_icrc(f)
        return bytes(f)

    with in_netns(h3.netns):
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    with in_netns(h1.netns):
        s1 = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    try:
        s.bind(("eth0", 0))
        s1.bind(("eth0", 0))
        before = counters(view, "h2")
        for _ in range(3):
            s.send(frame(h3))
        deadline = time.monotonic() + 5
        while counters(view, "h2")["wrong_source"] - before["wrong_source"] < 3:
            assert time.monotonic() < deadline, "the crafted packets never arrived"
            time.sleep(0.05)
        after = counters(view, "h2")
        assert after["placed"] == before["placed"]
        assert b.mr.read(65536) == bytes(65536)
        assert b.qp.query()["state"] == "RTS"
        s1.send(frame(h1))                         # control: the same frame from the peer
        deadline = time.monotonic() + 5
        while b.mr.read(len(payload), 512) != payload:
            assert time.monotonic() < deadline, "the control frame was not placed"
            time.sleep(0.05)
        assert counters(view, "h2")["placed"] == after["placed"] + 1
    finally:
        s.close()
        s1.close()


# ---- the control socket and the API --------------------------------------------------------

PROBE = """
import sys
from metaroce.verbs import Context
try:
    c = Context("eth0", sys.argv[1])
    print("limits", sorted(c.query_device()["limits"])[:1])
except Exception as exc:
    print("refused:", exc)
    sys.exit(3)
"""


def run_as(uid, gid, netns):
    cmd = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", sys.executable,
           "-c", PROBE, netns]
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=60)


def test_the_control_socket_refuses_unauthorised_users(star):
    view, _ = star
    ns = view.plan.node("h2").netns
    st = os.stat(d.DeviceId("eth0", ns).sock_path)
    assert st.st_mode & 0o777 == 0o660 and st.st_uid == 0
    p = run_as(65534, 65534, ns)                   # nobody
    assert p.returncode == 3 and "not allowed to use the device" in p.stdout, (p.stdout, p.stderr)
    p = run_as(65534, st.st_gid, ns)               # nobody, but in the socket's group: allowed
    assert p.returncode == 0 and p.stdout.startswith("limits"), (p.stdout, p.stderr)


def test_an_application_cannot_touch_another_applications_memory_or_qps(star):
    view, ctxs = star
    a, b = fresh_pair(view, ctxs)
    a.mr.write(b"secret of app A" * 100)
    ns1 = view.plan.node("h1").netns
    with Context("eth0", ns1) as evil:
        e = End(evil, 65536)
        peer = End(ctxs["h2"], 65536)
        connect(e, peer, ip_of(view, "h1"), ip_of(view, "h2"))
        stolen = [a.mr.addr, 1500, a.mr.lkey]
        attempts = [
            lambda: e.qp.post_send(SendWR(IBV_WR_RDMA_WRITE, sg_list=[stolen],   # read A's memory
                                          remote_addr=peer.mr.addr, rkey=peer.mr.rkey)),
            lambda: e.qp.post_send(SendWR(IBV_WR_SEND, sg_list=[stolen])),
            lambda: e.qp.post_send(SendWR(IBV_WR_RDMA_READ, sg_list=[stolen],    # write it
                                          remote_addr=peer.mr.addr, rkey=peer.mr.rkey)),
            lambda: e.qp.post_recv(RecvWR(sg_list=[stolen])),
            lambda: evil.request("dereg_mr", key=a.mr.lkey),
            lambda: evil.request("destroy_cq", cq=a.cq.handle),
            lambda: evil.request("destroy_qp", qpn=a.qp.qp_num),
            lambda: evil.request("query_qp", qpn=a.qp.qp_num),
            lambda: evil.request("connect_qp", qpn=a.qp.qp_num, remote={}),
            lambda: evil.request("reg_mr", pd=a.pd.handle, length=4096, access=1),
            lambda: evil.request("create_qp", pd=a.pd.handle, send_cq=e.cq.handle,
                                 recv_cq=e.cq.handle),
            # the raw receive-state request must not rewrite another application's QP
            lambda: evil.request("set_qp", qpn=a.qp.qp_num, epsn=0, pd=e.pd.handle),
            lambda: evil.request("set_qp", qpn=a.qp.qp_num + (1 << 32), epsn=0, pd=e.pd.handle),
            lambda: evil.request("set_qp", qpn=0x777777, epsn=0, pd=a.pd.handle),
        ]
        for i, attempt in enumerate(attempts):
            with pytest.raises(MetaroceError):
                attempt()
                pytest.fail(f"attempt {i} was allowed")
        assert e.cq.poll(10) == [] and peer.cq.poll(10) == []
        assert peer.mr.read(1500) == bytes(1500)
    # A is untouched and still works
    assert a.qp.query()["state"] == "RTS"
    a.qp.post_send(SendWR(IBV_WR_RDMA_WRITE, wr_id=1, sg_list=[a.mr.sge(0, 1500)],
                          remote_addr=b.mr.addr, rkey=b.mr.rkey))
    assert one(a.cq).status == IBV_WC_SUCCESS
    assert b.mr.read(1500) == (b"secret of app A" * 100)[:1500]
