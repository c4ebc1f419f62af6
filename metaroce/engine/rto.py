"""Retransmission timeout estimator: RFC 6298 SRTT/RTTVAR with exponential backoff.

Callers apply Karn's rule: only packets transmitted once give samples.
"""


class RtoEstimator:
    ALPHA, BETA, K = 1 / 8, 1 / 4, 4

    def __init__(self, initial_ns: int, min_ns: int = 10_000, max_ns: int = 1_000_000_000,
                 granularity_ns: int = 1_000):
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
