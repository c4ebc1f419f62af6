"""Transport headers: BTH, the IBTA extension headers and the MetaRoCE extension headers.

Every header is a frozen dataclass with ``pack() -> bytes`` and ``parse(buf, off=0)``;
fields are range-checked on construction (ValueError: a programming error), and ``parse``
raises only :class:`~metaroce.wire.errors.ParseError`.
"""

import struct
from dataclasses import dataclass, fields

from . import consts as C
from .errors import ParseError, Reason, need


def _bits(obj, **widths):
    for name, width in widths.items():
        value = getattr(obj, name)
        if not isinstance(value, int) or isinstance(value, bool) and width != 1:
            raise ValueError(f"{type(obj).__name__}.{name} must be an int, got {value!r}")
        if not 0 <= int(value) < (1 << width):
            raise ValueError(f"{type(obj).__name__}.{name}={value} does not fit in {width} bits")


class Header:
    """Base: fixed-size header. Subclasses define SIZE, NAME, pack() and _unpack()."""

    SIZE = 0
    NAME = ""

    @classmethod
    def parse(cls, buf, off: int = 0):
        need(buf, off, cls.SIZE, cls.NAME)
        return cls._unpack(bytes(buf[off:off + cls.SIZE]), off)

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class BTH(Header):
    """Base Transport Header (12 bytes)."""

    opcode: int
    dest_qp: int
    psn: int
    se: int = 0
    migreq: int = 0
    pad_count: int = 0
    tver: int = 0
    pkey: int = C.DEFAULT_PKEY
    fecn: int = 0
    becn: int = 0
    resv6: int = 0
    ack_req: int = 0
    resv7: int = 0

    SIZE = C.BTH_LEN
    NAME = "BTH"

    def __post_init__(self):
        _bits(self, opcode=8, dest_qp=24, psn=24, se=1, migreq=1, pad_count=2, tver=4,
              pkey=16, fecn=1, becn=1, resv6=6, ack_req=1, resv7=7)

    def pack(self) -> bytes:
        b1 = self.se << 7 | self.migreq << 6 | self.pad_count << 4 | self.tver
        b4 = self.fecn << 7 | self.becn << 6 | self.resv6
        b8 = self.ack_req << 7 | self.resv7
        return struct.pack("!BBHI I", self.opcode, b1, self.pkey,
                           b4 << 24 | self.dest_qp, b8 << 24 | self.psn)

    @classmethod
    def _unpack(cls, b, off):
        opcode, b1, pkey, w1, w2 = struct.unpack("!BBHII", b)
        return cls(opcode=opcode, se=b1 >> 7, migreq=b1 >> 6 & 1, pad_count=b1 >> 4 & 3,
                   tver=b1 & 0xF, pkey=pkey, fecn=w1 >> 31, becn=w1 >> 30 & 1,
                   resv6=w1 >> 24 & 0x3F, dest_qp=w1 & C.QPN_MASK, ack_req=w2 >> 31,
                   resv7=w2 >> 24 & 0x7F, psn=w2 & C.PSN_MASK)


@dataclass(frozen=True)
class RETH(Header):
    """RDMA Extended Transport Header (16 bytes): VA, R_Key, DMA length."""

    va: int
    rkey: int
    dma_len: int

    SIZE = C.RETH_LEN
    NAME = "RETH"

    def __post_init__(self):
        _bits(self, va=64, rkey=32, dma_len=32)

    def pack(self) -> bytes:
        return struct.pack("!QII", self.va, self.rkey, self.dma_len)

    @classmethod
    def _unpack(cls, b, off):
        return cls(*struct.unpack("!QII", b))


@dataclass(frozen=True)
class AETH(Header):
    """ACK Extended Transport Header (4 bytes): syndrome and MSN."""

    syndrome: int
    msn: int

    SIZE = C.AETH_LEN
    NAME = "AETH"

    def __post_init__(self):
        _bits(self, syndrome=8, msn=24)
        problem = syndrome_problem(self.syndrome)
        if problem:
            raise ValueError(f"AETH syndrome 0x{self.syndrome:02x}: {problem}")

    @property
    def kind(self) -> C.AethType:
        return C.AethType(self.syndrome & C.AETH_TYPE_MASK)

    @property
    def value(self) -> int:
        """Credit code (ACK), RNR timer code (RNR NAK) or NAK code (NAK)."""
        return self.syndrome & C.AETH_VALUE_MASK

    def pack(self) -> bytes:
        return struct.pack("!I", self.syndrome << 24 | self.msn)

    @classmethod
    def _unpack(cls, b, off):
        (w,) = struct.unpack("!I", b)
        problem = syndrome_problem(w >> 24)
        if problem:
            raise ParseError(Reason.BAD_SYNDROME, problem, off)
        return cls(syndrome=w >> 24, msn=w & C.MSN_MASK)


def syndrome_problem(syndrome: int) -> str:
    """Why an AETH syndrome byte is invalid, or '' if it is valid."""
    if syndrome & C.AETH_RESERVED_BIT:
        return "reserved bit 7 set"
    kind = syndrome & C.AETH_TYPE_MASK
    if kind == C.AethType.RESERVED:
        return "reserved syndrome type 0b10"
    if kind == C.AethType.NAK and (syndrome & C.AETH_VALUE_MASK) > max(C.NakCode):
        return f"reserved NAK code {syndrome & C.AETH_VALUE_MASK}"
    return ""


def ack_syndrome(credit_code: int = C.AETH_ACK_UNLIMITED) -> int:
    if not 0 <= credit_code <= 31:
        raise ValueError("credit code is 5 bits")
    return C.AethType.ACK | credit_code


def rnr_syndrome(timer_code: int) -> int:
    if not 0 <= timer_code <= 31:
        raise ValueError("RNR timer code is 5 bits")
    return C.AethType.RNR_NAK | timer_code


def nak_syndrome(code: C.NakCode) -> int:
    return C.AethType.NAK | C.NakCode(code)


def credits_from_code(code: int) -> int | None:
    """ACK credit code -> receive WQEs; None for code 31 (unlimited / invalid)."""
    return None if code == C.AETH_ACK_UNLIMITED else C.AETH_CREDIT_TABLE[code]


def credit_code_for(wqes: int) -> int:
    """The largest credit code whose count does not exceed ``wqes`` available WQEs."""
    code = 0
    for i, n in enumerate(C.AETH_CREDIT_TABLE):
        if n <= wqes:
            code = i
    return code


class _U32Header(Header):
    SIZE = 4

    def pack(self) -> bytes:
        return struct.pack("!I", self.value)

    @classmethod
    def _unpack(cls, b, off):
        return cls(struct.unpack("!I", b)[0])


@dataclass(frozen=True)
class ImmDt(_U32Header):
    """Immediate data (4 bytes, opaque to the transport)."""

    value: int
    NAME = "ImmDt"

    def __post_init__(self):
        _bits(self, value=32)


@dataclass(frozen=True)
class IETH(_U32Header):
    """Invalidate Extended Transport Header (4 bytes): the R_Key to invalidate."""

    value: int
    NAME = "IETH"

    def __post_init__(self):
        _bits(self, value=32)


@dataclass(frozen=True)
class AtomicETH(Header):
    """Atomic Extended Transport Header (28 bytes): VA, R_Key, swap/add, compare."""

    va: int
    rkey: int
    swap_add: int
    compare: int

    SIZE = C.ATOMICETH_LEN
    NAME = "AtomicETH"

    def __post_init__(self):
        _bits(self, va=64, rkey=32, swap_add=64, compare=64)

    def pack(self) -> bytes:
        return struct.pack("!QIQQ", self.va, self.rkey, self.swap_add, self.compare)

    @classmethod
    def _unpack(cls, b, off):
        return cls(*struct.unpack("!QIQQ", b))


@dataclass(frozen=True)
class AtomicAckETH(Header):
    """Atomic ACK Extended Transport Header (8 bytes): the original remote value."""

    orig: int

    SIZE = C.ATOMICACKETH_LEN
    NAME = "AtomicAckETH"

    def __post_init__(self):
        _bits(self, orig=64)

    def pack(self) -> bytes:
        return struct.pack("!Q", self.orig)

    @classmethod
    def _unpack(cls, b, off):
        return cls(struct.unpack("!Q", b)[0])


@dataclass(frozen=True)
class CNPPad(Header):
    """The 16 reserved bytes of a RoCEv2 CNP (sent as zero, ignored on receipt)."""

    reserved: bytes = bytes(16)

    SIZE = C.CNP_PAD_LEN
    NAME = "CNP"

    def __post_init__(self):
        if not isinstance(self.reserved, bytes) or len(self.reserved) != 16:
            raise ValueError("CNP reserved field is 16 bytes")

    def pack(self) -> bytes:
        return self.reserved

    @classmethod
    def _unpack(cls, b, off):
        return cls(bytes(b))


# --- MetaRoCE extension headers ----------------------------------------------------------------


def _flags_ok(flags: int, defined: int, name: str, off: int) -> None:
    if flags & ~defined:
        raise ParseError(Reason.BAD_FIELD, f"{name} undefined flag bits 0x{flags & ~defined:02x}", off)


@dataclass(frozen=True)
class PETH(Header):
    """MetaRoCE Placement Extended Transport Header (20 bytes).

    path_id: the path (UDP source port slot) the packet was sent on; flags: RETX/ACK_NOW;
    ssn: the request message's send sequence number (echoed by READ responses and atomic
    ACKs); rsn: the receive sequence number, i.e. which receive WQE the message consumes
    (SENDs, WRITE with immediate), otherwise the number of such messages sent before it;
    offset: byte offset of the payload within the message; ts: sender timestamp (ns mod 2^32),
    echoed in SACKETH.ts_echo.
    """

    path_id: int
    ssn: int
    offset: int
    rsn: int = 0
    ts: int = 0
    flags: int = 0

    SIZE = C.PETH_LEN
    NAME = "PETH"

    def __post_init__(self):
        _bits(self, path_id=8, flags=8, ssn=24, rsn=24, offset=32, ts=32)
        if self.flags & ~C.PETH_FLAGS_DEFINED:
            raise ValueError("PETH undefined flag bits")

    def pack(self) -> bytes:
        return struct.pack("!BBHIIII", self.path_id, self.flags, 0, self.ssn, self.rsn,
                           self.offset, self.ts)

    @classmethod
    def _unpack(cls, b, off):
        path_id, flags, resv, ssn, rsn, offset, ts = struct.unpack("!BBHIIII", b)
        _flags_ok(flags, C.PETH_FLAGS_DEFINED, "PETH", off + 1)
        if resv or ssn >> 24 or rsn >> 24:
            raise ParseError(Reason.BAD_FIELD, "PETH reserved bits set", off)
        return cls(path_id=path_id, flags=flags, ssn=ssn, rsn=rsn, offset=offset, ts=ts)


@dataclass(frozen=True)
class SACKETH(Header):
    """MetaRoCE Selective-ACK Extended Transport Header (32 bytes).

    The cumulative ACK is BTH.PSN (the last PSN received in order). Bit i of ``bitmap``
    (bit 0 = most significant bit of the first bitmap byte) reports PSN BTH.PSN + 2 + i.
    """

    path_id: int = 0
    flags: int = 0
    credit_limit_psn: int = 0
    ts_echo: int = 0
    ce_count: int = 0
    bitmap: int = 0

    SIZE = C.SACKETH_LEN
    NAME = "SACKETH"

    def __post_init__(self):
        _bits(self, path_id=8, flags=8, credit_limit_psn=24, ts_echo=32, ce_count=32,
              bitmap=C.SACK_BITMAP_BITS)
        if self.flags & ~C.SACK_FLAGS_DEFINED:
            raise ValueError("SACKETH undefined flag bits")

    def pack(self) -> bytes:
        return (struct.pack("!BBHIII", self.path_id, self.flags, 0, self.credit_limit_psn,
                            self.ts_echo, self.ce_count) + self.bitmap.to_bytes(16, "big"))

    @classmethod
    def _unpack(cls, b, off):
        path_id, flags, resv, limit, ts_echo, ce = struct.unpack("!BBHIII", b[:16])
        _flags_ok(flags, C.SACK_FLAGS_DEFINED, "SACKETH", off + 1)
        if resv or limit >> 24:
            raise ParseError(Reason.BAD_FIELD, "SACKETH reserved bits set", off)
        return cls(path_id=path_id, flags=flags, credit_limit_psn=limit, ts_echo=ts_echo,
                   ce_count=ce, bitmap=int.from_bytes(b[16:32], "big"))

    def sacked(self, cum_psn: int) -> list[int]:
        """PSNs reported received beyond the hole that follows ``cum_psn``."""
        return [(cum_psn + 2 + i) & C.PSN_MASK for i in range(C.SACK_BITMAP_BITS)
                if self.bitmap >> (C.SACK_BITMAP_BITS - 1 - i) & 1]

    @staticmethod
    def bitmap_for(cum_psn: int, received) -> int:
        """Build a bitmap from PSNs received after cum_psn + 1 (others are ignored)."""
        bm = 0
        for psn in received:
            i = (psn - cum_psn - 2) & C.PSN_MASK
            if i < C.SACK_BITMAP_BITS:
                bm |= 1 << (C.SACK_BITMAP_BITS - 1 - i)
        return bm


@dataclass(frozen=True)
class CREDITETH(Header):
    """MetaRoCE receiver credit grant (8 bytes): flags, limit PSN, pacing rate (Mbit/s)."""

    flags: int = C.CREDIT_F_ACTIVE
    limit_psn: int = 0
    rate_mbps: int = 0

    SIZE = C.CREDITETH_LEN
    NAME = "CREDITETH"

    def __post_init__(self):
        _bits(self, flags=8, limit_psn=24, rate_mbps=32)
        if self.flags & ~C.CREDIT_FLAGS_DEFINED:
            raise ValueError("CREDITETH undefined flag bits")

    def pack(self) -> bytes:
        return struct.pack("!II", self.flags << 24 | self.limit_psn, self.rate_mbps)

    @classmethod
    def _unpack(cls, b, off):
        w, rate = struct.unpack("!II", b)
        _flags_ok(w >> 24, C.CREDIT_FLAGS_DEFINED, "CREDITETH", off)
        return cls(flags=w >> 24, limit_psn=w & C.PSN_MASK, rate_mbps=rate)


@dataclass(frozen=True)
class CMETH(Header):
    """MetaRoCE connection-management block (52 bytes in version 2), in MR_CM packets, on the CM
    side channel and in CM private data. It starts with the magic (VER-4); its first 12 bytes
    keep their layout in every version (VER-2), see :meth:`prefix`."""

    cm_type: int
    txn_id: int
    qpn: int
    start_psn: int
    caps: int = 0
    mtu: int = 4
    max_paths: int = 1
    timeout: int = 14
    retry_cnt: int = 7
    rnr_retry: int = 7
    max_rd_atomic: int = 1
    max_dest_rd_atomic: int = 1
    min_rnr_timer: int = 12
    window_pkts: int = 0
    gid: bytes = bytes(16)
    version: int = C.CM_VERSION
    mtu64: int = 0          # version 3: the largest fitted path MTU offered, in 64 B (CM-14)
    reject_reason: int = 0

    SIZE = C.CMETH_LEN
    NAME = "CMETH"

    def __post_init__(self):
        _bits(self, cm_type=8, version=8, reject_reason=16, txn_id=32, qpn=24, start_psn=24,
              caps=32, mtu=8, max_paths=8, timeout=5, retry_cnt=3, rnr_retry=3,
              max_rd_atomic=8, max_dest_rd_atomic=8, min_rnr_timer=5, window_pkts=32,
              mtu64=8)
        if not isinstance(self.gid, bytes) or len(self.gid) != 16:
            raise ValueError("CMETH.gid is 16 bytes")

    _FMT = "!IBBHIIIIBBBBBBBBI16s"

    def pack(self) -> bytes:
        return struct.pack(
            self._FMT, C.CMETH_MAGIC, self.cm_type, self.version, self.reject_reason, self.txn_id,
            self.qpn, self.start_psn, self.caps, self.mtu, self.max_paths, self.timeout,
            self.retry_cnt << 5 | self.rnr_retry << 2, self.max_rd_atomic,
            self.max_dest_rd_atomic, self.min_rnr_timer, self.mtu64, self.window_pkts, self.gid)

    @staticmethod
    def prefix(buf) -> dict | None:
        """The version-independent first 12 bytes (VER-2) — cm_type, version, reject_reason,
        txn_id — or None when buf does not start with the magic (VER-4: not a CMETH)."""
        if len(buf) < C.CMETH_PREFIX_LEN:
            return None
        magic, cm_type, version, reject, txn = struct.unpack_from("!IBBHI", buf)
        if magic != C.CMETH_MAGIC:
            return None
        return {"cm_type": cm_type, "version": version, "reject_reason": reject, "txn_id": txn}

    @classmethod
    def _unpack(cls, b, off):
        (magic, cm_type, version, reject, txn, qpn, psn, caps, mtu, paths, timeout, retries, rd,
         drd, rnr, mtu64, window, gid) = struct.unpack(cls._FMT, b)
        if magic != C.CMETH_MAGIC:
            raise ParseError(Reason.BAD_FIELD, f"no CMETH magic (0x{magic:08x})", off)
        if version not in C.CM_VERSIONS:
            raise ParseError(Reason.BAD_FIELD, f"CMETH version {version} (this end implements "
                             f"{' and '.join(map(str, C.CM_VERSIONS))}); only its first "
                             f"{C.CMETH_PREFIX_LEN} bytes are readable", off)
        if cm_type not in C.CmType.__members__.values():
            raise ParseError(Reason.BAD_FIELD, f"CMETH unknown cm_type {cm_type}", off)
        if qpn >> 24 or psn >> 24 or timeout >> 5 or retries & 3 or rnr >> 5 or \
                (version < 3 and mtu64):                 # byte 31: reserved in version 2
            raise ParseError(Reason.BAD_FIELD, "CMETH reserved bits set", off)
        return cls(cm_type=cm_type, version=version, reject_reason=reject, txn_id=txn, qpn=qpn,
                   start_psn=psn, caps=caps, mtu=mtu, max_paths=paths, timeout=timeout,
                   retry_cnt=retries >> 5, rnr_retry=retries >> 2 & 7, max_rd_atomic=rd,
                   max_dest_rd_atomic=drd, min_rnr_timer=rnr, window_pkts=window, gid=gid,
                   mtu64=mtu64)


ALL_HEADERS = (BTH, RETH, AETH, ImmDt, IETH, AtomicETH, AtomicAckETH, CNPPad, PETH, SACKETH,
               CREDITETH, CMETH)
