"""`metaroce exporter --listen ADDR:PORT`: Prometheus metrics of the host's MetaRoCE devices."""

import math

import click

from ..errors import MissingDependency, UsageError
from ..system import require_root
from .output import emit_json, json_option, log


@click.command()
@click.option("--listen", default="localhost:9470", show_default=True,
              help="ADDR:PORT, [IPV6]:PORT or :PORT (every IPv4 address); port 0 picks one.")
@click.option("--dev", "devs", multiple=True,
              help="A device to export (repeatable); default: every running daemon.")
@click.option("--netns", "netnses", multiple=True,
              help="Namespace of the --dev devices: one for all, or one per --dev in order.")
@click.option("--once", is_flag=True,
              help="Print one scrape on stdout and exit (with --json: as one JSON document).")
@json_option
def exporter(listen, devs, netnses, once, as_json):
    """Serve device, drop-reason and per-QP counters at http://ADDR:PORT/metrics."""
    from ..deploy import exporter as ex  # noqa: PLC0415
    require_root("metaroce exporter")      # the daemons' sockets are root's (mode 0660)
    if netnses and not devs:
        raise UsageError("--netns names the namespace of --dev devices: give --dev too")
    if netnses and len(netnses) not in (1, len(devs)):
        raise UsageError(f"{len(netnses)} --netns for {len(devs)} --dev: give one, or one per --dev")
    devices = [(dv, (netnses[0] if len(netnses) == 1 else netnses[i]) if netnses else None)
               for i, dv in enumerate(devs)] or None
    collector = ex.Collector(devices)
    if once:
        text = collector.render()
        if as_json:
            emit_json(scrape_as_json(text))
        else:
            click.echo(text, nl=False)
        return 0
    srv = ex.make_server(listen, collector)
    host, port = srv.server_address[:2]
    url = f"http://{'[' + host + ']' if ':' in host else host or '0.0.0.0'}:{port}/metrics"
    if as_json:
        emit_json({"listen": f"{host}:{port}", "url": url,
                   "devices": [{"dev": a, "netns": b} for a, b in devices] if devices else "all"})
    log(f"metaroce: exporter serving {url} "
        f"({', '.join(a + (' in ' + b if b else '') for a, b in devices) if devices else 'every running daemon'})")
    import signal  # noqa: PLC0415
    import threading  # noqa: PLC0415
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=srv.shutdown).start())
    try:
        srv.serve_forever()
    finally:
        srv.server_close()
    return 0


def scrape_as_json(text: str) -> dict:
    """One scrape as JSON: {"families": [{"name", "type", "help", "samples": [{"name",
    "labels", "value"}]}]}, read back from the exposition text with prometheus_client's parser
    (so it says exactly what a Prometheus server would store). Values are numbers; a value JSON
    cannot hold is written as Prometheus writes it ("NaN", "+Inf", "-Inf")."""
    try:
        from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415
    except ImportError:
        raise MissingDependency("exporter --once --json needs prometheus_client "
                                "(pip install prometheus_client)") from None

    def number(v) -> int | float | str:
        v = float(v)
        if math.isfinite(v):
            return int(v) if v.is_integer() and abs(v) < 2 ** 63 else v
        return "NaN" if v != v else ("+Inf" if v > 0 else "-Inf")
    return {"families": [
        {"name": f.name, "type": f.type, "help": f.documentation,
         "samples": [{"name": s.name, "labels": dict(s.labels), "value": number(s.value)}
                     for s in f.samples]}
        for f in text_string_to_metric_families(text)]}
