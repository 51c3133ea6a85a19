"""`transbench env`, `runs` and `merge`: what is there, and what was measured."""

from __future__ import annotations

import json
from typing import Optional

import typer
from rich.table import Table

from .. import api
from ..spec import RunSpec, dump_file
from .app import app, fail, friendly
from .tables import console


@app.command()
def env(as_json: bool = typer.Option(False, "--json", help="print JSON"),
        db: str = typer.Option("transbench.db", help="SQLite store whose `micro gemm`/`micro bandwidth` runs give the measured ceilings")) -> None:
    """GPUs, driver, clocks, power limit, library versions, datasheet peaks and measured ceilings."""
    from ..scenarios.micro import measured_ceilings

    info = api.environment()
    for g in info["gpus"]:
        g["measured"] = measured_ceilings(db, g["name"])
    if as_json:
        typer.echo(json.dumps(info, indent=1, default=str))
        return
    t = Table(title="environment", show_header=False)
    for k in ("python", "platform", "torch", "transformers", "triton", "cuda", "cudnn", "driver"):
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
        cpu = measured_ceilings(db, "cpu")
        if cpu:
            console.print("measured on this store's CPU runs: " + ", ".join(f"{k} {v:.4g}" for k, v in cpu.items()))


@app.command()
@friendly
def runs(db: str = typer.Option("transbench.db", help="SQLite store"),
         spec: Optional[str] = typer.Option(None, "--spec", help="write this run's spec (name or id) as YAML/TOML"),
         out: str = typer.Option("-", help="where --spec writes: a .yaml/.toml path, or - for stdout")) -> None:
    """Stored runs; with --spec RUN, that run's full spec, to repeat it with `run --spec`."""
    rows = api.runs(db)
    if spec:
        match = [r for r in rows if spec in (r["run_id"], r["name"])] or (rows[-1:] if spec == "last" else [])
        if not match:
            fail(f"no run {spec} in {db}: `transbench runs` lists them")
        s = RunSpec.from_dict(match[0]["spec"]) if match[0]["kind"] == "inference" else None
        if s is None:
            typer.echo(json.dumps(match[0]["spec"], indent=1))
        elif out == "-":
            import yaml

            typer.echo(yaml.safe_dump({k: v for k, v in s.to_dict().items() if v is not None}, sort_keys=False))
        else:
            dump_file(s, out)
            typer.echo(f"wrote {out}")
        return
    t = Table(title=f"runs in {db}")
    for col in ("name", "run_id", "kind", "created", "cells", "gpu"):
        t.add_column(col)
    for r in rows:
        gpus = r["env"].get("gpus") or []
        t.add_row(r["name"], r["run_id"], r["kind"], r["created"], str(r["cells"]), gpus[0]["name"] if gpus else "cpu")
    console.print(t)


@app.command()
@friendly
def merge(sources: list[str] = typer.Argument(..., help="stores to join"),
          into: str = typer.Option("transbench.db", "--into", help="the store to merge into")) -> None:
    """Join stores (the shards of one sweep, run on several hosts) without duplicate cells."""
    r, c = api.merge(into, sources)
    typer.echo(f"merged into {into}: {r} new run(s), {c} new cell(s)")
