"""`metaroce train-demo`: 2-4 lab hosts train the same small model with DDP for a fixed number
of steps, once over the "metaroce" torch.distributed backend and once over Gloo (TCP), same seed;
the final parameters must be identical across ranks and equal between the backends."""

import click

from ..errors import MetaroceError
from .output import emit_json, json_option, log
from .params import SEED


@click.command("train-demo")
@click.option("--hosts", type=click.IntRange(2, 4), default=2, show_default=True)
@click.option("--steps", type=click.IntRange(1, 10000), default=20, show_default=True)
@click.option("--seed", type=SEED, default=1, show_default=True)
@click.option("--mode", type=click.Choice(["metaroce", "roce"]), default="metaroce",
              show_default=True, help="What the devices offer.")
@json_option
def train_demo(hosts, steps, seed, mode, as_json):
    """DDP over MetaRoCE vs Gloo on a lab star: parameters and step time side by side."""
    try:
        import torch  # noqa: F401
    except ImportError:
        raise MetaroceError("train-demo needs PyTorch: pip install '.[torch]'") from None
    from ..collectives.lab import lab_hosts
    from ..collectives.launch import run_ranks
    from ..collectives.reduce import ring_allreduce_bytes
    from ..collectives.train import compare, ddp_rank
    runs = {}
    with lab_hosts(hosts, mode) as (addrs, netns):
        for i, backend in enumerate(("metaroce", "gloo")):
            log(f"training on {hosts} hosts over {backend}: {steps} steps")
            runs[backend] = run_ranks(
                ddp_rank, hosts, lambda r: (hosts, backend, addrs[0], 29700 + i, netns[r],
                                            steps, seed),
                netns=netns, timeout_s=120 + steps * 5)
    doc = compare(runs)
    m = runs["metaroce"][0]
    need = steps * ring_allreduce_bytes(m["nparams"] * 4, hosts)
    doc.update(hosts=hosts, steps=steps, seed=seed, params=m["nparams"],
               final_loss={b: rs[0]["losses"][-1] for b, rs in runs.items()},
               metaroce_groups=m["groups"], metaroce_qp_modes=m["modes"],
               metaroce_sent_bytes=m["sent_bytes"], ring_volume_bytes=need)
    doc["ok"] = bool(doc["metaroce_ranks_identical"] and doc["gloo_ranks_identical"] and
                     doc["backends_match"] and m["groups"] == ["MetaroceProcessGroup"])
    if as_json:
        emit_json(doc)
    else:
        click.echo(f"{hosts} hosts, {steps} steps, {m['nparams']} parameters")
        for b in runs:
            click.echo(f"  {b:9s} step {doc[f'{b}_step_ms_median']:.2f} ms (median)  "
                       f"final loss {doc['final_loss'][b]:.5f}  ranks identical: "
                       f"{doc[f'{b}_ranks_identical']}")
        click.echo(f"  parameters equal between backends: {doc['backends_match']} "
                   f"(max |diff| {doc['max_abs_diff']:.3g})")
        click.echo(f"  MetaRoCE run: process groups {m['groups']}, QP modes {m['modes']}, "
                   f"{m['sent_bytes']} bytes sent per rank (ring volume {need})")
    if not doc["ok"]:
        raise MetaroceError("the backends disagree (see above)")
    return 0
