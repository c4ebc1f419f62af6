"""`metaroce up | down | status`: the software RNIC daemon of a device."""

import os
import signal
import time

import click

from ..errors import MetaroceError
from ..system import require_root
from .output import emit_json, json_option, log

dev_option = click.option("--dev", required=True, help="Network interface, e.g. eth0.")
netns_option = click.option("--netns", default=None, help="Network namespace of the device.")


def _dev(dev, netns):
    from ..nic.daemon import DeviceId  # noqa: PLC0415 (keep `metaroce --help` fast)
    if netns and not os.path.exists(f"/var/run/netns/{netns}"):
        raise MetaroceError(f"no network namespace {netns!r}")
    return DeviceId(dev, netns)


@click.command()
@dev_option
@netns_option
@click.option("--mode", type=click.Choice(["roce", "metaroce"]), default="roce", show_default=True)
@click.option("--foreground", is_flag=True, help="Stay attached to the terminal.")
@json_option
def up(dev, netns, mode, foreground, as_json):
    """Turn DEV into a MetaRoCE RDMA device (XDP NIC + daemon)."""
    from ..nic import daemon as d  # noqa: PLC0415
    require_root("metaroce up")
    did = _dev(dev, netns)
    pid = d.running_pid(did)
    if pid:
        raise MetaroceError(f"a MetaRoCE daemon already runs on {dev} (pid {pid}): metaroce down --dev {dev}")
    d.clean_stale(did)
    if foreground:
        dm = d.Daemon(did, mode)
        log(f"metaroce: {dev} is up ({dm.xdp_mode} XDP, pid {os.getpid()})")
        dm.serve_forever()
        return 0
    rfd, wfd = os.pipe()
    child = os.fork()
    if child == 0:                      # the daemon
        os.close(rfd)
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        try:
            dm = d.Daemon(did, mode)
        except BaseException as exc:  # noqa: BLE001 (reported to the parent, then exit)
            os.write(wfd, f"error: {exc}".encode())
            os._exit(1)
        os.write(wfd, b"ok")
        os.close(wfd)
        try:
            dm.serve_forever()
        finally:
            os._exit(0)
    os.close(wfd)
    answer = os.read(rfd, 4096).decode() or "error: the daemon died while starting"
    os.close(rfd)
    if answer != "ok":
        os.waitpid(child, 0)
        raise MetaroceError(answer.removeprefix("error: "))
    st, _ = d.request(did, {"op": "status"})
    if as_json:
        emit_json(st)
    else:
        log(f"metaroce: {dev} is up ({st['xdp_mode']} XDP: {st['xdp_mode_reason']}; pid {st['pid']})")
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
    pid = d.running_pid(did)
    if pid is None:
        if d.clean_stale(did):
            result = {"dev": dev, "stopped": None, "cleaned_stale": True}
        else:
            raise MetaroceError(f"no MetaRoCE daemon runs on {dev}")
    else:
        os.kill(pid, signal.SIGTERM)
        for _ in range(100):
            if d.running_pid(did) is None:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, signal.SIGKILL)
            d.clean_stale(did)
        result = {"dev": dev, "stopped": pid, "cleaned_stale": False}
    if as_json:
        emit_json(result)
    else:
        log(f"metaroce: {dev} is down")


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
    click.echo(f"{st['dev']}: mode {st['mode']}, XDP {st['xdp_mode']} ({st['xdp_mode_reason']}), "
               f"pid {st['pid']}, up {st['uptime_s']:.0f} s, {st['mrs']} MRs")
    for k, v in st["counters"].items():
        click.echo(f"  {k:<20} {v}")


