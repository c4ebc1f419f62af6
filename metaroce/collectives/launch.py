"""Run one Python function per rank, each in its own process (spawned, so nothing is inherited
from the caller but its arguments), optionally inside a lab host's network namespace; collect
what each returned or the traceback it died with."""

from __future__ import annotations

import multiprocessing as mp
import queue
import time
import traceback
from typing import Any, Callable

from .reduce import CollectiveError


def _child(q, rank: int, netns: str | None, fn: Callable, args: tuple) -> None:
    try:
        if netns:
            from pyroute2 import netns as _ns
            _ns.setns(netns)
        q.put((rank, True, fn(rank, *args)))
    except BaseException:  # noqa: BLE001 (reported to the parent)
        q.put((rank, False, traceback.format_exc()))


def run_ranks(fn: Callable, world: int, args: Callable[[int], tuple] | None = None,
              netns: list[str | None] | None = None, timeout_s: float = 120.0) -> list[Any]:
    """fn(rank, *args(rank)) in world processes; its return values in rank order. Raises
    CollectiveError with the first failing rank's traceback (the others are terminated)."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_child, daemon=True,
                         args=(q, r, netns[r] if netns else None, fn,
                               args(r) if args else ()))
             for r in range(world)]
    for p in procs:
        p.start()
    out: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < world:
            try:
                rank, ok, val = q.get(timeout=0.5)
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if r not in out and p.exitcode is not None]
                if dead and q.empty():
                    time.sleep(0.5)          # a result may still be in the pipe
                    if q.empty():
                        raise CollectiveError(f"ranks {dead} exited without a result (exit "
                                              f"codes {[procs[r].exitcode for r in dead]})")
                if time.monotonic() > deadline:
                    raise CollectiveError(f"ranks {sorted(set(range(world)) - set(out))} did "
                                          f"not finish within {timeout_s} s") from None
                continue
            if not ok:
                raise CollectiveError(f"rank {rank} failed:\n{val}")
            out[rank] = val
    finally:
        for p in procs:
            p.join(5 if len(out) == world else 0.1)
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(5)
    return [out[r] for r in range(world)]
