"""`metaroce conformance run | selftest | clauses`: the packet-level conformance suite."""

import json
import os

import click

from ..errors import MetaroceError
from ..system import require_root
from .output import emit_json, json_option


@click.group()
def conformance():
    """Conformance suite: test a RoCEv2 / MetaRoCE endpoint packet by packet."""


@conformance.command(name="run")
@click.option("--dut", "adapter", type=click.Choice(["reference", "manual"]), required=True,
              help="reference: our daemon in a lab it creates; manual: endpoints described by "
                   "--description.")
@click.option("--mode", type=click.Choice(["roce", "metaroce"]), default="roce",
              show_default=True, help="Connection mode to test.")
@click.option("--description", "desc", type=click.Path(dir_okay=False),
              help="manual: JSON file with the tester side and the DUT's endpoints.")
@click.option("--only", "only", default=None,
              help="Comma-separated test IDs, groups or clause IDs (globs allowed).")
@click.option("--report", "report_dir", type=click.Path(file_okay=False), default=None,
              help="Write junit.xml, summary.md and coverage.json here.")
@json_option
def run_cmd(adapter, mode, desc, only, report_dir, as_json):
    """Run the suite; exit 0 all passed, 1 some failed, 2 the suite could not run."""
    from ..conformance import report  # noqa: PLC0415
    from ..conformance.adapters import AdapterError, ManualAdapter, ReferenceAdapter  # noqa: PLC0415
    from ..conformance.runner import RunReport, run  # noqa: PLC0415
    require_root("metaroce conformance run")
    try:
        if adapter == "manual":
            if not desc:
                raise AdapterError("--dut manual needs --description FILE")
            dut = ManualAdapter(mode, desc)
        else:
            dut = ReferenceAdapter(mode)
    except AdapterError as exc:
        rep = RunReport(adapter, mode, error=str(exc))
    else:
        def progress(r):
            if not as_json:
                tail = f" {r.clause}: {r.message}" if r.status == "failed" else \
                    (f" ({r.message.splitlines()[0]})" if r.message else "")
                click.echo(f"{r.status.upper():7} {r.id:<28} [{' '.join(r.clauses)}]{tail}")
        rep = run(dut, only, progress)
    paths = report.write(rep, report_dir) if report_dir else {}
    cov = report.coverage(rep.results)
    if as_json:
        emit_json({**rep.to_dict(), "reports": paths,
                   "coverage": {k: cov[k] for k in ("must_total", "covered", "not_testable",
                                                    "missing")}})
    else:
        c = rep.counts
        if rep.error:
            click.echo(f"error: {rep.error}", err=True)
        click.echo(f"{c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped, "
                   f"{c['error']} errors in {rep.seconds:.1f} s; MUST clauses: {cov['covered']} "
                   f"covered, {cov['not_testable']} not testable, {len(cov['missing'])} missing "
                   f"of {cov['must_total']}")
        for k, p in paths.items():
            click.echo(f"wrote {p}")
    return rep.exit_code


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
    """The catalogue: test IDs, the clauses each checks, modes."""
    from ..conformance.catalogue import cases  # noqa: PLC0415
    rows = [{"id": c.id, "group": c.group, "clauses": list(c.clauses), "modes": list(c.modes),
             "title": c.title} for c in cases() if mode is None or mode in c.modes]
    if as_json:
        emit_json({"tests": rows})
        return
    for r in rows:
        click.echo(f"{r['id']:<28} {'/'.join(r['modes']):<14} {' '.join(r['clauses'])}")
