"""Rank functions for the collectives tests: each runs in its own spawned process and opens
its host's device (Context("eth0", netns)) through the daemon's socket."""

import numpy as np

from metaroce.collectives import Communicator
from metaroce.collectives import reduce as R
from metaroce.verbs import Context

CASES = [(dt, op) for dt in ("float32", "float16", "bfloat16", "int32", "int64")
         for op in ("sum", "min", "max", "avg")]
SIZES = (1, 10007)          # fewer elements than ranks; several chunks and uneven segments


def rank_data(seed: int, rank: int, dtype: str, n: int) -> np.ndarray:
    rng = np.random.default_rng([seed, rank, n, list(R.DTYPES).index(dtype)])
    if dtype in ("int32", "int64"):
        return rng.integers(-1000, 1000, n).astype(dtype)
    x = rng.uniform(-4, 4, n).astype(np.float32)
    return R.f32_to_bf16(x) if dtype == "bfloat16" else x.astype(dtype)


def _comm(rank, world, addrs, netns, job, **kw):
    ctx = Context("eth0", netns[rank])
    return ctx, Communicator(ctx, rank, world, addrs, job=job, **kw)


def allreduce_rank(rank, world, addrs, netns, job, seed):
    ctx, c = _comm(rank, world, addrs, netns, job, chunk_bytes=4096, slots=3, algorithm="ring")
    try:
        out = {}
        before = c.sent_bytes()
        for n in SIZES:
            for dt, op in CASES:
                a = rank_data(seed, rank, dt, n)
                c.allreduce(a, op, dtype=dt if dt == "bfloat16" else None)
                out[(dt, op, n)] = a
        # in registered memory, no copy: the same array object is reduced in place
        big = c.buffer(1 << 18, "float32")
        big[:] = np.arange(1 << 18, dtype=np.float32) * (rank + 1)
        b0 = c.sent_bytes()
        c.allreduce(big, "sum")
        moved = c.sent_bytes() - b0
        out["big"] = big.copy()
        out["moved"] = (moved, R.ring_allreduce_bytes(big.nbytes, world))
        out["modes"] = sorted(set(c.mode.values()))
        out["sent_total"] = c.sent_bytes() - before
        del big
        return out
    finally:
        c.close()
        ctx.close()


def others_rank(rank, world, addrs, netns, job):
    ctx, c = _comm(rank, world, addrs, netns, job, chunk_bytes=8192)
    try:
        out = {}
        b = np.full(30001, -1, np.int32) if rank != 1 else np.arange(30001, dtype=np.int32)
        out["bcast"] = c.broadcast(b, root=1).copy()
        g = np.zeros(world * 5001, np.float64)
        out["allgather"] = c.allgather(g, np.full(5001, rank + 0.5)).copy()
        rs = np.zeros(3000, np.float32)
        inp = np.tile(np.arange(3000, dtype=np.float32), world) * (rank + 1)
        out["reduce_scatter"] = c.reduce_scatter(rs, inp, "sum").copy()
        for _ in range(3):
            c.barrier()
        if world >= 2:
            if rank == 0:
                c.send(np.arange(70000, dtype=np.int64), 1)
                out["p2p"] = c.recv(np.zeros(3, np.int64), 1).copy()
            elif rank == 1:
                out["p2p"] = c.recv(np.zeros(70000, np.int64), 0).copy()
                c.send(np.array([7, 8, 9], np.int64), 0)
        c.barrier()
        return out
    finally:
        c.close()
        ctx.close()


def tree_rank(rank, world, addrs, netns, job, seed, arity):
    """Every case through the tree (and, for comparison, the ring), plus the bytes it moved."""
    ctx, c = _comm(rank, world, addrs, netns, job, chunk_bytes=4096, slots=3,
                   algorithm="tree", tree_arity=arity)
    try:
        out = {}
        for n in SIZES:
            for dt, op in CASES:
                a = rank_data(seed, rank, dt, n)
                c.allreduce(a, op, dtype=dt if dt == "bfloat16" else None)
                out[(dt, op, n)] = a
        big = c.buffer(1 << 16, "float32")
        big[:] = np.arange(1 << 16, dtype=np.float32) * (rank + 1)
        b0 = c.sent_bytes()
        c.allreduce(big, "sum")
        out["moved"] = (c.sent_bytes() - b0,
                        R.tree_allreduce_bytes(big.nbytes, world, rank, arity))
        out["big"] = big.copy()
        del big
        return out
    finally:
        c.close()
        ctx.close()


def lossy_rank(rank, world, addrs, netns, job):
    """Ring (1 MiB) and tree (64 KiB) allreduces while the lab drops 1 % of every link's
    packets: the results and the QPs' retransmission counters."""
    ctx, c = _comm(rank, world, addrs, netns, job, chunk_bytes=64 << 10, slots=4)
    try:
        out = {}
        for algo, n in (("ring", 1 << 18), ("tree", 1 << 14)):
            c.algorithm = algo
            for i in range(3):
                a = (np.arange(n, dtype=np.float32) % 251) * (rank + 1) + i
                c.allreduce(a, "sum")
                out[(algo, i)] = a
        out["retransmitted"] = sum(s.get("retransmitted_packets", 0)
                                   for s in c.qp_stats().values())
        out["modes"] = sorted(set(c.mode.values()))
        return out
    finally:
        c.close()
        ctx.close()
