"""QP states, legal transitions and attributes (ibv_qp_state / ibv_qp_attr subset for RC)."""

from dataclasses import dataclass
from enum import Enum

from metaroce.wire.consts import (LOCAL_ACK_TIMEOUT_UNIT_NS, MTU_CODES, PSN_MASK, RNR_TIMER_USEC,
                                  path_mtu_ok)


class QPState(Enum):
    RESET = "RESET"
    INIT = "INIT"
    RTR = "RTR"
    RTS = "RTS"
    SQD = "SQD"
    SQE = "SQE"
    ERR = "ERR"


class Mode(Enum):
    COMPAT = "compat"  # plain RoCEv2 RC, go-back-N
    METAROCE = "metaroce"  # selective repeat, SACK, per-packet placement


class QPStateError(Exception):
    """An illegal state transition or a verb not allowed in the current state."""


S = QPState
_LEGAL = {
    S.RESET: {S.RESET, S.INIT, S.ERR},
    S.INIT: {S.RESET, S.INIT, S.RTR, S.ERR},
    S.RTR: {S.RESET, S.RTS, S.ERR},
    S.RTS: {S.RESET, S.RTS, S.SQD, S.ERR},
    S.SQD: {S.RESET, S.SQD, S.RTS, S.ERR},
    S.SQE: {S.RESET, S.RTS, S.ERR},
    S.ERR: {S.RESET, S.ERR},
}


def check_transition(cur: QPState, new: QPState) -> None:
    if new not in _LEGAL[cur]:
        raise QPStateError(f"illegal QP transition {cur.value} -> {new.value}")


@dataclass
class QPAttr:
    qpn: int
    dest_qpn: int = 0
    sq_psn: int = 0
    rq_psn: int = 0
    path_mtu: int = 1024  # bytes: an IB MTU (256..4096) or a fitted one (CM-14)
    timeout: int = 14  # local ACK timeout exponent: 4.096 us x 2^timeout; 0 = infinite
    retry_cnt: int = 7
    rnr_retry: int = 7  # 7 = retry forever
    min_rnr_timer: int = 1  # RNR timer code we advertise as responder
    max_rd_atomic: int = 16  # outstanding READ/ATOMIC as requester
    max_dest_rd_atomic: int = 16  # saved READ/ATOMIC results as responder
    window: int = 128  # packets in flight; in MetaRoCE mode also the responder window W

    def validate(self) -> None:
        if not path_mtu_ok(self.path_mtu, True):     # the mode's own rule: the device's
            raise ValueError(f"path_mtu {self.path_mtu} is neither one of "
                             f"{sorted(MTU_CODES.values())} nor a multiple of 64 in 256 .. 8192")
        for name in ("qpn", "dest_qpn", "sq_psn", "rq_psn"):
            if not 0 <= getattr(self, name) <= PSN_MASK:
                raise ValueError(f"{name} must be 24-bit")
        if not 0 <= self.timeout <= 31 or not 0 <= self.min_rnr_timer <= 31:
            raise ValueError("timeout / min_rnr_timer are 5-bit")
        if not 0 <= self.retry_cnt <= 7 or not 0 <= self.rnr_retry <= 7:
            raise ValueError("retry_cnt / rnr_retry are 3-bit")
        if not 1 <= self.window < (1 << 23) or self.max_rd_atomic < 1:
            raise ValueError("window must be in [1, 2^23), max_rd_atomic >= 1")

    @property
    def local_ack_timeout_ns(self) -> int | None:
        """4.096 us x 2^timeout in ns; None means infinite (timeout 0)."""
        return None if self.timeout == 0 else LOCAL_ACK_TIMEOUT_UNIT_NS << self.timeout


def rnr_timer_ns(code: int) -> int:
    return RNR_TIMER_USEC[code] * 1000
