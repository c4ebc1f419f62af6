"""`metaroce sim`: packet-level simulations of the transport engine (no root, no network).

Every scenario runs the real engine (metaroce.cengine, in C) over the deterministic network simulator
(metaroce.sim.net): same seed and options, same result. Times are simulated seconds, rates
bits per second.
"""

import math

import click

from ..errors import UsageError
from ..sim import scenarios as S
from .output import emit_json, json_option, log
from .params import SEED, finite

MODE_HELP = "metaroce: selective repeat, SACK, window CC, multipath, credits; roce: RoCEv2 " \
            "go-back-N with DCQCN."

mode_option = click.option("--mode", type=click.Choice(["metaroce", "roce"]), default="metaroce",
                           show_default=True, help=MODE_HELP)
seed_option = click.option("--seed", type=SEED, default=1, show_default=True,
                           help="Seed of every random choice (loss, PSNs, entropy, hashing).")


@click.group()
def sim():
    """Simulate MetaRoCE / RoCEv2 on virtual networks (deterministic, seeded).

    \b
    Fabric defaults (all scenarios): MTU 4096, 1 µs per link, switch egress buffer 1 MiB
    (tail drop), ECN CE-marking above 64 KiB, PSN window 512, RTO_min 50 µs, compat local ACK
    timeout 4.096 µs × 2^14 (67 ms), retry_cnt 7.
    """


def _report(doc: dict, as_json: bool, keys: list[str]) -> None:
    if as_json:
        emit_json(doc)
        return
    head = " ".join(f"{k}={doc[k]}" for k in ("scenario", "mode", "seed"))
    click.echo(head)
    for k in keys:
        v = doc.get(k)
        if k.endswith("_bps") and isinstance(v, (int, float)):
            v = f"{v / 1e9:.2f} Gbit/s"
        elif k.endswith("_s") and isinstance(v, float):
            v = f"{v * 1e6:.1f} µs"
        click.echo(f"  {k:<22} {v}")


# what one simulation may be asked for (a simulated second of 10 Tbit/s is already huge)
LIMITS = {"rate_gbps": 10_000, "host_gbps": 10_000, "fabric_gbps": 10_000,
          "size_mib": 65_536, "size_kib": 1 << 20, "msg_kib": 1 << 20}
MINIMA = {"rate_gbps": 0.001, "host_gbps": 0.001, "fabric_gbps": 0.001, "size_mib": 1 / 1024}

COMMON = ["goodput_bps", "retransmissions", "drops", "max_queue_bytes", "jain_fairness",
          "app_errors", "fct_p50_s", "fct_p99_s", "timeouts", "completed_flows"]


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise UsageError(msg)


def _sizes(**values) -> None:
    """Sizes and rates: finite, positive and within what a simulation can hold."""
    for name, v in values.items():
        flag = "--" + name.replace("_", "-")
        _check(math.isfinite(v) and v > 0, f"{flag} must be a positive number (got {v})")
        _check(v <= LIMITS.get(name, 1 << 20), f"{flag} must be at most {LIMITS.get(name, 1 << 20)}")
        _check(v >= MINIMA.get(name, 1), f"{flag} must be at least {MINIMA.get(name, 1)}")


@sim.command()
@click.option("--loss", type=finite(), default=0.01, show_default=True,
              help="Probability that a frame is lost at each switch egress (data and ACKs).")
@mode_option
@seed_option
@click.option("--rate-gbps", type=finite(), default=S.LOSS_DEFAULTS["rate_gbps"], show_default=True)
@click.option("--size-mib", type=finite(), default=S.LOSS_DEFAULTS["size_mib"], show_default=True,
              help="Bytes the one QP writes.")
@click.option("--msg-kib", type=int, default=S.LOSS_DEFAULTS["msg_kib"], show_default=True,
              help="Size of each RDMA WRITE (4 posted at a time).")
@click.option("--baseline/--no-baseline", default=True, show_default=True,
              help="Also run without loss and report lossless_goodput_bps and goodput_ratio.")
@json_option
def loss(loss, mode, seed, rate_gbps, size_mib, msg_kib, baseline, as_json):
    """Random loss on a pair: h0 — switch — h1.

    Default workload: one QP writes 16 MiB as 1 MiB RDMA WRITEs over 100 Gbit/s links; every
    frame (data and acknowledgements) is lost with probability --loss at the switch egress.
    """
    _check(0.0 <= loss < 1.0, "--loss must be in [0, 1)")
    _sizes(rate_gbps=rate_gbps, size_mib=size_mib, msg_kib=msg_kib)
    if not as_json:
        log(f"simulating loss={loss} mode={mode} seed={seed} …")
    doc = S.run_loss(loss, mode, seed, rate_gbps, size_mib, msg_kib, baseline)
    _report(doc, as_json, COMMON + ["lossless_goodput_bps", "goodput_ratio"])


@sim.command()
@click.option("--senders", type=int, default=32, show_default=True,
              help="Hosts writing to one receiver behind the same switch.")
@click.option("--credits/--no-credits", default=True, show_default=True,
              help="Receiver credits (CC-8; MetaRoCE mode only).")
@mode_option
@seed_option
@click.option("--qps", type=int, default=S.INCAST_DEFAULTS["qps"], show_default=True,
              help="QPs per sender.")
@click.option("--rate-gbps", type=finite(), default=S.INCAST_DEFAULTS["rate_gbps"],
              show_default=True)
@click.option("--size-kib", type=int, default=S.INCAST_DEFAULTS["size_kib"], show_default=True,
              help="Bytes each QP writes.")
@click.option("--msg-kib", type=int, default=S.INCAST_DEFAULTS["msg_kib"], show_default=True)
@json_option
def incast(senders, credits, mode, seed, qps, rate_gbps, size_kib, msg_kib, as_json):
    """N-to-1 incast: N senders and one receiver on one switch.

    Default workload: 32 senders, one QP each, each writes 1 MiB as 256 KiB RDMA WRITEs, all
    starting at once over 100 Gbit/s links; the receiver's downlink is the bottleneck.
    """
    _check(senders >= 1 and qps >= 1, "--senders and --qps must be >= 1")
    _check(senders * qps <= 20_000, "at most 20000 QPs")
    _sizes(rate_gbps=rate_gbps, size_kib=size_kib, msg_kib=msg_kib)
    if not as_json:
        log(f"simulating {senders}-to-1 incast mode={mode} credits={credits} seed={seed} …")
    doc = S.run_incast(senders, credits, mode, seed, rate_gbps, size_kib, msg_kib, qps)
    _report(doc, as_json, COMMON + ["credit_grants", "ecn_marks", "cnps"])


@sim.command()
@click.option("--paths", type=int, default=4, show_default=True,
              help="Equal-cost paths: spines of the leaf-spine fabric.")
@click.option("--fail-at", type=finite(), default=None,
              help="Fail the spine0 — leaf1 link (both directions) at this simulated second.")
@mode_option
@seed_option
@click.option("--entropies", type=int, default=None,
              help="MetaRoCE source ports sprayed over (default 4 × paths, at most 64).")
@click.option("--host-gbps", type=finite(), default=S.MULTIPATH_DEFAULTS["host_gbps"],
              show_default=True)
@click.option("--fabric-gbps", type=finite(), default=S.MULTIPATH_DEFAULTS["fabric_gbps"],
              show_default=True)
@click.option("--size-mib", type=finite(), default=S.MULTIPATH_DEFAULTS["size_mib"],
              show_default=True)
@click.option("--msg-kib", type=int, default=S.MULTIPATH_DEFAULTS["msg_kib"], show_default=True)
@json_option
def multipath(paths, fail_at, mode, seed, entropies, host_gbps, fabric_gbps, size_mib, msg_kib,
              as_json):
    """Leaf-spine with K equal-cost paths, optionally losing one mid-run.

    Default workload: one QP between hosts on different leaves writes 32 MiB as 1 MiB RDMA
    WRITEs; hosts have 400 Gbit/s links, each leaf-spine link 100 Gbit/s, so one path alone
    is the bottleneck. Switches pick the spine by hashing the UDP source port. recovery_s is
    the time from the failure until the delivered rate (20 µs window) is back to 90 % of the
    pre-failure rate × (K−1)/K; null without --fail-at or if that never happens.
    """
    _check(1 <= paths <= 64, "--paths must be in 1..64")
    _check(entropies is None or 1 <= entropies <= 64, "--entropies must be in 1..64")
    _check(fail_at is None or (math.isfinite(fail_at) and 0 <= fail_at <= 1e6),
           "--fail-at must be a number of simulated seconds from 0 to 1e6")
    _sizes(host_gbps=host_gbps, fabric_gbps=fabric_gbps, size_mib=size_mib, msg_kib=msg_kib)
    if not as_json:
        log(f"simulating {paths}-path leaf-spine mode={mode} seed={seed} …")
    doc = S.run_multipath(paths, fail_at, mode, seed, host_gbps, fabric_gbps, size_mib, msg_kib,
                          entropies)
    _report(doc, as_json, COMMON + ["recovery_s", "path_evictions"])
