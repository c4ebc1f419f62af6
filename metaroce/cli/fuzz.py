"""`metaroce fuzz`: random and mutated packets through the NIC's XDP program; nothing may be
lost, nothing may be written outside a region. See docs/reliability.md."""

import click

from ..errors import UsageError
from .output import emit_json, json_option, log
from .params import SEED, finite

SUMMARY = ("packets", "accepted", "passed", "tx", "dropped", "unaccounted", "out_of_region_writes",
           "crashes")


@click.command()
@click.option("--packets", type=click.IntRange(min=1), default=1_000_000, show_default=True,
              help="Packets to run through the program.")
@click.option("--seed", type=SEED, default=1, show_default=True, help="Generator seed.")
@click.option("--wire", is_flag=True,
              help="Fuzz a running daemon over the wire: a pair lab, the real daemon with live "
                   "QPs, frames sent through an AF_PACKET socket.")
@click.option("--mtu", type=click.IntRange(1280, 9000), default=None,
              help="Jumbo frames: frames up to this link MTU plus the Ethernet header, QPs at the "
                   "path MTU it allows (4096 at 9000); frames past a page reach the program "
                   "as multi-buffer xdp_buffs (its fragments path). Default: small frames at "
                   "path MTU 256 (--wire: a 1500-byte lab at 1024).")
@click.option("--queues", type=click.IntRange(1, 16), default=1, show_default=True,
              help="--wire: receive and transmit queues of the lab's veths; with more than one "
                   "the daemon steers frames to their QP's CPU (metaroce up --rx-cpus auto), "
                   "and the run fails unless every RoCE frame went through the steering.")
@click.option("--time-limit", type=finite(min=0, min_open=True), default=None,
              help="Stop after this many seconds (the report says how many packets ran).")
@json_option
def fuzz(packets, seed, wire, mtu, queues, time_limit, as_json):
    """Fuzz the XDP fast path with BPF_PROG_TEST_RUN: valid packets of every opcode against
    live QPs and regions, mutated headers, lengths and keys, truncations, random frames.
    Exits non-zero if any packet is unaccounted for, any byte changes outside what an
    accepted packet may write, or any other invariant fails."""
    from ..system import import_bcc, require_root  # noqa: PLC0415
    require_root("metaroce fuzz")
    import_bcc()
    if queues != 1 and not wire:
        raise UsageError("--queues applies to --wire (the lab's veths)")
    if wire:
        if time_limit is not None:
            raise UsageError("--time-limit applies to the BPF_PROG_TEST_RUN fuzzer, not --wire")
        from ..fuzz.wire import fuzz_wire  # noqa: PLC0415
        if not as_json:
            log(f"fuzzing a running daemon over the wire: {packets} frames, seed {seed}" +
                (f", MTU {mtu}" if mtu else ""))
        rep = fuzz_wire(packets, seed, progress=lambda done, t: log(f"  {done} frames, {t:.0f} s"),
                        mtu=mtu, queues=queues)
        if as_json:
            emit_json(rep)
        else:
            for k in SUMMARY + ("not_delivered", "delivered", "qps_rearmed",
                                "multi_buffer_frames", "steered_frames"):
                click.echo(f"{k:<22} {rep[k]:>12,}")
            click.echo("drops by reason:")
            for k, v in rep["drops_by_reason"].items():
                click.echo(f"  {k:<20} {v:>12,}")
            click.echo(f"daemon serves after: {'yes' if rep['daemon_serves_after'] else 'NO'}")
        return 0 if rep["ok"] else 1
    from ..fuzz.harness import fuzz_fastpath  # noqa: PLC0415

    if not as_json:
        log(f"fuzzing the XDP fast path: {packets} packets, seed {seed}" +
            (f", frames up to {mtu + 14} bytes (MTU {mtu})" if mtu else ""))
    rep = fuzz_fastpath(packets, seed, time_limit_s=time_limit,
                        progress=lambda done, t: log(f"  {done} packets, {done / t:,.0f}/s"),
                        mtu=mtu)
    if as_json:
        emit_json(rep)
    else:
        _print(rep)
    if not rep["ok"]:
        if not as_json:
            log(f"metaroce: error: fuzzing found {rep['violations']} violation(s)")
        return 1
    return 0


def _print(rep: dict) -> None:
    for k in SUMMARY:
        click.echo(f"{k:<22} {rep[k]:>12,}")
    click.echo(f"{'rate':<22} {rep['packets_per_s']:>12,} packets/s ({rep['elapsed_s']} s)")
    if rep["mtu"]:
        click.echo(f"jumbo: MTU {rep['mtu']}, PMTU {rep['pmtu']}, largest frame "
                   f"{rep['largest_frame']:,} bytes")
        click.echo(f"{'multi_buffer_frames':<22} {rep['multi_buffer_frames']:>12,} "
                   f"(program counted {rep['multi_buffer_seen'] or 0:,} RoCE ones; "
                   f"{rep['multi_buffer_accepted']:,} accepted, "
                   f"{rep['multi_buffer_passed']:,} passed)")
        if rep["linear_splits"] is not None:
            click.echo(f"{'linear_splits':<22} {rep['linear_splits']:>12,}")
    click.echo("drops by reason (silently dropped):")
    for k, v in rep["drops_by_reason"].items():
        click.echo(f"  {k:<20} {v:>12,}")
    click.echo("refused with a reply (NAK, RNR NAK, re-ACK):")
    for k, v in rep["tx_by_reason"].items():
        click.echo(f"  {k:<20} {v:>12,}")
    missing = rep["deep_reasons_missing"]
    n = len(rep["deep_reasons"])
    click.echo(f"deep checks reached: {n - len(missing)}/{n}" +
               (f" (missing: {', '.join(missing)})" if missing else ""))
    click.echo(f"final valid WRITE placed: {'yes' if rep['final_write_ok'] else 'NO'}")
    for f in rep["failures"]:
        click.echo(f"FAIL {f}")


__all__ = ["fuzz"]
