"""`metaroce provision --config FILE [--dry-run]`: make the host match a provisioning file."""

import click

from ..system import require_root
from .output import emit_json, json_option, log


@click.command()
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False),
              help="Provisioning file (TOML; YAML with PyYAML).")
@click.option("--dry-run", is_flag=True, help="Print what would change and change nothing.")
@click.option("--netns", default=None, help="Apply inside this network namespace.")
@click.option("--config-dir", default=None, type=click.Path(file_okay=False),
              help="Where daemon configs go (default: the file's config_dir, /etc/metaroce).")
@json_option
def provision(config_path, dry_run, netns, config_dir, as_json):
    """Set MTU, addresses, routes and sysctls, and write the daemon configs (idempotent)."""
    from ..provision import apply as ap  # noqa: PLC0415 (keep `metaroce --help` fast)
    from ..provision.config import load  # noqa: PLC0415
    from ..provision.plan import format_plan  # noqa: PLC0415
    cfg = load(config_path, config_dir)
    if not dry_run:
        require_root("metaroce provision")
    changes, warnings = ap.plan(cfg, netns)
    if dry_run:
        applied = []
    else:
        applied = ap.apply(changes, netns,
                           on_change=None if as_json else lambda c: log(f"+ {c.text}"))
        left, _ = ap.plan(cfg, netns)
        if left:
            warnings.append("after applying, still different: " + "; ".join(c.text for c in left))
    if as_json:
        emit_json({"config": cfg.source, "netns": netns, "dry_run": dry_run,
                   "changes": [c.to_dict() for c in changes], "applied": len(applied),
                   "warnings": warnings})
        return 0
    lines = format_plan(changes, warnings, dry_run)
    if dry_run:
        for ln in lines:
            click.echo(ln)
    else:
        for ln in lines:
            if not ln.startswith("+ "):
                log(ln)
    return 0
