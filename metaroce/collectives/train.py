"""The DDP training run the demo, the benchmark and the tests share: a small MLP trained with
DistributedDataParallel for a fixed number of steps on synthetic data (per-rank, seeded), over
the "metaroce" backend or over Gloo; one function per rank, run in its lab host's namespace."""

from __future__ import annotations

import os
import time
from datetime import timedelta

import numpy as np

NO_GLOO_IF = "mr-no-gloo"       # a MetaRoCE run points Gloo at an interface that does not exist


def ddp_rank(rank: int, world: int, backend: str, master: str, port: int, netns: str | None,
             steps: int, seed: int, width: int = 256, batch: int = 32) -> dict:
    os.environ.update(MASTER_ADDR=master, MASTER_PORT=str(port), METAROCE_DEV="eth0",
                      METAROCE_NETNS=netns or "",
                      GLOO_SOCKET_IFNAME="eth0" if backend == "gloo" else NO_GLOO_IF)
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    if backend == "metaroce":
        from . import torch_backend  # noqa: F401  (registers the backend)
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    dist.init_process_group(backend, rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    try:
        pg = dist.group.WORLD
        model = torch.nn.Sequential(torch.nn.Linear(64, width), torch.nn.ReLU(),
                                    torch.nn.Linear(width, width), torch.nn.ReLU(),
                                    torch.nn.Linear(width, 10))
        if rank != 0:                  # DDP must make the ranks agree from rank 0's weights
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.01 * rank)
        ddp = DDP(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        g = torch.Generator().manual_seed(seed * 1000 + rank)
        teacher = torch.Generator().manual_seed(seed)
        w_true = torch.randn(64, 10, generator=teacher)
        losses, times = [], []
        sent0 = pg.sent_bytes() if backend == "metaroce" else 0
        for _ in range(steps):
            x = torch.randn(batch, 64, generator=g)
            y = (x @ w_true).argmax(1)
            t0 = time.perf_counter()
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(ddp(x), y)
            loss.backward()
            opt.step()
            times.append(time.perf_counter() - t0)
            losses.append(float(loss.detach()))
        params = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()
        nparams = params.size
        out = {"params": params, "losses": losses, "step_s": times,
               "backend": pg.name() if hasattr(pg, "name") else str(dist.get_backend()),
               "pg_type": type(pg).__name__, "nparams": nparams,
               "groups": sorted({type(p).__name__ for p in
                                 dist.distributed_c10d._world.pg_map})}
        if backend == "metaroce":
            out["sent_bytes"] = pg.sent_bytes() - sent0
            out["modes"] = sorted(set(pg.comm.mode.values()))
        return out
    finally:
        dist.destroy_process_group()


def compare(runs: dict[str, list[dict]]) -> dict:
    """Agreement across ranks (bit for bit) and between the backends (float tolerance)."""
    out = {}
    for b, rs in runs.items():
        out[f"{b}_ranks_identical"] = all(np.array_equal(r["params"], rs[0]["params"])
                                          for r in rs)
        st = np.array([t for r in rs for t in r["step_s"][1:]] or [0.0])
        out[f"{b}_step_ms_median"] = float(np.median(st) * 1e3)
    if len(runs) == 2:
        a, b = (rs[0]["params"] for rs in runs.values())
        out["max_abs_diff"] = float(np.max(np.abs(a - b)))
        out["backends_match"] = bool(np.allclose(a, b, rtol=1e-4, atol=1e-5))
    return out
