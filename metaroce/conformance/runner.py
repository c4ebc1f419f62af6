"""Run the catalogue against one adapter: open the DUT and the tester's raw socket, run every
selected test, and collect results (passed / failed on a MUST clause / warned: failed on a
SHOULD clause / skipped / error)."""

from __future__ import annotations

import fnmatch
import time
import traceback
from dataclasses import asdict, dataclass, field

from .. import spec
from .adapters import ALL_ACCESS, Adapter
from .catalogue import Case, cases
from .profiles import in_profile
from .tester import Failure, Peer, Skip, Wire, is_nak, syndrome

FATAL_NAKS = (0x61, 0x62, 0x63)     # invalid request, remote access, remote operational error


@dataclass
class Result:
    id: str
    group: str
    clauses: list
    title: str
    status: str                 # passed | failed | warned | skipped | error
    clause: str = ""            # the clause a failure names
    message: str = ""
    seconds: float = 0.0
    origin: str = ""            # where the failing clause comes from (spec 12.5): RoCEv2, ...
    basis: str = ""             # what it rests on there (12.5's table: IBTA chapter, choice)
    spec_text: str = ""         # the failing clause's normative text
    endpoints: list = field(default_factory=list)   # the DUT QPNs the test ran on
    retired: list = field(default_factory=list)     # those it left unusable, with the reason

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class RunReport:
    adapter: str
    mode: str
    results: list = field(default_factory=list)
    seconds: float = 0.0
    error: str = ""             # set when the suite could not run

    @property
    def counts(self) -> dict:
        out = {"passed": 0, "failed": 0, "warned": 0, "skipped": 0, "error": 0}
        for r in self.results:
            out[r.status] += 1
        return out

    @property
    def exit_code(self) -> int:
        if self.error:
            return 2
        c = self.counts
        return 1 if c["failed"] or c["error"] else 0

    def to_dict(self) -> dict:
        return {"adapter": self.adapter, "mode": self.mode, "ok": self.exit_code == 0,
                "exit_code": self.exit_code, "error": self.error or None, "counts": self.counts,
                "seconds": round(self.seconds, 3), "results": [r.to_dict() for r in self.results]}


class Context:
    """What a test sees: the adapter, the tester's wire, and peers of DUT endpoints."""

    def __init__(self, adapter: Adapter, side, wire: Wire):
        self.adapter, self.side, self.wire = adapter, side, wire
        self.metaroce = adapter.mode == "metaroce"
        self._peers: dict[int, Peer] = {}
        self.touched: list[Peer] = []
        self.notes: list[str] = []      # what the DUT chose where a clause allows a choice

    def note(self, text: str) -> None:
        self.notes.append(text)

    def peer(self, *, fresh: bool = False, access: int = ALL_ACCESS,
             tester_psn: int | None = None, csum: bool = False) -> Peer:
        """A DUT endpoint and the tester's side of it; csum: a connection that negotiated the
        option CSUM (INT-1), whose packets carry and are checked by the IPv4/UDP checksums."""
        if csum:
            self.adapter.need("csum", "connect a QP with the option CSUM (its device must be "
                                      "configured to accept it, INT-1)")
            ep = self.adapter.endpoint(fresh=True, access=access, tester_psn=tester_psn,
                                       integrity="csum")
            if getattr(ep, "integrity", "icrc") != "csum":
                raise Skip("the DUT connected without CSUM (INT-1)")
        else:
            ep = self.adapter.endpoint(fresh=fresh, access=access, tester_psn=tester_psn)
        p = self._peers.get(ep.qpn)
        if p is None or p.ep is not ep:
            p = Peer(self.wire, ep, self.side.mac, self.side.ip, self.metaroce,
                     csum=getattr(ep, "integrity", "icrc") == "csum")
            self._peers[ep.qpn] = p
        self.touched.append(p)
        return p


def select(pattern: str | None, mode: str, profile: str | None = None) -> list[Case]:
    """The catalogue's tests for mode (and, given one, in a profile's closure), filtered by
    --only (comma-separated glob patterns that match test IDs or clause IDs)."""
    tags = {c.id: c.profile for c in spec.clauses()}
    chosen = [c for c in cases() if mode in c.modes and
              (profile is None or in_profile(c, mode, profile, tags))]
    if not pattern:
        return chosen
    pats = [p.strip() for p in pattern.split(",") if p.strip()]

    def hit(c: Case) -> bool:
        for p in pats:
            if fnmatch.fnmatchcase(c.id, p) or c.id.startswith(p + ".") or c.group == p:
                return True
            if any(fnmatch.fnmatchcase(cl, p.upper()) for cl in c.clauses):
                return True
        return False
    return [c for c in chosen if hit(c)]


def _origins() -> dict[str, dict]:
    from ..spec.profiles import origins  # noqa: PLC0415
    return origins(spec.spec_dir())[0]


def _name_clause(r: Result, clause, origin: dict) -> None:
    """A failure on a clause: its level decides failed (MUST) or warned (SHOULD); the result
    carries where the clause comes from and its text, so a report says what it rests on."""
    r.status = "failed" if clause is None or clause.level == "MUST" else "warned"
    r.origin, r.basis = origin.get("origin", ""), origin.get("basis", "")
    r.spec_text = " ".join(clause.normative.split()) if clause is not None else ""


def _settle(adapter: Adapter, ctx: Context, status: str, since: int) -> tuple[list, list]:
    """After a test: the endpoints it ran on, and those it left unusable. An endpoint that got
    a fatal NAK (its QP is in ERR) the test did not expect, or that a failed test left out of
    step and that does not answer a resynchronisation, is retired: the adapter never hands it
    out again and the next test takes a fresh one, so no failure is the consequence of an
    earlier test."""
    used, retired = [], []
    for p in ctx.touched:
        if p in used:
            continue
        used.append(p)
        if p.broken:                       # the test drove it to ERR on purpose
            retired.append(f"0x{p.ep.qpn:06x}: driven to ERR by the test")
            continue
        fatal = next((s.pkt for s in ctx.wire.log[since:] if s.pkt is not None
                      and s.pkt.bth.dest_qp == p.ep.tester_qpn and is_nak(s.pkt)
                      and syndrome(s.pkt) in FATAL_NAKS), None)
        why = f"fatal NAK 0x{syndrome(fatal):02x} at PSN {fatal.bth.psn}" if fatal else None
        if why is None and status in ("failed", "warned", "error"):
            try:                           # a shared endpoint may be out of step now
                ok = p.resync()
            except Exception:  # noqa: BLE001
                ok = False
            why = None if ok else "no answer to a resynchronisation"
        if why:
            adapter.consumed(p.ep)
            p.broken = True
            retired.append(f"0x{p.ep.qpn:06x}: {why}")
    return [f"0x{p.ep.qpn:06x}" for p in used], retired


def run(adapter: Adapter, only: str | None = None, progress=None,
        profile: str | None = None) -> RunReport:
    rep = RunReport(adapter.name, adapter.mode)
    t0 = time.monotonic()
    chosen = select(only, adapter.mode, profile)
    clauses, origins = {c.id: c for c in spec.clauses()}, _origins()
    if not chosen:
        rep.error = f"no test matches --only {only!r} in {adapter.mode} mode" + \
            (f" and profile {profile}" if profile else "")
        return rep
    wire = None
    try:
        try:
            side = adapter.open()
            wire = Wire(side.netns, side.iface, adapter.dut_ip)
        except Exception as exc:  # noqa: BLE001 (the suite cannot run: exit 2)
            rep.error = f"{type(exc).__name__}: {exc}" if not str(exc).startswith("reference") \
                else str(exc)
            return rep
        ctx = Context(adapter, side, wire)
        for c in chosen:
            r = Result(c.id, c.group, list(c.clauses), c.title, "passed")
            s = time.monotonic()
            since = len(wire.log)
            try:
                c.fn(ctx)
            except Failure as f:
                r.clause, r.message = f.clause, f.message
                _name_clause(r, clauses.get(f.clause), origins.get(f.clause, {}))
            except Skip as sk:
                r.status, r.message = "skipped", str(sk)
            except Exception as exc:  # noqa: BLE001 (a broken DUT may break the tester's flow)
                r.status = "error"
                r.message = f"{type(exc).__name__}: {exc}"
                r.clause = ""
                tb = traceback.format_exc(limit=3)
                r.message += "\n" + tb
            r.endpoints, r.retired = _settle(adapter, ctx, r.status, since)
            if r.status == "passed" and ctx.notes:
                r.message = "; ".join(ctx.notes)
            ctx.touched, ctx.notes = [], []
            r.seconds = round(time.monotonic() - s, 3)
            rep.results.append(r)
            if progress:
                progress(r)
    finally:
        if wire is not None:
            wire.close()
        try:
            adapter.close()
        except Exception as exc:  # noqa: BLE001
            if not rep.error:
                rep.error = f"closing the DUT: {exc}"
        rep.seconds = time.monotonic() - t0
    return rep
