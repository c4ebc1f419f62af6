"""Python face of the AF_XDP transmit helper: open a socket on a device (in a namespace),
send batches of ready-made frames, read its counters. One call per batch, never per frame."""

from __future__ import annotations

import os

from ..errors import MetaroceError

XDP_COPY, XDP_ZEROCOPY, XDP_USE_NEED_WAKEUP, XDP_USE_SG = 1 << 1, 1 << 2, 1 << 3, 1 << 4
XSK_STATS = ("tx_queued", "tx_completed", "kicks", "kick_busy", "kick_deferred", "tx_ring_full",
             "tx_bytes", "tx_multi", "tx_refused", "kern_tx_invalid_descs",
             "kern_tx_ring_empty_descs")


def _lib():
    try:
        from . import _xsk  # noqa: PLC0415
    except ImportError as exc:
        raise MetaroceError("the fast-path helper is not built: run sudo make setup "
                            "(it builds metaroce/fastpath/_xsk with cffi)") from exc
    return _xsk


class XskSocket:
    """An AF_XDP socket with a private UMEM bound to one queue of a device. nframes UMEM slots
    of frame_size-byte chunks (one chunk each, two with XDP_USE_SG), ring_size frames on the
    TX ring. With XDP_USE_SG in bind_flags (the default) a frame may be up to frame_cap bytes
    and leaves as one descriptor per chunk; a kernel that refuses SG gives a socket without it
    (sg is False, frame_cap the chunk)."""

    def __init__(self, ifindex: int, queue: int = 0, *, nframes: int = 4096, frame_size: int = 4096,
                 ring_size: int = 2048, bind_flags: int = XDP_COPY | XDP_USE_SG,
                 tx_budget: int = 512):
        mod = _lib()
        self._ffi, self._c = mod.ffi, mod.lib
        err = self._ffi.new("int *")
        self._x = self._c.mr_xsk_open(ifindex, queue, nframes, frame_size, ring_size, bind_flags,
                                      tx_budget, err)
        if self._x == self._ffi.NULL:
            raise MetaroceError(f"AF_XDP socket on ifindex {ifindex} queue {queue}: "
                                f"{os.strerror(err[0])}")
        self.frame_size = frame_size
        self.sg = bool(self._c.mr_xsk_sg(self._x))
        self.frame_cap = int(self._c.mr_xsk_frame_cap(self._x))

    def close(self) -> None:
        if self._x is not None:
            self._c.mr_xsk_close(self._x)
            self._x = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def send(self, frames: list[bytes]) -> int:
        """Queue a batch of frames (each 1 .. frame_cap bytes); returns how many the rings
        accepted (fewer when they are full, or at the first frame no slot can hold)."""
        lens = self._ffi.new("uint32_t[]", [len(f) for f in frames])
        data = b"".join(frames)
        return self._c.mr_xsk_send(self._x, data, lens, len(frames))

    def flow(self, *, dmac: str, smac: str, src_ip: str, dst_ip: str, dqpn: int, sport: int,
             tos: int = 26 << 2 | 2, ttl: int = 64, pkey: int = 0xFFFF,
             sports: list[int] | None = None):
        """Header template of one QP's packets (DSCP 26 / ECT(0) by default). sports: one
        source port per path (MetaRoCE multipath, at most 8): packets are sprayed over them."""
        import ipaddress  # noqa: PLC0415
        f = self._ffi.new("struct mr_roce_flow *")
        f.dmac = bytes.fromhex(dmac.replace(":", ""))
        f.smac = bytes.fromhex(smac.replace(":", ""))
        src, dst = ipaddress.ip_address(src_ip), ipaddress.ip_address(dst_ip)
        f.ipv6 = int(src.version == 6)
        f.src_ip = src.packed.ljust(16, b"\0")
        f.dst_ip = dst.packed.ljust(16, b"\0")
        f.tos, f.ttl, f.sport, f.pkey, f.dqpn = tos, ttl, sport, pkey, dqpn
        if sports:
            if len(sports) > len(f.sports):
                raise MetaroceError(f"at most {len(f.sports)} paths per flow")
            f.npaths = len(sports)
            for i, port in enumerate(sports):
                f.sports[i] = port
        return f

    def send_write(self, flow, data, *, pmtu: int, psn0: int, va: int, rkey: int) -> int:
        """Send one RDMA WRITE (segmented, checksummed and ICRC'd in C, one call per batch).
        Returns the number of packets."""
        buf = self._ffi.from_buffer(data)
        off = self._ffi.new("uint64_t *", 0)
        packets = 0
        total = max(1, -(-len(data) // pmtu))
        while packets < total:
            n = self._c.mr_send_write(self._x, flow, buf, len(data), pmtu, psn0, va, rkey, off)
            if not n:
                if self._c.mr_xsk_poll_tx(self._x) == 0 and not self._c.mr_xsk_tx_room(self._x):
                    raise MetaroceError(f"PMTU {pmtu} does not fit a {self.frame_cap}-byte frame")
                continue                              # rings full: completions are draining
            packets += n
        return packets

    def in_flight(self) -> int:
        """Frames queued whose descriptors have not all completed (reaps completions first)."""
        return self._c.mr_xsk_poll_tx(self._x)

    def tx_room(self) -> int:
        """Frames of any length up to frame_cap that can be queued now."""
        return self._c.mr_xsk_tx_room(self._x)

    def stats(self) -> dict:
        st = self._ffi.new("struct mr_xsk_stats *")
        self._c.mr_xsk_get_stats(self._x, st)
        return {k: getattr(st, k) for k in XSK_STATS}
