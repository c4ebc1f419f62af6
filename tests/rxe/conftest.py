"""The rxe peer's fixtures: a lab pair with the rxe guest on its switch and our daemon on h1.
These tests run in their own CI stage (`make test-rxe`), after the guest image is built; `make
test` does not collect this directory (pyproject's norecursedirs)."""

import os
import shutil

import pytest
from _deps import missing


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces, BPF, QEMU): run sudo make test-rxe"
    for tool in ("qemu-system-x86_64", "debootstrap"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (make rxe-setup)"
    return None


@pytest.fixture(scope="session")
def rxe_lab():
    """(lab view, guest, our daemon's context on h1, h1's namespace, h1's address)."""
    why = _why_not()
    if why:
        missing("the rxe peer", why)
    from metaroce.lab import core, state
    from metaroce.nic import daemon as d
    from metaroce.rxe import guest
    from metaroce.verbs import Context
    name = f"rx{os.getpid() % 10000}"
    core.up(name, "pair")
    g = dev = ctx = None
    try:
        view = core.LabView(name)
        g = guest.up(name)
        h1 = view.plan.node("h1")
        dev = d.DeviceId("eth0", h1.netns)
        d.start_background(dev, "roce")
        ctx = Context("eth0", h1.netns)
        yield view, g, ctx, h1.netns, h1.iface("eth0").ipv4.split("/")[0]
    finally:
        if ctx is not None:
            ctx.close()
        if dev is not None:
            try:
                d.stop(dev)
            except Exception:  # noqa: BLE001
                d.clean_stale(dev)
        guest.down(name)
        if name in state.names() or core.namespaces_of(name):
            core.down(name)
