"""Model inputs for a cell: random tokens (never zeros), optionally variable lengths padded with a mask."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

PAD_ID = 0


@dataclass
class Inputs:
    input_ids: object  # (batch, seq) int64
    lengths: list[int]  # real tokens per sequence
    attention_mask: object | None = None  # only when some sequence is padded
    token_type_ids: object | None = None
    inputs_embeds: object | None = None  # --encoders-only: the token lookup is done beforehand
    extra: dict = field(default_factory=dict)

    @property
    def batch(self) -> int:
        return len(self.lengths)

    @property
    def real_tokens(self) -> int:
        return sum(self.lengths)

    def model_kwargs(self) -> dict:
        kw = {"attention_mask": self.attention_mask}
        if self.inputs_embeds is not None:
            kw["inputs_embeds"] = self.inputs_embeds
        else:
            kw["input_ids"] = self.input_ids
        if self.token_type_ids is not None:
            kw["token_type_ids"] = self.token_type_ids
        return kw

    def rows(self, idx: list[int]) -> Inputs:
        """The same inputs restricted to some sequences (the reference runs on a few rows only). The width
        stays the batch's, so the reference lines up with the timed output column for column."""
        pick = lambda t: None if t is None else t[idx]  # noqa: E731
        return Inputs(pick(self.input_ids), [self.lengths[i] for i in idx], pick(self.attention_mask),
                      pick(self.token_type_ids), pick(self.inputs_embeds))

    def to(self, device) -> Inputs:
        mv = lambda t: None if t is None else t.to(device)  # noqa: E731
        return Inputs(mv(self.input_ids), self.lengths, mv(self.attention_mask), mv(self.token_type_ids),
                      mv(self.inputs_embeds), self.extra)


def point_seed(*parts) -> int:
    """A seed per grid point, so every backend at one point sees the same tokens."""
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:4], "little")


def draw_lengths(batch: int, seq: int, stdev: float, max_len: int, seed: int) -> list[int]:
    if stdev <= 0:
        return [seq] * batch
    import torch

    g = torch.Generator().manual_seed(seed)
    raw = torch.normal(float(seq), float(stdev), (batch,), generator=g).round()
    # Clipped before the cast: a draw past int64 (`--seq-stdev 1e30`) cast to its most negative value, so every
    # length came out 1 where half of them are the max
    return raw.clamp(1, max_len).long().tolist()


def make_inputs(vocab: int, batch: int, seq: int, *, token_types: bool = False, pad_id: int = PAD_ID,
                stdev: float = 0.0, max_len: int | None = None, seed: int = 0) -> Inputs:
    """Token ids drawn from the vocabulary without `pad_id` (RoBERTa numbers positions by it, so a real token
    equal to it would be taken for padding); padding positions hold `pad_id`."""
    import torch

    lengths = draw_lengths(batch, seq, stdev, max_len or seq, seed)
    width = max(lengths)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab - 1, (batch, width), generator=g)
    ids += (ids >= pad_id).long()  # skip the pad id: uniform over the other vocab - 1 ids
    mask = None
    if any(n < width for n in lengths):
        mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
        ids = ids.masked_fill(mask == 0, pad_id)
    types = torch.zeros_like(ids) if token_types else None
    return Inputs(ids, lengths, mask, types)
