"""`--gpus` on a machine with GPUs (run on the device: python3 -m pytest tests/gpu/test_cli_gpus.py -m gpu):
the visible GPUs are accepted, one past them is refused before anything is stored, and counting them opens
no CUDA context in the parent process."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from typer.testing import CliRunner  # noqa: E402

from transbench.cli import app  # noqa: E402


def test_gpu_count_opens_no_cuda_context():
    code = ("import torch; from transbench.measure import device; n = device.gpu_count(); "
            "print(n, torch.cuda.is_initialized())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         timeout=300).stdout.split()
    assert int(out[0]) == torch.cuda.device_count() and out[1] == "False"


def test_visible_gpus_run_and_a_missing_one_is_refused(tmp_path):
    n = torch.cuda.device_count()
    db, js = tmp_path / "g.db", tmp_path / "g.json"
    res = CliRunner().invoke(app, ["run", "--model", "bert-tiny", "--batch", "1,2", "--seq", "32", "--backend", "sdpa",
                                   "--min-time", "0.05", "--gpus", ",".join(map(str, range(n))), "--db", str(db),
                                   "--json", str(js)])
    assert res.exit_code == 0, res.output
    recs = json.loads(js.read_text())["cells"]
    assert len(recs) == 2 and all(r["status"] == "ok" for r in recs)
    before = db.read_bytes()
    res = CliRunner().invoke(app, ["run", "--model", "bert-tiny", "--gpus", f"0,{n}", "--db", str(db)])
    assert res.exit_code == 2 and f"there is no GPU {n}" in res.stderr, res.output
    assert db.read_bytes() == before
