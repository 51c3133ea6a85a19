"""Shards of a grid, for every kind of run: which slice this process runs (`--shard I/N`, or `--shard auto` from the
cluster scheduler's variables) and the cells of that slice.

`auto` reads a Slurm job array (SLURM_ARRAY_TASK_ID with SLURM_ARRAY_TASK_MIN/MAX or SLURM_ARRAY_TASK_COUNT, and
SLURM_ARRAY_TASK_STEP for `--array=0-14:2`) or a Kubernetes Indexed Job (JOB_COMPLETION_INDEX, 0-based; a Job does
not tell its pods how many completions it has, so the count comes from `--shard-count N` or TRANSBENCH_SHARD_COUNT).
Each shard writes a store of its own on local disk (SQLite's locking does not hold over network filesystems) and
`transbench merge` joins them."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from ..errors import SpecError
from ..boundary import one_line
from ..spec import MAX_SHARDS, SHARD_DIGITS, check_shard, parse_shard, shard_number

COUNT_VAR = "TRANSBENCH_SHARD_COUNT"
SCHEDULER_VARS = ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_MIN",
                  "SLURM_ARRAY_TASK_MAX", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_STEP", "SLURM_JOB_NODELIST",
                  "JOB_COMPLETION_INDEX", COUNT_VAR)


def _int(env: Mapping[str, str], var: str) -> int | None:
    text = env.get(var)
    if text is None or not text.strip():
        return None
    try:
        return shard_number(text)  # ASCII digits, as every number transbench reads, and few enough of them
    except ValueError:
        raise SpecError(f"--shard auto: {var}='{one_line(text, 40)}' is not a whole number of at most {SHARD_DIGITS} "
                        "digits: fix or unset it") from None


def _slurm(env: Mapping[str, str]) -> tuple[int, int]:
    task = _int(env, "SLURM_ARRAY_TASK_ID")
    low, high = _int(env, "SLURM_ARRAY_TASK_MIN"), _int(env, "SLURM_ARRAY_TASK_MAX")
    count, step = _int(env, "SLURM_ARRAY_TASK_COUNT"), _int(env, "SLURM_ARRAY_TASK_STEP")
    step = 1 if step is None else step  # unset: no step; 0 is refused below, as -1 is (`or 1` read it as 1)
    if low is None:
        low = 0 if count is not None else None
    if low is None or (high is None and count is None):
        raise SpecError("--shard auto: SLURM_ARRAY_TASK_ID is set without SLURM_ARRAY_TASK_MIN/MAX or "
                        "SLURM_ARRAY_TASK_COUNT: run it as an array job (sbatch --array=0-N), or give --shard I/N")
    if step < 1:
        raise SpecError(f"--shard auto: SLURM_ARRAY_TASK_STEP={step} must be at least 1")
    n = count if count is not None else (high - low) // step + 1
    offset = task - low
    if n < 1 or offset < 0 or offset % step or offset // step >= n:
        raise SpecError(f"--shard auto: SLURM_ARRAY_TASK_ID {task} is not one of the array's {n} tasks "
                        f"({low}..{high if high is not None else low + (n - 1) * step} step {step})")
    return offset // step + 1, n


def _kubernetes(env: Mapping[str, str], count: int | None) -> tuple[int, int]:
    index = _int(env, "JOB_COMPLETION_INDEX")
    if count is None:
        count = _int(env, COUNT_VAR)
    if count is None:
        raise SpecError(f"--shard auto: JOB_COMPLETION_INDEX is set and the Job's completions are not: give "
                        f"--shard-count N (or set {COUNT_VAR} in the pod) to the Job's `completions`")
    if count < 1 or not 0 <= index < count:
        raise SpecError(f"--shard auto: JOB_COMPLETION_INDEX {index} is not an index of {count} completions "
                        "(0..count-1): check --shard-count")
    return index + 1, count


def resolve(shard: str | None, count: int | None = None,
            env: Mapping[str, str] | None = None) -> tuple[int, int] | None:
    """(I, N), 1-based, of `--shard I/N` or `--shard auto`; None without --shard. One line (SpecError) for anything
    that is not a shard: `auto` with no scheduler's variables, an index outside its array, --shard-count without auto."""
    env = os.environ if env is None else env
    if count is not None and (shard is None or shard.strip() != "auto"):
        raise SpecError("--shard-count is the count of --shard auto's Kubernetes Indexed Job: add --shard auto, or "
                        "leave --shard-count out")
    if count is not None and not 1 <= count <= MAX_SHARDS:
        # not echoed whole: typed, it may have thousands of digits
        got = count if abs(count) < 10**SHARD_DIGITS else f"a number of more than {SHARD_DIGITS} digits"
        raise SpecError(f"--shard-count must be at least 1 and at most {MAX_SHARDS:,}, got {got}")
    if shard is None or shard.strip() != "auto":
        return parse_shard(shard)
    if _int(env, "SLURM_ARRAY_TASK_ID") is not None:
        i, n = _slurm(env)
        if count is not None and count != n:
            raise SpecError(f"--shard-count {count} differs from the Slurm array's {n} tasks: leave --shard-count out")
        return check_shard(i, n, f"--shard auto (the Slurm array's task {i} of {n:,})")
    if _int(env, "JOB_COMPLETION_INDEX") is not None:
        i, n = _kubernetes(env, count)
        return check_shard(i, n, f"--shard auto (the Indexed Job's index {i - 1} of {n:,})")
    raise SpecError("--shard auto: no Slurm array (SLURM_ARRAY_TASK_ID) or Kubernetes Indexed Job "
                    "(JOB_COMPLETION_INDEX) in the environment: give --shard I/N")


def resolved(spec):
    """A spec (any kind's dataclass with `shard` and `shard_count`) with its shard checked and `auto` replaced by this
    task's I/N, so the stored spec says which slice ran."""
    from dataclasses import replace

    which = resolve(spec.shard, spec.shard_count)
    return replace(spec, shard=None if which is None else f"{which[0]}/{which[1]}", shard_count=None)


def scheduler(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The scheduler's variables of this process (stored with the run: which job and task ran it)."""
    env = os.environ if env is None else env
    return {k: env[k] for k in SCHEDULER_VARS if k in env}


def select(cells: list, which: tuple[int, int] | None, group: Callable[[object], object] | None = None) -> list:
    """Shard I of N: whole groups (by default the cells' OOM groups, so each shard skips larger batches as one run
    would) dealt round-robin in grid order; the same grid always gives the same slices, and together they are the
    grid."""
    if which is None:
        return cells
    i, n = which
    key = group or (lambda c: c.oom_group())
    groups = list(dict.fromkeys(key(c) for c in cells))
    owner = {g: k % n for k, g in enumerate(groups)}
    return [c for c in cells if owner[key(c)] == i - 1]
