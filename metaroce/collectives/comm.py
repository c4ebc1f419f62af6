"""A communicator for N ranks over MetaRoCE verbs: a full mesh of RC QPs set up through
`metaroce.cm`, and collectives built on RDMA WRITE with immediate data into memory the receiver
granted first (receiver-driven, "clear to send").

Protocol, per directed link (one RC QP per pair of ranks, both directions):
  * the receiver grants a buffer for the next transfer it expects: a SEND_WITH_IMM whose 24-byte
    payload is (addr, rkey, length, seq) and whose immediate is seq; the buffer is either one of
    its staging slots (data that is reduced on arrival) or the final place in its data region
    (data that is only copied: allgather, broadcast, recv);
  * the sender takes grants in order, checks that seq and length are the transfer it is about to
    make, and WRITEs with immediate (imm = seq) from its own registered data region;
  * the receiver's RECV_RDMA_WITH_IMM completion says the chunk is in place; a staged chunk is
    reduced into the data region and its slot is granted again.
Both sides derive the same list of transfers from (count, world, chunk size), so a grant and the
write it allows always name the same bytes; seq and length are checked on both sides. Every
incoming message consumes one of the RECV_DEPTH receives posted per QP, which are reposted as
they complete; a link never has more than GRANT_WINDOW grants outstanding in each direction, so
receives cannot run out (no RNR).

Large buffers are cut into chunks (chunk_bytes) that are pipelined: while chunk k is reduced,
chunks k+1 .. k+slots-1 are on the wire. A ring collective is one round: what a step sends is
what the step before received, so each chunk goes on as soon as it landed and was reduced, and
every step's grants go out ahead (`_ring`). Granting the data region itself in the allgather
phase stays safe without waiting for our own writes: the fully reduced segment that lands in
a region can only come back round the ring after the right neighbour received all of our
write from that region (its reduction needed every byte); a retransmission of that write read
later carries PSNs the neighbour already took, so nothing is placed from it. (Until
2026-12-07 every step was a round of its own, waiting for the completions of its writes:
3-rank allreduce at 256 KiB ran at 0.43 of Gloo's bus bandwidth, 0.83 since, in
tools/bench/allreduce.py --hosts 3 --quick.)

Allreduce has two algorithms (`algorithm=` or METAROCE_ALGORITHM: auto, ring, tree): the ring
moves 2 (N-1)/N of the buffer per rank in 2 (N-1) steps; the tree (arity METAROCE_TREE_ARITY,
default 2, rooted at rank 0) reduces chunks up and broadcasts them down, pipelined, in 2 log N
steps, and wins for small buffers; auto picks the tree below tree_threshold bytes.

Tensors can live in the registered data region with no copy: `buffer(count, dtype)` returns a
numpy array over `mr.buf` (`torch.frombuffer` works on it too); any other array is copied in and
out."""

from __future__ import annotations

import os
import secrets
import struct
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .. import cm
from ..verbs import (CQ, MR, PD, IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_REMOTE_WRITE,
                     IBV_SEND_INLINE, IBV_SEND_SIGNALED, IBV_WR_RDMA_WRITE_WITH_IMM,
                     IBV_WR_SEND_WITH_IMM, Context, QPCap, RecvWR, SendWR)
from ..verbs.api import wc_status_str
from . import reduce as R
from .reduce import Chunk, CollectiveError

DEFAULT_PORT = 18600             # rank r listens on DEFAULT_PORT + r in its device's namespace
GRANT = struct.Struct("<QIIQ")   # addr, rkey, length, seq
HELLO = struct.Struct("<IIQ")    # rank, world size, job
CTRL_SLOT = 32
RECV_DEPTH = 128
GRANT_WINDOW = 32                # grants outstanding per direction of a link (<= RECV_DEPTH / 2)
SCRATCH = 4096                   # the data region's first bytes are for barrier tokens
ACCESS = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE
CAP = QPCap(max_send_wr=1024, max_recv_wr=256)


class _Link:
    """The connection to one peer and the state of both directions of its protocol."""

    def __init__(self, index: int, peer: int, conn: cm.Connection, ctrl_off: int):
        self.index, self.peer, self.conn, self.qp = index, peer, conn, conn.qp
        self.ctrl_off = ctrl_off
        self.grants: deque[tuple[int, int, int, int]] = deque()  # from the peer: we may send
        self.arrivals: deque[tuple[int, int]] = deque()          # (imm, byte_len) written to us
        self.tx_seq = 0          # next transfer we send to the peer
        self.grant_seq = 0       # next transfer of the peer's we grant
        self.rx_seq = 0          # next transfer of the peer's we expect to land
        self.unacked = 0         # our sends (grants and writes) not completed yet
        self.repost: list[int] = []


@dataclass(eq=False)
class _Send:
    link: _Link
    offset: int                  # in the data region
    length: int
    after: "_Recv | tuple | None" = None  # post only once this receive (all these) landed

    def ready(self) -> bool:
        a = self.after
        if a is None:
            return True
        return a.done if isinstance(a, _Recv) else all(x.done for x in a)


@dataclass(eq=False)
class _Recv:
    link: _Link
    offset: int                  # in the data region: where the data goes / is reduced into
    length: int
    reduce: Callable[[np.ndarray, "_Recv"], None] | None = None  # staged: reduce on arrival
    done: bool = False
    slot: int = -1


class Communicator:
    """`Communicator(ctx, rank, world, addrs)`: connect to every other rank (addrs[i] is rank
    i's device address; rank i listens on port + i). Collectives operate on numpy arrays in
    place; `buffer()` gives arrays that live in registered memory (no copy)."""

    def __init__(self, ctx: Context, rank: int, world: int, addrs: list[str], *,
                 port: int = DEFAULT_PORT, chunk_bytes: int = 1 << 20, slots: int = 4,
                 timeout_s: float = 60.0, job: int = 0, data_bytes: int = 1 << 20,
                 algorithm: str | None = None, tree_arity: int | None = None,
                 tree_threshold: int = 256 << 10):
        if not 0 <= rank < world or len(addrs) != world:
            raise CollectiveError(f"rank {rank} of {world} with {len(addrs)} addresses")
        if chunk_bytes < 64 or slots < 1:
            raise CollectiveError("chunk_bytes must be >= 64 and slots >= 1")
        self.algorithm = algorithm or os.environ.get("METAROCE_ALGORITHM", "auto")
        if self.algorithm not in ("auto", "ring", "tree"):
            raise CollectiveError(f"algorithm must be auto, ring or tree, not {self.algorithm!r}")
        try:
            self.tree_arity = int(tree_arity or os.environ.get("METAROCE_TREE_ARITY", 2))
        except ValueError:
            raise CollectiveError("METAROCE_TREE_ARITY must be an integer") from None
        if not 1 <= self.tree_arity <= 16:
            raise CollectiveError(f"tree arity must be 1..16, not {self.tree_arity}")
        self.tree_threshold = tree_threshold
        self.ctx, self.rank, self.world = ctx, rank, world
        self.chunk_bytes, self.slots, self.timeout_s, self.job = chunk_bytes, slots, timeout_s, job
        self.pd = PD(ctx)
        self.cq = CQ(ctx, 8192)
        self.links: dict[int, _Link] = {}
        self._by_qpn: dict[int, _Link] = {}
        self._retired: list[MR] = []
        self.data: MR | None = None
        self._u8: np.ndarray | None = None
        npeers = world - 1
        self.ctrl = MR(self.pd, max(1, npeers) * RECV_DEPTH * CTRL_SLOT, ACCESS)
        self.stage = MR(self.pd, max(1, npeers) * slots * chunk_bytes, ACCESS)
        self._stage_u8 = np.frombuffer(self.stage.buf, np.uint8)
        self._ctrl_mv = self.ctrl.buf
        self._grow(data_bytes)
        try:
            self._connect_all(addrs, port)
        except BaseException:
            self.close()
            raise
        for link in self.links.values():
            link.qp.post_recv([RecvWR(wr_id=(link.index << 16) | s,
                                      sg_list=[self.ctrl.sge(link.ctrl_off + s * CTRL_SLOT,
                                                             CTRL_SLOT)])
                               for s in range(RECV_DEPTH)])
        self.mode = {p: link.conn.mode for p, link in self.links.items()}

    # -- setup --
    def _connect_all(self, addrs: list[str], port: int) -> None:
        hello = HELLO.pack(self.rank, self.world, self.job)
        lis = cm.listen(self.ctx, port + self.rank) if self.rank < self.world - 1 else None
        try:
            for j in range(self.rank):                    # lower ranks listen: connect to them
                deadline = time.monotonic() + self.timeout_s
                while True:
                    try:
                        conn = cm.connect(self.ctx, addrs[j], port + j, pd=self.pd,
                                          send_cq=self.cq, cap=CAP, private_data=hello,
                                          timeout_s=self.timeout_s)
                        break
                    except cm.CmError as exc:
                        if "refused" not in str(exc) or time.monotonic() > deadline:
                            raise CollectiveError(f"rank {self.rank}: cannot connect to rank "
                                                  f"{j} at {addrs[j]}: {exc}") from None
                        time.sleep(0.05)
                self._add(conn, j)
            for _ in range(self.rank + 1, self.world):   # higher ranks connect to us
                try:
                    conn = lis.accept(pd=self.pd, send_cq=self.cq, cap=CAP, private_data=hello,
                                      timeout_s=self.timeout_s)
                except cm.CmError as exc:
                    raise CollectiveError(f"rank {self.rank}: waiting for higher ranks: "
                                          f"{exc}") from None
                self._add(conn, None)
        finally:
            if lis is not None:
                lis.close()
        if len(self.links) != self.world - 1:
            raise CollectiveError(f"rank {self.rank}: connected to {sorted(self.links)} only")

    def _add(self, conn: cm.Connection, expect: int | None) -> None:
        try:
            peer, world, job = HELLO.unpack(conn.private_data[:HELLO.size])
        except struct.error:
            conn.close()
            raise CollectiveError("a peer sent no rank in its private data") from None
        if world != self.world or job != self.job or (expect is not None and peer != expect) \
                or peer in self.links or peer == self.rank or not 0 <= peer < world:
            conn.close()
            raise CollectiveError(f"rank {self.rank}: unexpected peer (rank {peer} of {world}, "
                                  f"job {job:#x}; this job {self.job:#x} of {self.world})")
        index = len(self.links)
        link = _Link(index, peer, conn, index * RECV_DEPTH * CTRL_SLOT)
        self.links[peer] = link
        self._by_qpn[conn.qp.qp_num] = link

    def _grow(self, nbytes: int) -> None:
        """Make the data region hold SCRATCH + nbytes (grants carry addresses, so peers need not
        be told)."""
        need = SCRATCH + nbytes
        if self.data is not None and self.data.length >= need:
            return
        size = max(need, 2 * self.data.length if self.data else 0)
        size = (size + 4095) & ~4095
        old = self.data
        self._u8 = None
        self.data = MR(self.pd, size, ACCESS)
        self._u8 = np.frombuffer(self.data.buf, np.uint8)
        if old is not None:
            try:
                old.close()
            except BufferError:        # a caller still holds an array over it: keep it mapped
                self._retired.append(old)

    # -- buffers --
    def buffer(self, count: int, dtype: str = "float32") -> np.ndarray:
        """An array of count elements in the registered data region (bfloat16: raw uint16).
        Collectives on it move no bytes through extra copies; the region is reused by the next
        buffer() call or copied-in collective."""
        st = R.storage(dtype)
        self._grow(count * st.itemsize)
        return self._u8[SCRATCH:SCRATCH + count * st.itemsize].view(st)

    def _place(self, a: np.ndarray, nbytes_needed: int | None = None) -> tuple[int, bool]:
        """The data-region offset of a's bytes; copies a in when it lives elsewhere."""
        if self._u8 is not None and a.flags.c_contiguous and a.nbytes and \
                np.shares_memory(a, self._u8):
            off = a.ctypes.data - self._u8.ctypes.data
            if SCRATCH <= off and off + max(a.nbytes, nbytes_needed or 0) <= self.data.length:
                return off, False
        self._grow(max(a.nbytes, nbytes_needed or 0))
        self._u8[SCRATCH:SCRATCH + a.nbytes] = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
        return SCRATCH, True

    def _view(self, off: int, nbytes: int, st: np.dtype) -> np.ndarray:
        return self._u8[off:off + nbytes].view(st)

    def _back(self, a: np.ndarray, off: int, copied: bool) -> None:
        if copied:
            a[...] = self._view(off, a.nbytes, a.dtype).reshape(a.shape)

    # -- progress --
    def _progress(self, block: bool, what: str) -> None:
        wcs = self.cq.poll(512)
        if not wcs and block:
            try:
                wcs = self.cq.wait(1, timeout_s=self.timeout_s)
            except Exception as exc:
                raise CollectiveError(f"rank {self.rank}: {what}: nothing happened within "
                                      f"{self.timeout_s} s ({exc})") from None
            wcs += self.cq.poll(511)
        for wc in wcs:
            link = self._by_qpn.get(wc.qp_num)
            if link is None:
                continue
            if wc.status != 0:
                raise CollectiveError(f"rank {self.rank}: {wc_status_str(wc.status)} on "
                                      f"{wc.opcode} with rank {link.peer} during {what}")
            if wc.opcode == "RECV":
                slot = wc.wr_id & 0xFFFF
                o = link.ctrl_off + slot * CTRL_SLOT
                addr, rkey, length, seq = GRANT.unpack_from(self._ctrl_mv, o)
                if seq & 0xFFFFFFFF != wc.imm_data:
                    raise CollectiveError(f"rank {link.peer} sent a malformed grant")
                link.grants.append((seq, addr, rkey, length))
                link.repost.append(slot)
            elif wc.opcode == "RECV_RDMA_WITH_IMM":
                link.arrivals.append((wc.imm_data, wc.byte_len))
                link.repost.append(wc.wr_id & 0xFFFF)
            else:
                link.unacked -= 1
        for link in self.links.values():
            if link.repost:
                link.qp.post_recv([RecvWR(wr_id=(link.index << 16) | s,
                                          sg_list=[self.ctrl.sge(link.ctrl_off + s * CTRL_SLOT,
                                                                 CTRL_SLOT)])
                                   for s in link.repost])
                link.repost = []

    def _run(self, sends: list[_Send], recvs: list[_Recv], what: str) -> None:
        """One round: grant every receive, write every send when granted, reduce staged
        arrivals; returns when all of it landed and all our writes completed."""
        to_grant: dict[_Link, deque[_Recv]] = {}
        granted: dict[_Link, deque[_Recv]] = {}
        free: dict[_Link, list[int]] = {}
        for r in recvs:
            to_grant.setdefault(r.link, deque()).append(r)
            granted.setdefault(r.link, deque())
            free.setdefault(r.link, list(range(self.slots - 1, -1, -1)))
        to_send: dict[_Link, deque[_Send]] = {}
        for s in sends:
            to_send.setdefault(s.link, deque()).append(s)
        left = len(recvs)
        send_links = list(to_send)
        while True:
            moved = False
            for link, q in to_grant.items():
                wrs = []
                while q and len(granted[link]) < GRANT_WINDOW:
                    r = q[0]
                    if r.reduce is not None:
                        if not free[link]:
                            break
                        r.slot = free[link].pop()
                        addr = self.stage.addr + (link.index * self.slots + r.slot) * \
                            self.chunk_bytes
                        rkey = self.stage.rkey
                    else:
                        addr, rkey = self.data.addr + r.offset, self.data.rkey
                    seq = link.grant_seq
                    link.grant_seq += 1
                    wrs.append(SendWR(IBV_WR_SEND_WITH_IMM, wr_id=1, imm_data=seq & 0xFFFFFFFF,
                                      send_flags=IBV_SEND_SIGNALED | IBV_SEND_INLINE,
                                      inline_data=GRANT.pack(addr, rkey, r.length, seq)))
                    granted[link].append(q.popleft())
                if wrs:
                    link.unacked += len(wrs)
                    link.qp.post_send(wrs)
                    moved = True
            for link in send_links:
                q, wrs = to_send[link], []
                while q and link.grants:
                    s = q[0]
                    if not s.ready():
                        break
                    seq, addr, rkey, length = link.grants.popleft()
                    if seq != link.tx_seq or length != s.length:
                        raise CollectiveError(
                            f"rank {self.rank}: rank {link.peer} granted transfer {seq} of "
                            f"{length} bytes where {link.tx_seq} of {s.length} was due "
                            f"({what}: the ranks disagree on the collective)")
                    wrs.append(SendWR(IBV_WR_RDMA_WRITE_WITH_IMM, wr_id=2,
                                      imm_data=seq & 0xFFFFFFFF, remote_addr=addr, rkey=rkey,
                                      sg_list=[self.data.sge(s.offset, s.length)]))
                    link.tx_seq += 1
                    q.popleft()
                if wrs:
                    link.unacked += len(wrs)
                    link.qp.post_send(wrs)
                    moved = True
            for link, g in granted.items():
                while link.arrivals and g:
                    imm, n = link.arrivals.popleft()
                    r = g.popleft()
                    if imm != link.rx_seq & 0xFFFFFFFF or n != r.length:
                        raise CollectiveError(
                            f"rank {self.rank}: rank {link.peer} wrote transfer {imm} of {n} "
                            f"bytes where {link.rx_seq} of {r.length} was due ({what})")
                    link.rx_seq += 1
                    if r.reduce is not None:
                        o = (link.index * self.slots + r.slot) * self.chunk_bytes
                        r.reduce(self._stage_u8[o:o + r.length], r)
                        free[link].append(r.slot)
                    r.done = True
                    left -= 1
                    moved = True
            if left == 0 and not any(to_send.values()) and \
                    all(lk.unacked == 0 for lk in self.links.values()):
                return
            self._progress(block=not moved, what=what)

    # -- collectives --
    def _dtype(self, a: np.ndarray, dtype: str | None) -> str:
        if dtype is None:
            return R.dtype_name(a.dtype)
        if R.storage(dtype) != a.dtype:
            raise CollectiveError(f"{dtype} is stored as {R.storage(dtype)}, not {a.dtype}")
        return dtype

    def _chunks(self, seg: Chunk, base: int, itemsize: int) -> list[Chunk]:
        return [Chunk(base + c.offset, c.length)
                for c in R.chunks(seg, self.chunk_bytes, itemsize)]

    def _ring(self, base: int, segs: list[Chunk], itemsize: int, shift: int, *,
              reduce_scatter: bool, allgather: bool, st: np.dtype | None = None,
              dtype: str = "", op: str = "sum",
              finish: bool = False) -> tuple[list[_Send], list[_Recv]]:
        """The ring's transfers as one pipelined plan. Reduce-scatter: after its N - 1 steps
        rank r holds segment (r + shift) mod N fully reduced (and finished, with `finish`);
        allgather: rank r starts with that segment and ends with all of them. What a step
        sends is what the step before received (the same segment, cut into the same chunks),
        so each chunk goes on as soon as it landed (and was reduced): no step waits for the
        whole of the one before, its grants go out ahead, and nobody waits for its own writes'
        completions between steps (one round, `_run`, for the lot)."""
        n, r = self.world, self.rank
        right, left = self.links[(r + 1) % n], self.links[(r - 1) % n]

        def reduce(stage: np.ndarray, rv: _Recv) -> None:
            R.reduce_into(self._view(rv.offset, rv.length, st), stage.view(st), op, dtype)

        def reduce_last(stage: np.ndarray, rv: _Recv) -> None:
            reduce(stage, rv)                 # the chunk is complete: avg divides it now
            R.finish(self._view(rv.offset, rv.length, st), op, dtype, n)

        steps = []      # (segment sent, segment received, how a received chunk is used)
        if reduce_scatter:
            steps += [(segs[(r - s - 1 + shift) % n], segs[(r - s - 2 + shift) % n],
                       reduce_last if finish and s == n - 2 else reduce) for s in range(n - 1)]
        if allgather:
            steps += [(segs[(r - s + shift) % n], segs[(r - s - 1 + shift) % n], None)
                      for s in range(n - 1)]
        sends: list[_Send] = []
        recvs: list[_Recv] = []
        prev: list[_Recv] | None = None
        for out, inn, use in steps:
            sends += [_Send(right, c.offset, c.length, prev[i] if prev else None)
                      for i, c in enumerate(self._chunks(out, base, itemsize))]
            prev = [_Recv(left, c.offset, c.length, use)
                    for c in self._chunks(inn, base, itemsize)]
            recvs += prev
        return sends, recvs

    def _ring_reduce_scatter(self, base: int, segs: list[Chunk], st: np.dtype, dtype: str,
                             op: str, shift: int, what: str) -> None:
        """After this rank r holds segment (r + shift) mod N fully reduced."""
        self._run(*self._ring(base, segs, st.itemsize, shift, reduce_scatter=True,
                              allgather=False, st=st, dtype=dtype, op=op), what)

    def _ring_allgather(self, base: int, segs: list[Chunk], itemsize: int, shift: int,
                        what: str) -> None:
        """Rank r starts with segment (r + shift) mod N, ends with all of them."""
        self._run(*self._ring(base, segs, itemsize, shift, reduce_scatter=False,
                              allgather=True), what)

    def _tree_links(self) -> tuple[_Link | None, list[_Link]]:
        """Rank r's parent and children in the arity-k tree rooted at rank 0."""
        r, k = self.rank, self.tree_arity
        parent = self.links[(r - 1) // k] if r else None
        return parent, [self.links[c] for c in range(k * r + 1, k * r + k + 1) if c < self.world]

    def _tree_allreduce(self, off: int, nbytes: int, st: np.dtype, dtype: str, op: str) -> None:
        """Reduce up the tree, chunk by chunk (a rank forwards chunk k to its parent as soon as
        every child's chunk k is reduced into it), then broadcast down the same way: 2 log_k N
        steps instead of the ring's 2 (N - 1), so small tensors finish sooner."""
        parent, children = self._tree_links()
        chs = self._chunks(Chunk(0, nbytes), off, st.itemsize)

        def reduce(stage: np.ndarray, rv: _Recv) -> None:
            R.reduce_into(self._view(rv.offset, rv.length, st), stage.view(st), op, dtype)

        ups = [[_Recv(c, ch.offset, ch.length, reduce) for ch in chs] for c in children]
        sends = [] if parent is None else \
            [_Send(parent, ch.offset, ch.length, tuple(u[i] for u in ups) or None)
             for i, ch in enumerate(chs)]
        self._run(sends, [r for u in ups for r in u], "allreduce (tree, up)")
        if parent is None:
            R.finish(self._view(off, nbytes, st), op, dtype, self.world)
        downs = [] if parent is None else [_Recv(parent, ch.offset, ch.length) for ch in chs]
        self._run([_Send(c, ch.offset, ch.length, downs[i] if downs else None)
                   for c in children for i, ch in enumerate(chs)], downs,
                  "allreduce (tree, down)")

    def algorithm_for(self, nbytes: int) -> str:
        """ring or tree: `algorithm` if set, else tree below tree_threshold bytes."""
        if self.algorithm != "auto":
            return self.algorithm
        return "tree" if nbytes < self.tree_threshold and self.world > 2 else "ring"

    def allreduce(self, a: np.ndarray, op: str = "sum", dtype: str | None = None) -> np.ndarray:
        """Allreduce in place: ring (reduce-scatter, then allgather) or tree (reduce to rank 0,
        then broadcast), see algorithm_for; every rank ends with the same bytes. dtype:
        "bfloat16" for raw uint16 storage, else taken from a."""
        dtype, op = self._dtype(a, dtype), R.check_op(op)
        st = R.storage(dtype)
        if self.world == 1 or a.size == 0:
            R.finish(a, op, dtype, 1)
            return a
        off, copied = self._place(a)
        if self.algorithm_for(a.nbytes) == "tree":
            self._tree_allreduce(off, a.nbytes, st, dtype, op)
            self._back(a, off, copied)
            return a
        segs = R.segments(a.size, self.world, st.itemsize)
        self._run(*self._ring(off, segs, st.itemsize, 1, reduce_scatter=True, allgather=True,
                              st=st, dtype=dtype, op=op, finish=True), "allreduce")
        self._back(a, off, copied)
        return a

    def reduce_scatter(self, out: np.ndarray, inp: np.ndarray, op: str = "sum",
                       dtype: str | None = None) -> np.ndarray:
        """out (count elements) = block `rank` of the reduction of inp (world * count)."""
        dtype, op = self._dtype(inp, dtype), R.check_op(op)
        st = R.storage(dtype)
        if inp.size != out.size * self.world or out.dtype != inp.dtype:
            raise CollectiveError(f"reduce_scatter: input has {inp.size} elements, output "
                                  f"{out.size}, world {self.world}")
        off, _ = self._place(inp)
        blk = out.size * st.itemsize
        segs = [Chunk(i * blk, blk) for i in range(self.world)]
        if self.world > 1:
            self._ring_reduce_scatter(off, segs, st, dtype, op, 0, "reduce_scatter")
        mine = self._view(off + self.rank * blk, blk, st)
        R.finish(mine, op, dtype, self.world)
        out[...] = mine.reshape(out.shape)
        return out

    def allgather(self, out: np.ndarray, inp: np.ndarray) -> np.ndarray:
        """out (world * count) = every rank's inp (count), in rank order."""
        if out.size != inp.size * self.world or out.dtype != inp.dtype:
            raise CollectiveError(f"allgather: input has {inp.size} elements, output "
                                  f"{out.size}, world {self.world}")
        blk = inp.nbytes
        off, copied = self._place(out)
        self._view(off + self.rank * blk, blk, np.dtype(np.uint8))[...] = \
            np.ascontiguousarray(inp).reshape(-1).view(np.uint8)
        segs = [Chunk(i * blk, blk) for i in range(self.world)]
        if self.world > 1:
            self._ring_allgather(off, segs, 1, 0, "allgather")
        self._back(out, off, copied)
        return out

    def broadcast(self, a: np.ndarray, root: int = 0) -> np.ndarray:
        """Pipelined chain from root: each rank forwards a chunk as soon as it has landed."""
        if not 0 <= root < self.world:
            raise CollectiveError(f"broadcast root {root} is not a rank of {self.world}")
        if self.world == 1 or a.nbytes == 0:
            return a
        off, copied = self._place(a)
        pos = (self.rank - root) % self.world
        chs = self._chunks(Chunk(0, a.nbytes), off, 1)
        recvs = [] if pos == 0 else \
            [_Recv(self.links[(self.rank - 1) % self.world], c.offset, c.length) for c in chs]
        sends = []
        if pos < self.world - 1:
            nxt = self.links[(self.rank + 1) % self.world]
            sends = [_Send(nxt, c.offset, c.length, recvs[i] if recvs else None)
                     for i, c in enumerate(chs)]
        self._run(sends, recvs, "broadcast")
        if pos != 0:
            self._back(a, off, copied)
        return a

    def send(self, a: np.ndarray, dst: int) -> None:
        off, _ = self._place(a)
        self._run([_Send(self._peer(dst), c.offset, c.length)
                   for c in self._chunks(Chunk(0, a.nbytes), off, 1)], [], "send")

    def recv(self, a: np.ndarray, src: int) -> np.ndarray:
        off, copied = self._place(a)
        self._run([], [_Recv(self._peer(src), c.offset, c.length)
                       for c in self._chunks(Chunk(0, a.nbytes), off, 1)], "recv")
        self._back(a, off, copied)
        return a

    def barrier(self) -> None:
        """No rank leaves before every rank entered: an allreduce of one token per rank
        (in the scratch area, so it never touches a caller's buffer)."""
        if self.world == 1:
            return
        tok = self._u8[:8].view(np.int64)
        tok[0] = 1
        segs = R.segments(1, self.world, 8)
        self._ring_reduce_scatter(0, segs, tok.dtype, "int64", "sum", 1, "barrier")
        self._ring_allgather(0, segs, 8, 1, "barrier")
        if int(tok[0]) != self.world:
            raise CollectiveError(f"barrier counted {int(tok[0])} of {self.world} ranks")

    def _peer(self, p: int) -> _Link:
        if p == self.rank or p not in self.links:
            raise CollectiveError(f"rank {p} is not a peer of rank {self.rank}")
        return self.links[p]

    # -- accounting, teardown --
    def qp_stats(self) -> dict[int, dict]:
        """Per peer: the QP's counters (sent_bytes, rx_bytes, retransmits, mode, ...)."""
        return {p: link.qp.query() for p, link in self.links.items()}

    def sent_bytes(self) -> int:
        return sum(s["sent_bytes"] for s in self.qp_stats().values())

    def close(self) -> None:
        for link in list(self.links.values()):
            try:
                link.conn.close()
            except Exception:  # noqa: BLE001 (the peer may be gone already)
                pass
        self.links.clear()
        self._u8 = self._stage_u8 = None
        self._ctrl_mv = None
        for mr in [self.data, self.stage, self.ctrl, *self._retired]:
            if mr is not None:
                try:
                    mr.close()
                except (BufferError, Exception):  # noqa: BLE001
                    pass
        self.data = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def new_job() -> int:
    return secrets.randbits(63)
