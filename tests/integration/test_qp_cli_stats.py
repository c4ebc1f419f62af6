"""`metaroce qp create/connect/show/list/destroy` (endpoints a RoCEv2 peer described by a file
can be connected to) and `metaroce stats` (rdma-core counter names), run as a user would: a
verbs application on h1 WRITEs into and READs back from an endpoint the CLI made on h2."""

import json
import os
import re
import subprocess
import sys

import pytest
from verbs_util import End, connect, daemons, ip_of, lab_pair

from metaroce.verbs import IBV_WC_SUCCESS, IBV_WR_RDMA_READ, IBV_WR_RDMA_WRITE, Context, SendWR

METAROCE = [sys.executable, "-m", "metaroce.cli"]
MiB = 1 << 20


def cli(*args, check=True):
    env = {**os.environ,
           "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.dirname(__file__)))}
    p = subprocess.run(METAROCE + list(args), capture_output=True, text=True, env=env, timeout=60)
    if check:
        assert p.returncode == 0, p.stderr
    return p


@pytest.fixture(scope="module")
def pair(module_lab_name):
    from metaroce.lab import core
    view = lab_pair(module_lab_name)
    try:
        with daemons(view):
            yield view
    finally:
        core.down(module_lab_name)


def test_endpoint_from_cli_serves_a_verbs_peer(pair, tmp_path):
    view = pair
    ns1, ns2 = (view.plan.node(h).netns for h in ("h1", "h2"))
    ep = json.loads(cli("qp", "create", "--dev", "eth0", "--netns", ns2, "--mr-size",
                        str(2 * MiB), "--json").stdout)
    assert ep["ip"] == ip_of(view, "h2") and ep["length"] == 2 * MiB
    assert 0 < ep["qpn"] < 1 << 24 and 0 <= ep["psn"] < 1 << 24 and len(ep["mac"]) == 17
    assert ep["access"] == 15 and ep["mode"] == "roce"

    with Context("eth0", ns1) as c1:
        a = End(c1, 3 * MiB)
        a.qp.connect({"qpn": ep["qpn"], "psn": ep["psn"], "ip": ep["ip"], "mtu": ep["mtu"]})
        mine = tmp_path / "h1.json"          # what any RoCEv2 peer would hand over
        mine.write_text(json.dumps({"qpn": hex(a.qp.qp_num), "psn": a.qp.psn,
                                    "gid": ip_of(view, "h1"), "mtu": 1024}))
        # QP numbers in hex (as `qp list` prints them) or decimal, everywhere
        con = json.loads(cli("qp", "connect", hex(ep["qpn"]), "--dev", "eth0", "--netns", ns2,
                             "--remote", str(mine), "--json").stdout)
        assert con["state"] == "RTS" and con["mtu"] == 1024

        data = os.urandom(MiB + 333)
        a.mr.write(data)
        a.qp.post_send(SendWR(IBV_WR_RDMA_WRITE, wr_id=1, sg_list=[a.mr.sge(0, len(data))],
                              remote_addr=ep["addr"] + 4096, rkey=ep["rkey"]))
        a.qp.post_send(SendWR(IBV_WR_RDMA_READ, wr_id=2, sg_list=[a.mr.sge(MiB + 512, len(data) - 512)],
                              remote_addr=ep["addr"] + 4096 + 512, rkey=ep["rkey"]))
        wcs = a.cq.wait(2)
        assert [(w.wr_id, w.status) for w in wcs] == [(1, IBV_WC_SUCCESS), (2, IBV_WC_SUCCESS)]
        assert a.mr.read(len(data) - 512, MiB + 512) == data[512:]

        shown = json.loads(cli("qp", "show", hex(ep["qpn"]), "--dev", "eth0", "--netns", ns2,
                               "--json").stdout)
        assert shown["state"] == "RTS" and shown["remote"]["qpn"] == a.qp.qp_num
        assert shown["rx_packets"] >= (MiB + 333) // 1024 and shown["sent_packets"] > 0

        st = json.loads(cli("stats", "--dev", "eth0", "--netns", ns2, "--json").stdout)
        hw = st["hw_counters"]
        assert hw["rx_read_requests"] == 1 and hw["rx_packets"] >= shown["rx_packets"]
        assert hw["out_of_sequence"] == hw["duplicate_request"] == 0
        assert st["drops"]["bad_icrc"] == 0 and set(st["drops"]) >= {"bad_rkey", "mr_bounds"}
        assert [q["qpn"] for q in st["qps"]] == [ep["qpn"]]          # JSON keeps integers
        text = cli("stats", "--dev", "eth0", "--netns", ns2).stdout.splitlines()
        assert text[0].startswith("link eth0/1 rx_packets ") and "rp_cnp_handled" in text[0]
        assert text[1].startswith("link eth0/1 port_xmit_data ")
        qline = (f"lqpn 0x{ep['qpn']:06x} type RC state RTS mode roce integrity icrc "
             f"rqpn 0x{a.qp.qp_num:06x}")
        assert any(qline in line for line in text), text
        one = json.loads(cli("stats", "--dev", "eth0", "--netns", ns2, "--qp", hex(ep["qpn"]),
                             "--json").stdout)
        assert [q["qpn"] for q in one["qps"]] == [ep["qpn"]]
        human = cli("qp", "show", str(ep["qpn"]), "--dev", "eth0", "--netns", ns2).stdout
        assert re.search(rf"^qpn +0x{ep['qpn']:06x}$", human, re.M), human
        assert re.search(rf"^remote\.qpn +0x{a.qp.qp_num:06x}$", human, re.M), human
        assert "{" not in human                       # no Python dict in human output
        a.qp.close()

    listed = json.loads(cli("qp", "list", "--dev", "eth0", "--netns", ns2, "--json").stdout)
    assert [e["qpn"] for e in listed["endpoints"]] == [ep["qpn"]]
    text = cli("qp", "list", "--dev", "eth0", "--netns", ns2).stdout
    assert text.startswith(f"qpn 0x{ep['qpn']:06x} RTS ")
    cli("qp", "destroy", hex(ep["qpn"]), "--dev", "eth0", "--netns", ns2)
    listed = json.loads(cli("qp", "list", "--dev", "eth0", "--netns", ns2, "--json").stdout)
    assert listed["endpoints"] == []
    st = json.loads(cli("status", "--dev", "eth0", "--netns", ns2, "--json").stdout)
    assert st["mrs"] == 0 and st["qps"] == []


def test_bad_remote_files_are_one_clear_line(pair, tmp_path):
    ns2 = pair.plan.node("h2").netns
    ep = json.loads(cli("qp", "create", "--dev", "eth0", "--netns", ns2, "--json").stdout)
    cases = {"missing.json": None, "notjson.json": "{qpn: 1", "list.json": "[1, 2]",
             "noip.json": json.dumps({"qpn": 5, "psn": 1}),
             "bigqpn.json": json.dumps({"qpn": 1 << 24, "psn": 1, "ip": "10.0.0.1"}),
             "badmtu.json": json.dumps({"qpn": 5, "psn": 1, "ip": "10.0.0.1", "mtu": 1500})}
    for name, text in cases.items():
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        p = cli("qp", "connect", str(ep["qpn"]), "--dev", "eth0", "--netns", ns2, "--remote",
                str(path), "--json", check=False)
        assert p.returncode != 0 and "error" in json.loads(p.stdout), name
        p = cli("qp", "connect", str(ep["qpn"]), "--dev", "eth0", "--netns", ns2, "--remote",
                str(path), check=False)
        assert p.returncode != 0 and p.stderr.count("\n") == 1 and "Traceback" not in p.stderr
    p = cli("qp", "show", "123", "--dev", "eth0", "--netns", ns2, "--json", check=False)
    assert p.returncode == 1 and "no endpoint" in json.loads(p.stdout)["error"]
    p = cli("qp", "create", "--dev", "eth0", "--netns", ns2, "--access", "remote_fly", check=False)
    assert p.returncode == 2 and "remote_fly" in p.stderr
    p = cli("stats", "--dev", "eth0", "--netns", ns2, "--qp", "7", "--json", check=False)
    assert p.returncode == 1 and "no QP" in json.loads(p.stdout)["error"]
    cli("qp", "destroy", str(ep["qpn"]), "--dev", "eth0", "--netns", ns2)


def _counters(ns) -> dict:
    st = json.loads(cli("stats", "--dev", "eth0", "--netns", ns, "--json").stdout)
    return {**st["hw_counters"], **st["port_counters"]}


def test_port_counters_count_every_qp_and_never_go_backwards(pair):
    """`stats` showed zeros after a 5 GiB perf run: it summed only the QPs alive at the time
    (the `qp create` endpoints). Port and traffic counters are the device's: verbs
    applications' QPs count, and keep counting after those QPs are gone."""
    view = pair
    ns1, ns2 = (view.plan.node(h).netns for h in ("h1", "h2"))
    before1, before2 = _counters(ns1), _counters(ns2)
    size = 8 * MiB
    with Context("eth0", ns1) as c1, Context("eth0", ns2) as c2:
        a, b = End(c1, size), End(c2, size)
        connect(a, b, ip_of(view, "h1"), ip_of(view, "h2"))
        a.mr.write(os.urandom(size))
        a.qp.post_send(SendWR(IBV_WR_RDMA_WRITE, wr_id=1, sg_list=[a.mr.sge()],
                              remote_addr=b.mr.addr, rkey=b.mr.rkey))
        a.qp.post_send(SendWR(IBV_WR_RDMA_READ, wr_id=2, sg_list=[a.mr.sge(0, MiB)],
                              remote_addr=b.mr.addr, rkey=b.mr.rkey))
        assert [w.status for w in a.cq.wait(2)] == [IBV_WC_SUCCESS] * 2
        live1, live2 = _counters(ns1), _counters(ns2)
        st = json.loads(cli("stats", "--dev", "eth0", "--netns", ns2, "--json").stdout)
        assert b.qp.qp_num in [q["qpn"] for q in st["qps"]]
    # the applications are gone, their QPs with them
    after1, after2 = _counters(ns1), _counters(ns2)
    st = json.loads(cli("stats", "--dev", "eth0", "--netns", ns2, "--json").stdout)
    assert b.qp.qp_num not in [q["qpn"] for q in st["qps"]]
    for name in live2:
        assert after1[name] >= live1[name] and after2[name] >= live2[name], name

    def grew(after, before, name):
        return after[name] - before[name]
    # h2 received the 8 MiB WRITE and the READ request, answered the READ (1 MiB)
    assert grew(after2, before2, "rx_bytes") >= size
    assert grew(after2, before2, "port_rcv_data") * 4 >= size             # 4-octet words
    assert grew(after2, before2, "port_rcv_packets") >= size // 4096
    assert grew(after2, before2, "port_xmit_data") * 4 >= MiB
    assert grew(after2, before2, "tx_bytes") >= MiB
    # h1 sent the 8 MiB and received the READ responses and the ACKs
    assert grew(after1, before1, "tx_bytes") >= size
    assert grew(after1, before1, "port_xmit_data") * 4 >= size
    assert grew(after1, before1, "port_rcv_data") * 4 >= MiB
    assert after1["port_xmit_packets"] == after1["unicast_xmit_packets"] == after1["tx_packets"]
    assert after2["port_rcv_errors"] == before2["port_rcv_errors"] == 0
