"""A plot that cannot be written for a full disk stops the report in one line, its last files left as they were."""

from __future__ import annotations

import errno

import pytest
from report_helpers import cell, make_run, ok_result

from transbench import api
from transbench.errors import SpecError
from transbench.report import plots


def _full(data, out):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_under_a_plot_leaves_the_last_report_as_it_was(tmp_path, monkeypatch):
    db, out = str(tmp_path / "s.db"), tmp_path / "report"
    make_run(db, "a", [(cell(backend=b, batch=n), ok_result([1.0, 1.1, 1.2], n)) for b in ("eager", "sdpa")
                       for n in (1, 2)])
    api.report(db, ["a"], str(out))
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    monkeypatch.setattr(plots, "PLOTS", (_full, *plots.PLOTS))
    # Taken for one broken plot, it became a line "plot _full failed: ... No space left on device" in a new report.md
    # that replaced the good one.
    with pytest.raises(SpecError, match="No space left on device"):
        api.report(db, ["a"], str(out))
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_a_plot_that_fails_otherwise_is_still_a_line_of_the_report(tmp_path, monkeypatch):
    db, out = str(tmp_path / "s.db"), tmp_path / "report"
    make_run(db, "a", [(cell(batch=n), ok_result([1.0, 1.1, 1.2], n)) for n in (1, 2)])

    def broken(data, out):
        raise OSError(errno.ENOENT, "a font file is gone")

    monkeypatch.setattr(plots, "PLOTS", (broken, *plots.PLOTS))
    paths = api.report(db, ["a"], str(out))
    assert "plot broken failed: FileNotFoundError" in paths.markdown.read_text()
