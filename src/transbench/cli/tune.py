"""`transbench tune`: the fused engine's kernel routes tuned ahead of time, so that a serving process starts warm."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from .. import api
from ..scenarios.tune.spec import TuneSpec
from .app import app, declared_command
from .options import build_spec
from .tables import console, visible


@declared_command(app, TuneSpec)
def tune(given: dict) -> None:
    """Tune the fused engine for a batch x seq grid, with no time budget, into the on-disk tuning table."""
    # A folder's name or an error's text may hold rich markup ("[/bold]" raised a MarkupError after the tuning)
    spec = build_spec(TuneSpec, None, given)
    t = Table(title=escape(visible(f"tuned {spec.model} {spec.dtype}")))
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

    api.tune(spec.model, spec.batches, spec.seqs, spec.dtype, spec.device, spec.cache_dir, progress=show)
    console.print(t)
