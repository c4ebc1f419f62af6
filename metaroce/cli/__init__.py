"""`metaroce` command line: one click group; each subcommand group lives in its own module."""

import importlib
import os
import sys

import click

from .. import __version__
from ..errors import MetaroceError
from .output import report_error

# name -> "module:attribute"; modules are imported only when their command runs, so a
# broken or slow import in one command group cannot break the others.
SUBCOMMANDS = {
    "lab": "metaroce.cli.lab:lab",
    "demo": "metaroce.cli.demo:demo",
    "pcap": "metaroce.cli.pcap:pcap",
    "spec": "metaroce.cli.spec:spec",
    "up": "metaroce.cli.nic:up",
    "down": "metaroce.cli.nic:down",
    "status": "metaroce.cli.nic:status",
    "sim": "metaroce.cli.sim:sim",
    "fuzz": "metaroce.cli.fuzz:fuzz",
    "stats": "metaroce.cli.nic:stats",
    "qp": "metaroce.cli.qp:qp",
    "conformance": "metaroce.cli.conformance:conformance",
    "provision": "metaroce.cli.provision:provision",
    "install": "metaroce.cli.install:install",
    "exporter": "metaroce.cli.exporter:exporter",
    "perf": "metaroce.cli.perf:perf",
    "train-demo": "metaroce.cli.train_demo:train_demo",
    "rxe": "metaroce.cli.rxe:rxe",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx, name):
        target = SUBCOMMANDS.get(name)
        if target is None:
            return None
        module, attr = target.split(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except ModuleNotFoundError:
            return None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="metaroce")
def cli():
    """MetaRoCE: a software RDMA NIC in XDP, its lab and its tools."""


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in argv
    if any("\x00" in a for a in argv):     # a shell cannot pass one; click's Path would choke
        report_error("an argument contains a NUL byte", as_json)
        return 2
    try:
        rv = cli.main(args=argv, prog_name="metaroce", standalone_mode=False)
    except MetaroceError as exc:
        report_error(str(exc), as_json)
        return exc.exit_code
    except click.exceptions.Abort:
        report_error("aborted", as_json)
        return 130
    except click.ClickException as exc:  # usage errors: one line, exit 2
        report_error(exc.format_message(), as_json)
        return exc.exit_code
    except KeyboardInterrupt:
        report_error("interrupted", as_json)
        return 130
    except Exception as exc:  # a bug or an unexpected system failure: still one line
        if os.environ.get("METAROCE_DEBUG"):
            raise
        report_error(f"{type(exc).__name__}: {exc} (METAROCE_DEBUG=1 shows a traceback)", as_json)
        return 1
    return rv if isinstance(rv, int) else 0


def _entry():
    sys.exit(main())


if __name__ == "__main__":
    _entry()
