"""The HTML report is self-contained and renders in a real browser: no console errors, every image shown."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
from report_helpers import bad_result, cell, make_run, ok_result

from transbench.report import build_report

# Injected into a test copy of the page only: records errors from the first moment, then writes what the
# browser made of the page into the DOM, which --dump-dom prints.
CHECKER = """<script>
window.__errors = [];
const origError = console.error;
console.error = function (...args) { window.__errors.push(args.join(' ')); origError.apply(console, args); };
window.addEventListener('error', e => window.__errors.push(
  e.message || ('failed to load ' + String(e.target && (e.target.src || e.target.href)).slice(0, 60))), true);
window.addEventListener('load', () => {
  const images = [...document.images].map(i => ({w: i.naturalWidth, h: i.naturalHeight, done: i.complete}));
  const pre = document.createElement('pre');
  pre.id = 'transbench-check';
  pre.textContent = JSON.stringify({images, errors: window.__errors});
  document.body.appendChild(pre);
});
</script>"""


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("html")
    db = str(tmp / "h.db")
    results = []
    for backend, scale in (("eager", 1.0), ("sdpa", 0.7)):
        for seq in (8, 16):
            for batch in (1, 2, 4):
                samples = [scale * batch * seq * (1 + 0.01 * i) for i in range(5)]
                results.append((cell(backend, batch, seq), ok_result(samples, batch)))
    results.append((cell("eager", 8, 16), bad_result("oom", "CUDA out of memory", latency_ms=5.0)))
    results.append((cell("sdpa", 8, 16), bad_result("wrong", "rel_err 0.9 <script>alert(1)</script>")))
    make_run(db, "html-run", results, spec={"baseline": "eager"})
    return build_report(db, ["html-run"], tmp / "out")


@pytest.mark.slow
def test_page_is_self_contained(report):
    page = report.html.read_text()
    assert len(report.figures) >= 4
    srcs = re.findall(r'<img src="([^"]*)"', page)
    assert len(srcs) == len(report.figures)
    assert all(s.startswith("data:image/png;base64,") and len(s) > 1000 for s in srcs)
    assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:|//|file:)", page)
    assert "<link" not in page and "<script" not in page  # no external CSS or JS, and no JS at all
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page  # an error message is text, not markup
    assert 'class="bad">OOM<' in page


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(_chromium() is None, reason="Chromium not found: apt-get install -y chromium")
def test_page_renders_in_chromium(report, tmp_path):
    page = report.html.read_text().replace("<head>", "<head>" + CHECKER, 1)
    test_copy = tmp_path / "checked.html"
    test_copy.write_text(page)
    cmd = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000", "--dump-dom",
           test_copy.as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    found = re.search(r'<pre id="transbench-check">(.*?)</pre>', proc.stdout, re.S)
    assert found, f"the page did not finish loading: rc {proc.returncode}, stderr {proc.stderr[-2000:]}"
    result = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    assert result["errors"] == []
    assert len(result["images"]) == len(report.figures)
    assert all(i["done"] and i["w"] > 0 and i["h"] > 0 for i in result["images"]), result["images"]
