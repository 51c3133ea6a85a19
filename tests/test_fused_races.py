"""benchmarks/fused_races.py prints what the fused engine's tuner raced in each stored cell (runs on CPU)."""
import pytest
from script_helpers import load_script

from transbench.store.db import Store


def _script():
    return load_script("fused_races")


def test_races_of_each_fused_cell_are_printed(tmp_path, capsys):
    races = _script()
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


@pytest.mark.parametrize("content", [None, b"not a database at all, just some text" * 40])
def test_a_missing_or_foreign_store_is_refused_with_exit_2_and_left_as_it_was(tmp_path, capsys, content):
    path = tmp_path / "r.db"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(SystemExit) as e:
        _script().main([str(path)])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert ("no store at" if content is None else "not a transbench store") in err
    assert (not path.exists()) if content is None else path.read_bytes() == content


def test_a_store_without_tuned_fused_cells_says_so(tmp_path, capsys):
    """A CPU run's fused cells tune nothing (no graphs): the script printed nothing at all and exited 0, which
    reads as a broken script; it now says what the store lacks."""
    store = Store(tmp_path / "r.db")
    run_id, _ = store.create_run("s", "inference", {}, {})
    store.put_cell(run_id, "fused", "inference", "ok", {}, info={},
                   cell={"backend": "fused", "model": "bert-tiny", "batch": 1, "seq": 32})
    store.close()
    _script().main([str(tmp_path / "r.db")])
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith("no fused cell in ") and "tuning" in out[0], out
