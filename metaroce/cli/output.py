"""The CLI output contract: one JSON document on stdout with --json, logs on stderr,
errors as one line (or {"error": ...}) with a non-zero exit status."""

import json
import sys

import click

json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")


def emit_json(doc) -> None:
    sys.stdout.write(json.dumps(doc, sort_keys=False) + "\n")
    sys.stdout.flush()


def log(msg: str) -> None:
    """Progress and diagnostics: always stderr, so stdout stays machine-readable."""
    click.echo(msg, err=True)


def report_error(message: str, as_json: bool) -> None:
    message = " ".join(str(message).split())  # one line, always
    if as_json:
        emit_json({"error": message})
    else:
        click.echo(f"metaroce: error: {message}", err=True)
