#!/usr/bin/env bash
# Provision one MetaRoCE host (a Vagrant VM or a bare Debian 12 machine), in steps:
#   setup     the project's idempotent setup (tools/setup.sh: packages, kernel headers, venv)
#   network   write $ETC/provision.toml for this host and run `metaroce provision` on it
#   service   install metaroce@.service and start metaroce@$IFACE (when systemd runs the host)
#   rxe       Soft-RoCE instead: rdma-core + rdma_rxe on $IFACE (a RoCEv2 stack we did not write)
#   perf-server / check
#             start a `metaroce perf` server; run the client against $PEER and the conformance
#             suite (each skipped, with a message, when that command does not exist yet)
# Usage: provision.sh STEP... ; settings come from the environment:
#   IFACE (eth1) ADDRESS (192.168.77.11/24) MTU (3000) MODE (metaroce) PEER (peer's address)
#   NETNS (apply the network step inside this namespace: how the tests run it in a lab)
#   ETC (/etc/metaroce) PREFIX (/: install root for the unit) ROOT (the checkout, /metaroce)
set -euo pipefail

ROOT=${ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
IFACE=${IFACE:-eth1}
ADDRESS=${ADDRESS:-192.168.77.11/24}
MTU=${MTU:-3000}
MODE=${MODE:-metaroce}
ETC=${ETC:-/etc/metaroce}
PREFIX=${PREFIX:-/}
NETNS=${NETNS:-}
PEER=${PEER:-}
METAROCE=${METAROCE:-$ROOT/.venv/bin/metaroce}
say() { printf 'provision[%s]: %s\n' "$step" "$*" >&2; }
has_command() { "$METAROCE" "$@" --help >/dev/null 2>&1; }

step_setup() {
    bash "$ROOT/tools/setup.sh"
}

step_network() {
    mkdir -p "$ETC"
    cat > "$ETC/provision.toml.new" <<TOML
# written by vagrant/provision.sh; metaroce provision --config $ETC/provision.toml applies it
config_dir = "$ETC"

[sysctl]
fib_multipath_hash_policy = 1     # ECMP hashes the UDP source port: MetaRoCE's flow entropy
rp_filter = "loose"               # replies over another path are not dropped

[interfaces.$IFACE]
mtu = $MTU
addresses = ["$ADDRESS"]
rp_filter = "loose"

[interfaces.$IFACE.metaroce]
mode = "$MODE"
dscp = 26
ecn = "ect0"
TOML
    mv "$ETC/provision.toml.new" "$ETC/provision.toml"
    local ns=()
    [ -n "$NETNS" ] && ns=(--netns "$NETNS")
    "$METAROCE" provision --config "$ETC/provision.toml" "${ns[@]}" --dry-run
    "$METAROCE" provision --config "$ETC/provision.toml" "${ns[@]}"
}

step_service() {
    "$METAROCE" install --systemd --prefix "$PREFIX" --config-dir "$ETC" --verify
    if [ "$PREFIX" = / ] && [ -d /run/systemd/system ]; then
        systemctl enable --now "metaroce@$IFACE"
        systemctl is-active "metaroce@$IFACE"
    else
        say "systemd does not manage this host (or PREFIX is not /): unit installed, not started"
    fi
}

step_rxe() {
    export DEBIAN_FRONTEND=noninteractive
    dpkg-query -W -f='${Status}' rdma-core 2>/dev/null | grep -q "install ok installed" \
        || { apt-get update -q && apt-get install -y -q rdma-core ibverbs-utils perftest iproute2; }
    modprobe rdma_rxe
    if ! rdma link show rxe0 >/dev/null 2>&1; then
        rdma link add rxe0 type rxe netdev "$IFACE"
    fi
    rdma link show rxe0
    ibv_devices
}

step_perf_server() {
    if ! has_command perf; then say "skipped: metaroce perf is not available in this version"; return; fi
    if [ -d /run/systemd/system ]; then
        systemctl stop metaroce-perf-server 2>/dev/null || true
        systemctl reset-failed metaroce-perf-server 2>/dev/null || true
        systemd-run --unit metaroce-perf-server "$METAROCE" perf write-bw --dev "$IFACE" -D 5
    else
        nohup "$METAROCE" perf write-bw --dev "$IFACE" -D 5 >/var/log/metaroce-perf-server.log 2>&1 &
    fi
    say "perf server started on $IFACE"
}

step_check() {
    if has_command perf; then
        if [ -n "$PEER" ]; then
            "$METAROCE" perf write-bw "$PEER" --dev "$IFACE" -D 5
        else
            say "skipped: metaroce perf needs PEER (the server's address)"
        fi
    else
        say "skipped: metaroce perf is not available in this version"
    fi
    if has_command conformance run; then
        "$METAROCE" conformance run --dut reference --mode "$MODE" --report /var/log/metaroce-conformance
    else
        say "skipped: metaroce conformance is not available in this version"
    fi
}

[ $# -gt 0 ] || { echo "usage: $0 setup|network|service|rxe|perf-server|check ..." >&2; exit 2; }
for step in "$@"; do
    case $step in
        setup|network|service|rxe|check) "step_$step" ;;
        perf-server) step_perf_server ;;
        *) echo "provision.sh: unknown step $step" >&2; exit 2 ;;
    esac
done
