"""Every option of every command, fed bad values (docs/measurement.md, "Statuses": bad input is one line on
stderr, `error: ...`, exit code 2, before anything runs, and nothing stored is changed). The options are read from the
typer app itself, so an option added later is swept too: an int or float option by its type alone, a text option by
the kind CLASSES gives it (test_every_option_of_every_command_is_swept fails until it has one).

Each case runs the command in-process (typer's CliRunner, as tests/test_cli_input.py does) in a folder of its own that
holds a transbench store with two runs (the default --db), another application's SQLite file and a file of random
bytes; the folder is compared byte for byte before and after. A command whose options all passed would start
measuring: the first step of its work is replaced by an exception (WORK), so a value the command accepts is seen as
accepted without running anything. Which values are rightly accepted, and why, is ACCEPTED below; every other value
of the sweep must be refused."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sqlite3
import stat
import subprocess
import sys
import threading
from contextlib import suppress
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from transbench.cli import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
ROOT_USER = os.geteuid() == 0  # root reads and writes past permission bits: those cases cannot be made
LONG = "x" * 10_000  # a path or a name past every file system's limit (255 bytes a name, 4096 a path)
LONG_NUMBER = "9" * 10_000  # past Python's 4,300 digits of int(): a ValueError, as a word would be
N = "٣"  # ARABIC-INDIC DIGIT THREE: Python's int() reads it as 3, the typed options (typer) refuse it

# --- the commands and their options, from the typer app -------------------------------------------------------


CLI = typer.main.get_command(app)  # built once: typer builds it anew on every invoke (50 ms, most of a case)


def commands() -> dict[tuple[str, ...], object]:
    """{('micro', 'gemm'): its click command, ...}: every leaf command of the app."""
    out = {}

    def walk(cmd, path):
        if hasattr(cmd, "commands"):
            for name, sub in cmd.commands.items():
                walk(sub, (*path, name))
        else:
            out[path] = cmd

    walk(CLI, ())
    return out


COMMANDS = commands()


def options(cmd) -> list[tuple[str, object, bool]]:
    """(its name on the command line, '--opt' or an argument's name; its annotation; is a flag) of each parameter."""
    return [(p.name, p.type_descriptor.annotation, False) if p.param_type_name == "argument" else
            (p.opts[0], p.type_descriptor.annotation, bool(getattr(p, "is_flag", False))) for p in cmd.params]


# A text option's kind decides its battery of bad values. "cmd:--opt" wins over "--opt".
CLASSES = {
    "--db": "store", "--into": "store", "merge:sources": "store-source",
    "--json": "out-file", "--csv": "out-file", "--plot": "out-file", "runs:--out": "out-file",
    "report:--out": "out-folder", "tune:--cache-dir": "out-folder",
    "--spec": "spec-file", "runs:--spec": "run-ref", "report:runs": "run-ref", "compare:run_a": "run-ref",
    "compare:run_b": "run-ref",
    "--batch": "int-list", "--seq": "int-list", "--gpus": "int-list", "--concurrency": "int-list",
    "--grad-accum": "int-list", "--zero-stage": "int-list", "train:--nproc": "int-list", "--sizes": "int-list",
    "--rate": "float-list",
    "--model": "model",
    "--task": "choice-list", "--backend": "choice-list", "--dtype": "choice-list", "--optim": "choice-list",
    "--kernels": "choice-list", "--head": "choice-list", "--strategy": "choice-list", "--ops": "choice-list",
    "--grad-ckpt": "choice-list", "--compile": "choice-list", "--nccl-p2p": "choice-list",
    "--device": "choice", "--activation": "choice", "--compile-mode": "choice", "--baseline": "choice",
    "--name": "name", "--prompt": "text", "--rdzv-endpoint": "endpoint", "--nccl-env": "nccl-env",
    "--shard": "shard", "--lengths": "lengths", "--op": "choice-list", "--comm-timing": "choice",
    "--url": "text", "--api": "choice", "--served-model": "text", "--tokenizer": "text", "--reference-model": "text",
    "--host": "host", "--served-model-name": "name", "--warm-lengths": "int-list",
    "compare:--markdown": "out-file", "compare:--github-benchmark": "out-file",
    "--arrivals": "text", "--trace": "text", "--slo": "text", "--percentiles": "float-list", "--quant": "choice-list",
}


def kind_of(command: tuple[str, ...], key: str, annotation, flag: bool) -> str | None:
    if flag:
        return "flag"
    if annotation in (int, float):
        return annotation.__name__
    return CLASSES.get(f"{' '.join(command)}:{key}") or CLASSES.get(f"{command[0]}:{key}") or CLASSES.get(key)


# A value is text, or `@name` for a path made in the case's folder (see make()).
BATTERY = {
    "int": ["-1", "0", "1.5", "nan", "inf", "-inf", "1e400", "1e30", "", " ", N, "99999999999999999999999",
            "-99999999999999999999999", LONG_NUMBER, "0x10", "1,2"],
    "float": ["-1", "0", "nan", "inf", "-inf", "1e400", "-1e400", "1e30", "1e-320", "", " ", N, "1,5", LONG_NUMBER,
              "0x1p3"],
    "int-list": ["-1", "0", "1.5", "nan", "inf", "1e400", "1e30", "", ",", "1,,2", "2,2", " ", N, LONG_NUMBER,
                 "1 2", "99999999999999999999999"],
    "float-list": ["-1", "0", "nan", "inf", "-inf", "1e400", "1e30", "", ",", "1,,2", "2,2", " ", N, LONG_NUMBER],
    "choice-list": ["", ",", " ", "bogus", N, LONG, "{v},,{v}", "{v},{v}", "{V}"],
    "choice": ["", " ", "bogus", N, LONG, "{v},{v}", "{V}"],
    "model": ["", ",", " ", "bogus", N, LONG, "bert-tiny,bert-tiny", "@dir", "@missing", "@random.bin",
              "@config-garbage", "@unreadable-dir", "@unreadable-config"],
    "name": ["", " ", "\t", LONG, N],
    "text": ["", " ", LONG, N],
    "run-ref": ["", " ", "nope", LONG, N],
    "spec-file": ["", " ", LONG, "@dir", "@missing.yaml", "@empty.yaml", "@random.yaml", "@random.json",
                  "@text.txt", "@fifo.yaml", "@unreadable.yaml", "@under-file/s.yaml", "@huge.yaml", "@huge.json",
                  "@huge.toml", "@bad-date.yaml"],
    "store": ["", " ", LONG, "@dir", "@text.db", "@empty.db", "@random.db", "@foreign.db", "@damaged.db",
              "@missing.db", "@under-file/t.db", "@under-missing/t.db", "@fifo.db", "/dev/null", "@readonly/t.db",
              "@unreadable.db", "@long-store.db"],
    "store-source": ["", " ", LONG, "@dir", "@text.db", "@empty.db", "@foreign.db", "@damaged.db", "@missing.db",
                     "@under-file/t.db", "@fifo.db", "/dev/null", "@unreadable.db", "@long-store.db"],
    "out-file": ["", " ", LONG, "@dir", ".", "@under-file/o.{ext}", "@under-missing/o.{ext}", "@foreign.db",
                 "@store", "@readonly/o.{ext}", "@long-name.{ext}"],
    "out-folder": ["", " ", LONG, "@text.txt", "@under-file/out", "@readonly/out", "@long-name", "@fresh-long"],
    "shard": ["", " ", "0/1", "2/1", "1/0", "-1/2", "1/2/3", "a/b", "1.5/2", "nan/1", f"{N}/{N}", LONG, "1/",
              "/2", "1/99999999999999999999999"],
    "lengths": ["", " ", "fixed:0", "fixed:-1", "fixed:0.5", "fixed:nan", "fixed:inf", "fixed:1e400", f"fixed:{N}",
                "normal:64", "lognormal:64:32", "lognormal:8:8:1e400", "bogus:1", LONG, "fixed:",
                "counts:@dir", "counts:@missing.txt", "counts:@empty.txt", "counts:@random.txt",
                "counts:@fifo.txt", "counts:@unreadable.txt", f"counts:{LONG}", "text:@random.txt",
                "counts:@counts-bad.txt"],
    "host": ["", " ", "bogus", "1.2.3", "256.0.0.1", "::g", LONG, N],
    "endpoint": ["", " ", "host:", ":29500", "host:abc", "host:0", "host:99999", "host:-1", LONG, "host:1:2"],
    "nccl-env": ["", " ", "FOO=1", "NCCL_X", "=1", "nccl_x=1", "NCCL_X=1 NCCL_X=2", LONG],
    "flag": ["=maybe"],
}
# A valid value of each choice option: `{v}` and `{V}` (upper case) in the battery.
VALID_CHOICE = {"--task": "base", "--backend": "sdpa", "--dtype": "fp32", "--optim": "sgd", "--kernels": "torch",
                "--head": "all", "--strategy": "none", "--ops": "copy", "--grad-ckpt": "off", "--compile": "off",
                "--nccl-p2p": "on", "--device": "cpu", "--activation": "gelu", "--compile-mode": "default",
                "--baseline": "sdpa", "--op": "all-reduce", "--api": "openai-embeddings"}
# Per command, the task a valid --task is (train trains mlm on a BERT; serve serves classification).
VALID_CHOICE_BY_COMMAND = {("train", "--task"): "mlm", ("serve", "--task"): "classification",
                           ("train", "--strategy"): "ddp", ("train", "--nccl-p2p"): "on",
                           ("train", "--comm-timing"): "off"}

# Valid options each command is given around the one swept (the one swept replaces its own entry).
BASE = {
    ("run",): ["--model", "bert-tiny", "--device", "cpu", "--backend", "sdpa", "--batch", "1", "--seq", "8",
               "--min-time", "0.01", "--warmup", "1"],
    ("serve",): ["--model", "bert-tiny", "--device", "cpu", "--lengths", "fixed:8", "--offline", "--duration", "0.2",
                 "--warmup", "0"],
    ("train",): ["--model", "bert-tiny", "--device", "cpu", "--batch", "2", "--seq", "8", "--steps", "1",
                 "--warmup", "1"],
    ("micro", "gemm"): ["--device", "cpu", "--sizes", "64", "--min-time", "0.01", "--warmup", "1"],
    ("micro", "bandwidth"): ["--device", "cpu", "--sizes", "1024", "--min-time", "0.01", "--warmup", "1"],
    ("micro", "layer"): ["--model", "bert-tiny", "--device", "cpu", "--batch", "1", "--seq", "8", "--min-time",
                         "0.01", "--warmup", "1"],
    ("micro", "breakdown"): ["--model", "bert-tiny", "--device", "cpu", "--batch", "1", "--seq", "8", "--min-time",
                             "0.01", "--warmup", "1"],
    ("micro", "collectives"): ["--device", "cpu", "--op", "all-reduce", "--sizes", "1KiB", "--min-time", "0.01",
                               "--warmup", "1"],
    ("tune",): ["--model", "bert-tiny", "--batch", "1", "--seq", "8"],
    ("server",): ["--model", "bert-tiny", "--device", "cpu", "--port", "18999"],
    ("report",): ["a", "b"],
    ("compare",): ["a", "b"],
    ("demo",): ["--prompt", "hello world", "--model", "bert-tiny", "--device", "cpu"],
    ("env",): [],
    ("runs",): [],
    ("merge",): ["@source.db"],
    ("models",): [],
}
# Where an option only applies with others, those others: (option, value), (flag, True), or (option, None) to leave
# the base's out.
CONTEXT = {
    ("run", "--new-tokens"): [("--model", "gpt2-tiny"), ("--task", "generate")],
    ("run", "--compile-mode"): [("--backend", "compile")],
    ("run", "--baseline"): [("--backend", "eager,sdpa")],
    ("serve", "--percentile"): [("--find-max-rate", True), ("--slo-ms", "10"), ("--offline", None)],
    ("serve", "--new-tokens"): [("--model", "gpt2-tiny"), ("--task", "generate")],
    ("serve", "--rate"): [("--offline", None)],
    ("serve", "--concurrency"): [("--offline", None)],
    ("train", "--plot"): [("--ladder", True)],
    ("train", "--max-batch-limit"): [("--ladder", True)],
    ("train", "--zero-stage"): [("--strategy", "deepspeed")],
    ("train", "--nccl-p2p"): [("--nproc", "2")],
    ("train", "--nccl-env"): [("--nproc", "2")],
    ("train", "--comm-timing"): [("--nproc", "2")],
    ("train", "--node-rank"): [("--nnodes", "2"), ("--rdzv-endpoint", "localhost:29500")],
    ("train", "--nnodes"): [("--rdzv-endpoint", "localhost:29500")],
    ("train", "--rdzv-endpoint"): [("--nnodes", "2")],
    ("micro", "gemm", "--tokens"): [("--model", "bert-tiny")],
    ("runs", "--out"): [("--spec", "a")],
}

# --- the case's folder ------------------------------------------------------------------------------------------

def random_bytes(n: int = 4096) -> bytes:
    """Deterministic bytes with NULs and invalid UTF-8 in them."""
    out = b""
    i = 0
    while len(out) < n:
        out += hashlib.sha256(str(i).encode()).digest()
        i += 1
    return b"\xff\xfe\x00" + out[: n - 3]


def foreign_sqlite(path: Path) -> None:
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT)")
    con.execute("INSERT INTO notes (text) VALUES ('not a store')")
    con.commit()
    con.close()


def make(token: str, folder: Path, store: Path) -> str:
    """The path `token` (`@kind[.ext]`, `@kind/name`) names, made in `folder`, as the command line gives it."""
    kind, _, rest = token[1:].partition("/")
    stem, dot, ext = kind.partition(".")
    name = f"{stem}{dot}{ext}"
    if stem in ("unreadable", "unreadable-dir", "unreadable-config", "readonly") and ROOT_USER:
        pytest.skip("root reads and writes past permission bits")
    p = folder / name
    if stem == "dir":
        p.mkdir()
    elif stem == "missing":
        pass
    elif stem == "empty":
        p.write_bytes(b"")
    elif stem == "random":
        p.write_bytes(random_bytes())
    elif stem == "text":
        p.write_text("hello\n")
    elif stem == "foreign":
        foreign_sqlite(p)
    elif stem == "damaged":
        p.write_bytes(b"SQLite format 3\x00" + random_bytes(4080))
    elif stem == "fifo":
        os.mkfifo(p)
    elif stem == "unreadable":
        p.write_text("batches: [1]\n")
        p.chmod(0)
    elif stem == "unreadable-dir":
        p.mkdir()
        (p / "config.json").write_text("{}")
        p.chmod(0)
    elif stem == "unreadable-config":
        p.mkdir()
        (p / "config.json").write_text('{"model_type": "bert"}')
        (p / "config.json").chmod(0)
    elif stem == "config-garbage":
        p.mkdir()
        (p / "config.json").write_bytes(random_bytes())
    elif stem == "huge":  # an integer of 5,000 digits: past what int() reads (4,300)
        number = "9" * 5000
        p.write_text({"yaml": f"batches: [{number}]\n", "json": f'{{"batches": [{number}]}}',
                      "toml": f"batches = [{number}]\n"}[ext])
    elif stem == "bad-date":  # YAML builds a date of it, and datetime refuses month 13
        p.write_text("name: 2024-13-01\n")
    elif stem == "long-store":  # a store whose name fits (252 bytes) and whose -journal file's does not
        name = "n" * 249 + dot + ext
        shutil.copy(store, folder / name)
    elif stem == "counts-bad":
        p.write_text("12\nabc\n")
    elif stem == "under-file":
        (folder / "plain").write_text("a file, not a folder\n")
        return f"plain/{rest}"
    elif stem == "under-missing":
        return f"no-such-folder/{rest}"
    elif stem == "readonly":
        (folder / "ro").mkdir(mode=0o500)
        return f"ro/{rest}"
    elif stem == "store":
        return "transbench.db"
    elif stem == "source":
        shutil.copy(store, p)
    elif stem == "long-name":  # one name of 300 bytes: over NAME_MAX (255), in a folder that exists
        return "n" * 300 + dot + ext
    elif stem == "fresh-long":  # a folder to make, and in it a name too long
        return "fresh/" + "n" * 300
    else:
        raise AssertionError(f"unknown path token {token}")
    return name


def expand(value: str, folder: Path, store: Path, ext: str = "json") -> str:
    value = value.replace("{ext}", ext)
    return re.sub(r"@[\w.-]+(?:/[\w.]+)?", lambda m: make(m.group(), folder, store), value)


def snapshot(folder: Path) -> dict[str, tuple]:
    """Every entry under `folder`: its type, permission bits and (files) a digest of its bytes. A FIFO is never
    read (that would block); an unreadable file is listed by its bits."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for n in dirnames + filenames:
            p = Path(dirpath, n)
            st = p.lstat()
            rel = str(p.relative_to(folder))
            if stat.S_ISREG(st.st_mode):
                try:
                    digest = hashlib.sha256(p.read_bytes()).hexdigest()
                except OSError:
                    digest = None
                out[rel] = ("file", stat.S_IMODE(st.st_mode), digest)
            else:
                out[rel] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode))
    return out


class Work(Exception):
    """The command got past its checks and started its work."""


def _work(*args, **kwargs):
    raise Work


# The first step of each command's work (after every check of its input): open_run makes the run in the store,
# run_cell launches another host's ranks, all_figures draws the report, environment asks the GPUs, _run_backend
# runs the demo's model.
WORK = ["transbench.scenarios.inference.run.open_run", "transbench.scenarios.serve.run.open_run",
        "transbench.runner.sweep.open_run", "transbench.scenarios.micro.run.open_run",
        "transbench.scenarios.training.spec.run_cell", "transbench.api.environment",
        "transbench.report.plots.all_figures", "transbench.demo._run_backend", "transbench.scenarios.serve.server.run"]
TUNE_WORK = "error: tune needs a CUDA GPU"  # tune's last check: on this CPU-only host, where it would start


def unblock(fifo: Path) -> threading.Thread:
    """A FIFO some code opened for reading would block it for ever: a writer that opens it and closes it at once
    hands that reader an end of file."""
    def writer():
        with suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY))

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    return thread


def release(fifo: Path, writer: threading.Thread) -> None:
    """The writer of unblock() still waits for a reader where nothing read the FIFO: be that reader."""
    while writer.is_alive():
        with suppress(OSError):
            os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
        writer.join(0.05)


# --- one case ---------------------------------------------------------------------------------------------------

FLAGS = {"--offline"}  # the flags of BASE: they take no value
EXT = {"--plot": "png", "--csv": "csv", "runs:--out": "yaml"}


def pairs(args: list[str]) -> list[tuple[str, object]]:
    """['a', '--model', 'x', '--offline'] -> [('', 'a'), ('--model', 'x'), ('--offline', True)]."""
    out, i = [], 0
    while i < len(args):
        if not args[i].startswith("--"):
            out.append(("", args[i]))
        elif args[i] in FLAGS:
            out.append((args[i], True))
        else:
            out.append((args[i], args[i + 1]))
            i += 1
        i += 1
    return out


def command_line(command: tuple[str, ...], key: str, kind: str, value: str) -> list[str]:
    """The command, its valid base and context options, and the swept one (tokens not yet made into paths)."""
    base = pairs(BASE[command])
    ctx = CONTEXT.get((*command, key), [])
    names = {o for o, _ in ctx} | {key}
    opts = [(o, v) for o, v in base if o and o not in names] + [(o, v) for o, v in ctx if v is not None]
    positional = [v for o, v in base if not o]
    if kind == "flag":
        opts.append((key + value, True))
    elif not key.startswith("-"):  # an argument
        if command == ("compare",):
            positional[0 if key == "run_a" else 1] = value
        else:
            positional = [value]
    else:
        opts.append((key, value))
    out = [*command, *positional]
    for o, v in opts:
        out += [o] if v is True else [o, v]
    return out


def choice(command: tuple[str, ...], key: str, value: str) -> str:
    v = VALID_CHOICE_BY_COMMAND.get((command[0], key)) or VALID_CHOICE.get(key, "x")
    return value.replace("{v}", v).replace("{V}", v.upper())


def cases():
    for command, cmd in COMMANDS.items():
        for key, annotation, flag in options(cmd):
            kind = kind_of(command, key, annotation, flag)
            for value in BATTERY.get(kind, []):
                yield command, key, kind, choice(command, key, value)


def case_id(case) -> str:
    command, key, kind, value = case
    shown = f"{value[:8]}...<{len(value)} chars>" if len(value) > 40 else ascii(value)[1:-1]
    return f"{' '.join(command)} {key} {shown}"


def run_case(folder: Path, store: Path, monkeypatch, command, key, kind, value):
    """Run one case in `folder` (the current folder by then); (outcome, result, snapshot before, after, argv):
    outcome is 'work' (accepted: its work began), 'done' (accepted: a reader that ran), 'refused' (exit 2) or
    'crash' (any other exception)."""
    shutil.copy(store, folder / "transbench.db")
    foreign_sqlite(folder / "other.sqlite")
    (folder / "notes.bin").write_bytes(random_bytes())
    monkeypatch.chdir(folder)
    ext = EXT.get(f"{command[0]}:{key}") or EXT.get(key, "json")
    argv = [expand(a, folder, store, ext) for a in command_line(command, key, kind, value)]
    monkeypatch.setattr("typer.testing._get_command", lambda _: CLI)
    for target in WORK:
        monkeypatch.setattr(target, _work)
    if command == ("tune",):  # past its GPU count, tune checks --device
        monkeypatch.setattr("transbench.measure.device.gpu_count", lambda: 1)
    fifos = {p: unblock(p) for p in folder.iterdir() if stat.S_ISFIFO(p.lstat().st_mode)}
    before = snapshot(folder)
    try:
        res = runner.invoke(app, argv)
    finally:
        for fifo, writer in fifos.items():
            release(fifo, writer)
    after = snapshot(folder)
    if isinstance(res.exception, Work) or (command == ("tune",) and res.stderr.startswith(TUNE_WORK)):
        outcome = "work"
    elif res.exception is None or isinstance(res.exception, SystemExit):
        outcome = "refused" if res.exit_code == 2 else "done"
    else:
        outcome = "crash"
    return outcome, res, before, after, argv


# --- what is rightly accepted ---------------------------------------------------------------------------------
# Every case of the sweep is refused but these, each with why it is not bad input. Keyed by (command, option,
# value); a new accepted value is a test failure until it is judged here.
WRITERS = "run|serve|train|micro gemm|micro bandwidth|micro layer|micro breakdown|micro collectives"
MICRO = "micro gemm|micro bandwidth|micro layer|micro breakdown|micro collectives"
_WHY = [
    (WRITERS, "--db", ["@empty.db", "@missing.db"],
     "a command that stores results starts a store in a missing or empty file (docs/results.md, The store; "
     "tests/test_store_guard.py: an empty file is no store to read, but a writer may start one)"),
    ("merge", "--into", ["@empty.db", "@missing.db"], "merge's target is a store it starts, as a writer's --db"),
    (WRITERS, "--name", [N], "a run name is text of any script: check_name (spec.py) refuses control characters, "
                             "an empty name, 'last' and a name over MAX_NAME characters only"),
    ("run|serve|train|server", "--seed", ["-1", "0"], "any 64-bit integer seeds the weights and tokens (a run with --seed -1 "
                                               "measured ok)"),
    ("run", "--seq-stdev", ["0", "1e-320"], "0 is the default (every sequence --seq long); a tiny stdev rounds to it"),
    ("run", "--seq-stdev", ["1e30"], "lengths are clipped to 1 and the model's positions (docs/options.md, run); see "
                                     "test_a_huge_seq_stdev_draws_lengths_at_both_ends"),
    ("run", "--min-time", ["0"], "0 or more (scenarios/inference/cells.py): --min-count calls are timed"),
    ("run|" + MICRO, "--min-time", ["1e-320"], "a positive time: --min-count calls (run), or one call (micro), are timed"),
    ("run|" + MICRO, "--min-time", ["1e30"], "the sampler stops at its cap (10,000 samples, or 120 s; micro 20 s) and "
                                             "the cell warns `short:` (docs/measurement.md)"),
    ("run|" + MICRO, "--warmup", ["0"], "no untimed calls: 0 or more"),
    ("run|serve|train", "--timeout", ["1e30"], "a deadline over 1e6 s is none (docs/options.md, shared options)"),
    ("run|train", "--timeout", ["1e-320"], "a positive deadline: every cell ends `timeout`, as asked"),
    ("serve|server", "--max-wait-ms", ["0", "1e-320"], "0 or more: a batch leaves at once"),
    ("server", "--served-model-name", [N], "a model name is text of any script (without spaces or control characters)"),
    ("serve", "--duration", ["1e-320"], "a positive duration: a short window, as asked"),
    ("serve|server", "--prepare-budget", ["0", "1e-320"], "0 or more seconds: a shape left runs a larger prepared "
                                                           "one, or is prepared on first use"),
    ("server", "--prepare-budget", ["1e30"], "every shape prepared before the server reports healthy: it has no "
                                             "deadline to fit"),
    ("serve", "--warmup", ["0", "1e-320"], "0 or more seconds of warm-up"),
    ("serve", "--slo-ms", ["1e30", "1e-320"], "a positive target: every request meets it, or none"),
    ("train", "--grad-ckpt", ["OFF"], "on/off words in any case (spec.py _scalar)"),
    ("train", "--compile", ["OFF"], "on/off words in any case (spec.py _scalar)"),
    ("train", "--nccl-p2p", ["ON"], "on/off words in any case (training.parse_bool)"),
    ("train", "--comm-timing", ["OFF"], "on/off words in any case (training.parse_bool)"),
    ("micro collectives", "--timeout", ["1e30", "1e-320"], "a positive deadline for each op's launch (1e30: none)"),
    ("train", "--lr", ["1e30", "1e-320"], "a positive learning rate; one whose loss diverges ends its cell `error` "
                                          "with the NaN loss (docs/train.md): a measured answer"),
    ("train", "--dropout", ["0", "1e-320"], "a probability in [0, 1): 0 is no dropout, as nanoGPT pretrains GPT-2"),
    ("train", "--node-rank", ["0"], "node 0 of --nnodes 2"),
    ("report", "--alpha", ["1e-320"], "between 0 and 1: an interval of almost 100% (compare refuses the runs: no pair "
                                      "of 5 + 5 samples gets a verdict at it, and a gate that judged nothing fails)"),
    ("report", "--min-effect", ["0", "1e-320"], "0 or more (docs/results.md, compare; compare refuses these runs at "
                                                "it: their 5 + 5 samples put no pair beyond or within a min effect of 0)"),
    ("demo", "--prompt", [LONG, N], "text: 10,000 letters are one WordPiece word ([UNK]), a digit a token"),
    ("micro gemm", "--model", ["", " "], "no model (docs/micro.md: `--model ''` for none); ' ' splits to the same "
                                         "empty list (',' is refused, as '1,,2' is: empty items between commas)"),
]
ACCEPTED = {(c, o, v): why for commands, o, values, why in _WHY for c in commands.split("|") for v in values}
# Valid values whose answer depends on the stored samples: at a min effect of 0, runs `a` and `b` (timed apart) get a
# verdict where all of one run's samples lie beyond the other's (exit 1), else none and a refusal (exit 2). The case
# failed about one run in four on a busy machine.
BY_THE_DATA = {("compare", "--min-effect", v): "no pair of cells got a verdict" for v in ("0", "1e-320")}


def why_accepted(command: tuple[str, ...], key: str, value: str) -> str | None:
    return ACCEPTED.get((" ".join(command), key, value))


# --- the tests ----------------------------------------------------------------------------------------------------

CASES = list(cases())


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """A store with runs `a` and `b` (one bert-tiny cell each): each case's default --db is a copy of it."""
    path = tmp_path_factory.mktemp("store") / "transbench.db"
    for name in ("a", "b"):
        res = runner.invoke(app, ["run", *BASE[("run",)], "--name", name, "--db", str(path)])
        assert res.exit_code == 0, res.output
    assert not Path(f"{path}-wal").exists()  # every cell is in the file a case copies
    return path


def shown(argv: list[str]) -> str:
    return " ".join(a if len(a) <= 60 else f"{a[:20]}...<{len(a)} chars>" for a in argv)


def test_every_option_of_every_command_is_swept():
    """A new command needs its valid base options (BASE), a new text option its kind (CLASSES): until then this
    fails, so nothing is left out of the sweep without a word."""
    assert set(COMMANDS) <= set(BASE), sorted(set(COMMANDS) - set(BASE))
    missing = [f"{' '.join(c)} {key}" for c, cmd in COMMANDS.items() for key, annotation, flag in options(cmd)
               if BATTERY.get(kind_of(c, key, annotation, flag)) is None]
    assert not missing, f"give these a kind in CLASSES: {missing}"
    swept = {(" ".join(c), k, v) for c, k, _, v in CASES}
    assert not set(ACCEPTED) - swept, sorted(set(ACCEPTED) - swept)  # no entry outlives its case


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_a_bad_value_is_one_line_exit_2_and_changes_nothing(case, store, tmp_path, monkeypatch):
    command, key, kind, value = case
    folder = tmp_path / "cwd"
    folder.mkdir()
    outcome, res, before, after, argv = run_case(folder, store, monkeypatch, *case)
    line = shown(argv)
    assert outcome != "crash", f"{line}: {res.exception!r}"
    assert "Traceback" not in res.stdout + res.stderr, line
    refusal = BY_THE_DATA.get((" ".join(command), key, value))
    if refusal:
        assert outcome == "done" or (outcome == "refused" and refusal in res.stderr), f"{line}: {res.stderr!r}"
        return
    why = why_accepted(command, key, value)
    if why:
        assert outcome in ("work", "done"), f"{line} is valid ({why}), and was refused: {res.stderr}"
        return
    assert outcome == "refused", (f"{line} was accepted (exit {res.exit_code}): refuse it, or say in ACCEPTED why it "
                                  "is valid")
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), f"{line}: {res.stderr!r}"
    changed = sorted((set(before) ^ set(after)) | {k for k in before if k in after and before[k] != after[k]})
    assert not changed, f"{line} changed {changed}"


def test_a_huge_seq_stdev_draws_lengths_at_both_ends():
    """`--seq-stdev 1e30` is accepted (clipped to the model's positions), and drew every length 1: a draw past
    int64 was cast before it was clipped."""
    import torch

    from transbench.scenarios.inputs import draw_lengths

    assert set(draw_lengths(64, 8, 1e30, 128, seed=0)) == {1, 128}
    cast_first = torch.normal(8.0, 3.0, (8,), generator=torch.Generator().manual_seed(0)).round().long().clamp(1, 128)
    assert draw_lengths(8, 8, 3.0, 128, seed=0) == cast_first.tolist()  # within int64: the lengths drawn before


def test_runs_out_without_spec_writes_json_only(store, tmp_path, monkeypatch):
    """`runs --out x.yaml` without --spec listed the runs and wrote nothing, exit 0; --out alone writes every stored
    run as the JSON record, and only to a .json file."""
    shutil.copy(store, tmp_path / "transbench.db")
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["runs", "--out", "x.yaml"])
    assert res.exit_code == 2 and res.stderr.startswith("error: --out x.yaml: without --spec"), res.output
    assert not (tmp_path / "x.yaml").exists()


@pytest.mark.slow
def test_real_processes_exit_2_with_one_line(store, tmp_path):
    """The same contract outside CliRunner: the installed entry point's exit code and stderr."""
    long_store = tmp_path / ("n" * 249 + ".db")  # its -journal file's name is past 255 bytes
    shutil.copy(store, long_store)
    before = long_store.read_bytes()
    commands = [["runs", "--db", long_store.name],
                ["micro", "gemm", "--device", "cpu", "--sizes", "64,,128", "--db", "m.db"],
                ["run", "--spec", LONG, "--db", "r.db"]]
    procs = [subprocess.Popen([sys.executable, "-m", "transbench", *c], cwd=tmp_path, text=True,  # conftest's PYTHONPATH
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for c in commands]
    for c, p in zip(commands, procs):
        out, err = p.communicate(timeout=120)
        assert p.returncode == 2, (shown(c), out, err)
        assert len(err.splitlines()) == 1 and err.startswith("error: ") and "Traceback" not in out + err, err
    assert long_store.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [long_store.name]


@pytest.mark.slow
@pytest.mark.skipif(not ROOT_USER or shutil.which("unshare") is None, reason="not root, or no unshare")
def test_the_permission_cases_as_another_user(tmp_path):
    """Root reads and writes past permission bits, so the sweep's unreadable and read-only cases skip under root. Here
    they run as uid 1000 of a user namespace (where the files root owns are that user's and the bits hold): a
    checkpoint folder that could not be read was a PermissionError traceback in every command taking --model."""
    ns = ["unshare", "--user", "--map-user=1000", "--map-group=1000"]
    if subprocess.run([*ns, "true"], capture_output=True, timeout=60).returncode != 0:
        pytest.skip("user namespaces are not available here")
    res = subprocess.run([*ns, sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", __file__,
                          "-k", "unreadable or readonly", f"--basetemp={tmp_path / 'as-user'}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    summary = res.stdout.strip().splitlines()[-1]
    assert "passed" in summary and "skipped" not in summary, summary
