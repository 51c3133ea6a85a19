"""The report's PNG plots. Only cells that are ok are drawn: a cell that was out of memory, wrong, timed
out or crashed has no point, bar or box (the heatmap writes its status name instead of a colour).

Figures are built with matplotlib's object API (no pyplot), so nothing global changes in the caller's
process and no display is needed."""

from __future__ import annotations

import errno
import hashlib
import math
import re
import sys
import textwrap
import warnings
import zlib
from contextlib import contextmanager
from pathlib import Path

from ..store import export
from .data import ReportData, by_scenario, groups, is_ok, sorted_values, variant
from .document import STATUS_TEXT, Figure, percent

DPI = 110
PANEL_ROW_WIDTH = 24.0  # inches: the widest row of heatmap (and latency distribution) panels
# The most batch sizes (rows) and sequence lengths (columns) a heatmap panel draws at full size, each cell's value
# written in it. Past them the panel keeps that size, its cells thinner and coloured only (every value is in the
# tables): a panel grew 0.45 inch a batch, and 600 batches of 3,000 cells made a 2.6 MB heatmap, 3.4 MB of
# report.html's 6.3 MB.
HEATMAP_CELLS = 24


def _canvas(width: float, height: float):
    from matplotlib.figure import Figure as MplFigure

    return MplFigure(figsize=(max(width, 6.0), height), dpi=DPI, layout="constrained")


def _figure(ncols: int, nrows: int = 1, width: float = 4.6, height: float = 3.6):
    fig = _canvas(width * ncols, height * nrows)
    return fig, fig.subplots(nrows, ncols, squeeze=False)


# The most sequence lengths side by side in the latency/throughput and speedup plots: one column per length made
# a 4,000-pixel strip at eight lengths, too small to read once the page fits it to the screen.
SEQ_COLUMNS = 4


def _seq_figure(count: int, rows: int):
    """`rows` stacked panels for each of `count` sequence lengths, in blocks of at most SEQ_COLUMNS lengths side
    by side; the unused places of the last block removed. Returns the figure and each length's panels."""
    cols = max(1, min(count, SEQ_COLUMNS))
    blocks = -(-count // cols)
    fig, axes = _figure(cols, rows * blocks)
    for j in range(count, cols * blocks):
        for i in range(rows):
            fig.delaxes(axes[(j // cols) * rows + i][j % cols])
    return fig, [[axes[(j // cols) * rows + i][j % cols] for i in range(rows)] for j in range(count)]


# A plot's file name spells its parts (model, task, dtype; a run's name) in lower-case letters, digits, dots and
# single hyphens. Where a part holds anything else, the spelling loses it: "org/m" and "org-m", or two names in
# another script (both spelled ""), wrote one file, the second plot over the first, and the report showed it
# twice; a name a case-insensitive file system folds ("Bert", "bert") did the same; a 300-character model path
# was over a file system's 255 bytes (OSError: no plot at all). Such names keep SLUG_MAX characters of the
# spelling and add a hash of the parts as they are.
SLUG_MAX = 80
_FAITHFUL = re.compile(r"[a-z0-9.]+(-[a-z0-9.]+)*")


def slug(*parts) -> str:
    texts = [str(p) for p in parts]
    text = re.sub(r"[^A-Za-z0-9.]+", "-", "_".join(texts)).strip("-")
    if all(_FAITHFUL.fullmatch(t) for t in texts) and len(text) <= SLUG_MAX:
        return text
    digest = hashlib.sha1("\0".join(texts).encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return f"{text[:SLUG_MAX].strip('-')}-{digest}".lstrip("-")


# The most characters of one name a figure draws. Past it, its start and end with a hash of the whole: folding a
# 20,000-character name (a store's damaged row, a run named by a script) took matplotlib minutes of text layout.
LABEL_MAX = 200


def wrap(text, width: int = 40) -> str:
    """A name drawn in a figure (legend entry, panel or figure title) folded onto lines of at most `width`
    characters: a long run name or model path pushed the legend and the title off the image and collapsed the
    axes to nothing. Folded, and cut only past LABEL_MAX, keeping a hash: two long names that differ only in the
    middle stay two entries."""
    text = str(text)
    if len(text) > LABEL_MAX:
        digest = hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()[:10]
        text = f"{text[:LABEL_MAX - 60]}...{text[-40:]} #{digest}"
    lines = text.split("\n")
    if all(len(line) <= width for line in lines):
        return text
    return "\n".join(part for line in lines for part in (textwrap.wrap(
        line, width, break_long_words=True, break_on_hyphens=False) or [""]))


def _suptitle(fig, title: str, **kwargs) -> None:
    """The figure's title, folded to the figure's width (about 8 characters an inch at the default size)."""
    fig.suptitle(wrap(title, max(48, int(fig.get_figwidth() * 8))), **kwargs)


@contextmanager
def quiet_glyphs():
    """A name in a script the bundled font lacks (CJK) is drawn as boxes in the PNG, and matplotlib warned once
    per character and figure on stderr; the report's text (captions, tables) keeps every name as it is.
    Figures a store holds as finite but that span more decades than a float does (a latency of 1e-300 ms beside one
    of 1e300) overflowed numpy in the log axes' scales and ticks: RuntimeWarnings with matplotlib's source lines on
    stderr, around a report that was written."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from", category=UserWarning)
        warnings.filterwarnings("ignore", message="overflow encountered", category=RuntimeWarning)
        yield


def _save(fig, path: Path, title: str, points: list[dict]) -> Figure:
    with quiet_glyphs():
        export.save_figure(fig, path)
    return Figure(path, title, points)


# The most batch sizes a panel's axis names: a sweep of every batch from 1 to 64 wrote 64 labels over each other.
# Every measured batch keeps its tick; the names are spread over the axis, the first and the last always named.
AXIS_LABELS = 8


def spread_labels(positions: list[float], names: list[str], most: int = AXIS_LABELS) -> list[str]:
    """names with all but at most `most` blanked, those kept at least 1/most of the axis's span apart."""
    if len(names) <= most:
        return list(names)
    lo, hi = positions[0], positions[-1]
    gap = (hi - lo) / most
    keep, last = {0}, lo
    for i, pos in enumerate(positions[1:-1], start=1):
        if pos - last >= gap and hi - pos >= gap:
            keep.add(i)
            last = pos
    keep.add(len(names) - 1)
    return [name if i in keep else "" for i, name in enumerate(names)]


def _log_axes(ax, x_values: list | None = None, y: bool = True) -> None:
    """Log axes that read as plain numbers, ticked at the batch sizes measured."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    plain = FuncFormatter(lambda v, _: f"{v:g}")
    if x_values:
        ax.set_xscale("log", base=2)
        ax.set_xticks(x_values, spread_labels([math.log2(v) for v in x_values], [str(v) for v in x_values]))
        ax.xaxis.set_minor_formatter(NullFormatter())
    if y:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(plain)
        few = FuncFormatter(lambda v, _: f"{v:g}" if f"{v:.0e}"[0] in "25" else "")
        span = _decades(ax)
        ax.yaxis.set_minor_formatter(plain if span < 0.7 else few if span < 2 else NullFormatter())


def _decades(ax) -> float:
    lo, hi = ax.get_ylim()
    return math.log10(hi / lo) if lo > 0 and hi > 0 else 0.0


# One colour per backend in every plot of every report: the backend registry's names in its order
# (backends/__init__.py _MODULES, sdpa's forced kernels next to sdpa), from matplotlib's tab20 so
# neighbours differ. report/ sits below backends/ and cannot import the registry; tests/test_report_plots.py
# checks that every registered backend is listed here.
BACKEND_COLORS = {
    "eager": "#1f77b4", "sdpa": "#ff7f0e", "sdpa-math": "#ffbb78", "sdpa-efficient": "#8c564b",
    "sdpa-flash": "#e377c2", "sdpa-cudnn": "#c49c94", "flash-attn2": "#9467bd", "compile": "#2ca02c",
    "cudagraph": "#17becf", "onnxruntime": "#7f7f7f", "fused": "#d62728",
}
# Unknown names (a test backend, a future one) by a stable hash of the name: the same in every run.
FALLBACK_COLORS = ("#bcbd22", "#aec7e8", "#98df8a", "#ff9896", "#c5b0d5", "#f7b6d2", "#dbdb8d", "#9edae5")
# Runs are told apart by marker and line style (lines) or hatch (bars, boxes), in the order asked for.
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LINESTYLES = ("-", "--", ":", "-.")
HATCHES = ("", "//", "..", "xx", "\\\\", "++", "oo", "--")


def backend_color(backend: str | None) -> str:
    name = str(backend)
    return BACKEND_COLORS.get(name) or FALLBACK_COLORS[zlib.crc32(name.encode()) % len(FALLBACK_COLORS)]


def _run_index(rec: dict) -> int:
    """Which run's style a record is drawn in: none where its column is shared by several runs."""
    return rec["_run"] if rec["_label"] != variant(rec) else 0


def _legend(fig, axes) -> None:
    """One legend outside the data for the whole figure, with every series drawn in any panel."""
    seen: dict[str, object] = {}
    for ax in axes:
        for handle, name in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(name, handle)
    if seen:
        figure_legend(fig, list(seen.values()), list(seen))


# Legend entries a column holds before the legend takes another: 55 runs' entries ran off the image's bottom.
LEGEND_ROWS = 24


def figure_legend(fig, handles: list, names: list[str]) -> None:
    """The figure's legend, outside the panels at the right, centred: at the top it sat over the figure's title
    (centred over the whole figure, legend included)."""
    fig.legend(handles, [wrap(name) for name in names], loc="outside right center", fontsize=8,
               ncols=max(1, -(-len(names) // LEGEND_ROWS)))


def _panels(fig, count: int, ncols: int = 4) -> list:
    """count axes in rows of at most ncols; the unused slots of the last row are removed, not left empty."""
    cols = max(1, min(count, ncols))
    rows = -(-count // cols)
    axes = fig.subplots(rows, cols, squeeze=False).ravel().tolist()
    for ax in axes[count:]:
        fig.delaxes(ax)
    return axes[:count]


def _inference_groups(data: ReportData) -> dict[tuple, list[dict]]:
    return groups(by_scenario(data.records, "inference"), ("model", "task", "dtype"))


def latency_throughput(data: ReportData, out: Path) -> list[Figure]:
    """Latency and throughput against batch size, one line per run and backend (colour: backend; marker
    and line style: run), one column per sequence length that has a measured cell."""
    figs = []
    for (model, task, dtype), recs in _inference_groups(data).items():
        seqs = sorted_values([r for r in recs if is_ok(r, "latency_ms")], "seq_len")
        if not seqs:
            continue
        series = list(dict.fromkeys(r["_series"] for r in recs))
        fig, columns = _seq_figure(len(seqs), 2)
        points = []
        for j, seq in enumerate(seqs):
            for row, (key, ylabel) in enumerate((("latency_ms", "latency (ms, median)"),
                                                 ("throughput_per_s", "throughput (seq/s)"))):
                ax = columns[j][row]
                off_axis = 0
                for name in series:
                    mine = [r for r in recs if r["_series"] == name and r["seq_len"] == seq and is_ok(r, key)]
                    # A value of 0 (a throughput stored as 0) has no place on a log axis: its line ran off the
                    # bottom edge as if it fell there. Left out of the line, and counted in the panel.
                    off_axis += sum(r[key] <= 0 for r in mine)
                    mine = [r for r in mine if r[key] > 0]
                    if not mine:
                        continue
                    pts = sorted((r["batch_size"], r[key]) for r in mine)
                    run = mine[0]["_run"]
                    ax.plot(*zip(*pts), label=name, color=backend_color(mine[0]["backend"]),
                            marker=MARKERS[run % len(MARKERS)], linestyle=LINESTYLES[run % len(LINESTYLES)])
                    points += [{"plot": key, "series": name, "model": model, "seq": seq, "batch": b, "value": v}
                               for b, v in pts]
                if off_axis:
                    ax.text(0.02, 0.02, f"{off_axis} value(s) <= 0 not drawn (log axis)", transform=ax.transAxes,
                            fontsize=7, color="dimgray")
                _log_axes(ax, sorted_values([r for r in recs if r["seq_len"] == seq and is_ok(r)], "batch_size"))
                ax.set_xlabel("batch size")
                ax.set_ylabel(ylabel)
                ax.set_title(f"seq {seq}")
                ax.grid(True, which="both", alpha=0.3)
        _legend(fig, [ax for column in columns for ax in column])
        title = f"{model} {task} {dtype}: latency and throughput vs batch"
        _suptitle(fig, title)
        figs.append(_save(fig, out / f"latency_throughput_{slug(model, task, dtype)}.png", title, points))
    return figs


def _bars(ax, recs: list[dict], key: str, labels: list[str]) -> list[dict]:
    batches = sorted_values([r for r in recs if is_ok(r, key)], "batch_size")
    labels = [lab for lab in labels if any(r["_label"] == lab and is_ok(r, key) for r in recs)]
    width = 0.8 / max(len(labels), 1)
    points = []
    for i, lab in enumerate(labels):
        mine = {r["batch_size"]: r for r in recs if r["_label"] == lab and is_ok(r, key)}
        first = next(iter(mine.values()))
        xs = [x for x, b in enumerate(batches) if b in mine]
        ax.bar([x - 0.4 + width * (i + 0.5) for x in xs], [mine[batches[x]][key] for x in xs], width, label=lab,
               color=backend_color(first["backend"]), hatch=HATCHES[_run_index(first) % len(HATCHES)],
               edgecolor="white", linewidth=0.5)
        points += [{"plot": key, "series": lab, "batch": batches[x], "value": mine[batches[x]][key]} for x in xs]
    ax.set_xticks(range(len(batches)), spread_labels(list(range(len(batches))), [str(b) for b in batches]))
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xlabel("batch size")
    ax.grid(True, axis="y", alpha=0.3)
    return points


def speedup_memory(data: ReportData, out: Path) -> list[Figure]:
    """Speedup % and memory saved % against the baseline per sequence length, as in the seeds' attention
    study: one bar per backend and batch size. A panel without a measured bar is left out."""
    figs = []
    for (model, task, dtype), recs in _inference_groups(data).items():
        recs = [r for r in recs if r.get("backend") != r.get("_baseline")]
        rows = [(key, ylabel) for key, ylabel in (("speedup", "speedup %"), ("mem_saved", "memory saved %"))
                if any(is_ok(r, key) for r in recs)]
        if not rows or rows[0][0] != "speedup":
            continue
        seqs = sorted_values([r for r in recs if is_ok(r, "speedup") or is_ok(r, "mem_saved")], "seq_len")
        labels = list(dict.fromkeys(r["_label"] for r in recs))
        fig, columns = _seq_figure(len(seqs), len(rows))
        points, drawn = [], []
        for j, seq in enumerate(seqs):
            for i, (key, ylabel) in enumerate(rows):
                ax = columns[j][i]
                at_seq = [r for r in recs if r["seq_len"] == seq]
                if not any(is_ok(r, key) for r in at_seq):
                    fig.delaxes(ax)
                    continue
                pts = _bars(ax, at_seq, key, labels)
                points += [{**p, "model": model, "seq": seq} for p in pts]
                ax.set_ylabel(ylabel)
                ax.set_title(f"SeqLen {seq}")
                drawn.append(ax)
        _legend(fig, drawn)
        bases = ", ".join(sorted({str(r["_baseline"]) for r in recs}))
        what = "speedup and memory saved" if len(rows) > 1 else "speedup (no memory measured)"
        title = f"{model} {task} {dtype}: {what} vs {bases}"
        _suptitle(fig, title)
        figs.append(_save(fig, out / f"speedup_{slug(model, task, dtype)}.png", title, points))
    return figs


def _grid_names(values: list) -> list[str]:
    """A heatmap axis's names: each value up to HEATMAP_CELLS of them, past that AXIS_LABELS spread over it."""
    names = [str(v) for v in values]
    return names if len(names) <= HEATMAP_CELLS else spread_labels(list(range(len(names))), names)


def efficiency_heatmap(data: ReportData, out: Path) -> list[Figure]:
    """MFU over batch x sequence length per backend; TFLOPS where the device's peak is unknown (MFU empty)."""
    figs = []
    for (model, task, dtype), recs in _inference_groups(data).items():
        # MFU only where every cell with a TFLOPS figure has one: two runs of which one ran where the peak is
        # unknown (a CPU, a GPU not in the table) had that run's panels dropped from an MFU heatmap, unsaid.
        use_mfu = any(is_ok(r, "mfu") for r in recs) and all(is_ok(r, "mfu") for r in recs if is_ok(r, "tflops"))
        key = "mfu" if use_mfu else "tflops"
        if not any(is_ok(r, key) for r in recs):
            continue
        # A panel per column of the tables (backend, or run/backend where runs measured the same point)
        # that has a measured cell; the cells of the others are in the "without a valid measurement" table.
        labels = list(dict.fromkeys(r["_label"] for r in recs if is_ok(r, key)))
        recs = [r for r in recs if r["_label"] in labels]
        batches, seqs = sorted_values(recs, "batch_size"), sorted_values(recs, "seq_len")
        scale = 100.0 if use_mfu else 1.0
        top = max(r[key] * scale for r in recs if is_ok(r, key))
        # Panels in rows of at most PANEL_ROW_WIDTH inches: six backends over eight lengths made one 50-inch row,
        # its figures too small to read once the page fits it to the screen.
        width, height = 1.2 + 0.9 * min(len(seqs), HEATMAP_CELLS), 1.6 + 0.45 * min(len(batches), HEATMAP_CELLS)
        written = len(seqs) <= HEATMAP_CELLS and len(batches) <= HEATMAP_CELLS
        ncols = max(1, min(len(labels), int(PANEL_ROW_WIDTH // width)))
        fig = _canvas(width * ncols + 1.0, height * -(-len(labels) // ncols))
        axes = _panels(fig, len(labels), ncols)
        points = []
        for ax, lab in zip(axes, labels):
            cell = {(r["batch_size"], r["seq_len"]): r for r in recs if r["_label"] == lab}
            grid = [[math.nan] * len(seqs) for _ in batches]
            for bi, b in enumerate(batches):
                for si, s in enumerate(seqs):
                    r = cell.get((b, s))
                    if r is not None and is_ok(r, key):
                        grid[bi][si] = r[key] * scale
                        points.append({"plot": key, "series": lab, "batch": b, "seq": s, "value": r[key]})
            im = ax.imshow(grid, cmap="viridis", vmin=0, vmax=top or 1, aspect="auto", origin="lower")
            for bi, b in enumerate(batches):
                for si, s in enumerate(seqs):
                    r = cell.get((b, s))
                    if r is None or not written:
                        continue
                    if is_ok(r, key):
                        value = grid[bi][si]
                        # percent(): an MFU of 0.04% read "0.0%", as if nothing ran (as in the tables)
                        text = percent(value) if use_mfu else f"{value:.3g}"
                        # dark text on the map's light (high) end: white on yellow could not be read
                        red, green, blue, _ = im.cmap(im.norm(value))
                        color = "black" if 0.299 * red + 0.587 * green + 0.114 * blue > 0.5 else "white"
                    else:
                        # an ok cell without the figure says so; a failed one its status (never blank)
                        text = "n/a" if r["status"] == "ok" else STATUS_TEXT.get(r["status"], str(r["status"]))
                        color = "dimgray" if r["status"] == "ok" else "red"
                    ax.text(si, bi, text, ha="center", va="center", fontsize=8, color=color)
            ax.set_xticks(range(len(seqs)), _grid_names(seqs))
            ax.set_yticks(range(len(batches)), _grid_names(batches))
            ax.set_xlabel("sequence length")
            ax.set_ylabel("batch size")
            # folded to the panel's width (about 12 characters an inch at 9 points, less the batch axis's labels):
            # at 30 characters, neighbouring panels' titles of one or two lengths ran into each other
            ax.set_title(wrap(lab, max(10, int((width - 0.7) * 12))), fontsize=9)
        fig.colorbar(im, ax=axes, label="MFU %" if use_mfu else "TFLOPS")
        what = ("MFU (dense datasheet peak)" if use_mfu else
                "TFLOPS (no datasheet peak for a device of these cells: no MFU)" if any(is_ok(r, "mfu") for r in recs)
                else "TFLOPS (no datasheet peak for this device: no MFU)")
        over = f" (over {HEATMAP_CELLS} batches or lengths: values in the tables)"
        title = f"{model} {task} {dtype}: {what}" + ("" if written else over)
        _suptitle(fig, title)
        figs.append(_save(fig, out / f"{key}_heatmap_{slug(model, task, dtype)}.png", title, points))
    return figs


# The distribution plot's axis spans these percentiles of every box in a panel: one stray call (a
# clock ramp, a page fault) 10x slower than the rest no longer flattens the boxes; samples beyond the
# axis are counted at its edge.
AXIS_PERCENTILES = (0.5, 99.5)
# Panels of one distribution plot, at most: a grid of 30 batches x 10 lengths drew 300, each plot 2.6 MB and 20 s,
# and 5 models took the report 3.5 minutes and 25 MB of HTML; the latency plot and the tables keep every point.
DIST_PANELS = 48


def _sample_axis(ax, samples: list[list[float]]) -> None:
    """Clip the y axis to AXIS_PERCENTILES of the boxes (log scale where they span over 10x) and mark
    how many samples of each box lie beyond it."""
    import numpy as np

    hi = max(float(np.percentile(s, AXIS_PERCENTILES[1])) for s in samples)
    # The low end from the positive samples: a sample of 0 ms (a clock coarser than the call) made the axis linear
    # from 0, and boxes 10x apart flat lines; it is counted below the axis (a log axis draws no value <= 0).
    # Through numpy: lists of numpy scalars, one per sample of millions, took hundreds of MB (Store.cells' arrays)
    samples = [np.asarray(s, dtype=np.float64) for s in samples]
    positive = [s[s > 0] for s in samples]
    lo = min((float(np.percentile(s, AXIS_PERCENTILES[0])) for s in positive if len(s)), default=0.0)
    if lo > 0 and hi / lo > 10:
        ax.set_yscale("log")
        bottom, top = lo / 1.15, hi * 1.15
    else:
        pad = (hi - lo) * 0.08 or abs(hi) * 0.05 or 1.0
        bottom, top = lo - pad, hi + pad
    # A stored sample near the largest float (finite, so read) padded past it to inf: "Axis limits cannot be NaN
    # or Inf", and the plot was lost.
    top = min(top, sys.float_info.max)
    ax.set_ylim(bottom, top)
    if ax.get_yscale() == "log":
        _log_axes(ax)  # ticks as plain numbers
    for x, s in enumerate(samples, start=1):
        above, below = int(np.count_nonzero(s > top)), int(np.count_nonzero(s < bottom))
        if above:
            ax.annotate(f"\u25b2{above}", (x, 1), xycoords=("data", "axes fraction"), ha="center", va="top",
                        fontsize=7, color="dimgray")
        if below:
            ax.annotate(f"\u25bc{below}", (x, 0), xycoords=("data", "axes fraction"), ha="center", va="bottom",
                        fontsize=7, color="dimgray")


def latency_distributions(data: ReportData, out: Path) -> list[Figure]:
    """Box plots of the raw per-call samples, a panel per (sequence length, batch) with a measured cell,
    a box per backend labelled under it; whiskers at AXIS_PERCENTILES, the axis clipped to them."""
    from matplotlib.patches import Patch

    figs = []
    for (model, task, dtype), group in _inference_groups(data).items():
        recs = [r for r in group if is_ok(r) and len(r["_samples"])]
        if not recs:
            continue
        points_at = list(groups(recs, ("seq_len", "batch_size")))
        measured_at = len(points_at)
        if measured_at > DIST_PANELS:  # spread evenly over the grid, its first and last point kept
            points_at = [points_at[round(i * (measured_at - 1) / (DIST_PANELS - 1))] for i in range(DIST_PANELS)]
        labels = list(dict.fromkeys(r["_label"] for r in group))
        per_panel = max(len({r["_label"] for r in group if (r["seq_len"], r["batch_size"]) == pt})
                        for pt in points_at)
        # rows of at most four panels, and of at most PANEL_ROW_WIDTH inches: three runs of six backends at one
        # point made four 12-inch panels a row
        # and a panel of at most that width: 55 runs at one point made one 35-inch panel; the names under
        # its boxes get smaller instead
        panel = min(1.2 + 0.62 * per_panel, PANEL_ROW_WIDTH)
        names_size = 7 if 1.2 + 0.62 * per_panel <= PANEL_ROW_WIDTH else 5
        ncols = max(1, min(len(points_at), 4, int(PANEL_ROW_WIDTH // panel)))
        fig = _canvas(ncols * panel, 3.3 * -(-len(points_at) // ncols))
        axes = _panels(fig, len(points_at), ncols)
        points, legend = [], {}
        for ax, (seq, b) in zip(axes, points_at):
            here = [r for lab in labels for r in group
                    if r["_label"] == lab and r["seq_len"] == seq and r["batch_size"] == b]
            boxed = [r for r in here if is_ok(r) and len(r["_samples"])]
            box = ax.boxplot([r["_samples"] for r in boxed], positions=range(1, len(boxed) + 1), widths=0.7,
                             whis=AXIS_PERCENTILES, patch_artist=True, flierprops={"markersize": 2},
                             medianprops={"color": "black"})
            for patch, r in zip(box["boxes"], boxed):
                patch.set_facecolor(backend_color(r["backend"]))
                patch.set_hatch(HATCHES[_run_index(r) % len(HATCHES)])
                legend.setdefault(r["_label"], Patch(facecolor=patch.get_facecolor(), hatch=patch.get_hatch()))
            _sample_axis(ax, [r["_samples"] for r in boxed])
            # A cell without samples keeps its place on the axis, with its status instead of a box.
            gone = [r for r in here if r not in boxed]
            for k, r in enumerate(gone, start=len(boxed) + 1):
                # an ok cell of a store that kept no raw samples read "ok" in a failure's red
                ok = r["status"] == "ok"
                ax.text(k, 0.5, "no samples" if ok else STATUS_TEXT.get(r["status"], str(r["status"])),
                        transform=ax.get_xaxis_transform(), ha="center", va="center", rotation=90, fontsize=8,
                        color="dimgray" if ok else "red")
            # Each box's sample count under its name: whiskers at p0.5 and p99.5 of 5 samples are their extremes,
            # and a reader could not tell that box from one of 2,000 samples.
            counts = [f"\nn={len(r['_samples']):,}" for r in boxed] + [""] * len(gone)
            names = [wrap(r["_label"].replace("/", "/\n"), 24) + n for r, n in zip(boxed + gone, counts)]
            ax.set_xticks(range(1, len(names) + 1), names, rotation=45, ha="right", rotation_mode="anchor")
            ax.set_xlim(0.4, len(names) + 0.6)
            ax.set_title(f"batch {b}, seq {seq}", fontsize=9)
            ax.set_ylabel("ms per call", fontsize=8)
            ax.tick_params(which="both", labelsize=7)
            ax.tick_params(axis="x", labelsize=names_size)
            ax.grid(True, axis="y", alpha=0.3)
            points += [{"plot": "samples", "series": r["_label"], "seq": seq, "batch": b,
                        "value": len(r["_samples"])} for r in boxed]
        figure_legend(fig, list(legend.values()), list(legend))
        lo, hi = AXIS_PERCENTILES
        shown = (f"; {len(points_at)} of {measured_at} batch x seq points, spread evenly"
                 if len(points_at) < measured_at else "")
        title = (f"{model} {task} {dtype}: latency distribution of the raw samples\n"
                 f"(n= samples a box; whiskers p{lo:g}-p{hi:g}; \u25b2n: n samples above the axis{shown})")
        _suptitle(fig, title, fontsize=10)
        figs.append(_save(fig, out / f"latency_dist_{slug(model, task, dtype)}.png", title.replace("\n", " "),
                          points))
    return figs


def training_scaling(data: ReportData, out: Path) -> list[Figure]:
    """Training throughput and scaling efficiency (throughput / (N x one-GPU throughput)) over GPUs."""
    recs = [r for r in by_scenario(data.records, "training") if is_ok(r, "samples_per_s") and r.get("world_size")]
    if not recs:
        return []
    from .tables import TRAINING_AXES

    fig, axes = _figure(2, 1)
    # The settings that differ between the cells (as the training table's columns) are part of a series: cells of
    # `--grad-ckpt off,on` at one GPU count were one series, one value drawn over the other's.
    varied = [(k, label) for k, label in TRAINING_AXES if len({repr(r.get(k)) for r in recs}) > 1]
    ident = ("run_id", "model", "backend", "dtype", "batch_size", "seq_len", *(k for k, _ in varied))
    single = {tuple(r.get(k) for k in ident): r["samples_per_s"] for r in recs if r["world_size"] == 1}
    # A series per strategy over several GPUs, each starting from the one-GPU run of the same shape.
    series = groups([r for r in recs if r["world_size"] > 1], (*ident, "strategy")) or groups(recs, (*ident, "strategy"))
    points, per_backend = [], {}
    for key, rs in series.items():
        one = single.get(key[:-1])
        pts = sorted({**({1: one} if one else {}), **{r["world_size"]: r["samples_per_s"] for r in rs}}.items())
        r0 = rs[0]
        name = " ".join([f"{r0['model']} {r0['backend']} {r0['dtype']} b{r0['batch_size']} s{r0['seq_len']}",
                         *(f"{label}={r0.get(k)}" for k, label in varied), str(key[-1] or "")]).strip()
        if data.multi_run:  # two runs of one shape (two machines) were one legend entry for two lines
            name = f"{r0['run_name']}/{name}"
        # Colour: the attention backend, as in every other plot; marker and line: the n-th series of it.
        nth = per_backend[r0["backend"]] = per_backend.get(r0["backend"], -1) + 1
        style = {"color": backend_color(r0["backend"]), "marker": MARKERS[nth % len(MARKERS)],
                 "linestyle": LINESTYLES[nth % len(LINESTYLES)]}
        axes[0][0].plot(*zip(*pts), label=name, **style)
        points += [{"plot": "samples_per_s", "series": name, "world_size": n, "value": v} for n, v in pts]
        if one:
            eff = [(n, v / (n * one)) for n, v in pts]
            axes[0][1].plot(*zip(*eff), label=name, **style)
            points += [{"plot": "efficiency", "series": name, "world_size": n, "value": e} for n, e in eff]
    axes[0][0].set_ylabel("samples/s (all GPUs)")
    axes[0][1].set_ylabel("scaling efficiency")
    if not single:
        axes[0][1].text(0.5, 0.5, "no one-GPU run to compare with", ha="center", transform=axes[0][1].transAxes)
    sizes = sorted({p["world_size"] for p in points})
    for ax in axes[0]:
        ax.set_xlabel("GPUs (world size)")
        ax.set_xticks(sizes)
        ax.grid(True, alpha=0.3)
    axes[0][1].set_ylim(0, max([1.05] + [p["value"] * 1.05 for p in points if p["plot"] == "efficiency"]))
    _legend(fig, axes[0])
    title = "training scaling over GPUs"
    _suptitle(fig, title)
    return [_save(fig, out / "training_scaling.png", title, points)]


def _ceilings(recs: list[dict]) -> tuple[dict[str, float], float | None]:
    """The ceilings the micro run judged its points by (peak_tflops, peak_gbs in its records), the best
    GEMM the run measured, and the datasheet where the records carry no peak."""
    from ..measure import peaks

    compute = {f"{r['dtype']} peak": r["peak_tflops"] for r in recs if r.get("peak_tflops") and r.get("dtype")}
    for r in recs:
        if r.get("scenario") == "micro-gemm" and is_ok(r, "tflops"):
            name = f"{r.get('dtype')} best GEMM measured"
            compute[name] = max(compute.get(name, 0.0), r["tflops"])
    bandwidth = next((r["peak_gbs"] for r in recs if r.get("peak_gbs")), None)
    copies = [r["gbps"] for r in recs if r.get("scenario") == "micro-bandwidth" and is_ok(r, "gbps")]
    if bandwidth is None and copies:
        bandwidth = max(copies)
    row = next((peaks.lookup(r["gpu"]) for r in recs if r.get("gpu") and peaks.lookup(r["gpu"])), None)
    if row is not None:
        bandwidth = bandwidth or row.bandwidth_gbs
        for dtype in sorted({r["dtype"] for r in recs if r.get("dtype")}):
            if row.peak(dtype) and not any(k.startswith(f"{dtype} peak") for k in compute):
                compute[f"{dtype} peak"] = row.peak(dtype)
    return compute, bandwidth


def roofline(data: ReportData, out: Path) -> list[Figure]:
    """The micro-benchmark points (GEMMs, layer parts) against the compute and memory ceilings, one plot
    per micro run."""
    from .roofline import plot_roofline, roofline_points

    figs = []
    for run in data.runs:
        recs = [r for r in data.records if r["run_id"] == run["run_id"] and str(r.get("scenario")).startswith("micro-")]
        pts = roofline_points(recs)  # ok cells only
        if not pts:
            continue
        compute, bandwidth = _ceilings(recs)
        path = out / (f"roofline_{slug(run['name'])}.png" if data.multi_run else "roofline.png")
        title = f"roofline: {run['name']}"
        with quiet_glyphs():
            plot_roofline(pts, compute or None, bandwidth, str(path), title=wrap(title, 60))
        figs.append(Figure(path, title, [{"plot": "roofline", "series": p["group"], "label": p["label"],
                                          "intensity": p["intensity"], "value": p["tflops"]} for p in pts]))
    return figs


PLOTS = (latency_throughput, speedup_memory, efficiency_heatmap, latency_distributions, training_scaling,
         roofline)
# A plot that cannot be written for these fails every plot and file after it: the report stops in one line (its
# last files left as they were), where a report.md saying "plot ... failed: No space left on device" replaced a
# good one.
DISK_ERRORS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS})


def all_figures(data: ReportData, out: Path) -> tuple[list[Figure], list[str]]:
    """Every plot the data allows, and a line for each plot that failed: the tables still get written."""
    out.mkdir(parents=True, exist_ok=True)
    figures, failures = [], []
    for plot in PLOTS:
        try:
            with quiet_glyphs():  # the axes are laid out before a figure is saved
                figures += plot(data, out)
        except OSError as exc:
            if exc.errno in DISK_ERRORS:
                raise
            failures.append(f"plot {plot.__name__} failed: {type(exc).__name__}: {exc}")
        except Exception as exc:  # noqa: BLE001 - one broken plot must not cost the whole report
            failures.append(f"plot {plot.__name__} failed: {type(exc).__name__}: {exc}")
    return figures, failures
