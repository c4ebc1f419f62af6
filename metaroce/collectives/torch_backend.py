"""The `torch.distributed` backend "metaroce": a Python ProcessGroup whose collectives run on
`metaroce.collectives.Communicator` (RDMA WRITE with immediate over MetaRoCE QPs), registered
with `Backend.register_backend` when this module is imported:

    import metaroce.collectives.torch_backend          # registers "metaroce"
    torch.distributed.init_process_group("metaroce", rank=r, world_size=n)   # MASTER_ADDR/PORT

Each rank opens its host's device: METAROCE_DEV (default eth0) in METAROCE_NETNS (default: the
daemon of the current namespace). The ranks find each other through the store torch was given
(MASTER_ADDR / MASTER_PORT): each publishes its device address (METAROCE_ADDR, else the device's
first IPv4 address), rank 0 publishes a job id, and the QPs are connected through metaroce.cm on
METAROCE_PORT + rank (default 18600 + rank). Work completes before the call returns (CPU
tensors); nothing here creates a Gloo or any other process group."""

from __future__ import annotations

import os
import secrets
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from ..verbs import CQ, PD, QP, Context, QPInitAttr
from .comm import DEFAULT_PORT, Communicator
from .reduce import CollectiveError

NAME = "metaroce"
_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
           torch.float64: "float64", torch.int32: "int32", torch.int64: "int64",
           torch.uint8: "uint8"}
_OPS = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.MIN: "min", dist.ReduceOp.MAX: "max",
        dist.ReduceOp.AVG: "avg", dist.ReduceOp.PRODUCT: "prod"}


def as_numpy(t: torch.Tensor) -> tuple[np.ndarray, str]:
    """A numpy view of a CPU tensor's memory (bfloat16 as its raw bits) and its type name."""
    if t.device.type != "cpu":
        raise CollectiveError(f"the metaroce backend takes CPU tensors, not {t.device}")
    try:
        name = _DTYPES[t.dtype]
    except KeyError:
        raise CollectiveError(f"the metaroce backend does not reduce {t.dtype}") from None
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16), name
    return t.numpy(), name


def _op(reduce_op) -> str:
    for k, v in _OPS.items():
        if reduce_op == k:
            return v
    raise CollectiveError(f"the metaroce backend does not support {reduce_op}")


class _Done(dist._Work):
    """A Work that completed before it was handed out."""

    def __init__(self, result: list[torch.Tensor]):
        super().__init__()
        self._result = result
        self._fut = torch.futures.Future()
        self._fut.set_result(result)

    def wait(self, timeout: timedelta | None = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def result(self) -> list[torch.Tensor]:
        return self._result

    def get_future(self) -> torch.futures.Future:
        return self._fut


def _device_addr(ctx: Context) -> str:
    """The device's first IPv4 address (what the daemon reports for a QP)."""
    pd = PD(ctx)
    cq = CQ(ctx, 1)
    qp = QP(pd, QPInitAttr(cq, cq))
    try:
        addrs = qp.attrs.get("addrs") or [qp.attrs["gid"]]
    finally:
        qp.close()
    v4 = [a for a in addrs if ":" not in a]
    return (v4 or addrs)[0]


class MetaroceProcessGroup(dist.ProcessGroup):
    def __init__(self, store, rank: int, size: int, timeout: timedelta):
        super().__init__(rank, size)
        self.ctx = Context(os.environ.get("METAROCE_DEV", "eth0"),
                           os.environ.get("METAROCE_NETNS") or None)
        addr = os.environ.get("METAROCE_ADDR") or _device_addr(self.ctx)
        store.set(f"metaroce/addr/{rank}", addr)
        if rank == 0:
            store.set("metaroce/job", str(secrets.randbits(63)))
        job = int(store.get("metaroce/job").decode())
        addrs = [store.get(f"metaroce/addr/{r}").decode() for r in range(size)]
        self.comm = Communicator(self.ctx, rank, size, addrs, job=job,
                                 port=int(os.environ.get("METAROCE_PORT", DEFAULT_PORT)),
                                 timeout_s=max(1.0, timeout.total_seconds()),
                                 chunk_bytes=int(os.environ.get("METAROCE_CHUNK", 1 << 20)))

    def getBackendName(self) -> str:
        return NAME

    def name(self) -> str:
        return NAME

    # -- collectives --
    def allreduce(self, tensors, opts=None):
        op = _op(opts.reduceOp) if opts is not None and hasattr(opts, "reduceOp") else "sum"
        for t in tensors:
            a, dt = as_numpy(t)
            self.comm.allreduce(a, op, dtype=dt)
        return _Done(tensors)

    def broadcast(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        for t in tensors:
            a, _ = as_numpy(t)
            self.comm.broadcast(a.reshape(-1) if a.flags.c_contiguous else a, root)
        return _Done(tensors)

    def allgather(self, output_tensors, input_tensors, opts=None):
        for outs, t in zip(output_tensors, input_tensors):
            a, _ = as_numpy(t)
            flat = np.empty(a.size * self.size(), a.dtype)
            self.comm.allgather(flat, np.ascontiguousarray(a).reshape(-1))
            for r, o in enumerate(outs):
                as_numpy(o)[0][...] = flat[r * a.size:(r + 1) * a.size].reshape(o.shape)
        return _Done(output_tensors)

    def _allgather_base(self, output, input, opts=None):
        out, _ = as_numpy(output)
        inp, _ = as_numpy(input)
        self.comm.allgather(out.reshape(-1) if out.flags.c_contiguous else out,
                            np.ascontiguousarray(inp).reshape(-1))
        return _Done([output])

    def _reduce_scatter_base(self, output, input, opts=None):
        op = _op(opts.reduceOp) if opts is not None else "sum"
        out, dt = as_numpy(output)
        inp, _ = as_numpy(input)
        self.comm.reduce_scatter(out, np.ascontiguousarray(inp).reshape(-1), op, dtype=dt)
        return _Done([output])

    def barrier(self, opts=None):
        self.comm.barrier()
        return _Done([])

    def send(self, tensors, dst: int, tag: int = 0):
        for t in tensors:
            self.comm.send(np.ascontiguousarray(as_numpy(t)[0]).reshape(-1), dst)
        return _Done(tensors)

    def recv(self, tensors, src: int, tag: int = 0):
        for t in tensors:
            self.comm.recv(as_numpy(t)[0], src)
        return _Done(tensors)

    def shutdown(self) -> None:
        self.comm.close()
        self.ctx.close()

    def sent_bytes(self) -> int:
        return self.comm.sent_bytes()


def _create(store, rank: int, size: int, timeout: timedelta) -> MetaroceProcessGroup:
    return MetaroceProcessGroup(store, rank, size, timeout)


def register() -> None:
    if NAME not in dist.Backend.backend_list:
        dist.Backend.register_backend(NAME, _create, devices=["cpu"])


register()
