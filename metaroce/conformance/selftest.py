"""Self-validation: the suite must fail deliberately broken builds of the reference data path,
each on the clause the breakage violates. A mutant is a compile-time switch in
bpf/nic/nic.bpf.c (``#ifdef MUTANT_…``), passed to the daemon's build through
METAROCE_BPF_DEFINES; the default build has none of them."""

from __future__ import annotations

import os
import secrets
import time
from dataclasses import dataclass

from .adapters import ReferenceAdapter
from .runner import run


@dataclass(frozen=True)
class Mutant:
    name: str            # the MUTANT_* define
    mode: str
    expected_clause: str
    only: str            # the tests run against it (those that check the clause)
    what: str


MUTANTS = (
    Mutant("MUTANT_SKIP_ICRC", "roce", "ICRC-1", "hdr.icrc", "the ICRC is not verified"),
    Mutant("MUTANT_NO_DUP_REACK", "roce", "RESP-4", "psn.duplicate",
           "duplicate SEND/WRITE packets are dropped without the re-ACK"),
    Mutant("MUTANT_NAK_EVERY_GAP", "roce", "COMPAT-2", "psn.gap_nak",
           "every packet ahead of ePSN gets a NAK 0x60, not only the first"),
    Mutant("MUTANT_WINDOW_OFF_BY_ONE", "metaroce", "SACK-1", "psn.window_edge",
           "the MetaRoCE window accepts ePSN + W"),
    Mutant("MUTANT_ACK_BEFORE_PLACE", "roce", "SEQ-3", "psn.ack",
           "a WRITE packet with AckReq is acknowledged but its payload is not placed"),
    Mutant("MUTANT_NO_SOURCE_CHECK", "roce", "SEC-3", "hdr.source",
           "packets from any source address are accepted"),
    Mutant("MUTANT_ATOMIC_TWICE", "metaroce", "RESP-4", "atomic.duplicate",
           "a duplicate atomic is executed again"),
    Mutant("MUTANT_NO_ACCESS_CHECK", "metaroce", "SEC-4", "access.flags",
           "memory region access flags are not enforced"),
    Mutant("MUTANT_ERR_NOT_STICKY", "roce", "QP-1", "access.rkey",
           "a QP in ERR keeps processing requests"),
    Mutant("MUTANT_SKIP_CSUM", "metaroce", "INT-3", "int.csum",
           "the IPv4/UDP checksums of a connection that negotiated CSUM are not verified"),
)


def selftest(names=None, progress=None) -> dict:
    """Run each mutant (in one lab, a fresh daemon per mutant); report whether it was caught
    on its expected clause and by which failures."""
    from ..lab import core  # noqa: PLC0415
    chosen = [m for m in MUTANTS if not names or m.name in names]
    lab = f"cs{os.getpid() % 1000}{secrets.token_hex(2)}"
    out = []
    t0 = time.monotonic()
    core.up(lab, "pair")
    try:
        for m in chosen:
            rep = run(ReferenceAdapter(m.mode, lab=lab, defines={m.name: 1}), m.only)
            failed = [r for r in rep.results if r.status == "failed"]
            caught_by = sorted({r.clause for r in failed})
            entry = {"name": m.name, "what": m.what, "mode": m.mode,
                     "expected_clause": m.expected_clause,
                     "caught": m.expected_clause in caught_by, "caught_by": caught_by,
                     "tests": m.only, "failures": [f"{r.id}: {r.clause}: {r.message}"
                                                   for r in failed],
                     "error": rep.error or None}
            out.append(entry)
            if progress:
                progress(entry)
    finally:
        core.down(lab)
    return {"mutants": out, "all_caught": all(e["caught"] for e in out),
            "seconds": round(time.monotonic() - t0, 1)}


def summary_md(doc: dict) -> str:
    lines = ["# Conformance self-test: deliberately broken reference builds", "",
             "Each mutant is a compile-time switch in `bpf/nic/nic.bpf.c`, built into the "
             "daemon's data path through `METAROCE_BPF_DEFINES`; the suite's tests for the "
             "clause the breakage violates are run against it. "
             f"{sum(e['caught'] for e in doc['mutants'])} of {len(doc['mutants'])} caught "
             f"in {doc['seconds']} s.", "",
             "| mutant | mode | breakage | expected clause | caught | caught by |",
             "|---|---|---|---|---|---|"]
    for e in doc["mutants"]:
        lines.append(f"| `{e['name']}` | {e['mode']} | {e['what']} | {e['expected_clause']} | "
                     f"{'yes' if e['caught'] else '**NO**'} | {', '.join(e['caught_by']) or '-'} |")
    lines += ["", "Failures reported:", ""]
    for e in doc["mutants"]:
        for f in e["failures"]:
            lines.append(f"- `{e['name']}`: {f.splitlines()[0]}")
    return "\n".join(lines) + "\n"
