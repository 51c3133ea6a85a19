"""Process entry of one training cell (one rank of it under torchrun): `python -m
transbench.scenarios.training.worker --cell CELL.json --out DIR`, started by runner/launch.py."""

from __future__ import annotations

from ...runner import rank
from . import loop as training_loop
from .cell import TrainCell


def _run(cell: dict, info: rank.RankInfo, device):
    return training_loop.run(TrainCell.from_dict(cell), info, device)


if __name__ == "__main__":
    rank.main(_run)
