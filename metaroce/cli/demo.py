"""`metaroce demo`: the embedded default run on this machine. A two-host lab; `metaroce up` on
both hosts makes each eth0 an XDP RDMA NIC; one application per host uses the verbs API:
h1 WRITEs 256 MiB into h2's memory, READs it back, SENDs to posted receives and runs atomics.
Every region is checked by SHA-256; a perftest-style summary and the NIC counters follow."""

import hashlib
import os
import re
import time

import click

from ..cm.endpoint import path_mtu
from ..errors import MetaroceError
from ..lab import core, fabric, procs
from ..nic import daemon as nicd
from ..verbs import (CQ, MR, PD, QP, IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_REMOTE_ATOMIC,
                     IBV_ACCESS_REMOTE_READ, IBV_ACCESS_REMOTE_WRITE, IBV_WC_SUCCESS,
                     IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_WR_RDMA_READ,
                     IBV_WR_RDMA_WRITE, IBV_WR_SEND_WITH_IMM, Context, QPInitAttr, RecvWR, SendWR,
                     wc_status_str)
from .output import emit_json, json_option, log

DEMO_PREFIX = "demo"          # a demo's lab is demo<pid>: several demos may run side by side
MiB = 1 << 20
MSG = 1 * MiB            # one WRITE / READ work request
TOTAL = 256 * MiB        # moved each way
SENDS = 64               # SEND_WITH_IMM of 64 KiB each into posted receives
SEND_BYTES = 64 * 1024
DEPTH = 16               # work requests in flight
ACCESS = (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
          IBV_ACCESS_REMOTE_ATOMIC)


class _Host:
    def __init__(self, ctx: Context, size: int):
        self.ctx = ctx
        self.pd = PD(ctx)
        self.mr = MR(self.pd, size, ACCESS)
        self.cq = CQ(ctx, 4096)
        self.qp = QP(self.pd, QPInitAttr(self.cq, self.cq))


def _check(wcs) -> None:
    for wc in wcs:
        if wc.status != IBV_WC_SUCCESS:
            raise MetaroceError(f"work request {wc.wr_id} ({wc.opcode}) failed: "
                                f"{wc_status_str(wc.status)}")


def _stream(a: _Host, opcode: str, total: int, bar, remote_off: int, local_off: int, b: _Host):
    """total bytes in MSG-sized work requests, DEPTH in flight; returns seconds."""
    n = total // MSG
    posted = done = 0
    t0 = time.monotonic()
    while done < n:
        while posted < n and posted - done < DEPTH:
            a.qp.post_send(SendWR(opcode, wr_id=posted,
                                  sg_list=[a.mr.sge(local_off + posted * MSG, MSG)],
                                  remote_addr=b.mr.addr + remote_off + posted * MSG,
                                  rkey=b.mr.rkey))
            posted += 1
        wcs = a.cq.wait(1, timeout_s=60)
        _check(wcs)
        done += len(wcs)
        bar.update(MSG * len(wcs))
    return time.monotonic() - t0


def _run(view, mode: str) -> dict:
    h1, h2 = view.plan.node("h1"), view.plan.node("h2")
    devs = [nicd.DeviceId("eth0", h.netns) for h in (h1, h2)]
    started = []
    try:
        for dev in devs:
            st = nicd.start_background(dev, mode)
            started.append(dev)
        c1, c2 = Context("eth0", h1.netns), Context("eth0", h2.netns)
        a, b = _Host(c1, 2 * TOTAL), _Host(c2, TOTAL + SENDS * SEND_BYTES + 4096)
        ip1, ip2 = (h.iface("eth0").ipv4.split("/")[0] for h in (h1, h2))
        # the path MTU as the CM picks it over the lab's IPv4 addresses: the smaller of what
        # both ends' devices take (the link MTU and the AF_XDP socket's largest frame decide
        # each): in RoCEv2 mode the IB enum's (4096 on a 9000-byte lab with multi-buffer
        # transmit, 2048 without it, 1024 at 1500), in MetaRoCE mode the fitted one (CM-14:
        # 1408 at 1500)
        pmtu = path_mtu(mode, c1, c2)
        a.qp.connect({"qpn": b.qp.qp_num, "psn": b.qp.psn, "ip": ip2, "mode": mode, "mtu": pmtu})
        b.qp.connect({"qpn": a.qp.qp_num, "psn": a.qp.psn, "ip": ip1, "mode": mode, "mtu": pmtu})
        data = os.urandom(TOTAL)
        a.mr.write(data)
        want = hashlib.sha256(data).digest()
        err = click.get_text_stream("stderr")
        with click.progressbar(length=TOTAL, label="RDMA WRITE h1 -> h2", file=err) as bar:
            write_s = _stream(a, IBV_WR_RDMA_WRITE, TOTAL, bar, 0, 0, b)
        write_ok = hashlib.sha256(b.mr.buf[:TOTAL]).digest() == want
        with click.progressbar(length=TOTAL, label="RDMA READ  h1 <- h2", file=err) as bar:
            read_s = _stream(a, IBV_WR_RDMA_READ, TOTAL, bar, 0, TOTAL, b)
        read_ok = hashlib.sha256(a.mr.buf[TOTAL:2 * TOTAL]).digest() == want

        # SEND with immediate into receives posted by h2's application
        base = TOTAL
        b.qp.post_recv([RecvWR(wr_id=i, sg_list=[b.mr.sge(base + i * SEND_BYTES, SEND_BYTES)])
                        for i in range(SENDS)])
        a.qp.post_send([SendWR(IBV_WR_SEND_WITH_IMM, wr_id=1000 + i, imm_data=i,
                               sg_list=[a.mr.sge(i * SEND_BYTES, SEND_BYTES)])
                        for i in range(SENDS)])
        _check(a.cq.wait(SENDS, timeout_s=30))
        recvs = b.cq.wait(SENDS, timeout_s=30)
        _check(recvs)
        send_ok = ([(w.wr_id, w.imm_data, w.byte_len) for w in recvs] ==
                   [(i, i, SEND_BYTES) for i in range(SENDS)] and
                   hashlib.sha256(b.mr.buf[base:base + SENDS * SEND_BYTES]).digest() ==
                   hashlib.sha256(data[:SENDS * SEND_BYTES]).digest())

        # atomics: 100 fetch-adds of 3 and one compare-and-swap on h2's counter word
        word = TOTAL + SENDS * SEND_BYTES
        b.mr.buf[word:word + 8] = (1000).to_bytes(8, "little")
        a.qp.post_send([SendWR(IBV_WR_ATOMIC_FETCH_AND_ADD, wr_id=2000 + i, compare_add=3,
                               sg_list=[a.mr.sge(8 * i, 8)], remote_addr=b.mr.addr + word,
                               rkey=b.mr.rkey) for i in range(100)])
        _check(a.cq.wait(100, timeout_s=30))
        a.qp.post_send(SendWR(IBV_WR_ATOMIC_CMP_AND_SWP, wr_id=3000, compare_add=1300, swap=7,
                              sg_list=[a.mr.sge(800, 8)], remote_addr=b.mr.addr + word,
                              rkey=b.mr.rkey))
        _check(a.cq.wait(1, timeout_s=30))
        olds = [int.from_bytes(a.mr.buf[8 * i:8 * i + 8], "little") for i in range(101)]
        atomic_ok = (olds == [1000 + 3 * i for i in range(100)] + [1300] and
                     int.from_bytes(b.mr.buf[word:word + 8], "little") == 7)
        s1, s2 = c1.status(), c2.status()
        qp = a.qp.query()
        c1.close()
        c2.close()
    finally:
        for dev in started:
            try:
                nicd.stop(dev)
            except MetaroceError as exc:     # a daemon that died: its log says why
                log(f"demo: {exc}; see {dev.log_path}")
    verified = TOTAL * (write_ok + read_ok) + SENDS * SEND_BYTES * send_ok + 8 * 101 * atomic_ok
    return {"xdp_mode": st["xdp_mode"], "mode": qp["mode"], "device_mode": st["mode"],
            "bytes_verified": verified,
            "data_ok": write_ok and read_ok and send_ok and atomic_ok,
            "write_ok": write_ok, "read_ok": read_ok, "send_ok": send_ok, "atomic_ok": atomic_ok,
            "write_bw_bps": round(TOTAL * 8 / write_s), "read_bw_bps": round(TOTAL * 8 / read_s),
            "write_s": round(write_s, 4), "read_s": round(read_s, 4),
            "msg_bytes": MSG, "iterations": TOTAL // MSG, "pmtu": qp["remote"]["mtu"],
            "msg_rate_pps": round(TOTAL / qp["remote"]["mtu"] / write_s),
            "retransmitted_packets": qp["retransmitted_packets"],
            "counters": {"h1": s1["counters"], "h2": s2["counters"]},
            "xsk": {"h1": s1["tx"], "h2": s2["tx"]}}


def _remove_leftover_demo_labs() -> None:
    """Labs of demos that died half-way: the demo that made it (its pid is in the name) is
    gone and nothing runs in it. A running demo's lab is left alone."""
    for name in core.lab_names():
        m = re.fullmatch(rf"{DEMO_PREFIX}(\d*)", name)
        if m and not (m.group(1) and os.path.exists(f"/proc/{m.group(1)}")):
            if not procs.pids_in(procs.namespace_inodes(core.namespaces_of(name))):
                log(f"demo: removing the lab {name} left by an earlier demo")
                core.down(name)


@click.command()
@click.option("--mode", type=click.Choice(["metaroce", "roce"]), default="metaroce",
              show_default=True, help="metaroce: selective repeat with SACK (spec 5); roce: "
              "RoCEv2 go-back-N.")
@click.option("--mtu", type=click.IntRange(1280, 9000), default=1500, show_default=True,
              help="The lab's link MTU (9000: jumbo frames; the NIC's program is frags-aware).")
@json_option
def demo(mode, mtu, as_json):
    """Two-host lab, XDP RDMA NICs on both; WRITE, READ back, SEND/RECV and atomics; verify."""
    core.preflight()
    _remove_leftover_demo_labs()
    lab = f"{DEMO_PREFIX}{os.getpid() % 1000000}"
    t0 = time.monotonic()
    rec = core.up(lab, "pair", mtu=mtu)
    up_s = time.monotonic() - t0
    try:
        view = core.LabView(lab)
        lab_progs = [fabric.xdp_attached(view.plan.node(h).netns, "eth0") for h in ("h1", "h2")]
        res = _run(view, mode)
        # after `metaroce down` the NIC is gone and the lab's own host-port program is back
        after = [fabric.xdp_attached(view.plan.node(h).netns, "eth0") for h in ("h1", "h2")]
    finally:
        core.down(lab)
    c = res["counters"]["h2"]
    clean = c["bad_icrc"] == c["malformed"] == 0
    ok = res["data_ok"] and clean and after == lab_progs
    doc = {"ok": ok, "lab_mtu": mtu, "lab_xdp_mode": rec["xdp_mode"], "lab_up_s": round(up_s, 3),
           "nic_detached_after_down": after == lab_progs, **res}
    if as_json:
        emit_json(doc)
        return 0 if ok else 1
    line = "-" * 86
    click.echo(line)
    click.echo("                    RDMA_Write / RDMA_Read BW Test (MetaRoCE demo: h1 <-> h2)")
    how = ("MetaRoCE: selective repeat, SACK, placement on arrival" if res["mode"] == "metaroce"
           else "RoCEv2 RC, go-back-N")
    click.echo(f" Mode            : {res['mode']} ({how})   XDP: {res['xdp_mode']}")
    sg = ", multi-buffer" if res["xsk"]["h1"].get("tx_multi") else ""
    click.echo(f" Transport       : AF_XDP (copy mode{sg}) on veth, PMTU {res['pmtu']}, "
               f"placement + ACK in XDP")
    click.echo(f" Outstanding     : {DEPTH} work requests of {MSG} bytes")
    click.echo(line)
    click.echo(" test        #bytes     #iterations    BW average[Gb/sec]   MsgRate[Mpps]")
    for name, key in (("RDMA_Write", "write"), ("RDMA_Read", "read")):
        click.echo(f" {name:<11} {MSG:<10} {TOTAL // MSG:<14} {res[key + '_bw_bps'] / 1e9:<20.2f} "
                   f"{res[key + '_bw_bps'] / 8 / res['pmtu'] / 1e6:<.3f}")
    click.echo(line)
    mark = lambda ok: "match" if ok else "MISMATCH"  # noqa: E731
    click.echo(f" SHA-256 WRITE {TOTAL // MiB} MiB: {mark(res['write_ok'])}   READ back: "
               f"{mark(res['read_ok'])}   SEND x{SENDS}: {mark(res['send_ok'])}   "
               f"atomics x101: {mark(res['atomic_ok'])}")
    for host in ("h1", "h2"):
        cs = res["counters"][host]
        click.echo(f" {host} NIC counters: " + ", ".join(f"{k} {v}" for k, v in cs.items() if v))
    click.echo("demo: " + ("ok" if ok else "FAILED"))
    return 0 if ok else 1
