"""The package's layers, read from its imports (ast): a lower layer never imports a higher one, the engine
depends on nothing of the benchmark, and no two modules import each other, even through a chain or from
inside a function. The layers are those of the design (shared/design.md, "Layers")."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "src" / "transbench"

# Lowest first. A module may import its own layer and the ones below.
LAYERS = [
    ("ground", ("errors", "keys", "boundary", "store")),
    ("core", ("declare", "spec", "arguments", "cells", "models", "measure")),
    ("engine", ("engine",)),
    ("report", ("report",)),
    ("backends", ("backends",)),
    ("runner", ("runner",)),
    ("scenarios", ("scenarios", "demo")),
    ("api", ("api",)),
    ("face", ("cli", "__main__", "__init__")),
]
RANK = {top: i for i, (_, tops) in enumerate(LAYERS) for top in tops}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def imports(path: Path) -> set[str]:
    """Every transbench module `path` imports, at the top or inside a function."""
    name = module_name(path)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.startswith("transbench"):
                mod = node.module.removeprefix("transbench").lstrip(".")
            else:
                continue
            for alias in node.names:  # `from . import x` imports the module x
                sub = f"{mod}.{alias.name}" if mod else alias.name
                out.add(sub if (PKG / Path(*sub.split("."))).with_suffix(".py").exists()
                        or (PKG / Path(*sub.split("."))).is_dir() else mod)
        elif isinstance(node, ast.Import):
            out |= {a.name.removeprefix("transbench.") for a in node.names if a.name.startswith("transbench.")}
    return {m for m in out if m and m != name}


def graph() -> dict[str, set[str]]:
    return {module_name(p): imports(p) for p in PKG.rglob("*.py")}


def top(module: str) -> str:
    return module.split(".")[0]


def test_every_module_has_a_layer():
    missing = sorted({top(m) for m in graph()} - set(RANK))
    assert not missing, f"modules with no layer in tests/test_layers.py: {missing}"


def test_no_lower_layer_imports_a_higher_one():
    bad = [f"{m} -> {d}" for m, deps in graph().items() for d in deps
           if top(d) in RANK and RANK[top(d)] > RANK[top(m)]]
    assert not bad, "imports against the layers:\n" + "\n".join(sorted(bad))


@pytest.mark.slow
def test_the_engine_depends_on_nothing_of_the_benchmark():
    bad = [f"{m} -> {d}" for m, deps in graph().items() if top(m) == "engine" for d in deps if top(d) != "engine"]
    assert not bad, bad


def test_runner_backends_and_report_name_no_scenario():
    bad = [f"{m} -> {d}" for m, deps in graph().items() if top(m) in ("runner", "backends", "report")
           for d in deps if top(d) in ("scenarios", "serve")]
    assert not bad, bad


def test_no_import_cycles():
    g = graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in sorted(g.get(m, ())):
            if d not in g:
                continue
            if state.get(d) == 1:
                cycles.append(" -> ".join(path[path.index(d):] + [d]) if d in path else f"{m} -> {d}")
            elif d not in state:
                visit(d, path + [d])
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m, [m])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


@pytest.mark.slow
def test_the_reader_sees_real_imports():
    """The checks above are only as good as the reader: it must see both kinds of import."""
    g = graph()
    assert "cells" in g["runner.sweep"] and "measure.timer" in g["scenarios.inference.measure"]
    assert any(d.startswith("scenarios") for d in g["api"])


# The face is thin: the command line reaches the package through the API and the declarations alone (the settings'
# spec dataclasses, the result keys, the typed reading of specs, the input boundary, the errors).
FACE_MAY_IMPORT = ("api", "declare", "keys", "errors", "spec", "boundary", "cli", "__init__", "")


def _declaration(module: str) -> bool:
    return module.startswith("scenarios.") and module.rsplit(".", 1)[-1] in ("spec", "server_spec", "options")


def test_the_command_line_imports_only_the_api_and_the_declarations():
    bad = [f"{m} -> {d}" for m, deps in graph().items() if top(m) == "cli" for d in deps
           if top(d) not in FACE_MAY_IMPORT and not _declaration(d)]
    assert not bad, "the CLI reaches past the API:\n" + "\n".join(sorted(bad))


def test_the_api_stays_thin():
    assert len((PKG / "api.py").read_text().splitlines()) <= 200
