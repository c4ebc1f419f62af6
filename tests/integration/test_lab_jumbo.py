"""A lab at MTU 9000 (issue 21): every link end runs its XDP program natively (frags-aware,
switch ports through pinned BPF links), 8,972-byte datagrams and `ping -s 8972 -M do` pass
between hosts through each fabric feature (counters, loss, duplication, reordering, rate and
ECN), and a NIC-side frags-aware program attaches natively on a host port by BPF link and
sends frames back through the switch with XDP_TX (which veth delivers only to a peer running
XDP natively)."""

import errno
import os
import socket
import subprocess

import pytest
from _deps import require_tool
from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from metaroce.kern import libbpf
from metaroce.kern.bcc_loader import load
from metaroce.lab import core, fabric
from metaroce.lab.impair import Impairment
from metaroce.lab.netdev import in_netns
from metaroce.lab.traffic import run_flow, udp_socket
from metaroce.nic import xdpslot
from metaroce.system import import_bcc

MTU = 9000
SIZE = MTU - 20 - 8                  # 8,972 bytes of UDP payload: the largest unfragmented
FRAME = SIZE + 8 + 20 + 14           # what XDP sees of one such datagram: 9,014 bytes


@pytest.fixture(scope="module")
def jumbo(module_lab_name):
    core.up(module_lab_name, "pair", mtu=MTU)
    return core.LabView(module_lab_name)


def _ip(view, host, family=socket.AF_INET):
    itf = view.plan.node(host).iface("eth0")
    return (itf.ipv4 if family == socket.AF_INET else itf.ipv6).split("/")[0]


def _link(view, name):
    return {l["name"]: l for l in view.status()["links"]}[name]["counters"]


def test_every_link_end_native_switch_ports_held_by_links(jumbo):
    assert jumbo.record["xdp_mode"] == "native" and jumbo.record["forwarding"] == "xdp"
    for n in jumbo.plan.nodes:
        for itf in n.ifaces:
            att = fabric.xdp_attached(n.netns, itf.name)
            assert att and att["mode"] == "native", (n.name, itf.name, att)
            if n.role == "host":
                continue
            assert os.path.exists(fabric.link_pin(jumbo.name, n.name, itf.name))
            with IPRoute(netns=n.netns) as ipr:       # netlink cannot take a link's program off
                with pytest.raises(NetlinkError) as exc:
                    ipr.link("set", index=ipr.link_lookup(ifname=itf.name)[0],
                             xdp={"attrs": [("IFLA_XDP_FD", -1),
                                            ("IFLA_XDP_FLAGS", libbpf.XDP_FLAGS_DRV_MODE)]})
                assert exc.value.code == errno.EBUSY
            assert fabric.xdp_attached(n.netns, itf.name) == att


@pytest.mark.parametrize("family", [socket.AF_INET, socket.AF_INET6])
def test_ping_largest_unfragmented(jumbo, family):
    require_tool("ping", "ping -M do through the lab")
    size = SIZE if family == socket.AF_INET else MTU - 40 - 8
    for a, b in (("h1", "h2"), ("h2", "h1")):
        p = subprocess.run(["ip", "netns", "exec", jumbo.plan.node(a).netns, "ping",
                            "-4" if family == socket.AF_INET else "-6", "-c", "3", "-i", "0.2",
                            "-W", "2", "-s", str(size), "-M", "do", _ip(jumbo, b, family)],
                           capture_output=True, text=True, timeout=30)
        assert p.returncode == 0 and " 0% packet loss" in p.stdout, p.stdout + p.stderr


@pytest.mark.parametrize("src,dst", [("h1", "h2"), ("h2", "h1")])
def test_largest_datagrams_arrive_whole_and_are_counted_whole(jumbo, src, dst):
    """Each program sizes a frame with bpf_xdp_get_buff_len: a frame in several buffers is
    counted with all of its bytes, at the host end and at both switch ports."""
    n = 300
    link_in, link_out = f"{src}-sw1", f"{dst}-sw1"
    before_in, before_out = _link(jumbo, link_in)["a-b"], _link(jumbo, link_out)["b-a"]
    res = run_flow(jumbo.plan.node(src).netns, jumbo.plan.node(dst).netns, _ip(jumbo, dst), n,
                   size=SIZE, flush=1)
    assert res.unique == n and res.bytes == n * SIZE, res
    after_in, after_out = _link(jumbo, link_in)["a-b"], _link(jumbo, link_out)["b-a"]
    frames = n + 1                                         # and the flush frame
    for what, before, after in (("switch port in", before_in, after_in),
                                ("host end", before_out, after_out)):
        got = after["rx_bytes"] - before["rx_bytes"]
        assert frames * FRAME <= got < frames * FRAME + 4096, (what, got)
    sent = after_out["tx_bytes"] - before_out["tx_bytes"]
    assert frames * FRAME <= sent < frames * FRAME + 4096, sent


def test_leaf_spine_routes_the_largest_datagrams_over_both_spines(lab_name):
    """Routed hops (leaves and spines) at MTU 9000: native everywhere, datagrams whole."""
    core.up(lab_name, "leaf-spine", 4, mtu=MTU)
    view = core.LabView(lab_name)
    assert view.record["xdp_mode"] == "native" and view.record["forwarding"] == "stack"
    for family, size in ((socket.AF_INET, SIZE), (socket.AF_INET6, MTU - 48)):
        for sport in (40000, 40001, 40002, 40003):
            res = run_flow(view.plan.node("h1").netns, view.plan.node("h4").netns,
                           _ip(view, "h4", family), 40, size=size, family=family, sport=sport,
                           flush=1)
            assert res.unique == 40 and res.bytes == 40 * size, (family, sport, res)
    links = {l["name"]: l["counters"] for l in view.status()["links"]}
    assert all(links[f"leaf1-spine{s}"]["a-b"]["rx_packets"] > 0 for s in (1, 2))


N = 2000
P = 0.10


@pytest.mark.parametrize("direction", ["a-b", "b-a"])
@pytest.mark.parametrize("kind", ["loss", "dup", "reorder"])
def test_impairment_on_largest_frames(jumbo, kind, direction):
    src, dst = ("h1", "h2") if direction == "a-b" else ("h2", "h1")
    before = _link(jumbo, "h1-sw1")[direction]["impair"]
    jumbo.impair("h1-sw1", direction, Impairment(**{kind: P, "seed": 21}).validate())
    try:
        res = run_flow(jumbo.plan.node(src).netns, jumbo.plan.node(dst).netns, _ip(jumbo, dst),
                       N, size=SIZE)
    finally:
        jumbo.impair("h1-sw1", direction, None)
    after = _link(jumbo, "h1-sw1")[direction]["impair"]
    delta = {k: after[k] - before[k] for k in after}
    assert res.sent == N and res.bytes == res.received * SIZE
    measured = {"loss": res.lost, "dup": res.duplicates, "reorder": res.late}[kind] / N
    assert abs(measured - P) <= 0.3 * P, (kind, direction, res)
    counted = {"loss": "lost", "dup": "duplicated", "reorder": "reordered"}[kind]
    assert delta[counted] >= measured * N, delta
    if kind != "loss":
        assert res.lost == 0, res


def test_rate_and_ecn_on_largest_frames(lab_name):
    rate = 100_000_000
    core.up(lab_name, "pair", mtu=MTU, rate=f"{rate}bit", ecn_threshold=60_000)
    view = core.LabView(lab_name)
    assert view.record["xdp_mode"] == "native" and view.record["forwarding"] == "stack"
    h1, h2 = view.plan.node("h1"), view.plan.node("h2")
    hot = run_flow(h1.netns, h2.netns, _ip(view, "h2"), 0, size=SIZE, tos=0x02, burst=0,
                   duration_s=1.5, flush=4)
    wire_bps = hot.received * FRAME * 8 / hot.duration_s
    assert 0.8 * rate <= wire_bps <= 1.2 * rate, f"delivered {wire_bps:.4g} bit/s for {rate}"
    assert hot.ce > 0.5 * hot.received, hot
    c = _link(view, "h2-sw1")["b-a"]
    assert c["ecn_marked"] >= hot.ce and c["queue_drops"] > 0, c


# A NIC-side program as MetaRoCE's would be: frags-aware, natively attached through a BPF link
# on the host port, answering with XDP_TX. It returns UDP datagrams to port ECHO to their
# sender (addresses and ports swapped: the checksum stays valid) and counts them whole.
ECHO = 7
NIC_SIDE = r"""
#include <uapi/linux/if_ether.h>
#include <uapi/linux/in.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/udp.h>
BPF_ARRAY(echoed, u64, 2);

static __always_inline void swap6(unsigned char *a, unsigned char *b)
{
    unsigned char t[6];
    __builtin_memcpy(t, a, 6);
    __builtin_memcpy(a, b, 6);
    __builtin_memcpy(b, t, 6);
}

int nic_side(struct xdp_md *ctx)
{
    void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
    struct ethhdr *eth = data;
    struct iphdr *ip = data + sizeof(*eth);
    struct udphdr *udp = (void *)(ip + 1);
    if ((void *)(udp + 1) > end || eth->h_proto != htons(ETH_P_IP) || ip->ihl != 5 ||
        ip->protocol != IPPROTO_UDP || udp->dest != htons(ECHO))
        return XDP_PASS;
    swap6(eth->h_dest, eth->h_source);
    __be32 a = ip->saddr;
    ip->saddr = ip->daddr;
    ip->daddr = a;
    __be16 p = udp->source;
    udp->source = udp->dest;
    udp->dest = p;
    u32 k0 = 0, k1 = 1;
    u64 *frames = echoed.lookup(&k0), *bytes = echoed.lookup(&k1);
    if (frames && bytes) {
        __sync_fetch_and_add(frames, 1);
        __sync_fetch_and_add(bytes, bpf_xdp_get_buff_len(ctx));
    }
    return XDP_TX;
}
"""


def test_nic_side_program_attaches_natively_and_its_xdp_tx_crosses_the_switch(jumbo, tmp_path):
    """What `metaroce up` does on a host port, with a stand-in NIC program: the lab's program
    is taken off (recorded), the NIC's attached natively by BPF link at MTU 9000; its XDP_TX
    frames reach the other host through the switch port; the lab's program is put back."""
    h1, h2 = jumbo.plan.node("h1"), jumbo.plan.node("h2")
    idx = jumbo.ports[("h1", "eth0")]
    lab_prog = fabric.xdp_attached(h1.netns, "eth0")
    for n, itf in (("sw1", "h1"), ("h1", "eth0")):
        assert fabric.xdp_attached(jumbo.plan.node(n).netns, itf)["mode"] == "native", (n, itf)
    bpf = import_bcc().BPF(text=NIC_SIDE.replace("ECHO", str(ECHO)).encode())
    record = str(tmp_path / "displaced.json")
    link = None
    try:
        fn = load(bpf, "nic_side", "xdp.frags")
        with in_netns(h1.netns):
            assert xdpslot.take_over(idx, record)["prog_id"] == lab_prog["prog_id"]
            link = libbpf.xdp_link_create(fn.fd, idx, libbpf.XDP_FLAGS_DRV_MODE)
        att = fabric.xdp_attached(h1.netns, "eth0")
        assert att["mode"] == "native" and att["prog_id"] != lab_prog["prog_id"]

        sock = udp_socket(h2.netns, bind=("", 0))
        sock.settimeout(2)
        n, echoed = 50, 0
        try:
            for i in range(n):
                payload = i.to_bytes(4, "big") * (SIZE // 4)
                sock.sendto(payload, (_ip(jumbo, "h1"), ECHO))
                try:
                    data, addr = sock.recvfrom(65536)
                except socket.timeout:
                    if i >= 4 and not echoed:
                        break                              # none come back: do not wait 50 times
                    continue
                assert addr == (_ip(jumbo, "h1"), ECHO) and data == payload
                echoed += 1
        finally:
            sock.close()
        assert echoed == n, f"{echoed} of {n} XDP_TX frames came back through the switch"
        table = bpf[b"echoed"]
        assert table[table.Key(0)].value == n and table[table.Key(1)].value == n * FRAME
        p = subprocess.run(["ip", "netns", "exec", h2.netns, "ping", "-c", "2", "-i", "0.2",
                            "-s", str(SIZE), "-M", "do", _ip(jumbo, "h1")],
                           capture_output=True, text=True, timeout=30)
        assert p.returncode == 0, p.stdout + p.stderr      # passed by the NIC-side program
    finally:
        if link is not None:
            os.close(link)                                 # the link goes with its fd
        with in_netns(h1.netns):
            xdpslot.put_back(record)
        bpf.cleanup()
    assert fabric.xdp_attached(h1.netns, "eth0") == lab_prog
