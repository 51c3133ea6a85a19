"""Per-shape kernel choices, timed on the device and kept on disk so a later process starts warm.

Each op's candidates are first timed alone; the choices are then settled by timing whole captured forwards
(`Tuner.refine`): one with every op on its fastest library route, one with every op on its fastest route of
ours, then one per close runner-up. Next to its real neighbours a kernel can gain or lose what it did not alone
(under programmatic dependent launch a Triton kernel overlaps the previous kernel's tail, a cuBLAS one does not).

Under a tuning budget (compile_model's tune_budget_s) a call does not time an op it meets for the first time
before running it: the op takes a route at once (`Tuner.choose`: the nearest tuned shape's, else a shape rule's),
and after the forward the call spends what is left of its budget timing the candidates of the ops that cost the
forward most (`Tuner.tune_pending`), saving each time on disk; a later call or process goes on from there.
"""
from __future__ import annotations

import functools
import json
import math
import os
import re
import stat
import statistics
import tempfile
import time
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
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
# Wall seconds a call that meets ops not yet tuned may spend tuning them (compile_model's tune_budget_s; None: no
# limit, every candidate timed before the op first runs, as `transbench tune` does), Triton compiles included:
# the target asks a first call of bert-base at a new shape to cost at most 5 s on an H100, where tuning every
# route took 28-53 s. Under a budget an untuned op runs a borrowed route at once (Tuner.choose: the nearest tuned
# shape's, else rule_route's); after the forward, the call times the candidates of the ops with the largest share
# of its time until the budget is spent (Tuner.tune_pending), recaptures with what it found, and saves the times
# (PROGRESS), so a later call or process that meets the op goes on where this one stopped. On an H100, bert-base
# fp8 256 x 128 ran 22,158 seq/s in a first process when such ops took their first-listed route, 29,460 tuned.
TUNE_BUDGET_S = 2.5
# The on-disk key of a partial entry (the fastest of the candidates timed so far): its full key behind this
# prefix, a plain string value like every other entry, so a table written by code that knows no partial entries
# loads here, and one written here loads there (where the prefixed keys match no lookup, and are kept when that
# code saves).
PARTIAL = "partial|"
# The on-disk key of the times measured so far for a key not yet complete: "route=ms;route=ms;route=-" (- : the
# route failed for that shape), a plain string like every other entry.
PROGRESS = "timed|"
# A tuned key lends its route to an untuned one of the same op, dtype, input form and model dimensions (a GEMM's
# N and K; attention's heads and head size) whose varying dimensions (a GEMM's M; attention's batch and sequence)
# are within this factor of its own, all together (log-scale distance); the nearest lends first.
NEIGHBOUR_MAX_RATIO = 8.0
# Leading dimensions of an op's shape field that vary from call to call; the rest are the model's. GEMM ops
# (linear, linear_gelu, linear_add_ln: M x N x K) vary in the first only. dense: B x S x heads x head_dim; varlen:
# B x S x tokens x heads; decode_attention: B x cache length x heads x head_dim.
VARYING_DIMS = {"dense": 2, "varlen": 3, "decode_attention": 2}
# rule_route: from this many rows an exact-GELU GEMM takes our Triton GEMM, its GELU in the epilogue (cuBLAS has no
# exact-GELU epilogue, so its route adds a pass): tuned so on an H100 for bert-base at 4,096 rows and more
# (benchmarks/results/fused_h100_2026-11.md).
RULE_TRITON_MIN_ROWS = 1024


TABLE_NAME = "engine-tuning.json"


def cache_path() -> Path:
    """The tuning table: $TRANSBENCH_CACHE_DIR/engine-tuning.json, else under $XDG_CACHE_HOME or ~/.cache.
    XDG_CACHE_HOME empty or relative is not set, as the XDG base directory spec says: an empty one kept the table in
    ./transbench of each working folder. The home folder is looked up only when needed: Path.home() raises
    RuntimeError where HOME is unset and the user has no passwd entry (a container run as an arbitrary uid), and
    it was looked up even with XDG_CACHE_HOME set."""
    root = os.environ.get("TRANSBENCH_CACHE_DIR")
    if root:
        return Path(root) / TABLE_NAME
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    return (Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache") / "transbench" / TABLE_NAME


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
    """Median GPU time of one fn() call, replayed from a CUDA graph as the engine runs it (a call no graph can hold
    raises, and the tuner skips it). Calls shorter than ~0.2 ms are timed as a graph of `inner` back-to-back calls:
    timed one by one, the host's launch cost (higher for a Triton launch than a cuBLAS one) would decide the race
    instead of the kernels."""
    side = side_stream(torch.cuda.current_device())  # hundreds of candidates per shape: one stream strands no memory
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile, pick cuBLAS heuristics, allocate: all outside the timing
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    # Whether a call is short is judged on a replay of one, not on one eager call: an eager call's span between two
    # events is the host's launch time wherever the host is slower than the kernels. On an H200 that timed routes of
    # bert-base's 1 x 128 GEMMs eagerly at 140-233 us where their graphs replay in 5-9 us, and the tuner chose
    # cuBLAS + LayerNorm for FC2, 1.7 us slower than our GEMM; judged so, the forward runs 0.319 ms, not 0.351
    # (benchmarks/results/engine_limits_h200_2026-11.md).
    graph = torch.cuda.CUDAGraph()
    with capture(graph, stream=side):  # on the stream warmed up above (graphs.GraphCache._graph says why)
        fn()
    graph.replay()
    if _event_ms(graph.replay, 3) >= 0.2:
        return _event_ms(graph.replay, reps)
    graph = torch.cuda.CUDAGraph()
    with capture(graph, stream=side):
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
    return _family(name) in ("triton", "splitk", "gemv", "decode")


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


# An op's shape field: "32768x2304x768", "256x128x12x64". Dimensions of ASCII digits, at most 18 of them (a tensor's
# size is below 2^63): a table's key of a 5,000-digit dimension was int()'s ValueError, and one of 10^400 against a
# real shape a math domain error in _distance, each a traceback of a budgeted call (a server's warm-up).
_SHAPE = re.compile(r"[0-9]{1,18}(?:x[0-9]{1,18})+")


def shape_of(key: str) -> tuple[str, tuple[int, ...]] | None:
    """A table key as (its signature, its varying dimensions): the signature is the key without its candidate
    digest and with the varying dimensions of its shape field blanked (VARYING_DIMS), so keys of one op, dtype,
    input form and model dimensions on one GPU and torch version share it. None: a key with no shape field."""
    parts = key.split("|")
    if len(parts) < 4:
        return None
    head, op = parts[:2], parts[2:-1]
    for i, field in enumerate(op):
        if _SHAPE.fullmatch(field):
            dims = tuple(int(v) for v in field.split("x"))
            n = min(VARYING_DIMS.get(op[0], 1), len(dims) - 1)
            fixed = "x".join(["*"] * n + [str(d) for d in dims[n:]])
            return "|".join([*head, *op[:i], fixed, *op[i + 1:]]), dims[:n]
    return None


def _distance(a: tuple[int, ...], b: tuple[int, ...]) -> float:
    return sum(abs(math.log(max(x, 1) / max(y, 1))) for x, y in zip(a, b))


def rule_route(op: str, names) -> str:
    """The route an op not yet tuned takes where no tuned shape lends one: a rule on its shape and the candidates it
    lists (`op` as Tuner.choose gets it). The H100 tunings it follows are in benchmarks/results
    (fp8_gemm_h100_2026-11.md, fp8_power_cap_h100_2026-11.md, fused_h100_2026-11.md).
    - A GEMM whose input is already e4m3 (`|fp8 input`): our fp8 GEMM, its first config (the largest tile that fits):
      its epilogue writes what the next op reads (bert-base and bert-large fp8 tuned so for QKV, FC1 and FC2).
    - An exact-GELU GEMM of at least RULE_TRITON_MIN_ROWS rows: our Triton GEMM, GELU in its epilogue.
    - A decode step's projection (norm_linear) at a few rows: our GEMV, its first config (gemv.CONFIGS), the
      LayerNorm, bias, GELU and residual in its one kernel.
    - Decode attention: its first config that fits the head size (decode_attention.CONFIGS; every candidate is our
      kernel, so the last line below picks it).
    - Otherwise the first library route: cuBLAS (with its own epilogue or our LayerNorm after it), SDPA's flash
      kernel, flash varlen; an fp8 layer whose input is not e4m3 stays in fp16 there (no quantize pass: the tuned
      output projection of bert-base fp8 256 x 128).
    - The first candidate where none of those is listed."""
    names = list(names)
    parts = op.split("|")
    dims = next((tuple(int(v) for v in f.split("x")) for f in parts if _SHAPE.fullmatch(f)), ())
    gemm = parts[0].startswith("linear")
    wanted = []
    if gemm and parts[-1] == "fp8 input":
        wanted.append(lambda n: n.startswith("fp8+triton"))
    if parts[:2] == ["linear_gelu", "exact"] and dims and dims[0] >= RULE_TRITON_MIN_ROWS:
        wanted.append(lambda n: _family(n) == "triton")
    if parts[0] == "norm_linear":  # offered only at a few rows (gemv.MAX_ROWS)
        wanted.append(lambda n: _family(n) == "gemv")
    wanted.append(lambda n: not _ours(n) and not _fp8(n))
    for want in wanted:
        pick = next((n for n in names if want(n)), None)
        if pick is not None:
            return pick
    return names[0]


def _read_progress(text: str) -> dict[str, float | None]:
    """A PROGRESS entry's value: {route: ms, or None where it failed}; malformed parts are dropped."""
    out: dict[str, float | None] = {}
    for part in text.split(";"):
        name, sep, ms = part.partition("=")
        if not sep or not name:
            continue
        if ms == "-":
            out[name] = None
            continue
        try:
            v = float(ms)
        except ValueError:
            continue
        if math.isfinite(v) and v >= 0:
            out[name] = v
    return out


def _write_progress(times: dict[str, float | None]) -> str:
    return ";".join(f"{n}={'-' if v is None else f'{v:.6g}'}" for n, v in sorted(times.items()))


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
    # opened without blocking and checked again: a FIFO put in its place after the stat held open() for ever
    with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise ValueError("it is not a regular file (a pipe, a device or a socket)")
        data = f.read(TABLE_MAX_BYTES + 1)
    if len(data) > TABLE_MAX_BYTES:  # grew while it was read
        raise ValueError(f"it is above the {TABLE_MAX_BYTES:,} bytes a table may have")
    text = data.decode("utf-8")
    try:
        return json.loads(text)
    except RecursionError:  # the parser's own bound on nesting (a table nests one level)
        raise ValueError("it nests too deep") from None


@dataclass
class _Pending:
    """An op met in this call whose key has no complete entry: what tune_pending needs to time its candidates."""
    op: str  # the op as choose() got it ('linear|bias=True|128x2304x768|torch.float16')
    candidates: dict[str, Callable[[], object]]  # from the op's first meeting in the call
    reps: int
    calls: int = 0  # times the call met it (each layer, each warm-up): its weight in the forward


ORIGINS = ("table", "tuned", "partial", "neighbour", "rule")  # where a route that ran came from (Tuner.origin)


class Tuner:
    def __init__(self, path: Path | None = None, timer: Callable[[Callable[[], object], int], float] = _gpu_ms,
                 clock: Callable[[], float] = time.perf_counter):
        self.path = path or cache_path()
        self.timer, self.clock = timer, clock
        self.deadline: float | None = None  # clock() past which nothing more is timed (see budget())
        self.table: dict[str, str] = {}  # key -> route every candidate was timed for
        self.interim: dict[str, str] = {}  # key -> the fastest of the candidates timed so far (a PARTIAL entry)
        self.progress: dict[str, dict[str, float | None]] = {}  # key -> {candidate: ms, None: it failed} so far
        for k, v in self._read().items():
            if k.startswith(PARTIAL):
                self.interim[k[len(PARTIAL):]] = v
            elif k.startswith(PROGRESS):
                self.progress[k[len(PROGRESS):]] = _read_progress(v)
            else:
                self.table[k] = v
        # What this process runs: key -> route, and where that route came from (ORIGINS). A key's route may change
        # only inside the call that first met it (its tuning, its races); once that call has returned (settle()),
        # every later call and engine in the process runs it, whatever later tuning finds (which goes to the table
        # for later processes): two engines of one process never run different kernels for one op.
        self.current: dict[str, str] = {}
        self.origin: dict[str, str] = {}
        self.settled: set[str] = set()
        self.pending: dict[str, _Pending] = {}  # ops of the running budgeted call that have no complete entry
        self._handled: set[str] = set()  # ops the running call has tuned already (its later builds add none)
        # key -> {runner-up: its time alone / the winner's} within RIVAL_MARGIN, timed in this process
        self.rivals: dict[str, dict[str, float]] = {}
        self.forced: dict[str, str] = {}  # key -> candidate, while refine() captures a trial forward
        self.ranked: dict[str, list[str]] = {}  # key -> candidates timed in this process, fastest alone first
        self.races: list[dict] = []  # each whole-forward trial refine() ran in this process, in order
        self.timed = 0  # choices that timed candidates in this process (choose(), tune_pending()), complete or not
        self._recordings: list[set[str]] = []
        self._budgets = 0  # budget() blocks open

    def _read(self) -> dict[str, str]:
        """The table on disk, its string entries only (anything else is no entry this code wrote: ignored)."""
        try:
            saved = read_table(self.path)
        except (OSError, ValueError):
            return {}
        return {k: v for k, v in saved.items() if isinstance(v, str)} if isinstance(saved, dict) else {}

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
        """Inside the block, tuning stops `seconds` from now (None: no limit; 0: nothing is timed); see
        TUNE_BUDGET_S. What the block's calls left pending is dropped when the outermost block ends."""
        saved = self.deadline
        self.deadline = None if seconds is None else self.clock() + seconds
        self._budgets += 1
        try:
            yield
        finally:
            self.deadline = saved
            self._budgets -= 1
            if not self._budgets:
                self.pending.clear()  # their candidates hold the call's tensors
                self._handled.clear()

    def out_of_time(self) -> bool:
        return self.deadline is not None and self.clock() >= self.deadline

    @staticmethod
    def _device_key() -> str:
        device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
        return f"{device}|torch {torch.__version__}"

    @staticmethod
    def op_name(key: str) -> str:
        """A table key without its device, versions and candidate digest: 'linear|bias=True|128x2304x768|torch.float16'."""
        return "|".join(key.split("|")[2:-1])

    def _route(self, key: str) -> str | None:
        return self.current.get(key) or self.table.get(key) or self.interim.get(key)

    def routes(self, keys) -> dict[str, str]:
        """The route each op of `keys` takes now, by op name: the one this process runs (a complete entry's, or one
        taken before its tuning was complete), else the table's."""
        return {self.op_name(k): r for k in sorted(keys) if (r := self._route(k)) is not None}

    def origins(self, keys) -> dict[str, int]:
        """How many ops of `keys` run a route from each origin (ORIGINS): a complete entry found (`table`) or timed
        in this process (`tuned`), the fastest of the candidates timed so far (`partial`), a nearby tuned shape's
        (`neighbour`), rule_route's (`rule`)."""
        counts = dict.fromkeys(ORIGINS, 0)
        for k in keys:
            if self._route(k) is not None:
                o = self.origin.get(k, "table" if k in self.table else "partial")
                counts[o] += 1
        return counts

    def settle(self, keys) -> None:
        """The routes of `keys` stay what they are for the rest of the process (a call that ran them returned)."""
        self.settled.update(keys)

    def key(self, op: str, names) -> str:
        """The table's key for `op` among candidates `names`: a choice holds only for the GPU and library versions
        that measured it, and only among the candidates it beat (a new route gets timed, not ignored)."""
        return f"{self._device_key()}|{op}|{zlib.crc32(','.join(sorted(names)).encode()):08x}"

    def neighbours(self, key: str) -> list[str]:
        """Keys with a complete entry that share `key`'s signature (shape_of), the nearest varying dimensions first
        (log scale), within NEIGHBOUR_MAX_RATIO."""
        mine = shape_of(key)
        if mine is None:
            return []
        near = []
        for k in self.table:
            theirs = shape_of(k) if k != key else None
            if theirs is not None and theirs[0] == mine[0]:
                d = _distance(mine[1], theirs[1])
                if d <= math.log(NEIGHBOUR_MAX_RATIO) + 1e-9:
                    near.append((d, k))
        return [k for _, k in sorted(near)]

    def choose(self, key: str, candidates: dict[str, Callable[[], object]], reps: int = 20) -> str:
        """The candidate name `key`'s op runs, among `candidates` (name -> fn, in the op's own order):
        - the route this process runs for it already (`current`: settled by an earlier call, or taken by this
          budgeted call), else the table's complete entry;
        - unbudgeted (no deadline): the fastest, every candidate timed now in ROUNDS alternating rounds, each
          `timer(fn, reps // ROUNDS)`; candidates that raise are skipped; the close runners-up worth racing are kept
          in `rivals`;
        - under a budget, nothing is timed before the op runs: it takes the fastest candidate timed so far for this
          key (`partial`), else the route of the nearest tuned shape (`neighbour`, see neighbours()) that is among
          its candidates and runs, else rule_route's (`rule`), else the first that runs; and the op waits in
          `pending` for tune_pending(), which the call runs after its forward."""
        full = self.key(key, candidates)
        for keys in self._recordings:
            keys.add(full)
        if self.forced.get(full) in candidates:
            return self.forced[full]
        now = self.current.get(full)
        if now in candidates and (self.deadline is not None or full in self.table or full in self.settled):
            self._pend(full, key, candidates, reps)
            return now
        if self.table.get(full) in candidates:
            return self._use(full, self.table[full], "table")
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            return next(iter(candidates))  # cannot time inside a capture: first working default
        if self.deadline is None:
            return self._use(full, self._time_all(full, key, candidates, reps), "tuned")
        route, origin = self._borrow(full, key, candidates)
        self._use(full, route, origin)
        self._pend(full, key, candidates, reps)
        return route

    def _use(self, key: str, route: str, origin: str) -> str:
        self.current[key], self.origin[key] = route, origin
        return route

    def _pend(self, key: str, op: str, candidates: dict, reps: int) -> None:
        if self.deadline is None or key in self.table or key in self.settled or key in self._handled:
            return
        self.pending.setdefault(key, _Pending(op, candidates, reps)).calls += 1

    def _borrow(self, key: str, op: str, candidates: dict) -> tuple[str, str]:
        """A route for an op not tuned yet, and where it came from, without timing: partial, neighbour, rule (see
        choose). A route taken from another shape is run once first: a name in this key's candidates can still
        fail at its shape (a failure is kept in `progress`, so it is not tried again)."""
        options = []
        if self.interim.get(key) in candidates:  # timed for this very key: it ran
            return self.interim[key], "partial"
        options += [(self.table[k], "neighbour") for k in self.neighbours(key)]
        options.append((rule_route(op, candidates), "rule"))
        options += [(n, "rule") for n in candidates]  # in the op's order, should the rule's route fail
        failed = {n for n, t in self.progress.get(key, {}).items() if t is None}
        tried = set()
        for route, origin in options:
            if route not in candidates or route in failed or route in tried:
                continue
            tried.add(route)
            try:
                candidates[route]()
            except Exception:  # noqa: BLE001 - a route that refuses this shape is no route for it
                self.progress.setdefault(key, {})[route] = None
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                continue
            if key in self.progress:  # a failure is kept at once: no later process runs that route again
                self._save()
            return route, origin
        raise RuntimeError(f"no candidate ran for {op}")

    def _time_all(self, key: str, op: str, candidates: dict, reps: int) -> str:
        """Every candidate timed in ROUNDS alternating rounds; the fastest becomes the complete entry."""
        samples: dict[str, list[float]] = {name: [] for name in candidates}
        self.timed += 1
        for _ in range(ROUNDS):
            for name in list(samples):
                try:
                    samples[name].append(self.timer(candidates[name], max(1, reps // ROUNDS)))
                except Exception:  # noqa: BLE001 - a backend that refuses this shape is simply not a candidate
                    del samples[name]
                    if torch.cuda.is_available():
                        torch.cuda.synchronize()
        if not samples:
            raise RuntimeError(f"no candidate ran for {op}")
        self._conclude(key, {name: statistics.median(v) for name, v in samples.items()}, complete=True)
        self._save()
        return self.table[key]

    def _conclude(self, key: str, times: dict[str, float], complete: bool) -> str:
        """Record the fastest of `times`: the complete entry (with its runners-up in `rivals`), or a partial one."""
        ranked = sorted(times, key=times.get)
        if not complete:
            self.interim[key] = ranked[0]
            return ranked[0]
        self.table[key], self.ranked[key] = ranked[0], ranked
        self.interim.pop(key, None)
        self.progress.pop(key, None)
        close = [n for n in ranked if times[n] <= times[ranked[0]] * (1 + RIVAL_MARGIN)]
        self.rivals[key] = {n: times[n] / max(times[ranked[0]], 1e-9) for n in _rivals(close)}
        return ranked[0]

    def tune_pending(self, keys=None) -> bool:
        """Spend what is left of the budget on the ops pending from this call (of `keys`; None: all): first the
        time of the route each runs (already compiled: milliseconds), which times the calls that met it gives its
        share of the forward; then, the largest share first, each op's candidates not yet timed for its key, until
        the deadline (see _time_some). An op whose every candidate has a time gets its complete entry; one left
        incomplete keeps the fastest so far as its partial entry, and its times on disk (PROGRESS) for the next
        call or process that meets it. Ops the call has not settled take what was found. True if a route of this
        call changed (the caller runs or captures its forward again)."""
        todo = {k: self.pending.pop(k) for k in list(self.pending) if keys is None or k in keys}
        self._handled.update(todo)
        if self.deadline is None or not todo:
            return False
        before, timed = {k: self.current.get(k) for k in todo}, self.timed
        share: dict[str, float] = {}
        for k, p in todo.items():
            if self.out_of_time():
                break
            route = self.current[k]
            if route not in self.progress.get(k, {}):
                self._time_some(k, p, [route])
            share[k] = p.calls * (self.progress.get(k, {}).get(route) or 0.0)
        for k in sorted(share, key=lambda k: (-share[k], k)):
            if self.out_of_time():
                break
            order = self._order(k, todo[k])
            if order:
                self._time_some(k, todo[k], order)
        for k, p in todo.items():
            times = self.progress.get(k, {})
            ran = {n: t for n, t in times.items() if t is not None and n in p.candidates}
            if ran:
                best = self._conclude(k, ran, complete=all(n in times for n in p.candidates))
                if k not in self.settled:
                    origin = "tuned" if k in self.table else "partial" if best != before[k] else self.origin[k]
                    self._use(k, best, origin)
        if self.timed > timed:
            self._save()
        return any(self.current.get(k) != r for k, r in before.items())

    def _order(self, key: str, p: _Pending) -> list[str]:
        """`key`'s candidates not yet timed, likeliest first: the route it runs, the nearest tuned shapes' routes,
        the rule's, then the first of each route family (families differ most), then the rest in the op's order."""
        names = list(p.candidates)
        first = [self.current.get(key), *(self.table[k] for k in self.neighbours(key)), rule_route(p.op, names)]
        families: dict[str, str] = {}
        for n in names:
            families.setdefault(_family(n), n)
        done = self.progress.get(key, {})
        order = []
        for n in [*first, *families.values(), *names]:
            if n in p.candidates and n not in done and n not in order:
                order.append(n)
        return order

    def _time_some(self, key: str, p: _Pending, names: list[str]) -> None:
        """Time `names` of a pending op in order while the budget lasts (the first always): one sample each (its
        compile included) until the deadline, then ROUNDS - 1 more rounds, alternating, over those reached (they
        are compiled: milliseconds). Medians go to `progress`; a candidate that raises is kept there as failed."""
        times = self.progress.setdefault(key, {})
        samples: dict[str, list[float]] = {}
        reps = max(1, p.reps // ROUNDS)
        self.timed += 1
        for i, name in enumerate(names):
            if i and self.out_of_time():
                break
            try:
                samples[name] = [self.timer(p.candidates[name], reps)]
            except Exception:  # noqa: BLE001 - a backend that refuses this shape is simply not a candidate
                times[name] = None
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
        for _ in range(ROUNDS - 1):
            for name in list(samples):
                try:
                    samples[name].append(self.timer(p.candidates[name], reps))
                except Exception:  # noqa: BLE001
                    del samples[name]
                    times[name] = None
        for name, v in samples.items():
            times[name] = statistics.median(v)

    def refine(self, keys: set[str], build: Callable[[], T], time_ms: Callable[[T], float], rounds: int = 3,
               clock: Callable[[], float] = time.perf_counter, enabled: bool = True,
               race_budget_s: float = RACE_BUDGET_S) -> T:
        """Settle close choices in context: `build()` captures the whole forward with the current choices. Under a
        budget, the ops that build left pending are tuned first (tune_pending), and the forward built again if a
        route changed. Then the forward with every op in `keys` on its fastest library route (timed in this
        process) races it, then the one with every op on its fastest route of ours, then the one with every op that
        has fp8 routes on its fastest fp8 route; then each rival of those ops, the closest first, one at a time and
        for at most race_budget_s (and none past the tuning budget's deadline). A trial forward replaces the best
        so far if at least MIN_GAIN faster (timed in alternation, `rounds` times). Returns the best build; the table
        keeps its choices. Each rival is tried at most once per process, and no op the process has settled is
        raced. enabled False (EngineOptions.refine): no races, each op on the route it won alone."""
        best = build()
        if self.tune_pending(keys):
            best = build()
        if not enabled:
            return best
        keys = {k for k in keys if k not in self.settled}
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
            for k, n in choices.items():
                if k not in self.settled:
                    self._use(k, n, "tuned")
            return trial
        return best

    def _save(self) -> None:
        """The table on disk: this process's entries over what is there (another process sharing the file may have
        saved entries of its own since this one read it: they are kept)."""
        tmp = None
        try:  # atomic replace: concurrent benchmark processes may share the file
            entries = self._read()
            mine = {**self.table,
                    **{PARTIAL + k: v for k, v in self.interim.items() if k not in self.table},
                    **{PROGRESS + k: _write_progress(v) for k, v in self.progress.items() if v and k not in self.table}}
            # a key complete here needs no partial entry or times from elsewhere
            entries = {k: v for k, v in entries.items() if _unprefixed(k) == k or _unprefixed(k) not in self.table}
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump({**entries, **mine}, f, indent=0, sort_keys=True)
            os.replace(tmp, self.path)
        except OSError:  # a read-only home only costs re-tuning in the next process
            if tmp is not None:  # a full disk, or a folder where the table should be: no .tmp file left per save
                try:
                    os.unlink(tmp)
                except OSError:
                    pass


def _unprefixed(key: str) -> str:
    for prefix in (PARTIAL, PROGRESS):
        if key.startswith(prefix):
            return key[len(prefix):]
    return key


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
    # A link to a missing folder, or a loop of links, is not there for exists() either, but mkdir cannot make it:
    # `--cache-dir` of such a link passed here, and the table was lost after the tuning (the save's mkdir failed)
    for above in (path.parent, *path.parent.parents):
        if above == folder:
            break
        if above.is_symlink():  # not there (folder is the nearest that is), yet a name taken
            return f"{above} is a symbolic link to nothing (a missing folder, or a loop of links)"
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
