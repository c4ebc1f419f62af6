"""`metaroce spec`: list the specification's clauses and lint them."""

import click

from .. import spec as _spec
from ..errors import MetaroceError
from .output import emit_json, json_option


def _load():
    try:
        return _spec.load()
    except _spec.SpecError as exc:
        raise MetaroceError(str(exc)) from None


@click.group()
def spec():
    """The MetaRoCE specification, version 2 (docs/spec)."""


@spec.command()
@json_option
@click.option("--prefix", default=None, help="Only clauses with this prefix (e.g. SACK).")
@click.option("--profile", type=click.Choice([p.key for p in _spec.PROFILES]), default=None,
              help="Only the clauses of this conformance profile (with those it builds on).")
def clauses(as_json, prefix, profile):
    """List every clause: id, level, profile, title, file."""
    from ..spec.profiles import clauses_of  # noqa: PLC0415
    found = _load()[0]
    items = clauses_of(profile, found) if profile else found
    items = [c for c in items if prefix is None or c.id.split("-")[0] == prefix.upper()]
    if as_json:
        emit_json([{"id": c.id, "level": c.level, "profile": c.profile, "title": c.title,
                    "text": c.text, "file": c.file, "line": c.line, "tests": list(c.tests)}
                   for c in items])
        return
    for c in items:
        click.echo(f"{c.id:<10} {c.level:<6} {c.profile:<9} {c.title}  ({c.file}:{c.line})")


@spec.command()
@json_option
def lint(as_json):
    """Check clause ids, levels, profiles and Test: sentences, the clauses cited, the
    registries against the codec and the profiles' clause lists; exit 1 on any problem."""
    found, problems = _load()
    if as_json:
        emit_json({"clauses": len(found), "problems": problems})
    else:
        for p in problems:
            click.echo(p)
        click.echo(f"{len(found)} clauses, {len(problems)} problems", err=True)
    return 1 if problems else 0
