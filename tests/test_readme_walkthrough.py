"""What the README and docs/ promise, where a literal walk through them on a CPU found the tool doing otherwise."""

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
    # docs/serve.md: "--percentile ... is refused without a target (--slo-ms, --slo)"; 99, the default, given by hand
    # ran a whole load as if the option had been left out (exit 0), where --percentile 50 was refused
    (["--rate", "10", "--percentile", "99"], "--percentile 99 is the percentile a verdict holds under --slo-ms or --slo"),
    (["--concurrency", "2", "--percentile", "99.0"], "add one, or leave --percentile out"),
    # docs/serve.md: "--new-tokens ... refused without --task generate"; 32, the default, ran alike
    (["--rate", "10", "--new-tokens", "32"], "--new-tokens 32 applies to --task generate"),
    # the other values keep their lines
    (["--rate", "10", "--percentile", "50"], "--percentile 50 is the percentile a verdict holds"),
    (["--rate", "10", "--percentile", "101"], "--percentile 101: give a percentile above 0 and below 100"),
    (["--find-max-rate", "--slo-ms", "10", "--percentile", "100"], "--percentile 100: give a percentile"),
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


def test_serve_prints_a_max_rate_of_zero_the_cells_warnings_and_names_as_text(tmp_path, monkeypatch):
    """docs/options.md (serve): a max-rate cell holds "0, with the lowest probe, where no rate meets the target", and names
    are "printed literally in every table". serve printed `sdpa max-rate: ok ` with neither the 0 nor the warning
    that said why (run prints its cells' warnings), and a --name "x[/bold]y" ended in a MarkupError traceback
    after the whole load had run and been stored."""
    from types import SimpleNamespace

    from transbench.api import RunOutcome
    from transbench.cells import CellResult
    from transbench.cli import serve as serve_cli

    def fake_serve(spec, db, *, json_path=None, csv_path=None, on_cell, on_progress=None):
        cell = SimpleNamespace(backend="sdpa", mode="max-rate", rate=0.0, concurrency=0)
        on_cell(cell, CellResult("ok", record={"max_rate": 0.0}, warnings=["no probed rate met p99 <= 10 ms"]))
        rec = {"status": "ok", "backend": "sdpa", "mode": "max-rate", "max_rate": 0.0}
        return RunOutcome("abc123", spec.name, [rec])

    monkeypatch.setattr(serve_cli.api, "serve", fake_serve)
    res = runner.invoke(app, ["serve", "--model", "bert-tiny", "--device", "cpu", "--find-max-rate", "--slo-ms",
                              "10", "--name", "x[/bold]y", "--db", str(tmp_path / "t.db")], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "sdpa max-rate: ok max rate 0.0/s" in res.output
    assert "warning: no probed rate met p99 <= 10 ms" in res.output
    assert "serve x[/bold]y (abc123)" in res.output and "as run x[/bold]y" in res.output


def _commands(group, path=()):
    import click

    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, (*path, name))
        else:
            yield (*path, name), cmd


@pytest.mark.slow
def test_help_shows_every_bracket_its_option_text_holds():
    """docs/train.md: `--kernels liger` needs `pip install 'transbench[liger]'`; train --help said "pip install
    'transbench'", as typer renders help as rich markup and took [liger] for a style tag."""
    import re

    import typer.main

    group = typer.main.get_command(app)
    checked = 0
    for path, cmd in _commands(group):
        out = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "1000"}).output
        for p in cmd.params:
            for bracket in re.findall(r"\[[^\]\s]*\]", (getattr(p, "help", None) or "").replace("\\[", "[")):
                checked += 1
                assert bracket in out, (path, p.name, bracket)
    assert checked  # [liger], [MASK], ...


@pytest.mark.parametrize("suffix", [".yaml", ".yml", ".toml", ".json"])
def test_runs_spec_out_writes_a_file_the_spec_option_reads_back(tmp_path, suffix):
    """docs/results.md (runs): `transbench runs --spec NAME --out sweep.yaml` writes that run's spec, and `run --spec`
    repeats its grid; --spec reads .yaml, .yml, .toml and .json. An `--out x.json` got YAML (no JSON reader takes
    it back), and a training run's spec went to stdout as JSON with no file written, exit 0."""
    from report_helpers import cell, make_run, ok_result

    from transbench.scenarios.training.spec import TrainSpec
    from transbench.scenarios.inference.spec import RunSpec
    from transbench.spec import load_file

    db = str(tmp_path / "t.db")
    run_spec = RunSpec(models=["bert-tiny"], backends=["eager"], batches=[1], seqs=[8])
    make_run(db, "a", [(cell("eager", 1), ok_result([1.0, 1.1, 1.2], 1))], spec=run_spec.to_dict())
    train_spec = TrainSpec(models=["bert-tiny"], optims=["adamw", "sgd"], batches=[2], seqs=[16], steps=3)
    make_run(db, "t", [], kind="training", spec=train_spec.to_dict())
    for name, cls, want in (("a", RunSpec, run_spec), ("t", TrainSpec, train_spec)):
        out = tmp_path / f"{name}{suffix}"
        res = runner.invoke(app, ["runs", "--db", db, "--spec", name, "--out", str(out)])
        assert res.exit_code == 0 and res.output == f"wrote {out}\n", res.output
        assert cls.from_dict(load_file(str(out))) == want


def test_runs_spec_out_in_a_format_the_spec_option_cannot_read_is_refused(tmp_path):
    from report_helpers import cell, make_run, ok_result

    db = str(tmp_path / "t.db")
    make_run(db, "a", [(cell("eager", 1), ok_result([1.0, 1.1, 1.2], 1))])
    out = tmp_path / "a.txt"
    res = runner.invoke(app, ["runs", "--db", db, "--spec", "a", "--out", str(out)])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
    assert res.output.startswith(f"error: --out {out}: end the file name in .yaml, .yml, .toml or .json")
    assert not out.exists()


def test_ladder_table_prints_names_as_text():
    """docs/results.md (report): names are "printed literally in every table: --name "x[/bold]y" shows as x[/bold]y". A
    ladder so named raised a MarkupError after all its training, before its table and plot."""
    from rich.console import Console

    from transbench.cli.train import LADDER_COLUMNS, training_table

    recs = [{"step": "fp32 ./ck[pt]", "kept": True, "batch_size": 2, "status": "ok", "samples_per_s": 10.0,
             "options": "fp32 [bold]"}, {"step": "bf16", "kept": False, "batch_size": 2, "status": "oom"}]
    console = Console(width=300, record=True, color_system=None)
    console.print(training_table(recs, LADDER_COLUMNS, "training ladder x[/bold]y (abc)"))
    text = console.export_text()
    assert "training ladder x[/bold]y (abc)" in text and "fp32 ./ck[pt]" in text and "fp32 [bold]" in text
    assert "oom" in text


def test_demo_refuses_a_backend_listed_twice():
    """docs/options.md (shared options): "on every axis of every command a value listed twice ... is refused". demo ran
    `--backend eager,eager` twice and printed a difference of 0 between eager and itself, exit 0."""
    res = runner.invoke(app, ["demo", "--prompt", "hello world", "--model", "bert-tiny", "--device", "cpu",
                              "--backend", "eager,sdpa,eager"])
    assert res.exit_code == 2, res.output
    assert res.output == "error: --backend lists eager twice: give each value once\n"


@pytest.mark.parametrize("option", ["--warmup", "--steps"])
def test_train_names_its_options_as_help_does(tmp_path, option):
    """docs/options.md (shared options): one name per concept, `train --warmup-steps` being an old, hidden spelling of
    `--warmup`; `train --warmup 0` answered "--steps and --warmup-steps must be at least 1"."""
    db = tmp_path / "t.db"
    res = runner.invoke(app, ["train", "--model", "bert-tiny", "--device", "cpu", option, "0", "--db", str(db)])
    assert res.exit_code == 2 and not db.exists(), res.output
    assert res.output.startswith("error: --steps and --warmup must be at least 1 ("), res.output


@pytest.mark.slow
def test_run_max_batch_says_on_the_console_that_its_answer_is_the_cap(tmp_path):
    """docs/options.md (run): "an answer at the cap warns that it is the cap" (spec key `max_batch_limit`). The warning was
    only stored, never printed (every cell's `noisy` is), and it named `--max-batch-limit`, which `run` has not."""
    spec = tmp_path / "mb.yaml"
    spec.write_text("max_batch_limit: 4\n")
    res = runner.invoke(app, ["run", "--spec", str(spec), "--model", "bert-tiny", "--backend", "sdpa", "--batch", "1",
                              "--seq", "8", "--max-batch", "--device", "cpu", "--min-time", "0", "--min-count", "3",
                              "--warmup", "1", "--db", str(tmp_path / "t.db")], env={"COLUMNS": "300"})
    assert res.exit_code == 0, res.output
    assert "max-batch search bert-tiny sdpa fp32 s8: largest batch 4 ok" in res.output
    assert ("warning: batch 4 is the search's cap (4: train's --max-batch-limit, run's spec key max_batch_limit), "
            "not the largest batch that fits") in res.output


def test_run_backend_help_names_every_backend_itself():
    """`run --help` said `eager,sdpa,sdpa-math,...,fused (`transbench env` lists them)`, and `transbench env` lists no
    backend: the help names each built-in one itself."""
    from transbench.backends import registry

    res = runner.invoke(app, ["run", "--help"], env={"COLUMNS": "250"})
    assert res.exit_code == 0
    text = " ".join(res.output.split())
    assert "transbench env` lists" not in text
    for name in registry():
        assert f" {name}," in text or f" {name} (" in text, name


@pytest.mark.parametrize("seqs, tokens, fix", [
    ("32", "128", "use --seq 1 or less, or --new-tokens 97 or less"),
    # the longest prompt sets how many new tokens fit: 113 after 16 would still overflow after 32
    ("16,32", "120", "use --seq 9 or less, or --new-tokens 97 or less"),
])
def test_a_generation_past_the_positions_is_told_both_fixes(tmp_path, seqs, tokens, fix):
    """docs/run.md's generate example on gpt2-tiny (`--seq 32 --new-tokens 128`) was told only "use --seq 1 or less":
    fewer new tokens after the prompt fit as well."""
    db = tmp_path / "t.db"
    res = runner.invoke(app, ["run", "--model", "gpt2-tiny", "--task", "generate", "--seq", seqs, "--new-tokens",
                              tokens, "--device", "cpu", "--db", str(db)])
    assert res.exit_code == 2 and not db.exists(), res.output
    assert res.output.rstrip().endswith(f"than gpt2-tiny allows (128 positions): {fix}"), res.output


def test_train_progress_lines_tell_every_cell_of_the_grid_apart():
    """docs/train.md's `--strategy deepspeed --zero-stage 2,3` (and `--nccl-p2p on,off`): each cell's progress line was
    `... deepspeed@2: unsupported ...`, the same for both stages, where the table below told them apart."""
    from transbench.cli.train import cell_label
    from transbench.scenarios.training.spec import TrainSpec, expand

    def labels(**kw):
        cells = expand(TrainSpec(models=["bert-tiny"], dtypes=["fp32"], batches=[2], seqs=[16], device="cpu", **kw))
        return [cell_label(c) for c in cells]

    zero = labels(strategies=["deepspeed"], nprocs=[2], zero_stages=[2, 3])
    assert len(set(zero)) == 2 and any("ZeRO-2" in x for x in zero) and any("ZeRO-3" in x for x in zero), zero
    nccl = labels(strategies=["ddp"], nprocs=[2], nccl_p2p=["on", "off"])
    assert len(set(nccl)) == 2 and any("NCCL_P2P_DISABLE=1" in x for x in nccl), nccl
    plain = labels()
    assert plain == ["bert-tiny mlm sdpa fp32 adamw-fused b2 s16 x1 torch none@1"], plain  # no axis: as before
    # a ladder's steps: the masked head, then the vocabulary padded, then no dropout, each on the one before
    steps = [labels(heads=["masked"]), labels(heads=["masked"], pad_vocab=64),
             labels(heads=["masked"], pad_vocab=64, dropout=0.0, activation="gelu-tanh")]
    assert len({x for s in steps for x in s}) == 3, steps
    assert steps[2][0].endswith("masked-head gelu-tanh pad-vocab-64 dropout-0 none@1"), steps
