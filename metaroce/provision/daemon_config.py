"""The daemon's configuration file (`/etc/metaroce/<dev>.toml`): written by `metaroce provision`,
read by `metaroce up --config` (the systemd unit passes it)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import MetaroceError
from .config import (DATAPATH_DSCP, DATAPATH_ECN, ECN_CHOICES, MODES, ConfigError, DaemonSettings,
                     _V, parse_text)


@dataclass(frozen=True)
class DaemonConfig:
    dev: str
    mode: str = "roce"
    dscp: int = DATAPATH_DSCP
    ecn: str = DATAPATH_ECN

    def unsupported_marking(self) -> str | None:
        """What the data path cannot honour yet: it marks DSCP 26 / ECT(0) on every packet."""
        if (self.dscp, self.ecn) == (DATAPATH_DSCP, DATAPATH_ECN):
            return None
        return (f"dscp {self.dscp} / ecn {self.ecn} requested, but the data path marks "
                f"DSCP {DATAPATH_DSCP} / {DATAPATH_ECN.upper()} (fixed in this version)")


def path_for(config_dir: str, dev: str) -> str:
    return os.path.join(config_dir, f"{dev}.toml")


def render(dev: str, settings: DaemonSettings, source: str) -> str:
    return (f"# MetaRoCE daemon configuration for {dev}, written by `metaroce provision` from\n"
            f"# {source}: edit that file and provision again rather than this one.\n"
            f'dev = "{dev}"\n'
            f'mode = "{settings.mode}"\n'
            f"dscp = {settings.dscp}\n"
            f'ecn = "{settings.ecn}"\n')


def load(path: str) -> DaemonConfig:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise MetaroceError(f"cannot read the daemon config {path}: {exc.strerror} "
                            "(write it with metaroce provision)") from None
    doc, loc = parse_text(text, path)
    v = _V(path, loc)
    v.keys(doc, (), ("dev", "mode", "dscp", "ecn"))
    dev = doc.get("dev")
    if not isinstance(dev, str) or not dev:
        v.err(("dev",), "the interface name (dev = \"eth1\") is required")
    mode = v.choice(doc.get("mode", "roce"), ("mode",), MODES)
    dscp = v.int_(doc.get("dscp", DATAPATH_DSCP), ("dscp",), 0, 63)
    ecn = v.choice(doc.get("ecn", DATAPATH_ECN), ("ecn",), ECN_CHOICES)
    if v.errors:
        raise ConfigError(v.errors)
    return DaemonConfig(dev=dev, mode=mode, dscp=dscp, ecn=ecn)


def load_for(path: str, dev: str, mode: str | None, warn) -> str:
    """`metaroce up --config`: check the file is for dev and return the mode to run (an explicit
    --mode wins); what the data path cannot apply is said through warn."""
    cfg = load(path)
    if cfg.dev != dev:
        raise MetaroceError(f"{path} configures {cfg.dev}, not {dev}")
    why = cfg.unsupported_marking()
    if why:
        warn(f"metaroce: warning: {path}: {why}")
    return mode or cfg.mode
