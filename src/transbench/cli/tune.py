"""`transbench tune`: the fused engine's kernel routes tuned ahead of time, so that a serving process starts warm."""

from __future__ import annotations

from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from .. import api
from ..spec import split_list
from .app import app, friendly
from .tables import console, visible


@app.command()
@friendly
def tune(
    model: str = typer.Option(..., "--model", "-m", help="preset or local bert/gpt2 checkpoint folder"),
    batch: str = typer.Option("1,8,64,256", help="batch sizes (comma-separated)"),
    seq: str = typer.Option("128,384,512", help="sequence lengths (comma-separated)"),
    dtype: str = typer.Option("fp16", help="fp16|bf16|fp8"),
    device: str = typer.Option("auto", help="auto|cuda|cuda:N"),
    cache_dir: Optional[str] = typer.Option(
        None, help="folder of the tuning table (engine-tuning.json); default $TRANSBENCH_CACHE_DIR or ~/.cache/transbench"),
) -> None:
    """Tune the fused engine for a batch x seq grid, with no time budget, into the on-disk tuning table."""
    # A folder's name or an error's text may hold rich markup ("[/bold]" raised a MarkupError after the tuning)
    t = Table(title=escape(visible(f"tuned {model} {dtype}")))
    for col in ("batch", "seq", "seconds", "ops tuned", "races won"):
        t.add_column(col, justify="right")

    def show(row: dict) -> None:
        console.print(f"batch {row['batch']} x seq {row['seq']}: {row['seconds']:.1f} s", markup=False)
        for r in row["races"]:  # what the whole-forward trials tried, so a surprising choice can be traced
            result = r.get("error") or f"{r['trial_ms']:.4f} ms against {r['best_ms']:.4f}{', won' if r['won'] else ''}"
            console.print(visible(f"  race ({r['trial']}) {', '.join(f'{op}: {n}' for op, n in r['routes'].items())}: "
                                  f"{result}"), markup=False, highlight=False)
        won = sum(bool(r.get("won")) for r in row["races"])
        t.add_row(str(row["batch"]), str(row["seq"]), f"{row['seconds']:.1f}", str(row["routes"]),
                  f"{won}/{len(row['races'])}")

    api.tune(model, split_list(batch, int), split_list(seq, int), dtype, device, cache_dir, progress=show)
    console.print(t)
