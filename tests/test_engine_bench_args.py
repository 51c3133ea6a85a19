"""benchmarks/engine_bench.py refuses unknown parts before touching the GPU (runs on CPU)."""
import re

import pytest
from script_helpers import BENCHMARKS, load_script

SCRIPT = BENCHMARKS / "engine_bench.py"


def _bench():
    return load_script("engine_bench")


def test_unknown_part_is_refused_with_exit_2(capsys):
    bench = _bench()
    with pytest.raises(SystemExit) as e:
        bench.main(["--parts", "call,refnie"])
    assert e.value.code == 2
    assert "unknown part refnie" in capsys.readouterr().err


def test_every_listed_part_has_a_branch_and_every_branch_is_listed():
    branches = re.findall(r'part == "([\w-]+)"', SCRIPT.read_text())
    assert sorted(branches) == sorted(_bench().PARTS)
