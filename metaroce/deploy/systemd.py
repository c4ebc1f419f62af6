"""The `metaroce@.service` template unit: one daemon per interface (`systemctl enable --now
metaroce@eth1`), configured by the file `metaroce provision` writes, ready when its XDP program
is attached (sd_notify), stopped by SIGTERM (the daemon closes its BPF link: XDP detached), and
restarted if it fails."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys

from ..errors import MetaroceError

UNIT_NAME = "metaroce@.service"
UNIT_DIR = "etc/systemd/system"          # under the prefix


def metaroce_executable() -> str:
    """The absolute path of this installation's `metaroce` command."""
    beside = os.path.join(os.path.dirname(os.path.abspath(sys.executable)), "metaroce")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("metaroce")
    if found:
        return os.path.abspath(found)
    raise MetaroceError("cannot find the metaroce command next to this Python or on PATH")


def exec_start(executable: str, config_dir: str) -> str:
    return f"{executable} up --dev %i --foreground --config {config_dir}/%i.toml"


def render_unit(executable: str, config_dir: str = "/etc/metaroce") -> str:
    if " " in executable or " " in config_dir:
        raise MetaroceError("the metaroce path and the config directory must not contain spaces")
    return f"""\
# MetaRoCE software RDMA NIC, one instance per interface: systemctl enable --now metaroce@eth1
# Written by `metaroce install --systemd`; its configuration is {config_dir}/<interface>.toml,
# written by `metaroce provision`. See docs/operations.md.
[Unit]
Description=MetaRoCE software RDMA NIC on %i
{_documentation()}# the interface must exist (and go away with the service); addresses come first
BindsTo=sys-subsystem-net-devices-%i.device
After=sys-subsystem-net-devices-%i.device network-online.target
Wants=network-online.target

[Service]
# READY=1 is sent once the XDP program is attached and the control socket listens
Type=notify
NotifyAccess=main
ExecStart={exec_start(executable, config_dir)}
# SIGTERM: the daemon leaves its loop and closes its BPF link, which detaches the program
KillSignal=SIGTERM
KillMode=mixed
TimeoutStartSec=120
TimeoutStopSec=20
Restart=on-failure
RestartSec=2s
# BPF maps, AF_XDP UMEM and registered memory are locked memory
LimitMEMLOCK=infinity
LimitNOFILE=65536
# applications reach the daemon through its socket in /run/metaroce/nic
UMask=0007

[Install]
WantedBy=multi-user.target
"""


def _documentation() -> str:
    """A Documentation= line pointing at docs/operations.md when this installation has it."""
    doc = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))), "docs", "operations.md")
    return f"Documentation=file://{doc}\n" if os.path.exists(doc) and " " not in doc else ""


def unit_path(prefix: str = "/") -> str:
    return os.path.join(prefix, UNIT_DIR, UNIT_NAME)


def systemd_running() -> bool:
    return os.path.isdir("/run/systemd/system")


def install(prefix: str = "/", config_dir: str = "/etc/metaroce", executable: str | None = None,
            remove: bool = False, dry_run: bool = False) -> dict:
    """Write (or remove) the unit; reload systemd when it manages this host. Idempotent."""
    path = unit_path(prefix)
    try:
        with open(path, encoding="utf-8") as f:
            current = f.read()
    except FileNotFoundError:
        current = None
    if remove:
        action = "unchanged" if current is None else "removed"
        if action == "removed" and not dry_run:
            os.unlink(path)
        content = None
    else:
        content = render_unit(executable or metaroce_executable(), config_dir)
        action = "unchanged" if current == content else ("created" if current is None else "updated")
        if action != "unchanged" and not dry_run:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = path + ".tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(content)
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
    reloaded = False
    if action != "unchanged" and not dry_run and os.path.abspath(prefix) == "/" \
            and systemd_running():
        subprocess.run(["systemctl", "daemon-reload"], check=True)
        reloaded = True
    return {"unit": path, "action": action, "dry_run": dry_run, "daemon_reload": reloaded,
            "exec_start": None if content is None else
            exec_start(executable or metaroce_executable(), config_dir)}


def verify(path: str) -> tuple[bool, str]:
    """`systemd-analyze verify` of a unit file (an instance of a template is verified as
    metaroce@<x>.service next to it)."""
    tool = shutil.which("systemd-analyze")
    if tool is None:
        raise MetaroceError("systemd-analyze is not installed (Debian package systemd)")
    r = subprocess.run([tool, "verify", path], capture_output=True, text=True)
    return r.returncode == 0, (r.stdout + r.stderr).strip()


def sd_notify(state: str) -> bool:
    """Tell systemd (Type=notify) about the service; False when not started by systemd."""
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return False
    if addr.startswith("@"):                 # abstract namespace
        addr = "\0" + addr[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
        s.connect(addr)
        s.sendall(state.encode())
    return True
