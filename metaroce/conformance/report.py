"""Reports of a run: JUnit XML, a Markdown summary, results per conformance profile, and clause
coverage (every MUST clause of the spec is covered by at least one test of the catalogue, or
listed here as not testable on the wire with the reason), overall and per profile."""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET

from .. import spec
from .catalogue import GROUPS, cases
from .profiles import KEYS, closure, summarize

_CODEC = ("a property of the codec and of packets as built, checked by the unit tests of "
          "metaroce.wire (Test: wire); the DUT's side of it is covered by the frame audit")
_INSPECT = "an implementation property checked by review or API (Test: inspect), not on the wire"
_CM = ("connection management runs over a side channel (TCP) or MR_CM packets the adapters do "
       "not drive; tests/integration/test_cm.py checks our implementation")
_CC = ("needs a sustained, shaped or impaired flow between two full endpoints (Test: impair); "
       "the tester sends crafted packets one exchange at a time")

NOT_TESTABLE = {
    "WIRE-12": _CODEC + " (CMETH GIDs only exist in connection management)",
    "ICRC-3": _CODEC + " (an implementation shortcut with an identical result)",
    "ICRC-4": _INSPECT,
    "EXT-7": _CODEC + " (CMETH, connection management)",
    "HDR-8": "ACK credit codes are a SHOULD for compat responders; the MUST (0x1F with an SRQ) "
             "needs an SRQ, which the adapters do not create",
    "QP-2": _INSPECT, "QP-3": _INSPECT, "PSN-4": _INSPECT, "MP-4": _INSPECT, "CM-8": _INSPECT,
    "SEC-1": _INSPECT + " (statistics over 10 000 registrations)",
    "SEC-2": _INSPECT + " (statistics over many connections)",
    "PSN-2": "needs 2^23 outstanding PSNs from the DUT's requester (a stalled responder for "
             "millions of packets)",
    "RESP-8": "timer accuracy of the DUT's requester: the tester would have to stay silent for "
              "the local ACK timeout and time retransmissions (seconds per case, timing-sensitive "
              "on shared CPUs)",
    "RESP-9": "exhausting retry_cnt needs (1 + retry_cnt) local ACK timeouts of the DUT's "
              "requester (Test: peer, timing)",
    "RESP-11": "max_dest_rd_atomic is not part of the QP description, so the tester cannot know "
               "which READ must be refused",
    "SACK-5": _CC, "SACK-8": _CC + " (dropping one of many READ responses in flight)",
    "PLACE-4": "READ response placement happens at the DUT's requester with the tester as "
               "responder; it needs the DUT's local buffer, which only the reference exposes, "
               "and is checked by tests/integration/test_verbs_metaroce.py",
    "MP-1": "needs the MULTIPATH capability, negotiated through connection management",
    "MP-5": _CC, "CC-1": _CC, "CC-2": _CC + " (RTT samples from ts_echo)", "CC-3": _CC,
    "CC-4": _CC, "CC-5": "the advertised window comes from CMETH (connection management)",
    "CC-8": _CC + " (8-to-1 incast)", "CC-9": _CC,
    "RTO-1": _CC + " (adaptive RTO of the DUT's requester)", "RTO-2": _CC,
    "CM-1": _CM, "CM-2": _CM, "CM-3": _CM, "CM-4": _CM, "CM-5": _CM, "CM-6": _CM, "CM-9": _CM,
    "CM-10": _CM, "SEC-9": _CM, "CM-11": _CM, "CM-12": _CM, "CM-13": _CM,
    "CM-14": _CM,
    "REG-4": _CM + " (capability bits)", "REG-5": _CM + " (CM registries)", "VER-2": _CM,
    "VER-4": _CM + " (the CMETH magic)", "VER-5": _CM + " (the CM's TCP port)",
    "SACK-12": _CC + " (READ responses reordered and lost across the responder's paths)",
    "CC-10": _CC + " (credit statements during an incast)", "CC-11": _CC + " (SACK hold times)",
    "CC-13": "needs the CNP_EXT capability, negotiated through connection management",
    "INT-5": _INSPECT + " (the device's counters: metaroce stats)",
    "SM-6": _CC + " (a receiver's credit states during an incast)",
    "RTO-4": "timer behaviour of the DUT's requester over seconds of silence (timeout 0)",
    "PLACE-7": "needs an SRQ, which the adapters do not create",
    "REG-8": _CODEC + " (the drop reasons a device reports are inspected, not seen on the wire)",
    "PAR-1": _INSPECT + " (the parameter table)", "PAR-2": _INSPECT + " (the parameter table)",
    "PAR-3": _INSPECT + " (the parameter table)", "PAR-4": _INSPECT + " (normative references)",
    "REG-2": _INSPECT + " (allocation policy)", "VER-6": _INSPECT + " (how later revisions "
    "extend the protocol)", "PROF-1": _INSPECT + " (conformance claims)",
    "PROF-2": _CM + " (offered and accepted capability bits)",
    "PROF-3": _INSPECT + " (the deviations table)", "PROF-4": _INSPECT + " (report contents)",
}


def coverage(results=None, profile: str | None = None) -> dict:
    """Per MUST clause (of one profile and those it builds on, or of the whole spec): the tests
    citing it (with this run's statuses) or the reason it is not testable on the wire.
    `missing` lists clauses with neither (must be empty)."""
    runs = {r.id: r for r in results or []}
    by_clause: dict[str, list] = {}
    for c in cases():
        for cl in c.clauses:
            by_clause.setdefault(cl, []).append(c.id)
    out, missing = {}, []
    tags = {spec.PROFILES_BY_KEY[k].tag for k in closure(profile)} if profile else None
    musts = [c for c in spec.clauses() if c.level == "MUST" and (tags is None or c.profile in tags)]
    for c in musts:
        tests = by_clause.get(c.id, [])
        if tests:
            out[c.id] = {"title": c.title, "tests": tests,
                         "results": {t: runs[t].status for t in tests if t in runs}}
        elif c.id in NOT_TESTABLE:
            out[c.id] = {"title": c.title, "not_testable": NOT_TESTABLE[c.id]}
        else:
            out[c.id] = {"title": c.title}
            missing.append(c.id)
    covered = sum(1 for v in out.values() if "tests" in v)
    return {"must_total": len(musts), "covered": covered,
            "not_testable": sum(1 for v in out.values() if "not_testable" in v),
            "missing": missing, "clauses": out}


def junit_xml(rep) -> str:
    suite = ET.Element("testsuite", name=f"metaroce-conformance-{rep.adapter}-{rep.mode}",
                       tests=str(len(rep.results)), failures=str(rep.counts["failed"]),
                       errors=str(rep.counts["error"]), skipped=str(rep.counts["skipped"]),
                       time=f"{rep.seconds:.3f}")
    for r in rep.results:
        tc = ET.SubElement(suite, "testcase", classname=f"conformance.{rep.mode}.{r.group}",
                           name=r.id, time=f"{r.seconds:.3f}")
        ET.SubElement(tc, "properties").extend(
            [ET.Element("property", name="clauses", value=" ".join(r.clauses)),
             ET.Element("property", name="endpoints", value=" ".join(r.endpoints))])
        if r.status == "failed":
            ET.SubElement(tc, "failure", message=f"{r.clause}: {r.message}"[:500],
                          type=r.clause).text = f"{r.message}\n{r.clause}: {r.spec_text}"
        elif r.status == "error":
            ET.SubElement(tc, "error", message=r.message.split("\n")[0][:500]).text = r.message
        elif r.status == "skipped":
            ET.SubElement(tc, "skipped", message=r.message)
        elif r.status == "warned":              # a SHOULD clause not met: reported, not failed
            ET.SubElement(tc, "system-err").text = \
                f"SHOULD not met, {r.clause}: {r.message}\n{r.clause}: {r.spec_text}"
    if rep.error:
        tc = ET.SubElement(suite, "testcase", classname="conformance", name="setup")
        ET.SubElement(tc, "error", message=rep.error)
    return ET.tostring(suite, encoding="unicode", xml_declaration=True)


def summary_md(rep, cov: dict, title: str = "MetaRoCE conformance run") -> str:
    c = rep.counts
    lines = [f"# {title}", "",
             f"DUT adapter `{rep.adapter}`, mode `{rep.mode}`: **{c['passed']} passed, "
             f"{c['failed']} failed, {c['warned']} SHOULD warnings, {c['skipped']} skipped, "
             f"{c['error']} errors** in {rep.seconds:.1f} s (exit status {rep.exit_code}).", ""]
    if rep.error:
        lines += [f"The suite could not run: {rep.error}", ""]
    by_group: dict[str, list] = {}
    for r in rep.results:
        by_group.setdefault(r.group, []).append(r)
    for g, rs in by_group.items():
        lines += [f"## {GROUPS.get(g, g)}", "", "| test | clauses | endpoint | result |",
                  "|---|---|---|---|"]
        for r in rs:
            where = f" ({r.origin})" if r.origin else ""
            res = r.status if r.status not in ("failed", "warned") else \
                f"**FAILED** {r.clause}{where}: {r.message}" if r.status == "failed" else \
                f"warning (SHOULD) {r.clause}{where}: {r.message}"
            if r.status in ("skipped", "error") or (r.status == "passed" and r.message):
                res += f": {r.message.splitlines()[0] if r.message else ''}"
            if r.retired:
                res += f" (retired {'; '.join(r.retired)})"
            lines.append(f"| `{r.id}` | {' '.join(r.clauses)} | {' '.join(r.endpoints) or '-'} | "
                         f"{res.replace('|', '/')} |")
        lines.append("")
    lines += rests_on_md(rep.results)
    lines += ["## Clause coverage", "",
              f"{cov['must_total']} MUST clauses: {cov['covered']} covered by tests, "
              f"{cov['not_testable']} not testable on the wire"
              + (f", **{len(cov['missing'])} missing: {', '.join(cov['missing'])}**"
                 if cov["missing"] else "") + ".", "",
              "| clause | not testable on the wire because |", "|---|---|"]
    for cid, v in cov["clauses"].items():
        if "not_testable" in v:
            lines.append(f"| {cid} | {v['not_testable']} |")
    return "\n".join(lines) + "\n"


def rests_on_md(results) -> list[str]:
    """Each failure and warning with the clause it names: its level, where it comes from and on
    what (spec 12.5), and its text."""
    named = [r for r in results if r.status in ("failed", "warned")]
    if not named:
        return []
    lines = ["## What the failures and warnings rest on", ""]
    for r in named:
        what = "fails" if r.status == "failed" else "warns (SHOULD)"
        src = f" — {r.origin}" + (f": {r.basis}" if r.basis else "") if r.origin else ""
        lines += [f"- `{r.id}` {what} on **{r.clause}**{src}.",
                  f"  > {r.spec_text or '(the clause is not in this specification)'}", ""]
    return lines


def write(rep, directory: str) -> dict:
    os.makedirs(directory, exist_ok=True)
    cov = coverage(rep.results)
    paths = {k: os.path.join(directory, k) for k in ("junit.xml", "summary.md", "coverage.json")}
    with open(paths["junit.xml"], "w") as f:
        f.write(junit_xml(rep))
    with open(paths["summary.md"], "w") as f:
        table = profile_table([rep])
        f.write(summary_md(rep, cov) + ("\n" + profiles_md(table) if table else ""))
    with open(paths["coverage.json"], "w") as f:
        json.dump({"adapter": rep.adapter, "mode": rep.mode, **cov}, f, indent=1)
    return paths


def profile_table(reports) -> dict[str, dict]:
    """Per profile that the runs cover: its results (profiles.summarize) and its MUST clauses'
    coverage (counts, and the clauses no test and no reason covers)."""
    out = {}
    results = [r for rep in reports for r in rep.results]
    for key, res in summarize(reports).items():
        cov = coverage(results, key)
        out[key] = {**res, "must_total": cov["must_total"], "covered": cov["covered"],
                    "not_testable": cov["not_testable"], "missing": cov["missing"]}
    return out


def profiles_md(table: dict) -> str:
    lines = ["## Results per conformance profile", "",
             "| profile | result | passed | failed | SHOULD warnings | skipped | errors | MUST "
             "clauses: covered / not testable on the wire |", "|---|---|---|---|---|---|---|---|"]
    for key in KEYS:
        if key in table:
            p = table[key]
            lines.append(f"| {p['title']} (`{key}`) | {'**pass**' if p['ok'] else '**FAIL**'} | "
                         f"{p['passed']} | {p['failed']} | {p['warned']} | {p['skipped']} | "
                         f"{p['error']} | {p['covered']} / {p['not_testable']} of "
                         f"{p['must_total']} |")
    return "\n".join(lines) + "\n"


def write_runs(reports, directory: str, profile: str | None = None) -> dict:
    """A profile's run (one report per mode): junit.xml with one suite per mode, summary.md with
    the results per profile and each mode's tables, coverage.json per profile."""
    os.makedirs(directory, exist_ok=True)
    table = profile_table(reports)
    paths = {k: os.path.join(directory, k) for k in ("junit.xml", "summary.md", "coverage.json")}
    suites = ET.Element("testsuites", name="metaroce-conformance")
    for rep in reports:
        suites.append(ET.fromstring(junit_xml(rep).split("?>", 1)[-1]))
    with open(paths["junit.xml"], "w") as f:
        f.write(ET.tostring(suites, encoding="unicode", xml_declaration=True))
    title = "MetaRoCE conformance run" + (f": profile {profile}" if profile else "")
    with open(paths["summary.md"], "w") as f:
        f.write(f"# {title}\n\n" + profiles_md(table) + "\n")
        for rep in reports:
            f.write(summary_md(rep, coverage(rep.results, profile),
                               title=f"Mode {rep.mode}").replace("# Mode", "## Mode", 1))
    with open(paths["coverage.json"], "w") as f:
        json.dump({"profile": profile, "profiles": {k: {**v, "clauses": coverage(
            [r for rep in reports for r in rep.results], k)["clauses"]} for k, v in table.items()}},
                  f, indent=1)
    return paths
