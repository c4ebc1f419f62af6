"""Our side of the stock rdma-core tools' connection exchanges, so that a MetaRoCE device talks
to ``ibv_rc_pingpong`` and perftest's ``ib_write_bw`` / ``ib_read_bw`` / ``ib_atomic_bw`` on
another machine (the rxe guest) exactly as a second copy of those tools would.

- ibv_rc_pingpong (TCP 18515): each side sends ``"%04x:%06x:%06x:%s\\0"`` (LID, QPN, PSN, GID as
  32 hex digits of its 16 bytes); the client writes first, the server answers, the client then
  sends ``"done\\0"``. Each side then posts receives and SENDs ``size`` bytes ``iters`` times in
  turn; both use one buffer for sending and receiving, so the server echoes what it got. With
  ``-c`` the server checks the first byte of every page is 0 at the end.
- perftest (TCP 18515, Ethernet exchange, one RC QP, not duplex): fixed-size blocks, the client
  writing first in each step: the version string (16 bytes), cycle buffer and cache line size
  (4 bytes each, big-endian), the active MTU as ``"%d"`` of the enum (2 bytes), the QP keys
  (108 bytes, ``KEY_PRINT_FMT_GID``), the same keys twice more (printed, then after RTR), and
  after the run a handshake, the bandwidth reports (five 8-byte fields) and a last handshake
  plus ``"done\\0"`` from each side.

The data is checked where the tools leave it checkable: pingpong's echo exactly (our client
sends a fresh pattern each round and must get it back; our server checks rxe's buffer contents);
perftest fills its buffers with rand() and checks nothing, so a perftest run proves the exchange
and every completion; the verified transfers are ``rxe_verbs`` (pyverbs in the guest).
"""

from __future__ import annotations

import ipaddress
import socket
import struct
import time
from dataclasses import dataclass

from ..errors import MetaroceError

PORT = 18515
PERFTEST_VERSION = b"6.06"        # what bookworm's perftest reports; >= 5.70 is required by it
MTU_ENUM = {256: 1, 512: 2, 1024: 3, 2048: 4, 4096: 5}
PP_MSG = 52                        # sizeof "0000:000000:000000:" + 32 hex digits + NUL
KEY_MSG = 108                      # perftest KEY_MSG_SIZE_GID


class InteropError(MetaroceError):
    """The peer tool broke its exchange or a transfer failed."""


def gid_of(ip: str) -> bytes:
    a = ipaddress.ip_address(ip)
    return (ipaddress.IPv6Address(f"::ffff:{a}") if a.version == 4 else a).packed


def ip_of_gid(raw: bytes) -> str:
    a = ipaddress.IPv6Address(raw)
    return str(a.ipv4_mapped or a)


# ---- a TCP side channel inside a network namespace ----------------------------------------

class Channel:
    def __init__(self, sock: socket.socket):
        self.sock = sock

    @classmethod
    def connect(cls, netns: str | None, ip: str, port: int = PORT, timeout: float = 60.0):
        """Connect, retrying while the peer tool is still starting up."""
        from ..lab import netdev  # noqa: PLC0415
        deadline = time.monotonic() + timeout
        while True:
            with netdev.in_netns(netns) if netns else _null():
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.settimeout(5.0)
            try:
                s.connect((ip, port))
                s.settimeout(timeout)
                return cls(s)
            except OSError as exc:
                s.close()
                if time.monotonic() > deadline:
                    raise InteropError(f"cannot reach {ip}:{port}: {exc}") from None
                time.sleep(0.2)

    @classmethod
    def accept(cls, netns: str | None, port: int = PORT, timeout: float = 60.0):
        from ..lab import netdev  # noqa: PLC0415
        with netdev.in_netns(netns) if netns else _null():
            ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind(("0.0.0.0", port))
        ls.listen(1)
        ls.settimeout(timeout)
        try:
            s, _ = ls.accept()
        except socket.timeout:
            raise InteropError(f"no client connected to port {port} in {timeout:.0f} s") from None
        finally:
            ls.close()
        s.settimeout(timeout)
        return cls(s)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            try:
                chunk = self.sock.recv(n - len(out))
            except socket.timeout:
                raise InteropError(f"the peer sent {len(out)} of {n} bytes") from None
            if not chunk:
                raise InteropError(f"the peer closed the exchange ({len(out)} of {n} bytes)")
            out += chunk
        return out

    def swap(self, mine: bytes, size: int, client: bool) -> bytes:
        """One ordered exchange step: the client writes first, the server reads first."""
        if client:
            self.send(mine)
            return self.recv(size)
        theirs = self.recv(size)
        self.send(mine)
        return theirs

    def close(self) -> None:
        self.sock.close()


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


# ---- our verbs endpoint -------------------------------------------------------------------

@dataclass
class Ours:
    """A PD, an MR, a CQ and an RC QP on our device (compat mode)."""
    ctx: object
    ip: str                        # our device's address
    mr_bytes: int
    access: int = 15

    def __post_init__(self):
        from ..verbs import CQ, MR, PD, QP, QPCap, QPInitAttr  # noqa: PLC0415
        self.pd = PD(self.ctx)
        self.mr = MR(self.pd, self.mr_bytes, self.access)
        self.cq = CQ(self.ctx, 4096)
        self.qp = QP(self.pd, QPInitAttr(self.cq, self.cq, cap=QPCap(max_send_wr=1024,
                                                                     max_recv_wr=1024)))

    def connect(self, qpn: int, psn: int, ip: str, mtu: int) -> None:
        self.qp.connect({"qpn": qpn, "psn": psn, "ip": ip, "mtu": mtu, "mode": "roce"},
                        timeout=14, retry_cnt=7, rnr_retry=7)

    def wait(self, n: int = 1, timeout: float = 60.0) -> list:
        wcs = self.cq.wait(n, timeout)
        bad = [w for w in wcs if w.status != 0]
        if bad:
            from ..verbs import wc_status_str  # noqa: PLC0415
            raise InteropError(f"completion error: {wc_status_str(bad[0].status)} "
                               f"(wr_id {bad[0].wr_id}, {bad[0].opcode})")
        return wcs

    def close(self) -> None:
        for o in (self.qp, self.cq, self.mr, self.pd):
            try:
                o.close()
            except Exception:  # noqa: BLE001
                pass


# ---- ibv_rc_pingpong ----------------------------------------------------------------------

def _pp_msg(qpn: int, psn: int, ip: str) -> bytes:
    return f"0000:{qpn:06x}:{psn:06x}:{gid_of(ip).hex()}".encode() + b"\0"


def _pp_parse(msg: bytes) -> tuple[int, int, str]:
    try:
        _, qpn, psn, gid = msg.rstrip(b"\0").decode().split(":")
        return int(qpn, 16), int(psn, 16), ip_of_gid(bytes.fromhex(gid))
    except ValueError:
        raise InteropError(f"ibv_rc_pingpong sent an unreadable address {msg!r}") from None


PAGE = 4096


def pp_pattern(size: int, round_: int) -> bytes:
    """A fresh message per round whose first byte of every page is 0 (what pingpong's -c checks)."""
    b = bytearray((i * 31 + round_ * 7 + 1) & 0xFF or 1 for i in range(size))
    for i in range(0, size, PAGE):
        b[i] = 0
    return bytes(b)


def pp_rxe_buffer(size: int) -> bytes:
    """ibv_rc_pingpong's client buffer: 0x7b bytes, the first of each page 0 (with -c)."""
    b = bytearray(b"\x7b" * size)
    for i in range(0, size, PAGE):
        b[i] = 0
    return bytes(b)


def pingpong(ctx, netns: str, our_ip: str, role: str, peer_ip: str, size: int = 4096,
             iters: int = 50, mtu: int = 1024, port: int = PORT, timeout: float = 120.0) -> dict:
    """Our side of ibv_rc_pingpong: role "client" (the guest runs the server) or "server".
    Returns the rounds done and the bytes checked."""
    from ..verbs import IBV_WR_SEND, RecvWR, SendWR  # noqa: PLC0415
    me = Ours(ctx, our_ip, 2 * size)
    t0 = time.monotonic()
    try:
        rx = me.mr.sge(size, size)
        me.qp.post_recv([RecvWR(wr_id=1000 + i, sg_list=[rx]) for i in range(min(iters, 500))])
        mine = _pp_msg(me.qp.qp_num, me.qp.psn, our_ip)
        if role == "client":
            ch = Channel.connect(netns, peer_ip, port, timeout)
            ch.send(mine)
            rqpn, rpsn, rip = _pp_parse(ch.recv(PP_MSG))
            me.connect(rqpn, rpsn, rip, mtu)
            ch.send(b"done\0")
        else:
            ch = Channel.accept(netns, port, timeout)
            rqpn, rpsn, rip = _pp_parse(ch.recv(PP_MSG))
            me.connect(rqpn, rpsn, rip, mtu)
            ch.send(mine)
            if ch.recv(5) != b"done\0":
                raise InteropError("ibv_rc_pingpong did not confirm the exchange")
        posted, checked = min(iters, 500), 0
        want_from_rxe = pp_rxe_buffer(size)
        for r in range(iters):
            if role == "client":
                data = pp_pattern(size, r)
                me.mr.write(data, 0)
                me.qp.post_send(SendWR(IBV_WR_SEND, wr_id=r, sg_list=[me.mr.sge(0, size)]))
                wcs = me.wait(2, timeout)
                got = me.mr.read(size, size)
                if got != data:
                    raise InteropError(f"round {r}: the echo differs from what we sent")
            else:
                wcs = me.wait(1, timeout)
                got = me.mr.read(size, size)
                if got != want_from_rxe:
                    raise InteropError(f"round {r}: received data differs from "
                                       f"ibv_rc_pingpong's buffer")
                me.mr.write(got, 0)
                me.qp.post_send(SendWR(IBV_WR_SEND, wr_id=r, sg_list=[me.mr.sge(0, size)]))
                wcs += me.wait(1, timeout)
            checked += size
            recvs = sum(1 for w in wcs if w.opcode.startswith("RECV"))
            if posted < iters and recvs:
                more = min(recvs, iters - posted)
                me.qp.post_recv([RecvWR(wr_id=1000 + posted + i, sg_list=[rx])
                                 for i in range(more)])
                posted += more
        ch.close()
    finally:
        me.close()
    return {"rounds": iters, "bytes_checked": checked, "seconds": round(time.monotonic() - t0, 3)}


# ---- perftest -----------------------------------------------------------------------------

def _key_msg(qpn: int, psn: int, rkey: int, vaddr: int, ip: str, out_reads: int) -> bytes:
    g = ":".join(f"{b:02x}" for b in gid_of(ip))
    return f"{0:04x}:{out_reads:04x}:{qpn:06x}:{psn:06x}:{rkey:08x}:{vaddr:016x}:{g}:{0:08x}:".encode() \
        .ljust(KEY_MSG, b"\0")


def _key_parse(msg: bytes) -> dict:
    try:
        f = msg.rstrip(b"\0").decode().split(":")
        gid = bytes(int(x, 16) for x in f[6:22])
        return {"out_reads": int(f[1], 16), "qpn": int(f[2], 16), "psn": int(f[3], 16),
                "rkey": int(f[4], 16), "vaddr": int(f[5], 16), "ip": ip_of_gid(gid)}
    except (ValueError, IndexError):
        raise InteropError(f"perftest sent unreadable keys {msg[:60]!r}") from None


def _version(raw: bytes) -> float:
    try:
        return float(raw.split(b"\0")[0].decode())
    except ValueError:
        raise InteropError(f"perftest sent an unreadable version {raw!r}") from None


def perftest(ctx, netns: str, our_ip: str, test: str, role: str, peer_ip: str,
             size: int = 65536, iters: int = 200, mtu: int = 1024, port: int = PORT,
             timeout: float = 300.0, tx_depth: int = 16) -> dict:
    """Our side of ib_write_bw / ib_read_bw / ib_atomic_bw (test "write" | "read" | "atomic").
    role "server": rxe runs the client and drives the operations into our memory; "client":
    we drive them into rxe's memory (the guest runs the server). Returns what ran."""
    from ..verbs import (IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_WR_RDMA_READ,  # noqa: PLC0415
                         IBV_WR_RDMA_WRITE, SendWR)
    if test not in ("write", "read", "atomic"):
        raise InteropError(f"unknown perftest test {test!r}")
    client = role == "client"
    size = 8 if test == "atomic" else size
    me = Ours(ctx, our_ip, max(1 << 22, 4 * size))
    t0 = time.monotonic()
    try:
        ch = Channel.connect(netns, peer_ip, port, timeout) if client else \
            Channel.accept(netns, port, timeout)
        rv = _version(ch.swap(PERFTEST_VERSION.ljust(16, b"\0"), 16, client))
        if rv < 5.70:
            raise InteropError(f"perftest {rv} is older than 5.70 (its own minimum)")
        rcycle = struct.unpack("!i", ch.swap(struct.pack("!i", PAGE), 4, client))[0]
        ch.swap(struct.pack("!i", 64), 4, client)                       # cache line size
        rmtu = int(ch.swap(str(MTU_ENUM[mtu]).encode()[:1] + b"\0", 2, client)[:1] or b"3")
        path_mtu = min(mtu, 128 << rmtu)
        mine = _key_msg(me.qp.qp_num, me.qp.psn, me.mr.rkey, me.mr.addr, our_ip, 16)
        rem = _key_parse(ch.swap(mine, KEY_MSG, client))
        me.connect(rem["qpn"], rem["psn"], rem["ip"], path_mtu)
        ch.swap(mine, KEY_MSG, client)                                  # keys printed
        ch.swap(mine, KEY_MSG, client)                                  # after RTR
        done = 0
        if client:
            op = {"write": IBV_WR_RDMA_WRITE, "read": IBV_WR_RDMA_READ,
                  "atomic": IBV_WR_ATOMIC_FETCH_AND_ADD}[test]
            cycle = max(rcycle, PAGE, size)
            outstanding = 0
            while done < iters:
                while outstanding < tx_depth and done + outstanding < iters:
                    k = done + outstanding
                    off = (k * size) % cycle if size <= cycle else 0
                    me.qp.post_send(SendWR(op, wr_id=k, sg_list=[me.mr.sge(off, size)],
                                           remote_addr=rem["vaddr"] + off, rkey=rem["rkey"],
                                           compare_add=1))
                    outstanding += 1
                n = len(me.wait(1, timeout))
                done += n
                outstanding -= n
        ch.swap(mine, KEY_MSG, client)                                  # end of the run
        secs = time.monotonic() - t0
        for v in (struct.pack("!Q", size), struct.pack("!Q", done)):
            ch.swap(v, 8, client)
        for _ in range(3):                                              # peak, avg, msg rate
            ch.swap(struct.pack("!d", 0.0), 8, client)
        ch.swap(mine, KEY_MSG, client)                                  # close: handshake
        ch.send(b"done\0")
        ch.recv(5)               # theirs: closing with it unread would reset the connection
        ch.close()
    finally:
        me.close()
    return {"test": test, "role": role, "size": size, "iters": done if client else iters,
            "path_mtu": path_mtu, "peer_version": rv, "seconds": round(secs, 3)}
