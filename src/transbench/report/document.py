"""The report as a document: sections of tables, figures and text, rendered to markdown (and to HTML by
html.py) from the same blocks, so the two never disagree."""

from __future__ import annotations

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


def num(value, kind: str = "") -> str:
    """A measured value as text: enough digits to compare, no scientific notation for everyday sizes."""
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if kind == "pct":
        return f"{value * 100:.1f}%"
    if kind == "signed":
        return f"{value:+.1f}"
    if kind == "err":
        return f"{value:.2e}"
    if isinstance(value, int):
        return str(value)
    a = abs(value)
    if a >= 1000:
        return f"{value:.0f}"
    if a >= 100:
        return f"{value:.1f}"
    if a >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def measured(rec: dict, key: str, kind: str = "") -> str:
    """The value of a record's key, or the status name for a cell that is not ok: never a number there."""
    status = rec.get("status")
    if status != "ok":
        return STATUS_TEXT.get(status, str(status))
    return num(rec.get(key), kind)


def _md_cell(text) -> str:
    return str(text).replace("\n", " ").replace("|", "\\|")


def table_markdown(t: Table) -> str:
    lines = [f"#### {t.title}", ""] if t.title else []
    if t.note:
        lines += [t.note, ""]
    lines.append("| " + " | ".join(_md_cell(h) for h in t.headers) + " |")
    lines.append("|" + "|".join("---" for _ in t.headers) + "|")
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in t.rows]
    return "\n".join(lines)


def to_markdown(title: str, sections: list[Section], image_dir: Path) -> str:
    out = [f"# {title}", ""]
    for s in sections:
        out += [f"## {s.title}", ""]
        for b in s.blocks:
            if isinstance(b, Table):
                out += [table_markdown(b), ""]
            elif isinstance(b, Figure):
                rel = Path(b.path).resolve().relative_to(image_dir.resolve())
                out += [f"![{b.title}]({rel.as_posix()})", ""]
            else:
                out += [b, ""]
    return "\n".join(out)
