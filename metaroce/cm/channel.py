"""The out-of-band side channel of CM-2: CMETH blocks over TCP (default port 4791, VER-5), each
followed by the application's private data (as RDMA-CM carries it in REQ/REP): the 52-byte
CMETH, a 2-byte big-endian length, then that many bytes (at most MAX_PRIVATE). A message that
does not start with the CMETH magic is not MetaRoCE CM (VER-4); one of another CMETH version is
readable only in its first 12 bytes (VER-2): both surface as :class:`Unreadable`. Sockets are
made in the device's network namespace, so an application can use a lab host's device from
anywhere."""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import time

from pyroute2 import netns as _netns

from ..errors import MetaroceError
from ..wire import consts as C
from ..wire.errors import ParseError
from ..wire.headers import CMETH

MAX_PRIVATE = 192


class CmError(MetaroceError):
    """A connection could not be made or was lost; the message says why."""


class ConnectionRefused(CmError):
    """Nothing listens at the address (yet): a client may try again."""


class Unreadable(CmError):
    """A message this end cannot take: `prefix` holds its version-independent first 12 bytes
    (cm_type, version, reject_reason, txn_id) when it had the magic, else None (VER-2, VER-4)."""

    def __init__(self, message: str, prefix: dict | None):
        super().__init__(message)
        self.prefix = prefix


@contextlib.contextmanager
def in_netns(name: str | None):
    if not name:
        yield
        return
    _netns.pushns(name)
    try:
        yield
    finally:
        _netns.popns()


def tcp_socket(netns: str | None, family: int) -> socket.socket:
    with in_netns(netns):
        return socket.socket(family, socket.SOCK_STREAM)


class Channel:
    """One TCP connection carrying CM messages."""

    def __init__(self, sock: socket.socket, peer: str):
        self.sock, self.peer = sock, peer
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buf = b""

    def send(self, msg: CMETH, private: bytes = b"") -> None:
        if len(private) > MAX_PRIVATE:
            raise CmError(f"private data is at most {MAX_PRIVATE} bytes")
        try:
            self.sock.sendall(msg.pack() + struct.pack("!H", len(private)) + private)
        except OSError as exc:
            raise CmError(f"the connection to {self.peer} was lost ({exc.strerror})") from None

    def _fill(self, n: int, deadline: float | None) -> bool:
        while len(self._buf) < n:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            r, _, _ = select.select([self.sock], [], [], left)    # timeout 0: one look
            if not r:
                return False
            try:
                chunk = self.sock.recv(4096)
            except OSError as exc:
                raise CmError(f"the connection to {self.peer} was lost ({exc.strerror})") from None
            if not chunk:
                raise CmError(f"{self.peer} closed the connection")
            self._buf += chunk
        return True

    def recv(self, timeout_s: float | None) -> tuple[CMETH, bytes] | None:
        """The next message, or None on timeout; a malformed one is a CmError."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        if not self._fill(C.CMETH_LEN + 2, deadline):
            return None
        n = struct.unpack_from("!H", self._buf, C.CMETH_LEN)[0]
        if n > MAX_PRIVATE:
            raise CmError(f"{self.peer} sent {n} bytes of private data (at most {MAX_PRIVATE})")
        if not self._fill(C.CMETH_LEN + 2 + n, deadline):
            return None
        raw, self._buf = self._buf[:C.CMETH_LEN + 2 + n], self._buf[C.CMETH_LEN + 2 + n:]
        try:
            msg = CMETH.parse(raw[:C.CMETH_LEN])
        except ParseError as exc:
            prefix = CMETH.prefix(raw)
            what = "not a MetaRoCE CM message (no CMETH magic)" if prefix is None else \
                f"an invalid CM message: {exc}"
            raise Unreadable(f"{self.peer} sent {what}", prefix) from None
        return msg, raw[C.CMETH_LEN + 2:]

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
