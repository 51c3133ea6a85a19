"""benchmarks/fused_races.py prints what the fused engine's tuner raced in each stored cell (runs on CPU)."""
import importlib.util
from pathlib import Path

from transbench.store.db import Store

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "fused_races.py"


def test_races_of_each_fused_cell_are_printed(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("fused_races", SCRIPT)
    races = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(races)
    tuned = {"routes": {"linear|bias=True|128x2304x768|torch.float16": "cublas"},
             "races": [{"trial": "library", "routes": {"linear|bias=True|128x2304x768|torch.float16": "cublas"},
                        "best_ms": 0.40, "trial_ms": 0.35, "won": True},
                       {"trial": "rival", "routes": {"dense|1x128x12x64|torch.float16|causal=False": "cudnn"},
                        "error": "RuntimeError: capture failed"}]}
    store = Store(tmp_path / "r.db")
    run_id, _ = store.create_run("s", "inference", {}, {})
    for backend, info in (("sdpa", {}), ("fused", {"engine_tuning": {"enc|1|128|True|128": tuned}})):
        store.put_cell(run_id, backend, "inference", "ok", {}, info=info,
                       cell={"backend": backend, "model": "bert-base-uncased", "batch": 1, "seq": 128})
    store.close()
    races.main([str(tmp_path / "r.db"), "--routes"])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "s bert-base-uncased 1x128 graph enc|1|128|True|128: 2 races, 1 won"
    assert out[1].split() == ["library", "0.3500", "vs", "0.4000", "ms", "WON",
                              "linear|bias=True|128x2304x768|torch.float16", "->", "cublas"]
    assert "RuntimeError: capture failed" in out[2] and out[2].split()[0] == "rival"
    assert out[3].split() == ["linear|bias=True|128x2304x768|torch.float16", "cublas"] and len(out) == 4
