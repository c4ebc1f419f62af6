"""Codec-independent packet objects the engine consumes and emits.

Mapping to the wire (metaroce.wire.headers; docs/spec 02 and 05):

=================  ===========================================================
field              wire
=================  ===========================================================
opcode             BTH.OpCode (metaroce.wire.consts.Opcode; MR_* = 0xC0|RC op)
psn, dest_qp       BTH.PSN, BTH.DestQP
ack_req            BTH.AckReq (compat); in MetaRoCE mode also PETH ACK_NOW
reth               RETH (VA, R_Key, DMA length); MetaRoCE: on every WRITE packet
aeth               AETH (syndrome, MSN)
immdt              ImmDt
atomic             AtomicETH (VA, R_Key, swap/add, compare)
atomic_ack         AtomicAckETH (original value)
sack               SACKETH.bitmap (cumulative PSN = BTH.PSN of the MR_SACK)
place              PETH (SSN, RSN, Offset); MetaRoCE data/READ/ATOMIC only
retx               PETH.flags RETX
ts                 PETH.Timestamp (ns mod 2^32); echoed in SACKETH.ts_echo
path               PETH.PathID (requests); SACKETH.PathID (echo of the trigger)
sport              UDP source port (entropy; MP-1, COMPAT-5)
ce                 IP ECN field == CE (set by switches; the ICRC masks it)
ecn_echo           SACKETH.flags ECE
ce_count           SACKETH.CE Count
ts_echo            SACKETH.Timestamp Echo
credit_limit       SACKETH.Credit Limit PSN when flags CREDIT_VALID, else None
probe_reply        SACKETH.flags PROBE_REPLY
grant              MR_CREDIT's CREDITETH: (active, limit PSN, rate Mbit/s); psn = grant seq
payload            payload bytes (pad and ICRC are the codec's job)
=================  ===========================================================
"""

from dataclasses import dataclass, field

from metaroce.wire.consts import Opcode, is_metaroce

O = Opcode


@dataclass(frozen=True)
class Reth:
    va: int
    rkey: int
    length: int


@dataclass(frozen=True)
class Aeth:
    syndrome: int
    msn: int


@dataclass(frozen=True)
class AtomicEth:
    va: int
    rkey: int
    swap_add: int
    compare: int = 0


@dataclass(frozen=True)
class Placement:
    ssn: int
    rsn: int
    offset: int


@dataclass(frozen=True, slots=True)
class Packet:
    opcode: int
    psn: int
    dest_qp: int = 0
    ack_req: bool = False
    reth: Reth | None = None
    aeth: Aeth | None = None
    immdt: int | None = None
    atomic: AtomicEth | None = None
    atomic_ack: int | None = None
    sack: int | None = None
    place: Placement | None = None
    retx: bool = False
    ts: int = 0
    payload: bytes = field(default=b"", repr=False)
    path: int = 0
    sport: int = 0
    ce: bool = False
    ecn_echo: bool = False
    ce_count: int = 0
    ts_echo: int = 0
    credit_limit: int | None = None
    probe_reply: bool = False
    grant: tuple | None = None


def base(opcode: int) -> Opcode:
    """The RC opcode with the same meaning (MR_x -> RC_x; MR_SACK -> RC_ACKNOWLEDGE)."""
    return Opcode(opcode & 0x3F) if is_metaroce(opcode) else Opcode(opcode)


def to_mode(rc_opcode: Opcode, metaroce: bool) -> int:
    return int(rc_opcode) | 0xC0 if metaroce else int(rc_opcode)


SEND_FIRST = {O.RC_SEND_FIRST}
SEND_MIDDLE = {O.RC_SEND_MIDDLE}
SEND_LAST = {O.RC_SEND_LAST, O.RC_SEND_LAST_WITH_IMMEDIATE}
SEND_ONLY = {O.RC_SEND_ONLY, O.RC_SEND_ONLY_WITH_IMMEDIATE}
WRITE_FIRST = {O.RC_RDMA_WRITE_FIRST}
WRITE_MIDDLE = {O.RC_RDMA_WRITE_MIDDLE}
WRITE_LAST = {O.RC_RDMA_WRITE_LAST, O.RC_RDMA_WRITE_LAST_WITH_IMMEDIATE}
WRITE_ONLY = {O.RC_RDMA_WRITE_ONLY, O.RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE}
SENDS = SEND_FIRST | SEND_MIDDLE | SEND_LAST | SEND_ONLY
WRITES = WRITE_FIRST | WRITE_MIDDLE | WRITE_LAST | WRITE_ONLY
WITH_IMM = {O.RC_SEND_LAST_WITH_IMMEDIATE, O.RC_SEND_ONLY_WITH_IMMEDIATE,
            O.RC_RDMA_WRITE_LAST_WITH_IMMEDIATE, O.RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE}
ATOMIC_REQ = {O.RC_COMPARE_SWAP, O.RC_FETCH_ADD}
READ_REQ = {O.RC_RDMA_READ_REQUEST}
REQUESTS = SENDS | WRITES | ATOMIC_REQ | READ_REQ
# SEND with invalidate (optional, spec HDR-14): not implemented, so an invalid request (HDR-15)
SEND_INVALIDATE = {O.RC_SEND_LAST_WITH_INVALIDATE, O.RC_SEND_ONLY_WITH_INVALIDATE}
READ_RESP = {O.RC_RDMA_READ_RESPONSE_FIRST, O.RC_RDMA_READ_RESPONSE_MIDDLE,
             O.RC_RDMA_READ_RESPONSE_LAST, O.RC_RDMA_READ_RESPONSE_ONLY}
RESPONSES = READ_RESP | {O.RC_ACKNOWLEDGE, O.RC_ATOMIC_ACKNOWLEDGE}
MSG_END = SEND_LAST | SEND_ONLY | WRITE_LAST | WRITE_ONLY | ATOMIC_REQ | READ_REQ
CONSUMES_RECV = SENDS | {O.RC_RDMA_WRITE_LAST_WITH_IMMEDIATE, O.RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE}


def segment_opcodes(kind: str, npkts: int, imm: bool) -> list[Opcode]:
    """Opcode sequence of a SEND or WRITE message of npkts packets."""
    p = "RC_SEND" if kind == "send" else "RC_RDMA_WRITE"
    suffix = "_WITH_IMMEDIATE" if imm else ""
    if npkts == 1:
        return [O[f"{p}_ONLY{suffix}"]]
    return [O[f"{p}_FIRST"]] + [O[f"{p}_MIDDLE"]] * (npkts - 2) + [O[f"{p}_LAST{suffix}"]]


def read_resp_opcode(i: int, n: int) -> Opcode:
    if n == 1:
        return O.RC_RDMA_READ_RESPONSE_ONLY
    if i == 0:
        return O.RC_RDMA_READ_RESPONSE_FIRST
    return O.RC_RDMA_READ_RESPONSE_LAST if i == n - 1 else O.RC_RDMA_READ_RESPONSE_MIDDLE


def npackets(length: int, mtu: int) -> int:
    return max(1, -(-length // mtu))
