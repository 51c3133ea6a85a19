"""merge into a store whose run another process is writing: refused like a second writer, the target unchanged."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from process_helpers import first_line
from report_helpers import cell, make_run, ok_result

from transbench import api
from transbench.errors import SpecError
from transbench.store import Store

ROOT = Path(__file__).resolve().parents[1]

HOLDER = """
import sys, time
from transbench.store.db import Store
store = Store(sys.argv[1])
store.claim(sys.argv[2])  # what a sweep does before it measures the run's first cell
print("holding", flush=True)
time.sleep(120)
"""


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_merge_into_a_run_another_process_is_writing_is_refused(tmp_path):
    source, target = tmp_path / "a.db", tmp_path / "t.db"
    make_run(str(source), "sweep", [(cell(batch=b), ok_result([1.0, 1.1, 1.2], b)) for b in (1, 2)])
    Store(str(target)).close()
    before = _digest(target)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(target), "sweep"], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    try:
        assert first_line(holder) == "holding"
        # Merged, its cells were replaced by the writer's own of the same keys while merge said they went in.
        with pytest.raises(SpecError, match=rf"run 'sweep' is being written to store {target} by another process"):
            api.merge(str(target), [str(source)])
        assert _digest(target) == before
    finally:
        holder.kill()
        holder.wait()
    merged = api.merge(str(target), [str(source)])  # the writer ended: the run is free to merge
    assert merged.runs == 1 and merged.cells > 0
