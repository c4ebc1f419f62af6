"""Fuzz a running daemon over the wire (issue 9): a pair lab, the real `metaroce up` daemon on
h2 with live QPs (both modes) and registered regions, and the generator's frames (gen.py:
valid packets of every opcode, mutated headers, keys, lengths, truncations, random frames; most
with their ICRC recomputed) sent from h1's namespace through an AF_PACKET socket on the veth,
addressed from h1 to h2 so that they reach the deep checks.

Invariants, reported as JSON:
  * every frame is accounted for: each frame the XDP program saw moved exactly one receive
    reason of the device's counters, so packets = accepted + passed + dropped + not_delivered
    + unaccounted with unaccounted = 0 (not_delivered: frames the sending socket refused, e.g.
    shorter than an Ethernet header); tx counts the replies the program sent (XDP_TX), which
    are drawn from accepted and dropped frames here (the BPF_PROG_TEST_RUN mode splits them
    per packet);
  * out_of_region_writes = 0: a guard region (same PD, an rkey the generator never uses) keeps
    its pattern, and the bytes past every region's length inside its map keep theirs;
  * crashes = 0: the daemon is alive afterwards, and daemon_serves_after: a fresh QP pair still
    WRITEs and READs back verified data.

With `mtu` (the CLI's --mtu, e.g. 9000) the pair lab runs at that link MTU (the NIC's program
frags-aware in native XDP), the QPs at the path MTU it allows (4096 at 9000) and the frames grow
up to the MTU plus the Ethernet header; `multi_buffer_frames` is the NIC program's own count
(port counter rcv_multi_buf) of RoCE frames that reached it as multi-buffer xdp_buffs, so a run
that never exercised the fragments path cannot pass.
"""

from __future__ import annotations

import os
import socket
import sys
import time

from ..lab import core
from ..nic import daemon as d
from ..nic.device import largest_fitted_pmtu, largest_pmtu
from ..verbs import (IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_REMOTE_ATOMIC, IBV_ACCESS_REMOTE_READ,
                     IBV_ACCESS_REMOTE_WRITE, IBV_WC_SUCCESS, IBV_WR_RDMA_READ, IBV_WR_RDMA_WRITE,
                     CQ, MR, PD, QP, Context, QPInitAttr, SendWR)
from . import frames as F
from .gen import Generator, Qp, Region, Target
from ..nic.rx import QP_RX_ERROR
from .harness import ACCEPT_REASONS, DEEP_REASONS, LINEAR_MAX

ALL = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | \
    IBV_ACCESS_REMOTE_ATOMIC
MR_CHUNK = 65536
# (length, access) of the live regions: lengths off the chunk size leave guard bytes in the map
REGIONS = ((3 * MR_CHUNK + 1000, ALL),
           (5000, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ),
           (MR_CHUNK + 7, IBV_ACCESS_REMOTE_READ), (4097, ALL))
BATCH = 64
SYNC_EVERY = 1                       # batches between reads of the QPs' expected PSNs


def _pattern(n: int, salt: int) -> bytes:
    block = bytes((i * 131 + salt) & 0xFF for i in range(4096))
    return (block * (n // 4096 + 1))[:n]


def _mac(view, host: str) -> bytes:
    return bytes.fromhex(view.plan.node(host).iface("eth0").mac.replace(":", ""))


def _addr(view, host: str, v6: bool) -> bytes:
    iface = view.plan.node(host).iface("eth0")
    ip = (iface.ipv6 if v6 else iface.ipv4).split("/")[0]
    return socket.inet_pton(socket.AF_INET6 if v6 else socket.AF_INET, ip)


class _Sender:
    """An AF_PACKET socket on h1's eth0, opened inside h1's namespace."""

    def __init__(self, netns: str):
        from ..lab.netdev import in_netns  # noqa: PLC0415
        with in_netns(netns):
            self.s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
            self.s.bind(("eth0", 0))
        self.s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)

    def send(self, frame: bytes) -> bool:
        try:
            self.s.send(frame)
            return True
        except OSError:
            return False

    def close(self):
        self.s.close()


def fuzz_wire(packets: int, seed: int = 1, progress=None, lab: str | None = None,
              mtu: int | None = None, queues: int = 1) -> dict:
    name = lab or f"fzw{os.getpid() % 10000}"
    t0 = time.monotonic()
    pmtu = 1024 if mtu is None else largest_pmtu(mtu, 2 * 4096)   # 4096 at 9000
    # the MetaRoCE QP at the fitted path MTU a MetaRoCE connection takes (CM-14: 8064 at 9000)
    mr_pmtu = pmtu if mtu is None else largest_fitted_pmtu(mtu, 2 * 4096)
    core.up(name, "pair", mtu=mtu or 1500, queues=queues)
    view = core.LabView(name)
    h1, h2 = view.plan.node("h1"), view.plan.node("h2")
    dev1, dev2 = d.DeviceId("eth0", h1.netns), d.DeviceId("eth0", h2.netns)
    started, ctxs = [], []
    saved = (F.ETH_SRC, F.ETH_DST, F.V4_SRC, F.V4_DST, F.V6_SRC, F.V6_DST)
    try:
        for dev in (dev1, dev2):
            d.start_background(dev, "metaroce")
            started.append(dev)
        pid = d.running_pid(dev2)
        ctx = Context("eth0", h2.netns)
        ctxs.append(ctx)
        pd = PD(ctx)
        # the frames come from h1 to h2 (so the veth delivers them and the source checks pass)
        F.ETH_SRC, F.ETH_DST = _mac(view, "h1"), _mac(view, "h2")
        F.V4_SRC, F.V4_DST = _addr(view, "h1", False), _addr(view, "h2", False)
        F.V6_SRC, F.V6_DST = _addr(view, "h1", True), _addr(view, "h2", True)
        mrs, regions = [], []
        for i, (length, access) in enumerate(REGIONS):
            mr = MR(pd, length, access)
            mr._mm[:] = _pattern(len(mr._mm), i)
            mrs.append(mr)
            regions.append(Region(i, mr.rkey, mr.addr, length, access, pd.handle))
        guard = MR(pd, 3 * MR_CHUNK + 11, ALL)        # same PD, an rkey no frame names
        guard._mm[:] = _pattern(len(guard._mm), 99)
        qps = []
        for i, metaroce in enumerate((False, False, False, True)):
            qpn = 0x100000 + (os.getpid() & 0xFFF) * 16 + i
            epsn = (0xFFFFFF - 40 * i) if i < 2 else 1000 * i     # two wrap soon
            ctx.request("set_qp", qpn=qpn, epsn=epsn, pd=pd.handle, dqpn=0x200 + i,
                        pmtu=mr_pmtu if metaroce else pmtu, metaroce=metaroce)
            qps.append(Qp(qpn, pd.handle, 0x200 + i, epsn, pmtu=mr_pmtu if metaroce else pmtu,
                          metaroce=metaroce))
        target = Target(regions, qps, dead_rkeys=[guard.rkey ^ 0x5A5A5A5A, 0, 0xFFFFFFFF],
                        pmtu=pmtu, max_frame=None if mtu is None else mtu + F.ETH_LEN)
        gen = Generator(target, seed)
        rx0, before = _snapshot(d, dev2, h2.netns)
        sender = _Sender(h1.netns)
        sent = refused = rearmed = 0
        big = 0                                    # frames sent longer than one page holds
        it = iter(gen)
        batches = 0
        try:
            while sent + refused < packets:
                for _ in range(min(BATCH, packets - sent - refused)):
                    frame = next(it)
                    if sender.send(frame):
                        sent += 1
                        big += len(frame) > LINEAR_MAX
                    else:
                        refused += 1
                batches += 1
                if batches % SYNC_EVERY == 0:              # follow the QPs' expected PSNs
                    time.sleep(0.002)
                    for q in qps:
                        st = ctx.request("raw_qp_state", qpn=q.qpn)[0]
                        q.epsn = st["epsn"]
                        if st["state"] == QP_RX_ERROR:     # a fatal NAK: re-arm (as the
                            rearmed += 1                   # BPF_PROG_TEST_RUN harness does)
                            ctx.request("set_qp", qpn=q.qpn, epsn=q.epsn, pd=pd.handle,
                                        dqpn=q.dqpn, pmtu=q.pmtu, metaroce=q.metaroce)
                    if progress and batches % 200 == 0:
                        progress(sent + refused, time.monotonic() - t0)
        finally:
            sender.close()
        # let the last frames drain through the veth's NAPI, then count
        d1, after = _snapshot(d, dev2, h2.netns)
        delivered = d1 - rx0
        rx = {k: after["counters"][k] - before["counters"].get(k, 0)
              for k in after["counters"] if not k.startswith("tx_")}
        tx = sum(after["counters"][k] - before["counters"].get(k, 0)
                 for k in after["counters"] if k.startswith("tx_"))
        seen = sum(rx.values())
        accepted = sum(v for k, v in rx.items() if k in ACCEPT_REASONS)
        passed = rx.get("not_roce", 0)
        dropped = seen - accepted - passed
        # the kernel's own traffic on the link (IPv6 ND/MLD) also reaches XDP as not_roce
        unaccounted = delivered - seen          # reached the device, no verdict counted
        not_delivered = refused + max(0, sent - delivered)   # lost on the way (MTU, switch)
        out_of_region = 0
        for mr, (i, (length, _)) in zip(mrs, enumerate(REGIONS)):
            tail = bytes(mr._mm[length:])
            out_of_region += sum(a != b for a, b in zip(tail, _pattern(len(mr._mm), i)[length:]))
        out_of_region += sum(a != b for a, b in zip(bytes(guard._mm), _pattern(len(guard._mm), 99)))
        port = {k: after.get("port", {}).get(k, 0) - before.get("port", {}).get(k, 0)
                for k in ("rcv_packets", "rcv_bytes", "rcv_multi_buf", "rcv_steered")}
        multi = port["rcv_multi_buf"]
        alive = pid is not None and _alive(pid)
        serves = alive and _serves(view, ctx, h1, mr_pmtu)
        deep = {k: rx.get(k, 0) for k in DEEP_REASONS}
        return {"mode": "wire", "packets": packets, "sent": sent,
                "not_delivered": not_delivered, "refused_by_socket": refused,
                "delivered": delivered, "qps_rearmed": rearmed,
                "seen_by_xdp": seen, "accepted": accepted, "passed": passed, "tx": tx,
                "dropped": dropped, "unaccounted": unaccounted,
                "drops_by_reason": {k: v for k, v in rx.items()
                                    if v and k not in ACCEPT_REASONS and k != "not_roce"},
                "deep_reasons_hit": deep,
                "out_of_region_writes": out_of_region, "crashes": 0 if alive else 1,
                "daemon_serves_after": serves, "seed": seed,
                "mtu": mtu or 1500, "pmtu": pmtu, "pmtu_metaroce": mr_pmtu,
                "max_frame": target.max_frame,
                # veth queues; with more than one the daemon steers by QP (nic_steer and
                # nic_rx_cpu see every frame: steered_frames is nic_steer's own count)
                "queues": queues, "rx_steering": isinstance(after.get("rx_steering"), dict),
                "steered_frames": port["rcv_steered"],
                "sent_longer_than_a_page": big,
                # RoCE frames the NIC's program got as multi-buffer xdp_buffs (its own count)
                "multi_buffer_frames": multi, "rcv_bytes": port["rcv_bytes"],
                "seconds": round(time.monotonic() - t0, 1),
                "packets_per_s": round(packets / max(time.monotonic() - t0, 1e-9)),
                "ok": unaccounted == 0 and out_of_region == 0 and alive and serves and
                (mtu is None or mtu <= LINEAR_MAX or multi > 0) and
                (queues == 1 or port["rcv_steered"] >= port["rcv_packets"] > 0)}
    finally:
        F.ETH_SRC, F.ETH_DST, F.V4_SRC, F.V4_DST, F.V6_SRC, F.V6_DST = saved
        for c in ctxs:
            c.close()
        for dev in started:
            try:
                d.stop(dev)
            except Exception:  # noqa: BLE001
                d.clean_stale(dev)
        core.down(name)


def _snapshot(d, dev, netns: str) -> tuple[int, dict]:
    """The device's rx_packets and the daemon's status (XDP verdict counters), read together
    and taken only when neither moved between two reads: the kernel's own traffic (IPv6 DAD,
    MLD, router solicitations in a freshly built lab) may arrive at any time, and veth counts
    a frame received before XDP has seen it."""
    last = None
    for _ in range(100):
        d0 = _rx_packets(netns)
        st = d.request(dev, {"op": "status"})[0]
        seen = sum(v for k, v in st["counters"].items() if not k.startswith("tx_"))
        d1 = _rx_packets(netns)
        if d0 == d1 and (seen, d1) == last:
            break
        last = (seen, d1)
        time.sleep(0.05)
    return d1, st


def _rx_packets(ns: str) -> int:
    """Frames the device received (veth counts every frame its XDP program saw)."""
    from pyroute2 import IPRoute  # noqa: PLC0415
    with IPRoute(netns=ns) as ipr:
        idx = ipr.link_lookup(ifname="eth0")[0]
        return ipr.link("get", index=idx)[0].get_attr("IFLA_STATS64")["rx_packets"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def _serves(view, ctx2: Context, h1, pmtu: int = 1024) -> bool:
    """A fresh QP pair (h1 -> h2) still WRITEs and READs back a verified MiB (at pmtu)."""
    c1 = Context("eth0", h1.netns)
    try:
        ends = []
        for c in (c1, ctx2):
            pd = PD(c)
            mr = MR(pd, 1 << 20, ALL)
            cq = CQ(c)
            ends.append((mr, cq, QP(pd, QPInitAttr(cq, cq))))
        (ma, ca, qa), (mb, _, qb) = ends
        ip1 = view.plan.node("h1").iface("eth0").ipv4.split("/")[0]
        ip2 = view.plan.node("h2").iface("eth0").ipv4.split("/")[0]
        qa.connect({"qpn": qb.qp_num, "psn": qb.psn, "ip": ip2, "mode": "metaroce", "mtu": pmtu})
        qb.connect({"qpn": qa.qp_num, "psn": qa.psn, "ip": ip1, "mode": "metaroce", "mtu": pmtu})
        data = os.urandom(1 << 19)
        ma.write(data)
        qa.post_send([SendWR(IBV_WR_RDMA_WRITE, wr_id=1, sg_list=[ma.sge(0, 1 << 19)],
                             remote_addr=mb.addr, rkey=mb.rkey),
                      SendWR(IBV_WR_RDMA_READ, wr_id=2, sg_list=[ma.sge(1 << 19, 1 << 19)],
                             remote_addr=mb.addr, rkey=mb.rkey)])
        wcs = ca.wait(2, timeout_s=20)
        ok = all(w.status == IBV_WC_SUCCESS for w in wcs) and \
            mb.read(1 << 19) == data and ma.read(1 << 19, 1 << 19) == data
        if not ok:
            print(f"fuzz --wire: the daemon did not serve afterwards: {wcs}", file=sys.stderr)
        return ok
    except Exception as exc:  # noqa: BLE001 (a daemon that cannot serve is the finding)
        print(f"fuzz --wire: the daemon did not serve afterwards: {exc}", file=sys.stderr)
        return False
    finally:
        c1.close()
