"""The daemon's side of an application's control connection. The socket is non-blocking and
what the daemon sends (replies, completions, async events, MR fds) waits in a bounded output
queue until the socket takes it, so one application that stops reading cannot stall the loop
that serves every other one: a connection whose queue would pass MAX_OUTPUT_BYTES is cut off
(closed and reclaimed exactly as if the application had exited)."""

from __future__ import annotations

import array
import os
import socket
import struct
from collections import deque

# Bytes the daemon holds for one connection beyond what its socket buffer took (about 200 KiB):
# some 40,000 completions. An application reads them whenever it calls the library (any
# request, poll or wait); its CQs' cqe bound how many can be pending, this bounds the rest.
MAX_OUTPUT_BYTES = 4 << 20
MAX_REQUEST_BYTES = 16 << 20     # one request line at most


class OutputQueue:
    """Messages for a non-blocking stream socket, in order, at most `limit` bytes. A message's
    fds (SCM_RIGHTS) go with its first byte; the queue keeps its own duplicates of them, so a
    region deregistered meanwhile cannot send another descriptor in its place."""

    def __init__(self, limit: int = MAX_OUTPUT_BYTES):
        self.limit = limit
        self.nbytes = 0
        self._q: deque[list] = deque()            # [memoryview still to send, fds]

    def __len__(self) -> int:
        return len(self._q)

    def push(self, data: bytes, fds=()) -> bool:
        """Queue one message; False (and nothing queued) if the queue would then hold more
        than the bound."""
        if self.nbytes + len(data) > self.limit:
            return False
        self._q.append([memoryview(data), [os.dup(fd) for fd in fds]])
        self.nbytes += len(data)
        return True

    def flush(self, sock: socket.socket) -> None:
        """Send what the socket takes now; raises OSError when the peer is gone."""
        while self._q:
            ent = self._q[0]
            data, fds = ent
            try:
                if fds:
                    n = sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                               array.array("i", fds))])
                    _close_all(fds)
                    ent[1] = []
                else:
                    n = sock.send(data)
            except (BlockingIOError, InterruptedError):
                return
            self.nbytes -= n
            if n < len(data):
                ent[0] = data[n:]
                return                              # the socket is full
            self._q.popleft()

    def clear(self) -> None:
        for _, fds in self._q:
            _close_all(fds)
        self._q.clear()
        self.nbytes = 0


def _close_all(fds) -> None:
    for fd in fds:
        os.close(fd)


class Connection:
    """One application's connection; it owns what the application creates on the device."""

    def __init__(self, sock: socket.socket, limit: int = MAX_OUTPUT_BYTES):
        sock.setblocking(False)
        self.sock = sock
        self.inbuf = b""
        self.out = OutputQueue(limit)
        self.closed = False
        try:
            self.pid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                           struct.calcsize("3i")))[0]
        except OSError:
            self.pid = 0

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, data: bytes, fds=()) -> bool:
        """Send now what the socket takes, queue the rest; False when the output bound is
        exceeded (the caller cuts the connection off). A peer that is gone raises OSError."""
        self.out.flush(self.sock)
        if not self.out.push(data, fds):
            return False
        self.out.flush(self.sock)
        return True

    def lines(self, chunk: bytes):
        """The complete request lines that chunk finishes (the rest waits for more)."""
        self.inbuf += chunk
        *done, self.inbuf = self.inbuf.split(b"\n")
        return done

    def close(self) -> None:
        self.closed = True
        self.out.clear()
        self.sock.close()
