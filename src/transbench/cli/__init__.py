"""The `transbench` command: a typer app whose commands live in this package, one module per topic."""

from __future__ import annotations

import importlib

from .app import app, fail  # noqa: F401

# Each module registers its commands on `app`; a topic whose module is not there yet is left out.
for _topic in ("run", "serve", "info", "models", "micro", "train", "report", "demo", "tune"):
    try:
        importlib.import_module(f"{__name__}.{_topic}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{_topic}":
            raise


def main() -> None:
    app()
