"""The roofline model: which ceiling bounds an operation, and a log-log plot of measured points.

An operation of arithmetic intensity I (FLOPs per byte moved) can reach at most
min(peak FLOP/s, I x memory bandwidth). The ridge point peak / bandwidth separates memory-bound
operations (left of it) from compute-bound ones (right of it).

    from transbench.report.roofline import plot_roofline
    plot_roofline([{"label": "qkv", "intensity": 410.0, "tflops": 512.0}], 989.4, 3350, "roofline.png")
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def ridge_point(peak_tflops: float, bandwidth_gbs: float) -> float:
    """The intensity (FLOP/byte) at which the bandwidth slope meets the compute ceiling."""
    return peak_tflops * 1e12 / (bandwidth_gbs * 1e9)


def attainable_tflops(intensity: float, peak_tflops: float, bandwidth_gbs: float) -> float:
    return min(peak_tflops, intensity * bandwidth_gbs * 1e9 / 1e12)


def bound(intensity: float, peak_tflops: float | None, bandwidth_gbs: float | None) -> str | None:
    """'compute' or 'memory' for an operation of this intensity on these ceilings; None when a ceiling
    is unknown (no guessing)."""
    if not peak_tflops or not bandwidth_gbs:
        return None
    return "compute" if intensity >= ridge_point(peak_tflops, bandwidth_gbs) else "memory"


def roofline_points(records: list[dict]) -> list[dict]:
    """The ok micro-benchmark records with an intensity, as points for plot_roofline (here, not in
    scenarios/micro, so the report draws them without importing a higher layer)."""
    out = []
    for r in records:
        if r.get("status") != "ok" or not r.get("intensity") or not r.get("tflops"):
            continue
        # .get: a record without a key the current code writes (an older store) is a point, not a failed plot
        if r.get("scenario") == "micro-breakdown":
            label, group = r.get("part"), r.get("bound") or r.get("dtype")
        elif r.get("scenario") == "micro-gemm":
            label = f"n={r.get('m')}" if r.get("shape") == "square" else r.get("shape")
            group = r.get("dtype")
        else:
            label, group = f"{r.get('op')} {r.get('elements')}", r.get("op")
        out.append({"label": label, "intensity": r["intensity"], "tflops": r["tflops"], "group": group})
    return out


def plot_roofline(points: Iterable[Mapping], peak_tflops: float | Mapping[str, float] | None,
                  bandwidth_gbs: float | None, path: str, title: str = "roofline") -> str:
    """Write a log-log roofline PNG to `path` and return the path.

    points: mappings with "intensity" (FLOP/byte), "tflops" (achieved), "label" (annotated next to the
    point) and optionally "group" (points of one group share a colour and a legend entry). Points
    without a positive intensity and TFLOPS are left out (they cannot sit on a log axis).
    peak_tflops: one compute ceiling, or {name: TFLOPS} to draw several (e.g. one per dtype);
    bandwidth_gbs: the memory ceiling in GB/s (1e9 bytes). A ceiling that is None is not drawn.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from ..store import export

    pts = [p for p in points if (p.get("intensity") or 0) > 0 and (p.get("tflops") or 0) > 0]
    peaks = dict(peak_tflops) if isinstance(peak_tflops, Mapping) else ({"peak": peak_tflops} if peak_tflops else {})
    peaks = {k: v for k, v in peaks.items() if v}
    xs = [p["intensity"] for p in pts] or [1.0]
    lo, hi = min(xs) / 4, max(xs) * 4
    for v in peaks.values():
        if bandwidth_gbs:
            r = ridge_point(v, bandwidth_gbs)
            lo, hi = min(lo, r / 4), max(hi, r * 4)

    # The object API (no pyplot): nothing global changes in the caller's process.
    fig = Figure(figsize=(8, 5.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    grid = [lo * (hi / lo) ** (k / 200) for k in range(201)]
    for n, (name, peak) in enumerate(sorted(peaks.items(), key=lambda kv: -kv[1])):
        style = dict(color="black", lw=1.5 if n == 0 else 1.0, ls="-" if n == 0 else "--")
        if bandwidth_gbs:
            ax.plot(grid, [attainable_tflops(x, peak, bandwidth_gbs) for x in grid], **style)
        else:
            ax.axhline(peak, **style)
        ax.annotate(f"{name} {peak:.4g} TFLOPS", (hi, peak), ha="right", va="bottom", fontsize=8)
    if bandwidth_gbs and not peaks:
        ax.plot(grid, [x * bandwidth_gbs / 1e3 for x in grid], color="black", lw=1.5)
    if bandwidth_gbs:
        ax.annotate(f"{bandwidth_gbs:.4g} GB/s", (lo * 1.2, lo * 1.2 * bandwidth_gbs / 1e3), fontsize=8,
                    rotation=20, va="bottom")

    groups: dict[str, list[Mapping]] = {}
    for p in pts:
        groups.setdefault(str(p.get("group", "")), []).append(p)
    for name, members in groups.items():
        ax.scatter([p["intensity"] for p in members], [p["tflops"] for p in members], s=22, zorder=3,
                   label=name or None)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("TFLOPS")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    if any(groups):
        fig.legend(fontsize=8, loc="outside right center")  # as plots.figure_legend: clear of the title
    _label_points(fig, ax, [p for p in pts if p.get("label")])
    export.save_figure(fig, path, dpi=120)
    return path


# Offsets (points) tried for a label, nearest first: beside the marker, then further out on a leader line.
_RINGS = (6, 16, 28, 42, 58, 76, 96)
_ANGLES = (45, -45, 135, -135, 0, 180, 90, -90, 20, -20, 160, -160)


def _label_points(fig, ax, pts: list[Mapping]) -> None:
    """Annotate each point with its label where the text overlaps no other label, marker or the axes'
    edge. A label with no free place within the rings becomes a number next to its point, spelled out in
    a key under the axes, so labels never overlap however dense the points."""
    import math

    from matplotlib.text import Text

    fig.canvas.draw()  # lay out once, then freeze it: the free places are found in display pixels
    fig.set_layout_engine("none")
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    px = fig.dpi / 72
    taken = []
    for p in pts:
        x, y = ax.transData.transform((p["intensity"], p["tflops"]))
        taken.append((x - 4 * px, y - 4 * px, x + 4 * px, y + 4 * px))
    for text in ax.texts:  # the ceilings' names
        bb = text.get_window_extent(renderer)
        taken.append((bb.x0, bb.y0, bb.x1, bb.y1))

    def free(box) -> bool:
        inside = frame.x0 <= box[0] and box[2] <= frame.x1 and frame.y0 <= box[1] and box[3] <= frame.y1
        return inside and not any(box[0] < t[2] and t[0] < box[2] and box[1] < t[3] and t[1] < box[3]
                                  for t in taken)

    def place(text_value: str, xy) -> bool:
        for ring in _RINGS:
            for angle in _ANGLES:
                dx, dy = ring * math.cos(math.radians(angle)), ring * math.sin(math.radians(angle))
                text = ax.annotate(text_value, xy, xytext=(dx, dy), textcoords="offset points", fontsize=7,
                                   ha="left" if dx > 1 else "right" if dx < -1 else "center",
                                   va="bottom" if dy > 1 else "top" if dy < -1 else "center",
                                   arrowprops={"arrowstyle": "-", "lw": 0.5, "color": "gray"} if ring > 6 else None)
                text.update_positions(renderer)
                bb = Text.get_window_extent(text, renderer)  # the text alone, not its leader line
                box = (bb.x0 - px, bb.y0 - px, bb.x1 + px, bb.y1 + px)
                if free(box):
                    taken.append(box)
                    return True
                text.remove()
        return False

    key = []
    for p in sorted(pts, key=lambda q: (-q["tflops"], q["intensity"])):
        xy = (p["intensity"], p["tflops"])
        if not place(str(p["label"]), xy):
            key.append(str(p["label"]))
            if not place(str(len(key)), xy):
                ax.annotate(str(len(key)), xy, xytext=(3, 3), textcoords="offset points", fontsize=6)
    if key:
        ax.text(0.01, 0.99, "\n".join(f"{i}: {name}" for i, name in enumerate(key, start=1)), fontsize=7,
                va="top", transform=ax.transAxes, bbox={"facecolor": "white", "alpha": 0.8, "lw": 0})
