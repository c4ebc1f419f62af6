"""`metaroce up | down | status`: the software RNIC daemon of a device."""

import os

import click

from ..errors import MetaroceError, UsageError
from ..system import require_root
from .output import emit_json, json_option, log
from .params import QPN, finite, fmt_qpn

dev_option = click.option("--dev", required=True, help="Network interface, e.g. eth0.")
netns_option = click.option("--netns", default=None,
                            help="Network namespace of the device: a name (ip netns) or a path "
                                 "(/proc/PID/ns/net) [default: this process's].")


def _dev(dev, netns):
    """The device DEV in the namespace NETNS (a name as `ip netns` shows, or a path such as
    /proc/PID/ns/net), or in the caller's own namespace: whichever way the namespace is
    reached, it is the same device."""
    from ..nic.devid import DeviceId  # noqa: PLC0415 (keep `metaroce --help` fast)
    return DeviceId(dev, netns)


@click.command()
@dev_option
@netns_option
@click.option("--mode", type=click.Choice(["roce", "metaroce"]), default=None,
              help="Transport mode [default: the --config file's, else roce].")
@click.option("--foreground", is_flag=True, help="Stay attached to the terminal.")
@click.option("--credits/--no-credits", default=True, show_default=True,
              help="Receiver credits for incast (spec CC-8; MetaRoCE mode).")
@click.option("--link-rate", default=None,
              help="The device's bottleneck rate for credits and congestion control, e.g. "
                   "150mbit or 25gbit [default: the interface's speed, else 10gbit].")
@click.option("--credit-rtt-us", type=finite(1, 1e6), default=500.0, show_default=True,
              help="Base round trip the credit BDP is computed with.")
@click.option("--cc/--no-cc", default=True, show_default=True,
              help="Congestion control (spec CC-1..CC-7, COMPAT-4): MetaRoCE QPs run a window "
                   "that reacts to ECN and delay, RoCEv2 QPs DCQCN's reaction to CNPs; "
                   "--no-cc keeps a fixed window.")
@click.option("--cc-target-us", type=finite(0, 1e6), default=1000.0, show_default=True,
              help="Queueing delay above the smallest measured round trip that counts as "
                   "congestion when ECN marks arrive (CC-3).")
@click.option("--integrity", type=click.Choice(["icrc", "csum"]), default="icrc",
              show_default=True,
              help="The cheapest end-to-end check this device accepts on MetaRoCE connections "
                   "(spec 5.7): icrc, the RoCEv2 ICRC (CRC-32) only; csum, also the IPv4/UDP "
                   "checksums in its place (about a fifth of the ICRC's cost per KiB), used when "
                   "the peer's device accepts them too. Compat connections always check the "
                   "ICRC.")
@click.option("--rx-cpus", default="auto", show_default=True,
              help="Receive steering: each QP's frames are handled by the XDP program on one "
                   "of these CPUs (handed over through a cpumap by destination QP), so a QP's "
                   "state has one CPU whatever queue its frames arrive on. auto: all on a "
                   "device with several receive queues, else off; all: every CPU this process "
                   "may run on (off with one CPU); off: each frame where it arrives; or a list "
                   "such as 1 or 0,2-3.")
@click.option("--config", "config_path", default=None,
              help="Daemon config written by metaroce provision (e.g. /etc/metaroce/eth1.toml).")
@json_option
def up(dev, netns, mode, foreground, credits, link_rate, credit_rtt_us, cc, cc_target_us,
       integrity, rx_cpus, config_path, as_json):
    """Turn DEV into a MetaRoCE RDMA device (XDP NIC + daemon)."""
    from ..nic import daemon as d  # noqa: PLC0415
    require_root("metaroce up")
    did = _dev(dev, netns)
    if config_path:
        from ..provision.daemon_config import load_for  # noqa: PLC0415
        mode = load_for(config_path, dev, mode, log)
    mode = mode or "roce"
    from ..nic.ccconfig import CCConfig  # noqa: PLC0415
    from ..nic.credit import CreditConfig, parse_rate  # noqa: PLC0415
    try:
        rate = parse_rate(link_rate) if link_rate else None   # None: the device's speed
    except ValueError as exc:
        raise UsageError(f"--link-rate: {exc}") from None
    cfg = CreditConfig(link_rate_bps=rate, base_rtt_s=credit_rtt_us / 1e6) if credits else None
    ccfg = CCConfig(enabled=cc, link_rate_bps=rate, target_qdelay_s=cc_target_us / 1e6)
    if foreground:
        pid = d.running_pid(did)
        if pid:
            raise MetaroceError(d.already_running(did, pid))
        d.clean_stale(did)
        dm = d.Daemon(did, mode, cfg, integrity, ccfg, rx_cpus)
        if as_json:
            emit_json(dm.status())
        log(f"metaroce: {did.where()} is up ({dm.xdp_mode} XDP, pid {os.getpid()})")
        from ..deploy.systemd import sd_notify  # noqa: PLC0415
        sd_notify(f"READY=1\nSTATUS={dev} up, {mode} mode, {dm.xdp_mode} XDP")
        dm.serve_forever()
        return 0
    st = d.start_background(did, mode, cfg, integrity, ccfg, rx_cpus)
    if as_json:
        emit_json(st)
    else:
        log(f"metaroce: {did.where()} is up ({st['xdp_mode']} XDP: {st['xdp_mode_reason']}; "
            f"pid {st['pid']})")
    return 0


@click.command()
@dev_option
@netns_option
@json_option
def down(dev, netns, as_json):
    """Stop the daemon of DEV (its XDP program goes with it)."""
    from ..nic import daemon as d  # noqa: PLC0415
    require_root("metaroce down")
    did = _dev(dev, netns)
    result = d.stop(did)
    if as_json:
        emit_json(result)
    else:
        log(f"metaroce: {did.where()} is down")


@click.command()
@dev_option
@netns_option
@json_option
def status(dev, netns, as_json):
    """Show a device's mode, XDP attachment and counters."""
    from ..nic import daemon as d  # noqa: PLC0415
    require_root("metaroce status")
    st, _ = d.request(_dev(dev, netns), {"op": "status"})
    if as_json:
        emit_json(st)
        return
    click.echo(f"{st['dev']}: mode {st['mode']}, integrity {st.get('integrity', 'icrc')}, "
               f"XDP {st['xdp_mode']} ({st['xdp_mode_reason']}), "
               f"pid {st['pid']}, up {st['uptime_s']:.0f} s, {st['mrs']} MRs")
    cc = st.get("cc", {})
    if cc.get("enabled"):
        click.echo(f"  congestion control: MetaRoCE {cc['metaroce']}, RoCEv2 {cc['roce']}; link "
                   f"{cc['link_rate_bps'] / 1e9:g} Gbit/s, base RTT {cc['base_rtt_us']:g} us, "
                   f"delay target +{cc['target_qdelay_us']:g} us")
    elif cc:
        click.echo("  congestion control: off (fixed windows)")
    b = st.get("bpf_build", {})
    if b.get("verified_insns"):
        click.echo(f"  BPF: {b['source']} build {b['key']}, the verifier walked "
                   f"{b['verified_insns']:,} of its {b['verifier_budget']:,} instructions")
    steer = st.get("rx_steering", "off")
    if isinstance(steer, dict):
        per = ", ".join(f"CPU {c}: {n}" for c, n in steer["qps_per_cpu"].items())
        click.echo(f"  receive steering: QPs per CPU {per}")
    else:
        click.echo("  receive steering: off (each frame on the CPU it arrives on)")
    for k, v in st["counters"].items():
        click.echo(f"  {k:<20} {v}")




@click.command()
@dev_option
@netns_option
@click.option("--qp", "qpn", type=QPN, default=None, help="Only this QP (decimal or 0x-hex).")
@click.option("--nonzero", is_flag=True, help="Leave out counters that are zero.")
@json_option
def stats(dev, netns, qpn, nonzero, as_json):
    """Device and QP counters in rdma-core's names (`rdma statistic show` style)."""
    from ..nic import daemon as d  # noqa: PLC0415
    from ..nic.stats import device_stats, format_stats  # noqa: PLC0415
    require_root("metaroce stats")
    did = _dev(dev, netns)
    st = device_stats(d.request(did, {"op": "status"})[0])
    if qpn is not None:
        st["qps"] = [q for q in st["qps"] if q["qpn"] == qpn]
        if not st["qps"]:
            raise MetaroceError(f"no QP {fmt_qpn(qpn)} on {did.where()}")
    if as_json:
        emit_json({**did.describe(), "port": 1, **st})
        return
    for line in format_stats(dev, st, show_zero=not nonzero):
        click.echo(line)
