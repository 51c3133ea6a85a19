"""Preparing a server within a time budget: its shapes (buckets, graphs) in the order the load is likeliest to
need them, until the budget is spent; what is left is prepared on first use, under load, and counted in the
cell's record (graphs_captured_under_load, shapes_prepared_under_load). The clock is a parameter, so the budget
is tested against a fake one."""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

PROGRESS_EVERY_S = 2.0  # progress lines at most this often (the first and the last always)


@dataclass
class Step:
    what: str  # e.g. "batch 32, 4,224 tokens"
    run: Callable[[], None]
    key: object = None  # steps of one key run once: a shape both among the commonest and among those covering the rest


def by_need(groups: dict[int, list], counts: dict[int, Counter]) -> list[tuple]:
    """One order, as (group, item) pairs, for every group's items: each group's items by how often the load drew them (most first, never
    drawn last, in their own order), the groups taken in turns, largest key first. A load near its capacity
    runs full batches, a light one small ones: turns give each batch size its commonest shapes early."""
    ranked = [[(g, x) for x in sorted(items, key=lambda x, c=counts.get(g, Counter()),
                                      o={x: i for i, x in enumerate(items)}: (-c[x], o[x]))]
              for g, items in sorted(groups.items(), reverse=True)]
    out = []
    for i in range(max((len(r) for r in ranked), default=0)):
        out += [r[i] for r in ranked if i < len(r)]
    return out


def run_steps(steps: Iterable[Step], budget_s: float | None, what: str,
              progress: Callable[[str], None] | None = None, clock: Callable[[], float] = time.perf_counter,
              start: float | None = None, switch_s: float | None = None,
              on_switch: Callable[[], None] | None = None, first_after_switch: Sequence[Step] = ()) -> dict:
    """Run steps in order until `budget_s` seconds (since `start`) are spent: a step is started only while time is
    left (one may end past the budget; the steps are seconds at most). The first step started `switch_s` seconds or
    more after the start runs after `on_switch()` (the fused server stops tuning there: what is left is captured on
    borrowed routes, a fraction of a tuned capture's time), and after `first_after_switch` (the fused server's
    largest shape of each batch size: once captured, every batch pads into a captured graph instead of capturing
    one under load). A step whose key ran already is skipped. Returns what ran, what is left, how many ran before
    the switch, seconds."""
    start = clock() if start is None else start
    queue = deque(steps)
    keys = [s.key if s.key is not None else id(s) for s in [*queue, *first_after_switch]]
    total = len(set(keys))
    done, said, before, ran = 0, None, None, set()
    while queue:
        step = queue.popleft()
        key = step.key if step.key is not None else id(step)
        if key in ran:
            continue
        if budget_s is not None and clock() - start >= budget_s:
            break
        if before is None and switch_s is not None and clock() - start >= switch_s:
            before = done
            if on_switch is not None:
                on_switch()
            if progress is not None:
                progress(f"preparing {what}: {clock() - start:.1f} s spent tuning {done} of {total}; the rest "
                         "captured without tuning" + (", each batch size's largest first" if first_after_switch else ""))
            if first_after_switch:
                queue.appendleft(step)
                queue.extendleft(reversed(first_after_switch))
                continue
        step.run()
        ran.add(key)
        done += 1
        now = clock()
        if progress is not None and (said is None or now - said >= PROGRESS_EVERY_S or done == total):
            progress(f"preparing {what}: {step.what} ({done} of {total}, {now - start:.1f} s)")
            said = now
    seconds = clock() - start
    if progress is not None and done < total:
        progress(f"preparing {what}: budget of {budget_s:g} s spent after {done} of {total}; "
                 f"{total - done} left to first use under load")
    return {"prepared": done, "total": total, "left": total - done, "tuned": done if before is None else before,
            "seconds": seconds}
