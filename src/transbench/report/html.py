"""The report as one self-contained HTML page: images embedded as base64 data URIs, inline CSS, no
scripts and nothing fetched from the network, so it opens anywhere, offline, and can be mailed."""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

from .document import STATUS_TEXT, Figure, Section, Table, shown_text


def _escape(text, quote: bool = True) -> str:
    """Text as HTML: its control and direction characters shown as escapes (document.shown_text), then escaped."""
    return html.escape(shown_text(text), quote=quote)


CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1400px;
       padding: 0 1em; color: #222; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ccc; margin-top: 2em; } h4 { margin-bottom: .3em; }
table { border-collapse: collapse; margin: .5em 0 1.5em; font-size: .85em; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; white-space: nowrap; }
th { background: #f3f3f3; } tr:nth-child(even) td { background: #fafafa; }
.wrap { overflow-x: auto; } td.left { text-align: left; }
td.bad { color: #b00020; font-weight: 600; } td.text { text-align: left; white-space: normal; }
td.faster { color: #0a7d28; font-weight: 600; } td.slower, td.broken { color: #b00020; font-weight: 600; }
figure { margin: 1em 0 2em; } img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: .9em; color: #555; } p.note { color: #555; font-size: .9em; }
"""
BAD = set(STATUS_TEXT.values())
NUMBER = re.compile(r"^[+-]?[0-9.,]*([eE][+-]?[0-9]+)?%?$")
VERDICTS = {"faster", "slower", "broken"}


def data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode("ascii")


def _cell(text: str) -> str:
    cls = ("bad" if text in BAD else text if text in VERDICTS else "text" if len(text) > 40
           else "" if NUMBER.match(text) else "left")
    return f"<td class=\"{cls}\">{_escape(text)}</td>" if cls else f"<td>{_escape(text)}</td>"


def table_html(t: Table) -> str:
    parts = [f"<h4>{_escape(t.title)}</h4>"] if t.title else []
    if t.note:
        parts.append(f"<p class=\"note\">{_escape(t.note)}</p>")
    parts.append("<div class=\"wrap\"><table><thead><tr>" + "".join(f"<th>{_escape(h)}</th>" for h in t.headers)
                 + "</tr></thead><tbody>")
    parts += ["<tr>" + "".join(_cell(str(c)) for c in row) + "</tr>" for row in t.rows]
    parts.append("</tbody></table></div>")
    return "\n".join(parts)


def figure_html(f: Figure) -> str:
    alt = _escape(f.title, quote=True)
    return (f"<figure><img src=\"{data_uri(f.path)}\" alt=\"{alt}\">"
            f"<figcaption>{_escape(f.title)}</figcaption></figure>")


def to_html(title: str, sections: list[Section]) -> str:
    body = [f"<h1>{_escape(title)}</h1>"]
    for s in sections:
        body.append(f"<h2>{_escape(s.title)}</h2>")
        for b in s.blocks:
            if isinstance(b, Table):
                body.append(table_html(b))
            elif isinstance(b, Figure):
                body.append(figure_html(b))
            else:
                body.append(f"<p>{_escape(b)}</p>")
    from ..store.export import REPORT_MARK

    # The mark right after the doctype (before it, a comment may put a browser in quirks mode) tells a rerun that
    # report.html is ours to replace (store/export.py ours).
    return (f"<!DOCTYPE html>\n{REPORT_MARK}\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_escape(title)}</title><style>{CSS}</style></head>\n<body>\n"
            + "\n".join(body) + "\n</body></html>\n")
