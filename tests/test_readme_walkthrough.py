"""What README.md promises, where a literal walk through it on a CPU found the tool doing otherwise."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from transbench.cli import app

runner = CliRunner()


def refused(tmp_path, *args):
    db = tmp_path / "t.db"
    res = runner.invoke(app, ["serve", "--model", "bert-tiny", "--device", "cpu", "--lengths", "fixed:8",
                              *args, "--db", str(db)])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
    assert not db.exists()  # bad input: refused before any store is made
    return res.output


@pytest.mark.parametrize("args, message", [
    # README (serve): "--percentile ... is refused without --find-max-rate"; 99, the default, given by hand ran a
    # whole load as if the option had been left out (exit 0), where --percentile 50 was refused
    (["--rate", "10", "--percentile", "99"], "--percentile 99 is the percentile --find-max-rate holds under --slo-ms"),
    (["--concurrency", "2", "--percentile", "99.0"], "add --find-max-rate, or leave --percentile out"),
    # README (serve): "--new-tokens ... refused without --task generate"; 32, the default, ran alike
    (["--rate", "10", "--new-tokens", "32"], "--new-tokens 32 applies to --task generate"),
    # the other values keep their lines
    (["--rate", "10", "--percentile", "50"], "--percentile 50 is the percentile --find-max-rate holds"),
    (["--rate", "10", "--percentile", "101"], "--percentile 101: choose from 50, 90, 99, 99.9"),
    (["--find-max-rate", "--slo-ms", "10", "--percentile", "95"], "--percentile 95: choose from"),
])
def test_serve_refuses_an_option_its_load_does_not_use_even_at_its_default(tmp_path, args, message):
    assert message in refused(tmp_path, *args)


def test_serve_help_still_shows_the_defaults():
    res = runner.invoke(app, ["serve", "--help"], env={"COLUMNS": "250"})
    assert res.exit_code == 0
    lines = res.output.splitlines()
    for option, default in (("--percentile", "99"), ("--new-tokens", "32")):
        line = next(x for x in lines if option in x)
        assert f"[default: ({default})]" in line, line  # as run shows its own (cli/run.py)
