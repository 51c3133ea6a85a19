"""Run-to-run comparison: is a change a real regression or noise?

Cells of two runs are matched on their stored cell key (the `key` column of the cells table), which holds
every setting that changes what is measured; settings outside it (timing parameters such as --min-time)
may differ. A cell in one run only is listed with the reason. A search's cells are not a grid: max-batch answers and
the rate probes of `serve --find-max-rate` are not paired (search_probe).

For each matched pair of ok cells, the verdict comes from the raw per-call samples, in the time order they
were stored:
1. Block medians. A cell's n samples are cut into m = floor(sqrt(n)) blocks of floor(n / m) consecutive
   samples (the first n - m * floor(n / m) samples, nearest the warm-up, fewer than one block, are left out)
   and each block is replaced by its median. Why: per-call samples drift (clock, temperature) and are
   autocorrelated, so they are not n independent draws; a per-sample Mann-Whitney U test called two
   identical back-to-back H100 runs `slower` with p = 6.7e-45. Medians of blocks of
   consecutive samples are close to independent once a block outlasts the correlation, and sqrt(n) blocks
   of sqrt(n) samples is the classical batch-means choice (Flegal and Jones 2010) that lets both the block
   length and the block count grow with n. From 25 samples, a block spans at least BLOCK_TAUS integrated
   autocorrelation times of the samples (autocorrelation_time); where that leaves under MIN_BLOCKS blocks, their
   medians are independent draws as repeats are (rule 5's Welch interval), or `n/a` under two a side (correlated).
2. A percentile bootstrap interval of median(B's block medians) / median(A's block medians): RESAMPLES
   resamples of each side's block medians with replacement, from a fixed seed, so the same data always
   give the same verdict; its level is 1 - alpha (95% by default).
3. `slower` when the whole interval lies above 1 + min_effect, `faster` when it lies below 1 - min_effect,
   else `same`: a change must be both outside the noise and larger than what the gate cares about.
4. Fewer than MIN_BLOCKS blocks on either side (under 25 samples): an exact rank interval instead. Each side
   is its samples (its block medians past RANK_SAMPLES); the interval of the ratio B/A is the pair of
   order statistics of the pairwise ratios b / a that the exact null distribution of the Mann-Whitney count U
   gives at level 1 - alpha (the Hodges-Lehmann construction; the distribution is counted exactly,
   `rank_counts`, for any n). `slower` when it lies above 1 + min_effect, `faster` below 1 - min_effect,
   `same` when it lies within both; else `n/a`, with how many samples an interval over blocks needs. A
   regression that cuts a cell to a few samples (115x slower: 11 against 18 samples, one of them a
   preempted call inside B's range) was `n/a`, exit 0; samples that do not overlap at all are the extreme
   case (every pair apart: chance 1 / C(n_a + n_b, n_b) under no change).
5. Both runs repeated (`run --repeat N`, N >= 2 on each side): the verdict comes from the repeats, each a
   fresh process: a Welch t-interval of the mean log repeat median, B minus A, exponentiated (level
   1 - alpha), against the same min effect. Calls of one process share its state (allocator, thread
   placement, clock); repeats in separate processes are the independent draws, so their spread is the
   run-to-run noise a gate must see past.
A cell that was ok in A and is not in B (OOM, wrong, error, ...) is `broken`; the reverse is `fixed`. A load
test's cell (`serve`) whose share of failed requests grew is `broken` too, whatever its latency: the answered
requests alone are timed, so a server that sheds load fast would pass on them (more_failures).
Everything is numpy and the standard library; rule 4's counts are exact Python integers at any n."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from fractions import Fraction
import statistics
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from ..boundary import loads_json
from ..errors import SpecError
from ..store import Store
from .data import load
from .document import STATUS_TEXT, Table, num

# Verdicts that fail a pipeline gate (`transbench compare` exits 1).
REGRESSIONS = ("slower", "broken")
# max-batch cells are matched on everything but the batch they found: their latencies are not comparable.
NOT_COMPARED = ("max-batch",)
# Five blocks is the fewest whose bootstrapped median is not one of two or three values: it needs 25
# samples; any cell timed for the default --min-time 1 s at under 40 ms per call has them.
MIN_BLOCKS = 5
RESAMPLES = 2000
# Sokal's window constant (autocorrelation_time): the window is closed once it spans WINDOW correlation times.
WINDOW = 5.0
# A block spans at least BLOCK_TAUS correlation times where the samples are autocorrelated (tau >= DEPENDENT_TAU):
# adjacent blocks of AR(1) samples then correlate about (tau - 1) / (2 x BLOCK_TAUS x tau), under 0.25. sqrt(n)
# blocks alone were shorter than the correlation of AR(1) noise with phi 0.9 (tau 19) below 360 samples, and two
# runs of one distribution failed the gate (`slower`) several times as often as the interval's level says.
BLOCK_TAUS = 2
DEPENDENT_TAU = 2.0
# The lag-1 rank autocorrelation above which samples count as dependent: its 99th percentile for independent ones
# (about normal with variance 1 / n); 40 independent samples were cut into blocks for a chance tau of 3.
DEPENDENT_Z = 2.326
# The most samples a side of the rank interval (rule 4) takes as they are; past that, its block medians.
RANK_SAMPLES = 2000
SEED = 0
# A sample of 0 ms is a time (a clock coarser than the call reads it; measure/record.py guards its rates against it),
# but a ratio over it is none: A's block medians of 0 made the interval nan-nan, and compare said `same`.
ZERO_NOTE = "samples of 0 ms (a clock coarser than the call) leave B/A without an interval"


@dataclass(frozen=True)
class CompareConfig:
    alpha: float = 0.05  # the interval's level is 1 - alpha
    min_effect: float = 0.03

    def __post_init__(self):
        if not 0 < self.alpha < 1:
            raise SpecError(f"--alpha {self.alpha} must be between 0 and 1 (0.05 = a 95% interval)")
        if not 0 <= self.min_effect < 10:
            # 10 (1000%) and above was refused with "must be a fraction >= 0", which it is: say the bound
            raise SpecError(f"--min-effect {self.min_effect} must be a fraction >= 0 and below 10 (0.03 = 3%)")


@dataclass
class CellComparison:
    record_a: dict
    record_b: dict
    median_a: float | None
    median_b: float | None
    ratio: float | None  # B / A median latency
    interval: tuple[float, float] | None  # bootstrap interval of the ratio of block medians
    verdict: str  # faster | slower | same | broken | fixed | n/a
    note: str = ""
    method: str | None = None  # what gave the interval: blocks | ranks | repeats (compare.method)


@dataclass
class Comparison:
    run_a: dict
    run_b: dict
    config: CompareConfig
    cells: list[CellComparison] = field(default_factory=list)
    only_a: list[dict] = field(default_factory=list)
    only_b: list[dict] = field(default_factory=list)

    @property
    def regressions(self) -> list[CellComparison]:
        return [c for c in self.cells if c.verdict in REGRESSIONS]

    @property
    def failed(self) -> bool:
        """The gate (`transbench compare` exits 1): a cell slower or broken, or a cell of A that B lacks. A run B that
        crashed part way, or one shard of a sweep, passed on the cells it had."""
        return bool(self.regressions or self.only_a)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for c in self.cells:
            out[c.verdict] = out.get(c.verdict, 0) + 1
        return out

    def summary(self) -> str:
        parts = [f"{n} {v}" for v, n in sorted(self.counts().items())]
        if self.only_a:
            parts.append(f"{len(self.only_a)} missing in B")
        if self.only_b:
            parts.append(f"{len(self.only_b)} only in B")
        return (f"{self.run_b['name']} vs {self.run_a['name']}: " + (", ".join(parts) or "no cells")
                + f" ({percent(1 - self.config.alpha)} interval, min effect {percent(self.config.min_effect)})")


def percent(x: float) -> str:
    """A fraction as a percentage to 3 significant digits, more where that would round onto 0% or 100%: `:.0%`
    printed --min-effect 0.001 as "min effect 0%" (and -0.0 as "-0%"), and --alpha 0.001 as a "100% interval"."""
    p = x * 100 + 0.0
    for digits in range(3, 13):
        text = f"{p:.{digits}g}"
        if p in (0.0, 100.0) or float(text) not in (0.0, 100.0):
            break
    if "e+" in text:  # --min-effect 9.9999 read "min effect 1e+03%": 3 digits of 999.99 round up to 1,000
        text = f"{float(text):.0f}"
    return text + "%"


def autocorrelation_time(samples) -> float:
    """The integrated autocorrelation time tau of a series (1 for independent samples; n / tau of them are worth as
    much as independent ones: the effective sample size), by Sokal's automatic windowing (Sokal 1997, as emcee uses
    it): tau(M) = 1 + 2 (rho_1 + ... + rho_M) at the smallest window M >= WINDOW x tau(M). Over the samples' ranks:
    one preempted call 100x slower would otherwise set the whole correlation. Independent samples' tau(M) wanders
    by about sqrt(4M / n) (Sokal's variance), so their correlation counts only where the lag-1 rank autocorrelation
    lies above what independent samples give 99% of the time (DEPENDENT_Z / sqrt(n)); else tau is 1. A series
    whose window does not close within half its length is too short to show all of its correlation: the largest
    tau(M) it shows."""
    x = np.asarray(samples, dtype=np.float64)
    if len(x) < MEMO_SAMPLES:
        return _autocorrelation_time(x)
    key = (len(x), hashlib.blake2b(x.tobytes(), digest_size=16).digest())
    if key not in _TAUS:
        if len(_TAUS) >= MEMO_KEPT:
            _TAUS.clear()
        _TAUS[key] = _autocorrelation_time(x)
    return _TAUS[key]


# A pair's samples are read for their correlation three times (its verdict, its rank side, the method named): from
# MEMO_SAMPLES samples a side, tau is kept by the samples' content, so 6,000,000 samples of one cell are ranked and
# transformed once, not three times (18 of compare's 22 s).
MEMO_SAMPLES = 100_000
MEMO_KEPT = 8
_TAUS: dict[tuple[int, bytes], float] = {}


def _autocorrelation_time(x: np.ndarray) -> float:
    n = len(x)
    if n < 4:
        return 1.0
    # mid-ranks: tied samples share one (a constant series is no ramp). Looked up in sorted order and put back:
    # searching the samples in their time order jumped about the sorted array, and 6,000,000 samples of one cell
    # (a 59 MB store) held compare and report for over a minute.
    # Each array let go once used and the ranks written straight into the FFT's zero-padded input: the same
    # arithmetic as the whole-array expressions that held them all at once (412 MB traced for 6,000,000 samples).
    order = np.argsort(x, kind="stable")
    ordered = x[order]
    both = np.searchsorted(ordered, ordered, "left")
    both += np.searchsorted(ordered, ordered, "right")
    del ordered
    padded = np.zeros(2 * n)
    r = padded[:n]
    r[order] = both
    del order, both
    r /= 2.0
    r -= r.mean()
    spectrum = np.fft.rfft(padded)
    del padded, r
    # out of place, as it was: numpy's product in place (out=spectrum) differs in the last bit
    power = spectrum * np.conj(spectrum)
    del spectrum
    acf = np.fft.irfft(power)
    del power
    if acf[0] <= 0:  # every sample equal: nothing varies, nothing correlates
        return 1.0
    rho = acf[:n] / acf[0]
    del acf
    if rho[1] <= DEPENDENT_Z / math.sqrt(n):
        return 1.0
    taus = 2 * np.cumsum(rho) - 1
    window = np.arange(n)
    closed = np.flatnonzero((window >= WINDOW * taus) & (window >= 1) & (window <= n // 2))
    return max(1.0, float(taus[closed[0]] if len(closed) else taus[1:n // 2 + 1].max()))


def block_count(n: int, tau: float) -> int:
    """How many blocks n samples of autocorrelation time tau are cut into: floor(sqrt(n)), fewer where a block
    would be shorter than BLOCK_TAUS x tau (blocks much shorter than the correlation are not independent)."""
    m = math.isqrt(n)
    if tau >= DEPENDENT_TAU:
        m = min(m, n // math.ceil(BLOCK_TAUS * tau))
    return m


def block_medians(samples: list[float]) -> np.ndarray:
    """Medians of block_count(n, tau) blocks of consecutive samples (the oldest remainder left out). Under 25
    samples (fewer than MIN_BLOCKS blocks whatever their length: rule 4 takes the samples) tau is not estimated."""
    x = np.asarray(samples, dtype=np.float64)
    tau = autocorrelation_time(x) if len(x) >= MIN_BLOCKS * MIN_BLOCKS else 1.0
    m = block_count(len(x), tau)
    if m == 0:
        return x if len(x) == 0 else np.median(x)[None]
    size = len(x) // m
    return np.median(x[len(x) - m * size:].reshape(m, size), axis=1)


def ratio_interval(blocks_a: np.ndarray, blocks_b: np.ndarray, alpha: float) -> tuple[float, float]:
    """Percentile bootstrap interval (level 1 - alpha) of median(blocks_b) / median(blocks_a)."""
    rng = np.random.default_rng(SEED)
    med_a = np.median(blocks_a[rng.integers(0, len(blocks_a), (RESAMPLES, len(blocks_a)))], axis=1)
    med_b = np.median(blocks_b[rng.integers(0, len(blocks_b), (RESAMPLES, len(blocks_b)))], axis=1)
    lo, hi = np.quantile(med_b / med_a, [alpha / 2, 1 - alpha / 2])
    if np.array_equal(np.sort(blocks_a), np.sort(blocks_b)):
        # The same block medians on both sides (a run compared with itself): the exact bootstrap distribution of
        # the ratio is then symmetric about 1 (in log), so its interval at any level holds 1. Only the Monte Carlo
        # error of RESAMPLES draws can move it off 1, and did: a run against itself at --alpha 0.99
        # --min-effect 0 was `slower` (exit 1) or `faster` for about 1 cell in 50.
        lo, hi = min(lo, 1.0), max(hi, 1.0)
    return float(lo), float(hi)


def longer(scenario: object) -> str:
    """The option that gives a cell of this scenario more samples: a serve cell's samples are its requests
    and a training cell's its steps, and neither command has the --min-time the n/a note named."""
    text = str(scenario or "")
    return ("--duration or --rate" if text.startswith("serve") else "--steps" if text.startswith("training")
            else "--min-time")


def rank_counts(m: int, n: int, upto: int) -> list[int]:
    """counts[u] for u = 0..upto: of the C(m + n, m) orders of m A samples and n B samples, how many hold exactly
    u (A, B) pairs with B above A (the Mann-Whitney count U). They are the coefficients of the Gaussian binomial
    [m + n choose m]_q, the product over i = 1..min(m, n) of (1 - q^(max(m, n) + i)) / (1 - q^i), truncated at
    q^upto: no later factor lowers a degree, so the truncation is exact. Python integers: exact at any size
    (24 against 10,000 samples, up to the middle of U's range, takes about 0.2 s)."""
    k, big = min(m, n), max(m, n)
    c = np.zeros(upto + 1, dtype=object)
    c[0] = 1
    for i in range(1, k + 1):
        s = big + i
        if s <= upto:
            c[s:] = c[s:] - c[:-s]  # times (1 - q^s); numpy reads the right side whole first
        for r in range(min(i, upto + 1)):
            c[r::i] = np.cumsum(c[r::i])  # over (1 - q^i): a running sum with stride i
    return [int(x) for x in c]


def rank_depth(m: int, n: int, alpha: float) -> int:
    """The largest d with P(U < d) <= alpha / 2 under no change (U over m x n pairs), 0 where even the most
    extreme order is likelier than that (too few samples for any verdict at this alpha)."""
    total = math.comb(m + n, m)
    half = m * n // 2
    below = 0
    share = Fraction(alpha) * total  # exact: C(m + n, m) outgrows a float (an OverflowError past ~1e308)
    for u, count in enumerate(rank_counts(m, n, half)):
        below += count
        if below * 2 > share:  # P(U <= u) > alpha / 2: P(U < u) was the last that passed
            return u
    return half + 1


def rank_interval(a: np.ndarray, b: np.ndarray, alpha: float) -> tuple[float, float] | None:
    """The exact rank (Hodges-Lehmann) interval of the ratio B / A at level 1 - alpha: the d-th smallest and the
    d-th largest of the m x n pairwise ratios b / a, d from U's exact null distribution (rank_depth). It is the
    rank test of every ratio at once: a ratio r outside it is refused by the test of B against r x A (samples
    that do not overlap at all are the extreme case, chance 1 / C(m + n, n)). None where no interval exists."""
    d = rank_depth(len(a), len(b), alpha)
    if d == 0:
        return None
    with np.errstate(over="ignore", divide="ignore", under="ignore"):  # stored extremes (1e300 ms over 1e-300 ms)
        ratios = (b[None, :] / a[:, None]).ravel()
    k = len(ratios)
    lo, hi = np.partition(ratios, (d - 1, k - d))[[d - 1, k - d]]
    return float(lo), float(hi)  # not finite over 0 ms or past the largest float: its callers say which (`n/a`)


def fewest_per_side(alpha: float) -> int:
    """The fewest samples per side for which a rank interval exists at this alpha: 1 / C(2n, n) <= alpha / 2."""
    n = 1
    while 2 > Fraction(alpha) * math.comb(2 * n, n):
        n += 1
    return n


def _side(samples: list[float]) -> np.ndarray:
    """A side of the rank interval: its samples, or past RANK_SAMPLES of them its block medians (at least 44).
    Raw samples keep the power a side of one or two samples needs (a cell cut to one call by a regression
    thousands of times slower, against 40 calls of its baseline: chance 1 / 41); the cap keeps the exact count
    cheap (10,000 samples against 24 take about 2 s, their block medians a millisecond)."""
    x = np.asarray(samples, dtype=np.float64)
    return block_medians(samples) if len(x) > RANK_SAMPLES else x


def t_quantile(p: float, df: float) -> float:
    """The p-quantile (p > 0.5) of Student's t with `df` degrees of freedom: its density integrated by Simpson's
    rule and the CDF bisected (numpy and math only: scipy is not a dependency)."""
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def cdf(x: float) -> float:
        t = np.linspace(0.0, x, 4001)
        f = np.exp(log_c - (df + 1) / 2 * np.log1p(t * t / df))
        return 0.5 + x / 12000 * (f[0] + f[-1] + 4 * f[1:-1:2].sum() + 2 * f[2:-1:2].sum())

    lo, hi = 0.0, 1.0
    while cdf(hi) < p:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def repeat_interval(reps_a: list[float], reps_b: list[float], alpha: float) -> tuple[float, float]:
    """Welch t-interval (level 1 - alpha) of mean(log B repeats) - mean(log A repeats), as a ratio B / A."""
    la, lb = np.log(np.asarray(reps_a, dtype=np.float64)), np.log(np.asarray(reps_b, dtype=np.float64))
    va, vb = la.var(ddof=1) / len(la), lb.var(ddof=1) / len(lb)
    diff = float(lb.mean() - la.mean())
    if va + vb == 0:
        return _exp(diff), _exp(diff)
    df = (va + vb) ** 2 / (va * va / (len(la) - 1) + vb * vb / (len(lb) - 1))
    half = t_quantile(1 - alpha / 2, df) * math.sqrt(va + vb)
    return _exp(diff - half), _exp(diff + half)


def _exp(x: float) -> float:
    """exp, infinite past the largest float: two repeats of 1 and 1.3 ms at --alpha 1e-6 bound the log ratio by
    about 1,000, and math.exp raised OverflowError (a traceback in compare and report)."""
    return math.inf if x > 709.0 else math.exp(x)


def _beyond(lo: float, hi: float, cfg: CompareConfig) -> str | None:
    if lo > 1 + cfg.min_effect:
        return "slower"
    if hi < 1 - cfg.min_effect:
        return "faster"
    return None


def judge(samples_a: list[float], samples_b: list[float], median_a: float, median_b: float,
          cfg: CompareConfig, scenario: object = None, repeats_a: list[float] | None = None,
          repeats_b: list[float] | None = None) -> tuple[float, tuple[float, float] | None, str, str]:
    """(ratio B/A, interval, verdict, note) for two cells that were both ok (of `scenario`: the note's hint);
    `repeats_a` / `repeats_b`: the medians of each side's repeats, where its run was repeated (rule 5)."""
    with np.errstate(over="ignore", divide="ignore"):
        ratio = float(np.float64(median_b) / np.float64(median_a))
    if min(median_a, median_b) <= 0:  # a side of 0 ms calls: B all 0 ms read `faster` within the interval (0, 0)
        return (ratio if math.isfinite(ratio) else None), None, "n/a", ZERO_NOTE
    if not math.isfinite(ratio):  # medians at the two ends of the floats (1e300 ms over 1e-300 ms)
        return None, None, "n/a", f"B/A is past the largest float (medians {median_a:.4g} and {median_b:.4g} ms)"
    if repeats_a and repeats_b and len(repeats_a) >= 2 and len(repeats_b) >= 2:
        if min(*repeats_a, *repeats_b) <= 0:
            return ratio, None, "n/a", ZERO_NOTE
        lo, hi = repeat_interval(repeats_a, repeats_b, cfg.alpha)
        if not (math.isfinite(lo) and math.isfinite(hi)):
            return ratio, None, "n/a", (f"{len(repeats_a)} + {len(repeats_b)} repeats spread too widely to bound the "
                                        "ratio at this --alpha: more repeats (--repeat) bound it")
        return ratio, (lo, hi), _beyond(lo, hi, cfg) or "same", f"over {len(repeats_a)} + {len(repeats_b)} repeats"
    blocks_a, blocks_b = block_medians(samples_a), block_medians(samples_b)
    if _too_correlated(samples_a, blocks_a) or _too_correlated(samples_b, blocks_b):
        return (ratio, *correlated(samples_a, samples_b, cfg, scenario))
    if min(len(blocks_a), len(blocks_b)) < MIN_BLOCKS:
        return (ratio, *few_samples(samples_a, samples_b, cfg, scenario))
    with np.errstate(divide="ignore", invalid="ignore"):  # over 0 ms: no finite bound, checked below
        lo, hi = ratio_interval(blocks_a, blocks_b, cfg.alpha)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return ratio, None, "n/a", ZERO_NOTE
    # where the correlation lengthened the blocks, the note says what the calls were worth
    lengthened = any(len(blocks) < math.isqrt(len(x)) for x, blocks in ((samples_a, blocks_a), (samples_b, blocks_b)))
    worth = (f"{_effective(samples_a)} + {_effective(samples_b)} samples, autocorrelated: "
             f"{len(blocks_a)} + {len(blocks_b)} blocks" if lengthened else "")
    verdict = _beyond(lo, hi, cfg)
    if verdict:
        return ratio, (lo, hi), verdict, worth
    if lo > 1 or hi < 1:
        return ratio, (lo, hi), "same", "; ".join(
            x for x in (worth, f"a change, but not all of it beyond the {percent(cfg.min_effect)} min effect") if x)
    return ratio, (lo, hi), "same", worth


def _too_correlated(samples: list[float], blocks: np.ndarray) -> bool:
    """Samples enough for MIN_BLOCKS blocks that their correlation cut to fewer (`correlated` judges them)."""
    return len(samples) >= MIN_BLOCKS * MIN_BLOCKS and len(blocks) < MIN_BLOCKS


def _effective(samples: list[float]) -> str:
    """A side's sample count with its effective size where its samples are autocorrelated: `300 (about 9)`."""
    n = len(samples)
    tau = autocorrelation_time(samples) if n >= MIN_BLOCKS * MIN_BLOCKS else 1.0
    return f"{n} (about {max(1, round(n / tau))})" if tau >= DEPENDENT_TAU else f"{n}"


def correlated(samples_a: list[float], samples_b: list[float], cfg: CompareConfig,
               scenario: object = None) -> tuple[tuple[float, float] | None, str, str]:
    """(interval, verdict, note) where a side's samples are so autocorrelated that they make fewer than MIN_BLOCKS
    blocks of BLOCK_TAUS correlation times: the blocks' medians (a side under 25 samples: its samples) are taken
    as independent draws, as repeats are (rule 5: a Welch t-interval of their mean log), never the samples, which
    are not. Under two blocks a side: `n/a`, saying how many independent samples the calls were worth (n / tau)."""
    units_a, units_b = (np.asarray(x, dtype=np.float64) if len(x) < MIN_BLOCKS * MIN_BLOCKS else block_medians(x)
                        for x in (samples_a, samples_b))
    counts = f"{_effective(samples_a)} + {_effective(samples_b)} samples"
    hint = ("time longer (--min-time) or repeat the runs (--repeat)" if longer(scenario) == "--min-time"
            else f"raise {longer(scenario)} or repeat the runs (--repeat)")
    blocks = f"{len(units_a)} + {len(units_b)} blocks"
    if not len(units_a) or not len(units_b):
        return None, "n/a", f"{counts}: a verdict needs samples on both sides; {hint}"
    interval = None
    if min(len(units_a), len(units_b)) >= 2 and min(*units_a, *units_b) > 0:
        interval = repeat_interval(units_a.tolist(), units_b.tolist(), cfg.alpha)
    if interval is None and _least(samples_a, samples_b) <= 0:  # a step of 0 ms samples reads as a correlation too
        return None, "n/a", f"{counts}: {ZERO_NOTE}"
    if interval is None or not all(math.isfinite(v) for v in interval):
        return None, "n/a", (f"{counts}, autocorrelated (effective size in brackets): too few independent stretches "
                             f"for a verdict at alpha {cfg.alpha:g} ({blocks} of at least {BLOCK_TAUS} correlation "
                             f"times; an interval needs 2 a cell, spread narrowly enough); {hint}")
    lo, hi = interval
    verdict = _beyond(lo, hi, cfg)
    note = f"{counts}, autocorrelated: t-interval over {blocks}"
    if verdict:
        return interval, verdict, note
    if lo >= 1 - cfg.min_effect and hi <= 1 + cfg.min_effect:
        return interval, "same", f"{note}, within the {percent(cfg.min_effect)} min effect"
    return interval, "n/a", f"{note} reaches past the {percent(cfg.min_effect)} min effect; {hint}"


def _least(samples_a, samples_b) -> float:
    """The smallest sample of two non-empty sides: min(*a, *b) made a numpy scalar of each of millions of samples."""
    return min(float(np.min(np.asarray(x, dtype=np.float64))) for x in (samples_a, samples_b))


def few_samples(samples_a: list[float], samples_b: list[float], cfg: CompareConfig,
                scenario: object = None) -> tuple[tuple[float, float] | None, str, str]:
    """(interval, verdict, note) for cells with too few samples for blocks: the exact rank interval (rule 4)."""
    counts = f"{len(samples_a)} + {len(samples_b)} samples"
    need = MIN_BLOCKS * MIN_BLOCKS
    hint = "time longer (--min-time)" if longer(scenario) == "--min-time" else f"raise {longer(scenario)}"
    if not len(samples_a) or not len(samples_b):
        return None, "n/a", f"{counts}: a verdict needs samples on both sides; {hint}"
    with np.errstate(divide="ignore", invalid="ignore"):  # over 0 ms: no finite bound, checked below
        interval = rank_interval(_side(samples_a), _side(samples_b), cfg.alpha)
    if interval is None:
        return None, "n/a", (f"{counts}: too few for any verdict at alpha {cfg.alpha:g} (a rank interval needs "
                             f"{fewest_per_side(cfg.alpha)} per cell, one over blocks {need}); {hint}")
    lo, hi = interval
    if not (math.isfinite(lo) and math.isfinite(hi)):
        zero = _least(samples_a, samples_b) <= 0
        return None, "n/a", f"{counts}: {ZERO_NOTE if zero else 'a ratio of their samples passes the largest float'}"
    verdict = _beyond(lo, hi, cfg)
    if verdict:
        return interval, verdict, f"{counts}: exact rank interval"
    if lo >= 1 - cfg.min_effect and hi <= 1 + cfg.min_effect:
        return interval, "same", f"{counts}: exact rank interval, within the {percent(cfg.min_effect)} min effect"
    return interval, "n/a", (f"{counts}: the rank interval reaches past the {percent(cfg.min_effect)} min effect "
                             f"without lying beyond it; {need} per cell give an interval over blocks: {hint}")


def method(samples_a: list[float], samples_b: list[float], reps_a: list[float] | None,
           reps_b: list[float] | None, interval) -> str | None:
    """Which rule gave the interval: `repeats` (rule 5), `ranks` (rule 4) or `blocks` (rules 1-3, and blocks cut
    short by the samples' correlation); None: none."""
    if interval is None:
        return None
    if reps_a and reps_b and len(reps_a) >= 2 and len(reps_b) >= 2:
        return "repeats"
    blocks_a, blocks_b = block_medians(samples_a), block_medians(samples_b)
    if _too_correlated(samples_a, blocks_a) or _too_correlated(samples_b, blocks_b):
        return "blocks"  # a t-interval over the blocks there are
    return "blocks" if min(len(blocks_a), len(blocks_b)) >= MIN_BLOCKS else "ranks"


def repeat_medians(rec: dict) -> list[float] | None:
    """The medians of a cell's repeats (`run --repeat`), where the record holds at least two finite ones."""
    reps = rec.get("repeat_medians_ms")
    if not isinstance(reps, list) or len(reps) < 2:
        return None
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0 for v in reps):
        return None
    return [float(v) for v in reps]


def _geometric_mean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _median(rec: dict) -> float | None:
    if rec.get("latency_ms"):
        return rec["latency_ms"]
    return sample_median(rec.get("_samples"))


def sample_median(samples) -> float | None:
    """The median of a cell's samples (a numpy array, as Store.cells reads them, or a list), None where there are
    none. np.median, not statistics.median, which sorted an array into a list of numpy scalars, an object each
    sample; both take the same middle pair and halve its sum."""
    if samples is None or len(samples) == 0:
        return None
    return float(np.median(np.asarray(samples, dtype=np.float64)))


def _same(a, b) -> bool:
    return type(a) is type(b) and a == b


def settings(rec: dict) -> dict[str, object]:
    """The settings the record's stored cell key holds, by name. A JSON-object key names them; a list key
    does not, so each value is named by the first field of the record (contract order: the identity
    fields come first) that holds it, else by its position."""
    try:  # through the input boundary: a stored key is a row read back, its nesting bounded
        key = loads_json(rec["_key"], "cell key", fix="")
    except SpecError:  # a key that is not JSON (a store written through Store.put_cell) is one setting, as it is
        key = rec["_key"]
    if isinstance(key, dict):
        return key
    out: dict[str, object] = {}
    for i, value in enumerate(key if isinstance(key, list) else [key]):
        name = next((f for f, v in rec.items() if f not in out and not f.startswith(("_", "run_"))
                     and _same(v, value)), f"#{i}")
        out[name] = value
    return out


def _value(v: object) -> str:
    # A setting is shown as it was given (seq_stdev=16, not 16.00): it names the cell, it is not a measurement.
    return f"{v:g}" if isinstance(v, float) else str(v)


def _text(values: dict[str, object], names) -> str:
    return " ".join(f"{n}={_value(values[n])}" for n in names if n in values)


def varying(records: list[dict]) -> list[str]:
    """Names of the key settings that differ between these records (or that some lack), in key order."""
    all_settings = [settings(r) for r in records]
    names = list(dict.fromkeys(n for s in all_settings for n in s))
    return [n for n in names
            if any(n not in s or not _same(s[n], all_settings[0].get(n)) for s in all_settings)]


def common(records: list[dict]) -> str:
    """The key settings every record shares, as `name=value` text."""
    if not records:
        return ""
    vary = set(varying(records))
    first = settings(records[0])
    return _text(first, [n for n in first if n not in vary])


def _differ(mine: dict, theirs: dict) -> list[str]:
    return [n for n in dict.fromkeys([*mine, *theirs]) if not _same(mine.get(n), theirs.get(n))]


def _token(v: object) -> tuple[str, str]:
    # A setting's value as a dict key, equal where _same is (a stray match, NaN's, is checked by _differ after)
    return type(v).__name__, json.dumps(v, sort_keys=True, default=repr)


def unmatched_reasons(recs: list[dict], others: list[tuple[object, dict]], other: str) -> list[str]:
    """Why each of `recs` has no partner: `not in B`, and where the other run's nearest cell (same scenario) differs
    in at most two settings, what it has there (`not in B (B has batch 8)`). Found through an index, not by looking
    at every other cell (tests/test_compare.py keeps that look as the reference): two runs of 3,000 cells each that
    shared one took a minute (10,000 ten), as the nearest cell was sought among all the others for each. A cell
    within two settings of another agrees with it on all the rest, so each set of at most two settings left out (of
    those that vary) is one lookup in a table of the other run's cells keyed by the rest: the earliest of the fewest
    differences, as the look at every cell chose."""
    reasons = [f"not in {other}"] * len(recs)
    by_scenario: dict[object, list[int]] = {}
    for i, rec in enumerate(recs):
        by_scenario.setdefault(_token(rec.get("scenario")), []).append(i)
    for scenario_token, mine_at in by_scenario.items():
        theirs = [s for sc, s in others if _token(sc) == scenario_token]
        if not theirs:
            continue
        mine = [settings(recs[i]) for i in mine_at]
        names = list(dict.fromkeys(n for s in (*mine, *theirs) for n in s))
        rows_mine, rows_theirs = ([[_token(s.get(n)) for n in names] for s in side] for side in (mine, theirs))
        # settings every cell has alike tell no cell apart: leaving them out is no lookup
        vary = [k for k in range(len(names)) if len({row[k] for row in (*rows_mine, *rows_theirs)}) > 1]
        best: list[tuple[int, int] | None] = [None] * len(mine)  # (differences, index in theirs)
        for size in range(3):
            if all(b is not None and b[0] < size for b in best):
                break  # each has a nearer cell than any this size of left-out set can find
            for left_out in itertools.combinations(vary, size):
                kept = [k for k in vary if k not in left_out]
                first: dict[tuple, int] = {}
                for j, row in enumerate(rows_theirs):
                    first.setdefault(tuple(row[k] for k in kept), j)
                for i, row in enumerate(rows_mine):
                    j = first.get(tuple(row[k] for k in kept))
                    if j is not None:
                        found = (len(_differ(mine[i], theirs[j])), j)
                        if found[0] <= 2 and (best[i] is None or found < best[i]):
                            best[i] = found
        for i, b in zip(mine_at, best):
            if b is not None and b[0] > 0:
                near = theirs[b[1]]
                shown = _text(near, _differ(settings(recs[i]), near))
                reasons[i] = f"not in {other} ({other} has {shown})" if shown else f"not in {other}"
    return reasons


def hardware(rec: dict) -> tuple[str | None, str | None, int | None]:
    """Where a cell ran: (device type, GPU name, CPU threads of a CPU cell), None where the record does not say (the
    GPU of a cell that failed before it saw one). cuda:0 and cuda:1 are one device type; GPUs tell apart by their
    name. A CPU cell's threads (`--threads`) are its hardware: a 1-thread run against a 2-thread one was paired and
    judged `slower` or `faster` for the cores it was given, not for the code."""
    device = str(rec.get("device") or "").split(":")[0] or None
    threads = rec.get("threads") if device == "cpu" and isinstance(rec.get("threads"), int) else None
    return device, (rec.get("gpu") or None) if device != "cpu" else None, threads


def other_hardware(a: dict, b: dict) -> bool:
    """Two cells known to have run on different hardware (what is unknown on one side does not count)."""
    return any(x is not None and y is not None and x != y for x, y in zip(hardware(a), hardware(b)))


def hardware_text(rec: dict) -> str:
    device, gpu, threads = hardware(rec)
    return (f"{device or 'an unknown device'}" + (f" ({gpu})" if gpu else "")
            + (f" with {threads} thread{'s' if threads != 1 else ''}" if threads else ""))


def search_probe(run: dict, rec: dict) -> bool:
    """A rate probe of `serve --find-max-rate` (every rate cell of such a run: the option takes no --rate beside it,
    serve/spec.py). Each probe's rate comes from the probe before it (serve/run.py bisects from the offline rate), so
    two runs of one server probe other rates: their probes were all `missing in B` and every such compare failed the
    gate, exit 1. Like the max-batch search's (whose probes are not stored), they are a search, not a grid."""
    return bool((run.get("spec") or {}).get("find_max_rate")) and rec.get("scenario") == "serve" \
        and rec.get("mode") == "rate"


def compare_records(run_a: dict, recs_a: list[dict], run_b: dict, recs_b: list[dict],
                    cfg: CompareConfig) -> Comparison:
    def index(run, recs):
        return {(r.get("scenario"), r["_key"]): r for r in recs
                if r.get("scenario") not in NOT_COMPARED and not search_probe(run, r)}

    a, b = index(run_a, recs_a), index(run_b, recs_b)
    out = Comparison(run_a, run_b, cfg, only_a=[a[k] for k in a if k not in b],
                     only_b=[b[k] for k in b if k not in a])
    for k, ra in a.items():
        rb = b.get(k)
        if rb is None:
            continue
        if other_hardware(ra, rb):
            # The key names what runs, not where: a cpu cell against a cuda one (or an A100 against an H100)
            # would judge the machines, and pass or fail a gate for that. Listed, not paired.
            out.only_a.append({**ra, "_why": f"B ran it on {hardware_text(rb)}, A on {hardware_text(ra)}"})
            out.only_b.append({**rb, "_why": f"A ran it on {hardware_text(ra)}, B on {hardware_text(rb)}"})
            continue
        ok_a, ok_b = ra["status"] == "ok", rb["status"] == "ok"
        ma, mb = (_median(ra) if ok_a else None), (_median(rb) if ok_b else None)
        if ok_a and not ok_b:
            out.cells.append(CellComparison(ra, rb, ma, None, None, None, "broken", f"B is {rb['status']}"))
        elif ok_b and not ok_a:
            out.cells.append(CellComparison(ra, rb, None, mb, None, None, "fixed", f"A was {ra['status']}"))
        elif not ok_a or not ma or mb is None:
            # "no latency in either run" was also said where one of them had one, and of a max-rate search's answer,
            # whose figure is its rate: one number a run, with no spread to bound a ratio
            why = (f"A {ra['status']}, B {rb['status']}" if not ok_a
                   else f"max rate {num(ra.get('max_rate'))}/s in A, {num(rb.get('max_rate'))}/s in B: one figure a "
                        "run, no interval" if ra.get("scenario") == "serve-max-rate"
                   else "no latency in either run" if not ma and mb is None
                   else "no latency in A" if not ma else "no latency in B")
            out.cells.append(CellComparison(ra, rb, ma, mb, None, None, "n/a", why))
        else:
            reps_a, reps_b = repeat_medians(ra), repeat_medians(rb)
            # B/A from the data its interval comes from, so it lies inside it: a repeated cell's latency_ms is its
            # middle repeat's median, and B/A 1.019 was printed beside an interval of 1.020-1.049
            if reps_a and reps_b:  # rule 5: the repeats' geometric means, the centre of the Welch interval
                ma, mb = _geometric_mean(reps_a), _geometric_mean(reps_b)
            elif reps_a or reps_b:  # the samples, every repeat's pooled: their medians
                pooled_a, pooled_b = sample_median(ra["_samples"]), sample_median(rb["_samples"])
                ma = ma if pooled_a is None else pooled_a
                mb = mb if pooled_b is None else pooled_b
            ratio, interval, verdict, note = judge(ra["_samples"], rb["_samples"], ma, mb, cfg, ra.get("scenario"),
                                                   reps_a, reps_b)
            failing = more_failures(ra, rb, cfg)
            if failing is not None:
                verdict, note = "broken", failing
            out.cells.append(CellComparison(ra, rb, ma, mb, ratio, interval, verdict, note,
                                            method(ra["_samples"], rb["_samples"], reps_a, reps_b, interval)))
    return out


def more_failures(ra: dict, rb: dict, cfg: CompareConfig) -> str | None:
    """Why B's share of failed requests is a regression, or None. B fails more than A by at least min_effect (as a
    share of requests: 0.03, 3 points) and by more than chance: a one-sided two-proportion z-test at alpha. Only
    cells that count requests and their failures (serve --url's `n_requests`, `failed`) are judged."""
    counts = [(r.get("n_requests"), r.get("failed")) for r in (ra, rb)]
    if not all(isinstance(n, int) and isinstance(f, int) and 0 <= f <= n and n > 0 for n, f in counts):
        return None
    (na, fa), (nb, fb) = counts
    pa, pb = fa / na, fb / nb
    pooled = (fa + fb) / (na + nb)
    if pb - pa < cfg.min_effect or pooled in (0, 1):
        return None
    z = (pb - pa) / math.sqrt(pooled * (1 - pooled) * (1 / na + 1 / nb))
    if z < statistics.NormalDist().inv_cdf(1 - cfg.alpha):
        return None
    return f"B failed {pb:.1%} of its requests ({fb:,} of {nb:,}), A {pa:.1%} ({fa:,} of {na:,})"


def compare(db: str, run_a: str, run_b: str, cfg: CompareConfig | None = None) -> Comparison:
    """Compare two stored runs (names, ids or 'last') of one store. Runs without one pair of cells are a
    SpecError: a gate that compared nothing must not pass."""
    cfg = cfg or CompareConfig()
    store = Store(db, readonly=True)  # a missing or foreign store is refused without a file left behind
    try:
        da, db_ = load(store, [run_a]), load(store, [run_b])
    finally:
        store.close()
    a, b = da.runs[0], db_.runs[0]
    if a["run_id"] == b["run_id"]:
        # `compare a a` (or `a last` where a is the newest) judged every cell `same` and passed the gate: a run
        # against itself checks nothing, and is most likely a name mistyped in a CI step. As `report a a` says.
        raise SpecError(f"runs '{run_a}' and '{run_b}' are one run ('{a['name']}'): a comparison needs two "
                        "different runs (`transbench runs` lists them)")
    cmp = compare_records(a, da.records, b, db_.records, cfg)
    why = nothing_compared(cmp)
    if why is not None:
        raise SpecError(why)
    if all(c.verdict == "n/a" for c in cmp.cells) and not any("_why" not in r for r in cmp.only_a):
        # every pair too uncertain to judge (3 samples a side): a 10x regression passed the gate, exit 0. A cell of A
        # that B lacks is a verdict that fails the gate whatever the pairs say: a B that crashed after one cell of a
        # few samples was refused as judging nothing (exit 2), its missing cells unsaid.
        note = next((c.note for c in cmp.cells if c.note), "")
        raise SpecError(f"runs '{a['name']}' and '{b['name']}': no pair of cells got a verdict"
                        + (f" ({note})" if note else "") + ": a gate that judged nothing must not pass; time more "
                        "samples (--min-count, --min-time) or repeat the runs (--repeat)")
    return cmp


def nothing_compared(cmp: Comparison) -> str | None:
    """Why two runs share no measured cell to compare, or None where they share one. `report` shows this line
    where `compare` refuses the runs: its comparison of two runs of other kinds was an empty table."""
    # Cells that ran on other hardware are not paired; where that leaves only pairs of failed cells (whose
    # records may not name their GPU), the runs are of two machines and nothing was compared. Pairs failed in
    # both runs alone compare nothing either: every verdict was n/a and the gate passed.
    if any("ok" in (c.record_a["status"], c.record_b["status"]) for c in cmp.cells):
        return None
    a, b = cmp.run_a, cmp.run_b
    moved = next((r for r in cmp.only_a if "_why" in r), None)
    if a["kind"] != b["kind"]:
        why = f"'{a['name']}' holds {a['kind']} cells, '{b['name']}' {b['kind']} cells"
    elif moved is not None:
        why = (f"their cells ran on other hardware ({moved['_why']}): their latencies would compare the "
               "machines, not the code")
    elif not cmp.cells and not (cmp.only_a and cmp.only_b):
        # "no cell of one has the settings of a cell of the other" sent the reader to compare grids where one run
        # held no cell at all: a B that stopped before its first cell, or a name given to the wrong run
        empty = [run["name"] for run, recs in ((a, cmp.only_a), (b, cmp.only_b)) if not recs]
        why = (f"{' and '.join(repr(n) for n in empty)} hold{'s' if len(empty) == 1 else ''} no cell that compare "
               "judges (none stored, or only max-batch answers and rate probes, which are searches): `transbench "
               "runs` counts each run's cells")
    elif cmp.cells:
        why = (f"the {len(cmp.cells)} cell(s) they share ran ok in neither (A: {_statuses(c.record_a for c in cmp.cells)};"
               f" B: {_statuses(c.record_b for c in cmp.cells)}): fix what failed and run them again")
    else:
        why = ("no cell of one has the settings of a cell of the other (`transbench runs --spec RUN` prints "
               "a run's grid)")
    return f"runs '{a['name']}' and '{b['name']}' share no cell to compare: {why}"


def _statuses(records) -> str:
    return ", ".join(f"{n} {s}" for s, n in sorted(Counter(r["status"] for r in records).items()))


def ratio_text(ratio: float) -> str:
    """B/A as text: three decimals where they say something; past them, three significant digits (a ratio of 1e-18
    read 0.000, one of 1e18 nineteen digits and three decimals)."""
    return f"{ratio:.3f}" if 0.001 <= abs(ratio) < 10_000 or ratio == 0 else f"{ratio:.3g}"


def _state(rec: dict, median: float | None) -> str:
    return num(median) if rec["status"] == "ok" else STATUS_TEXT.get(rec["status"], rec["status"])


def comparison_table(cmp: Comparison) -> Table:
    """One row per matched cell: the key settings that vary between the cells (`cell`; those all share are
    in the title), both medians, B/A, its interval and the verdict."""
    records = [c.record_a for c in cmp.cells]
    vary = varying(records)
    rows = []
    for c in cmp.cells:
        interval = "" if c.interval is None else f"{ratio_text(c.interval[0])}-{ratio_text(c.interval[1])}"
        rows.append(([_text(settings(c.record_a), vary)] if vary else []) + [
            _state(c.record_a, c.median_a), _state(c.record_b, c.median_b),
            "" if c.ratio is None else ratio_text(c.ratio), interval, c.verdict, c.note])
    headers = (["cell"] if vary else []) + ["A ms", "B ms", "B/A", f"{percent(1 - cmp.config.alpha)} interval",
                                            "verdict", "note"]
    shared = common(records)
    title = f"A = {cmp.run_a['name']}, B = {cmp.run_b['name']}" + (f"; every cell: {shared}" if shared else "")
    return Table(title, headers, rows, cmp.summary())


def unmatched_table(cmp: Comparison) -> Table | None:
    if not (cmp.only_a or cmp.only_b):
        return None
    rows = []
    for side, recs, other, others in (("A", cmp.only_a, "B", cmp.only_b), ("B", cmp.only_b, "A", cmp.only_a)):
        parsed = [(o.get("scenario"), settings(o)) for o in others]
        for r, why in zip(recs, unmatched_reasons(recs, parsed, other)):
            rows.append(["missing in B" if side == "A" else "only in B", _text(settings(r), settings(r)),
                         STATUS_TEXT.get(r["status"], r["status"]), r.get("_why") or why])
    return Table("cells in one run only", ["in", "cell", "status", "why"], rows)


def _n(rec: dict) -> int:
    return 0 if rec.get("_samples") is None else len(rec["_samples"])


def comparison_document(cmp: Comparison) -> dict:
    """`compare --json`: the versioned comparison (store/schema.py's `comparison`): per matched cell its settings,
    both statuses and medians, B/A, the interval and the rule that gave it, the verdict and its note; the cells in
    one run only, with why; the verdict counts and how many fail the gate."""
    from ..store.schema import SCHEMA_VERSION, version

    def side(run: dict) -> dict:
        return {"run_id": run["run_id"], "name": run["name"], "kind": run["kind"]}

    cells = [{"scenario": c.record_a.get("scenario"), "settings": settings(c.record_a),
              "status_a": c.record_a["status"], "status_b": c.record_b["status"],
              "median_a_ms": c.median_a, "median_b_ms": c.median_b, "ratio": c.ratio,
              "interval": list(c.interval) if c.interval is not None else None, "method": c.method,
              "verdict": c.verdict, "note": c.note, "n_a": _n(c.record_a), "n_b": _n(c.record_b),
              "repeats_a": repeat_medians(c.record_a), "repeats_b": repeat_medians(c.record_b)} for c in cmp.cells]
    unmatched = [{"side": s, "scenario": r.get("scenario"), "settings": settings(r), "status": r["status"],
                  "why": r.get("_why") or f"not in {'B' if s == 'A' else 'A'}"}
                 for s, recs in (("A", cmp.only_a), ("B", cmp.only_b)) for r in recs]
    return {"schema_version": SCHEMA_VERSION, "transbench_version": version(), "kind": "comparison",
            "run_a": side(cmp.run_a), "run_b": side(cmp.run_b), "alpha": cmp.config.alpha,
            "min_effect": cmp.config.min_effect, "counts": cmp.counts(), "regressions": len(cmp.regressions),
            "missing_in_b": len(cmp.only_a), "failed": cmp.failed,
            "summary": cmp.summary(), "cells": cells, "unmatched": unmatched}


def comparison_markdown(cmp: Comparison) -> str:
    """`compare --markdown`: a summary for a CI job's page (GitHub's $GITHUB_STEP_SUMMARY): the gate's outcome
    first, then the comparison table and the unmatched cells."""
    from .document import table_markdown

    failed = cmp.regressions
    missing = f", {len(cmp.only_a)} cell(s) of A missing in B" if cmp.only_a else ""
    head = (f"**transbench compare: {len(failed)} regression(s){missing}** (exit 1)" if cmp.failed
            else "**transbench compare: no regression** (exit 0)")
    parts = [head, "", table_markdown(comparison_table(cmp))]  # the table's markdown ends in the summary
    extra = unmatched_table(cmp)
    if extra is not None:
        parts += ["", table_markdown(extra)]
    return "\n".join(parts) + "\n"


def refusal_markdown(message: str) -> str:
    """`compare --markdown` where the runs could not be compared (exit 2): the reason in the step summary too, which
    a refused gate left silent, its reason in the job's log alone."""
    return f"**transbench compare: refused** (exit 2): {message}\n"


def github_benchmark(cmp: Comparison) -> list[dict]:
    """`compare --github-benchmark`: run B's ok cells in github-action-benchmark's `customSmallerIsBetter` format,
    [{name, unit, value, range, extra}]: its median latency per cell, named by the cell's settings (stable from
    run to run, so the action charts each cell over time), ± half the IQR, and the verdict against A in `extra`."""
    out = []
    judged = {id(c.record_b): c for c in cmp.cells}
    for rec in [c.record_b for c in cmp.cells] + list(cmp.only_b):
        median = _median(rec) if rec["status"] == "ok" else None
        if median is None:
            continue
        c = judged.get(id(rec))
        named = settings(rec)
        scenario = "" if "scenario" in named else str(rec.get("scenario") or "")
        name = " ".join(x for x in (scenario, _text(named, named)) if x)
        entry = {"name": name, "unit": "ms", "value": median}
        if rec.get("latency_iqr_ms") is not None:
            entry["range"] = f"± {rec['latency_iqr_ms'] / 2:.4g}"
        if c is not None:
            interval = "" if c.interval is None else f" ({ratio_text(c.interval[0])}-{ratio_text(c.interval[1])})"
            ratio = "" if c.ratio is None else f"; B/A {ratio_text(c.ratio)}{interval}"
            entry["extra"] = f"{c.verdict} against {cmp.run_a['name']}{ratio}; {_n(rec)} samples"
        out.append(entry)
    return out
