"""The report as a document: sections of tables, figures and text, rendered to markdown (and to HTML by
html.py) from the same blocks, so the two never disagree."""

from __future__ import annotations

from ..keys import KEYS, flag, percent  # noqa: F401  (report.document.percent)
from ..spec import escaped

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

# What a table cell says instead of a number when the cell has no valid measurement.
STATUS_TEXT = {"oom": "OOM", "wrong": "wrong", "timeout": "timeout", "error": "error",
               "unsupported": "unsupported", "skipped": "skipped"}


@dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[list[str]]
    note: str = ""


@dataclass
class Figure:
    path: Path
    title: str
    points: list[dict] = field(default_factory=list)  # every value drawn, to check what a plot shows


@dataclass
class Section:
    title: str
    blocks: list[Table | Figure | str] = field(default_factory=list)


LONG = 10**15  # num() writes values from here on in scientific notation


def num(value, kind: str = "") -> str:
    """A measured value as text: enough digits to compare, no scientific notation for everyday sizes."""
    if value is None:
        return ""
    if isinstance(value, bool):  # no key known: a switch's words (cell() gives a key's own, keys.flag)
        return "on" if value else "off"
    if isinstance(value, (list, dict)):  # as --json and --csv write it: Python's repr ({'pid': 1}) is no format
        return json.dumps(value, default=str)
    if not isinstance(value, (int, float)):
        return str(value)
    if kind == "pct":
        return percent(value * 100)
    if kind == "signed":
        return f"{value:+.1f}"
    if kind == "err":
        return f"{value:.2e}"
    a = abs(value)
    if LONG <= a < 2**1023:  # past any measured figure: 1e300 ms printed 301 digits, wider than any table
        return f"{float(value):.4g}"
    if isinstance(value, int):
        return str(value)
    if a >= 1000:
        return f"{value:.0f}"
    if a >= 100:
        return f"{value:.1f}"
    if a >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def measured(rec: dict, key: str, kind: str | None = None) -> str:
    """The value of a record's key, or the status name for a cell that is not ok: never a number there. `kind`
    defaults to the key's declared format (keys.py)."""
    status = rec.get("status")
    if status != "ok":
        return STATUS_TEXT.get(status, str(status))
    if kind is None:
        kind = {"pct": "pct", "signed": "signed", "sci": "err"}.get(KEYS[key].fmt, "") if key in KEYS else ""
    return cell(key, rec.get(key), kind)


def cell(key: str, value, kind: str = "") -> str:
    """One value of a report table: a true/false key as the terminal's tables print it (keys.flag: on/off for a
    switch, yes/no for a verdict), never Python's True/False; anything else as num() writes it."""
    return flag(key, value) if isinstance(value, bool) else num(value, kind)


# Characters that markdown (GitHub's included) reads as markup: emphasis, links, code, strike-through,
# table cells. A run or model name is text, as report.html's html.escape keeps it.
_MD_MARKUP = re.compile(r"([\\`*_\[\]|~])")
_HTML = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}


def shown_text(text) -> str:
    """Text with its control and direction characters written as escapes (\\u202e), as the terminal shows them
    (cli/tables.py visible): a checkpoint folder named with U+202E reversed the rest of report.md's and report.html's
    headings."""
    return escaped(text, keep="\n\t")


def md_text(text) -> str:
    """Any text as literal markdown on one line: markup characters backslash-escaped, HTML as entities."""
    s = shown_text(" ".join(str(text).splitlines()))
    s = re.sub(r"[&<>]", lambda m: _HTML[m.group()], s)
    return _MD_MARKUP.sub(r"\\\1", s)


def table_markdown(t: Table) -> str:
    lines = [f"#### {md_text(t.title)}", ""] if t.title else []
    if t.note:
        lines += [md_text(t.note), ""]
    lines.append("| " + " | ".join(md_text(h) for h in t.headers) + " |")
    lines.append("|" + "|".join("---" for _ in t.headers) + "|")
    lines += ["| " + " | ".join(md_text(c) for c in row) + " |" for row in t.rows]
    return "\n".join(lines)


def to_markdown(title: str, sections: list[Section], image_dir: Path) -> str:
    from ..store.export import REPORT_MARK

    # The mark first (an HTML comment: no markdown viewer shows it) tells a rerun that report.md is ours to
    # replace; a file without it is a user's, and `report --out` refuses to write over it (store/export.py ours).
    out = [REPORT_MARK, f"# {md_text(title)}", ""]
    for s in sections:
        out += [f"## {md_text(s.title)}", ""]
        for b in s.blocks:
            if isinstance(b, Table):
                out += [table_markdown(b), ""]
            elif isinstance(b, Figure):
                rel = Path(b.path).resolve().relative_to(image_dir.resolve())
                out += [f"![{md_text(b.title)}]({rel.as_posix()})", ""]
            else:
                out += [md_text(b), ""]
    return "\n".join(out)
