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


def plot_roofline(points: Iterable[Mapping], peak_tflops: float | Mapping[str, float] | None,
                  bandwidth_gbs: float | None, path: str, title: str = "roofline") -> str:
    """Write a log-log roofline PNG to `path` and return the path.

    points: mappings with "intensity" (FLOP/byte), "tflops" (achieved), "label" (annotated next to the
    point) and optionally "group" (points of one group share a colour and a legend entry). Points
    without a positive intensity and TFLOPS are left out (they cannot sit on a log axis).
    peak_tflops: one compute ceiling, or {name: TFLOPS} to draw several (e.g. one per dtype);
    bandwidth_gbs: the memory ceiling in GB/s (1e9 bytes). A ceiling that is None is not drawn.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [p for p in points if (p.get("intensity") or 0) > 0 and (p.get("tflops") or 0) > 0]
    peaks = dict(peak_tflops) if isinstance(peak_tflops, Mapping) else ({"peak": peak_tflops} if peak_tflops else {})
    peaks = {k: v for k, v in peaks.items() if v}
    xs = [p["intensity"] for p in pts] or [1.0]
    lo, hi = min(xs) / 4, max(xs) * 4
    for v in peaks.values():
        if bandwidth_gbs:
            r = ridge_point(v, bandwidth_gbs)
            lo, hi = min(lo, r / 4), max(hi, r * 4)

    fig, ax = plt.subplots(figsize=(8, 5.5))
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
        for p in members:
            if p.get("label"):
                ax.annotate(str(p["label"]), (p["intensity"], p["tflops"]), fontsize=7, xytext=(3, 3),
                            textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("TFLOPS")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    if any(groups):
        ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def roofline_points(records: list[dict]) -> list[dict]:
    """The ok records with an intensity, as points for report.roofline.plot_roofline."""
    out = []
    for r in records:
        if r.get("status") != "ok" or not r.get("intensity") or not r.get("tflops"):
            continue
        if r.get("scenario") == "micro-breakdown":
            label, group = r["part"], r.get("bound") or r["dtype"]
        elif r.get("scenario") == "micro-gemm":
            label = f"n={r['m']}" if r["shape"] == "square" else r["shape"]
            group = r["dtype"]
        else:
            label, group = f"{r.get('op')} {r.get('elements')}", r.get("op")
        out.append({"label": label, "intensity": r["intensity"], "tflops": r["tflops"], "group": group})
    return out
