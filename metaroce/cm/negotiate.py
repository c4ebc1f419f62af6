"""The pure parts of connection management (spec section 6): what an initiator offers, what a
target accepts (CM-5, CM-6), which CONNECT_REQs are invalid (CM-10, VER-2), and the mode a set
of accepted capabilities means. No I/O: tested without a network."""

from __future__ import annotations

import ipaddress

from ..wire import consts as C
from ..wire.headers import CMETH

METAROCE_CAPS = int(C.Cap.SACK | C.Cap.PLACEMENT)     # the mandatory pair of MetaRoCE mode
# what this implementation can accept (CSUM only where the device accepts the checksums, CREDIT
# only where it grants receiver credits)
SUPPORTED_CAPS = METAROCE_CAPS | int(C.Cap.MULTIPATH) | int(C.Cap.CSUM) | int(C.Cap.CREDIT)
DEFAULT_PATHS = 4          # MP-1: paths a MetaRoCE connection asks for unless told otherwise
LOCAL_MAX_PATHS = 8        # what this data path sprays over (metaroce/nic/paths.py)
MR_WINDOW = 128            # SACK-1: the receive window W the data path enforces and advertises
                           # (bpf/nic/nic_consts.h MR_WINDOW: it records ePSN .. ePSN + 127)
MTU_CODE = {v: k for k, v in C.MTU_CODES.items()}


class Rejected(Exception):
    """A CONNECT_REQ the target must refuse; `reason` is a CmReject code."""

    def __init__(self, reason: int, why: str):
        super().__init__(why)
        self.reason = reason


def mode_of(caps: int) -> str:
    """MetaRoCE mode iff SACK and PLACEMENT were both accepted (CM-5)."""
    return "metaroce" if caps & METAROCE_CAPS == METAROCE_CAPS else "roce"


def effective(caps: int) -> int:
    """CM-5: an answer is 0 (compat) or holds the MetaRoCE pair; option bits without the pair
    mean nothing, so such an answer counts as 0."""
    return caps if mode_of(caps) == "metaroce" else 0


def offer(mode: str, paths: int = DEFAULT_PATHS, integrity: str = "icrc",
          credits: bool = False) -> int:
    """The caps an initiator offers for the mode it wants (MULTIPATH with MetaRoCE mode unless
    paths is 0; CSUM when its device accepts the checksums in place of the ICRC, INT-1; CREDIT
    when its device grants receiver credits, CC-8: `metaroce up --credits`)."""
    if mode != "metaroce":
        return 0
    return METAROCE_CAPS | (int(C.Cap.MULTIPATH) if paths else 0) | \
        (int(C.Cap.CSUM) if integrity == "csum" else 0) | (int(C.Cap.CREDIT) if credits else 0)


def integrity_of(caps: int) -> str:
    """INT-1: the connection's end-to-end check, "csum" iff CSUM was accepted on a MetaRoCE
    connection, else the ICRC."""
    return "csum" if effective(caps) & C.Cap.CSUM else "icrc"


def credit_of(caps: int) -> bool:
    """CC-8: both ends accepted CREDIT, so each is a receiver that grants credits and a sender
    that starts in credit mode (initial_credit packets) and obeys its peer's grants."""
    return bool(effective(caps) & C.Cap.CREDIT)


def local_paths(paths: int | None) -> int:
    """The max_paths this end advertises: the asked-for number within what the data path does."""
    n = DEFAULT_PATHS if paths is None else int(paths)
    if not 0 <= n <= LOCAL_MAX_PATHS:
        raise ValueError(f"paths must be 0-{LOCAL_MAX_PATHS}, not {n}")
    return n


def paths_of(caps: int, req_max_paths: int, rep_max_paths: int) -> int:
    """MP-1: N = min of both ends' max_paths with MULTIPATH accepted, else 0 (one fixed port)."""
    if not caps & C.Cap.MULTIPATH:
        return 0
    return max(1, min(req_max_paths, rep_max_paths, LOCAL_MAX_PATHS))


def accept(req: CMETH, device_mode: str, policy_allows: bool = True,
           mandatory: bool = False, integrity: str = "icrc", credits: bool = False) -> int:
    """The caps a target answers (CM-5: offered AND supported AND permitted; unknown bits are
    cleared, never echoed). A target that cannot do MetaRoCE answers compat (0) unless the
    initiator marked MetaRoCE mandatory, then it rejects with UNSUPPORTED_CAPS (CM-6). CSUM is
    permitted only when this device accepts the checksums (integrity "csum", INT-1), CREDIT
    only when it grants receiver credits (credits, CC-8)."""
    validate(req)
    supported = SUPPORTED_CAPS if device_mode == "metaroce" and policy_allows else 0
    if integrity != "csum":
        supported &= ~int(C.Cap.CSUM)
    if not credits:
        supported &= ~int(C.Cap.CREDIT)
    caps = effective(req.caps & supported & C.CAPS_DEFINED)   # options need the pair (CM-5)
    if mandatory and mode_of(caps) != "metaroce":
        raise Rejected(C.CmReject.UNSUPPORTED_CAPS, "MetaRoCE mode was required and is not "
                       "offered by this device")
    return caps


def validate(req: CMETH) -> None:
    """CM-10: the fields a target refuses with INVALID_PARAMS, and the version (VER-2)."""
    if req.version not in C.CM_VERSIONS:
        raise Rejected(C.CmReject.BAD_VERSION, f"CMETH version {req.version} is not one of "
                       f"{C.CM_VERSIONS}")
    if req.mtu not in C.MTU_CODES:
        raise Rejected(C.CmReject.INVALID_PARAMS, f"MTU code {req.mtu} is not 1-5")
    if not mtu64_ok(req.mtu64):
        raise Rejected(C.CmReject.INVALID_PARAMS, f"fitted MTU {req.mtu64} x 64 bytes is not "
                       f"{C.FITTED_MTU_MIN} .. {C.FITTED_MTU_MAX} (CM-14)")
    if req.caps & C.Cap.MULTIPATH and not 1 <= req.max_paths <= C.MAX_PATHS:
        raise Rejected(C.CmReject.INVALID_PARAMS, f"max_paths {req.max_paths} is not "
                       f"1-{C.MAX_PATHS}")
    if mode_of(req.caps) == "metaroce" and not 1 <= req.window_pkts < C.PSN_HALF:
        raise Rejected(C.CmReject.INVALID_PARAMS, f"window_pkts {req.window_pkts} is not "
                       f"1-{C.PSN_HALF - 1} (SACK-1)")


def gid_of(ip: str) -> bytes:
    """WIRE-12: an IPv6 address, or the IPv4-mapped form of an IPv4 address."""
    a = ipaddress.ip_address(ip)
    if a.version == 4:
        return ipaddress.IPv6Address(f"::ffff:{a}").packed
    return a.packed


def ip_of(gid: bytes) -> str:
    a = ipaddress.IPv6Address(gid)
    return str(a.ipv4_mapped) if a.ipv4_mapped else str(a)


def path_mtu(local_bytes: int, remote_code: int, local_fitted: int = 0,
             remote_mtu64: int = 0, caps: int = 0) -> int:
    """CM-1: the connection's path MTU is the smaller of the two; CM-14: on a MetaRoCE
    connection whose two CMETHs both offered a fitted MTU, the smaller of those."""
    if mode_of(caps) == "metaroce" and local_fitted and remote_mtu64:
        return min(local_fitted, remote_mtu64 * C.FITTED_MTU_UNIT)
    return min(local_bytes, C.MTU_CODES[remote_code])


def mtu64_ok(mtu64: int) -> bool:
    """CM-14 / CM-10: a CMETH's fitted MTU offer is none (0) or 256 .. 8192 bytes."""
    return not mtu64 or C.path_mtu_ok(mtu64 * C.FITTED_MTU_UNIT, True)


def mtu64_of(fitted_bytes: int, caps: int, peer_offered: bool = True) -> int:
    """CM-14: the mtu64 a CMETH carries: the fitted MTU in 64-byte units in a MetaRoCE offer
    (or, in an answer, when the initiator offered one too); else 0."""
    if mode_of(caps) != "metaroce" or not peer_offered or not fitted_bytes:
        return 0
    return fitted_bytes // C.FITTED_MTU_UNIT


REJECT_TEXT = {C.CmReject.NO_RESOURCES: "no resources", C.CmReject.BAD_VERSION: "bad version",
               C.CmReject.UNSUPPORTED_CAPS: "incompatible: MetaRoCE mode required but not offered",
               C.CmReject.INVALID_PARAMS: "invalid parameters",
               C.CmReject.CONSUMER_REJECT: "rejected by the application"}
