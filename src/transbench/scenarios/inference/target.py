"""The sweep's target for `run` cells: inference, or generation for --task generate."""

from __future__ import annotations

from ...cells import Cell, CellResult
from ..generation import measure as generation
from . import measure as inference


def measure(cell: dict, state: dict) -> CellResult:
    """Measure one cell in a worker. `state` is the worker's: its ModelCache (fp32 models and reference
    outputs on the host) outlives the cell; the device memory the cell used does not."""
    c = Cell.from_dict(cell)
    cache = state.setdefault("models", inference.ModelCache())
    if c.scenario == "generation":
        return generation.run(c, cache)
    return inference.run(c, cache)
