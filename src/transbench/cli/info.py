"""`transbench env`, `runs` and `merge`: what is there, and what was measured."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from .. import api, boundary
from ..scenarios.inference.spec import RunSpec
from ..spec import dump_text
from ..api import export
from ..errors import SpecError
from .app import app, fail, friendly
from .tables import Col, console, fitted, visible

# A run name wraps rather than being cut; the GPU and the time it was created go first on a narrow terminal.
# merge prints the first of the cells stored twice with other results, and how many more.
MAX_DIFFERING = 10
RUNS_COLUMNS = [Col("name", "name", left=True), Col("run_id", "run id", left=True), Col("kind", "kind", rank=3, left=True),
                Col("created", "created", rank=1, left=True), Col("cells", "cells", rank=4),
                Col("gpu", "gpu", rank=2, left=True)]


def _first_gpu(env: dict) -> str:
    """The run's first GPU by name (the store checks its type: an object named by text, or a bare name)."""
    first = (env.get("gpus") or ["cpu"])[0]
    return first if isinstance(first, str) else str(first.get("name", "?"))


@app.command()
@friendly
def env(as_json: bool = typer.Option(False, "--json", help="print JSON"),
        db: Optional[str] = typer.Option(None, help="SQLite store whose `micro gemm`/`micro bandwidth` runs give "
                                                    "the measured ceilings (default: transbench.db when there)")) -> None:
    """GPUs, driver, clocks, power limit, library versions, datasheet peaks and measured ceilings."""
    from ..api import measured_ceilings
    from ..api import Store

    given = db is not None
    if not given:
        db = "transbench.db"  # no store there yet: the datasheet peaks alone
    else:
        Store(db, readonly=True).close()  # a --db given must be a store: a missing or foreign one is refused

    info = api.environment()
    try:
        for g in info["gpus"]:
            g["measured"] = measured_ceilings(db, g["name"])
        if not info["gpus"]:  # the CPU's, as the table prints them: --json left them out
            info["cpu_measured"] = measured_ceilings(db, "cpu")
    except SpecError as exc:
        if given:
            raise
        # env describes the machine; ./transbench.db is only looked in, as a folder of that name is skipped. A
        # stray file there (empty, another program's, damaged) refused the whole command, exit 2: it is named
        # in one note on stderr (--json's stdout stays JSON), and the datasheet peaks are shown alone.
        typer.echo(f"note: measured ceilings left out: {exc}", err=True)
        for g in info["gpus"]:
            g["measured"] = {}
        if not info["gpus"]:
            info["cpu_measured"] = {}
    if as_json:
        typer.echo(json.dumps(info, indent=1, default=str))
        return
    t = Table(title="environment", show_header=False)
    for k in ("python", "platform", "hostname", "cpu_model", "cpu_threads", "load_avg", "git_commit", "torch",
              "transformers", "triton", "cuda", "cudnn", "driver"):
        t.add_row(k, str(info.get(k)))
    t.add_row("GPUs", str(len(info["gpus"])))
    console.print(t)
    for g in info["gpus"]:
        gt = Table(title=f"GPU {g['index']}: {g['name']}", show_header=False)
        for k, v in g.items():
            if k not in ("index", "name", "peak", "measured"):
                gt.add_row(k, str(v))
        peak = g.get("peak")
        gt.add_row("datasheet peak", "unknown device: MFU stays empty" if peak is None else
                   f"{peak['gpu']}: " + ", ".join(f"{d} {v:g} TFLOPS" for d, v in peak["tflops"].items())
                   + f", {peak['bandwidth_gbs']:g} GB/s")
        for k, v in (g.get("measured") or {}).items():
            gt.add_row(f"measured {k}", f"{v:.4g}")
        console.print(gt)
    if not info["gpus"]:
        console.print("no CUDA GPU visible: benchmarks run on the CPU")
        if info["cpu_measured"]:
            console.print("measured on this store's CPU runs: "
                          + ", ".join(f"{k} {v:.4g}" for k, v in info["cpu_measured"].items()))


SPEC_SUFFIXES = (".yaml", ".yml", ".toml", ".json")  # what spec.load_file reads


@app.command()
@friendly
def runs(db: str = typer.Option("transbench.db", help="SQLite store"),
         spec: Optional[str] = typer.Option(None, "--spec", help="write this run's spec (name or id) as YAML/TOML"),
         out: str = typer.Option("-", help="where --spec writes: a .yaml, .toml or .json path, or - for stdout "
                                           "(the text a .yaml file gets); "
                                           "without --spec, a .json file for every stored run as the JSON record")) -> None:
    """Stored runs; with --spec RUN, that run's spec, for its own command's --spec (run, serve, train, micro KIND);
    with --out FILE.json alone, every stored run and its cells as the versioned JSON record."""
    # Both listed every run instead, exit 0: `--spec ''` as if it were not given, `--out` without --spec unused.
    if spec is not None and not spec.strip():
        fail("--spec is empty: give a run's name or id (`transbench runs` lists them), or leave --spec out")
    if spec is None and out != "-":
        # every stored run as the versioned record (the --json of the commands that made them)
        # a folder is told of a .json file in it: `runs --out o` was told of o/spec.yaml (--spec's), refused here
        export.check_output(out, "--out", db, writes=export.RUNS_OUT, example="runs.json")
        if Path(out).suffix != ".json":
            fail(f"--out {out}: without --spec, --out writes every stored run as the JSON record: end the name in "
                 ".json (or add --spec RUN to write that run's spec)")
        rows = api.runs(db)
        export.write_record(api.records(db), rows, out)
        typer.echo(f"wrote {out} ({len(rows)} run(s))")
        return
    if spec and out != "-":
        export.check_output(out, "--out", db, writes=export.RUNS_OUT)
        # the suffix picks the format, and --spec reads only these: `--out spec.txt` wrote YAML no command reads back
        if Path(out).suffix not in SPEC_SUFFIXES:
            fail(f"--out {out}: end the file name in .yaml, .yml, .toml or .json (the formats --spec reads), or give "
                 "- for stdout")
    rows = api.runs(db)
    if spec:
        # as Store.find_run: 'last' the newest, else a name before another run's id (a name may look like one)
        match = (rows[-1:] if spec == "last" else
                 [r for r in rows if r["name"] == spec] or [r for r in rows if r["run_id"] == spec])
        if not match:
            fail(f"no run '{spec}' in {db}: `transbench runs` lists them")  # quoted, as compare and report say it
        try:
            s = RunSpec.from_dict(match[0]["spec"]) if match[0]["kind"] == "inference" else None
        except SpecError as exc:  # said in a spec file's words ("batches: expected a list"), as if the user wrote it
            fail(f"store {db} is damaged: the spec of run {match[0]['name']!r} does not read back ({exc}): restore it "
                 "from a copy, or give another --db")
        stored = api.spec_file(match[0])
        if not boundary.is_utf8(json.dumps(stored, ensure_ascii=False)):
            # a setting given in bytes that are not UTF-8, stored before spec.coerce refused it: the TOML written from
            # it (a lone surrogate's escape) was refused by the --spec it was written for
            fail(f"store {db} is damaged: the spec of run {match[0]['name']!r} does not read back (a setting holds "
                 "text that is not UTF-8): restore it from a copy, or write the spec by hand")
        # a training, serve or micro run's spec too: --out was ignored for them (JSON on stdout, no file, exit 0).
        # stdout gets the text a .yaml file gets, mark included: printed without it (and a serve, train or micro
        # spec as JSON), `runs --spec X > s.yaml` given to another command's --spec was refused key by key instead
        # of in one line naming the command it belongs to (cli/options.py build_spec reads the mark).
        suffix = Path(out).suffix if out != "-" else ".yaml"
        text = dump_text(s or stored, suffix)
        if suffix != ".json":
            # YAML and TOML take a comment: the mark that tells a rerun this file is ours to replace (a spec
            # the user wrote by hand is refused, store/export.py ours); JSON has none, and is told by its shape.
            text = export.spec_mark(match[0]["name"], match[0]["kind"]) + "\n" + text
        if out == "-":
            typer.echo(text, nl=False)
            return
        with export.writing(out):  # whole, or the file as it was (a full disk, Ctrl-C)
            export.write_text(out, text)
        typer.echo(f"wrote {out}")
        return
    listed = [{**r, "gpu": _first_gpu(r["env"])} for r in rows]
    console.print(fitted(listed, RUNS_COLUMNS, f"runs in {db}", console.width, notes_from=None))


@app.command()
@friendly
def merge(sources: list[str] = typer.Argument(..., help="stores to join"),
          into: str = typer.Option("transbench.db", "--into", help="the store to merge into")) -> None:
    """Join stores (the shards of one sweep, run on several hosts) without duplicate cells."""
    merged = api.merge(into, sources)
    typer.echo(f"merged into {into}: {merged.runs} new run(s), {merged.cells} new cell(s)")
    for line in merged.differing[:MAX_DIFFERING]:
        console.print(visible(f"warning: {line}"), style="yellow", markup=False, highlight=False)
    if len(merged.differing) > MAX_DIFFERING:
        console.print(f"warning: and {len(merged.differing) - MAX_DIFFERING} more cell(s) stored with other results",
                      style="yellow", markup=False, highlight=False)
