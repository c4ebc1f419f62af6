"""The AF_XDP transmit helper (cffi): batches of frames leave h1 through a real AF_XDP socket
(copy mode on veth) and arrive intact at h2's UDP socket, in order. At MTU 9000 a frame longer
than one 4 KiB UMEM chunk leaves as several descriptors (XDP_USE_SG) and arrives whole through
the lab's frags-aware XDP ports. Every wait is bounded: a descriptor the kernel refused never
completes, so an unbounded `while in_flight()` would hang instead of failing."""

import socket
import time

import pytest
from pyroute2 import IPRoute
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from metaroce.errors import MetaroceError
from metaroce.fastpath.xsk import XDP_COPY, XskSocket
from metaroce.lab import core, netdev
from metaroce.lab.traffic import udp_socket

N = 5000
HDRS = 14 + 20 + 8                     # Ethernet, IPv4, UDP
DEADLINE_S = 20.0


def send_all(xs: XskSocket, frames: list[bytes], batch: int = 256) -> None:
    """Queue every frame, retrying while the rings are full; fails (with the counters) if no
    frame could be queued for DEADLINE_S."""
    sent, stuck_since = 0, time.monotonic()
    while sent < len(frames):
        n = xs.send(frames[sent:sent + batch])
        if n:
            sent, stuck_since = sent + n, time.monotonic()
        elif time.monotonic() - stuck_since > DEADLINE_S:
            pytest.fail(f"{sent} of {len(frames)} frames queued, then none for {DEADLINE_S} s "
                        f"(frame {len(frames[sent])} bytes, cap {xs.frame_cap}, "
                        f"in flight {xs.in_flight()}): {xs.stats()}")


def drain(xs: XskSocket) -> dict:
    """Wait (bounded) until every queued frame completed; the socket's counters."""
    deadline = time.monotonic() + DEADLINE_S
    while (left := xs.in_flight()) and time.monotonic() < deadline:
        time.sleep(0.0005)
    st = xs.stats()
    assert left == 0, f"{left} frames never completed within {DEADLINE_S} s: {st}"
    return st


def receive(rx: socket.socket, n: int) -> list[bytes]:
    out = []
    try:
        while len(out) < n:
            out.append(rx.recv(16384))
    except socket.timeout:
        pass
    return out


def udp_frames(a, b, payloads: list[bytes]) -> list[bytes]:
    return [bytes(Ether(src=a.mac, dst=b.mac) / IP(src="10.0.0.1", dst="10.0.0.2") /
                  UDP(sport=50000, dport=4791) / p) for p in payloads]


def payload(seq: int, frame_len: int) -> bytes:
    """A UDP payload that makes a frame_len-byte frame: its sequence number, then bytes that
    depend on it and on their position (a misplaced or lost chunk shows)."""
    body = bytes((seq * 7 + i * 13) & 0xFF for i in range(frame_len - HDRS - 4))
    return seq.to_bytes(4, "big") + body


def test_af_xdp_batches_reach_the_peer(lab_name):
    core.up(lab_name, "pair")
    view = core.LabView(lab_name)
    h1, h2 = view.plan.node("h1"), view.plan.node("h2")
    a, b = h1.iface("eth0"), h2.iface("eth0")
    rx = udp_socket(h2.netns, bind=("", 4791), rcvbuf=64 << 20)
    rx.settimeout(1.0)
    frames = udp_frames(a, b, [i.to_bytes(4, "big") + bytes(1000) for i in range(N)])
    with netdev.in_netns(h1.netns):
        xs = XskSocket(view.ports[("h1", "eth0")])
    try:
        send_all(xs, frames)
        st = drain(xs)
    finally:
        xs.close()
    assert st["tx_queued"] == st["tx_completed"] == N and st["tx_multi"] == 0
    assert st["kicks"] < N / 10, "must be batched: one kick per batch, not per frame"
    got = receive(rx, N)
    assert all(len(d) == 1004 for d in got)
    assert [int.from_bytes(d[:4], "big") for d in got] == list(range(N))


@pytest.fixture(scope="module")
def jumbo(module_lab_name):
    core.up(module_lab_name, "pair", mtu=9000)
    view = core.LabView(module_lab_name)
    h1, h2 = view.plan.node("h1"), view.plan.node("h2")
    return view, h1, h2


def _open(view, h1, **kw) -> XskSocket:
    """A socket on h1's eth0. The kernel lets go of a closed socket's queue binding in deferred
    work (~30 ms here, up to 76 ms seen): until then a bind there is EBUSY, so the tests that
    follow each other on one lab retry for a bounded time."""
    deadline = time.monotonic() + 5.0
    while True:
        try:
            with netdev.in_netns(h1.netns):
                return XskSocket(view.ports[("h1", "eth0")], **kw)
        except MetaroceError as exc:
            if "busy" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.005)


def test_multi_buffer_frames_reach_the_peer_whole(jumbo):
    """Frames of one chunk, of a chunk and a byte, of a 4 KiB RoCE payload with its headers,
    and the largest the socket takes (two chunks), mixed with small ones: all arrive whole,
    byte-exact and in order, and every slot comes back (all of its descriptors completed)."""
    view, h1, h2 = jumbo
    a, b = h1.iface("eth0"), h2.iface("eth0")
    xs = _open(view, h1)
    try:
        assert xs.sg and xs.frame_cap == 8192, (xs.sg, xs.frame_cap)
        sizes = [64, 4096, 4097, 4096 + 160, 1500, xs.frame_cap, 8000, 200]
        lens = [sizes[i % len(sizes)] for i in range(4000)]
        rx = udp_socket(h2.netns, bind=("", 4791), rcvbuf=256 << 20)
        rx.settimeout(1.0)
        frames = udp_frames(a, b, [payload(i, n) for i, n in enumerate(lens)])
        assert [len(f) for f in frames] == lens
        send_all(xs, frames)
        st = drain(xs)
    finally:
        xs.close()
    multi = sum(n > 4096 for n in lens)
    assert st["tx_queued"] == st["tx_completed"] == len(lens), st
    assert st["tx_multi"] == multi and st["kern_tx_invalid_descs"] == 0, st
    assert st["tx_bytes"] == sum(lens), st
    got = receive(rx, len(lens))
    rx.close()
    assert len(got) == len(lens), f"{len(got)} of {len(lens)} datagrams arrived"
    for i, (d, n) in enumerate(zip(got, lens)):
        assert d == payload(i, n), f"datagram {i} ({n}-byte frame) differs"


def test_largest_frames_in_a_long_run_free_every_slot(jumbo):
    """More frames of two chunks than the UMEM has slots (and the completion ring entries,
    per descriptor): slots are reused only once both descriptors completed."""
    view, h1, h2 = jumbo
    a, b = h1.iface("eth0"), h2.iface("eth0")
    xs = _open(view, h1, nframes=256, ring_size=128)
    n = 3000
    try:
        frames = udp_frames(a, b, [payload(i % 251, xs.frame_cap) for i in range(n)])
        send_all(xs, frames, batch=64)
        st = drain(xs)
        assert xs.tx_room() == 128
    finally:
        xs.close()
    assert st["tx_queued"] == st["tx_completed"] == st["tx_multi"] == n, st
    assert st["kern_tx_invalid_descs"] == 0, st


def test_room_counts_a_frame_at_its_longest_only_once(lab_name):
    """With the device down nothing is consumed, so the rings' accounting shows: room for
    ring_size frames of any length (a large frame takes two descriptors, a small one one), and
    no frame is queued beyond it."""
    core.up(lab_name, "pair", mtu=9000)
    view = core.LabView(lab_name)
    h1, h2 = view.plan.node("h1"), view.plan.node("h2")
    a, b = h1.iface("eth0"), h2.iface("eth0")
    big = udp_frames(a, b, [payload(1, 8192)])[0]
    small = udp_frames(a, b, [payload(2, 100)])[0]
    with IPRoute(netns=h1.netns) as ipr:
        ipr.link("set", index=view.ports[("h1", "eth0")], state="down")
    xs = _open(view, h1, nframes=64, ring_size=16)
    try:
        assert xs.tx_room() == 16
        assert xs.send([small] * 10) == 10                 # 10 descriptors of 32
        assert xs.tx_room() == 11                          # 22 free: 11 frames at their longest
        assert xs.send([big] * 12) == 11                   # the 12th has no room
        assert xs.tx_room() == 0 and xs.send([small]) == 0
        st = xs.stats()
        assert st["tx_queued"] == 21 and st["tx_multi"] == 11 and st["tx_ring_full"] == 2, st
        assert st["tx_refused"] == 0, st
        assert xs.in_flight() == 21
    finally:
        xs.close()


def test_without_sg_a_frame_is_one_chunk(jumbo):
    """A socket bound without XDP_USE_SG (as on a kernel that refuses it): frames up to a
    chunk, a longer one is refused before it reaches the ring (never a descriptor the kernel
    would drop without completing)."""
    view, h1, h2 = jumbo
    a, b = h1.iface("eth0"), h2.iface("eth0")
    xs = _open(view, h1, bind_flags=XDP_COPY)
    try:
        assert not xs.sg and xs.frame_cap == 4096
        ok, too_long = udp_frames(a, b, [payload(1, 4096), payload(2, 4097)])
        assert xs.send([too_long]) == 0
        send_all(xs, [ok] * 100)
        st = drain(xs)
    finally:
        xs.close()
    assert st["tx_queued"] == st["tx_completed"] == 100 and st["tx_multi"] == 0, st
    assert st["tx_refused"] == 1 and st["kern_tx_invalid_descs"] == 0, st


def test_bad_device_is_a_clear_error():
    with pytest.raises(MetaroceError, match="AF_XDP socket on ifindex 999999"):
        XskSocket(999999)
