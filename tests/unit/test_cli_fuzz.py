"""CLI parser fuzz (issue 9, part 1): random argument vectors for every `metaroce` command.

Invariants (the CLI contract, README "CLI"):
  * parsing any argv either succeeds or raises click's own usage errors — never another
    exception (every leaf command, through click's parser only, so nothing runs);
  * running a command that has no side effects outside its output (sim, spec, pcap decode,
    and the daemon/lab queries aimed at a device or lab that does not exist) with hostile
    option values ends in a success or ONE clear error line and a non-zero exit; with --json
    stdout is exactly one JSON document ({"error": ...} on failure). METAROCE_DEBUG=1 makes an
    unexpected exception escape main(), so the catch-all "a bug" path fails the test.
"""

import contextlib
import io
import json
import math
import os

import click
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metaroce.cli import SUBCOMMANDS, cli, main
from metaroce.cli.params import FiniteFloat, QpnType

NON_FINITE = ["nan", "NaN", "-nan", "inf", "-inf", "+inf", "Infinity", "-Infinity", "1e400",
              "-1e400"]
HOSTILE_NUMBERS = ["0", "-1", "-0", "1e308", "-1e308", "inf", "-inf", "nan", "NaN", "1e-320",
                   str(2 ** 63), str(-(2 ** 63) - 1), str(2 ** 200), "0x10", "1_000", " 7", "",
                   "3.5", "٣", "１"]
HOSTILE_TEXT = ["", " ", "-", "--", "---", "\x00", "é", "🦀", "a" * 5000, "../../etc",
                "/dev/null", "-h", "=", "--=", "%s%n", "\n", "NaN"]


def leaf_commands():
    out = []

    def walk(cmd, path):
        if isinstance(cmd, click.Group):
            for n in cmd.list_commands(None):
                walk(cmd.get_command(None, n), path + [n])
        else:
            out.append((tuple(path), cmd))
    for name in sorted(SUBCOMMANDS):
        walk(cli.get_command(None, name), [name])
    return out


LEAVES = leaf_commands()


def _tokens(cmd):
    names = [o for p in cmd.params if isinstance(p, click.Option) for o in p.opts]
    choices = [c for p in cmd.params if isinstance(getattr(p, "type", None), click.Choice)
               for c in p.type.choices]
    return st.lists(st.one_of(st.sampled_from(names or ["--x"]),
                              st.sampled_from(HOSTILE_NUMBERS + HOSTILE_TEXT),
                              st.sampled_from(choices or ["x"]),
                              st.text(max_size=12),
                              st.integers(-2 ** 70, 2 ** 70).map(str)), max_size=8)


@pytest.mark.parametrize("path,cmd", LEAVES, ids=[" ".join(p) for p, _ in LEAVES])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_parser_raises_only_usage_errors(path, cmd, data):
    argv = [a for a in data.draw(_tokens(cmd)) if "\x00" not in a]   # main() refuses NUL
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            cmd.make_context(" ".join(path), list(argv))
    except (click.ClickException, click.exceptions.Exit):
        pass


NUMERIC_PARAMS = [(path, p) for path, cmd in LEAVES for p in cmd.params
                  if isinstance(p.type, (click.types.FloatParamType, click.types.IntParamType,
                                         QpnType))]


def test_there_are_numeric_options():
    names = {" ".join(path) + " " + p.name for path, p in NUMERIC_PARAMS}
    assert {"up credit_rtt_us", "perf duration", "lab impair loss", "sim loss loss",
            "stats qpn", "qp connect qpn", "fuzz time_limit"} <= names, names


@pytest.mark.parametrize("path,param", NUMERIC_PARAMS,
                         ids=[" ".join(p) + " " + q.name for p, q in NUMERIC_PARAMS])
def test_every_numeric_option_refuses_non_finite_values(path, param):
    """NaN passes every range check (each comparison is False), so a plain FloatRange lets it
    through and a command runs with it: every number a command takes is refused by the parser
    when it is NaN or infinite, and every float option uses the finite type."""
    ctx = click.Context(click.Command(path[-1]))
    for value in NON_FINITE:
        with pytest.raises(click.BadParameter):
            param.type.convert(value, param, ctx)
    if isinstance(param.type, click.types.FloatParamType):
        assert isinstance(param.type, FiniteFloat), (path, param.name)


def run(argv):
    out, err = io.StringIO(), io.StringIO()
    old = os.environ.get("METAROCE_DEBUG")
    os.environ["METAROCE_DEBUG"] = "1"
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(argv))
    finally:
        if old is None:
            os.environ.pop("METAROCE_DEBUG", None)
        else:
            os.environ["METAROCE_DEBUG"] = old
    return code, out.getvalue(), err.getvalue()


def check_contract(argv, code, out, err):
    if argv[-1:] == ["--json"] and "--help" not in argv and "-h" not in argv:
        docs = [json.loads(line) for line in out.splitlines() if line.strip()]
        assert len(docs) == 1, (argv, out[:500])
        if code:
            assert set(docs[0]) == {"error"} and docs[0]["error"], (argv, docs[0])
    elif code:
        lines = [ln for ln in err.splitlines() if ln.startswith("metaroce: error:") or
                 ln.startswith("Error:") or ln.startswith("Usage:")]
        assert lines, (argv, err[-500:])
    assert "Traceback" not in err, (argv, err[-2000:])


def small_or_hostile(valid):
    return st.one_of(st.sampled_from(valid), st.sampled_from(HOSTILE_NUMBERS))


# Every option of the simulator commands, with small valid values (so a run that happens to be
# valid stays short) or hostile ones.
SIM = {
    "loss": {"--loss": ["0", "0.01", "0.05"], "--rate-gbps": ["1", "10"],
             "--size-mib": ["0.02", "0.05"], "--msg-kib": ["16", "4"], "--seed": ["1", "2"],
             "--mode": ["metaroce", "roce", "bogus"]},
    "incast": {"--senders": ["2", "3"], "--qps": ["1", "2"], "--rate-gbps": ["1", "10"],
               "--size-kib": ["16", "32"], "--msg-kib": ["16", "4"], "--seed": ["1", "2"],
               "--mode": ["metaroce", "roce", "bogus"]},
    "multipath": {"--paths": ["1", "2"], "--fail-at": ["0", "0.0001"], "--entropies": ["1", "4"],
                  "--host-gbps": ["1", "10"], "--fabric-gbps": ["1", "10"],
                  "--size-mib": ["0.02", "0.05"], "--msg-kib": ["16", "4"], "--seed": ["1", "2"],
                  "--mode": ["metaroce", "roce", "bogus"]},
}


@st.composite
def sim_argv(draw):
    """Every option at a small valid value (a valid run stays short), then one or two of them
    replaced by a hostile value."""
    which = draw(st.sampled_from(sorted(SIM)))
    opts = SIM[which]
    chosen = {name: vals[0] for name, vals in opts.items()}
    for name in draw(st.lists(st.sampled_from(sorted(opts)), min_size=1, max_size=2, unique=True)):
        chosen[name] = draw(small_or_hostile(opts[name][1:] or opts[name]))
    argv = ["sim", which] + [x for kv in chosen.items() for x in kv]
    if which == "incast" and draw(st.booleans()):
        argv.append("--no-credits")
    if draw(st.booleans()):
        argv.append("--json")
    return argv


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(argv=sim_argv())
def test_sim_options_hostile_values(argv):
    code, out, err = run(argv)
    check_contract(argv, code, out, err)
    if code == 0 and "--json" in argv:
        doc = json.loads(out)
        assert isinstance(doc, dict)
        for k, v in doc.items():          # no NaN/inf leaks into a result
            if isinstance(v, float):
                assert math.isfinite(v), (argv, k, v)


NO_SUCH = "mrfz0"      # no device, lab or daemon has this name


@st.composite
def query_argv(draw):
    forms = [
        ["stats", "--dev", NO_SUCH], ["status", "--dev", NO_SUCH], ["qp", "list", "--dev", NO_SUCH],
        ["qp", "show", draw(st.sampled_from(HOSTILE_NUMBERS)), "--dev", NO_SUCH],
        ["qp", "destroy", draw(st.sampled_from(HOSTILE_NUMBERS)), "--dev", NO_SUCH],
        ["stats", "--dev", NO_SUCH, "--qp", draw(st.sampled_from(HOSTILE_NUMBERS))],
        ["lab", "status", "--name", NO_SUCH],
        ["lab", "impair", draw(st.sampled_from(["h1-sw1", "", "x" * 300])), "--name", NO_SUCH,
         "--loss", draw(st.sampled_from(HOSTILE_NUMBERS)),
         "--reorder-depth", draw(st.sampled_from(HOSTILE_NUMBERS))],
        ["lab", "exec", "--name", NO_SUCH, draw(st.sampled_from(["h1", "", "../x"])), "true"],
        ["spec", "clauses", "--prefix", draw(st.sampled_from(HOSTILE_TEXT))],
        ["spec", "lint"],
        ["conformance", "list", "--mode", draw(st.sampled_from(["roce", "metaroce", "x", ""]))],
        ["fuzz", "--packets", draw(st.sampled_from(["-1", "0", "nan", "x"]))],
        ["perf", draw(st.sampled_from(["write-bw", "nope", ""])), "--dev", NO_SUCH,
         "-s", draw(st.sampled_from(["0", "-1", "1Q", "1e9999", "64", "x"])),
         "-n", draw(st.sampled_from(["0", "-5", "x"])),
         "-D", draw(st.sampled_from(NON_FINITE + ["0", "-1", "0.5", "1e308"]))],
        ["up", "--dev", NO_SUCH, "--credit-rtt-us", draw(st.sampled_from(NON_FINITE + ["0"])),
         "--link-rate", draw(st.sampled_from(NON_FINITE + ["1e400gbit", "10gbit", "0"]))],
        ["lab", "impair", "h1", "--name", NO_SUCH,
         draw(st.sampled_from(["--loss", "--dup", "--reorder"])), draw(st.sampled_from(NON_FINITE))],
        ["qp", "connect", draw(st.sampled_from(NON_FINITE + ["0x", "0x1000000", "-0x1"])),
         "--dev", NO_SUCH, "--remote", "/nonexistent.json"],
    ]
    argv = draw(st.sampled_from(forms))
    if draw(st.booleans()):
        argv = argv + ["--json"]
    return argv


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(argv=query_argv())
def test_queries_against_nothing_fail_cleanly(argv):
    code, out, err = run(argv)
    check_contract(argv, code, out, err)
    if argv[0] in ("stats", "status", "qp", "lab", "up") and argv[:2] != ["lab", "exec"]:
        assert code != 0, argv
    if argv[0] != "spec" and any(a in NON_FINITE for a in argv):   # (spec's are text)
        assert code == 2, argv          # a number: refused by the parser, before anything ran


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(blob=st.binary(max_size=600), as_json=st.booleans())
def test_pcap_decode_of_random_files(tmp_path_factory, blob, as_json):
    p = tmp_path_factory.mktemp("pcap") / "x.pcap"
    p.write_bytes(blob)
    argv = ["pcap", "decode", str(p)] + (["--json"] if as_json else [])
    code, out, err = run(argv)
    assert "Traceback" not in err
    if code:
        if as_json:
            assert [json.loads(x) for x in out.splitlines() if x.strip()][-1].get("error")
        else:
            assert "metaroce: error:" in err
