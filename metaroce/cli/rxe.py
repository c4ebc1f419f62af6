"""`metaroce rxe`: an independent RoCEv2 peer — Linux Soft-RoCE (rdma_rxe) with Debian's kernel
and rdma-core in a QEMU guest on a lab's switch."""

import click

from ..errors import MetaroceError
from ..system import require_root
from .output import emit_json, json_option
from .params import finite

lab_option = click.option("--lab", "lab", default=None,
                          help="Lab whose switch the guest joins (default: the only lab up).")


@click.group()
def rxe():
    """rxe peer: build, start, inspect and stop a Soft-RoCE guest."""


@rxe.command()
@click.option("--force", is_flag=True, help="Rebuild even when the cache has the image.")
@json_option
def build(force, as_json):
    """Build the guest image from Debian packages (cached by package versions)."""
    from ..rxe import image  # noqa: PLC0415
    require_root("metaroce rxe build")
    man = image.build(force=force)
    doc = {k: man[k] for k in ("key", "dir", "cached", "kernel_release", "rootfs_bytes",
                                "build_seconds")}
    doc["versions"] = man["versions"]["packages"]
    if as_json:
        emit_json(doc)
    else:
        click.echo(f"image {doc['key']} in {doc['dir']} ({'cached, ' if doc['cached'] else ''}"
                   f"built in {doc['build_seconds']} s; kernel {doc['kernel_release']})")


@rxe.command()
@lab_option
@click.option("--switch", default=None, help="Switch node whose bridge the guest joins.")
@click.option("--memory", "mem_mib", type=click.IntRange(256, 8192), default=1024,
              show_default=True, help="Guest memory in MiB.")
@click.option("--accel", type=click.Choice(["kvm", "tcg"]), default=None,
              help="Accelerator (default: kvm when /dev/kvm works, else tcg).")
@json_option
def up(lab, switch, mem_mib, accel, as_json):
    """Boot the guest on the lab's switch and wait for rxe0."""
    from ..lab import state  # noqa: PLC0415
    from ..rxe import guest  # noqa: PLC0415
    g = guest.up(state.resolve(lab), switch=switch, mem_mib=mem_mib, accel=accel)
    if as_json:
        emit_json(g.to_dict())
    else:
        click.echo(f"rxe0 at {g.ip} (GID {g.gid}, index {g.gid_index}) on lab {g.lab}")


@rxe.command()
@lab_option
@json_option
def down(lab, as_json):
    """Stop the lab's guest."""
    from ..rxe import guest  # noqa: PLC0415
    require_root("metaroce rxe down")
    name = lab or _only_guest()
    stopped = guest.down(name)
    if as_json:
        emit_json({"lab": name, "stopped": stopped})
    elif not stopped:
        click.echo(f"no rxe guest on lab {name}", err=True)


@rxe.command()
@lab_option
@json_option
def status(lab, as_json):
    """The guest's addresses, accelerator, image and liveness."""
    from ..rxe import guest  # noqa: PLC0415
    g = guest.load(lab or _only_guest())
    doc = {**g.to_dict(), "alive": guest._alive(g.pid)}
    if as_json:
        emit_json(doc)
    else:
        for k, v in doc.items():
            click.echo(f"{k}: {v}")


@rxe.command(name="exec", context_settings={"ignore_unknown_options": True})
@lab_option
@click.option("--timeout", type=finite(0.1, 3600), default=60, show_default=True,
              help="Seconds the command may run.")
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED)
@json_option
def exec_cmd(lab, timeout, argv, as_json):
    """Run a command in the guest (e.g. `metaroce rxe exec -- ibv_devinfo`)."""
    from ..rxe import guest  # noqa: PLC0415
    require_root("metaroce rxe exec")
    g = guest.load(lab or _only_guest())
    with guest.Agent(g) as a:
        r = a.exec(argv, timeout=timeout)
    if as_json:
        emit_json(r)
    else:
        click.echo(r["out"], nl=False)
        click.echo(r["err"], nl=False, err=True)
    return 124 if r["rc"] is None else r["rc"]


def _only_guest() -> str:
    from ..rxe import guest  # noqa: PLC0415
    names = guest.running()
    if len(names) != 1:
        raise MetaroceError("no rxe guest is running" if not names else
                            f"several rxe guests run ({', '.join(names)}): give --lab")
    return names[0]
