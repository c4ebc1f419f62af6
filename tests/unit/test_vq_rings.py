"""The shared-memory verbs queues' C layer (metaroce/fastpath/vq.c) and the daemon's and
library's Python sides of it, without a daemon: rings in real memfds, both views in this
process (threads stand in for the other side). Posting and fetching across wrap-around, a full
ring, impossible indices and scribbled slots (never a read outside the ring: the ring ends at
an inaccessible guard page), the need_wakeup handshake and completion events under races."""

import ctypes
import mmap
import os
import random
import select
import threading
import time

import pytest

from metaroce.engine.wr import WcStatus
from metaroce.fastpath.vqlayout import C, CQE, HDR_SIZE, SEND_WQE, SGE, WQE_DATA, ring_bytes
from metaroce.fastpath.xsk import _lib
from metaroce.fastpath.vqlayout import WC_CODES, WC_SOLICITED, WC_WITH_IMM
from metaroce.nic.vrings import CqRing, QpRings, SharedMemory, new_eventfd
from metaroce.verbs.api import WC
from metaroce.verbs.queues import CompletionRing, Mapping

mod = _lib()
ffi, c = mod.ffi, mod.lib
SQ, RQ, CQ = C["MR_VQ_SQ"], C["MR_VQ_RQ"], C["MR_VQ_CQ"]
ENOSPC, EPIPE = 28, 32
PAGE = mmap.PAGESIZE


class Guarded:
    """A ring's memory ending exactly at an inaccessible page: a read or write past the ring
    kills the test process (so a test that passes never touched it)."""

    def __init__(self, size: int):
        self.size = size
        pages = -(-size // PAGE)
        self.mm = mmap.mmap(-1, (pages + 1) * PAGE)
        base = ctypes.addressof(ctypes.c_char.from_buffer(self.mm))
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        assert libc.mprotect(base + pages * PAGE, PAGE, 0) == 0     # PROT_NONE
        self.ptr = ffi.cast("uint8_t *", base + pages * PAGE - size)
        self.hdr = ffi.cast("struct mr_vq_hdr *", self.ptr)


def pair(kind, entries, stride, max_wr=None, doorbell=-1, event_fd=-1):
    """(memory, the daemon's view, the application's view) of a new ring."""
    mem = Guarded(ring_bytes(entries, stride))
    dq, aq = ffi.new("struct mr_vq *"), ffi.new("struct mr_vq *")
    max_wr = entries if max_wr is None else max_wr
    assert c.mr_vq_create(dq, mem.ptr, kind, entries, stride, max_wr, 4, 64, 0x1234,
                          event_fd) == 0
    assert c.mr_vq_attach(aq, mem.ptr, kind, entries, stride, doorbell) == 0
    return mem, dq, aq


def wqes(start, n, stride):
    buf = bytearray(n * stride)
    for i in range(n):
        SEND_WQE.pack_into(buf, i * stride, start + i, 0, 2, 1, 0, 0xAB00 + start + i, 7, 0, 0, 0)
        SGE.pack_into(buf, i * stride + WQE_DATA, 0x1000 + i, 64, 99)
        buf[i * stride + stride - 1] = (start + i) & 0xFF       # the slot's last byte too
    return buf


def post(aq, buf, n):
    return c.mr_vq_post(aq, ffi.from_buffer(buf), n)


def fetch(dq, stride, max_n=64):
    out = ffi.new("uint8_t[]", max_n * stride)
    n = c.mr_vq_fetch(dq, out, max_n)
    return n, bytes(ffi.buffer(out, max(n, 0) * stride))


def test_layout_matches_the_header():
    assert ffi.sizeof("struct mr_vq_hdr") == 320 <= HDR_SIZE
    for field, off in (("prod", 64), ("cons", 128), ("dflags", 192), ("arm_sn", 256)):
        assert ffi.offsetof("struct mr_vq_hdr", field) == off     # one cache line each
    assert SEND_WQE.size == WQE_DATA == 64 and CQE.size == 32 and SGE.size == 16


def test_attach_refuses_a_ring_that_is_not_what_was_announced():
    mem, dq, aq = pair(SQ, 8, 128)
    q = ffi.new("struct mr_vq *")
    assert c.mr_vq_attach(q, mem.ptr, RQ, 8, 128, -1) != 0
    assert c.mr_vq_attach(q, mem.ptr, SQ, 16, 128, -1) != 0
    assert c.mr_vq_create(q, mem.ptr, SQ, 12, 128, 8, 1, 0, 1, -1) != 0   # not a power of 2


def test_post_and_fetch_across_wrap_around():
    """Batches of every size through an 8-slot ring 200 times: every WQE arrives once, whole
    and in order, and the indices run on past the ring's size."""
    stride = 128
    mem, dq, aq = pair(SQ, 8, stride)
    rng = random.Random(1)
    sent = got = 0
    for _ in range(200):
        k = rng.randint(1, 8)
        if post(aq, wqes(sent, k, stride), k) == 0:
            sent += k
        n, raw = fetch(dq, stride, rng.randint(1, 8))
        assert n >= 0
        for i in range(n):
            f = SEND_WQE.unpack_from(raw, i * stride)
            assert f[0] == got + i and f[5] == 0xAB00 + got + i
            assert raw[i * stride + stride - 1] == (got + i) & 0xFF
        got += n
        c.mr_vq_settle(dq, rng.randint(0, dq.head - dq.tail))     # some complete
    assert got > 8 * 20 and int(mem.hdr.prod) == sent


def test_a_full_ring_refuses_posts_until_slots_are_released():
    stride = 128
    mem, dq, aq = pair(SQ, 8, stride, max_wr=6)
    assert post(aq, wqes(0, 6, stride), 6) == 0
    assert post(aq, wqes(6, 1, stride), 1) == -ENOSPC        # max_wr outstanding
    assert fetch(dq, stride)[0] == 6
    assert post(aq, wqes(6, 1, stride), 1) == -ENOSPC        # fetched is not completed
    c.mr_vq_settle(dq, 4)                                    # two completed
    assert post(aq, wqes(6, 3, stride), 3) == -ENOSPC        # all or nothing
    assert post(aq, wqes(6, 2, stride), 2) == 0
    n, raw = fetch(dq, stride)
    assert n == 2 and SEND_WQE.unpack_from(raw, 0)[0] == 6


def test_the_daemon_never_fetches_more_than_max_wr_even_if_the_application_posts_more():
    stride = 128
    mem, dq, aq = pair(SQ, 8, stride, max_wr=4)
    mem.hdr.prod = 8                      # a hostile library: 8 posted against max_wr 4
    assert fetch(dq, stride)[0] == 4
    assert fetch(dq, stride)[0] == 0      # the rest waits for completions
    c.mr_vq_settle(dq, 0)
    assert fetch(dq, stride)[0] == 4


@pytest.mark.parametrize("prod", [9, 1 << 20, 0xFFFFFFFF, 0x80000000])
def test_an_impossible_producer_index_is_refused(prod):
    stride = 128
    mem, dq, aq = pair(SQ, 8, stride)
    mem.hdr.prod = prod
    assert fetch(dq, stride)[0] == -1


def test_a_producer_index_moved_back_behind_what_was_fetched_is_refused():
    stride = 128
    mem, dq, aq = pair(SQ, 8, stride)
    assert post(aq, wqes(0, 5, stride), 5) == 0
    assert fetch(dq, stride)[0] == 5
    mem.hdr.prod = 3
    assert fetch(dq, stride)[0] == -1


def test_random_indices_never_make_the_daemon_read_outside_the_ring():
    """Any producer index, any consumer index the application writes into the daemon's
    published one: fetch copies at most the ring (the guard page is never touched)."""
    stride = 64
    rng = random.Random(7)
    for _ in range(2000):
        mem, dq, aq = pair(SQ, 4, stride)
        mem.hdr.prod = rng.getrandbits(32)
        mem.hdr.cons = rng.getrandbits(32)            # the daemon never reads it back
        dq.head = dq.tail = rng.getrandbits(32)
        n, _ = fetch(dq, stride, 8)
        assert -1 <= n <= 4


def test_concurrent_scribbling_cannot_crash_the_fetch():
    """A thread rewrites the whole ring (header and slots) with random bytes while the daemon's
    view fetches and settles in a loop."""
    stride = 128
    entries = 16
    mem, dq, aq = pair(SQ, entries, stride)
    size = ring_bytes(entries, stride)
    stop = threading.Event()

    def scribble():                      # legitimate posts, random bytes anywhere, bad prods
        r = random.Random(3)
        buf = ffi.buffer(mem.ptr, size)
        k = 0
        while not stop.is_set():
            x = r.random()
            if x < 0.6:
                if post(aq, wqes(k, 2, stride), 2) == 0:
                    k += 2
            elif x < 0.95:                # mostly the slots, sometimes the header
                off = r.randrange(HDR_SIZE if x > 0.9 else 0, size - 8)
                buf[off:off + 8] = r.getrandbits(64).to_bytes(8, "little")
            else:
                mem.hdr.prod = r.getrandbits(32)

    t = threading.Thread(target=scribble)
    t.start()
    refused = fetched = 0
    out = ffi.new("uint8_t[]", 64 * stride)
    try:
        t0 = time.monotonic()
        i = 0
        while time.monotonic() - t0 < (0.5 if refused and fetched else 10.0):
            i += 1
            n = c.mr_vq_fetch(dq, out, 64)
            if n < 0:
                refused += 1
            else:
                assert n <= entries
                fetched += n
                c.mr_vq_settle(dq, 0)
            if n < 0 or i % 200 == 0:                    # start over, as a fresh QP would
                dq.head = dq.tail = mem.hdr.prod = mem.hdr.cons = aq.head
                mem.hdr.dflags = 0
    finally:
        stop.set()
        t.join()
    assert refused and fetched


# ---- the daemon's Python side: WQEs out of the ring, then the rules ------------------------

class MemRecvRing:
    """A receive ring laid out as the NIC's (rx.RecvRing, a BPF map) but in a memfd: the unit
    tests need no BPF."""

    def __init__(self, entries=4):
        stride = C["MR_RQ_STRIDE"]
        self.entries, self.stride = entries, stride
        self.mem = SharedMemory("test-rq", ring_bytes(entries, stride))
        self.fd = self.mem.fd
        self.view = ffi.new("struct mr_vq *")
        assert c.mr_vq_create(self.view, self.mem.ptr, RQ, entries, stride, entries, 1, 0, 0x42,
                              -1) == 0

    def describe(self):
        return {"bytes": self.mem.size, "offset": 0, "entries": self.entries,
                "stride": self.stride, "max_wr": self.entries, "max_sge": 1}


def _qp_rings():
    return QpRings(0x42, max_send_wr=8, max_send_sge=4, max_inline=64, rq=MemRecvRing())


def test_the_rings_memfd_cannot_shrink_under_the_daemon():
    r = _qp_rings()
    try:
        with pytest.raises(PermissionError):
            os.ftruncate(r.fds[0], 0)
    finally:
        r.close()


# ---- the need_wakeup handshake --------------------------------------------------------------

def test_the_doorbell_rings_only_when_the_daemon_said_it_sleeps():
    stride = 128
    bell = new_eventfd()
    mem, dq, aq = pair(SQ, 8, stride, doorbell=bell)
    table = ffi.new("struct mr_vq *[]", [dq])
    assert post(aq, wqes(0, 1, stride), 1) == 0 and aq.doorbells == 0   # daemon awake
    assert c.mr_vqs_sleep(table, 1) == 1          # work is waiting: it must not sleep
    c.mr_vqs_wake(table, 1)
    fetch(dq, stride)
    assert c.mr_vqs_sleep(table, 1) == 0          # nothing waiting: it sleeps
    assert post(aq, wqes(1, 1, stride), 1) == 0 and aq.doorbells == 1
    assert select.select([bell], [], [], 0)[0] == [bell]
    os.eventfd_read(bell)
    c.mr_vqs_wake(table, 1)
    assert post(aq, wqes(2, 1, stride), 1) == 0 and aq.doorbells == 1
    os.close(bell)


def test_no_post_is_ever_missed_by_a_sleeping_daemon():
    """An application thread posts at random moments; the daemon thread sleeps on the doorbell
    whenever the handshake allows (with a 2 s timeout that must never be what wakes it with
    work waiting). Every WQE is fetched; a lost wake-up would show as a timed-out sleep that
    found work."""
    stride, n = 128, 3000
    bell = new_eventfd()
    mem, dq, aq = pair(SQ, 64, stride, doorbell=bell)
    table = ffi.new("struct mr_vq *[]", [dq])
    got, lost, sleeps = [0], [0], [0]

    def daemon():
        out = ffi.new("uint8_t[]", 64 * stride)
        while got[0] < n:
            k = c.mr_vq_fetch(dq, out, 64)
            if k > 0:
                got[0] += k
                c.mr_vq_settle(dq, 0)
                continue
            if c.mr_vqs_sleep(table, 1):
                c.mr_vqs_wake(table, 1)
                continue
            sleeps[0] += 1
            r, _, _ = select.select([bell], [], [], 2.0)
            if r:
                os.eventfd_read(bell)
            elif c.mr_vq_fetch(dq, out, 0) == 0 and int(mem.hdr.prod) != dq.head:
                lost[0] += 1
            c.mr_vqs_wake(table, 1)

    t = threading.Thread(target=daemon)
    t.start()
    rng = random.Random(5)
    posted = 0
    while posted < n:
        k = min(n - posted, rng.randint(1, 4))
        if post(aq, wqes(posted, k, stride), k) == 0:
            posted += k
        if rng.random() < 0.3:
            time.sleep(rng.random() * 1e-4)
    t.join(timeout=60)
    assert not t.is_alive() and got[0] == n and lost[0] == 0
    assert sleeps[0] > 0 and aq.doorbells > 0
    os.close(bell)


# ---- completion rings and events ------------------------------------------------------------

class DaemonCq:
    """The daemon's side of a completion ring as the data path thread writes it (vq.c
    mr_vq_put / mr_vq_publish; metaroce/datapath/dp_cq.c)."""

    def __init__(self, entries, chan):
        self.ring = CqRing(5, entries, chan)
        self.q, self.fd, self.mem = self.ring.q, self.ring.fd, self.ring.mem
        self.eligible = 0

    @property
    def head(self):
        return int(self.q.head)

    def put(self, wc):
        flags = WC_WITH_IMM if wc.get("imm_data") is not None else 0
        if wc.get("solicited"):
            flags |= WC_SOLICITED
        if wc.get("status") or flags & WC_SOLICITED:
            self.eligible = 1
        raw = CQE.pack(wc["wr_id"], wc.get("byte_len", 0), wc.get("imm_data") or 0, wc["qp_num"],
                       wc.get("src_qp", 0), wc.get("status", 0), WC_CODES[wc["opcode"]], flags)
        c.mr_vq_put(self.q, raw)

    def publish(self):
        c.mr_vq_publish(self.q, self.eligible)
        self.eligible = 0

    def describe(self):
        return self.ring.describe()

    def close(self):
        self.ring.close()


def _cq(entries=8):
    chan = new_eventfd()
    ring = DaemonCq(entries, chan)
    app = CompletionRing(Mapping(os.dup(ring.fd), ring.mem.size), ring.describe(), WC)
    return ring, app, chan


def _wc(i, **kw):
    return {"wr_id": i, "status": 0, "opcode": "RDMA_WRITE", "qp_num": 0x42, "byte_len": 64, **kw}


def test_completions_cross_the_ring_in_order_with_their_fields():
    ring, app, chan = _cq(8)
    got = []
    for r in range(50):
        for i in range(r % 8 + 1):
            ring.put(_wc(len(got) + i + (r << 20) * 0, imm_data=7 if i % 2 else None))
        ring.publish()
        got += app.poll(16)
    assert [w.wr_id for w in got] == list(range(len(got)))
    assert {w.imm_data for w in got} == {None, 7} and all(w.opcode == "RDMA_WRITE" for w in got)
    ring.put({"wr_id": 2**64 - 1, "status": 12, "opcode": "RECV_RDMA_WITH_IMM", "qp_num": 9,
              "byte_len": 5, "imm_data": 0xDEADBEEF, "src_qp": 77})
    ring.publish()
    assert app.poll(4) == [WC(2**64 - 1, 12, "RECV_RDMA_WITH_IMM", 9, 5, 0xDEADBEEF, 77)]
    ring.close()
    os.close(chan)


def test_an_event_only_after_arming_and_once_per_arm():
    ring, app, chan = _cq(8)
    ring.put(_wc(1))
    ring.publish()
    assert not select.select([chan], [], [], 0)[0]         # not armed: no event
    assert app.arm() == 1                                  # one waits already: poll it
    app.poll(8)
    ring.put(_wc(2))
    ring.publish()
    assert select.select([chan], [], [], 0)[0] == [chan]   # armed: one event
    os.eventfd_read(chan)
    ring.put(_wc(3))
    ring.publish()
    assert not select.select([chan], [], [], 0)[0]         # one event per arm
    assert app.notified() == 1
    app.arm(solicited_only=True)
    ring.put(_wc(4))
    ring.publish()
    assert not select.select([chan], [], [], 0)[0]         # not solicited
    ring.put(_wc(5, status=5))
    ring.publish()
    assert select.select([chan], [], [], 0)[0] == [chan]   # an error completion is
    ring.close()
    os.close(chan)


def test_no_completion_event_is_lost_to_the_arm_race():
    """The application arms and sleeps whenever it finds nothing; the daemon thread publishes
    completions at random moments. Every completion is polled and no sleep runs into its
    timeout while a completion waits."""
    ring, app, chan = _cq(64)
    n = 3000
    late = [0]

    def daemon():
        rng = random.Random(9)
        i = 0
        while i < n:
            if ring.head - app.q.head < 32:
                ring.put(_wc(i))
                ring.publish()
                i += 1
            if rng.random() < 0.2:
                time.sleep(rng.random() * 1e-4)

    t = threading.Thread(target=daemon)
    t.start()
    got = 0
    while got < n:
        k = len(app.poll(64))
        got += k
        if k:
            continue
        if app.arm():
            continue
        if not select.select([chan], [], [], 2.0)[0]:
            late[0] += app.ready() > 0
        else:
            os.eventfd_read(chan)
    t.join()
    assert got == n and late[0] == 0
    ring.close()
    os.close(chan)
