"""What `transbench tune` is asked for, each setting declared once (declare.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ...declare import setting

TUNED_DTYPES = ("fp16", "bf16", "fp8")


@dataclass
class TuneSpec:
    model: str | None = setting(None, "preset or local bert/gpt2 checkpoint folder (required)", short="-m")
    batches: list[int] = setting([1, 8, 64, 256], "batch sizes", option="--batch", axis=False)
    seqs: list[int] = setting([128, 384, 512], "sequence lengths", option="--seq", axis=False)
    dtype: str = setting("fp16", "", choices=TUNED_DTYPES)
    device: str = setting("auto", "auto|cuda|cuda:N")
    cache_dir: str | None = setting(None, "folder of the tuning table (engine-tuning.json)",
                                    shown="$TRANSBENCH_CACHE_DIR or ~/.cache/transbench")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
