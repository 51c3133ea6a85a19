"""`transbench demo`: a prompt through a real tokenizer and a model, per backend, logits out."""

from __future__ import annotations

from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from ..api import format_prob, run_demo
from ..spec import split_list
from .app import app, friendly
from .tables import console


@app.command()
@friendly
def demo(
    prompt: str = typer.Option(..., help="text to run; with [MASK] in it an MLM model predicts that token"),
    model: Optional[str] = typer.Option(None, "--model", "-m",
                                        help="checkpoint folder or preset (default: the packaged all-MiniLM-L6-v2 BERT)"),
    backend: str = typer.Option("eager", "--backend", "-b", help="backends to run and compare (comma-separated)"),
    device: str = typer.Option("auto", help="auto|cpu|cuda|cuda:N"),
    dtype: str = typer.Option("fp32", help="fp32|tf32|fp16|bf16"),
) -> None:
    """Tokenize a prompt, run it through the model with each backend, print tokens, outputs and differences."""
    result = run_demo(prompt, model, split_list(backend), device, dtype)
    console.print(f"model [bold]{escape(result.model)}[/] ({result.task}, "
                  f"{'random weights' if result.random_weights else 'checkpoint weights'}), {len(result.tokens)} tokens")
    console.print(" ".join(f"{escape(t)}[dim]:{i}[/]" for t, i in zip(result.tokens, result.input_ids)),
                  highlight=False)
    for note in result.notes:
        console.print(f"[yellow]note:[/] {note}")
    for out in result.outputs:
        if out.error:
            console.print(f"{escape(out.backend)}: [red]not run[/] ({escape(out.error)})", highlight=False)
    first = result.first()
    if first is None:
        return
    console.print(f"output of {first.backend}: shape {tuple(first.output.shape)}, "
                  f"mean {first.output.mean():.5f}, std {first.output.std():.5f}")
    emb = result.sentence_embedding()
    if emb is not None:
        console.print("sentence embedding (mean-pooled, L2-normalized), first 8 of "
                      f"{emb.numel()}: " + " ".join(f"{v:+.4f}" for v in emb[:8].tolist()))
        console.print("last hidden state, token 0, first 8: " +
                      " ".join(f"{v:+.4f}" for v in first.output[0, 0, :8].tolist()))
    for pos, top in result.predictions():
        where = "next token" if result.task == "causal-lm" else f"[MASK] at {pos}"
        console.print(f"{where}: " + ", ".join(f"{t} {format_prob(p)}" for t, p in top), highlight=False, markup=False)
    diffs = result.differences()
    if diffs:
        table = Table(title="differences between backends")
        for col in ("reference", "backend", "max abs diff", "relative diff"):
            table.add_column(col)
        for a, b, mx, rel in diffs:
            table.add_row(a, b, f"{mx:.3e}", f"{rel:.3e}")
        console.print(table)
