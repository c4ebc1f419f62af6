"""The registries of docs/spec/11-registries.md, read from their tables and checked against the
reference codec (metaroce.wire): every value the codec uses is an `assigned` row with the same
name, every `assigned` row is used by the codec, and no other row (reserved, unassigned,
experimental, withdrawn, ibta) names a value the codec uses. A registry with a `Space:` line
must cover its whole value space without overlaps.

A registry is a section headed ``### Registry: NAME`` holding one table whose first columns are
``| Value | Name | Status |``. Values are hex or decimal numbers, ranges ``0x18–0x1B``, or
(drop reasons) `codes` in backticks; in a ``Kind: bits`` registry a value is a bit mask and a
range covers every single-bit mask in it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..wire import consts as C
from ..wire.errors import Reason

FILE = "11-registries.md"
STATUSES = ("assigned", "reserved", "unassigned", "experimental", "withdrawn", "ibta")

_HEAD = re.compile(r"^### Registry: (?P<name>[a-z-]+)\s*$")
_SPACE = re.compile(r"^Space: (?P<lo>\S+)–(?P<hi>\S+)\s*$")
_KIND = re.compile(r"^Kind: bits\s*$")
_ROW = re.compile(r"^\| (?P<value>[^|]+?) \| (?P<name>[^|]+?) \| (?P<status>[a-z]+) \|")


def _flags(prefix: str) -> dict:
    return {getattr(C, n): n[len(prefix):] for n in dir(C) if n.startswith(prefix)}


def codec_values() -> dict[str, dict]:
    """Registry name -> {value: name} as the codec uses them."""
    return {
        "opcodes": {int(o): o.name for o in C.Opcode},
        "capabilities": {int(c): c.name for c in C.Cap},
        "cm-types": {int(t): t.name for t in C.CmType},
        "reject-reasons": {int(r): r.name for r in C.CmReject},
        "cmeth-versions": {v: f"CMETH_V{v}" for v in C.CM_VERSIONS},
        "sack-flags": _flags("SACK_F_"),
        "peth-flags": _flags("PETH_F_"),
        "credit-flags": _flags("CREDIT_F_"),
        "drop-reasons": {r.value: r.name for r in Reason},
    }


@dataclass
class Row:
    lo: int | str
    hi: int | str
    name: str
    status: str
    line: int


@dataclass
class Registry:
    name: str
    line: int
    rows: list
    space: tuple | None = None
    bits: bool = False


def _num(text: str) -> int:
    return int(text, 16) if text.lower().startswith("0x") else int(text)


def _value(text: str):
    text = text.strip().strip("`")
    if re.fullmatch(r"[a-z_]+", text):
        return text, text
    lo, _, hi = text.partition("–")
    return _num(lo), _num(hi or lo)


def parse(path: Path, problems: list[str]) -> list[Registry]:
    regs: list[Registry] = []
    cur: Registry | None = None
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        m = _HEAD.match(line)
        if m:
            cur = Registry(m["name"], n, [])
            regs.append(cur)
            continue
        if line.startswith("#"):
            cur = None
            continue
        if cur is None:
            continue
        if _KIND.match(line):
            cur.bits = True
            continue
        m = _SPACE.match(line)
        if m:
            cur.space = (_num(m["lo"]), _num(m["hi"]))
            continue
        m = _ROW.match(line)
        if not m or m["value"].strip() in ("Value", "Code") or set(m["value"]) <= set("-"):
            continue
        where = f"{path.name}:{n}: registry {cur.name}"
        if m["status"] not in STATUSES:
            problems.append(f"{where}: status {m['status']!r} is not one of {', '.join(STATUSES)}")
            continue
        try:
            lo, hi = _value(m["value"])
        except ValueError:
            problems.append(f"{where}: value {m['value'].strip()!r} is not a number, range or code")
            continue
        cur.rows.append(Row(lo, hi, m["name"].strip().strip("`"), m["status"], n))
    return regs


def _members(reg: Registry, row: Row) -> list:
    if isinstance(row.lo, str):
        return [row.lo]
    if reg.bits:
        return [1 << k for k in range(64) if row.lo <= 1 << k <= row.hi]
    return list(range(row.lo, row.hi + 1))


def check(root: Path) -> list[str]:
    """Problems of the registries in root/11-registries.md against the codec."""
    path = root / FILE
    if not path.is_file():
        return [f"{FILE}: missing (the registries)"]
    problems: list[str] = []
    regs = {r.name: r for r in parse(path, problems)}
    codec = codec_values()
    for name in sorted(set(codec) - set(regs)):
        problems.append(f"{FILE}: no registry {name!r} (the codec uses {len(codec[name])} values)")
    for name, reg in regs.items():
        where = f"{FILE}:{reg.line}: registry {name}"
        if name not in codec:
            problems.append(f"{where}: unknown registry (known: {', '.join(sorted(codec))})")
            continue
        used = codec[name]
        seen: dict = {}
        for row in reg.rows:
            here = f"{FILE}:{row.line}: registry {name}"
            members = _members(reg, row)
            if row.status == "assigned" and len(members) != 1:
                problems.append(f"{here}: an assigned row names one value, not a range")
            for v in members:
                if v in seen:
                    problems.append(f"{here}: value {_show(v)} also in line {seen[v]}")
                seen[v] = row.line
                if row.status == "assigned":
                    if v not in used:
                        problems.append(f"{here}: {_show(v)} {row.name} is assigned but the codec "
                                        f"does not use it")
                    elif used[v] != row.name:
                        problems.append(f"{here}: {_show(v)} is {used[v]} in the codec, not "
                                        f"{row.name}")
                elif v in used:
                    problems.append(f"{here}: {_show(v)} is {row.status} but the codec uses it as "
                                    f"{used[v]}")
        for v, vname in used.items():
            if v not in seen:
                problems.append(f"{where}: the codec's {_show(v)} {vname} is not registered")
        if reg.space:
            lo, hi = reg.space
            space = [1 << k for k in range(64) if lo <= 1 << k <= hi] if reg.bits \
                else range(lo, hi + 1)
            missing = [v for v in space if v not in seen]
            if missing:
                problems.append(f"{where}: {len(missing)} values of its space have no row (first "
                                f"{_show(missing[0])})")
    return problems


def _show(v) -> str:
    return f"0x{v:02X}" if isinstance(v, int) else repr(v)
