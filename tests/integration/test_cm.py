"""metaroce.cm over a real lab pair: CONNECT_REQ / REP / READY on a TCP side channel (CM-2),
the target allocating its QP on the request (CM-4), mode negotiation (CM-5, CM-6: MetaRoCE when
both devices offer it, RoCEv2 otherwise, a mandatory request failing cleanly), private data,
data moving over the connected QPs, DISCONNECT flushing the peer (CM-9), and clear errors for
refused, unreachable and incompatible peers."""

import os
import threading

import pytest
from verbs_util import ip_of, lab_pair

from metaroce import cm
from metaroce.nic import daemon as d
from metaroce.verbs import (CQ, MR, PD, IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_REMOTE_READ,
                            IBV_ACCESS_REMOTE_WRITE, IBV_WC_SUCCESS, IBV_WC_WR_FLUSH_ERR,
                            IBV_WR_RDMA_WRITE, Context, RecvWR, SendWR)

ACCESS = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ


@pytest.fixture(scope="module")
def lab(module_lab_name):
    from metaroce.lab import core
    view = lab_pair(module_lab_name)
    try:
        yield view
    finally:
        core.down(module_lab_name)


class Side:
    def __init__(self, view, host, mode, integrity="icrc", credits=None):
        self.dev = d.DeviceId("eth0", view.plan.node(host).netns)
        d.start_background(self.dev, mode, integrity=integrity, credits=credits)
        self.ctx = Context("eth0", self.dev.netns)
        self.pd = PD(self.ctx)
        self.mr = MR(self.pd, 1 << 20, ACCESS)
        self.cq = CQ(self.ctx)

    def close(self):
        self.ctx.close()
        d.stop(self.dev)


@pytest.fixture(scope="module")
def sides(lab):
    """Both devices offer MetaRoCE; a test may restart one with another mode."""
    a, b = Side(lab, "h1", "metaroce"), Side(lab, "h2", "metaroce")
    yield lab, a, b
    a.close()
    b.close()


def serve(b, out, port, version=None, **kw):
    try:
        with cm.listen(b.ctx, port, **({} if version is None else {"version": version})) as lis:
            out["conn"] = lis.accept(pd=b.pd, send_cq=b.cq, timeout_s=10,
                                     private_data=b"srv:" + b.mr.rkey.to_bytes(4, "big"), **kw)
    except Exception as exc:  # noqa: BLE001 (handed to the test)
        out["error"] = exc


def connect_pair(view, a, b, port, v6=False, version=None, **kw):
    out = {}
    t = threading.Thread(target=serve, args=(b, out, port, version))
    t.start()
    try:
        for _ in range(50):                      # until the listener is bound
            try:
                conn = cm.connect(a.ctx, ip_of(view, "h2", v6), port, pd=a.pd, send_cq=a.cq,
                                  private_data=b"hello", **kw)
                break
            except cm.CmError as exc:
                if "refused" not in str(exc):
                    raise
                import time
                time.sleep(0.05)
    finally:
        t.join(15)
    return conn, out


def write_and_check(a, b, conn, n):
    """n random bytes WRITTEN from a's region into b's (the rkey the server sent as private
    data): completed and verified."""
    rkey = int.from_bytes(conn.private_data[4:8], "big")
    data = os.urandom(n)
    a.mr.write(data)
    conn.qp.post_send(SendWR(IBV_WR_RDMA_WRITE, wr_id=1, sg_list=[a.mr.sge(0, len(data))],
                             remote_addr=b.mr.addr, rkey=rkey))
    assert a.cq.wait(1)[0].status == IBV_WC_SUCCESS
    assert b.mr.read(len(data)) == data


@pytest.mark.parametrize("v6", [False, True], ids=["ipv4", "ipv6"])
def test_connect_negotiates_metaroce_and_moves_data(sides, v6):
    view, a, b = sides
    ca, out = connect_pair(view, a, b, 18600 + v6, v6=v6)
    cb = out["conn"]
    assert ca.mode == cb.mode == "metaroce" and ca.caps == cb.caps == 3 | 4   # + MULTIPATH
    assert ca.qp.query()["paths"] == cb.qp.query()["paths"] == 4            # MP-1 default
    assert ca.private_data[:4] == b"srv:" and cb.private_data == b"hello"
    assert ca.remote["qpn"] == cb.qp.qp_num and cb.remote["qpn"] == ca.qp.qp_num
    assert ca.qp.query()["mode"] == cb.qp.query()["mode"] == "metaroce"
    # CM-14: both ends offered a fitted path MTU; at link MTU 1500 that is 1408 bytes over
    # IPv4 and 1344 over IPv6 (20 bytes more of IP header), where the IB enum would give 1024
    fit = 1344 if v6 else 1408
    assert ca.remote["mtu"] == cb.remote["mtu"] == fit
    assert ca.qp.query()["remote"]["mtu"] == cb.qp.query()["remote"]["mtu"] == fit
    sent = ca.qp.query()["sent_packets"]
    write_and_check(a, b, ca, 300000)
    assert ca.qp.query()["sent_packets"] - sent == -(-300000 // fit)   # 214 / 224, not 293
    # CM-9: DISCONNECT moves the peer's QP to ERR: its posted receive is flushed
    cb.qp.post_recv(RecvWR(wr_id=77, sg_list=[b.mr.sge(0, 64)]))
    t = threading.Thread(target=cb.wait_disconnect, args=(5,))
    t.start()
    ca.close()
    t.join(10)
    assert cb.closed
    wc = b.cq.wait(1)[0]
    assert (wc.wr_id, wc.status) == (77, IBV_WC_WR_FLUSH_ERR)


def test_csum_is_negotiated_only_when_both_devices_take_it(sides):
    """INT-1: with both devices started --integrity csum the connection checks the IPv4/UDP
    checksums (both QPs say so, data moves and both kernels counted csum-checked packets);
    with one of them at the default (the ICRC) it is the ICRC."""
    view, a, b = sides
    try:
        for side, host in ((a, "h1"), (b, "h2")):
            side.close()
            side.__init__(view, host, "metaroce", "csum")
        ca, out = connect_pair(view, a, b, 18620)
        cb = out["conn"]
        assert ca.integrity == cb.integrity == "csum" and ca.caps & 0x40 and cb.caps & 0x40
        assert ca.qp.query()["integrity"] == cb.qp.query()["integrity"] == "csum"
        write_and_check(a, b, ca, 200000)
        for side in (a, b):                  # data one way, SACKs the other: both checked
            port = side.ctx.status()["port"]
            assert port["rcv_csum_checked"] > 0, port
        ca.close()
        cb.close()
        a.close()
        a.__init__(view, "h1", "metaroce")       # h1 back to the ICRC only
        ca, out = connect_pair(view, a, b, 18621)
        assert ca.integrity == out["conn"].integrity == "icrc" and not ca.caps & 0x40
        assert ca.qp.query()["integrity"] == "icrc"
        ca.close()
        out["conn"].close()
    finally:
        b.close()
        b.__init__(view, "h2", "metaroce")


def test_credit_is_negotiated_only_when_both_devices_grant(sides):
    """CM-5 and CC-8: with both devices started --credits the connection takes CREDIT and both
    QPs start in credit mode (a limit PSN of their own, initial_credit past their start) and
    still move data; with one of them without credits, neither does."""
    from metaroce.nic.credit import CreditConfig
    view, a, b = sides
    try:
        for side, host in ((a, "h1"), (b, "h2")):
            side.close()
            side.__init__(view, host, "metaroce", credits=CreditConfig())
        assert a.ctx.query_device()["credits"] and b.ctx.query_device()["credits"]
        ca, out = connect_pair(view, a, b, 18630)
        cb = out["conn"]
        assert ca.caps & 0x08 and cb.caps & 0x08, (ca.caps, cb.caps)
        for conn in (ca, cb):
            q = conn.qp.query()
            assert q["credit_limit_psn"] is not None, q
        write_and_check(a, b, ca, 300000)        # grants let the whole message through
        ca.close()
        cb.close()
        a.close()
        a.__init__(view, "h1", "metaroce")       # h1 grants no credits
        assert not a.ctx.query_device()["credits"]
        ca, out = connect_pair(view, a, b, 18631)
        assert not ca.caps & 0x08 and not out["conn"].caps & 0x08
        assert ca.qp.query()["credit_limit_psn"] is None
        assert out["conn"].qp.query()["credit_limit_psn"] is None
        write_and_check(a, b, ca, 100000)
        ca.close()
        out["conn"].close()
    finally:
        b.close()
        b.__init__(view, "h2", "metaroce")


def test_a_compat_target_yields_roce_and_mandatory_fails(sides):
    view, a, b = sides
    b.close()
    b.__init__(view, "h2", "roce")              # h2's device now offers RoCEv2 only
    ca, out = connect_pair(view, a, b, 18610)
    assert ca.mode == out["conn"].mode == "roce" and ca.caps == 0
    assert ca.qp.query()["mode"] == "roce"
    assert ca.remote["mtu"] == out["conn"].remote["mtu"] == 1024    # compat: the IB enum
    ca.close()
    out["conn"].close()
    with pytest.raises(cm.CmError, match="incompatible"):
        connect_pair(view, a, b, 18611, mandatory=True)


def test_refused_unreachable_and_bad_arguments(sides):
    view, a, b = sides
    with pytest.raises(cm.CmError, match="refused"):
        cm.connect(a.ctx, ip_of(view, "h2"), 18620, pd=a.pd, send_cq=a.cq, timeout_s=2)
    with pytest.raises(cm.CmError, match="unreachable"):
        cm.connect(a.ctx, "10.0.0.77", 18620, pd=a.pd, send_cq=a.cq, timeout_s=1)
    with pytest.raises(cm.CmError, match="not an IP address"):
        cm.connect(a.ctx, "h2", 18620, pd=a.pd, send_cq=a.cq)
    assert a.ctx.status()["qps"] == []             # nothing left behind by the failures


def _raw_exchange(a, view, port, payload):
    """A client that is not metaroce.cm: send raw bytes to the listener, read its answer until
    it closes the connection."""
    import socket
    import time
    from metaroce.cm.channel import tcp_socket
    for _ in range(50):
        s = tcp_socket(a.dev.netns, socket.AF_INET)
        s.settimeout(5)
        try:
            s.connect((ip_of(view, "h2"), port))
            break
        except ConnectionRefusedError:
            s.close()
            time.sleep(0.05)
    s.sendall(payload)
    got = b""
    while True:
        chunk = s.recv(4096)
        if not chunk:
            break
        got += chunk
    s.close()
    return got


def test_cm_port_magic_and_version(sides):
    """VER-5: the listener's default port is 4791. VER-4: bytes without the CMETH magic are not
    answered. VER-2: a CONNECT_REQ of another version gets REJECT BAD_VERSION, written in
    version 2."""
    from metaroce.wire import consts as C
    from metaroce.wire.headers import CMETH
    view, a, b = sides
    with cm.listen(b.ctx) as lis:
        assert lis.port == cm.DEFAULT_PORT == 4791
    req = CMETH(cm_type=C.CmType.CONNECT_REQ, txn_id=0x5EED, qpn=0x11, start_psn=1, mtu=3,
                caps=3, window_pkts=128).pack()
    for payload, expect in ((bytes(C.CMETH_LEN + 2), "magic"),
                            (req[:5] + bytes([4]) + req[6:] + b"\0\0", "BAD_VERSION")):
        out = {}
        t = threading.Thread(target=serve, args=(b, out, 18630))
        t.start()
        got = _raw_exchange(a, view, 18630, payload)
        t.join(15)
        assert isinstance(out.get("error"), cm.CmError)
        if expect == "magic":
            assert got == b"" and "magic" in str(out["error"])
        else:
            rej = CMETH.parse(got[:C.CMETH_LEN])
            assert (rej.cm_type, rej.reject_reason, rej.txn_id, rej.version) == \
                (C.CmType.REJECT, C.CmReject.BAD_VERSION, 0x5EED, 3)
    assert b.ctx.status()["qps"] == []


def test_fitted_mtu_needs_both_offers_and_a_valid_size(sides):
    """CM-14 from the target's side, with raw CONNECT_REQs from an IPv4 address: an offer of 21
    x 64 bytes gets an answer that offers the target's own (22 at link MTU 1500 over IPv4) and
    a QP at 1344, the smaller; an offer of 128 a QP at the target's 1408; a MetaRoCE
    request without an offer (mtu64 0) gets none back and the IB enum's 1024; an offer outside
    256 .. 8192 bytes is refused INVALID_PARAMS (CM-10)."""
    from metaroce.wire import consts as C
    from metaroce.wire.headers import CMETH
    view, a, b = sides
    b.close()
    b.__init__(view, "h2", "metaroce")        # an earlier test may have left it in roce mode
    for k, (mtu64, want) in enumerate(((21, 1344), (0, 1024), (128, 1408), (3, None),
                                       (129, None))):
        req = CMETH(cm_type=C.CmType.CONNECT_REQ, txn_id=0x600 + k, qpn=0x11, start_psn=1,
                    mtu=5, caps=3, window_pkts=128, mtu64=mtu64,
                    gid=bytes(10) + b"\xff\xff" + bytes([10, 0, 0, 1])).pack() + b"\0\0"
        out = {}
        t = threading.Thread(target=serve, args=(b, out, 18640 + k))
        t.start()
        got = _raw_exchange(a, view, 18640 + k, req)
        t.join(15)
        rep = CMETH.parse(got[:C.CMETH_LEN])
        if want is None:
            assert (rep.cm_type, rep.reject_reason) == (C.CmType.REJECT,
                                                        C.CmReject.INVALID_PARAMS), rep
            continue
        assert rep.cm_type == C.CmType.CONNECT_REP and rep.caps & 3 == 3, rep
        assert rep.mtu64 == (22 if mtu64 else 0) and rep.mtu == 3, rep
        assert "no READY" in str(out.get("error")), out      # the raw client never confirms
    assert b.ctx.status()["qps"] == []


def test_a_version_2_target_gets_a_retry_in_version_2(sides):
    """VER-2: the initiator asks in version 3; a target that implements version 2 only answers
    REJECT BAD_VERSION in version 2, and the initiator retries once in version 2 with a new
    transaction: the connection is MetaRoCE all the same, at the IB enum's MTU (a version-2 block
    has no fitted MTU offer, CM-14), and moves data."""
    view, a, b = sides
    b.close()
    b.__init__(view, "h2", "metaroce")
    listening = {}

    def serve_twice():              # the rejected attempt, then the retry, on one listener
        try:
            with cm.listen(b.ctx, 18650, version=2) as lis:
                try:
                    lis.accept(pd=b.pd, send_cq=b.cq, timeout_s=10)
                except cm.CmError as exc:
                    listening["first"] = str(exc)
                listening["conn"] = lis.accept(pd=b.pd, send_cq=b.cq, timeout_s=10,
                                               private_data=b"srv:" + b.mr.rkey.to_bytes(4, "big"))
        except Exception as exc:  # noqa: BLE001 (handed to the test)
            listening["error"] = exc
    t = threading.Thread(target=serve_twice)
    t.start()
    import time
    for _ in range(50):
        try:
            ca = cm.connect(a.ctx, ip_of(view, "h2"), 18650, pd=a.pd, send_cq=a.cq)
            break
        except cm.CmError as exc:
            if "refused" not in str(exc):
                raise
            time.sleep(0.05)
    t.join(15)
    cb = listening["conn"]
    assert "version 3" in listening["first"], listening
    assert ca.version == cb.version == 2 and ca.txn_id == cb.txn_id
    assert ca.mode == cb.mode == "metaroce"
    assert ca.remote["mtu"] == cb.remote["mtu"] == 1024
    write_and_check(a, b, ca, 100000)
    ca.close()
    cb.close()
