"""The shared-memory verbs queues' binary layouts as Python sees them: struct formats derived
from the one definition in vq.h (through cffi's view of the compiled structs, so they cannot
drift), and the opcode names of work requests and completions by their codes."""

from __future__ import annotations

import struct

from .xsk import _lib

_CODES = {"uint8_t": "B", "uint16_t": "H", "uint32_t": "I", "uint64_t": "Q"}


def packer(ctype: str) -> tuple[struct.Struct, tuple[str, ...]]:
    """A struct.Struct for the C struct ctype, reserved fields and padding skipped, and the
    names of the fields it packs, in order."""
    ffi = _lib().ffi
    fmt, names, pos = "=", [], 0
    for name, f in ffi.typeof(ctype).fields:
        if f.offset > pos:
            fmt += f"{f.offset - pos}x"
        size = ffi.sizeof(f.type)
        if f.type.kind == "array" or name.startswith(("rsvd", "pad")):
            fmt += f"{size}x"
        else:
            fmt += _CODES[f.type.cname]
            names.append(name)
        pos = f.offset + size
    total = ffi.sizeof(ctype)
    if total > pos:
        fmt += f"{total - pos}x"
    s = struct.Struct(fmt)
    assert s.size == total, (ctype, fmt)
    return s, tuple(names)


def _consts() -> dict:
    lib = _lib().lib
    return {n: getattr(lib, n) for n in dir(lib) if n.startswith(("MR_VQ_", "MR_WR_", "MR_WC_",
                                                                   "MR_SEND_", "MR_WQE_",
                                                                   "MR_RECV_WQE", "MR_MAX_", "MR_RQ_"))}


C = _consts()
HDR_SIZE = C["MR_VQ_HDR_SIZE"]
SEND_WQE, SEND_WQE_FIELDS = packer("struct mr_send_wqe")
RECV_WQE, RECV_WQE_FIELDS = packer("struct mr_recv_wqe")
SGE, _ = packer("struct mr_sge")
CQE, CQE_FIELDS = packer("struct mr_cqe")
WQE_DATA, RECV_WQE_DATA = C["MR_WQE_DATA"], C["MR_RECV_WQE_DATA"]
MAX_SGE, MAX_INLINE = C["MR_MAX_SGE"], C["MR_MAX_INLINE"]

# work request opcodes (SendWR.opcode names, as the verbs enums spell them) <-> codes
WR_CODES = {n.removeprefix("MR_WR_"): v for n, v in C.items() if n.startswith("MR_WR_")}
WR_NAMES = {v: n for n, v in WR_CODES.items()}
# completion opcodes (WC.opcode names) <-> codes
WC_CODES = {n.removeprefix("MR_WC_"): v for n, v in C.items()
            if n.startswith("MR_WC_") and n not in ("MR_WC_WITH_IMM", "MR_WC_SOLICITED")}
WC_NAMES = {v: n for n, v in WC_CODES.items()}
WC_WITH_IMM, WC_SOLICITED = C["MR_WC_WITH_IMM"], C["MR_WC_SOLICITED"]


def stride_for(need: int) -> int:
    """A slot of at least need bytes: a power of two (slots never straddle a cache line
    needlessly and an index maps to an offset with a shift)."""
    return 1 << max(4, (need - 1).bit_length())


def ring_bytes(entries: int, stride: int) -> int:
    return HDR_SIZE + entries * stride
