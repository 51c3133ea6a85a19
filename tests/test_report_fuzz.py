"""The report on odd but legal stored data: names that share a file-name spelling or are very long, several
runs of one serve or training shape, runs on machines with and without a datasheet peak, large grids, values
a log axis cannot hold, keys an older store lacks. Plots are read from the matplotlib figures (most are not
rendered: that is what takes the time)."""

from __future__ import annotations

import json
import statistics
import warnings

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from matplotlib.colors import to_hex
from report_helpers import bad_result, cell, make_run, ok_result

from transbench.report import build_report, plots
from transbench.report import serve as serve_report
from transbench.report import tables
from transbench.report.data import load
from transbench.report.document import Figure, Table
from transbench.store import Store


@pytest.fixture
def drawn(monkeypatch):
    """The figure behind each plot, by file name; not rendered (the PNG is not written)."""
    figs = {}

    def keep(fig, path, title, points):
        figs[path.name] = fig
        return Figure(path, title, points)

    monkeypatch.setattr(plots, "_save", keep)
    return figs


def _load(db: str, runs: list[str], baseline: str | None = None):
    store = Store(db, readonly=True)
    try:
        return load(store, runs, baseline)
    finally:
        store.close()


def _samples(ms: float, n: int = 5) -> list[float]:
    return [ms * (1 + 0.01 * i) for i in range(n)]


@pytest.mark.slow
def test_models_with_one_file_name_spelling_and_long_names_get_their_own_plots(tmp_path):
    db = str(tmp_path / "s.db")
    long_model = "/models/" + "x" * 300 + "/checkpoint"
    models = ["org/m", "org-m", "模型/一", "模型/二", "Bert", "bert", long_model]
    make_run(db, "names", [(cell("eager", 1, 8, model=m), ok_result(_samples(1.0 + i), 1))
                           for i, m in enumerate(models)])
    data = _load(db, ["names"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        figs = plots.latency_throughput(data, tmp_path)
    # one file per model: "org/m" and "org-m" (and the two CJK names, and Bert/bert on a case-insensitive file
    # system) were written to one path, the second plot over the first; the long path was an OSError
    names = [f.path.name for f in figs]
    assert len(figs) == len(models) and len({n.lower() for n in names}) == len(models), names
    assert all(len(n.encode()) < 255 and f.path.is_file() for n, f in zip(names, figs))
    assert sorted(p["value"] for f in figs for p in f.points if p["plot"] == "latency_ms") == \
        pytest.approx([1.02 + 1.02 * i for i in range(len(models))])
    assert "latency_throughput_bert-base-fp32.png" in names  # a plain name keeps its plain file name
    # a script the font lacks is drawn as boxes, without a warning per character on stderr
    assert not [w for w in caught if "Glyph" in str(w.message)]


def test_long_run_and_model_names_are_folded_in_figures(tmp_path, drawn):
    db = str(tmp_path / "s.db")
    model = "org/" + "m" * 150
    for run, batch in (("run-" + "a" * 120, 1), ("run-" + "b" * 120, 1)):
        make_run(db, run, [(cell("sdpa", batch, 8, model=model), ok_result(_samples(1.0), batch))])
    data = _load(db, ["run-" + "a" * 120, "run-" + "b" * 120])
    plots.latency_throughput(data, tmp_path)
    (fig,) = drawn.values()
    # A 150-character title and 125-character legend entries pushed both off the image and collapsed the axes.
    assert max(len(line) for line in fig.get_suptitle().splitlines()) <= max(48, fig.get_figwidth() * 8)
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert len(legend) == 2 and all(len(line) <= 40 for text in legend for line in text.splitlines())
    assert sorted(t.replace("\n", "") for t in legend) == sorted(f"{r}/sdpa" for r in ("run-" + "a" * 120,
                                                                                      "run-" + "b" * 120))


def _serve_run(db: str, name: str, backends: list[str]) -> None:
    store = Store(db)
    run_id, _ = store.create_run(name, "serve", {}, {"gpus": []})
    for backend in backends:
        for rate in (10.0, 100.0):
            ident = {"scenario": "serve", "model": "bert-tiny", "task": "base", "backend": backend, "dtype": "fp32",
                     "mode": "rate", "lengths": "fixed:32", "max_batch_size": 8, "max_wait_ms": 2.0, "slo_ms": 10.0,
                     "seed": 0, "activation": None, "rate": rate}
            rec = {**ident, "device": "cpu", "batch_size": 8, "offered_rate": rate, "achieved_rate": rate * 0.9,
                   "latency_ms": 2.0, "latency_p50_ms": 2.0, "latency_p99_ms": 4.0, "latency_p999_ms": 5.0,
                   "goodput": 0.99, "mean_batch": 1.5, "n_requests": int(rate * 60)}
            store.put_cell(run_id, json.dumps(ident, sort_keys=True), "serve", "ok", rec, cell={}, samples=[2.0])
        ident = {"scenario": "serve-max-rate", "model": "bert-tiny", "task": "base", "backend": backend,
                 "dtype": "fp32", "mode": "max-rate", "lengths": "fixed:32", "slo_ms": 10.0}
        store.put_cell(run_id, json.dumps(ident, sort_keys=True), "serve-max-rate", "ok",
                       {**ident, "max_rate": 50.0 if name == "one" else 80.0, "percentile": 99, "offline_rate": 200.0},
                       cell={})
    store.close()


def test_serve_plots_keep_backend_colours_and_the_max_rate_table_names_runs(tmp_path, monkeypatch):
    from matplotlib.figure import Figure as MplFigure

    db = str(tmp_path / "s.db")
    _serve_run(db, "one", ["fused", "sdpa"])
    _serve_run(db, "two", ["sdpa", "eager"])
    data = _load(db, ["one", "two"])
    figs = []
    monkeypatch.setattr(MplFigure, "savefig", lambda self, path, **kw: figs.append(self))
    section = serve_report.section(data, tmp_path)
    # fused came first in its plot and was drawn in eager's blue: every backend has its one colour
    assert len(figs) == 2
    for fig in figs:
        for ax in fig.axes:
            for line in ax.get_lines():
                backend = line.get_label().split(" ")[0]
                if not backend.startswith("_"):
                    assert to_hex(line.get_color()) == plots.backend_color(backend), line.get_label()
    # the percentiles drawn say how many requests each load held
    assert [fig.axes[0].get_title() for fig in figs] == ["latency vs load (n=600..6,000 requests a load)"] * 2
    top = next(b for b in section.blocks if isinstance(b, Table) and b.title.startswith("largest rate"))
    # two runs' sdpa rows differed only in their numbers
    assert top.headers[0] == "run"
    assert sorted((row[0], row[1]) for row in top.rows) == [("one", "fused"), ("one", "sdpa"), ("two", "eager"),
                                                            ("two", "sdpa")]


@pytest.mark.slow
def test_heatmap_of_runs_with_and_without_a_datasheet_peak_leaves_no_run_out(tmp_path, drawn):
    db = str(tmp_path / "s.db")
    make_run(db, "h100", [(cell("sdpa", b, 8, dtype="fp16"), ok_result(_samples(b), b, gpu="H100", mfu=0.0004 * b))
                          for b in (1, 2)])
    make_run(db, "other", [(cell("sdpa", b, 8, dtype="fp16"), ok_result(_samples(b), b, gpu="mystery GPU"))
                           for b in (1, 2)] + [(cell("sdpa", 4, 8, dtype="fp16"), ok_result(_samples(4), 4, tflops=None))])
    (both,) = plots.efficiency_heatmap(_load(db, ["h100", "other"]), tmp_path)
    # MFU for the first run only dropped the second run's panel from the heatmap, unsaid: TFLOPS for both
    assert both.path.name.startswith("tflops_heatmap")
    assert {(p["series"], p["batch"]) for p in both.points} == {(r, b) for r in ("h100/sdpa", "other/sdpa")
                                                                for b in (1, 2)}
    # an ok cell without the figure (an older store) says so instead of an empty square
    assert "n/a" in [t.get_text() for ax in drawn[both.path.name].axes for t in ax.texts]
    drawn.clear()
    (mfu,) = plots.efficiency_heatmap(_load(db, ["h100"]), tmp_path)
    fig = drawn[mfu.path.name]
    texts = {t.get_text(): t.get_color() for ax in fig.axes for t in ax.texts}
    # 0.04% read "0.0%", as if nothing ran; the top of the scale (yellow) had white text on it
    assert set(texts) == {"0.04%", "0.08%"}
    assert texts["0.08%"] == "black"


def test_training_scaling_keeps_runs_and_settings_apart(tmp_path, drawn):
    db = str(tmp_path / "s.db")
    store = Store(db)
    for name, factor in (("a100", 1.0), ("h100", 2.0)):
        run_id, _ = store.create_run(name, "training", {}, {})
        for n in (1, 2):
            for ckpt in (False, True):
                rec = {"scenario": "training", "model": "bert-tiny", "task": "mlm", "backend": "sdpa",
                       "dtype": "bf16", "batch_size": 8, "seq_len": 128, "world_size": n,
                       "strategy": "ddp" if n > 1 else "none", "grad_ckpt": ckpt, "latency_ms": 80.0,
                       "samples_per_s": 100.0 * n * factor * (0.7 if ckpt else 1.0)}
                store.put_cell(run_id, json.dumps({"n": n, "ckpt": ckpt}), "training", "ok", rec, cell={})
    store.close()
    (fig,) = plots.training_scaling(_load(db, ["a100", "h100"]), tmp_path)
    legend = [t.get_text() for t in drawn["training_scaling.png"].legends[0].get_texts()]
    # two runs, grad ckpt off and on: four series (they were one legend entry, the values drawn over each other)
    assert len(legend) == 4 and len(set(legend)) == 4
    throughput = {(p["series"], p["world_size"]): p["value"] for p in fig.points if p["plot"] == "samples_per_s"}
    assert sorted(throughput.values()) == sorted(100.0 * n * f * c for n in (1, 2) for f in (1.0, 2.0)
                                                 for c in (0.7, 1.0))


@pytest.mark.slow
def test_large_grids_wrap_their_panels(tmp_path, drawn):
    db = str(tmp_path / "s.db")
    backends = ["eager", "sdpa", "fused", "cudagraph", "compile", "sdpa-flash"]
    seqs = [8, 16, 32, 64, 128, 256, 512, 1024]
    make_run(db, "grid", [(cell(b, 1, s), ok_result(_samples(0.001 * s), 1, mfu=0.3))
                          for b in backends for s in seqs], spec={"baseline": "eager"})
    data = _load(db, ["grid"])
    for plot in (plots.latency_throughput, plots.speedup_memory, plots.efficiency_heatmap):
        plot(data, tmp_path)
    # One row of eight lengths (or six heatmaps) was 40 to 50 inches wide: unreadable once fitted to a page.
    for name, fig in drawn.items():
        assert fig.get_figwidth() <= 25, (name, fig.get_figwidth())
    panels = [ax for ax in drawn["latency_throughput_bert-tiny-base-fp32.png"].axes if ax.get_title()]
    assert sorted(ax.get_title() for ax in panels) == sorted(f"seq {s}" for s in seqs for _ in range(2))
    # three runs of the same points: 18 boxes a panel, four panels a row made a 49-inch row
    for run in ("r1", "r2", "r3"):
        make_run(db, run, [(cell(b, 1, s), ok_result(_samples(0.001 * s), 1)) for b in backends for s in seqs[:4]])
    drawn.clear()
    (dist,) = plots.latency_distributions(_load(db, ["r1", "r2", "r3"]), tmp_path)
    fig = drawn[dist.path.name]
    assert fig.get_figwidth() <= 25 and len(dist.points) == 3 * 6 * 4


def test_zero_throughput_is_not_drawn_on_a_log_axis(tmp_path, drawn):
    db = str(tmp_path / "s.db")
    make_run(db, "zero", [(cell("eager", 1, 8), ok_result(_samples(1e-6), 1)),
                          (cell("eager", 2, 8), ok_result(_samples(1e6), 2, throughput_per_s=0.0))])
    (fig,) = plots.latency_throughput(_load(db, ["zero"]), tmp_path)
    throughput = [p for p in fig.points if p["plot"] == "throughput_per_s"]
    # the 0 had no place on the log axis: its line ran off the bottom edge, and it was listed as drawn
    assert [p["batch"] for p in throughput] == [1]
    texts = [t.get_text() for ax in drawn[fig.path.name].axes for t in ax.texts]
    assert "1 value(s) <= 0 not drawn (log axis)" in texts


# Times up to 1e300 ms: matplotlib's linear ticks cannot step through an axis near the largest float at all (a plot
# that fails is a line in report.md, and the others are written).
FINITE_MS = st.floats(min_value=0.0, max_value=1e300, allow_nan=False, allow_infinity=False)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(samples=st.lists(st.lists(FINITE_MS, min_size=1, max_size=6), min_size=2, max_size=3))
@example(samples=[[0.0], [1.0000000000022387e+307]])
@example(samples=[[1e-300, 1e300], [1.7e308, 5e-324]])
def test_any_finite_samples_a_store_holds_make_every_plot_and_no_warning(tmp_path_factory, samples):
    """A store reads any finite time of 0 ms or more. Times that span more decades than a float (1e-300 beside
    1e300 ms) printed numpy's overflow RuntimeWarnings with matplotlib's source lines, and one near the largest
    float lost the distributions plot ("Axis limits cannot be NaN or Inf")."""
    from transbench.cells import CellResult

    folder = tmp_path_factory.mktemp("finite")
    db = str(folder / "s.db")
    results = []
    for batch, s in enumerate(samples, start=1):
        med = statistics.median(s)
        record = {"latency_ms": med, "latency_p99_ms": max(s), "n_samples": len(s), "rel_err": 1e-7}
        results.append((cell("eager", batch, 8), CellResult("ok", record=record, samples_ms=s)))
    make_run(db, "a", results)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        paths = build_report(db, ["a"], folder / "out")
    assert not caught, sorted({f"{w.category.__name__}: {w.message}" for w in caught})
    assert "failed" not in paths.markdown.read_text()


def test_records_without_keys_of_newer_stores(tmp_path):
    db = str(tmp_path / "s.db")
    store = Store(db)
    for name in ("t1", "t2"):  # keys that are not JSON, as Store.put_cell takes them
        run_id, _ = store.create_run(name, "training", {}, {"gpus": ["A10G"]})  # a GPU as a bare name
        store.put_cell(run_id, "step", "training", "ok", {"scenario": "training", "model": "m", "backend": "sdpa",
                                                          "world_size": 1, "samples_per_s": 10.0, "latency_ms": 8.0},
                       cell={}, samples=[8.0] * 30)
    run_id, _ = store.create_run("micro", "micro", {}, {})
    # a GEMM without its shape and sizes, a breakdown part without its name
    store.put_cell(run_id, "g", "micro-gemm", "ok", {"scenario": "micro-gemm", "dtype": "fp16", "tflops": 3.0,
                                                     "intensity": 100.0}, cell={})
    store.put_cell(run_id, "b", "micro-breakdown", "ok", {"scenario": "micro-breakdown", "tflops": 1.0,
                                                          "intensity": 10.0}, cell={})
    store.close()
    # a traceback (JSONDecodeError in the comparison, AttributeError in the runs table) before
    paths = build_report(db, ["t1", "t2"], tmp_path / "r")
    assert "A10G" in paths.markdown.read_text() and len(paths.comparisons) == 1
    (roof,) = plots.roofline(_load(db, ["micro"]), tmp_path)  # was "plot roofline failed: KeyError: 'shape'"
    assert sorted(p["value"] for p in roof.points) == [1.0, 3.0]
    assert tables.runs_table(_load(db, ["t1"])).rows[0][4] == "A10G"


def test_an_ok_cell_without_raw_samples_is_not_drawn_as_a_failure(tmp_path, drawn):
    db = str(tmp_path / "s.db")
    bare = ok_result(_samples(2.0), 1)
    bare.samples_ms = []  # a store that kept no raw samples
    make_run(db, "bare", [(cell("eager", 1, 8), ok_result(_samples(1.0), 1)), (cell("sdpa", 1, 8), bare)])
    (fig,) = plots.latency_distributions(_load(db, ["bare"]), tmp_path)
    (ax,) = drawn[fig.path.name].axes
    (text,) = ax.texts
    assert (text.get_text(), text.get_color()) == ("no samples", "dimgray")  # was "ok", in a failure's red


def test_runs_with_other_cell_settings_do_not_share_a_column(tmp_path):
    from dataclasses import replace

    db = str(tmp_path / "s.db")
    make_run(db, "fixed", [(cell("sdpa", 1, 8), ok_result(_samples(1.0), 1))])
    make_run(db, "varied", [(replace(cell("sdpa", 2, 8), seq_stdev=4.0), ok_result(_samples(2.0), 2))])
    data = _load(db, ["fixed", "varied"])
    (table,) = tables.engine_tables(data)
    # one "sdpa" column held a fixed-length batch 1 and a variable-length batch 2, the table saying neither
    assert table.headers == ["Batch size", "fixed/sdpa Latency (ms)", "fixed/sdpa QPS (seq/s)",
                             "varied/sdpa Latency (ms)", "varied/sdpa QPS (seq/s)"]


def test_failed_cells_that_differ_in_task_or_gpu_count_are_told_apart(tmp_path):
    db = str(tmp_path / "s.db")
    make_run(db, "tasks", [(cell("sdpa", 1, 8, task=t), bad_result("oom", "out of memory"))
                           for t in ("base", "classification")])
    store = Store(db)
    run_id, _ = store.create_run("train", "training", {}, {})
    for n in (1, 2):
        rec = {"scenario": "training", "model": "m", "backend": "sdpa", "dtype": "bf16", "batch_size": 8,
               "seq_len": 128, "world_size": n, "strategy": "ddp"}
        store.put_cell(run_id, json.dumps({**rec, "gpus": n}, sort_keys=True), "training", "timeout", rec, cell={})
    store.close()
    for runs in (["tasks"], ["train"], ["tasks", "train"]):
        problems = tables.problems_table(_load(db, runs))
        # the same model, backend and point under two tasks (or two GPU counts): two identical rows before
        assert len({tuple(row) for row in problems.rows}) == len(problems.rows) == (4 if len(runs) > 1 else 2)


def test_the_report_counts_the_serve_plots_it_wrote(tmp_path):
    db = str(tmp_path / "s.db")
    _serve_run(db, "one", ["sdpa"])
    paths = build_report(db, ["one"], tmp_path / "r")
    # `transbench report` said "wrote ... and 0 plot(s)" beside the serve plot it had written
    assert [p.name for p in paths.plots] == ["serve_0.png"] and paths.plots[0].is_file()


def test_a_failed_max_batch_search_shows_no_largest_batch(tmp_path):
    from dataclasses import replace

    from transbench.runner.sweep import max_batch_key, store_result

    db = str(tmp_path / "s.db")
    run_id = make_run(db, "mb", [])
    store = Store(db)
    for backend, result, batch in (("eager", ok_result(_samples(9.0), 512), 512),
                                   ("sdpa", bad_result("error", "RuntimeError: boom"), 0)):  # as the search stores it
        c = replace(cell(backend, batch, 128), batch=batch)
        store_result(store, run_id, c, result, key=max_batch_key(c), scenario="max-batch")
    store.close()
    table = tables.max_batch_table(_load(db, ["mb"]))
    column = table.headers.index("largest batch")
    # "largest batch 0" beside an error read as a measured answer
    assert [row[column] for row in table.rows] == ["512", "error"]


def test_a_name_past_label_max_is_drawn_cut_with_a_hash_and_stays_distinct():
    """Folding a 20,000-character backend name from a damaged store took matplotlib minutes (`report` timed out)."""
    from transbench.report import plots

    a, b = "x" * 10_000 + "a" + "x" * 10_000, "x" * 10_000 + "b" + "x" * 10_000
    drawn_a, drawn_b = plots.wrap(a), plots.wrap(b)
    assert drawn_a != drawn_b
    assert max(len(drawn_a), len(drawn_b)) <= plots.LABEL_MAX + 30  # the hash and the folds' line breaks
    assert plots.wrap("bert-tiny") == "bert-tiny"


def test_direction_and_control_characters_are_shown_as_escapes_in_the_report(tmp_path):
    """A checkpoint folder named with U+202E (right-to-left override) reversed the rest of report.md's and
    report.html's headings; the terminal already showed it as \\u202e."""
    db = str(tmp_path / "b.db")
    make_run(db, "a", [(cell("eager", 1, model="ck/\u202emodel"), ok_result([1.0, 1.1, 0.9] * 10, 1))])
    paths = build_report(db, ["a"], tmp_path / "out")
    for path in (paths.markdown, paths.html):
        text = path.read_text()
        assert "\u202e" not in text and "u202emodel" in text, path


def test_a_name_with_dollar_signs_is_drawn_as_it_is_in_every_plot(tmp_path):
    """matplotlib read `$...$` in a run name as math: `cost $x^2$` was drawn as a formula, and `$\\undefined{$`
    failed every plot of the report (ParseFatalException), exit 0 with no plots."""
    db = str(tmp_path / "d.db")
    for name in ("cost $x^2$ run", "bad $\\undefinedcmd{$ math"):
        make_run(db, name, [(cell(b, n), ok_result([1.0 * n, 1.1 * n, 0.9 * n] * 10, n)) for b in ("eager", "sdpa")
                            for n in (1, 2)])
    paths = build_report(db, ["cost $x^2$ run", "bad $\\undefinedcmd{$ math"], tmp_path / "out")
    assert not paths.plot_failures and len(paths.figures) >= 3, paths.plot_failures


def test_a_name_as_long_as_names_may_be_leaves_the_other_columns_of_runs(tmp_path):
    """One 1,000-character name claimed the whole terminal: `runs` showed the name column alone and said `--wide`
    would show the rest, an option it does not have."""
    from test_cli_input import invoke

    db = tmp_path / "l.db"
    make_run(str(db), "L" * 1000, [(cell("eager", 1), ok_result([1.0] * 30, 1))])
    out = invoke("runs", "--db", db).output
    assert "run id" in out and "inference" in out and "--wide" not in out, out


def test_matplotlib_s_own_tick_labels_stay_math_while_our_texts_are_drawn_as_they_are(tmp_path):
    # Turning math off for every text reached the log axes' tick labels, which matplotlib writes as math: the
    # roofline plot's axes read `$\mathdefault{10^{0}}$`
    from matplotlib.figure import Figure

    from transbench.store import export

    fig = Figure()
    ax = fig.subplots()
    ax.loglog([1, 10, 100], [1, 10, 100])
    ax.set_title("cost $x^2$ run")
    export.save_figure(fig, tmp_path / "f.png")
    labels = [t for t in ax.get_xticklabels() + ax.get_yticklabels() if "mathdefault" in t.get_text()]
    assert labels and all(t.get_parse_math() for t in labels)
    assert not ax.title.get_parse_math()
