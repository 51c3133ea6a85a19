"""Transformers models for (preset or local checkpoint, task), with random or real weights, offline."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import SpecError
from .presets import PRESETS, Preset

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach a hub: models come from presets or folders

TASKS = ("base", "mlm", "classification", "token-classification", "qa", "causal-lm", "generate")
ACTIVATIONS = {"gelu": "gelu", "gelu-tanh": "gelu_pytorch_tanh"}
NUM_LABELS = 2

_TASK_CLASSES = {
    "bert": {
        "base": "BertModel",
        "mlm": "BertForMaskedLM",
        "classification": "BertForSequenceClassification",
        "token-classification": "BertForTokenClassification",
        "qa": "BertForQuestionAnswering",
    },
    "gpt2": {
        "base": "GPT2Model",
        "causal-lm": "GPT2LMHeadModel",
        "generate": "GPT2LMHeadModel",
        "classification": "GPT2ForSequenceClassification",
        "token-classification": "GPT2ForTokenClassification",
        "qa": "GPT2ForQuestionAnswering",
    },
}


@dataclass(frozen=True)
class ModelRef:
    """A resolved --model: its shape, and the folder its weights come from (None: random weights)."""

    name: str
    shape: Preset
    path: str | None = None

    @property
    def family(self) -> str:
        return self.shape.family


def _shape_from_config(name: str, cfg) -> Preset:
    family = cfg.model_type
    if family not in _TASK_CLASSES:
        raise SpecError(
            f"checkpoint {name} is a '{family}' model; transbench runs the bert and gpt2 families"
        )
    if family == "gpt2":
        return Preset(name, family, cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_inner or 4 * cfg.n_embd,
                      cfg.vocab_size, cfg.n_positions)
    return Preset(name, family, cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads,
                  cfg.intermediate_size, cfg.vocab_size, cfg.max_position_embeddings)


def resolve(model: str) -> ModelRef:
    if model in PRESETS:
        return ModelRef(model, PRESETS[model])
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise SpecError(f"folder {model} has no config.json; point --model at a transformers checkpoint folder")
        from transformers import AutoConfig

        cfg = AutoConfig.from_pretrained(str(path))
        return ModelRef(str(path), _shape_from_config(str(path), cfg), str(path))
    raise SpecError(
        f"unknown model '{model}': use a preset ({', '.join(PRESETS)}) or a local checkpoint folder"
    )


def check_task(ref: ModelRef, task: str) -> None:
    if task not in TASKS:
        raise SpecError(f"unknown task '{task}': choose from {', '.join(TASKS)}")
    if task not in _TASK_CLASSES[ref.family]:
        fits = "gpt2" if task in ("causal-lm", "generate") else "bert"
        raise SpecError(f"task '{task}' needs a {fits}-family model; {ref.name} is {ref.family}")


def hf_config(ref: ModelRef, task: str, activation: str | None = None):
    import transformers

    s = ref.shape
    if ref.path:
        cfg = transformers.AutoConfig.from_pretrained(ref.path)
    elif s.family == "bert":
        cfg = transformers.BertConfig(
            vocab_size=s.vocab, hidden_size=s.hidden, num_hidden_layers=s.layers,
            num_attention_heads=s.heads, intermediate_size=s.intermediate,
            max_position_embeddings=s.max_positions,
        )
    else:
        eos = min(50256, s.vocab - 1)
        cfg = transformers.GPT2Config(
            vocab_size=s.vocab, n_embd=s.hidden, n_layer=s.layers, n_head=s.heads,
            n_inner=s.intermediate, n_positions=s.max_positions, bos_token_id=eos, eos_token_id=eos,
        )
    if s.family == "gpt2":
        cfg.pad_token_id = cfg.eos_token_id  # sequence classification needs one
    cfg.num_labels = NUM_LABELS
    if activation is not None:
        setattr(cfg, "hidden_act" if s.family == "bert" else "activation_function", ACTIVATIONS[activation])
    return cfg


def build_model(ref: ModelRef, task: str, *, attn: str = "eager", activation: str | None = None,
                device: str = "cpu", seed: int = 0):
    """An fp32 model in eval mode on `device`; random weights from `seed` unless `ref` has a folder."""
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    check_task(ref, task)
    cls = getattr(transformers, _TASK_CLASSES[ref.family][task])
    cfg = hf_config(ref, task, activation)
    extra = {"add_pooling_layer": False} if cls.__name__ == "BertModel" else {}
    if ref.path:
        model = cls.from_pretrained(ref.path, config=cfg, attn_implementation=attn, **extra).to(device)
    else:
        torch.manual_seed(seed)
        cfg._attn_implementation = attn
        with torch.device(device):
            model = cls(cfg, **extra)
    return model.eval().requires_grad_(False)
