"""Rich tables for the terminal, fitted to its width: no value is ever cut to an ellipsis.

Every table of the CLI goes through `fitted`: settings that are the same in every row move to the title,
empty columns go, rarely needed ones wait for `--wide`, and when the rest is still wider than the terminal
the least important columns are left out (the caption names them). Every text is a rich `Text`, so
user-provided names and error messages are printed literally, never read as markup."""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

from rich import box
from rich.cells import cell_len
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from ..boundary import env_int
from ..keys import KEYS, STATUSES, fmt, percent, show
from ..spec import escaped  # control characters as escapes (defined with the run-name check)


MIN_WIDTH, MAX_WIDTH = 40, 1000


def _width() -> int:
    """COLUMNS where it is a whole number, clamped to 40..1000 (COLUMNS=0 printed nothing and exited 0, and
    99999999 padded every line to that width); else a terminal's own width, clamped too; else (CI logs, `| tee`)
    180 rather than rich's 80-column default for output that is not a terminal. Always a number: given None, rich
    reads COLUMNS itself, unclamped."""
    columns = env_int("COLUMNS", None, MIN_WIDTH, MAX_WIDTH)
    if columns is not None:
        return columns
    try:
        if sys.stdout.isatty():
            return min(MAX_WIDTH, max(MIN_WIDTH, os.get_terminal_size(sys.stdout.fileno()).columns))
    except (OSError, ValueError, AttributeError):
        pass
    return 180


class _Console(Console):
    def on_broken_pipe(self) -> None:
        """A reader gone (`| head -1`) is an OSError for the command to handle, as every other write's is. rich's own
        answer was SystemExit(1), which `compare` (where 1 means a regression) could not tell from a verdict."""
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))


console = _Console(width=_width())


def visible(text) -> str:
    """`text` with its control characters written as escapes (\\x1b), everything else as it is."""
    return escaped(text)


def pct(value) -> str:
    return "-" if value is None else percent(value * 100)  # the report's rule: a tiny MFU is not "0.0%"


def signed(value) -> str:
    return "-" if value is None else f"{value:+.1f}"


@dataclass(frozen=True)
class Col:
    """A column: the record key, a short header, how a value prints.

    `setting`: a swept setting; when it is the same in every row it moves to the title.
    `rank`: columns are left out lowest rank first when the table is wider than the terminal (0: never).
    `wide`: shown only with --wide."""

    key: str
    header: str = ""  # "": the key's title in the catalogue (keys.py)
    show: Callable[[object], str] | None = None  # None: as the catalogue formats the key
    setting: bool = False
    rank: int = 0
    wide: bool = False
    left: bool = False  # text, not a number

    def __post_init__(self):
        if not self.header:
            object.__setattr__(self, "header", KEYS[self.key].title if self.key in KEYS else self.key.replace("_", " "))
        if self.show is None:
            object.__setattr__(self, "show", lambda v, key=self.key: show(key, v))


# Box drawing: one border character per column and one more, plus the padding of one space either side.
def _table_width(widths: list[int]) -> int:
    return sum(widths) + 3 * len(widths) + 1


# The most a text column (names, settings) claims when the table is fitted: past it the column folds its values,
# as rich does. A run name of 1,000 characters (the longest a name may be) claimed the whole terminal, and every
# other column of `runs` was left out.
TEXT_FOLD = 40


def _min_width(header: str, texts: list[str], fold: bool = False) -> int:
    # The whole header: rich would rather wrap a value than a header when it must squeeze, so a table is
    # only known to fit when every header fits on one line too. Headers are kept short for that. `fold`: a text
    # column, which claims at most TEXT_FOLD.
    values = max([cell_len(t) for t in texts] + [1])
    return max(cell_len(header), min(values, TEXT_FOLD) if fold else values)


def fitted(rows: list[dict], cols: list[Col], title: str = "", width: int | None = None, wide: bool = False,
           notes_from: str | None = "error") -> Group:
    """`rows` as one table no wider than `width`. A row whose status is not ok gets a numbered note with
    its reason (`notes_from`) under the table, instead of a column that would be too wide to fit."""
    width = width or console.width
    # (a setting no row has, serve's clients in a rate load, is not a setting of the table: "clients=-" said nothing)
    constant = {c.key: rows[0].get(c.key) for c in cols
                if c.setting and rows and len({repr(r.get(c.key)) for r in rows}) == 1 and len(rows) > 1
                and rows[0].get(c.key) is not None}
    shown = [c for c in cols if c.key not in constant and (c.key == "status" or any(r.get(c.key) is not None for r in rows))]
    hidden_wide = [c for c in shown if c.wide and not wide]
    shown = [c for c in shown if wide or not c.wide]

    notes: dict[str, int] = {}
    texts: dict[str, list[str]] = {c.key: [] for c in shown}
    for r in rows:
        for c in shown:
            v = r.get(c.key)
            t = c.show(v)
            if c.key == "status" and v not in (None, "ok"):
                reason = r.get(notes_from) if notes_from else None
                if reason:
                    n = notes.setdefault(str(reason), len(notes) + 1)
                    t = f"{t} [{n}]"
            texts[c.key].append(visible(t))

    dropped: list[Col] = []
    while True:
        widths = [_min_width(c.header, texts[c.key], c.left or c.setting) for c in shown]
        if _table_width(widths) <= width:
            break
        candidates = [c for c in shown if c.rank > 0]
        if not candidates:
            break  # nothing more may go: columns fold (wrap) rather than cut
        victim = min(candidates, key=lambda c: c.rank)
        shown.remove(victim)
        dropped.append(victim)

    head = title
    if constant:
        head += "  " + "  ".join(f"{_setting_name(cols, k)}={fmt(v)}" for k, v in constant.items())
    left_out = [c.header for c in dropped] + [c.header for c in hidden_wide]
    # `--wide` only where the table has columns it adds (`runs` has none, and no --wide)
    how = ("a wider terminal" if wide or not any(c.wide for c in cols) else "--wide and a wider terminal" if dropped
           else "--wide")
    caption = f"not shown: {', '.join(left_out)} ({how} shows them)" if left_out else None
    t = Table(title=Text(visible(head.strip())), caption=Text(caption) if caption else None, box=box.HEAVY_HEAD)
    for c in shown:
        t.add_column(Text(c.header), justify="left" if c.left or c.setting or c.key == "status" else "right",
                     overflow="fold")
    for i, r in enumerate(rows):
        t.add_row(*(Text(texts[c.key][i], style="bold red" if c.key == "status" and r.get("status") not in (None, "ok")
                         else "") for c in shown))
    parts = [t] + [Text(visible(f"[{n}] {reason}"), style="yellow") for reason, n in notes.items()]
    return Group(*parts)


def _setting_name(cols: list[Col], key: str) -> str:
    return next(c.header for c in cols if c.key == key)


def status_text(v) -> str:
    return "-" if v is None else ("OOM" if v == "oom" else str(v))


# The inference and generation table of `transbench run`.
RUN_COLUMNS = [
    Col("scenario", setting=True), Col("model", setting=True), Col("task", setting=True),
    Col("backend", setting=True), Col("dtype", setting=True), Col("quant", setting=True),
    Col("batch_size", setting=True), Col("seq_len", setting=True), Col("status", show=status_text),
    Col("latency_ms"), Col("_repeats", "repeats ms", lambda v: "" if v is None else v, rank=8),
    Col("throughput_per_s", rank=8), Col("prefill_ms", rank=7), Col("decode_ms_per_token", rank=7),
    Col("tflops", rank=6), Col("mfu", rank=5), Col("speedup", rank=6), Col("peak_mem_mb", rank=4),
    Col("mem_saved", rank=3, wide=True), Col("latency_iqr_ms", rank=2, wide=True),
    Col("latency_p99_ms", rank=2, wide=True), Col("tokens_per_s", rank=3, wide=True), Col("rel_err", rank=1, wide=True),
    Col("task_agreement", rank=1, wide=True),
]


def records_table(recs: list[dict], title: str = "", width: int | None = None, wide: bool = False) -> Group:
    """One row per cell of a run; a repeated cell (`run --repeat`) shows the range of its repeats' medians. `quant`
    only where a cell is quantized (else every title read `quant=none`); a run with a quantized or fp8 cell shows its
    task agreement without --wide: there it is how the cell is judged."""
    quantized = any(r.get("quant") not in (None, "none") for r in recs)
    cols = [c for c in RUN_COLUMNS if c.key != "quant" or quantized]
    if quantized or any(r.get("dtype") == "fp8" for r in recs):
        cols = [Col("task_agreement", rank=1) if c.key == "task_agreement" else c for c in cols]
    return fitted([{**r, "_repeats": repeat_range(r)} for r in recs], cols, title, width, wide)


def repeat_range(rec: dict) -> str | None:
    """min-max of a repeated cell's repeat medians and their count, e.g. '0.81-0.86 (3x)'."""
    lo, hi, n = rec.get("latency_repeat_min_ms"), rec.get("latency_repeat_max_ms"), rec.get("repeats")
    if lo is None or hi is None or rec.get("status") != "ok":
        return None
    return f"{lo:.4g}-{hi:.4g} ({n}x)"


def pivot(title: str, corner: str, columns: list[str], rows: dict[str, dict[str, str]], width: int | None = None) -> list[Table]:
    """A pivot ({row label: {column: text}}) as tables no wider than `width`: every column is data, so
    none is left out; columns that do not fit go to a next table that repeats the row labels."""
    width = width or console.width
    labels = list(rows)
    label_w = _min_width(corner, [visible(x) for x in labels])
    chunks: list[list[str]] = [[]]
    for c in columns:
        w = [label_w] + [_min_width(x, [rows[r].get(x, "") for r in labels]) for x in (*chunks[-1], c)]
        if chunks[-1] and _table_width(w) > width:
            chunks.append([])
        chunks[-1].append(c)
    tables = []
    for i, chunk in enumerate(chunks):
        part = f" ({i + 1}/{len(chunks)})" if len(chunks) > 1 else ""
        t = Table(title=Text(visible(title + part)), box=box.HEAVY_HEAD)
        t.add_column(Text(corner), justify="right", overflow="fold")
        for c in chunk:
            t.add_column(Text(c), justify="right", overflow="fold")
        for label in labels:
            t.add_row(Text(visible(label)), *(_cell(visible(rows[label].get(c, ""))) for c in chunk))
        tables.append(t)
    return tables


FAILED = tuple(s for s in STATUSES if s != "ok")


def _cell(text: str) -> Text:
    return Text(text, style="bold red" if text in FAILED else "")
