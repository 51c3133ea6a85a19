"""Shards (runner/shard.py): `--shard auto` from a Slurm array's and a Kubernetes Indexed Job's variables on every
command that has --shard, the one-line refusals, the slices covering the grid, and the stores of shards run on two
hosts merged into one run that says where each cell ran."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from transbench import api
from transbench.cli import app
from transbench.errors import SpecError
from transbench.runner import shard
from transbench.store import Store

SLURM = {"SLURM_ARRAY_JOB_ID": "77", "SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_MIN": "0",
         "SLURM_ARRAY_TASK_MAX": "1"}
K8S = {"JOB_COMPLETION_INDEX": "1"}
SCHEDULER_VARS = [*SLURM, "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_STEP", *K8S, shard.COUNT_VAR]


@pytest.mark.parametrize("env, count, want", [
    (SLURM, None, (2, 2)),
    ({"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_MIN": "3", "SLURM_ARRAY_TASK_MAX": "10"}, None, (3, 8)),
    ({"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_COUNT": "4"}, None, (4, 4)),
    ({"SLURM_ARRAY_TASK_ID": "4", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_MAX": "6",
      "SLURM_ARRAY_TASK_STEP": "2", "SLURM_ARRAY_TASK_COUNT": "4"}, None, (3, 4)),
    (K8S, 2, (2, 2)),
    ({**K8S, shard.COUNT_VAR: "3"}, None, (2, 3)),
    ({"JOB_COMPLETION_INDEX": "0"}, 1, (1, 1)),
])
def test_auto_reads_the_schedulers_index(env, count, want):
    assert shard.resolve("auto", count, env) == want


@pytest.mark.parametrize("text, count, env, says", [
    ("auto", None, {}, "no Slurm array"),
    ("auto", None, K8S, "--shard-count"),
    ("auto", 1, K8S, "not an index of 1"),
    ("auto", None, {"SLURM_ARRAY_TASK_ID": "3"}, "SLURM_ARRAY_TASK_MIN"),
    ("auto", None, {"SLURM_ARRAY_TASK_ID": "9", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_MAX": "3"}, "not one of"),
    ("auto", None, {"SLURM_ARRAY_TASK_ID": "x", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_MAX": "3"}, "whole number"),
    ("auto", 5, SLURM, "differs from the Slurm array"),
    ("1/2", 2, {}, "--shard-count is the count"),
    (None, 2, {}, "--shard-count is the count"),
    ("3/2", None, {}, "bad --shard"),
    # another script's digits, and counts past any cluster's array (a run of no cells, exit 0)
    ("auto", 5, {"JOB_COMPLETION_INDEX": "٣"}, "whole number"),
    ("auto", None, {"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_MAX": "3",
                    "SLURM_ARRAY_TASK_STEP": "0"}, "SLURM_ARRAY_TASK_STEP=0 must be at least 1"),
    ("1/1000000000000000000", None, {}, "above the limit of 1,000,000"),
    ("auto", None, {"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_MIN": "0",
                    "SLURM_ARRAY_TASK_MAX": "1000000000000000000"}, "above the limit of 1,000,000"),
    # more digits than a 64-bit integer holds: no scheduler's index or count
    ("1/100000000000000000000000", None, {}, "at most 19 digits"),
    ("auto", None, {"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_MIN": "0",
                    "SLURM_ARRAY_TASK_MAX": "100000000000000000000"}, "at most 19 digits"),
    ("auto", 0, K8S, "at least 1 and at most 1,000,000, got 0"),
    ("auto", 10**40, K8S, "got a number of more than 19 digits"),
])
def test_refusals_are_one_line(text, count, env, says):
    with pytest.raises(SpecError, match=says) as got:
        shard.resolve(text, count, env)
    assert "\n" not in str(got.value)


# Values of any length and make-up in each variable --shard auto reads, and in --shard itself.
_LONG = st.one_of(st.text(min_size=41, max_size=3000), st.integers(20, 6000).map(lambda n: "9" * n),
                  st.integers(1, 2000).map(lambda n: "\x1b[2J\n" * n))


@settings(max_examples=60, deadline=None)
@given(value=_LONG, var=st.sampled_from(["SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_MAX",
                                         "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_STEP", "JOB_COMPLETION_INDEX",
                                         shard.COUNT_VAR]))
def test_a_long_value_is_refused_in_one_short_printable_line(value, var):
    # Before: a value of thousands of digits was read, then echoed whole (with thousands separators, twice) by the
    # refusal that named it: a TRANSBENCH_SHARD_COUNT of 4,000 nines made a line of 10,755 characters.
    env = {"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_COUNT": "2"} if var.startswith("SLURM") else \
        {"JOB_COMPLETION_INDEX": "0", shard.COUNT_VAR: "2"}
    for text, e in (("auto", {**env, var: value}), (f"1/{value}", {}), (f"{value}/2", {})):
        with pytest.raises(SpecError) as got:
            shard.resolve(text, None, e)
        said = str(got.value)
        assert len(said) <= 200 and said.isprintable(), said


def test_slices_are_disjoint_and_cover_whole_groups():
    cells = [(g, b) for g in "abcde" for b in (1, 2)]
    parts = [shard.select(cells, (i, 3), group=lambda c: c[0]) for i in (1, 2, 3)]
    assert sorted(sum(parts, [])) == sorted(cells)
    assert all({g for g, _ in p}.isdisjoint({g for g, _ in q}) for p in parts for q in parts if p is not q)
    assert shard.select(cells, None) is cells


# Every command that has --shard, with a grid of one group: shard 2 of 2 holds nothing, so each ends at once.
COMMANDS = {
    "run": ["run", "--model", "bert-tiny", "--device", "cpu", "--backend", "sdpa", "--batch", "1", "--seq", "8"],
    "serve": ["serve", "--model", "bert-tiny", "--device", "cpu", "--lengths", "fixed:8", "--offline",
              "--duration", "0.2", "--warmup", "0"],
    "train": ["train", "--model", "bert-tiny", "--device", "cpu", "--batch", "2", "--seq", "8", "--steps", "1",
              "--warmup", "1"],
    "micro gemm": ["micro", "gemm", "--device", "cpu", "--sizes", "64"],
    "micro bandwidth": ["micro", "bandwidth", "--device", "cpu", "--sizes", "1024", "--ops", "copy"],
    "micro layer": ["micro", "layer", "--model", "bert-tiny", "--device", "cpu", "--batch", "1", "--seq", "8"],
    "micro breakdown": ["micro", "breakdown", "--model", "bert-tiny", "--device", "cpu", "--batch", "1", "--seq", "8"],
    "micro collectives": ["micro", "collectives", "--device", "cpu", "--op", "all-reduce", "--sizes", "1KiB"],
}


@pytest.fixture
def clean_env(monkeypatch):
    for var in SCHEDULER_VARS:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


@pytest.mark.parametrize("scheduler", ["slurm", "k8s-option", "k8s-env"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_shard_auto_on_every_command(command, scheduler, clean_env, tmp_path):
    env = {"slurm": SLURM, "k8s-option": K8S, "k8s-env": {**K8S, shard.COUNT_VAR: "2"}}[scheduler]
    for k, v in env.items():
        clean_env.setenv(k, v)
    db = tmp_path / "s.db"
    extra = ["--shard-count", "2"] if scheduler == "k8s-option" else []
    r = CliRunner().invoke(app, [*COMMANDS[command], "--shard", "auto", *extra, "--db", str(db)])
    assert r.exit_code == 0, r.output
    store = Store(db, readonly=True)
    (run,) = store.runs()
    cells = store.cells(run["run_id"])
    store.close()
    assert run["spec"]["shard"] == "2/2" and not run["spec"].get("shard_count")  # the slice this task ran
    assert cells == []  # one group: shard 1 of 2 holds it
    assert run["env"]["hostname"] and {k: run["env"]["scheduler"][k] for k in env} == env


def test_a_100_kb_shard_count_is_one_short_line_exit_2_and_no_store(clean_env, tmp_path):
    clean_env.setenv("JOB_COMPLETION_INDEX", "0")
    clean_env.setenv(shard.COUNT_VAR, "7" * 100_000)
    db = tmp_path / "s.db"
    r = CliRunner().invoke(app, [*COMMANDS["run"], "--shard", "auto", "--db", str(db)])
    assert r.exit_code == 2 and "at most 19 digits" in r.output and len(r.output) < 300, r.output[:300]
    assert not db.exists()


@pytest.mark.parametrize("command", list(COMMANDS))
def test_shard_auto_without_a_scheduler_is_refused(command, clean_env, tmp_path):
    db = tmp_path / "s.db"
    r = CliRunner().invoke(app, [*COMMANDS[command], "--shard", "auto", "--db", str(db)])
    assert r.exit_code == 2 and "no Slurm array" in r.output and "Traceback" not in r.output
    assert not db.exists()


@pytest.mark.slow
def test_shards_from_two_hosts_merge_into_one_run_that_says_where_each_cell_ran(tmp_path, clean_env):
    from transbench.measure import env as env_mod
    from transbench.runner import sweep
    from transbench.scenarios.inference.spec import RunSpec

    stores = []
    for task, host in ((0, "node-a"), (1, "node-b")):
        clean_env.setattr(env_mod.socket, "gethostname", lambda host=host: host)
        clean_env.setattr(sweep.socket, "gethostname", lambda host=host: host)
        for k, v in {"SLURM_ARRAY_TASK_ID": str(task), "SLURM_ARRAY_TASK_MIN": "0",
                     "SLURM_ARRAY_TASK_MAX": "1"}.items():
            clean_env.setenv(k, v)
        db = str(tmp_path / f"{host}.db")  # a store per shard, on the host's own disk
        api.run(RunSpec(models=["bert-tiny"], backends=["sdpa"], batches=[1], seqs=[8, 16], device="cpu",
                        min_time=0.01, min_count=2, warmup=1, shard="auto", name="grid"), db)
        stores.append(db)
    merged = api.merge(str(tmp_path / "all.db"), stores)
    assert merged.cells == 2 and not merged.differing
    store = Store(tmp_path / "all.db", readonly=True)
    (run,) = store.runs()
    store.close()
    assert [h["hostname"] for h in run["env"]["hosts"]] == ["node-a", "node-b"]
    assert [h["scheduler"]["SLURM_ARRAY_TASK_ID"] for h in run["env"]["hosts"]] == ["0", "1"]
    recs = api.records(str(tmp_path / "all.db"))
    assert sorted((r["seq_len"], r["host"]) for r in recs) == [(8, "node-a"), (16, "node-b")]
    assert all(r["status"] == "ok" for r in recs)
    # merged again: nothing new, the hosts listed once
    again = api.merge(str(tmp_path / "all.db"), stores)
    assert again.cells == 0
    store = Store(tmp_path / "all.db", readonly=True)
    assert len(store.runs()[0]["env"]["hosts"]) == 2
    store.close()
    json.dumps(run["env"])
