"""Frames built by the C requester path (metaroce/fastpath/roce_tx.c) decode with our codec
(ICRC verified), with scapy (ICRC, IP and UDP checksums recomputed independently), carry the
right opcode sequence, and reassemble to the message."""

import pytest
from _deps import require
from scapy.contrib.roce import BTH as ScapyBTH
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether

from metaroce.wire import consts as C
from metaroce.wire.headers import RETH
from metaroce.wire.packet import parse_frame

_xsk = require("metaroce.fastpath._xsk", "the fast path's C helpers are not built: run make setup")
ffi, lib = _xsk.ffi, _xsk.lib


def flow(v6):
    f = ffi.new("struct mr_roce_flow *")
    f.dmac, f.smac = bytes.fromhex("020000000002"), bytes.fromhex("020000000001")
    f.ipv6 = int(v6)
    if v6:
        f.src_ip = bytes.fromhex("fd00" + "0" * 27 + "1")
        f.dst_ip = bytes.fromhex("fd00" + "0" * 27 + "2")
    else:
        f.src_ip, f.dst_ip = bytes([10, 0, 0, 1]).ljust(16, b"\0"), bytes([10, 0, 0, 2]).ljust(16, b"\0")
    f.tos, f.ttl, f.sport, f.pkey, f.dqpn = 26 << 2 | 2, 64, 0xC0DE, 0xFFFF, 0xABCDE
    return f


@pytest.mark.parametrize("v6", [False, True])
@pytest.mark.parametrize("size", [0, 1, 1024, 1027, 3 * 1024 + 2])
def test_c_built_write_frames(v6, size):
    data = bytes((i * 13 + 7) & 0xFF for i in range(size))
    buf = ffi.new("uint8_t[]", 4096)
    n = max(1, -(-size // 1024))
    got, ops = b"", []
    for idx in range(n):
        flen = lib.mr_roce_build_write(buf, 4096, flow(v6), data, size, 1024, 0xFFFFFE, 0x1000, 77, idx)
        frame = bytes(ffi.buffer(buf, flen))
        pkt = parse_frame(frame)                 # raises on a bad ICRC or a malformed header
        ops.append(pkt.bth.opcode)
        assert pkt.bth.dest_qp == 0xABCDE and pkt.bth.psn == (0xFFFFFE + idx) & C.PSN_MASK
        assert pkt.bth.ack_req == int(idx == n - 1)
        if idx == 0:
            assert pkt.get(RETH) == RETH(va=0x1000, rkey=77, dma_len=size)
        got += pkt.payload
        s = Ether(frame)
        assert s[ScapyBTH].icrc == ScapyBTH(bytes(s[ScapyBTH])).icrc
        ip = s[IPv6] if v6 else s[IP]
        fresh = ip.copy()
        if v6:
            fresh[UDP].chksum = None
            assert IPv6(bytes(fresh))[UDP].chksum == s[UDP].chksum
        else:
            fresh.chksum = None
            assert IP(bytes(fresh)).chksum == s[IP].chksum and s[UDP].chksum == 0
    assert got == data
    O = C.Opcode
    want = ([O.RC_RDMA_WRITE_ONLY] if n == 1 else
            [O.RC_RDMA_WRITE_FIRST] + [O.RC_RDMA_WRITE_MIDDLE] * (n - 2) + [O.RC_RDMA_WRITE_LAST])
    assert ops == want
    assert lib.mr_roce_build_write(buf, 4096, flow(v6), data, size, 1024, 0, 0, 0, n) == 0
