"""`--head masked`: the MLM head on the masked positions only, as BERT's own pretraining runs it
(google-research/bert run_pretraining.py gathers `masked_lm_positions` before the output layer; NVIDIA's
and Megatron's BERT do the same). transformers' BertForMaskedLM scores every position and its loss then
ignores the ~85% without a label: at seq 128 that is 85% of a (tokens x 30,522) product, its fp32 logits
and their cross-entropy, computed for nothing. The loss is the same mean over the labelled positions."""

from __future__ import annotations

import torch

# family -> (the encoder's attribute, the head's attribute): the head is transform + vocabulary decoder
# and takes hidden states of any leading shape.
HEADS = {"bert": ("bert", "cls"), "roberta": ("roberta", "lm_head")}


def gather_labelled(hidden, labels, k: int):
    """The `k` labelled positions of each row (every MLM row has exactly k: training_loop.make_batches)
    as (batch * k, hidden), and their labels. A fixed shape: torch.compile sees no data-dependent size
    (a boolean mask index would break its graph)."""
    idx = torch.topk((labels != -100).float(), k, dim=1, sorted=False).indices
    picked = hidden.gather(1, idx.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
    return picked.reshape(-1, hidden.shape[-1]), labels.gather(1, idx).reshape(-1)


class MaskedHead(torch.nn.Module):
    """The model with its MLM head run on the `k` masked positions of each sequence. A module around the
    whole model (its parameters, nothing new), so the optimizer, DDP, FSDP and DeepSpeed see the model."""

    def __init__(self, model, family: str, k: int):
        super().__init__()
        self.model, self.k = model, k
        self.body, self.head = HEADS[family]

    def forward(self, input_ids, labels, **kwargs):
        hidden = getattr(self.model, self.body)(input_ids=input_ids).last_hidden_state
        picked, targets = gather_labelled(hidden, labels, self.k)
        logits = getattr(self.model, self.head)(picked)
        return {"loss": torch.nn.functional.cross_entropy(logits, targets)}
