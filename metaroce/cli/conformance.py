"""`metaroce conformance run | selftest | clauses`: the packet-level conformance suite."""

import json
import os

import click

from ..errors import MetaroceError
from ..spec.profiles import PROFILES
from ..system import require_root
from .output import emit_json, json_option

PROFILE_KEYS = [p.key for p in PROFILES]


@click.group()
def conformance():
    """Conformance suite: test a RoCEv2 / MetaRoCE endpoint packet by packet."""


@conformance.command(name="run")
@click.option("--dut", "adapter", type=click.Choice(["reference", "rxe", "manual"]), required=True,
              help="reference: our daemon in a lab it creates; rxe: Linux Soft-RoCE in a QEMU "
                   "guest on a lab it creates (compat mode only); manual: endpoints described by "
                   "--description.")
@click.option("--mode", type=click.Choice(["roce", "metaroce"]), default=None,
              help="Connection mode to test (default roce). Not with --profile.")
@click.option("--profile", type=click.Choice(PROFILE_KEYS), default=None,
              help="Test one conformance profile (spec section 12): its tests and those of the "
                   "profiles it builds on, in every mode they need.")
@click.option("--description", "desc", type=click.Path(dir_okay=False),
              help="manual: JSON file with the tester side and the DUT's endpoints.")
@click.option("--only", "only", default=None,
              help="Comma-separated test IDs, groups or clause IDs (globs allowed).")
@click.option("--report", "report_dir", type=click.Path(file_okay=False), default=None,
              help="Write junit.xml, summary.md and coverage.json here.")
@json_option
def run_cmd(adapter, mode, profile, desc, only, report_dir, as_json):
    """Run the suite; exit 0 all passed, 1 some failed, 2 the suite could not run."""
    from ..conformance import report  # noqa: PLC0415
    from ..conformance.profiles import closure, modes_for  # noqa: PLC0415
    if mode and profile:
        raise MetaroceError("give --mode or --profile, not both (a profile chooses its modes)")
    require_root("metaroce conformance run")
    modes = modes_for(profile) if profile else (mode or "roce",)
    reps = [_run_mode(adapter, m, desc, only, profile, as_json) for m in modes]
    table = report.profile_table(reps)
    if profile:                                  # the profile asked for and what it builds on
        table = {k: v for k, v in table.items() if k in closure(profile)}
    if report_dir:
        paths = report.write_runs(reps, report_dir, profile) if profile else \
            report.write(reps[0], report_dir)
    else:
        paths = {}
    results = [r for rep in reps for r in rep.results]
    cov = report.coverage(results, profile)
    code = max(rep.exit_code for rep in reps)
    if profile and code == 0 and not table.get(profile, {}).get("ok", False):
        code = 1
    if as_json:
        doc = reps[0].to_dict() if len(reps) == 1 else \
            {"adapter": adapter, "profile": profile, "ok": code == 0, "exit_code": code,
             "error": next((r.error for r in reps if r.error), None),
             "runs": [r.to_dict() for r in reps]}
        doc.update({"ok": code == 0, "exit_code": code, "reports": paths, "profiles": table,
                    "coverage": {k: cov[k] for k in ("must_total", "covered", "not_testable",
                                                     "missing")}})
        emit_json(doc)
    else:
        for rep in reps:
            c = rep.counts
            if rep.error:
                click.echo(f"error ({rep.mode}): {rep.error}", err=True)
            click.echo(f"{rep.mode}: {c['passed']} passed, {c['failed']} failed, {c['warned']} "
                       f"SHOULD warnings, {c['skipped']} skipped, {c['error']} errors in "
                       f"{rep.seconds:.1f} s")
        for key, p in table.items():
            click.echo(f"profile {key:<9} {'pass' if p['ok'] else 'FAIL'}: {p['passed']} passed, "
                       f"{p['failed']} failed, {p['warned']} warnings; MUST clauses "
                       f"{p['covered']} covered, {p['not_testable']} not testable, "
                       f"{len(p['missing'])} missing of {p['must_total']}")
        click.echo(f"MUST clauses{f' of profile {profile}' if profile else ''}: {cov['covered']} "
                   f"covered, {cov['not_testable']} not testable, {len(cov['missing'])} missing "
                   f"of {cov['must_total']}")
        for k, p in paths.items():
            click.echo(f"wrote {p}")
    return code


def _run_mode(adapter, mode, desc, only, profile, as_json):
    """One mode's run; an adapter that cannot be made is a report with its error."""
    from ..conformance.adapters import (AdapterError, ManualAdapter,  # noqa: PLC0415
                                       ReferenceAdapter, RxeAdapter)
    from ..conformance.runner import RunReport, run  # noqa: PLC0415
    try:
        if adapter == "manual":
            if not desc:
                raise AdapterError("--dut manual needs --description FILE")
            dut = ManualAdapter(mode, desc)
        elif adapter == "rxe":
            dut = RxeAdapter(mode)
        else:
            dut = ReferenceAdapter(mode)
    except AdapterError as exc:
        return RunReport(adapter, mode, error=str(exc))

    def progress(r):
        if not as_json:
            tail = f" {r.clause}: {r.message}" if r.status in ("failed", "warned") else \
                (f" ({r.message.splitlines()[0]})" if r.message else "")
            click.echo(f"{r.status.upper():7} {mode:<8} {r.id:<28} [{' '.join(r.clauses)}]{tail}")
    return run(dut, only, progress, profile)


@conformance.command()
@click.option("--mutant", "names", multiple=True, help="Run only these MUTANT_* switches.")
@click.option("--report", "report_dir", type=click.Path(file_okay=False), default=None,
              help="Write selftest.json and selftest.md here (docs/conformance keeps one).")
@json_option
def selftest(names, report_dir, as_json):
    """Build deliberately broken reference data paths; each must fail on its clause."""
    from ..conformance import selftest as st  # noqa: PLC0415
    require_root("metaroce conformance selftest")
    unknown = set(names) - {m.name for m in st.MUTANTS}
    if unknown:
        raise MetaroceError(f"unknown mutant(s): {', '.join(sorted(unknown))}")

    def progress(e):
        if not as_json:
            click.echo(f"{'caught' if e['caught'] else 'MISSED':7} {e['name']:<26} expected "
                       f"{e['expected_clause']}, failed on {', '.join(e['caught_by']) or '-'}")
    doc = st.selftest(list(names), progress)
    if report_dir:
        os.makedirs(report_dir, exist_ok=True)
        with open(os.path.join(report_dir, "selftest.json"), "w") as f:
            json.dump(doc, f, indent=1)
        with open(os.path.join(report_dir, "selftest.md"), "w") as f:
            f.write(st.summary_md(doc))
    if as_json:
        emit_json(doc)
    else:
        click.echo(f"{sum(e['caught'] for e in doc['mutants'])} of {len(doc['mutants'])} "
                   f"mutants caught in {doc['seconds']} s")
    return 0 if doc["all_caught"] else 1


@conformance.command(name="list")
@click.option("--mode", type=click.Choice(["roce", "metaroce"]), default=None)
@json_option
def list_cmd(mode, as_json):
    """The catalogue: test IDs, the clauses each checks, modes, the profile checked per mode."""
    from ..conformance.catalogue import cases  # noqa: PLC0415
    from ..conformance.profiles import case_profile  # noqa: PLC0415
    rows = [{"id": c.id, "group": c.group, "clauses": list(c.clauses), "modes": list(c.modes),
             "profiles": {m: case_profile(c, m) for m in c.modes}, "title": c.title}
            for c in cases() if mode is None or mode in c.modes]
    if as_json:
        emit_json({"tests": rows})
        return
    for r in rows:
        click.echo(f"{r['id']:<28} {'/'.join(r['modes']):<14} {' '.join(r['clauses'])}")
