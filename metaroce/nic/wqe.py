"""What makes a work request valid, decided once for both sides of the shared rings: the verbs
library checks a work request before it posts it (a clear error at once), and the daemon checks
every WQE again after copying it out of the application's ring (an application may write
anything there): a bad one completes with an error status and moves its QP to ERR, as on a
verbs device. The rules take the SGE check as a function, because each side looks regions up
in its own table."""

from __future__ import annotations

from typing import Callable, Sequence

from ..engine.wr import WcStatus
from ..errors import MetaroceError
from ..fastpath.vqlayout import C

MSG_WRITE, MSG_SEND, MSG_READ_RESP, MSG_READ_REQ, MSG_CMP_SWAP, MSG_FETCH_ADD = range(1, 7)
# work request opcode code -> (message kind, with immediate)
SEND_KINDS = {C["MR_WR_RDMA_WRITE"]: (MSG_WRITE, 0), C["MR_WR_RDMA_WRITE_WITH_IMM"]: (MSG_WRITE, 1),
              C["MR_WR_SEND"]: (MSG_SEND, 0), C["MR_WR_SEND_WITH_IMM"]: (MSG_SEND, 1),
              C["MR_WR_RDMA_READ"]: (MSG_READ_REQ, 0),
              C["MR_WR_ATOMIC_CMP_AND_SWP"]: (MSG_CMP_SWAP, 0),
              C["MR_WR_ATOMIC_FETCH_AND_ADD"]: (MSG_FETCH_ADD, 0)}
SEND_INLINE = C["MR_SEND_INLINE"]
ACCESS_LOCAL_WRITE = 1
MAX_MSG = 1 << 31
U64 = (1 << 64) - 1


class BadWqe(MetaroceError):
    """A work request no device would execute; `status` is its completion status."""

    def __init__(self, status: WcStatus, message: str):
        super().__init__(message)
        self.status = status


Sge = Sequence[int]                       # (addr, length, lkey)
CheckSge = Callable[[Sge, int], object]   # raises BadWqe; returns what the caller needs


def check_send(opcode: int, flags: int, sges: Sequence[Sge], inline_len: int, remote_addr: int,
               max_sge: int, max_inline: int, local: CheckSge) -> tuple[int, int, int, list]:
    """(message kind, with immediate, message length, local(sge, access) of each SGE)."""
    try:
        kind, imm = SEND_KINDS[opcode]
    except (KeyError, TypeError):
        raise BadWqe(WcStatus.LOC_QP_OP_ERR, f"unknown work request opcode {opcode!r}") from None
    if kind in (MSG_WRITE, MSG_SEND):
        if flags & SEND_INLINE:
            if not 0 <= inline_len <= max_inline:
                raise BadWqe(WcStatus.LOC_LEN_ERR,
                             f"inline data is at most {max_inline} bytes (max_inline_data)")
            return kind, imm, inline_len, []
        if len(sges) > max_sge:
            raise BadWqe(WcStatus.LOC_QP_OP_ERR,
                         f"{len(sges)} SGEs: this QP takes at most {max_sge} (max_send_sge)")
        parts = [local(s, 0) for s in sges]
        length = sum(int(s[1]) for s in sges)
    else:
        if len(sges) != 1:
            raise BadWqe(WcStatus.LOC_QP_OP_ERR, "READ and atomics take exactly one SGE")
        parts = [local(sges[0], ACCESS_LOCAL_WRITE)]
        length = int(sges[0][1])
        if kind != MSG_READ_REQ:
            if length != 8:
                raise BadWqe(WcStatus.LOC_LEN_ERR, "an atomic's SGE is 8 bytes")
            if remote_addr & 7:
                raise BadWqe(WcStatus.LOC_QP_OP_ERR,
                             "an atomic's remote_addr must be 8-byte aligned")
    if length > MAX_MSG:
        raise BadWqe(WcStatus.LOC_LEN_ERR, f"message longer than max_msg_sz {MAX_MSG}")
    return kind, imm, length, parts


def check_recv(sges: Sequence[Sge], local: CheckSge) -> object:
    """local(sge, LOCAL_WRITE) of the receive's one SGE."""
    if len(sges) != 1:
        raise BadWqe(WcStatus.LOC_QP_OP_ERR, "a receive takes exactly one SGE here")
    return local(sges[0], ACCESS_LOCAL_WRITE)


def check_sge_in(sge: Sge, lkey: int, mr_addr: int, mr_length: int, mr_access: int,
                 need: int) -> tuple[int, int]:
    """An SGE within one region (found by its lkey) with the access it needs: (addr, length)."""
    addr, length = int(sge[0]), int(sge[1])
    if need and not mr_access & need:
        raise BadWqe(WcStatus.LOC_PROT_ERR, f"lkey 0x{lkey:08x} lacks local write access")
    if length < 0 or addr < mr_addr or addr + length > mr_addr + mr_length:
        raise BadWqe(WcStatus.LOC_PROT_ERR,
                     f"SGE [0x{addr:x}, {length}] is outside lkey 0x{lkey:08x}")
    return addr, length


def not_in_pd(lkey: int) -> BadWqe:
    return BadWqe(WcStatus.LOC_PROT_ERR, f"lkey 0x{lkey:08x} is not a region of this QP's PD")
