"""The README's commands, run exactly as written (issue 18): every `sh` block after the first
(the first is `make demo` / `make test` themselves) runs in order with bash -e from the
repository's root, and must succeed. The blocks use the lab name t1 and `sudo`, which
tools/setup.sh installs. Afterwards nothing of the lab is left: no namespace, no process in
one, no daemon file."""

import os
import re
import subprocess

import pytest

from metaroce.lab import core, procs
from metaroce.nic.devid import RUN_DIR

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def readme_blocks() -> list[str]:
    with open(os.path.join(ROOT, "README.md")) as f:
        return re.findall(r"```sh\n(.*?)```", f.read(), re.S)


def test_the_first_block_is_the_two_commands():
    first = [l.split("#")[0].strip() for l in readme_blocks()[0].splitlines()]
    assert first == ["sudo make demo", "sudo make test"]


@pytest.mark.parametrize("index", range(1, len(readme_blocks())))
def test_readme_block_runs_as_written(index):
    block = readme_blocks()[index]
    assert "t1" in block
    if core.namespaces_of("t1"):
        pytest.fail("a lab named t1 exists already: the README's commands need that name "
                    "(sudo .venv/bin/metaroce lab down --name t1)")
    inodes_seen: set[int] = set()
    try:
        p = subprocess.run(["bash", "-e", "-x", "-c", block], cwd=ROOT, capture_output=True,
                           text=True, timeout=300)
        assert p.returncode == 0, f"README block {index} failed:\n{p.stderr[-4000:]}"
        if "perf write-bw 10.0.0.2" in block:       # the client's perftest table
            assert re.search(r"^\s*1048576\s+\d+\s+[\d.]+\s+[\d.]+", p.stdout, re.M), p.stdout
        if "status --dev eth0 --netns mr-t1-h1" in block:
            assert "eth0: mode metaroce" in p.stdout, p.stdout
    finally:
        inodes_seen |= procs.namespace_inodes(core.namespaces_of("t1"))
        if core.namespaces_of("t1"):
            core.down("t1")
    assert not core.namespaces_of("t1")
    assert not procs.pids_in(inodes_seen)
    left = [f for f in os.listdir(RUN_DIR) if any(f"net{i}--" in f for i in inodes_seen)
            and not f.endswith(".log")] if os.path.isdir(RUN_DIR) else []
    assert not left, left
