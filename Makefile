# MetaRoCE — the two commands are `sudo make demo` and `sudo make test`.
VENV   ?= $(CURDIR)/.venv
PY     := $(VENV)/bin/python
PYTEST := $(VENV)/bin/pytest

.PHONY: setup demo test test-unit test-integration bench clean fuzz fuzz-wire fuzz-jumbo fuzz-wire-jumbo soak rxe-setup test-rxe

setup:
	@bash tools/setup.sh

demo: setup
	$(VENV)/bin/metaroce demo

test: setup
	$(PYTEST) -q tests

test-unit: setup
	$(PYTEST) -q tests/unit

test-integration: setup
	$(PYTEST) -q tests/integration

# the rxe peer (Linux Soft-RoCE in a QEMU guest): host tools and the guest image (built once from
# Debian packages, cached in /var/cache/metaroce/rxe-guest), then the interop tests and the
# conformance suite against it (tests/rxe; make test does not collect them)
rxe-setup: setup
	@bash tools/rxe-peer/setup.sh

test-rxe: rxe-setup
	$(PYTEST) -q tests/rxe

fuzz: setup
	$(VENV)/bin/metaroce fuzz --packets 1000000

# 100,000 frames on the wire against a running daemon in a pair lab (a few minutes)
fuzz-wire: setup
	$(VENV)/bin/metaroce fuzz --wire --packets 100000

# the same two at MTU 9000 (PMTU 4096): frames up to 9014 bytes, multi-buffer xdp_buffs
fuzz-jumbo: setup
	$(VENV)/bin/metaroce fuzz --mtu 9000 --packets 1000000

fuzz-wire-jumbo: setup
	$(VENV)/bin/metaroce fuzz --wire --mtu 9000 --packets 100000

soak: setup
	$(PY) -m metaroce.soak --minutes 8

# the quick benchmark set (each script also has --full); results and plots in tools/bench/results
bench: setup
	$(VENV)/bin/pip install -q -e '.[bench,torch]'
	$(PY) tools/bench/vs_tcp.py --quick
	$(PY) tools/bench/vs_tcp.py --quick --steer
	$(PY) tools/bench/vs_tcp.py --quick --rx-cpus all
	$(PY) tools/bench/vs_tcp.py --quick --mtu 9000
	$(PY) tools/bench/vs_tcp.py --quick --mtu 9000 --steer
	$(PY) tools/bench/loss_sweep.py --quick
	$(PY) tools/bench/qp_scale.py --quick --sizes 1,16,128,1024
	$(PY) tools/bench/post_syscalls.py
	$(PY) tools/bench/post_to_wire.py
	$(PY) tools/bench/verbs_steps.py
	$(PY) tools/bench/busy_poll.py
	$(PY) tools/bench/daemon_rtt.py
	$(PY) tools/bench/nic_rx_cost.py
	$(PY) tools/bench/bpf_build.py
	$(PY) tools/bench/incast.py --quick
	$(PY) tools/bench/multipath.py --quick
	$(PY) tools/bench/sim_scale.py --quick --jobs 2
	$(PY) tools/bench/engine_cost.py --quick
	$(PY) tools/bench/allreduce.py --hosts 3 --quick
	$(PY) tools/bench/allreduce.py --hosts 3 --quick --mtu 9000
	$(PY) tools/bench/report.py

clean:
	-$(VENV)/bin/metaroce lab down --all 2>/dev/null
	rm -rf $(VENV) .pytest_cache .hypothesis
