"""Per-shape kernel choices, timed once on the device and kept on disk so a second process starts warm.

Each op's candidates are first timed alone; the choices are then settled by timing whole captured forwards
(`Tuner.refine`): one with every op on its fastest library route, one with every op on its fastest route of
ours, then one per close runner-up. Next to its real neighbours a kernel can gain or lose what it did not alone
(under programmatic dependent launch a Triton kernel overlaps the previous kernel's tail, a cuBLAS one does not).
"""
from __future__ import annotations

import functools
import json
import os
import re
import stat
import statistics
import tempfile
import time
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, TypeVar

import torch

from .capture import capture, side_stream

T = TypeVar("T")
# Runners-up within this fraction of the winner's time alone are re-timed in the whole forward. Wide on purpose:
# on an H100, bert-base 1 x 512, routes picked alone by two tuning runs gave forwards of 0.551 and 0.583 ms.
RIVAL_MARGIN = 0.5
RIVALS_PER_OP = 4
# Candidates are timed in this many alternating rounds (median of the rounds), so that whatever drifts while they
# are timed (clocks, temperature) cannot favour the ones timed first. Two tuning runs on one H100 before this
# chose different routes for 12 of the 17 bert-base ops both tuned; 8 x 128 forwards replayed in 1.1067 vs 0.7094 ms.
ROUNDS = 4
MIN_GAIN = 0.01  # a rival replaces the winner only if the whole forward gets at least this much faster
# Wall time one shape may spend racing, closest rivals first: a bert-large 256 x 512 forward takes ~0.2 s, so
# racing every rival there would outlast a benchmark cell's timeout.
RACE_BUDGET_S = 10.0  # EngineOptions.race_budget_s
# Wall seconds a shape's first call may spend tuning (compile_model's tune_budget_s; None: no limit), Triton compiles
# included: the target asks a first call of bert-base at a new shape to cost at most 5 s on an H100, where tuning
# every route took 28-53 s. Past it, an op not yet tuned takes its default route, the first candidate it lists
# (cuBLAS for a GEMM, flash SDPA for attention: library kernels, nothing to compile), and no whole forward is
# raced. Such choices are saved as partial entries (PARTIAL): a later budgeted process takes them as they are (the
# serve scenario's --find-max-rate runs each probe in a new worker, which would otherwise tune every shape anew
# under load), and an unbudgeted one (`transbench tune`, api.tune) times every candidate and replaces them.
TUNE_BUDGET_S = 2.5
# The on-disk key of a partial entry: its full key behind this prefix, a plain string value like every other entry,
# so a table written by code that knows no partial entries loads here, and one written here loads there (where
# the prefixed keys match no lookup, and are kept when that code saves).
PARTIAL = "partial|"


TABLE_NAME = "engine-tuning.json"


def cache_path() -> Path:
    """The tuning table: $TRANSBENCH_CACHE_DIR/engine-tuning.json, else under $XDG_CACHE_HOME or ~/.cache."""
    root = os.environ.get("TRANSBENCH_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "transbench"
    return Path(root) / TABLE_NAME


def _event_ms(run: Callable[[], object], reps: int, per_sample: int = 1) -> float:
    """Median (the upper one for an even count) over `reps` CUDA-event samples of `per_sample` back-to-back
    run() calls, per call."""
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for a, b in ev:
        a.record()
        for _ in range(per_sample):
            run()
        b.record()
    torch.cuda.synchronize()
    return statistics.median_high(a.elapsed_time(b) for a, b in ev) / per_sample


def _gpu_ms(fn: Callable[[], object], reps: int, inner: int = 10) -> float:
    """Median GPU time of one fn() call. Calls shorter than ~0.2 ms are timed as a CUDA graph of `inner`
    back-to-back calls, as the engine runs them: timed one by one, the host's launch cost (higher for a
    Triton launch than a cuBLAS one) would decide the race instead of the kernels."""
    side = side_stream(torch.cuda.current_device())  # hundreds of candidates per shape: one stream strands no memory
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile, pick cuBLAS heuristics, allocate: all outside the timing
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    if _event_ms(fn, 1) >= 0.2:
        return _event_ms(fn, reps)
    graph = torch.cuda.CUDAGraph()
    with capture(graph, stream=side):  # on the stream warmed up above (graphs.GraphCache._graph says why)
        for _ in range(inner):
            fn()
    graph.replay()
    return _event_ms(graph.replay, reps) / inner


def replay_ms(run: Callable[[], object], budget_ms: float = 40.0) -> float:
    """Median GPU time of run() (a captured forward's replay) over about budget_ms of back-to-back runs,
    several runs per timed sample where one is short."""
    run()
    once = max(_event_ms(run, 1), 1e-3)
    inner = max(1, min(4, round(0.5 / once)))
    return _event_ms(run, max(3, min(15, round(budget_ms / (once * inner)))), inner)


def _family(name: str) -> str:
    """'triton128x64x8' -> 'triton', 'cublas+ln' -> 'cublas+ln', 'fp8+triton_gelu_q128x256xTrue' -> 'fp8+triton_gelu_q':
    routes that differ in more than a tile size (the config that ends the route's name)."""
    return re.sub(r"(?<!^fp)\d.*", "", name)  # the 8 of a leading "fp8" names the family, not a tile


def _ours(name: str) -> bool:
    """A route whose GEMM or attention is one of our Triton kernels, not a library's (cuBLAS, SDPA's kernels)."""
    return _family(name) in ("triton", "splitk")


def _fp8(name: str) -> bool:
    """A route whose GEMM runs in e4m3 (ops.TritonOps: fp8, fp8+add, fp8+gelu_q, fp8+ln, and our fp8 GEMM's
    fp8+triton, fp8+triton_gelu_q, fp8+triton+ln), or attention's that writes the next GEMM's e4m3 input
    (attention.dense: fp8+triton)."""
    return name.startswith("fp8")


def _rivals(ranked: list[str]) -> list[str]:
    """Of the winner (first) and its close runners-up (the rest, fastest first), the ones worth racing, at most
    RIVALS_PER_OP: the best of each other route family first (whole forwards differ most between families: under
    PDL a Triton kernel overlaps its predecessor's tail, a cuBLAS one does not), then the closest of the rest."""
    families, firsts = {_family(ranked[0])}, []
    for name in ranked[1:]:
        if _family(name) not in families:
            families.add(_family(name))
            firsts.append(name)
    return (firsts + [n for n in ranked[1:] if n not in firsts])[:RIVALS_PER_OP]


# The engine depends on nothing of the benchmark, so it keeps its own bounded reader of its table instead of the
# benchmark's input boundary (boundary.py): a table is a flat object of a few hundred short entries.
TABLE_MAX_BYTES = 16 * 2**20


def read_table(path: Path):
    """The table's JSON, read with limits: a regular file (a FIFO there blocked for ever), at most TABLE_MAX_BYTES,
    parsed with its nesting bounded (a document nested 100,000 deep was a RecursionError traceback). OSError
    when it cannot be read, ValueError when it is not a table's JSON."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise ValueError("it is not a regular file (a pipe, a device or a socket)")
    if st.st_size > TABLE_MAX_BYTES:
        raise ValueError(f"it is {st.st_size:,} bytes, above the {TABLE_MAX_BYTES:,} a table may have")
    with open(path, "rb") as f:
        text = f.read(TABLE_MAX_BYTES + 1).decode("utf-8")
    try:
        return json.loads(text)
    except RecursionError:  # the parser's own bound on nesting (a table nests one level)
        raise ValueError("it nests too deep") from None


class Tuner:
    def __init__(self, path: Path | None = None, timer: Callable[[Callable[[], object], int], float] = _gpu_ms,
                 clock: Callable[[], float] = time.perf_counter):
        self.path = path or cache_path()
        self.timer, self.clock = timer, clock
        self.deadline: float | None = None  # clock() past which nothing more is timed (see budget())
        self.table: dict[str, str] = {}  # key -> route every candidate was timed for
        self.interim: dict[str, str] = {}  # key -> route chosen out of time (saved as a PARTIAL entry)
        try:
            saved = read_table(self.path)
        except (OSError, ValueError):
            saved = {}
        for k, v in (saved.items() if isinstance(saved, dict) else ()):
            if isinstance(v, str):  # anything else is no entry this code wrote: ignored, re-timed when needed
                if k.startswith(PARTIAL):
                    self.interim[k[len(PARTIAL):]] = v
                else:
                    self.table[k] = v
        # key -> {runner-up: its time alone / the winner's} within RIVAL_MARGIN, timed in this process
        self.rivals: dict[str, dict[str, float]] = {}
        self.forced: dict[str, str] = {}  # key -> candidate, while refine() captures a trial forward
        self.ranked: dict[str, list[str]] = {}  # key -> candidates timed in this process, fastest alone first
        self.races: list[dict] = []  # each whole-forward trial refine() ran in this process, in order
        self.timed = 0  # choices that timed candidates in this process (choose()), complete or not
        self._recordings: list[set[str]] = []

    @contextmanager
    def recording(self) -> Iterator[set[str]]:
        """The keys chosen inside the block (what one forward depends on)."""
        keys: set[str] = set()
        self._recordings.append(keys)
        try:
            yield keys
        finally:
            self._recordings.remove(keys)

    @contextmanager
    def budget(self, seconds: float | None) -> Iterator[None]:
        """Inside the block, tuning stops `seconds` from now (None: no limit); see TUNE_BUDGET_S."""
        saved = self.deadline
        self.deadline = None if seconds is None else self.clock() + seconds
        try:
            yield
        finally:
            self.deadline = saved

    def out_of_time(self) -> bool:
        return self.deadline is not None and self.clock() > self.deadline

    @staticmethod
    def _device_key() -> str:
        device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
        return f"{device}|torch {torch.__version__}"

    @staticmethod
    def op_name(key: str) -> str:
        """A table key without its device, versions and candidate digest: 'linear|bias=True|128x2304x768|torch.float16'."""
        return "|".join(key.split("|")[2:-1])

    def routes(self, keys) -> dict[str, str]:
        """The route each op of `keys` takes now, by op name: the table's, else the one chosen out of time (as in
        choose(): a forward tuned past its budget runs interim routes, and its record must name them)."""
        chosen = {**self.interim, **self.table}
        return {self.op_name(k): chosen[k] for k in sorted(keys) if k in chosen}

    def key(self, op: str, names) -> str:
        """The table's key for `op` among candidates `names`: a choice holds only for the GPU and library versions
        that measured it, and only among the candidates it beat (a new route gets timed, not ignored)."""
        return f"{self._device_key()}|{op}|{zlib.crc32(','.join(sorted(names)).encode()):08x}"

    def choose(self, key: str, candidates: dict[str, Callable[[], object]], reps: int = 20) -> str:
        """Fastest candidate name for `key`: the median of ROUNDS alternating rounds, each `timer(fn, reps // ROUNDS)`;
        candidates that raise are skipped. Keeps the close runners-up worth racing in `rivals`. Past the budget's
        deadline the candidates timed so far (at least the first) decide: a partial choice (`interim`, saved as a
        PARTIAL entry), which a budgeted call takes as it is and an unbudgeted one (no deadline) times anew."""
        full = self.key(key, candidates)
        for keys in self._recordings:
            keys.add(full)
        if self.forced.get(full) in candidates:
            return self.forced[full]
        if full in self.table and self.table[full] in candidates:
            return self.table[full]
        if self.interim.get(full) in candidates and self.deadline is not None:
            return self.interim[full]
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            return next(iter(candidates))  # cannot time inside a capture: first working default
        samples: dict[str, list[float]] = {name: [] for name in candidates}
        complete = True
        self.timed += 1
        for _ in range(ROUNDS):
            for name in list(samples):
                # Out of time: stop once anything has a time (the default route, listed first, is timed first).
                if self.out_of_time() and any(samples.values()):
                    complete = False
                    break
                try:
                    samples[name].append(self.timer(candidates[name], max(1, reps // ROUNDS)))
                except Exception:  # noqa: BLE001 - a backend that refuses this shape is simply not a candidate
                    del samples[name]
                    if torch.cuda.is_available():
                        torch.cuda.synchronize()
            if not complete:
                break
        if not samples:
            raise RuntimeError(f"no candidate ran for {key}")
        times = {name: statistics.median(v) for name, v in samples.items() if v}
        ranked = sorted(times, key=times.get)
        if not complete:  # a choice among some candidates only: kept apart from the complete ones
            self.interim[full] = ranked[0]
            self._save()
            return ranked[0]
        self.table[full], self.ranked[full] = ranked[0], ranked
        self.interim.pop(full, None)
        close = [n for n in ranked if times[n] <= times[ranked[0]] * (1 + RIVAL_MARGIN)]
        self.rivals[full] = {n: times[n] / max(times[ranked[0]], 1e-9) for n in _rivals(close)}
        self._save()
        return ranked[0]

    def refine(self, keys: set[str], build: Callable[[], T], time_ms: Callable[[T], float], rounds: int = 3,
               clock: Callable[[], float] = time.perf_counter, enabled: bool = True,
               race_budget_s: float = RACE_BUDGET_S) -> T:
        """Settle close choices in context: `build()` captures the whole forward with the current choices. First
        the forward with every op in `keys` on its fastest library route (timed in this process) races it, then the
        one with every op on its fastest route of ours, then the one with every op that has fp8 routes on its fastest
        fp8 route; then each rival of those ops, the closest first, one at a time and for at most race_budget_s (and
        none past the tuning budget's deadline). A trial forward replaces the best so far if at least MIN_GAIN faster
        (timed in alternation, `rounds` times). Returns the best build; the table keeps its choices. Each rival is
        tried at most once per process. enabled False (EngineOptions.refine): `build()` alone, each op on the route
        it won alone."""
        best = build()
        if not enabled:
            return best
        # Routes picked one op at a time can lose, as a whole, to one family's kernels throughout, and racing one
        # change at a time never reaches such a forward: H100 bert-base 8 x 512 lost to the cudagraph backend,
        # which runs cuBLAS and SDPA (2.176 ms against 2.158); two tunings of 1 x 128 replayed in 0.3165 and
        # 0.3913 ms, the faster with both LayerNorm GEMMs on our kernels.
        ranked = {k: self.ranked.pop(k, ()) for k in keys}
        alone = {k: self.table.get(k) for k in keys}
        start = clock()
        # The fp8 forward: an fp8 GEMM that quantizes its output hands the next GEMM an fp8 input, so a chain of fp8
        # routes saves the quantize passes that make each of them lose alone (see ops.FP8_MIN_ROWS).
        for family, wanted in (("library", lambda n: not _ours(n)), ("ours", _ours), ("fp8", _fp8)):
            uniform = {k: next((n for n in names if wanted(n)), None) for k, names in ranked.items()}
            uniform = {k: n for k, n in uniform.items() if n is not None and n != self.table.get(k)}
            if uniform and not self.out_of_time():
                best = self._race(best, uniform, build, time_ms, rounds, family)
        for k, n in alone.items():  # where a uniform forward won, each route it displaced is raced back first
            if n is not None and self.table.get(k) != n:
                self.rivals.setdefault(k, {})[n] = 1.0
        trials = sorted((ratio, key, rival) for key in keys for rival, ratio in self.rivals.pop(key, {}).items())
        for _, key, rival in trials:
            if clock() - start > race_budget_s or self.out_of_time():
                break
            if rival != self.table.get(key):
                best = self._race(best, {key: rival}, build, time_ms, rounds, "rival")
        self._save()
        return best

    def _race(self, best: T, choices: dict[str, str], build: Callable[[], T], time_ms: Callable[[T], float],
              rounds: int, trial_of: str) -> T:
        """A forward built with `choices` forced, if it beats `best` by MIN_GAIN (then the table takes them).
        Each trial is kept in `races`, so what a tuning tried and what won can be read afterwards."""
        race = {"trial": trial_of, "routes": {self.op_name(k): n for k, n in sorted(choices.items())}}
        self.races.append(race)
        self.forced.update(choices)
        try:
            trial = build()
        except Exception as e:  # noqa: BLE001 - a rival that cannot be captured is no rival
            race["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            return best
        finally:
            self.forced.clear()
        t_best, t_trial = [], []
        for _ in range(rounds):
            t_best.append(time_ms(best))
            t_trial.append(time_ms(trial))
        race.update(best_ms=statistics.median(t_best), trial_ms=statistics.median(t_trial))
        race["won"] = race["trial_ms"] < race["best_ms"] * (1 - MIN_GAIN)
        if race["won"]:
            self.table.update(choices)
            return trial
        return best

    def _save(self) -> None:
        tmp = None
        try:  # atomic replace: concurrent benchmark processes may share the file
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                partial = {PARTIAL + k: v for k, v in self.interim.items() if k not in self.table}
                json.dump({**self.table, **partial}, f, indent=0, sort_keys=True)
            os.replace(tmp, self.path)
        except OSError:  # a read-only home only costs re-tuning in the next process
            if tmp is not None:  # a full disk, or a folder where the table should be: no .tmp file left per save
                try:
                    os.unlink(tmp)
                except OSError:
                    pass


def table_problem(path: Path) -> str | None:
    """Why the table at `path` cannot be read and replaced, or None. A Tuner takes an unreadable table as empty and
    a failed save as a cost of the next process (a cache); `transbench tune` exists to fill the table, so it asks
    first, instead of tuning for minutes and keeping nothing. Nothing is created or changed here."""
    try:
        return _table_problem(Path(path))
    except OSError as e:  # pathlib before Python 3.13 raises for a name too long (ENAMETOOLONG): a traceback
        return f"its path cannot be used ({e.strerror or e})"


def _table_problem(path: Path) -> str | None:
    if path.is_dir():
        return "it is a folder"
    if path.exists():
        try:
            data = read_table(path)
        except OSError as e:
            return f"it cannot be read ({e.strerror or e})"
        except ValueError as e:  # not JSON, truncated, not UTF-8
            return f"it is not valid JSON ({str(e)[:120]})"
        if not isinstance(data, dict):
            return f"it holds a JSON {type(data).__name__}, not the object of choices a table is"
    # The folder, or the nearest of its parents that exists (the Tuner creates the rest): really writable, by a
    # file made and removed there (permissions do not stop root, and /proc takes no files).
    folder = next((p for p in (path.parent, *path.parent.parents) if p.exists()), Path("."))
    if not folder.is_dir():
        return f"{folder} is a file, not a folder"
    # The folders the Tuner would make, by the length of their names: exists() stops at the first missing one, so
    # `--cache-dir new/NAME` with a NAME too long passed here and its table was lost after the tuning
    limit = os.pathconf(folder, "PC_NAME_MAX")
    for part in path.parent.parts[len(folder.parts):]:  # folder is path.parent or one of its parents
        if len(os.fsencode(part)) > limit:
            return f"the folder name {part[:40]}... is longer than its file system takes ({limit} bytes)"
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        return f"a file made in {folder} failed ({e.strerror or e})"
    return None


def for_table(path: Path | str) -> Tuner:
    """The process's one Tuner of the table at `path` (EngineOptions(tuner=...) for another table than the default,
    as api.tune --cache-dir does): engines that share a table share what was timed, raced and saved."""
    return _tuner_of(Path(path).absolute())


@functools.cache
def _tuner_of(path: Path) -> Tuner:
    return Tuner(path)


def tuner() -> Tuner:
    """The process's Tuner of the default table, cache_path() read now (a changed $TRANSBENCH_CACHE_DIR gets its
    own): what an engine uses unless EngineOptions.tuner names another."""
    return for_table(cache_path())
