"""The `metaroce perf` tests (perftest's ib_*_bw / ib_*_lat family) over metaroce.verbs and
metaroce.cm. Both sides run the same command; the side without an address is the server. The
client drives the test and reports; the server serves (posts receives, answers ping-pongs) until
the client disconnects. Latency loops busy-poll registered memory in C (fastpath/poll.c)."""

from __future__ import annotations

import os
import struct
import time
from dataclasses import dataclass

from .. import cm
from ..errors import MetaroceError
from ..fastpath.xsk import _lib
from ..verbs import (CQ, MR, PD, IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_REMOTE_ATOMIC,
                     IBV_ACCESS_REMOTE_READ, IBV_ACCESS_REMOTE_WRITE, IBV_WC_SUCCESS,
                     IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_WR_RDMA_READ, IBV_WR_RDMA_WRITE,
                     IBV_WR_SEND, Context, QPCap, RecvWR, SendWR, wait_for_completions,
                     wc_status_str)
from . import report

TESTS = ("write-bw", "read-bw", "send-bw", "write-lat", "read-lat", "send-lat", "atomic-lat")
ACCESS = (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
          IBV_ACCESS_REMOTE_ATOMIC)
MAX_BUF = 64 << 20            # registered bytes per side at most
RX_DEPTH = 256                # receives the send-bw server keeps posted
POLL_TIMEOUT_NS = 5_000_000_000
_PRIV = struct.Struct("!QQI")  # addr, length, rkey of the peer's region


@dataclass
class Options:
    test: str
    dev: str
    netns: str | None = None
    address: str | None = None
    size: int = 65536
    iters: int | None = None
    duration: float | None = None
    qps: int = 1
    mode: str | None = None
    integrity: str | None = None    # "icrc": keep the ICRC where both devices take CSUM
    mtu: int | None = None          # the largest path MTU this side offers (perftest's -m)
    all_sizes: bool = False
    port: int = 18515            # perftest's default port (-p), not the CM's
    tx_depth: int = 128
    cpu: int | None = None

    def __post_init__(self):
        if self.test not in TESTS:
            raise MetaroceError(f"unknown perf test {self.test!r} (one of {', '.join(TESTS)})")
        # NaN passes no comparison: `not lo <= x <= hi` refuses it (a NaN -D ran no iteration)
        if self.duration is not None and not 0 < self.duration <= 86400:
            raise MetaroceError(f"duration must be a number of seconds in (0, 86400], "
                                f"not {self.duration!r}")
        for name, lo, hi in (("size", 1, 1 << 30), ("qps", 1, 1024), ("tx_depth", 1, 4096),
                             ("port", 1, 65535)):
            v = getattr(self, name)
            if not isinstance(v, int) or not lo <= v <= hi:
                raise MetaroceError(f"{name} must be an integer from {lo} to {hi}, not {v!r}")
        if self.iters is not None and not (isinstance(self.iters, int) and self.iters >= 1):
            raise MetaroceError(f"iters must be a positive integer, not {self.iters!r}")

    def sizes(self) -> list[int]:
        if self.test == "atomic-lat":
            return [8]
        return [1 << k for k in range(1, 24)] if self.all_sizes else [self.size]

    def iterations(self, size: int) -> int:
        if self.iters:
            return self.iters
        base = 5000 if self.test.endswith("bw") else 1000
        if self.all_sizes:                     # keep -a quick: at most ~256 MiB per size
            return max(16, min(base, (256 << 20) // size))
        return base


def _cpu_now() -> int:
    with open("/proc/self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[36])


class Side:
    """This process's verbs objects: one MR laid out as [send area][receive area]."""

    def __init__(self, o: Options):
        if o.cpu is not None:
            try:
                os.sched_setaffinity(0, {o.cpu})
            except OSError as exc:
                raise MetaroceError(f"cannot pin to CPU {o.cpu}: {exc.strerror}") from None
        self.o = o
        self.ctx = Context(o.dev, o.netns)
        self.dev = self.ctx.query_device()
        self.slots = max(1, min(o.tx_depth, MAX_BUF // 2 // max(o.sizes())))
        self.area = max(o.sizes()) * self.slots
        self.pd = PD(self.ctx)
        self.mr = MR(self.pd, 2 * self.area, ACCESS)
        self.cq = CQ(self.ctx, 65536)
        mod = _lib()
        self.ffi, self.c = mod.ffi, mod.lib
        self.ptr = self.ffi.from_buffer(self.mr.buf)
        self.conns: list[cm.Connection] = []

    def private(self) -> bytes:
        return _PRIV.pack(self.mr.addr + self.area, self.area, self.mr.rkey)

    def info(self) -> dict:
        st = self.ctx.status()
        return {"dev": self.o.dev, "qps": self.o.qps, "tx_depth": self.o.tx_depth,
                "mode": self.conns[0].mode if self.conns else "-",
                "mtu": self.conns[0].remote["mtu"] if self.conns else "-",
                "integrity": self.conns[0].integrity if self.conns else "-",
                "xdp_mode": st["xdp_mode"], "cpus": sorted(os.sched_getaffinity(0)),
                "cpu_last": _cpu_now(), "daemon_pid": st["pid"]}

    def close(self) -> None:
        for c in self.conns:
            c.close()
        self.ffi.release(self.ptr)
        self.mr.close()
        self.ctx.close()


def _busy(fields: list[int]) -> int:
    """Busy ticks of a /proc/stat cpu line: user, nice, system, irq, softirq (guest time is
    inside user already; idle, iowait and steal — time the hypervisor gave to others — are not
    this machine's work)."""
    user, nice, system, _idle, _iowait, irq, softirq = fields[:7]
    return user + nice + system + irq + softirq


def busy_cpu_s() -> float:
    """CPU-seconds the whole machine spent busy so far, steal excluded (the XDP data path
    runs in softirq, charged to no process of ours, so a run's cost is measured machine-wide)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return _busy(v) / os.sysconf("SC_CLK_TCK")


def busy_per_cpu_s() -> list[float]:
    """The same, per CPU (cpu0, cpu1, ...)."""
    out = []
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu") and line[3].isdigit():
                out.append(_busy([int(x) for x in line.split()[1:]]) / os.sysconf("SC_CLK_TCK"))
    return out


def _check(wcs) -> None:
    for w in wcs:
        if w.status != IBV_WC_SUCCESS:
            raise MetaroceError(f"work request {w.wr_id} failed: {wc_status_str(w.status)}")


# ---- server ----------------------------------------------------------------------------------

def serve(o: Options, log=lambda m: None) -> dict:
    s = Side(o)
    try:
        with cm.listen(s.ctx, o.port) as lis:
            log(f"perf: waiting for {o.qps} connection(s) on port {lis.port}")
            for _ in range(o.qps):
                s.conns.append(lis.accept(pd=s.pd, send_cq=s.cq, private_data=s.private(),
                                          cap=QPCap(max_send_wr=4096, max_recv_wr=RX_DEPTH),
                                          timeout_s=120, allow_metaroce=o.mode != "roce",
                                          integrity=o.integrity, mtu=o.mtu))
        info = s.info()
        if o.test == "send-bw":
            _serve_send_bw(s)
        elif o.test in ("write-lat", "send-lat"):
            for size in o.sizes():
                (_pong_write if o.test == "write-lat" else _pong_send)(s, size, o.iterations(size))
        for c in s.conns:                      # passive tests: until the client is done
            c.wait_disconnect(None)
        return {"role": "server", "test": o.test, "connections": len(s.conns), **info}
    finally:
        s.close()


def _serve_send_bw(s: Side) -> None:
    """Keep receives posted on every QP until the client disconnects."""
    posted = {}
    size = max(s.o.sizes())
    for i, c in enumerate(s.conns):
        c.qp.post_recv([RecvWR(wr_id=i << 32 | k, sg_list=[s.mr.sge(s.area, size)])
                        for k in range(RX_DEPTH)])
        posted[c.qp.qp_num] = c
    open_conns = set(posted)
    while open_conns:
        wcs = s.cq.poll(1024)
        if not wcs:
            for c in s.conns:
                if c.qp.qp_num in open_conns and c.wait_disconnect(0):
                    open_conns.discard(c.qp.qp_num)
            if open_conns:
                wait_for_completions([s.cq], 0.001)
            continue
        by_qp: dict[int, int] = {}
        for w in wcs:
            if w.status == IBV_WC_SUCCESS:
                by_qp[w.qp_num] = by_qp.get(w.qp_num, 0) + 1
        for qpn, n in by_qp.items():
            c = posted[qpn]
            if not c.closed:
                c.qp.post_recv([RecvWR(wr_id=k, sg_list=[s.mr.sge(s.area, size)])
                                for k in range(n)])


def _pong_write(s: Side, size: int, iters: int) -> None:
    c = s.conns[0]
    addr, _, rkey = _PRIV.unpack(c.private_data)
    last = s.area + size - 1                       # the byte the client's WRITE ends with
    for i in range(iters):
        mark = i % 255 + 1
        if s.c.mr_poll_byte(s.ptr + last, mark, POLL_TIMEOUT_NS) < 0:
            raise MetaroceError(f"write-lat: no ping {i} within {POLL_TIMEOUT_NS / 1e9} s")
        s.mr.buf[size - 1] = mark
        c.qp.post_send(SendWR(IBV_WR_RDMA_WRITE, wr_id=i, send_flags=0 if i % 64 else 2,
                              sg_list=[s.mr.sge(0, size)], remote_addr=addr, rkey=rkey))
        s.cq.poll(64)


def _pong_send(s: Side, size: int, iters: int) -> None:
    c = s.conns[0]
    c.qp.post_recv(RecvWR(wr_id=0, sg_list=[s.mr.sge(s.area, size)]))
    for i in range(iters):
        while True:
            wcs = s.cq.wait(1, timeout_s=POLL_TIMEOUT_NS / 1e9)
            _check(wcs)
            if wcs[0].opcode.startswith("RECV"):
                break
        c.qp.post_recv(RecvWR(wr_id=i + 1, sg_list=[s.mr.sge(s.area, size)]))
        c.qp.post_send(SendWR(IBV_WR_SEND, wr_id=i, send_flags=0 if i % 64 else 2,
                              sg_list=[s.mr.sge(0, size)]))


# ---- client ----------------------------------------------------------------------------------

SERVER_WAIT_S = 10.0          # a client started with (or just after) its server waits for it


def _connect(s: Side, o: Options, log) -> cm.Connection:
    """Connect to the server, waiting up to SERVER_WAIT_S for it to listen (the two sides are
    started together, as perftest's are, and the server may not have bound its port yet)."""
    deadline = time.monotonic() + SERVER_WAIT_S
    said = False
    while True:
        try:
            return cm.connect(s.ctx, o.address, o.port, pd=s.pd, send_cq=s.cq,
                              cap=QPCap(max_send_wr=4096, max_recv_wr=RX_DEPTH),
                              mode=o.mode, integrity=o.integrity, mtu=o.mtu,
                              private_data=s.private(),
                              timeout_s=10)
        except cm.ConnectionRefused:
            if time.monotonic() >= deadline:
                raise
            if not said:
                log(f"perf: waiting for the server at {o.address} port {o.port}")
                said = True
            time.sleep(0.1)


def run_client(o: Options, log=lambda m: None) -> dict:
    s = Side(o)
    try:
        for _ in range(o.qps):
            s.conns.append(_connect(s, o, log))
        info = s.info()
        results = []
        for size in o.sizes():
            if o.test.endswith("bw"):
                results.append(_bw(s, size))
            else:
                results.append(_lat(s, size))
            log(report.row(o.test, results[-1]))
        return {"role": "client", "test": o.test, **info, "results": results, **results[-1]}
    finally:
        s.close()


def _bw(s: Side, size: int) -> dict:
    o = s.o
    op = {"write-bw": IBV_WR_RDMA_WRITE, "read-bw": IBV_WR_RDMA_READ, "send-bw": IBV_WR_SEND}[o.test]
    iters = o.iterations(size)
    peers = [_PRIV.unpack(c.private_data) for c in s.conns]
    _fits(size, peers[0][1])
    posted = done = 0
    outstanding = [0] * len(s.conns)
    deadline = time.monotonic() + o.duration if o.duration else None
    cpu0 = busy_cpu_s()
    t0 = time.monotonic()
    peak, win_t, win_n = 0.0, t0, 0
    limit = iters * len(s.conns) if not deadline else 1 << 62
    while done < posted or (posted < limit and (deadline is None or time.monotonic() < deadline)):
        for qi, c in enumerate(s.conns):
            batch = []
            while outstanding[qi] < o.tx_depth and posted < limit and \
                    (deadline is None or time.monotonic() < deadline):
                slot = posted % s.slots
                addr, _, rkey = peers[qi]
                src = s.mr.sge((slot * size) % s.area if op != IBV_WR_RDMA_READ else
                               s.area + (slot * size) % s.area, size)
                room = peers[qi][1] // size * size
                batch.append(SendWR(op, wr_id=qi, sg_list=[src],
                                    remote_addr=addr + (slot * size) % room, rkey=rkey))
                outstanding[qi] += 1
                posted += 1
            if batch:
                c.qp.post_send(batch)
        wcs = s.cq.wait(1, timeout_s=30)
        wcs += s.cq.poll(4096)
        _check(wcs)
        for w in wcs:
            outstanding[w.wr_id] -= 1
        done += len(wcs)
        win_n += len(wcs)
        now = time.monotonic()
        if now - win_t >= 0.05:
            peak = max(peak, win_n * size * 8 / (now - win_t))
            win_t, win_n = now, 0
    res = report.bw_result(size, done, time.monotonic() - t0, peak)
    res["cpu_s"] = round(busy_cpu_s() - cpu0, 3)
    moved = size * done
    res["cpu_s_per_gib"] = round(res["cpu_s"] / (moved / (1 << 30)), 3) if moved else None
    return res


def _fits(size: int, peer_len: int) -> None:
    if size > peer_len:
        raise MetaroceError(f"the server registered {peer_len} bytes, less than a {size}-byte "
                            f"message: run both sides with the same -s / -a")


def _lat(s: Side, size: int) -> dict:
    o = s.o
    c = s.conns[0]
    addr, peer_len, rkey = _PRIV.unpack(c.private_data)
    _fits(size, peer_len)
    iters = o.iterations(size)
    samples = []
    now = s.c.mr_now_ns
    if o.test == "write-lat":
        last = s.area + size - 1
        for i in range(iters):
            mark = i % 255 + 1
            s.mr.buf[size - 1] = mark
            t0 = now()
            c.qp.post_send(SendWR(IBV_WR_RDMA_WRITE, wr_id=i, send_flags=0 if i % 64 else 2,
                                  sg_list=[s.mr.sge(0, size)], remote_addr=addr, rkey=rkey))
            if s.c.mr_poll_byte(s.ptr + last, mark, POLL_TIMEOUT_NS) < 0:
                raise MetaroceError(f"write-lat: no pong {i} within {POLL_TIMEOUT_NS / 1e9} s")
            samples.append((now() - t0) / 2000)     # half the round trip, as perftest reports
            s.cq.poll(64)
    elif o.test == "send-lat":
        c.qp.post_recv(RecvWR(wr_id=0, sg_list=[s.mr.sge(s.area, size)]))
        for i in range(iters):
            t0 = now()
            c.qp.post_send(SendWR(IBV_WR_SEND, wr_id=i, send_flags=0 if i % 64 else 2,
                                  sg_list=[s.mr.sge(0, size)]))
            while True:
                wcs = s.cq.wait(1, timeout_s=POLL_TIMEOUT_NS / 1e9)
                _check(wcs)
                if wcs[0].opcode.startswith("RECV"):
                    break
            samples.append((now() - t0) / 2000)
            c.qp.post_recv(RecvWR(wr_id=i + 1, sg_list=[s.mr.sge(s.area, size)]))
    else:                                            # read-lat, atomic-lat: one side, full RTT
        op = IBV_WR_RDMA_READ if o.test == "read-lat" else IBV_WR_ATOMIC_FETCH_AND_ADD
        for i in range(iters):
            t0 = now()
            c.qp.post_send(SendWR(op, wr_id=i, sg_list=[s.mr.sge(s.area, size)],
                                  remote_addr=addr, rkey=rkey, compare_add=1))
            _check(s.cq.wait(1, timeout_s=POLL_TIMEOUT_NS / 1e9))
            samples.append((now() - t0) / 1000)
    return report.lat_result(size, samples)
