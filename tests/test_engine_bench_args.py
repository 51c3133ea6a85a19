"""benchmarks/engine_bench.py refuses unknown parts before touching the GPU (runs on CPU)."""
import importlib.util
import re
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "engine_bench.py"


def _bench():
    spec = importlib.util.spec_from_file_location("engine_bench", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_unknown_part_is_refused_with_exit_2(capsys):
    bench = _bench()
    with pytest.raises(SystemExit) as e:
        bench.main(["--parts", "call,refnie"])
    assert e.value.code == 2
    assert "unknown part refnie" in capsys.readouterr().err


def test_every_listed_part_has_a_branch_and_every_branch_is_listed():
    branches = re.findall(r'part == "([\w-]+)"', SCRIPT.read_text())
    assert sorted(branches) == sorted(_bench().PARTS)
