"""`transbench report` and `transbench compare`: what the stored runs say, and whether a change is real."""

from __future__ import annotations

import errno
import os
import sys
from contextlib import contextmanager
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from ..errors import SpecError
from .app import app, fail, friendly, stdout_to_devnull
from .tables import console, visible

VERDICT_STYLE = {"slower": "bold red", "broken": "bold red", "faster": "bold green", "fixed": "green"}
# `compare`'s exit where its table or document could not be written to stdout (a full disk, an I/O error): 1 is the
# gate's "regression" and 2 its refusal of the input, and the comparison was neither.
OUTPUT_FAILED = 3
# Errors of stdout itself, not of the comparison (as cli/__init__.py's _OUTPUT_ERRORS)
STDOUT_ERRORS = frozenset({errno.EPIPE, errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO})


@contextmanager
def judged_output(failed: bool):
    """Print a comparison whose verdict is known; end with its exit code (1: a regression) whatever stdout does.
    Everything printed is flushed here, inside the command: a write error surfaced at the interpreter's last flush
    (cli/__init__.py main) as exit 1, and a CI gate read a full disk, or a `| head -1` that had read its line, as a
    regression. A reader gone (EPIPE) asked for no more: no word, the verdict's exit. Another write error: one line
    and exit OUTPUT_FAILED."""
    try:
        yield
        sys.stdout.flush()
    except OSError as exc:
        if exc.errno not in STDOUT_ERRORS:
            raise
        stdout_to_devnull()
        if exc.errno != errno.EPIPE:
            typer.echo(f"error: cannot write the comparison to stdout ({exc.strerror or exc}): free some space or "
                       f"write it elsewhere (exit {OUTPUT_FAILED}: no verdict was given)", err=True)
            raise typer.Exit(OUTPUT_FAILED)
    if failed:
        raise typer.Exit(1)


@app.command()
@friendly
def report(
    runs: Optional[list[str]] = typer.Argument(None, help="run names or ids, or 'last' (default: the newest run)"),
    out: str = typer.Option("report", "--out", "-o", help="folder for report.md, report.html and the PNG plots"),
    db: str = typer.Option("transbench.db", help="SQLite store"),
    baseline: Optional[str] = typer.Option(None, help="backend for speedup and memory saved "
                                                      "(default: the run's --baseline, else eager)"),
    compare: Optional[bool] = typer.Option(None, "--compare/--no-compare",
                                           help="compare the first run with each other one (default: on when "
                                                "two or more runs are given)"),
    alpha: Optional[float] = typer.Option(None, show_default="0.05", help="significance level of the comparison"),
    min_effect: Optional[float] = typer.Option(None, show_default="0.03",
                                               help="smallest latency change that counts (0.03 = 3%)"),
) -> None:
    """Write report.md, PNG plots and a self-contained report.html for one or more stored runs."""
    from ..errors import SpecError
    from ..api import CompareConfig, build_report

    # Both only shape the comparison: a report of one run (or --no-compare) ignored them without a word.
    comparing = compare if compare is not None else len(runs or []) > 1
    for option, value in (("--alpha", alpha), ("--min-effect", min_effect)):
        if value is not None and not comparing:
            raise SpecError(f"{option} applies to the comparison of two runs, and this report compares none: "
                            "give two runs (transbench report A B), or leave it out")
    alpha = 0.05 if alpha is None else alpha
    min_effect = 0.03 if min_effect is None else min_effect

    paths = build_report(db, runs or ["last"], out, baseline, compare_runs=compare,
                         config=CompareConfig(alpha, min_effect))
    console.print(visible(f"wrote {paths.markdown}, {paths.html} and {len(paths.figures)} plot(s) in {paths.out_dir}"),
                  markup=False, highlight=False)
    for failure in paths.plot_failures:
        console.print(visible(f"warning: {failure}"), style="yellow", markup=False, highlight=False)
    for cmp in paths.comparisons:
        console.print(visible(cmp.summary()), highlight=False, markup=False)


@app.command()
@friendly
def compare(
    run_a: str = typer.Argument(..., help="the reference run (name, id or 'last')"),
    run_b: str = typer.Argument(..., help="the run to judge against it"),
    db: str = typer.Option("transbench.db", help="SQLite store"),
    alpha: float = typer.Option(0.05, help="1 - the level of the B/A interval (0.05 = 95%)"),
    min_effect: float = typer.Option(0.03, help="smallest latency change that counts (0.03 = 3%)"),
    json_path: Optional[str] = typer.Option(None, "--json", help="also write the comparison as JSON (the versioned "
                                                                 "record's `comparison` kind); - for stdout"),
    markdown: Optional[str] = typer.Option(None, "--markdown", help="also write it as markdown, for a CI step "
                                                                   "summary ($GITHUB_STEP_SUMMARY): added at the "
                                                                   "end of an existing file; - for stdout"),
    github_benchmark: Optional[str] = typer.Option(None, "--github-benchmark", help="also write B's cells for "
                                                   "github-action-benchmark (tool: customSmallerIsBetter)"),
) -> None:
    """Per-cell latency ratio B/A with an interval (over block medians; an exact rank interval for few samples;
    over repeats where both runs have them). Exit 0: no regression; 1: a cell got slower, broke or is missing in B;
    2: the input was refused; 3: stdout could not be written."""
    import json

    from ..api import CompareConfig
    from ..api import compare_runs
    from ..api import (comparison_document, comparison_markdown, github_benchmark_export as benchmark_entries,
                       refusal_markdown)
    from ..api import export

    outputs = {"--json": json_path, "--markdown": markdown, "--github-benchmark": github_benchmark}
    files = {o: p for o, p in outputs.items() if p is not None and p != "-"}
    if github_benchmark == "-" or list(outputs.values()).count("-") > 1:
        fail("- (stdout) takes one of --json and --markdown; --github-benchmark writes a file")
    # What each writes (store/export.py KINDS): a file already there is replaced only when it is one of those, and
    # the markdown is appended, as a step summary expects ($GITHUB_STEP_SUMMARY holds the job's earlier steps').
    writes = {"--json": "json", "--github-benchmark": "benchmark"}
    # A file an earlier compare wrote at --json or --github-benchmark stays as it was when this one is refused (each
    # is replaced only whole, once the runs are judged): the refusal's line names it, as a CI step that read it after
    # a refusal (`compare ... || true`) took a comparison of other runs for this one's.
    kept = [f"{o} {p}" for o, p in files.items() if o in writes and os.path.isfile(p) and os.path.getsize(p)
            and export.ours(p, writes[o])]
    kept_note = (f" (nothing was written: {' and '.join(kept)} still hold{'s' if len(kept) == 1 else ''} an earlier "
                 "compare's output)" if kept else "")
    try:
        for option, path in files.items():
            export.check_output(path, option, db, writes=writes.get(option), append=option == "--markdown")
        for i, (option, path) in enumerate(files.items()):
            for other, before in list(files.items())[:i]:
                if os.path.realpath(path) == os.path.realpath(before):
                    raise SpecError(f"{other} and {option} both write {path}: give them different files")
        try:
            cmp = compare_runs(db, run_a, run_b, CompareConfig(alpha, min_effect))
        except SpecError as exc:
            if "--markdown" in files:
                with export.writing(files["--markdown"]):
                    export.append_text(files["--markdown"], refusal_markdown(visible(str(exc) + kept_note)))
            raise
    except SpecError as exc:
        if kept_note:
            raise SpecError(str(exc) + kept_note) from None
        raise

    def strict(doc) -> str:  # JSON a CI's parser reads: an undefined figure is null, never a bare NaN
        return json.dumps(export.finite_json(doc), indent=1, default=str, allow_nan=False) + "\n"

    texts = {"--json": lambda: strict(comparison_document(cmp)),
             "--markdown": lambda: comparison_markdown(cmp),
             "--github-benchmark": lambda: strict(benchmark_entries(cmp))}
    for option, path in files.items():
        with export.writing(path):
            (export.append_text if option == "--markdown" else export.write_text)(path, texts[option]())
    stdout = next((o for o, p in outputs.items() if p == "-"), None)
    if stdout is not None:  # the document alone on stdout, for a pipe; the gate's exit code as always
        with judged_output(cmp.failed):
            typer.echo(texts[stdout](), nl=False)
        return
    with judged_output(cmp.failed):
        print_comparison(cmp)


def print_comparison(cmp) -> None:
    """The comparison's tables and summary line on stdout."""
    from ..api import comparison_table, unmatched_table

    # A CI log or a narrow terminal: every value whole within 100 columns (long text folds, never "...").
    width = min(console.width, 100)
    for doc in (comparison_table(cmp), unmatched_table(cmp)):
        if doc is None:
            continue
        t = Table(title=escape(visible(doc.title)))
        for header in doc.headers:
            right = header in ("A ms", "B ms", "B/A")
            t.add_column(header, justify="right" if right else "left", overflow="fold", no_wrap=right)
        for row in doc.rows:
            t.add_row(*[f"[{VERDICT_STYLE[v]}]{v}[/]" if v in VERDICT_STYLE and h == "verdict" else escape(visible(v))
                        for h, v in zip(doc.headers, row)])
        console.print(t, width=width)
    console.print(visible(cmp.summary()), highlight=False, markup=False, width=width)
