"""The serve section of the report: latency percentiles against offered load per backend (the curve that
bends up at saturation), achieved against offered rate, the load table and the max-rate table."""

from __future__ import annotations

import math
from pathlib import Path

from ..keys import KEYS
from ..store import export
from .data import ReportData, by_scenario, groups, is_ok
from .document import Figure, Section, Table, measured, num
from .plots import DISK_ERRORS

LOAD_COLS = ("backend", "mode", "offered_rate", "achieved_rate", "error_rate", "latency_p50_ms", "latency_p90_ms", "latency_p99_ms",
             "latency_p99_upper_ms", "latency_p999_ms", "latency_max_ms", "n_requests", "goodput", "mean_batch",
             "busy_share", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "itl_p50_ms", "itl_p99_ms",
             "tokens_per_s", "client_lag_p99_ms", "graphs_captured_under_load", "j_per_request", "rel_err")
# new_tokens: a generation table's title said neither how many tokens a request asked for nor (column) its tokens/s
# An upper figure stays beside its percentile even where every cell's is empty: the section's text says an empty
# one means too few requests for the percentile, and a missing column said nothing.
PAIRED = {"latency_p99_upper_ms": "latency_p99_ms"}
SETTINGS = ("run_name", "model", "task", "dtype", "lengths", "new_tokens", "max_batch_size", "max_wait_ms", "slo_ms",
            "slo")


def _level(r: dict) -> str:
    if r.get("mode") == "rate":
        kind = r.get("arrivals") or "Poisson"
        return f"{r.get('rate'):g}/s {kind}"
    if r.get("mode") == "trace":
        return f"trace {r.get('trace')} x{r.get('trace_speed'):g}"
    if r.get("mode") == "concurrency":
        return f"{r.get('concurrency')} clients"
    return str(r.get("mode"))


def load_tables(recs: list[dict]) -> list[Table]:
    out = []
    for key, rows in groups(recs, SETTINGS).items():
        cols = [k for k in LOAD_COLS if any(r.get(PAIRED.get(k, k)) is not None or r.get(k) is not None
                                            for r in rows)]
        body = [[_level(r) if k == "mode" else measured(r, k) if k != "backend" else str(r.get(k))
                 for k in cols] for r in rows]
        title = "serve: " + ", ".join(f"{k}={v}" for k, v in zip(SETTINGS, key) if v is not None)
        out.append(Table(title, [KEYS[k].title for k in cols], body))
    return out


def max_rate_table(recs: list[dict], multi_run: bool = False) -> Table | None:
    if not recs:
        return None
    # With several runs, a run column: two runs' rows of one backend were otherwise the same text with other numbers.
    rows = [[*([str(r.get("run_name"))] if multi_run else []), str(r.get("backend")), str(r.get("model")),
             str(r.get("dtype")), str(r.get("lengths")), _target(r), measured(r, "max_rate"),
             measured(r, "latency_p50_ms"), measured(r, "latency_p99_ms"), measured(r, "latency_p99_upper_ms"),
             measured(r, "prepare_s"), measured(r, "offline_rate")] for r in recs]
    return Table("largest rate meeting the target (bisection; every probe is a serve cell; a verdict by MLPerf "
                 "LoadGen's early-stopping rule, p99 upper its estimate)",
                 [*(["run"] if multi_run else []), "backend", "model", "dtype", "lengths", "target", "max rate /s",
                  "p50 ms", "p99 ms", "p99 upper ms", "prepare s", "offline /s"], rows)


def _target(r: dict) -> str:
    if r.get("slo"):
        e2e = f",e2e:{num(r.get('slo_ms'))}" if r.get("slo_ms") is not None else ""
        return f"{num(r.get('percentile'))}% meet {r.get('slo')}{e2e}"
    return f"p{num(r.get('percentile'))} <= {num(r.get('slo_ms'))} ms"


def figures(recs: list[dict], out: Path) -> list[Figure]:
    from matplotlib.figure import Figure as MplFigure

    from .plots import _log_axes, backend_color, quiet_glyphs, wrap

    # p50 is every measured load's; p99 and p99.9 only where its requests carry them (measure/timer.carried): a
    # load of 84 requests has none, and is drawn by its median
    rated = [r for r in recs if r.get("mode") == "rate" and is_ok(r, "latency_p50_ms")]
    figs = []
    for i, (key, rows) in enumerate(groups(rated, SETTINGS).items()):
        fig = MplFigure(figsize=(10, 3.8), dpi=110, layout="constrained")
        lat, ach = fig.subplots(1, 2)
        points = []
        for backend, brows in groups(rows, ("backend",)).items():
            brows = sorted(brows, key=lambda r: r["offered_rate"])
            x = [r["offered_rate"] for r in brows]
            # The backend's colour in every other plot (plots.BACKEND_COLORS): by its place in this group, fused
            # was drawn in eager's blue where it came first.
            color = backend_color(backend[0])
            for pkey, style in (("latency_p50_ms", ":"), ("latency_p99_ms", "-"), ("latency_p999_ms", "--")):
                ys = [math.nan if r.get(pkey) is None else r[pkey] for r in brows]
                if not all(map(math.isnan, ys)):
                    lat.plot(x, ys, style, color=color, marker="o", label=wrap(f"{backend[0]} {pkey[8:-3]}"))
            ach.plot(x, [r["achieved_rate"] for r in brows], color=color, marker="o", label=wrap(backend[0]))
            points += [{"backend": backend[0], "offered_rate": r["offered_rate"], "achieved_rate": r["achieved_rate"],
                        "latency_p99_ms": r.get("latency_p99_ms")} for r in brows]
        slo = key[SETTINGS.index("slo_ms")]
        if slo:
            lat.axhline(slo, color="grey", lw=0.8)
        _log_axes(lat)  # ticks as plain numbers (2, 5, 10), as in the other plots, not 2 x 10^0
        # The percentiles' sample counts: a p99.9 of 900 requests is their slowest, not a tail estimate.
        counts = sorted(r["n_requests"] for r in rows if r.get("n_requests") is not None)
        told = "" if not counts else f"{counts[0]:,}" if counts[0] == counts[-1] else f"{counts[0]:,}..{counts[-1]:,}"
        lat.set(xlabel="offered rate (requests/s)", ylabel="latency (ms)",
                title="latency vs load" + (f" (n={told} requests a load)" if counts else ""))
        top = max(r["offered_rate"] for r in rows)
        ach.plot([0, top], [0, top], color="grey", lw=0.8)
        ach.set(xlabel="offered rate (requests/s)", ylabel="achieved rate (requests/s)", title="achieved vs offered")
        lat.legend(fontsize=7)
        ach.legend(fontsize=7)
        path = out / f"serve_{i}.png"
        with quiet_glyphs():
            export.save_figure(fig, path)
        figs.append(Figure(path, "serve: " + ", ".join(str(v) for v in key if v is not None), points))
    return figs


def section(data: ReportData, out: Path) -> Section | None:
    """The report's serve section, or None when the runs hold no serve cell."""
    recs = by_scenario(data.records, "serve")
    top = max_rate_table(by_scenario(data.records, "serve-max-rate"), data.multi_run)
    if not recs and top is None:
        return None
    blocks: list = ["Latency runs from a request's planned arrival to its result on the host (no coordinated "
                    "omission); goodput is the share of requests meeting every objective. An upper figure is MLPerf "
                    "LoadGen's early-stopping estimate of its percentile (an upper bound at 99% confidence), empty "
                    "where the load had fewer requests than the percentile needs (662 for p99)."]
    if top is not None:
        blocks.append(top)
    blocks += load_tables(recs)
    try:
        blocks += figures(recs, out)
    except OSError as exc:
        if exc.errno in DISK_ERRORS:  # the folder, not the plot (plots.DISK_ERRORS)
            raise
        blocks.append(f"serve plot failed: {type(exc).__name__}: {exc}")
    except Exception as exc:  # noqa: BLE001 - a broken plot must not cost the tables
        blocks.append(f"serve plot failed: {type(exc).__name__}: {exc}")
    return Section("Serving under load", blocks)
