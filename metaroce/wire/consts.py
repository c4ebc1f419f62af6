"""Wire constants: the single source of truth for opcodes, syndromes, sizes and ports.

Names follow the IBTA specification as spelled in Linux ``include/rdma/ib_pack.h`` and rxe;
MetaRoCE additions use the manufacturer-specific opcode space 0xC0-0xFF and an ``MR_`` prefix.
"""

from enum import IntEnum

# --- Encapsulation ---------------------------------------------------------------------------
ROCEV2_UDP_PORT = 4791
ETH_P_IPV4 = 0x0800
ETH_P_IPV6 = 0x86DD
ETH_P_8021Q = 0x8100
IPPROTO_UDP = 17
UDP_SPORT_MIN = 0xC000  # IB_ROCE_UDP_ENCAP_VALID_PORT_MIN
UDP_SPORT_MAX = 0xFFFF  # IB_ROCE_UDP_ENCAP_VALID_PORT_MAX
DEFAULT_PKEY = 0xFFFF
ECN_NOT_ECT, ECN_ECT1, ECN_ECT0, ECN_CE = 0, 1, 2, 3
DSCP_DATA_DEFAULT = 26
DSCP_CNP_DEFAULT = 48

# --- Header sizes (bytes) ----------------------------------------------------------------------
ETH_LEN = 14
VLAN_LEN = 4
IPV4_MIN_LEN = 20
IPV6_LEN = 40
UDP_LEN = 8
BTH_LEN = 12
RETH_LEN = 16
AETH_LEN = 4
IMMDT_LEN = 4
IETH_LEN = 4
ATOMICETH_LEN = 28
ATOMICACKETH_LEN = 8
CNP_PAD_LEN = 16
ICRC_LEN = 4
PETH_LEN = 20
SACKETH_LEN = 32
CREDITETH_LEN = 8
CMETH_LEN = 52
SACK_BITMAP_BITS = 128

# --- BTH ---------------------------------------------------------------------------------------
BTH_TVER = 0
PSN_BITS = 24
PSN_MASK = (1 << PSN_BITS) - 1
PSN_HALF = 1 << (PSN_BITS - 1)  # 2^23: the largest forward distance still "ahead"
QPN_MASK = 0xFFFFFF
MSN_MASK = 0xFFFFFF
GSI_QPN = 1  # QP1, the connection-management QP

TRANSPORT_RC = 0x00
TRANSPORT_UC = 0x20
TRANSPORT_RD = 0x40
TRANSPORT_UD = 0x60
TRANSPORT_CNP = 0x80
TRANSPORT_XRC = 0xA0
TRANSPORT_MANUFACTURER = 0xC0  # 0xC0-0xFF: manufacturer-specific, MetaRoCE lives here


class Opcode(IntEnum):
    """Every BTH opcode this codec understands (RC, CNP and MetaRoCE extensions)."""

    RC_SEND_FIRST = 0x00
    RC_SEND_MIDDLE = 0x01
    RC_SEND_LAST = 0x02
    RC_SEND_LAST_WITH_IMMEDIATE = 0x03
    RC_SEND_ONLY = 0x04
    RC_SEND_ONLY_WITH_IMMEDIATE = 0x05
    RC_RDMA_WRITE_FIRST = 0x06
    RC_RDMA_WRITE_MIDDLE = 0x07
    RC_RDMA_WRITE_LAST = 0x08
    RC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x09
    RC_RDMA_WRITE_ONLY = 0x0A
    RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x0B
    RC_RDMA_READ_REQUEST = 0x0C
    RC_RDMA_READ_RESPONSE_FIRST = 0x0D
    RC_RDMA_READ_RESPONSE_MIDDLE = 0x0E
    RC_RDMA_READ_RESPONSE_LAST = 0x0F
    RC_RDMA_READ_RESPONSE_ONLY = 0x10
    RC_ACKNOWLEDGE = 0x11
    RC_ATOMIC_ACKNOWLEDGE = 0x12
    RC_COMPARE_SWAP = 0x13
    RC_FETCH_ADD = 0x14
    RC_SEND_LAST_WITH_INVALIDATE = 0x16
    RC_SEND_ONLY_WITH_INVALIDATE = 0x17
    CNP = 0x81
    # MetaRoCE data opcodes: 0xC0 | the RC opcode with the same sequence semantics.
    MR_SEND_FIRST = 0xC0
    MR_SEND_MIDDLE = 0xC1
    MR_SEND_LAST = 0xC2
    MR_SEND_LAST_WITH_IMMEDIATE = 0xC3
    MR_SEND_ONLY = 0xC4
    MR_SEND_ONLY_WITH_IMMEDIATE = 0xC5
    MR_RDMA_WRITE_FIRST = 0xC6
    MR_RDMA_WRITE_MIDDLE = 0xC7
    MR_RDMA_WRITE_LAST = 0xC8
    MR_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0xC9
    MR_RDMA_WRITE_ONLY = 0xCA
    MR_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0xCB
    MR_RDMA_READ_REQUEST = 0xCC
    MR_RDMA_READ_RESPONSE_FIRST = 0xCD
    MR_RDMA_READ_RESPONSE_MIDDLE = 0xCE
    MR_RDMA_READ_RESPONSE_LAST = 0xCF
    MR_RDMA_READ_RESPONSE_ONLY = 0xD0
    MR_SACK = 0xD1
    MR_ATOMIC_ACKNOWLEDGE = 0xD2
    MR_COMPARE_SWAP = 0xD3
    MR_FETCH_ADD = 0xD4
    MR_SEND_LAST_WITH_INVALIDATE = 0xD6
    MR_SEND_ONLY_WITH_INVALIDATE = 0xD7
    # MetaRoCE control opcodes.
    MR_CREDIT = 0xE0
    MR_CM = 0xE1
    MR_PROBE = 0xE2


OPCODE_NAMES = {int(op): op.name for op in Opcode}
METAROCE_OPCODE_MIN = 0xC0
METAROCE_OPCODE_MAX = 0xFF


def is_metaroce(opcode: int) -> bool:
    return METAROCE_OPCODE_MIN <= opcode <= METAROCE_OPCODE_MAX


# --- AETH --------------------------------------------------------------------------------------
AETH_TYPE_MASK = 0x60
AETH_VALUE_MASK = 0x1F
AETH_RESERVED_BIT = 0x80


class AethType(IntEnum):
    ACK = 0x00
    RNR_NAK = 0x20
    RESERVED = 0x40
    NAK = 0x60


class NakCode(IntEnum):
    """AETH NAK codes (syndrome = 0x60 | code)."""

    PSN_SEQ_ERROR = 0
    INVALID_REQUEST = 1
    REMOTE_ACCESS_ERROR = 2
    REMOTE_OPERATIONAL_ERROR = 3
    INVALID_RD_REQUEST = 4


AETH_ACK_UNLIMITED = 0x1F  # ACK credit code 31: credits invalid / unlimited

# ACK credit codes 0..30 -> number of receive WQEs (IBTA end-to-end credit encoding).
AETH_CREDIT_TABLE = (
    0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768,
    1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
)

# RNR NAK timer codes 0..31 -> microseconds (IB_RNR_TIMER_*; code 0 is the longest).
RNR_TIMER_USEC = (
    655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920, 2560,
    3840, 5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122880, 163840,
    245760, 327680, 491520,
)

LOCAL_ACK_TIMEOUT_UNIT_NS = 4096  # 4.096 us x 2^timeout; timeout 0 = infinite

# --- MetaRoCE extension fields -----------------------------------------------------------------
PETH_F_RETX = 0x80  # this packet is a retransmission
PETH_F_ACK_NOW = 0x40  # receiver should send a SACK immediately (tail / probe)
PETH_FLAGS_DEFINED = PETH_F_RETX | PETH_F_ACK_NOW

SACK_F_ECE = 0x80  # the packet that triggered this SACK arrived CE-marked
SACK_F_OOO = 0x40  # triggered by an out-of-order arrival
SACK_F_PROBE_REPLY = 0x20  # answers an MR_PROBE
SACK_F_CREDIT_VALID = 0x10  # credit_limit_psn is valid
SACK_FLAGS_DEFINED = SACK_F_ECE | SACK_F_OOO | SACK_F_PROBE_REPLY | SACK_F_CREDIT_VALID

CREDIT_F_ACTIVE = 0x80  # credit mode on: the limit binds; clear: unlimited again
CREDIT_FLAGS_DEFINED = CREDIT_F_ACTIVE


class CmType(IntEnum):
    CONNECT_REQ = 1
    CONNECT_REP = 2
    REJECT = 3
    READY = 4
    DISCONNECT = 5


class CmReject(IntEnum):
    NONE = 0
    NO_RESOURCES = 1
    BAD_VERSION = 2
    UNSUPPORTED_CAPS = 3
    INVALID_PARAMS = 4
    CONSUMER_REJECT = 5


class Cap(IntEnum):
    """MetaRoCE capability bits (CMETH.caps)."""

    SACK = 1 << 0
    PLACEMENT = 1 << 1
    MULTIPATH = 1 << 2
    CREDIT = 1 << 3
    DELAY_TS = 1 << 4
    CNP_EXT = 1 << 5
    CSUM = 1 << 6      # the IPv4/UDP checksums as the connection's integrity check (INT-1)


CAPS_DEFINED = sum(int(c) for c in Cap)
CM_VERSION = 3  # the highest CMETH version this end implements (VER-2); version 1 is withdrawn
CM_VERSIONS = (2, 3)  # 3: byte 31 carries the fitted MTU offer (CM-14); 2: it is reserved
CMETH_MAGIC = 0x4D52434D  # "MRCM": every CMETH block starts with it (VER-4)
CM_TCP_PORT = 4791  # the CM side channel's default TCP port (VER-5)
CMETH_PREFIX_LEN = 12  # magic, type, version, reject reason, txn id: the same in every version
MAX_PATHS = 64

# IB MTU enum -> bytes
MTU_CODES = {1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096}
# CM-14: a MetaRoCE connection's fitted path MTU, any multiple of FITTED_MTU_UNIT in this range
FITTED_MTU_UNIT, FITTED_MTU_MIN, FITTED_MTU_MAX = 64, 256, 8192


def path_mtu_ok(mtu: int, metaroce: bool) -> bool:
    """QP-4 / CM-14: an IB MTU in either mode; in MetaRoCE mode also a fitted one."""
    return mtu in MTU_CODES.values() or (
        metaroce and FITTED_MTU_MIN <= mtu <= FITTED_MTU_MAX and mtu % FITTED_MTU_UNIT == 0)
