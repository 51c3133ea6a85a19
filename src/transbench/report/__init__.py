"""Reports of stored runs (markdown tables, PNG plots, a self-contained HTML page) and run-to-run
comparison with a statistical verdict.

    from transbench.report import build_report, compare
    paths = build_report("transbench.db", ["last"], "report/")
    cmp = compare("transbench.db", "before", "after")   # cmp.failed gates a pipeline
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..errors import SpecError
from .compare import (CompareConfig, Comparison, compare, compare_records, comparison_table, nothing_compared,
                      unmatched_table)
from .document import Figure, Section, to_markdown

__all__ = ["ReportPaths", "build_report", "compare", "CompareConfig", "Comparison"]


@dataclass
class ReportPaths:
    out_dir: Path
    markdown: Path
    html: Path
    figures: list[Figure] = field(default_factory=list)
    comparisons: list[Comparison] = field(default_factory=list)
    plot_failures: list[str] = field(default_factory=list)

    @property
    def plots(self) -> list[Path]:
        return [f.path for f in self.figures]


# What a report writes in its folder (glob pattern -> the kind of file, store/export.py KINDS): the plots' names
# are plots.py's and serve.py's. An existing file of these names is replaced, so each must be one a report wrote
# (not a user's notes in report.md, nor a SQLite database kept beside its report): check_folder refuses the folder
# otherwise, before anything is written. A user's other files there (diagram.png) are left alone.
REPORT_FILES = {"report.md": "report.md", "report.html": "report.html",
                "latency_throughput_*.png": "plot", "speedup_*.png": "plot", "*_heatmap_*.png": "plot",
                "latency_dist_*.png": "plot", "training_scaling.png": "plot", "roofline.png": "plot",
                "roofline_*.png": "plot", "serve_*.png": "plot"}


def _report_folder(out: str | Path) -> Path:
    """`out` as a folder the report can be written in, created if missing; a SpecError otherwise, before any
    file is written (store/export.py checks every output path)."""
    from ..store.export import check_folder

    return check_folder(out, "--out", REPORT_FILES)


def build_report(db: str, runs: list[str] | None, out_dir: str | Path, baseline: str | None = None, *,
                 compare_runs: bool | None = None, config: CompareConfig | None = None) -> ReportPaths:
    """Write report.md, the PNG plots and report.html for the runs (names, ids or 'last'; default the
    newest). With two or more runs (or compare_runs=True) the first is compared with each other one."""
    from ..store import Store
    from ..store.export import write_text, writing
    from . import html, plots, tables
    from .data import load

    store = Store(db, readonly=True)
    try:
        data = load(store, runs or ["last"], baseline)
    finally:
        store.close()
    given = runs or ["last"]
    if compare_runs is None:
        compare_runs = len(given) > 1
    if compare_runs and len(data.runs) < 2:
        if len(given) > 1:
            # `report a a` (or `a last`) dropped the copy and compared nothing, --alpha and all, without a word
            names = " and ".join(f"'{r}'" for r in given)
            raise SpecError(f"runs {names} are one run ('{data.runs[0]['name']}'): a comparison needs two "
                            "different runs; give another one, or --no-compare to report it alone")
        raise SpecError("--compare needs two runs: transbench report RUN_A RUN_B --compare")
    out = _report_folder(out_dir)  # the text as given: Path("") would be the current folder
    with writing(out):  # a full disk (plots.DISK_ERRORS) is one line before report.md is replaced
        figures, plot_failures = plots.all_figures(data, out)
    comparisons = []
    if compare_runs:
        by_run = {r["run_id"]: [x for x in data.records if x["run_id"] == r["run_id"]] for r in data.runs}
        a = data.runs[0]
        comparisons = [compare_records(a, by_run[a["run_id"]], b, by_run[b["run_id"]], config or CompareConfig())
                       for b in data.runs[1:]]

    sections = [Section("Runs", [tables.runs_table(data)])]
    engine = tables.engine_tables(data)
    if engine:
        sections.append(Section("Inference: latency and QPS per backend", [
            "One table per model, task, dtype and sequence length; latency is the median per call; "
            "OOM = out of memory; a status name replaces the numbers of a cell without a valid measurement.",
            *engine]))
    for title, table in (("Inference: every cell", tables.inference_detail(data)),
                         ("Largest batch", tables.max_batch_table(data)),
                         ("Generation", tables.generation_table(data)),
                         ("Training", tables.training_table(data))):
        if table is not None:
            sections.append(Section(title, [table]))
    micro = tables.micro_tables(data)
    if micro:
        sections.append(Section("Micro-benchmarks", micro))
    from .serve import section as serve_section  # serving under load (report/serve.py)

    with writing(out):
        serve = serve_section(data, out)
    if serve is not None:
        sections.append(serve)
    problems = tables.problems_table(data)
    if problems is not None:
        sections.append(Section("Cells without a valid measurement", [problems]))
    if figures or plot_failures:
        sections.append(Section("Plots", [*plot_failures, *figures]))
    for cmp in comparisons:
        # Runs with no cell in common (other kinds, grids or machines): the line `compare` refuses them with,
        # not an empty table under a summary of "6 unmatched".
        why = nothing_compared(cmp)
        blocks = ([why + "."] if why else []) + ([comparison_table(cmp)] if cmp.cells else [])
        extra = unmatched_table(cmp)
        if extra is not None:
            blocks.append(extra)
        sections.append(Section(f"Comparison: {cmp.run_b['name']} vs {cmp.run_a['name']}", blocks))

    title = "transbench report: " + ", ".join(r["name"] for r in data.runs)
    md_path, html_path = out / "report.md", out / "report.html"
    # The folder was writable when checked, and its report files ours (check_folder); a full disk still is one
    # line, and leaves the last report's files as they were (store/export.py replacing).
    with writing(md_path):
        write_text(md_path, to_markdown(title, sections, out))
    with writing(html_path):
        write_text(html_path, html.to_html(title, sections))
    # The serve section's plots too: `transbench report` of a serve run said "0 plot(s)" beside serve_0.png.
    served = [b for b in (serve.blocks if serve is not None else []) if isinstance(b, Figure)]
    return ReportPaths(out, md_path, html_path, figures + served, comparisons, plot_failures)
