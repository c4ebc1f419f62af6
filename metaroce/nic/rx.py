"""Load the NIC receive program (bpf/nic/nic.bpf.c) and manage what it reads: QP receive
state, memory regions (one mmap-able array map per MR, found by rkey), counters."""

from __future__ import annotations

import mmap
import os
import secrets
import struct
from dataclasses import dataclass

from ..errors import MetaroceError
from ..kern import libbpf
from ..kern.bcc_loader import compile_program, load

MR_CHUNK = 65536
ACCESS_LOCAL_WRITE, ACCESS_REMOTE_WRITE, ACCESS_REMOTE_READ, ACCESS_REMOTE_ATOMIC = 1, 2, 4, 8
RX_REASONS = ("placed", "not_roce", "malformed", "unknown_qp", "psn_out_of_order",
              "bad_opcode_seq", "bad_rkey", "mr_bounds", "mr_access", "unsupported_opcode",
              "bad_icrc", "duplicate")
TX_COUNTERS = ("ack", "nak_seq")


def crc32_slice8_tables() -> bytes:
    """The 8 x 256 tables of slice-by-8 CRC-32 (reflected 0xEDB88320), as struct crc_tables."""
    t0 = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0xEDB88320 if c & 1 else c >> 1
        t0.append(c)
    tables = [t0]
    for _ in range(7):
        prev = tables[-1]
        tables.append([(v >> 8) ^ t0[v & 0xFF] for v in prev])
    return b"".join(struct.pack("=256I", *t) for t in tables)
_QP = struct.Struct("=IIIIQQIIII")   # struct qp_rx
_MR_INFO = struct.Struct("=QQII")    # struct mr_info


@dataclass
class MemoryRegion:
    """Registered memory: `buf` is the application's view, the XDP program writes into it."""
    rkey: int
    addr: int
    length: int
    access: int
    pd: int
    fd: int
    buf: memoryview
    _mm: mmap.mmap


class RxPath:
    """One loaded receive program with its maps; attach `prog_fd` to a device or test-run it."""

    def __init__(self, max_qps: int = 4096, max_mrs: int = 4096):
        self.bpf = compile_program("nic/nic.bpf.c", {"MAX_QPS": max_qps, "MAX_MRS": max_mrs})
        self.prog = load(self.bpf, "nic_rx", "xdp")
        self.prog_fd = self.prog.fd
        self._mrs_fd = self.bpf[b"mrs"].map_fd
        self._info_fd = self.bpf[b"mr_infos"].map_fd
        self._qps_fd = self.bpf[b"qps"].map_fd
        libbpf.map_update_raw(self.bpf[b"crc_tab"].map_fd, struct.pack("=I", 0), crc32_slice8_tables())
        self.mrs: dict[int, MemoryRegion] = {}

    def close(self) -> None:
        for mr in list(self.mrs.values()):
            self.dereg_mr(mr)
        self.bpf.cleanup()

    def set_qp(self, qpn: int, epsn: int, pd: int, dqpn: int = 0, msn: int = 0) -> None:
        """Receive state of a QP in RTR: what it expects next and whom it acknowledges."""
        libbpf.map_update_raw(self._qps_fd, struct.pack("=I", qpn),
                              _QP.pack(epsn, pd, 0, 0, 0, 0, dqpn, msn, 0, 0))

    def qp_state(self, qpn: int) -> dict:
        raw = self.bpf[b"qps"][self.bpf[b"qps"].Key(qpn)]
        return {f: getattr(raw, f) for f in ("epsn", "state", "wr_va", "wr_left", "dqpn", "msn",
                                             "nak_sent")}

    def reg_mr(self, length: int, pd: int, access: int, addr: int | None = None) -> MemoryRegion:
        """Register `length` bytes of new memory; the rkey is random (unpredictable)."""
        if length <= 0:
            raise MetaroceError("MR length must be positive")
        chunks = -(-length // MR_CHUNK)
        fd = libbpf.map_create(libbpf.BPF_MAP_TYPE_ARRAY, "mr", 4, MR_CHUNK, chunks,
                               libbpf.BPF_F_MMAPABLE | libbpf.BPF_F_INNER_MAP)
        mm = mmap.mmap(fd, chunks * MR_CHUNK)
        rkey = secrets.randbits(32)
        while rkey in self.mrs or rkey == 0:
            rkey = secrets.randbits(32)
        addr = addr if addr is not None else secrets.randbits(47) & ~0xFFF
        libbpf.map_update_raw(self._info_fd, struct.pack("=I", rkey),
                              _MR_INFO.pack(addr, length, access, pd))
        libbpf.map_update_raw(self._mrs_fd, struct.pack("=I", rkey), struct.pack("=I", fd))
        mr = MemoryRegion(rkey, addr, length, access, pd, fd, memoryview(mm)[:length], mm)
        self.mrs[rkey] = mr
        return mr

    def dereg_mr(self, mr: MemoryRegion) -> None:
        """Invalidate the rkey at once (the kernel stops placing), then release the memory."""
        key = struct.pack("=I", mr.rkey)
        libbpf.map_delete_raw(self._mrs_fd, key)
        libbpf.map_delete_raw(self._info_fd, key)
        self.mrs.pop(mr.rkey, None)
        mr.buf.release()
        mr._mm.close()
        os.close(mr.fd)

    def counters(self) -> dict:
        """Receive verdicts by reason, and replies sent (`tx_*`), summed over CPUs."""
        rx, tx = self.bpf[b"rx_counters"], self.bpf[b"tx_counters"]
        out = {name: sum(rx[rx.Key(i)]) for i, name in enumerate(RX_REASONS)}
        out.update({f"tx_{name}": sum(tx[tx.Key(i)]) for i, name in enumerate(TX_COUNTERS)})
        return out

    def run(self, packet: bytes, repeat: int = 1) -> tuple[int, bytes, int]:
        return libbpf.prog_test_run(self.prog_fd, packet, repeat)
