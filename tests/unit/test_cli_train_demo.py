"""`metaroce train-demo` is registered and validates its options before touching a lab."""

from click.testing import CliRunner

from metaroce.cli import cli


def test_train_demo_is_a_command_with_its_options():
    r = CliRunner().invoke(cli, ["train-demo", "--help"])
    assert r.exit_code == 0, r.output
    assert "--hosts" in r.output and "--steps" in r.output and "Gloo" in r.output


def test_train_demo_rejects_more_than_four_hosts():
    r = CliRunner().invoke(cli, ["train-demo", "--hosts", "5"])
    assert r.exit_code == 2 and "5 is not in the range 2<=x<=4" in r.output
