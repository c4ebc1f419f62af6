"""The pure parts of the collectives: element types (bfloat16 carried as its raw 16 bits, since
numpy has no bfloat16), reduction operators applied in place, and how a buffer is cut into ring
segments and pipeline chunks. No I/O here, so all of it is unit-tested on its own."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import MetaroceError


class CollectiveError(MetaroceError):
    """A collective failed (bad arguments, a peer's error completion, a protocol violation)."""


# name -> (numpy storage dtype, is the storage raw bfloat16 bits)
DTYPES: dict[str, tuple[np.dtype, bool]] = {
    "float32": (np.dtype(np.float32), False),
    "float16": (np.dtype(np.float16), False),
    "bfloat16": (np.dtype(np.uint16), True),
    "float64": (np.dtype(np.float64), False),
    "int32": (np.dtype(np.int32), False),
    "int64": (np.dtype(np.int64), False),
    "uint8": (np.dtype(np.uint8), False),
}
OPS = ("sum", "min", "max", "avg", "prod")


def storage(dtype: str) -> np.dtype:
    try:
        return DTYPES[dtype][0]
    except KeyError:
        raise CollectiveError(f"unsupported element type {dtype!r} "
                              f"(one of {', '.join(DTYPES)})") from None


def dtype_name(dt) -> str:
    """A numpy dtype's name in DTYPES (uint16 is not accepted: say "bfloat16" explicitly)."""
    name = np.dtype(dt).name
    if name not in DTYPES or name == "bfloat16":
        raise CollectiveError(f"unsupported element type {name}")
    return name


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round to nearest even, as torch does; NaNs stay (quiet) NaNs."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        rounded[nan] = ((u[nan] >> 16) | np.uint32(0x40)).astype(np.uint16)
    return rounded


_UFUNC = {"sum": np.add, "avg": np.add, "prod": np.multiply, "min": np.minimum,
          "max": np.maximum}


def check_op(op: str) -> str:
    if op not in OPS:
        raise CollectiveError(f"unsupported reduction {op!r} (one of {', '.join(OPS)})")
    return op


def reduce_into(dst: np.ndarray, src: np.ndarray, op: str, dtype: str) -> None:
    """dst = dst (op) src, elementwise, in place; avg accumulates a sum (see finish)."""
    uf = _UFUNC[check_op(op)]
    if DTYPES[dtype][1]:
        dst[...] = f32_to_bf16(uf(bf16_to_f32(dst), bf16_to_f32(src)))
    else:
        uf(dst, src, out=dst)


def finish(buf: np.ndarray, op: str, dtype: str, world: int) -> None:
    """What is left after the sum for avg: divide by the number of ranks (integers: floor)."""
    if op != "avg" or world == 1:
        return
    if DTYPES[dtype][1]:
        buf[...] = f32_to_bf16(bf16_to_f32(buf) / np.float32(world))
    elif buf.dtype.kind in "iu":
        np.floor_divide(buf, world, out=buf)
    else:
        # in the element type, as torch divides a float16 tensor by an integer
        buf[...] = (buf / buf.dtype.type(world)).astype(buf.dtype)


@dataclass(frozen=True)
class Chunk:
    offset: int          # bytes from the start of the buffer
    length: int          # bytes


def segments(count: int, parts: int, itemsize: int) -> list[Chunk]:
    """Cut count elements into `parts` contiguous segments (element-aligned, sizes differing by
    at most one element, earlier ones larger); empty segments are allowed."""
    if parts <= 0:
        raise CollectiveError("parts must be positive")
    base, extra = divmod(count, parts)
    out, off = [], 0
    for i in range(parts):
        n = base + (1 if i < extra else 0)
        out.append(Chunk(off * itemsize, n * itemsize))
        off += n
    return out


def chunks(seg: Chunk, chunk_bytes: int, itemsize: int) -> list[Chunk]:
    """Cut a segment into pipeline chunks of at most chunk_bytes (rounded down to whole
    elements, at least one element); an empty segment has no chunks."""
    step = max(itemsize, chunk_bytes - chunk_bytes % itemsize)
    return [Chunk(seg.offset + o, min(step, seg.length - o)) for o in range(0, seg.length, step)]


def ring_allreduce_bytes(nbytes: int, world: int) -> int:
    """What each rank sends in a ring allreduce of nbytes: 2 (N-1)/N of the buffer."""
    return 0 if world == 1 else 2 * (world - 1) * nbytes // world


def tree_allreduce_bytes(nbytes: int, world: int, rank: int, arity: int = 2) -> int:
    """What rank sends in a tree allreduce: the buffer once up (unless root), once per child."""
    children = sum(1 for c in range(arity * rank + 1, arity * rank + arity + 1) if c < world)
    return nbytes * ((rank != 0) + children)


def bus_bandwidth(nbytes: int, seconds: float, world: int) -> float:
    """nccl-tests' bus bandwidth of an allreduce, bytes/s: algbw * 2 (N-1)/N."""
    return nbytes / seconds * (2 * (world - 1) / world) if seconds > 0 else 0.0
