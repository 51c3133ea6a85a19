"""The `--kernels liger` axis: Liger-Kernel's fused Triton kernels put into a built model, from Liger's own
module classes (no copies here).

For BERT and GPT-2 Liger has no `apply_liger_kernel_to_*` (its table covers Llama-, Mistral-, Gemma-,
Qwen-style models), and those models have no RMSNorm, SwiGLU, GeGLU or RoPE: what applies is its
LayerNorm, and its fused linear + cross-entropy for the LM / MLM head, which computes the loss over chunks
of the sequence so the full (tokens x vocabulary) fp32 logits are never held. Models of a family Liger
patches by name take its own `apply_liger_kernel_to_<model_type>(model=...)`. Whether it can run at all
is `training_loop.check_supported`'s job (this module imports torch and Liger)."""

from __future__ import annotations

import torch


def _swap_layer_norms(model) -> list[str]:
    """Every torch LayerNorm becomes a LigerLayerNorm holding the same parameters (same values, same
    Parameter objects, so the optimizer and the memory split see nothing new)."""
    from liger_kernel.transformers import LigerLayerNorm

    replaced = []
    for parent_name, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.LayerNorm:
                new = LigerLayerNorm(child.normalized_shape[0], eps=child.eps, bias=child.bias is not None)
                new.weight = child.weight
                if child.bias is not None:
                    new.bias = child.bias
                setattr(parent, name, new)
                replaced.append(f"{parent_name}.{name}".lstrip("."))
    return replaced


# The families whose LM/MLM head LigerLoss knows how to take apart (hidden states in, the decoder's weight):
# BERT's transform + decoder and GPT-2's tied lm_head. RoBERTa, DistilBERT and the rest keep their own head.
FUSED_HEADS = {"bert": "cls.predictions.decoder", "gpt2": "lm_head"}


class LigerLoss(torch.nn.Module):
    """The model with its task's loss through Liger's fused linear + cross-entropy: the body's hidden
    states and the head's weight go in, the loss comes out (the logits are computed chunk by chunk and
    dropped). A module around the whole model, so DDP, FSDP and DeepSpeed wrap it like the model itself."""

    def __init__(self, model, task: str, family: str, predict: int | None = None):
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

        super().__init__()
        self.model, self.task, self.family, self.predict = model, task, family, predict
        self.fused = LigerFusedLinearCrossEntropyLoss()  # ignore_index -100: the unmasked MLM positions

    def forward(self, input_ids, labels, **kwargs):
        m = self.model
        if self.family == "gpt2":
            hidden = m.transformer(input_ids=input_ids, use_cache=False).last_hidden_state
            # transformers' own causal-LM loss shifts inside the model: position t predicts token t + 1
            hidden, labels = hidden[:, :-1], labels[:, 1:]
            weight, bias = m.lm_head.weight, None
        else:
            hidden = m.bert(input_ids=input_ids).last_hidden_state
            if self.predict:  # --head masked: the k masked positions of each row only (training_head.py)
                from .head import gather_labelled

                hidden, labels = gather_labelled(hidden, labels, self.predict)
            hidden = m.cls.predictions.transform(hidden)
            weight, bias = m.cls.predictions.decoder.weight, m.cls.predictions.decoder.bias
        # Under autocast the hidden states are bf16/fp16 and the master weights fp32: Liger's kernel wants
        # one dtype (the cast is differentiable, the fp32 weight still gets the gradient).
        weight = weight.to(hidden.dtype)
        bias = bias.to(hidden.dtype) if bias is not None else None
        h = hidden.reshape(-1, hidden.shape[-1])
        return {"loss": self._loss(weight, h, labels.reshape(-1), bias)}

    # Liger's loss is its own Triton kernels with a host read of the label count: under --compile on an H100,
    # dynamo traced into it, broke the graph at that read and then failed on a fake-tensor addmm (gpt2, torch
    # 2.11, Liger 0.8.5). Compile the model around it and call the loss as it is.
    @torch.compiler.disable
    def _loss(self, weight, h, labels, bias):
        return self.fused(weight, h, labels, bias)


def apply(model, task: str, family: str, predict: int | None = None) -> tuple[object, list[str]]:
    """Put Liger's kernels into `model` (in place). Returns (the module to train: `model`, or a LigerLoss
    around it where the head has a fused form; `predict`: its MLM head on that many masked positions per
    row; for a family without a fused head the caller wraps the masked head itself) and the names of what was
    replaced."""
    from liger_kernel.transformers import monkey_patch

    by_type = getattr(monkey_patch, "MODEL_TYPE_TO_APPLY_LIGER_FN", {}).get(model.config.model_type)
    if by_type is not None:
        by_type(model=model)
        return model, [f"apply_liger_kernel_to_{model.config.model_type}"]
    replaced = [f"{n} -> LigerLayerNorm" for n in _swap_layer_norms(model)]
    if task in ("mlm", "causal-lm") and family in FUSED_HEADS:
        return LigerLoss(model, task, family, predict), \
            replaced + [f"{FUSED_HEADS[family]} + cross-entropy -> LigerFusedLinearCrossEntropyLoss"]
    return model, replaced  # other families keep their own head (and loss): LayerNorm is what Liger gives them
