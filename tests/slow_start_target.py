"""A cell whose start-up is slow: importing this module takes TB_TEST_START_S seconds (as importing torch does on a
CPU), its work TB_TEST_WORK_S; launched, the rank TB_TEST_HANG_RANK never ends its work (a rank stuck short of a
collective). A worker target (`measure`) and a launched rank (`python -m slow_start_target`)."""

from __future__ import annotations

import os
import time

from transbench.cells import CellResult

time.sleep(float(os.environ.get("TB_TEST_START_S", "0")))


def measure(cell: dict, state: dict) -> CellResult:
    time.sleep(float(os.environ.get("TB_TEST_WORK_S", "0")))
    return CellResult("ok", record={"latency_ms": 1.0})


def run(cell: dict, info, device) -> CellResult:
    if os.environ.get("TB_TEST_HANG_RANK") == str(info.rank):
        time.sleep(10**6)
    return measure(cell, {}) if info.rank == 0 else None  # as the project's ranks: rank 0 reports for all


if __name__ == "__main__":
    from transbench.runner import rank

    rank.main(run)
