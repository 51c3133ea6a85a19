"""Named model shapes, as published with the original checkpoints."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Preset:
    name: str
    family: str  # "bert" (encoder) or "gpt2" (decoder)
    layers: int
    hidden: int
    heads: int
    intermediate: int
    vocab: int
    max_positions: int

    def as_dict(self) -> dict:
        return asdict(self)


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in [
        Preset("bert-base-uncased", "bert", 12, 768, 12, 3072, 30522, 512),
        Preset("bert-large-uncased", "bert", 24, 1024, 16, 4096, 30522, 512),
        Preset("gpt2", "gpt2", 12, 768, 12, 3072, 50257, 1024),
        Preset("gpt2-medium", "gpt2", 24, 1024, 16, 4096, 50257, 1024),
        Preset("gpt2-large", "gpt2", 36, 1280, 20, 5120, 50257, 1024),
        Preset("gpt2-xl", "gpt2", 48, 1600, 25, 6400, 50257, 1024),
        # Tiny shapes for tests: odd enough (3 heads of 16) to catch layout bugs.
        Preset("bert-tiny", "bert", 2, 48, 3, 96, 1000, 128),
        Preset("gpt2-tiny", "gpt2", 2, 48, 3, 96, 1000, 128),
    ]
}
