"""`transbench models`: the presets with their shapes, and what runs for each family."""

from __future__ import annotations

from rich import box
from rich.table import Table

from ..api import backend_registry, family_reason
from ..api import build
from ..api import PRESETS
from .app import app, friendly
from .tables import console


@app.command()
@friendly
def models() -> None:
    """Model presets (random weights, published shapes) and the tasks and backends each family runs."""
    t = Table(title="presets (random weights; shapes from each checkpoint's config.json)", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1, 0, 0))
    for col in ("preset", "family", "layers", "hidden", "heads", "kv", "ffn", "vocab", "max seq", "params"):
        t.add_column(col, justify="left" if col in ("preset", "family") else "right")
    for p in PRESETS.values():
        params = build.param_count(p)
        t.add_row(p.name, p.family, str(p.layers), str(p.hidden), str(p.heads), str(p.kv), str(p.intermediate),
                  str(p.vocab), str(p.max_positions), f"{params / 1e6:.1f}M")
    console.print(t)
    f = Table(title="what runs for each family", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1, 0, 0))
    for col in ("family", "kind", "tasks", "backends"):
        f.add_column(col)
    reg = backend_registry()
    for family in dict.fromkeys(p.family for p in PRESETS.values()):
        cannot = [b.name for b in reg.values() if family_reason(b, family)]
        forced = [n for n in reg if n.startswith("sdpa-")]
        if forced and set(forced) <= set(cannot):  # one entry for the forced SDPA kernels
            cannot = [n if n != forced[0] else "sdpa-*" for n in cannot if n not in forced[1:]]
        lacks = [t for t in build.TASKS if t not in build.family_tasks(family)]
        f.add_row(family, "decoder" if build.is_decoder(family) else "encoder",
                  f"all but {', '.join(lacks)}" if lacks else "all", f"all but {', '.join(cannot)}" if cannot else "all")
    console.print(f)
    console.print("A local checkpoint folder of any family transformers ships runs too: --model PATH",
                  soft_wrap=False)
    # Found only when a capture is tried (backends/cudagraph.py capture_refusal), so not in the table above.
    console.print("cudagraph: a model whose forward torch refuses to capture (deberta-v2 copies a CPU\n"
                  "tensor on every call) is `unsupported`, with torch's reason", soft_wrap=False)
