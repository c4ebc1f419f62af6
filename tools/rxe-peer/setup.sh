#!/usr/bin/env bash
# The rxe peer's host tools (QEMU, debootstrap; Debian packages) and its guest image, built once
# from Debian packages and cached in /var/cache/metaroce/rxe-guest (keyed by package versions).
# Quick when both are in place. Needs `make setup` first (the venv).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
VENV=${VENV:-$ROOT/.venv}
say() { printf 'rxe-setup: %s\n' "$*" >&2; }
if [ "$(id -u)" -ne 0 ]; then
    echo "rxe-setup: needs root (apt, debootstrap, QEMU with a tap): run it with sudo" >&2
    exit 2
fi
# qemu-system-x86: the guest (KVM when it works, TCG otherwise); debootstrap: its userland;
# iproute2: `ip netns exec` starts QEMU inside the lab switch's namespace
PKGS=(qemu-system-x86 debootstrap iproute2)
missing=()
# (outputs are read whole before matching: with pipefail, `cmd | grep -q` fails when grep stops
# reading early and cmd gets SIGPIPE)
for p in "${PKGS[@]}"; do
    st=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    [ "$st" = "install ok installed" ] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    say "installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >&2
    apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
fi
# the image is keyed by the candidate versions apt knows: without package lists there are none
policy=$(apt-cache policy linux-image-amd64 2>/dev/null || true)
if ! grep -q 'Candidate: [0-9]' <<<"$policy"; then
    say "apt has no package lists: apt-get update"
    apt-get update -q >&2
fi
t0=$SECONDS
"$VENV/bin/metaroce" rxe build
say "guest image ready ($((SECONDS - t0)) s)"
