"""The kernel does the work: h1 sends a multi-packet RDMA WRITE over the lab's veth links
(AF_XDP); on h2 no user-space code runs in the data path — the XDP NIC verifies each packet's
ICRC, places it into the registered region and sends the ACK back (XDP_TX) to h1."""

import hashlib
import os

from roce_util import lab_write, parse_ack

from metaroce.lab import core, fabric
from metaroce.lab.traffic import udp_socket
from metaroce.nic.rx import ACCESS_REMOTE_WRITE, RxPath
from metaroce.wire import consts as C

MSG = 4 << 20            # 4 MiB
QPN, PEER_QPN, PD, PSN0 = 0x11, 0x22, 3, 0xFFFF00   # the PSN wraps mid-message


def test_write_is_placed_and_acked_by_the_kernel(lab_name):
    core.up(lab_name, "pair")
    view = core.LabView(lab_name)
    h1, h2 = view.plan.node("h1"), view.plan.node("h2")
    nic = RxPath(max_qps=16, max_mrs=16)
    try:
        mr = nic.reg_mr(MSG, PD, ACCESS_REMOTE_WRITE)
        nic.set_qp(QPN, epsn=PSN0, pd=PD, dqpn=PEER_QPN)
        fabric.attach_xdp(h2.netns, "eth0", nic.prog_fd, view.plan.mtu)   # h2's NIC is XDP now
        acks = udp_socket(h1.netns, bind=("", C.ROCEV2_UDP_PORT))
        acks.settimeout(3.0)
        data = os.urandom(MSG)
        n = lab_write(view, "h1", "h2", mr.rkey, mr.addr, data, QPN, PSN0)
        bth, aeth = parse_ack(acks.recvfrom(2048)[0])   # through h1's ordinary UDP stack
        assert bth.opcode == C.Opcode.RC_ACKNOWLEDGE and bth.dest_qp == PEER_QPN
        assert bth.psn == (PSN0 + n - 1) & C.PSN_MASK and aeth.syndrome == 0x1F
        assert aeth.msn == 1
        assert hashlib.sha256(mr.buf).digest() == hashlib.sha256(data).digest()
        c = nic.counters()
        assert c["placed"] == n and c["tx_ack"] == 1, c
        assert c["bad_icrc"] == c["malformed"] == c["psn_out_of_order"] == 0, c
        assert nic.qp_state(QPN)["epsn"] == (PSN0 + n) & C.PSN_MASK
    finally:
        core.down(lab_name)
        nic.close()
