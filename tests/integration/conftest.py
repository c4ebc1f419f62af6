"""Root/BPF integration fixtures: real namespaces, veth links and BCC-loaded programs."""

import os

import pytest
from _deps import in_ci

from metaroce.errors import MetaroceError


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces, BPF): run sudo make test"
    try:
        from metaroce.system import import_bcc
        import_bcc()
    except MetaroceError as exc:
        return str(exc)
    if not os.path.isdir("/sys/fs/bpf"):
        return "bpffs is not available"
    return None


REASON = _why_not()


def pytest_collection_modifyitems(config, items):
    if REASON is None:
        return
    if in_ci():
        # CI here is root with BPF: an integration test that cannot run is a failure, not a skip
        raise pytest.UsageError(f"integration tests cannot run in CI: {REASON}")
    for item in items:
        if "integration" in str(item.fspath):
            item.add_marker(pytest.mark.skip(reason=REASON))


_counter = [0]


def _lab(prefix: str):
    """A lab name unique to this test run; the lab is removed afterwards whatever happened."""
    from metaroce.lab import core, state
    _counter[0] += 1
    name = f"{prefix}{os.getpid() % 10000}x{_counter[0]}"
    yield name
    if name in state.names() or core.namespaces_of(name):
        core.down(name)


@pytest.fixture
def lab_name():
    yield from _lab("t")


@pytest.fixture(scope="module")
def module_lab_name():
    yield from _lab("m")


@pytest.fixture(scope="module")
def rx_path():
    """Load the NIC's XDP program (not attached) for BPF_PROG_TEST_RUN tests: call it with the
    RxPath sizes; closed after the module."""
    from metaroce.nic.rx import RxPath
    made = []

    def make(max_qps: int = 16, max_mrs: int = 16):
        made.append(RxPath(max_qps=max_qps, max_mrs=max_mrs))
        return made[-1]
    yield make
    for path in made:
        path.close()


@pytest.fixture(scope="module")
def rx(rx_path):
    """The NIC's XDP program for 16 QPs and 16 MRs, one per test module."""
    return rx_path()
