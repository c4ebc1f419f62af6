"""Retransmission timeout estimator: RFC 6298 SRTT/RTTVAR with exponential backoff.

Spec RTO-1 and PAR-2: RTO = clamp(SRTT + max(4 RTTVAR, G), RTO_min, RTO_max) with G = 5 us,
RTO_min = 50 us by default and RTO_max the local ACK timeout (1 s when it is infinite, RTO-4);
before the first sample RTO = RTO_max. Callers apply Karn's rule to samples from their own send
times: only packets transmitted once give samples.
"""

RTO_MIN_NS = 50_000           # RTO_min's default (PAR-2)
RTO_G_NS = 5_000              # G, the RTTVAR floor of the RTO (RTO-1)
RTO_MAX_INFINITE_NS = 1_000_000_000   # RTO_max when the local ACK timeout is infinite (RTO-4)


class RtoEstimator:
    ALPHA, BETA, K = 1 / 8, 1 / 4, 4

    def __init__(self, initial_ns: int, min_ns: int = RTO_MIN_NS,
                 max_ns: int = RTO_MAX_INFINITE_NS, granularity_ns: int = RTO_G_NS):
        self.initial, self.min, self.max, self.g = initial_ns, min_ns, max_ns, granularity_ns
        self.srtt: float | None = None
        self.rttvar = 0.0
        self.min_rtt: int | None = None
        self.backoff = 0
        self.samples = 0

    def sample(self, rtt_ns: int) -> None:
        rtt = max(0, rtt_ns)
        if self.srtt is None:
            self.srtt, self.rttvar = float(rtt), rtt / 2
        else:
            self.rttvar = (1 - self.BETA) * self.rttvar + self.BETA * abs(self.srtt - rtt)
            self.srtt = (1 - self.ALPHA) * self.srtt + self.ALPHA * rtt
        self.min_rtt = rtt if self.min_rtt is None else min(self.min_rtt, rtt)
        self.samples += 1

    def on_timeout(self) -> None:
        self.backoff += 1

    def on_progress(self) -> None:
        self.backoff = 0

    @property
    def base_ns(self) -> int:
        if self.srtt is None:
            return self.initial
        return int(self.srtt + max(self.g, self.K * self.rttvar))

    @property
    def rto_ns(self) -> int:
        v = min(self.max, max(self.min, self.base_ns)) << min(self.backoff, 16)
        return min(v, self.max)
