"""`metaroce perf TEST [ADDRESS]`: the ib_write_bw / ib_write_lat family. Run the same command
on both hosts; without ADDRESS it is the server, with it the client. In a lab:

    metaroce lab exec --name L h2 -- metaroce perf write-bw --dev eth0 &
    metaroce lab exec --name L h1 -- metaroce perf write-bw 10.0.0.2 --dev eth0
"""

import click

from ..system import require_root
from .output import emit_json, json_option, log
from .params import finite


def _size(text: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = str(text).strip().lower().removesuffix("b")
    mult = units.get(t[-1:], 1)
    try:
        n = int(t[:-1] if mult > 1 else t) * mult
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a size (e.g. 64, 4k, 1m)", param_hint="-s")
    if not 1 <= n <= 1 << 30:
        raise click.BadParameter("size must be 1 byte .. 1 GiB", param_hint="-s")
    return n


@click.command()
@click.argument("test", type=click.Choice(["write-bw", "read-bw", "send-bw", "write-lat",
                                           "read-lat", "send-lat", "atomic-lat"]))
@click.argument("address", required=False)
@click.option("--dev", "-d", required=True, help="The MetaRoCE device (interface), e.g. eth0.")
@click.option("--netns", default=None, help="Network namespace of the device.")
@click.option("-s", "--size", default="65536", show_default=True, help="Message size (4k, 1m …).")
@click.option("-n", "--iters", type=click.IntRange(1, 10**9), default=None,
              help="Iterations (default 5000 for bandwidth, 1000 for latency).")
@click.option("-D", "--duration", type=finite(0.1, 3600), default=None,
              help="Run for this many seconds instead of -n (bandwidth tests).")
@click.option("-q", "--qps", type=click.IntRange(1, 1024), default=1, show_default=True)
@click.option("-t", "--tx-depth", type=click.IntRange(1, 4096), default=128, show_default=True)
@click.option("--mode", type=click.Choice(["metaroce", "roce"]), default=None,
              help="Ask for this mode (default: what the device offers).")
@click.option("--integrity", type=click.Choice(["icrc", "csum"]), default=None,
              help="The end-to-end check to ask for: csum takes the IPv4/UDP checksums in "
                   "place of the ICRC when both devices accept them (metaroce up --integrity "
                   "csum, spec 5.7); icrc keeps the ICRC [default: what the device accepts].")
@click.option("-m", "--mtu", type=click.IntRange(256, 8192), default=None,
              help="The largest path MTU this side offers (perftest's -m): an IB MTU (up to "
                   "4096), or on a MetaRoCE connection a multiple of 64 bytes up to 8192 (spec "
                   "CM-14); the connection takes the smaller of both sides' [default: what the "
                   "device takes].")
@click.option("-a", "--all", "all_sizes", is_flag=True, help="All sizes 2 B .. 8 MiB.")
@click.option("-p", "--port", type=click.IntRange(1, 65535), default=18515, show_default=True)
@click.option("--cpu", type=click.IntRange(0, 4095), default=None, help="Pin to this CPU.")
@json_option
def perf(test, address, dev, netns, size, iters, duration, qps, tx_depth, mode, integrity,
         mtu, all_sizes, port, cpu, as_json):
    """perftest-style RDMA bandwidth and latency (server without ADDRESS, client with it)."""
    from ..perf import report  # noqa: PLC0415 (keep `metaroce --help` fast)
    from ..perf.run import Options, run_client, serve  # noqa: PLC0415
    require_root("metaroce perf")
    if duration and test.endswith("lat"):
        raise click.BadParameter("-D is for bandwidth tests; use -n", param_hint="-D")
    if qps > 1 and test.endswith("lat"):
        raise click.BadParameter("latency tests use one QP", param_hint="-q")
    o = Options(test=test, dev=dev, netns=netns, address=address, size=_size(size), iters=iters,
                duration=duration, qps=qps, mode=mode, integrity=integrity, mtu=mtu,
                all_sizes=all_sizes, port=port,
                tx_depth=tx_depth, cpu=cpu)
    if address is None:
        doc = serve(o, log)
        if as_json:
            emit_json(doc)
        else:
            log(f"perf: server done ({doc['connections']} connection(s), mode {doc['mode']})")
        return 0
    rows = None if as_json else []
    doc = run_client(o, log=(lambda m: None) if as_json else rows.append)
    if as_json:
        emit_json(doc)
        return 0
    for line in report.header(test, doc):
        click.echo(line)
    for line in rows:
        click.echo(line)
    click.echo(report.LINE)
    return 0
