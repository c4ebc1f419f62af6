"""`metaroce sim`: one JSON object with the documented keys, house-style errors.

Clauses: CC-8 (incast credits), MP-5 (recovery_s), SACK-5 (loss).
"""

import json

from metaroce.cli import main

KEYS = {"goodput_bps", "retransmissions", "drops", "max_queue_bytes", "jain_fairness",
        "app_errors", "fct_p50_s", "fct_p99_s", "seed", "mode"}


def run(capsys, *args):
    rc = main(["sim", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_loss_json(capsys):
    rc, out, _ = run(capsys, "loss", "--loss", "0.02", "--size-mib", "2", "--seed", "5",
                     "--json")
    assert rc == 0 and out.count("\n") == 1
    doc = json.loads(out)
    assert KEYS <= set(doc) and doc["seed"] == 5 and doc["mode"] == "metaroce"
    assert doc["loss"] == 0.02 and doc["size_mib"] == 2 and "goodput_ratio" in doc
    rc2, out2, _ = run(capsys, "loss", "--loss", "0.02", "--size-mib", "2", "--seed", "5",
                       "--json")
    assert out2 == out  # deterministic


def test_incast_json_and_text(capsys):
    rc, out, _ = run(capsys, "incast", "--senders", "4", "--no-credits", "--mode", "roce",
                     "--size-kib", "128", "--json")
    doc = json.loads(out)
    assert rc == 0 and KEYS <= set(doc)
    assert doc["senders"] == 4 and doc["credits"] is False and doc["mode"] == "roce"
    rc, out, err = run(capsys, "incast", "--senders", "4", "--size-kib", "128")
    assert rc == 0 and "goodput_bps" in out and "Gbit/s" in out and "simulating" in err


def test_multipath_json_has_recovery(capsys):
    rc, out, _ = run(capsys, "multipath", "--paths", "2", "--fail-at", "0.00005",
                     "--size-mib", "4", "--json")
    doc = json.loads(out)
    assert rc == 0 and KEYS | {"recovery_s"} <= set(doc)
    assert doc["paths"] == 2 and doc["fail_at"] == 0.00005 and doc["app_errors"] == 0
    rc, out, _ = run(capsys, "multipath", "--paths", "2", "--size-mib", "1", "--json")
    assert json.loads(out)["recovery_s"] is None


def test_errors_are_one_line(capsys):
    rc, out, err = run(capsys, "loss", "--loss", "1.5")
    assert rc == 2 and err.strip() == "metaroce: error: --loss must be in [0, 1)" and out == ""
    rc, out, _ = run(capsys, "incast", "--senders", "0", "--json")
    assert rc == 2 and json.loads(out) == {"error": "--senders and --qps must be >= 1"}
    rc, out, err = run(capsys, "multipath", "--mode", "tcp")
    assert rc == 2 and len(err.strip().splitlines()) == 1


def test_help_documents_default_workloads(capsys):
    for cmd, needle in (("loss", "16 MiB"), ("incast", "32 senders"), ("multipath", "32 MiB")):
        rc, out, _ = run(capsys, cmd, "--help")
        assert rc == 0 and needle in out
