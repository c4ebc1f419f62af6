"""`metaroce install --systemd`: put the `metaroce@.service` template unit in place."""

import click

from ..errors import UsageError
from .output import emit_json, json_option, log


@click.command()
@click.option("--systemd", "systemd_unit", is_flag=True, help="Install the metaroce@.service unit.")
@click.option("--prefix", default="/", show_default=True, type=click.Path(file_okay=False),
              help="Root to install under (the unit goes to PREFIX/etc/systemd/system).")
@click.option("--config-dir", default="/etc/metaroce", show_default=True,
              help="Where the unit reads <interface>.toml (what metaroce provision writes).")
@click.option("--remove", is_flag=True, help="Remove the unit instead.")
@click.option("--dry-run", is_flag=True, help="Say what would be done, do nothing.")
@click.option("--verify", is_flag=True, help="Also check the unit with systemd-analyze verify.")
@json_option
def install(systemd_unit, prefix, config_dir, remove, dry_run, verify, as_json):
    """Install service files (today: the systemd unit)."""
    from ..deploy import systemd  # noqa: PLC0415
    if not systemd_unit:
        raise UsageError("say what to install: metaroce install --systemd")
    res = systemd.install(prefix, config_dir, remove=remove, dry_run=dry_run)
    if verify and not remove and not dry_run:
        ok, out = systemd.verify(res["unit"])
        res["verify"] = {"ok": ok and not out, "output": out}
    if as_json:
        emit_json(res)
    else:
        would = "would be " if dry_run and res["action"] != "unchanged" else ""
        log(f"metaroce: {res['unit']}: {would}{res['action']}")
        if res["daemon_reload"]:
            log("metaroce: systemctl daemon-reload done")
        if "verify" in res:
            log(f"metaroce: systemd-analyze verify: "
                f"{'ok' if res['verify']['ok'] else res['verify']['output']}")
        if res["action"] in ("created", "updated") and not dry_run:
            log("metaroce: next: metaroce provision --config FILE, then "
                "systemctl enable --now metaroce@<interface>")
    if "verify" in res and not res["verify"]["ok"]:
        return 1
    return 0
