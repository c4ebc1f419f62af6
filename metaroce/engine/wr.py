"""Work requests and completions, named after ibv_wr_opcode / ibv_wc_opcode / ibv_wc_status."""

from dataclasses import dataclass, field
from enum import Enum, IntEnum


class WrOpcode(Enum):
    RDMA_WRITE = "IBV_WR_RDMA_WRITE"
    RDMA_WRITE_WITH_IMM = "IBV_WR_RDMA_WRITE_WITH_IMM"
    SEND = "IBV_WR_SEND"
    SEND_WITH_IMM = "IBV_WR_SEND_WITH_IMM"
    RDMA_READ = "IBV_WR_RDMA_READ"
    ATOMIC_CMP_AND_SWP = "IBV_WR_ATOMIC_CMP_AND_SWP"
    ATOMIC_FETCH_AND_ADD = "IBV_WR_ATOMIC_FETCH_AND_ADD"


class WcOpcode(Enum):
    SEND = "IBV_WC_SEND"
    RDMA_WRITE = "IBV_WC_RDMA_WRITE"
    RDMA_READ = "IBV_WC_RDMA_READ"
    COMP_SWAP = "IBV_WC_COMP_SWAP"
    FETCH_ADD = "IBV_WC_FETCH_ADD"
    RECV = "IBV_WC_RECV"
    RECV_RDMA_WITH_IMM = "IBV_WC_RECV_RDMA_WITH_IMM"


class WcStatus(IntEnum):
    """Values as in enum ibv_wc_status."""

    SUCCESS = 0
    LOC_LEN_ERR = 1
    LOC_QP_OP_ERR = 2
    LOC_EEC_OP_ERR = 3
    LOC_PROT_ERR = 4
    WR_FLUSH_ERR = 5
    MW_BIND_ERR = 6
    BAD_RESP_ERR = 7
    LOC_ACCESS_ERR = 8
    REM_INV_REQ_ERR = 9
    REM_ACCESS_ERR = 10
    REM_OP_ERR = 11
    RETRY_EXC_ERR = 12
    RNR_RETRY_EXC_ERR = 13
    FATAL_ERR = 19
    RESP_TIMEOUT_ERR = 20
    GENERAL_ERR = 21


WC_OF_WR = {
    WrOpcode.RDMA_WRITE: WcOpcode.RDMA_WRITE,
    WrOpcode.RDMA_WRITE_WITH_IMM: WcOpcode.RDMA_WRITE,
    WrOpcode.SEND: WcOpcode.SEND,
    WrOpcode.SEND_WITH_IMM: WcOpcode.SEND,
    WrOpcode.RDMA_READ: WcOpcode.RDMA_READ,
    WrOpcode.ATOMIC_CMP_AND_SWP: WcOpcode.COMP_SWAP,
    WrOpcode.ATOMIC_FETCH_AND_ADD: WcOpcode.FETCH_ADD,
}
ATOMICS = (WrOpcode.ATOMIC_CMP_AND_SWP, WrOpcode.ATOMIC_FETCH_AND_ADD)
NEEDS_RESPONSE = (WrOpcode.RDMA_READ, *ATOMICS)


@dataclass
class SendWR:
    """One send-queue work request with a single local buffer (one SGE).

    For SEND/WRITE the payload is ``local[offset:offset+length]`` (captured at post time);
    for READ the response is placed there; for atomics the 8-byte original value is.
    """

    wr_id: int
    opcode: WrOpcode
    local: bytearray | bytes = b""
    offset: int = 0
    length: int = 0
    remote_addr: int = 0
    rkey: int = 0
    imm: int | None = None
    compare_add: int = 0
    swap: int = 0

    def __post_init__(self):
        if self.opcode in ATOMICS:
            self.length = 8
        if self.offset < 0 or self.length < 0 or self.offset + self.length > len(self.local):
            raise ValueError("SGE outside the local buffer")
        if self.opcode in (WrOpcode.SEND_WITH_IMM, WrOpcode.RDMA_WRITE_WITH_IMM) and self.imm is None:
            raise ValueError(f"{self.opcode.name} needs imm")


@dataclass
class RecvWR:
    wr_id: int
    buf: bytearray
    offset: int = 0
    length: int | None = None

    def __post_init__(self):
        if self.length is None:
            self.length = len(self.buf) - self.offset


@dataclass
class Completion:
    wr_id: int
    status: WcStatus
    opcode: WcOpcode
    byte_len: int = 0
    imm: int | None = None
    qp_num: int = 0
    extra: dict = field(default_factory=dict)
