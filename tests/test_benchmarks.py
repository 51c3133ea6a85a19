"""benchmarks/ as a toolbox (runs on CPU): the GPU script's parts are listed, declared and refused when unknown; every
script parses; every benchmarks/ path the repository names exists; the results index lists every results file."""
import py_compile
import re
import subprocess
import sys
from pathlib import Path

import pytest
from script_helpers import BENCHMARKS

ROOT = BENCHMARKS.parent
GPU = BENCHMARKS / "gpu.sh"


def run_gpu(*args, **kw):
    return subprocess.run(["bash", str(GPU), *args], cwd=ROOT, capture_output=True, text=True, timeout=30, **kw)


def test_every_listed_part_is_declared_and_every_declared_part_is_listed():
    r = run_gpu("--list")
    assert r.returncode == 0, r.stderr
    listed = [line.split()[0] for line in r.stdout.splitlines()[1:]]
    declared = re.findall(r"^part_(\w+)\(\)", GPU.read_text(), re.M)
    assert listed and sorted(p.replace("-", "_") for p in listed) == sorted(declared)
    assert "tests" in listed and len(set(listed)) == len(listed)


def test_an_unknown_part_is_one_line_and_exit_2_before_anything_runs(tmp_path):
    out = tmp_path / "out"
    r = run_gpu("verify", "no-such-part", env={"OUT": str(out), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "no-such-part" in r.stderr
    assert not out.exists()  # the known part before it did not start either


def test_no_part_prints_the_usage_and_exits_2():
    r = run_gpu()
    assert r.returncode == 2 and "gpu.sh PART" in r.stdout


@pytest.mark.parametrize("script", sorted(BENCHMARKS.rglob("*.sh")), ids=lambda p: p.name)
def test_shell_scripts_parse(script):
    r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("script", sorted(BENCHMARKS.rglob("*.py")), ids=lambda p: p.name)
def test_python_scripts_compile(script, tmp_path):
    py_compile.compile(str(script), cfile=str(tmp_path / "x.pyc"), doraise=True)


def test_every_benchmarks_path_named_in_the_repository_exists():
    named = {}
    for folder in ("src", "tests", "docs", "benchmarks"):
        for f in (ROOT / folder).rglob("*"):
            if f.suffix in (".py", ".md", ".sh") and f.is_file():
                for path in re.findall(r"benchmarks/[\w./-]*\w", f.read_text(errors="replace")):
                    named.setdefault(path, f.relative_to(ROOT))
    missing = {p: str(f) for p, f in named.items() if not (ROOT / p).exists()}
    assert not missing


def test_the_results_index_lists_every_results_file():
    index = (BENCHMARKS / "results" / "README.md").read_text()
    files = sorted(p.name for p in (BENCHMARKS / "results").glob("*.md") if p.name != "README.md")
    assert files and [f for f in files if f"({f})" not in index] == []
    # named by topic, GPU and month
    assert all(re.fullmatch(r"[a-z0-9_]+_(h100|h200|[a-z0-9]+)_\d{4}-\d{2}\.md", f) for f in files)


def test_the_readme_names_every_part_and_every_script():
    readme = (BENCHMARKS / "README.md").read_text()
    parts = [line.split()[0] for line in run_gpu("--list").stdout.splitlines()[1:]]
    assert [p for p in parts if f"| `{p}` |" not in readme] == []
    scripts = sorted(p.relative_to(BENCHMARKS).as_posix() for p in BENCHMARKS.rglob("*") if p.suffix in (".py", ".sh")
                     and "__pycache__" not in p.parts)
    assert [s for s in scripts if f"`{s}`" not in readme] == []


@pytest.mark.parametrize("value", ["0", "1", "-3", "x"])
def test_plain_loop_check_refuses_a_generation_without_decode_steps(value):
    """--new-tokens below 2 leaves no decode step to time (it divided by zero after loading the model)."""
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "plain_loop_check.py"), "--new-tokens", value],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--new-tokens" in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("args", [["--point", "8"], ["--point", "0x128"], ["--point", "8x-1"], ["--point", "axb"],
                                  ["--model", "no-such-preset"], ["--backend", "fused"], ["--task", "generate"]])
def test_transformers_loop_check_refuses_bad_arguments_before_building_a_model(args):
    r = subprocess.run([sys.executable, str(BENCHMARKS / "transformers_loop_check.py"), *args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) <= 3, r.stderr
