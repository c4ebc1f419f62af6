"""Sockets inside a lab's namespaces, for probes, tests and benchmarks."""

from __future__ import annotations

import socket
import struct
import threading
import time
from dataclasses import dataclass, field

from .netdev import in_netns


def udp_socket(netns_name: str, family: int = socket.AF_INET, bind: tuple | None = None,
               rcvbuf: int | None = None) -> socket.socket:
    """A UDP socket that lives in the namespace (sockets keep the namespace they were made in)."""
    with in_netns(netns_name):
        s = socket.socket(family, socket.SOCK_DGRAM)
        if rcvbuf:
            s.setsockopt(socket.SOL_SOCKET, 33, rcvbuf)  # SO_RCVBUFFORCE (root)
        if bind is not None:
            s.bind(bind)
    return s


def tcp_socket(netns_name: str, family: int = socket.AF_INET) -> socket.socket:
    with in_netns(netns_name):
        return socket.socket(family, socket.SOCK_STREAM)


# --- sequenced UDP flows: what the lab tests and benchmarks measure ---------------------

MAGIC = 0x4D52_5345            # "MRSE"
FLUSH = 1 << 63                # sequence numbers at or above this only push held frames out
_HDR = struct.Struct("!IQ")
IP_RECVTOS, IPV6_RECVTCLASS = 13, 66
IP_TOS_CMSG, IPV6_TCLASS_CMSG = 1, 67


@dataclass
class FlowResult:
    sent: int = 0
    received: int = 0            # data frames, duplicates included
    unique: int = 0
    duplicates: int = 0
    late: int = 0                # arrived after a frame with a higher sequence number
    ce: int = 0                  # arrived with ECN CE set
    bytes: int = 0               # UDP payload bytes of data frames
    first_s: float = 0.0
    last_s: float = 0.0
    seen: set = field(default_factory=set, repr=False)

    @property
    def lost(self) -> int:
        return self.sent - self.unique

    @property
    def duration_s(self) -> float:
        return max(self.last_s - self.first_s, 1e-9)


class Receiver(threading.Thread):
    """Counts sequenced frames on a UDP socket until the flush frames arrive or it goes idle."""

    def __init__(self, sock: socket.socket, family: int, idle_s: float = 0.5):
        super().__init__(daemon=True)
        self.sock, self.idle_s, self.result = sock, idle_s, FlowResult()
        self.flushes = 0
        self.want_flushes = None
        if family == socket.AF_INET:
            sock.setsockopt(socket.IPPROTO_IP, IP_RECVTOS, 1)
        else:
            sock.setsockopt(socket.IPPROTO_IPV6, IPV6_RECVTCLASS, 1)
        sock.settimeout(idle_s)
        self.ready = threading.Event()

    def run(self):
        r, top = self.result, -1
        self.ready.set()
        while True:
            try:
                data, anc, _flags, _addr = self.sock.recvmsg(65536, 64)
            except (socket.timeout, OSError):
                return
            if len(data) < _HDR.size:
                continue
            magic, seq = _HDR.unpack_from(data)
            if magic != MAGIC:
                continue
            if seq >= FLUSH:
                self.flushes += 1
                if self.want_flushes is not None and self.flushes >= self.want_flushes:
                    return
                continue
            now = time.monotonic()
            if not r.received:
                r.first_s = now
            r.last_s = now
            r.received += 1
            r.bytes += len(data)
            for level, ctype, cdata in anc:
                if ctype in (IP_TOS_CMSG, IPV6_TCLASS_CMSG) and cdata and (cdata[0] & 3) == 3:
                    r.ce += 1
            if seq in r.seen:
                r.duplicates += 1
                continue
            r.seen.add(seq)
            r.unique += 1
            if seq < top:
                r.late += 1
            top = max(top, seq)


def run_flow(src_ns: str, dst_ns: str, dst_addr: str, count: int, *, family: int = socket.AF_INET,
             port: int = 4791, size: int = 64, sport: int | None = None, tos: int = 0,
             burst: int = 64, gap_s: float = 0.0002, flush: int = 32,
             duration_s: float | None = None) -> FlowResult:
    """Send `count` sequenced datagrams (or as many as fit in duration_s) and count arrivals.
    Bursts of `burst` frames with `gap_s` pauses keep the sender from overrunning queues that
    are not under test; `flush` trailing frames push out anything held by a reorder stash."""
    rx = udp_socket(dst_ns, family, ("", port), rcvbuf=64 << 20)
    tx = udp_socket(src_ns, family, ("", sport) if sport else None)
    if tos:
        if family == socket.AF_INET:
            tx.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
        else:
            tx.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS, tos)
    recv = Receiver(rx, family)
    recv.start()
    recv.ready.wait()
    pad = b"\0" * max(0, size - _HDR.size)
    dest = (dst_addr, port)
    seq = 0
    deadline = time.monotonic() + duration_s if duration_s else None
    try:
        while (seq < count) if deadline is None else (time.monotonic() < deadline):
            try:
                tx.sendto(_HDR.pack(MAGIC, seq) + pad, dest)
            except BlockingIOError:
                continue
            seq += 1
            if burst and seq % burst == 0 and gap_s:
                time.sleep(gap_s)
        time.sleep(0.05)
        recv.want_flushes = flush
        for i in range(flush):
            tx.sendto(_HDR.pack(MAGIC, FLUSH + i) + pad, dest)
            time.sleep(0.001)
        recv.join(timeout=10)
    finally:
        tx.close()
        rx.close()
    recv.result.sent = seq
    return recv.result
