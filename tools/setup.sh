#!/usr/bin/env bash
# Idempotent setup for a Debian 12 host: apt packages, the kernel-headers link BCC needs,
# a virtualenv that can import Debian's bcc, and the project itself.
# Quick when everything is already in place; says what it installs.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${VENV:-$ROOT/.venv}
SYS_PY=${SYS_PY:-/usr/bin/python3}

say() { printf 'setup: %s\n' "$*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
    echo "setup: needs root (apt, kernel headers link, BPF): run it with sudo" >&2
    exit 2
fi

# --- 1. Debian packages ---------------------------------------------------------------
# python3-bpfcc: BCC (compiles and loads the XDP/tc programs); linux-headers-amd64: the
# headers BCC compiles against; python3-venv/python3-dev/gcc: the venv and cffi helpers;
# libbpf1: link/pin/test-run syscalls; tshark: independent RoCEv2 decoder for the codec tests;
# libisal-dev: CRC-32 (the ICRC) at memory speed in the fast path;
# iperf3, sockperf: the TCP baselines (throughput, ping-pong latency); ethtool: queue and offload settings in labs; iputils-ping: for
# users poking at a lab (metaroce lab exec h1 -- ping ...).
APT_PKGS=(python3-bpfcc linux-headers-amd64 python3-venv python3-dev gcc libbpf1 libbpf-dev iputils-ping
          tshark iperf3 ethtool libisal-dev sockperf)
# sudo: the README's commands are written `sudo ...` (and tests run them as written); a root
# shell on a fresh machine may not have it
APT_PKGS+=(sudo)
# systemd: systemd-analyze checks the metaroce@.service unit (metaroce install --systemd --verify)
APT_PKGS+=(systemd)
missing=()
for p in "${APT_PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    say "installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >&2
    apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
fi

# --- 2. kernel headers for BCC ----------------------------------------------------------
# The running kernel may have no headers package; BCC looks in /lib/modules/$(uname -r)/build.
# The uapi headers an XDP program needs are stable, so Debian's newest amd64 headers serve.
KDIR=/lib/modules/$(uname -r)
if [ ! -e "$KDIR/build/include" ]; then
    hdr=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -n1 || true)
    if [ -z "$hdr" ]; then
        echo "setup: no /usr/src/linux-headers-*-amd64 found: install linux-headers-amd64" >&2
        exit 1
    fi
    common=${hdr%-amd64}-common
    say "linking $KDIR/build -> $hdr (and source -> $common) for BCC"
    mkdir -p "$KDIR"
    ln -sfn "$hdr" "$KDIR/build"
    [ -d "$common" ] && ln -sfn "$common" "$KDIR/source"
fi

# bpffs for pinned lab maps
if ! grep -qs ' /sys/fs/bpf bpf ' /proc/mounts; then
    say "mounting bpffs on /sys/fs/bpf"
    mount -t bpf bpf /sys/fs/bpf
fi

# --- 3. virtualenv that sees Debian's bcc (and only bcc) --------------------------------
if [ ! -x "$VENV/bin/python" ]; then
    say "creating virtualenv $VENV (from $SYS_PY)"
    "$SYS_PY" -m venv "$VENV"
fi
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
shim=$VENV/debian-bcc
if [ ! -e "$shim/bcc" ]; then
    say "exposing Debian's bcc module to the venv ($shim)"
    mkdir -p "$shim"
    ln -sfn /usr/lib/python3/dist-packages/bcc "$shim/bcc"
    echo "$shim" > "$site/debian-bcc.pth"
fi

# --- 4. the project ---------------------------------------------------------------------
# Everything the tests use is installed here (the suite fails under CI=true when something is
# missing: tests/_deps.py): the test extra and the torch extra (torch==2.13.0, a CPU build; its
# DDP test and bf16 cross-check). torch is checked by finding it, not importing it: the import
# alone takes 1.5 s, on every make.
stamp=$VENV/.metaroce-installed
want=$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ] \
   || ! "$VENV/bin/python" -c 'import metaroce, click, pyroute2, numpy, pytest, hypothesis, scapy, prometheus_client, yaml
import importlib.util, sys; sys.exit(importlib.util.find_spec("torch") is None)' 2>/dev/null; then
    say "installing the project, its test extra and torch (the torch extra) into the venv (pip)"
    "$VENV/bin/python" -m pip install -q --upgrade pip >&2
    "$VENV/bin/python" -m pip install -q -e "$ROOT[test,torch]" >&2
    echo "$want" > "$stamp"
fi
# the user-space fast path's C helpers (cffi, API mode), rebuilt when their sources change
fp=$ROOT/metaroce/fastpath
# (the verbs queues' layout and the NIC's structs, bpf/nic, are compiled into them too, and so
# are the data path thread, metaroce/datapath, and the transport engine it runs)
if ! ls "$fp"/_xsk.*.so >/dev/null 2>&1 || [ -n "$(find "$fp" "$ROOT/bpf/nic" "$ROOT/metaroce/datapath" "$ROOT/metaroce/cengine" \( -name '*.c' -o -name '*.h' -o -name build.py \) ! -name '_xsk.c' ! -name '_mre.c' -newer "$(ls "$fp"/_xsk.*.so | head -n1)")" ]; then
    say "building the fast-path C helpers (cffi)"
    "$VENV/bin/python" -m metaroce.fastpath.build >&2
fi
# the transport engine in C (cffi, API mode), rebuilt when its sources change
ce=$ROOT/metaroce/cengine
if ! ls "$ce"/_mre.*.so >/dev/null 2>&1 || [ -n "$(find "$ce" \( -name '*.c' -o -name '*.h' -o -name build.py \) ! -name '_mre.c' -newer "$(ls "$ce"/_mre.*.so | head -n1)")" ]; then
    say "building the transport engine (cffi)"
    "$VENV/bin/python" -m metaroce.cengine.build >&2
fi
"$VENV/bin/python" -c 'import bcc' 2>/dev/null || { echo "setup: the venv cannot import bcc (install python3-bpfcc)" >&2; exit 1; }
say "ready ($VENV)"
