"""Congestion control, clock-free: the caller passes ``now`` (integer ns) to every method.

MetaRoCE mode (:class:`WindowCC`, spec CC-1 … CC-4): a byte window capped at 1.25 × BDP
(IRN's BDP-FC), started at the cap, and updated on every SACK from two signals as in UET NSCC /
Swift — ECN (SACK flag E, CE count, CNP) and delay (RTT sample from the timestamp echo against
target = base_rtt + target_qdelay):

=========  ===============  ==========================================================
ECN        RTT vs target    action
=========  ===============  ==========================================================
no         below            proportional increase: += α · acked · (target − RTT) / target
no         at/above         fair increase: += MTU · acked / cwnd
yes        at/above         multiplicative decrease, at most once per SRTT:
                            ×= max(1 − β · (RTT − target) / RTT, 1 − max_mdf)
yes        below            no change; the congestion is on the path, not shared: the
                            caller lowers that path's weight (MP-3)
=========  ===============  ==========================================================

Losses cut the lost bytes once per SRTT; an RTO resets cwnd to one MTU (CC-4).

Compat mode (:class:`Dcqcn`, COMPAT-4): DCQCN's reaction point — a rate cut
Rc ×= (1 − α/2) per CNP with α an EWMA of CNP arrivals, then fast recovery, additive and
hyper increase driven by a timer and a byte counter. The rate paces the requester.
"""

from dataclasses import dataclass


@dataclass
class CCConfig:
    """Per-QP congestion-control parameters (the sim derives line rate and base RTT from its
    topology; a NIC takes them from its link and a configured fabric RTT)."""

    line_rate_bps: float = 100e9
    base_rtt_ns: int = 8_000  # configured fabric base RTT (a smaller measured RTT replaces it)
    target_qdelay_ns: int = 10_000
    bdp_factor: float = 1.25  # max_cwnd = bdp_factor × BDP (CC-1)
    alpha: float = 1.0
    beta: float = 0.8
    max_mdf: float = 0.5
    enabled: bool = True  # False: window fixed at max_cwnd (BDP-FC only), no reaction
    # DCQCN reaction point (compat)
    dcqcn: bool = True
    dcqcn_g: float = 1 / 256
    dcqcn_alpha_timer_ns: int = 55_000
    dcqcn_rate_timer_ns: int = 55_000
    dcqcn_byte_counter: int = 10 * 2**20
    dcqcn_fast_steps: int = 5
    dcqcn_ai_bps: float = 40e6
    dcqcn_hai_bps: float = 400e6
    dcqcn_min_bps: float = 100e6
    # receiver side (compat): minimum gap between CNPs per QP
    cnp_interval_ns: int = 50_000

    @property
    def bdp_bytes(self) -> float:
        return self.line_rate_bps * self.base_rtt_ns / 8e9


class WindowCC:
    """MetaRoCE sender window (CC-1 … CC-4). All sizes in bytes, times in ns."""

    def __init__(self, cfg: CCConfig, mtu: int):
        self.cfg, self.mtu = cfg, mtu
        self.max_cwnd = max(float(mtu), cfg.bdp_factor * cfg.bdp_bytes)
        self.cwnd = self.max_cwnd  # line-rate start (CC-1)
        self.base_rtt = cfg.base_rtt_ns
        self.last_md = None
        self.last_loss_cut = None
        self.stats = {"md": 0, "loss_cuts": 0, "rto_resets": 0, "ecn_path_only": 0}

    @property
    def target(self) -> int:
        return self.base_rtt + self.cfg.target_qdelay_ns

    def _clamp(self) -> None:
        self.cwnd = min(self.max_cwnd, max(float(self.mtu), self.cwnd))

    def on_ack(self, now: int, acked: int, rtt: int | None, ecn: bool, srtt: float) -> bool:
        """One SACK's signals (CC-3). Returns True when the ECN is a path signal only
        (quadrant 4): the caller lowers that path's weight."""
        if not self.cfg.enabled:
            return False
        if rtt is None:
            rtt = int(srtt) if srtt else self.base_rtt
        if rtt > 0 and rtt < self.base_rtt:
            self.base_rtt = rtt
        target = self.target
        path_only = False
        if not ecn:
            if acked:
                if rtt < target:
                    self.cwnd += self.cfg.alpha * acked * (target - rtt) / target
                else:
                    self.cwnd += self.mtu * acked / self.cwnd
        elif rtt >= target:
            if self.last_md is None or now - self.last_md >= max(srtt, self.base_rtt):
                f = max(1 - self.cfg.beta * (rtt - target) / rtt, 1 - self.cfg.max_mdf)
                self.cwnd *= f
                self.last_md = now
                self.stats["md"] += 1
        else:
            path_only = True
            self.stats["ecn_path_only"] += 1
        self._clamp()
        return path_only

    def on_loss(self, now: int, lost_bytes: int, srtt: float) -> None:
        """PSNs declared lost: cut their bytes, at most once per SRTT (CC-4)."""
        if not self.cfg.enabled:
            return
        if self.last_loss_cut is not None and now - self.last_loss_cut < max(srtt, self.base_rtt):
            return
        self.last_loss_cut = now
        self.cwnd -= lost_bytes
        self.stats["loss_cuts"] += 1
        self._clamp()

    def on_rto(self, now: int) -> None:
        if not self.cfg.enabled:
            return
        self.cwnd = float(self.mtu)
        self.stats["rto_resets"] += 1


class Dcqcn:
    """DCQCN reaction point (Zhu et al. 2015), evaluated lazily at each call."""

    def __init__(self, cfg: CCConfig):
        self.cfg = cfg
        self.line = cfg.line_rate_bps
        self.rc = self.rt = self.line  # current and target rate
        self.alpha = 1.0
        self.cnps = 0
        self._alpha_t = self._rate_t = None  # last alpha / rate timer instants
        self._t_count = self._b_count = 0
        self._bytes = 0
        self._cnp_since_alpha = False

    @property
    def limited(self) -> bool:
        return self.rc < self.line

    def on_cnp(self, now: int) -> None:
        if not self.cfg.dcqcn:
            return
        self.advance(now)
        self.cnps += 1
        self.rt = self.rc
        self.rc = max(self.cfg.dcqcn_min_bps, self.rc * (1 - self.alpha / 2))
        self.alpha = (1 - self.cfg.dcqcn_g) * self.alpha + self.cfg.dcqcn_g
        self._cnp_since_alpha = True
        self._alpha_t = self._rate_t = now
        self._t_count = self._b_count = self._bytes = 0

    def _increase(self, t: int, b: int) -> None:
        f = self.cfg.dcqcn_fast_steps
        if max(t, b) < f:
            pass  # fast recovery: towards the target rate
        elif min(t, b) > f:
            self.rt = min(self.line, self.rt + self.cfg.dcqcn_hai_bps * (min(t, b) - f))
        else:
            self.rt = min(self.line, self.rt + self.cfg.dcqcn_ai_bps)
        self.rc = min(self.line, (self.rt + self.rc) / 2)

    def advance(self, now: int) -> None:
        """Run the alpha and rate-increase timers up to now."""
        if self._alpha_t is None:
            return
        at = self.cfg.dcqcn_alpha_timer_ns
        while now - self._alpha_t >= at:
            self._alpha_t += at
            if not self._cnp_since_alpha:
                self.alpha *= 1 - self.cfg.dcqcn_g
            self._cnp_since_alpha = False
        rt = self.cfg.dcqcn_rate_timer_ns
        steps = 0
        while now - self._rate_t >= rt and self.rc < self.line and steps < 10_000:
            self._rate_t += rt
            self._t_count += 1
            self._increase(self._t_count, self._b_count)
            steps += 1
        if self.rc >= self.line:
            self.rc = self.rt = self.line
            self._alpha_t = self._rate_t = None  # at line rate: nothing left to recover

    def on_sent(self, nbytes: int) -> None:
        if self._rate_t is None:
            return
        self._bytes += nbytes
        if self._bytes >= self.cfg.dcqcn_byte_counter:
            self._bytes = 0
            self._b_count += 1
            self._increase(self._t_count, self._b_count)


class Pacer:
    """Token-less pacing: the next packet may leave at ``next_ns``; a small burst allowance
    keeps a paced sender from losing rate to timer granularity."""

    def __init__(self, burst_pkts: int = 2):
        self.next_ns = 0
        self.burst = burst_pkts

    def ready(self, now: int) -> bool:
        return now >= self.next_ns

    def sent(self, now: int, nbytes: int, rate_bps: float) -> None:
        gap = int(nbytes * 8e9 / rate_bps) if rate_bps > 0 else 0
        self.next_ns = max(self.next_ns, now - self.burst * gap) + gap
