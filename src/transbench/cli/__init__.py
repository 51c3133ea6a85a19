"""The `transbench` command: a typer app whose commands live in this package, one module per topic."""

from __future__ import annotations

import importlib
import os

# The command never reaches a hub (models come from presets or folders, which the library reads with
# local_files_only): set before anything imports huggingface_hub, which reads it once. Only here, in the
# process the command owns; the Python API leaves its caller's environment alone.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from .app import app, fail  # noqa: E402,F401

# Each module registers its commands on `app`; a topic whose module is not there yet is left out.
for _topic in ("run", "serve", "server", "info", "models", "micro", "train", "report", "demo", "tune"):
    try:
        importlib.import_module(f"{__name__}.{_topic}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{_topic}":
            raise


def main() -> None:
    app()
