"""`metaroce demo`: the embedded default run on this machine. A two-host lab; `metaroce up` on
h2 makes its eth0 an XDP RDMA NIC; an application on h2 registers a region; h1 WRITEs into it
through the C fast path (AF_XDP); every region is checked by SHA-256; perftest-style summary."""

import hashlib
import mmap
import os
import socket
import time

import click

from ..errors import MetaroceError
from ..fastpath.xsk import XskSocket
from ..lab import core, fabric, netdev
from ..lab.traffic import udp_socket
from ..nic import daemon as nicd
from ..nic.rx import ACCESS_LOCAL_WRITE, ACCESS_REMOTE_WRITE
from ..wire import consts as C
from ..wire.headers import AETH, BTH
from .output import emit_json, json_option, log

DEMO_LAB = "demo"
MSG = 1 << 20            # one WRITE
ITERS = 64               # 64 MiB in all
PMTU = 1024              # the largest RoCE path MTU that fits 1500-byte links
QPN, PEER_QPN, PD = 0x000111, 0x000222, 1


def _wait_acks(sock: socket.socket, want_psn: int, timeout_s: float) -> tuple[int, float]:
    """Read ACKs until the one for want_psn; returns (ACKs seen, arrival time)."""
    sock.settimeout(timeout_s)
    seen = 0
    while True:
        payload = sock.recv(2048)
        bth, aeth = BTH.parse(payload[:12]), AETH.parse(payload[12:16])
        if bth.opcode != C.Opcode.RC_ACKNOWLEDGE or aeth.syndrome & 0x60:
            raise MetaroceError(f"the responder answered with syndrome 0x{aeth.syndrome:02x} "
                                f"at PSN {bth.psn}")
        seen += 1
        if bth.psn == want_psn:
            return seen, time.monotonic()


def _run(view) -> dict:
    h1, h2 = view.plan.node("h1"), view.plan.node("h2")
    a, b = h1.iface("eth0"), h2.iface("eth0")
    dev = nicd.DeviceId("eth0", h2.netns)
    st = nicd.start_background(dev, "roce")
    try:
        # the application on h2: one region, mapped through the fd the daemon hands it
        rep, fds = nicd.request(dev, {"op": "reg_mr", "length": MSG * ITERS, "pd": PD,
                                      "access": ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE})
        if "error" in rep:
            raise MetaroceError(f"reg_mr: {rep['error']}")
        region = mmap.mmap(fds[0], rep["map_bytes"])
        psn0 = int.from_bytes(os.urandom(3), "big")
        nicd.request(dev, {"op": "set_qp", "qpn": QPN, "epsn": psn0, "pd": PD, "dqpn": PEER_QPN})
        data = os.urandom(MSG * ITERS)
        acks = udp_socket(h1.netns, bind=("", C.ROCEV2_UDP_PORT), rcvbuf=8 << 20)
        with netdev.in_netns(h1.netns):
            xs = XskSocket(view.ports[("h1", "eth0")])
        psn = psn0
        try:
            flow = xs.flow(dmac=b.mac, smac=a.mac, src_ip=a.ipv4.split("/")[0],
                           dst_ip=b.ipv4.split("/")[0], dqpn=QPN, sport=0xC000 | psn0 & 0x3FFF)
            t0 = time.monotonic()
            with click.progressbar(range(ITERS), label="RDMA WRITE h1 -> h2", file=click.get_text_stream("stderr")) as bar:
                for i in bar:
                    psn = (psn0 + i * (MSG // PMTU)) & C.PSN_MASK
                    xs.send_write(flow, memoryview(data)[i * MSG:(i + 1) * MSG], pmtu=PMTU,
                                  psn0=psn, va=rep["addr"] + i * MSG, rkey=rep["rkey"])
            while xs.in_flight():       # wakes the kernel until the TX ring is drained
                pass
            last_psn = (psn0 + ITERS * (MSG // PMTU) - 1) & C.PSN_MASK
            try:
                n_acks, t1 = _wait_acks(acks, last_psn, 5.0)
            except socket.timeout:
                c = nicd.request(dev, {"op": "status"})[0]["counters"]
                raise MetaroceError("no ACK for the last WRITE within 5 s; NIC counters: " +
                                    ", ".join(f"{k} {v}" for k, v in c.items() if v)) from None
        finally:
            xs.close()
            acks.close()
        ok_data = hashlib.sha256(region[:MSG * ITERS]).digest() == hashlib.sha256(data).digest()
        region.close()
        os.close(fds[0])
        status = nicd.request(dev, {"op": "status"})[0]
    finally:
        nicd.stop(dev)
    secs = t1 - t0
    return {"xdp_mode": st["xdp_mode"], "mode": st["mode"], "bytes_verified": MSG * ITERS if ok_data else 0,
            "data_ok": ok_data, "write_bw_bps": round(MSG * ITERS * 8 / secs), "write_s": round(secs, 4),
            "msg_bytes": MSG, "iterations": ITERS, "pmtu": PMTU, "acks": n_acks,
            "msg_rate_pps": round(MSG * ITERS / PMTU / secs), "counters": status["counters"]}


@click.command()
@json_option
def demo(as_json):
    """Two-host lab; h2 becomes an XDP RDMA NIC; h1 WRITEs 64 MiB into h2's memory; verify."""
    core.preflight()
    if DEMO_LAB in core.state.names() or core.namespaces_of(DEMO_LAB):
        log("demo: removing a demo lab left by an earlier run")
        core.down(DEMO_LAB)
    t0 = time.monotonic()
    rec = core.up(DEMO_LAB, "pair")
    up_s = time.monotonic() - t0
    try:
        view = core.LabView(DEMO_LAB)
        res = _run(view)
        after = fabric.xdp_attached(view.plan.node("h2").netns, "eth0")
    finally:
        core.down(DEMO_LAB)
    c = res["counters"]
    clean = c["bad_icrc"] == c["malformed"] == c["psn_out_of_order"] == 0
    ok = res["data_ok"] and clean and after is None and c["placed"] == ITERS * MSG // PMTU
    doc = {"ok": ok, "lab_xdp_mode": rec["xdp_mode"], "lab_up_s": round(up_s, 3),
           "nic_detached_after_down": after is None, **res}
    if as_json:
        emit_json(doc)
        return 0 if ok else 1
    click.echo("-" * 86)
    click.echo("                    RDMA_Write BW Test (MetaRoCE demo: h1 -> XDP NIC on h2)")
    click.echo(f" Mode            : {res['mode']} (RoCEv2 RC, go-back-N)   XDP: {res['xdp_mode']}")
    click.echo(f" Transport       : AF_XDP (copy mode) on veth, PMTU {PMTU}, placement + ACK in XDP")
    click.echo("-" * 86)
    click.echo(" #bytes     #iterations    BW average[Gb/sec]   MsgRate[Mpps]   ACKs")
    click.echo(f" {MSG:<10} {ITERS:<14} {res['write_bw_bps'] / 1e9:<20.2f} "
               f"{res['msg_rate_pps'] / 1e6:<15.3f} {res['acks']}")
    click.echo("-" * 86)
    click.echo(f" SHA-256 of {res['bytes_verified'] // (1 << 20)} MiB on h2: "
               f"{'match' if res['data_ok'] else 'MISMATCH'}")
    click.echo(" NIC counters: " + ", ".join(f"{k} {v}" for k, v in c.items() if v))
    click.echo("demo: " + ("ok" if ok else "FAILED"))
    return 0 if ok else 1
