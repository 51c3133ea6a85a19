"""The report's plots: a backend keeps its colour in every plot of every report, runs are told apart by
marker and line style, every drawn series is in its figure's legend, no panel is empty, outliers do not
flatten the latency distributions, and point labels do not overlap. Read from the matplotlib artists."""

from __future__ import annotations

import pytest
from matplotlib.colors import to_hex
from report_helpers import bad_result, cell, make_run, ok_result

from transbench import backends
from transbench.report import build_report, plots


@pytest.fixture
def drawn(monkeypatch):
    """The matplotlib figure behind each PNG a report writes, by file name."""
    figs = {}
    save = plots._save

    def keep(fig, path, title, points):
        figs[path.name] = fig
        return save(fig, path, title, points)

    monkeypatch.setattr(plots, "_save", keep)
    return figs


def _samples(ms: float, n: int = 40) -> list[float]:
    return [ms * (1 + 0.01 * (i % 7)) for i in range(n)]


def _run(db: str, name: str, points: dict[tuple[str, int, int], float | str], no_memory: int | None = None) -> None:
    """points: (backend, batch, seq) -> median ms, or a status name for a failed cell; cells at sequence
    length no_memory have no peak memory (no memory-saved bar)."""
    results = []
    for (backend, batch, seq), value in points.items():
        c = cell(backend, batch, seq)
        memory = {"peak_mem_mb": None} if seq == no_memory else {}
        results.append((c, bad_result(value, f"{value} here") if isinstance(value, str)
                        else ok_result(_samples(value), batch, **memory)))
    make_run(db, name, results, spec={"baseline": "eager"})


def _series(fig) -> dict[str, dict]:
    """Every labelled line and bar series of a figure: colours, markers and line styles seen."""
    out: dict[str, dict] = {}
    for ax in fig.axes:
        for line in ax.get_lines():
            if not line.get_label().startswith("_"):
                s = out.setdefault(line.get_label(), {"color": set(), "marker": set(), "style": set()})
                s["color"].add(to_hex(line.get_color()))
                s["marker"].add(line.get_marker())
                s["style"].add(line.get_linestyle())
        for bars in ax.containers:
            if not bars.get_label().startswith("_"):
                s = out.setdefault(bars.get_label(), {"color": set(), "marker": set(), "style": set()})
                s["color"] |= {to_hex(p.get_facecolor()) for p in bars.patches}
    return out


def _boxes(fig) -> dict[str, set[str]]:
    """Box plot colours by the backend label under each box."""
    out: dict[str, set[str]] = {}
    for ax in fig.axes:
        names = [t.get_text().split("\nn=")[0].replace("/\n", "/") for t in ax.get_xticklabels()]
        boxes = [p for p in ax.patches if type(p).__name__ == "PathPatch"]
        for name, box in zip(names, boxes):
            out.setdefault(name, set()).add(to_hex(box.get_facecolor()))
    return out


def _legend(fig) -> list[str]:
    (legend,) = fig.legends
    return [t.get_text() for t in legend.get_texts()]


@pytest.mark.slow
def test_a_backend_keeps_its_colour_in_every_plot_and_report(tmp_path, drawn):
    db = str(tmp_path / "s.db")
    _run(db, "first", {("eager", 1, 8): 4.0, ("sdpa", 1, 8): 3.0, ("fused", 1, 8): 1.0,
                       ("eager", 2, 8): 7.0, ("sdpa", 2, 8): 5.0, ("fused", 2, 8): 2.0})
    # Another run: other backends, in another order.
    _run(db, "second", {("fused", 4, 8): 3.0, ("cudagraph", 4, 8): 3.5, ("eager", 4, 8): 9.0,
                        ("sdpa", 4, 8): 8.0, ("mystery", 4, 8): 6.0})
    colors: dict[str, set[str]] = {}
    for name in ("first", "second"):
        drawn.clear()
        build_report(db, [name], tmp_path / name)
        for file, fig in drawn.items():
            found = _boxes(fig) if file.startswith("latency_dist") else _series(fig)
            for label, seen in found.items():
                colors.setdefault(label, set()).update(seen if file.startswith("latency_dist") else seen["color"])
    assert set(colors) == {"eager", "sdpa", "fused", "cudagraph", "mystery"}
    assert all(len(c) == 1 for c in colors.values()), colors  # one colour per backend everywhere
    assert len({c for cs in colors.values() for c in cs}) == len(colors)  # and no two backends share one
    assert colors["sdpa"] == {plots.BACKEND_COLORS["sdpa"]}
    assert colors["mystery"] == {plots.backend_color("mystery")} and plots.backend_color("mystery") in \
        plots.FALLBACK_COLORS


def test_every_registered_backend_has_a_fixed_colour():
    assert set(backends.registry()) <= set(plots.BACKEND_COLORS)
    assert len(set(plots.BACKEND_COLORS.values())) == len(plots.BACKEND_COLORS)
    assert not set(plots.FALLBACK_COLORS) & set(plots.BACKEND_COLORS.values())


@pytest.mark.slow
def test_runs_are_told_apart_by_marker_and_every_series_is_in_the_legend(tmp_path, drawn):
    db = str(tmp_path / "s.db")
    # two runs measure different points; in the first panel (seq 8) only some series.
    _run(db, "p1x128", {("sdpa", 1, 8): 3.0, ("eager", 1, 8): 4.0, ("eager", 1, 16): 8.0, ("cudagraph", 1, 16): 1.0})
    _run(db, "p256x128", {("cudagraph", 256, 16): 30.0, ("sdpa", 256, 16): 90.0, ("fused", 256, 16): 20.0,
                          ("eager", 256, 16): "oom"})
    build_report(db, ["p1x128", "p256x128"], tmp_path / "r", compare_runs=False)
    fig = drawn["latency_throughput_bert-tiny-base-fp32.png"]
    series = _series(fig)
    assert set(series) == {"p1x128/sdpa", "p1x128/eager", "p1x128/cudagraph", "p256x128/cudagraph",
                           "p256x128/sdpa", "p256x128/fused"}
    assert sorted(_legend(fig)) == sorted(series)
    assert series["p1x128/sdpa"]["color"] == series["p256x128/sdpa"]["color"]
    assert series["p1x128/sdpa"]["color"] != series["p256x128/cudagraph"]["color"]
    assert series["p1x128/sdpa"]["marker"] != series["p256x128/sdpa"]["marker"]
    assert series["p1x128/sdpa"]["style"] != series["p256x128/sdpa"]["style"]
    for file, fig in drawn.items():
        found = _boxes(fig) if file.startswith("latency_dist") else _series(fig)
        if found and fig.legends:
            assert set(_legend(fig)) == set(found), file  # every series drawn, in the legend


@pytest.mark.slow
def test_panels_without_data_are_left_out(tmp_path, drawn):
    db = str(tmp_path / "s.db")
    # seq 32: every cell failed; batch 2 x seq 16: nothing measured at all; seq 16: no memory measured;
    # five points of the distribution plot: rows of four leave three unused places.
    _run(db, "gaps", {("eager", 1, 8): 4.0, ("sdpa", 1, 8): 3.0, ("eager", 2, 8): 7.0, ("sdpa", 2, 8): "wrong",
                      ("eager", 4, 8): 12.0, ("eager", 8, 8): 20.0, ("eager", 1, 16): 8.0, ("sdpa", 1, 16): 6.0,
                      ("eager", 1, 32): "oom", ("sdpa", 1, 32): "oom"}, no_memory=16)
    build_report(db, ["gaps"], tmp_path / "r")
    assert {f.split("_bert")[0] for f in drawn} == {"latency_throughput", "speedup", "tflops_heatmap",
                                                     "latency_dist"}
    for file, fig in drawn.items():
        panels = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
        for ax in panels:
            assert ax.get_lines() or ax.patches or ax.images or ax.collections, f"{file}: empty panel {ax.get_title()}"
    titles = {f: sorted(ax.get_title() for ax in fig.axes if ax.get_title()) for f, fig in drawn.items()}
    assert titles["latency_throughput_bert-tiny-base-fp32.png"] == ["seq 16", "seq 16", "seq 8", "seq 8"]
    assert titles["latency_dist_bert-tiny-base-fp32.png"] == ["batch 1, seq 16", "batch 1, seq 8",
                                                              "batch 2, seq 8", "batch 4, seq 8", "batch 8, seq 8"]
    speedup = drawn["speedup_bert-tiny-base-fp32.png"]
    assert sorted((ax.get_ylabel(), ax.get_title()) for ax in speedup.axes) == [
        ("memory saved %", "SeqLen 8"), ("speedup %", "SeqLen 16"), ("speedup %", "SeqLen 8")]


def test_latency_distribution_is_not_flattened_by_an_outlier(tmp_path, drawn):
    db = str(tmp_path / "s.db")
    slow = [3.0 + 0.01 * i for i in range(200)]
    slow[17] = 300.0  # one call 100x slower than the rest
    make_run(db, "tail", [(cell("eager", 1, 8), ok_result(slow, 1)), (cell("sdpa", 1, 8), ok_result(_samples(2.0), 1)),
                          (cell("fused", 1, 8), bad_result("wrong", "rel_err 1"))])
    build_report(db, ["tail"], tmp_path / "r")
    (ax,) = drawn["latency_dist_bert-tiny-base-fp32.png"].axes
    # each box says its sample count: a percentile whisker of a few samples is their extreme
    assert [t.get_text() for t in ax.get_xticklabels()] == ["eager\nn=200", "sdpa\nn=40", "fused"]
    low, high = ax.get_ylim()
    assert ax.get_yscale() == "linear" and high < 10 and low > 1  # the boxes fill the axis, not the 300 ms call
    texts = [t.get_text() for t in ax.texts]
    assert "\u25b21" in texts  # the clipped call is counted at the edge
    assert "wrong" in texts  # the failed cell keeps its place, with its status instead of a box


def test_roofline_point_labels_do_not_overlap():
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.text import Text

    from transbench.report.roofline import _label_points

    fig = Figure(figsize=(8, 5.5))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    pts = [{"label": f"part {i}", "intensity": 1.0 + 0.02 * i, "tflops": 2.0 + 0.03 * i} for i in range(12)]
    pts += [{"label": f"gemm {i}", "intensity": 400.0 + 5 * i, "tflops": 500.0 + 4 * i} for i in range(6)]
    ax.scatter([p["intensity"] for p in pts], [p["tflops"] for p in pts])
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(0.2, 2000)
    ax.set_ylim(0.5, 2000)
    _label_points(fig, ax, pts)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [Text.get_window_extent(t, renderer) for t in ax.texts]
    assert sorted(t.get_text() for t in ax.texts) == sorted(p["label"] for p in pts)  # each label, once
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not a.overlaps(b), "two point labels overlap"
    frame = ax.get_window_extent(renderer)
    assert all(frame.x0 <= b.x0 and b.x1 <= frame.x1 and frame.y0 <= b.y0 and b.y1 <= frame.y1 for b in boxes)


def _text_boxes(fig, texts) -> list:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    return [t.get_window_extent(renderer) for t in texts if t.get_text()]


def _apart(boxes) -> bool:
    return not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])


def test_a_dense_batch_sweep_names_few_batches_and_no_two_names_overlap(tmp_path, drawn):
    db = str(tmp_path / "s.db")
    _run(db, "dense", {(backend, b, 8): 1.0 + b * (0.5 if backend == "sdpa" else 1.0)
                       for b in range(1, 49) for backend in ("eager", "sdpa")})
    build_report(db, ["dense"], tmp_path / "r")
    for file in ("latency_throughput_bert-tiny-base-fp32.png", "speedup_bert-tiny-base-fp32.png"):
        fig = drawn[file]
        for ax in fig.axes:
            labels = ax.get_xticklabels()
            named = [t.get_text() for t in labels if t.get_text()]
            assert len(labels) == 48 and 2 <= len(named) <= plots.AXIS_LABELS, (file, named)
            assert named[0] == "1" and named[-1] == "48"  # the ends are always named
            assert _apart(_text_boxes(fig, labels)), f"{file}: batch labels overlap"


def test_heatmap_panel_titles_do_not_run_into_each_other(tmp_path, drawn):
    db = str(tmp_path / "s.db")
    backends_ = ("eager", "sdpa", "sdpa-math", "sdpa-efficient", "compile", "cudagraph")
    make_run(db, "a-run-name-long-enough-to-fold", [(cell(b, 1, 8), ok_result(_samples(2.0), 1)) for b in backends_])
    make_run(db, "another-run-name-as-long-as-it", [(cell(b, 1, 8), ok_result(_samples(3.0), 1)) for b in backends_])
    build_report(db, ["a-run-name-long-enough-to-fold", "another-run-name-as-long-as-it"], tmp_path / "r")
    fig = drawn["tflops_heatmap_bert-tiny-base-fp32.png"]
    titles = [ax.title for ax in fig.axes if ax.get_title()]
    assert len(titles) == 12 and _apart(_text_boxes(fig, titles))


def test_latency_distribution_of_many_runs_stays_within_the_row_width(tmp_path, drawn):
    db = str(tmp_path / "s.db")
    make_run(db, "many", [(cell(f"backend-{i}", 1, 8), ok_result(_samples(1.0 + i / 10), 1)) for i in range(55)])
    build_report(db, ["many"], tmp_path / "r")
    fig = drawn["latency_dist_bert-tiny-base-fp32.png"]
    assert fig.get_figwidth() <= plots.PANEL_ROW_WIDTH
    (ax,) = fig.axes
    assert len([t for t in ax.get_xticklabels() if t.get_text()]) == 55  # every box keeps its name


def test_latency_distribution_says_each_box_sample_count(tmp_path, drawn):
    db = str(tmp_path / "s.db")
    make_run(db, "few", [(cell("eager", 1, 8), ok_result([1.0, 1.2, 1.1], 1)),
                         (cell("sdpa", 1, 8), ok_result(_samples(1.0, 2500), 1))])
    build_report(db, ["few"], tmp_path / "r")
    fig = drawn["latency_dist_bert-tiny-base-fp32.png"]
    (ax,) = fig.axes
    assert [t.get_text() for t in ax.get_xticklabels()] == ["eager\nn=3", "sdpa\nn=2,500"]
    assert "n= samples a box" in fig._suptitle.get_text().replace("\n", " ")


def test_latency_distribution_of_a_large_grid_draws_a_spread_of_its_points(tmp_path, drawn):
    db = str(tmp_path / "s.db")
    grid = [(b, s) for s in (8, 16, 32) for b in range(1, 21)]  # 60 points
    make_run(db, "grid", [(cell("eager", b, s), ok_result(_samples(1.0 + b / 10, 5), b)) for b, s in grid])
    build_report(db, ["grid"], tmp_path / "r")
    fig = drawn["latency_dist_bert-tiny-base-fp32.png"]
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert len(titles) == plots.DIST_PANELS == len(set(titles))
    assert titles[0] == "batch 1, seq 8" and titles[-1] == "batch 20, seq 32"  # both ends of the grid
    assert "48 of 60 batch x seq points, spread evenly" in fig._suptitle.get_text().replace("\n", " ")


def test_a_heatmap_of_hundreds_of_batches_keeps_the_size_of_a_written_grid(tmp_path, drawn):
    """A heatmap panel grew 0.45 inch a batch, each cell's value written in it: 600 batches of a 3,000-cell run made
    a 2.6 MB PNG, 3.4 MB of its 6.3 MB report.html. Past plots.HEATMAP_CELLS batches the panel keeps the size of
    that many, its cells coloured only (the title sends the reader to the tables) and its axis names spread."""
    from transbench.report.data import load
    from transbench.store import Store

    def heatmap(batches: int):
        db = str(tmp_path / f"b{batches}.db")
        _run(db, "wide", {(b, n, seq): 0.1 * n * seq for b in ("eager", "sdpa") for n in range(1, batches + 1)
                          for seq in (8, 16)})
        store, out = Store(db, readonly=True), tmp_path / f"out{batches}"
        out.mkdir()
        try:
            (figure,) = plots.efficiency_heatmap(load(store, ["wide"]), out)
        finally:
            store.close()
        return figure, drawn[figure.path.name]

    small, small_fig = heatmap(plots.HEATMAP_CELLS)
    wide, wide_fig = heatmap(300)
    assert len(small_fig.axes[0].texts) == plots.HEATMAP_CELLS * 2  # each value written, as before
    assert not wide_fig.axes[0].texts and "values in the tables" in wide.title
    assert list(wide_fig.get_size_inches()) == list(small_fig.get_size_inches())
    assert len([t for t in wide_fig.axes[0].get_yticklabels() if t.get_text()]) <= plots.AXIS_LABELS + 1
    assert len(wide.points) == 300 * 2 * 2  # every measured cell still in the figure's data
    assert wide.path.stat().st_size < 2 * small.path.stat().st_size  # was 0.45 inch of PNG a batch
