"""`metaroce pcap`: write a golden capture of every opcode, decode captures."""

import click

from ..errors import UsageError
from ..wire.describe import describe, text_line
from ..wire.pcap import PcapError, read_pcap, write_pcap
from ..wire.samples import sample_packets
from .output import emit_json, json_option, log


@click.group()
def pcap():
    """Write and decode RoCEv2 / MetaRoCE captures (classic pcap, Ethernet)."""


@pcap.command()
@click.argument("out", type=click.Path(dir_okay=False, writable=True))
@click.option("--ipv", type=click.Choice(["4", "6", "both"]), default="both", show_default=True,
              help="IP version(s) to write.")
@json_option
def sample(out, ipv, as_json):
    """Write one valid packet of every opcode the spec defines to OUT."""
    versions = (4, 6) if ipv == "both" else (int(ipv),)
    pkts = sample_packets(versions)
    try:
        n = write_pcap(out, (p.to_bytes() for p in pkts))
    except OSError as exc:
        raise UsageError(f"cannot write {out}: {exc.strerror or exc}") from None
    if as_json:
        emit_json({"file": out, "packets": n, "ip_versions": list(versions)})
    else:
        log(f"wrote {n} packets to {out}")


@pcap.command()
@click.argument("file", type=click.Path(dir_okay=False))
@json_option
def decode(file, as_json):
    """List every frame of FILE (RoCE or not), with parse errors and ICRC status.

    With --json: one document, {"file": FILE, "frames": [one object per frame]}."""
    try:
        frames = []
        for rec in read_pcap(file):
            doc = describe(rec.data, rec.index)
            if as_json:
                frames.append(doc)
            else:
                click.echo(text_line(doc))
        if as_json:
            emit_json({"file": file, "frames": frames})
    except FileNotFoundError:
        raise UsageError(f"{file}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"{file}: is a directory") from None
    except PermissionError:
        raise UsageError(f"{file}: permission denied") from None
    except PcapError as exc:
        raise UsageError(f"{file}: {exc}") from None
