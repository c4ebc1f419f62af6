"""The daemon's per-connection output queue on real Unix stream sockets (socketpair): nothing
blocks, order is kept across partial sends, the byte bound holds, fds travel with the first
byte of their message, and a queued message keeps its own copy of them."""

import array
import os
import socket

import pytest

from metaroce.nic.clients import MAX_OUTPUT_BYTES, Connection, OutputQueue


def _pair():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    a.setblocking(False)
    return a, b


def _drain(sock, want: int) -> bytes:
    got = b""
    while len(got) < want:
        got += sock.recv(1 << 20)
    return got


def test_the_socket_takes_what_it_can_the_rest_waits_in_order():
    a, b = _pair()
    q = OutputQueue(limit=64 << 20)
    msgs = [(f"{i:08d}".encode() * 1024) for i in range(400)]        # 8 KiB each, 3.2 MiB
    for m in msgs:
        assert q.push(m)
        q.flush(a)                     # never blocks, although nobody reads yet
    assert len(q) > 0 and 0 < q.nbytes < sum(map(len, msgs))          # the socket is full
    got = b""
    while len(q):
        got += b.recv(1 << 20)
        q.flush(a)
    got += _drain(b, sum(map(len, msgs)) - len(got))
    assert got == b"".join(msgs) and q.nbytes == 0


def test_the_bound_counts_what_is_queued():
    a, b = _pair()
    q = OutputQueue(limit=1 << 20)
    n = 0
    while q.push(b"x" * 4096):
        q.flush(a)
        n += 1
    assert q.nbytes <= 1 << 20 < q.nbytes + 4096
    assert n * 4096 > 1 << 20           # the socket buffer took some before the queue filled
    pending = q.nbytes
    assert not q.push(b"y")             # refused, and nothing of it was queued
    assert q.nbytes == pending
    assert MAX_OUTPUT_BYTES >= 1 << 20


def test_fds_arrive_with_their_bytes_even_when_the_message_waits():
    a, b = _pair()
    q = OutputQueue(limit=64 << 20)
    filler = b"f" * (1 << 20)
    while True:                         # fill the socket first, so the fd message must wait
        q.push(filler)
        q.flush(a)
        if len(q):
            break
    r, w = os.pipe()
    q.push(b'{"map_bytes": 1}\n', [w])
    os.close(w)                         # the queue holds its own copy
    fds = array.array("i")
    data = b""
    while len(q) or not data.endswith(b"\n"):
        msg, anc, _f, _a = b.recvmsg(1 << 20, socket.CMSG_SPACE(4 * fds.itemsize))
        for level, ctype, cdata in anc:
            assert (level, ctype) == (socket.SOL_SOCKET, socket.SCM_RIGHTS)
            fds.frombytes(cdata)
            assert b'{"map_bytes"' in msg   # the fds come with the message's first byte
        data += msg
        q.flush(a)
    assert data.endswith(b'{"map_bytes": 1}\n') and len(fds) == 1
    os.write(fds[0], b"ok")
    assert os.read(r, 2) == b"ok"       # the very pipe, not another descriptor
    os.close(fds[0])
    os.close(r)


def test_clear_closes_the_queued_copies():
    a, b = _pair()
    q = OutputQueue(limit=64 << 20)
    r, w = os.pipe()
    while True:
        q.push(b"f" * (1 << 20))
        q.flush(a)
        if len(q):
            break
    before = len(os.listdir("/proc/self/fd"))
    q.push(b"x\n", [w])
    assert len(os.listdir("/proc/self/fd")) == before + 1
    q.clear()
    assert len(os.listdir("/proc/self/fd")) == before and q.nbytes == 0
    os.close(r)
    os.close(w)


def test_connection_send_reports_the_bound_and_splits_lines():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    c = Connection(a, limit=1 << 20)
    assert c.pid == os.getpid()         # SO_PEERCRED: who is on the other end
    sent = 0
    while c.send(b"z" * 65536):
        sent += 1
    assert c.out.nbytes + 65536 > 1 << 20
    assert c.lines(b'{"op": 1}\n{"op"') == [b'{"op": 1}'] and c.inbuf == b'{"op"'
    assert c.lines(b': 2}\n') == [b'{"op": 2}'] and c.inbuf == b""
    b.close()
    with pytest.raises(OSError):        # the peer is gone
        while True:
            c.send(b"z")
            c.out.flush(c.sock)
    c.close()
    assert c.closed and c.out.nbytes == 0
