"""Where a lab's record lives (/run/metaroce/labs/<name>.json) and how it is found again."""

from __future__ import annotations

import json
import os

from ..errors import MetaroceError

STATE_DIR = os.environ.get("METAROCE_STATE_DIR", "/run/metaroce/labs")


def state_path(name: str) -> str:
    return os.path.join(STATE_DIR, f"{name}.json")


def save(name: str, record: dict) -> None:
    os.makedirs(STATE_DIR, exist_ok=True)
    tmp = state_path(name) + ".tmp"
    with open(tmp, "w") as f:
        json.dump(record, f, indent=1)
    os.replace(tmp, state_path(name))


def load(name: str) -> dict:
    try:
        with open(state_path(name)) as f:
            return json.load(f)
    except FileNotFoundError:
        raise MetaroceError(f"no lab named {name!r} is up (metaroce lab up --name {name})") from None


def remove(name: str) -> bool:
    try:
        os.unlink(state_path(name))
        return True
    except FileNotFoundError:
        return False


def names() -> list[str]:
    try:
        return sorted(f[:-5] for f in os.listdir(STATE_DIR) if f.endswith(".json"))
    except FileNotFoundError:
        return []


def resolve(name: str | None) -> str:
    """The lab to act on: the one named, or the only one up."""
    if name:
        return name
    up = names()
    if not up:
        raise MetaroceError("no lab is up (start one with: metaroce lab up)")
    if len(up) > 1:
        raise MetaroceError(f"several labs are up ({', '.join(up)}): pass --name")
    return up[0]
