"""The daemon is a process of its own, not a fork of its caller (issue 18 §1, the root cause of
the flaky failures on a fresh machine).

`start_background` used to fork its caller and run the daemon in the copy. The copy inherits
every Python object of the caller, garbage included; when the child's garbage collector
finalises an inherited socket or file, it closes that fd *number* in the daemon, where the
number now belongs to one of the daemon's own BPF maps, its event ring or a client socket. The
daemon then failed at random: status answered an OSError (EBADF), READ requests were never
served, connections were closed under applications. Which test failed depended on what garbage
the test runner happened to hold at the moment of the fork."""

import gc
import os
import socket

from verbs_util import ALL_ACCESS, End, connect, daemons, ip_of, lab_pair

from metaroce.lab import core
from metaroce.nic import daemon as d
from metaroce.verbs import IBV_WC_SUCCESS, IBV_WR_RDMA_READ, IBV_WR_RDMA_WRITE, Context, SendWR


def _fd_garbage(pairs: int = 120) -> None:
    """Unreachable socket pairs held only by reference cycles: only the cyclic garbage
    collector closes them, whenever it next runs (in whichever process)."""
    gc.collect()
    for _ in range(pairs):
        a, b = socket.socketpair()
        cycle = [a, b]
        cycle.append(cycle)


def test_the_daemon_is_not_a_fork_of_its_caller(lab_name):
    view = lab_pair(lab_name)
    try:
        _fd_garbage()
        with daemons(view, hosts=("h1", "h2")) as devs:
            for dev in devs:
                pid = d.running_pid(dev)
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
                assert b"metaroce.nic.daemon_proc" in argv, argv
                # it holds none of the caller's sockets: only what it opened itself
                mine = {os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
                        if os.path.exists(f"/proc/self/fd/{fd}")}
                theirs = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
                shared = {x for x in mine & theirs if x.startswith("socket:")}
                assert not shared, shared
            ctxs = {h: Context("eth0", view.plan.node(h).netns) for h in ("h1", "h2")}
            try:
                _fd_garbage()              # garbage at the time the verbs traffic runs, too
                for _ in range(20):        # enough requests and events for any GC to run
                    a, b = End(ctxs["h1"], 1 << 20), End(ctxs["h2"], 1 << 20, ALL_ACCESS)
                    connect(a, b, ip_of(view, "h1"), ip_of(view, "h2"))
                    data = os.urandom(1 << 20)
                    a.mr.write(data)
                    a.qp.post_send(SendWR(IBV_WR_RDMA_WRITE, wr_id=1, sg_list=[a.mr.sge()],
                                          remote_addr=b.mr.addr, rkey=b.mr.rkey))
                    assert a.cq.wait(1, timeout_s=10)[0].status == IBV_WC_SUCCESS
                    a.mr.write(bytes(1 << 20))
                    a.qp.post_send(SendWR(IBV_WR_RDMA_READ, wr_id=2, sg_list=[a.mr.sge()],
                                          remote_addr=b.mr.addr, rkey=b.mr.rkey))
                    assert a.cq.wait(1, timeout_s=10)[0].status == IBV_WC_SUCCESS
                    assert a.mr.read(1 << 20) == data == b.mr.read(1 << 20)
                    for dev in devs:
                        assert "counters" in d.request(dev, {"op": "status"})[0]
                    for e in (a, b):
                        e.qp.close()
                        e.mr.close()
            finally:
                for c in ctxs.values():
                    c.close()
    finally:
        core.down(lab_name)
