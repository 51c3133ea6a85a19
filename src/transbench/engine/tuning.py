"""Per-shape kernel choices, timed once on the device and kept on disk so a second process starts warm."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Callable

import torch


def cache_path() -> Path:
    root = os.environ.get("TRANSBENCH_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "transbench"
    return Path(root) / "engine-tuning.json"


def _gpu_ms(fn: Callable[[], object], reps: int, inner: int = 10) -> float:
    """Median GPU time of one fn() call. Calls shorter than ~0.2 ms are timed as a CUDA graph of `inner`
    back-to-back calls, as the engine runs them: timed one by one, the host's launch cost (higher for a
    Triton launch than a cuBLAS one) would decide the race instead of the kernels."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile, pick cuBLAS heuristics, allocate: all outside the timing
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    b.record()
    torch.cuda.synchronize()
    run, per = fn, 1
    if a.elapsed_time(b) < 0.2:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(inner):
                fn()
        run, per = graph.replay, inner
        run()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for a, b in ev:
        a.record()
        run()
        b.record()
    torch.cuda.synchronize()
    return sorted(a.elapsed_time(b) for a, b in ev)[reps // 2] / per


class Tuner:
    def __init__(self, path: Path | None = None):
        self.path = path or cache_path()
        try:
            self.table: dict[str, str] = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.table = {}

    @staticmethod
    def _device_key() -> str:
        # Choices are only valid for the GPU and library versions that measured them.
        return f"{torch.cuda.get_device_name()}|torch {torch.__version__}"

    def choose(self, key: str, candidates: dict[str, Callable[[], object]], reps: int = 20) -> str:
        """Fastest candidate name for `key` (median of CUDA-event timings); candidates that raise are skipped."""
        full = f"{self._device_key()}|{key}"
        if full in self.table and self.table[full] in candidates:
            return self.table[full]
        if torch.cuda.is_current_stream_capturing():  # cannot time inside a capture: first working default
            return next(iter(candidates))
        times = {}
        for name, fn in candidates.items():
            try:
                times[name] = _gpu_ms(fn, reps)
            except Exception:  # noqa: BLE001 - a backend that refuses this shape is simply not a candidate
                torch.cuda.synchronize()
        if not times:
            raise RuntimeError(f"no candidate ran for {key}")
        best = min(times, key=times.get)
        self.table[full] = best
        self._save()
        return best

    def _save(self) -> None:
        try:  # atomic replace: concurrent benchmark processes may share the file
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump(self.table, f, indent=0, sort_keys=True)
            os.replace(tmp, self.path)
        except OSError:
            pass  # a read-only home only costs re-tuning in the next process


_TUNER: Tuner | None = None


def tuner() -> Tuner:
    global _TUNER
    if _TUNER is None:
        _TUNER = Tuner()
    return _TUNER
