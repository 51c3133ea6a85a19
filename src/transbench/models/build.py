"""Transformers models for (preset or local checkpoint, task), with random or real weights, offline.

Any family transformers ships runs: the task head is the class transformers' own Auto mappings name for
the family (`MODEL_FOR_MASKED_LM_MAPPING_NAMES`, ...), so a family without such a head is `unsupported`,
never guessed. A checkpoint folder is checked before anything runs (`resolve`): its config parses, its
model_type is one transformers knows, it brings no custom code (auto_map: never executed,
trust_remote_code stays False), and its weight files are there with readable headers."""

from __future__ import annotations

import copy
import json
import os
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import SpecError, Unsupported
from .presets import PRESETS, Preset

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach a hub: models come from presets or folders

TASKS = ("base", "mlm", "classification", "token-classification", "qa", "causal-lm", "generate")
ACTIVATIONS = {"gelu": "gelu", "gelu-tanh": "gelu_pytorch_tanh"}
NUM_LABELS = 2

# Task -> the transformers Auto mapping (model_type -> class name) whose class runs it.
_TASK_MAPPINGS = {
    "base": "MODEL_MAPPING_NAMES",
    "mlm": "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "classification": "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
    "token-classification": "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",
    "qa": "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES",
    "causal-lm": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "generate": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
}
# Config attribute of the FFN width and of the activation, where a family does not use the common name.
_FFN_NAMES = ("intermediate_size", "n_inner", "hidden_dim", "ffn_dim", "d_ff")
_ACT_NAMES = ("hidden_act", "activation_function", "activation", "hidden_activation")
# Families that number positions from pad_token_id + 1 (RoBERTa's create_position_ids_from_input_ids):
# their max_position_embeddings is the longest sequence plus that offset.
OFFSET_POSITIONS = ("roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "roberta-prelayernorm", "data2vec-text")
# Keys of a config's dict that describe the file, not the model (and model_type is the family).
_NOT_CONFIG = ("model_type", "architectures", "transformers_version", "_name_or_path", "auto_map", "dtype",
               "torch_dtype", "_attn_implementation_autoset", "num_hidden_layers", "hidden_size",
               "num_attention_heads", "vocab_size", "max_position_embeddings", "num_key_value_heads", "head_dim",
               "n_layer", "n_embd", "n_head", "n_positions", "dim", "n_layers", "n_heads", *_FFN_NAMES)
_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


@dataclass(frozen=True)
class ModelRef:
    """A resolved --model: its shape, and the folder its weights come from (None: random weights)."""

    name: str
    shape: Preset
    path: str | None = None

    @property
    def family(self) -> str:
        return self.shape.family


def _auto(name: str) -> dict:
    from transformers.models.auto import modeling_auto

    return getattr(modeling_auto, name)


def task_class(family: str, task: str) -> str | None:
    """The transformers class that runs `task` for `family`, or None when the family has no such head.
    Causal LM heads of encoders (BERT's is_decoder mode) are not a decoder benchmark: decoders only."""
    if task in ("causal-lm", "generate") and not is_decoder(family):
        return None
    name = _auto(_TASK_MAPPINGS[task]).get(family)
    return name if isinstance(name, str) else None


def is_decoder(family: str) -> bool:
    """A causal LM family: transformers has a causal LM head for it and no masked-LM head."""
    return family in _auto("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES") and family not in _auto("MODEL_FOR_MASKED_LM_MAPPING_NAMES")


def family_tasks(family: str) -> list[str]:
    return [t for t in TASKS if task_class(family, t)]


def _first(cfg, names, default=None):
    for n in names:
        v = getattr(cfg, n, None)
        if v is not None:
            return v
    return default


def shape_from_config(name: str, cfg) -> Preset:
    """The benchmark's view of a transformers config (attribute_map makes GPT-2's n_embd read as hidden_size)."""
    hidden, heads = cfg.hidden_size, cfg.num_attention_heads
    positions = getattr(cfg, "max_position_embeddings", None) or 1 << 20
    if cfg.model_type in OFFSET_POSITIONS:
        positions -= (cfg.pad_token_id or 0) + 1
    head_dim = getattr(cfg, "head_dim", None)
    kv = getattr(cfg, "num_key_value_heads", None)
    return Preset(
        name, cfg.model_type, cfg.num_hidden_layers, hidden, heads, _first(cfg, _FFN_NAMES, 4 * hidden),
        cfg.vocab_size, positions,
        kv_heads=kv if kv and kv != heads else None,
        head_dim=head_dim if head_dim and head_dim != hidden // heads else None,
        decoder=is_decoder(cfg.model_type),
        config={k: v for k, v in cfg.to_dict().items() if k not in _NOT_CONFIG},
    )


def preset_config(shape: Preset):
    """The transformers config of a preset: the family's config class with the shape and the preset's extras."""
    import transformers

    offset = shape.config.get("pad_token_id", 0) + 1 if shape.family in OFFSET_POSITIONS else 0
    kw = dict(num_hidden_layers=shape.layers, hidden_size=shape.hidden, num_attention_heads=shape.heads,
              vocab_size=shape.vocab, max_position_embeddings=shape.max_positions + offset)
    cls = transformers.CONFIG_MAPPING[shape.family]
    defaults = cls()
    ffn = next((n for n in _FFN_NAMES if hasattr(defaults, n)), "intermediate_size")
    kw[ffn] = shape.intermediate
    # Always named where the class has them: a class's defaults are another model's (Mistral's 8 kv heads,
    # Gemma's 16 kv heads of 256), and a shape leaves them out when they equal heads and hidden // heads.
    if shape.kv_heads or hasattr(defaults, "num_key_value_heads"):
        kw["num_key_value_heads"] = shape.kv
    if shape.head_dim or hasattr(defaults, "head_dim"):
        kw["head_dim"] = shape.dim
    # A deep copy: transformers fills nested dicts (rope_scaling) in place, and the preset must stay as declared.
    return transformers.AutoConfig.for_model(shape.family, **kw, **copy.deepcopy(shape.config))


# --- checkpoint folders -----------------------------------------------------------------------------

def _refuse(folder: Path, problem: str, fix: str):
    raise SpecError(f"checkpoint {folder}: {problem}; {fix}")


def _read_config(folder: Path) -> dict:
    path = folder / "config.json"
    if not path.is_file():
        _refuse(folder, "has no config.json", "point --model at a transformers checkpoint folder")
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        _refuse(folder, f"config.json is not valid JSON ({str(exc).splitlines()[0]})", "fix or re-download it")
    if not isinstance(cfg, dict) or not isinstance(cfg.get("model_type"), str):
        _refuse(folder, "config.json names no model_type", "re-download the checkpoint's config.json")
    return cfg


def _check_safetensors(folder: Path, file: Path) -> None:
    """The header: 8 bytes of little-endian length, then that many bytes of JSON (the safetensors format)."""
    try:
        size = file.stat().st_size
        with open(file, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n <= 0 or 8 + n > size:
                raise ValueError("header length past the end of the file")
            header = json.loads(f.read(n))
        if not isinstance(header, dict):
            raise ValueError("header is not a JSON object")
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
        if 8 + n + end > size:
            raise ValueError(f"truncated: {size} bytes, the header describes {8 + n + end}")
    except (OSError, ValueError, KeyError, TypeError, IndexError, struct.error) as exc:
        _refuse(folder, f"weight file {file.name} is not a readable safetensors file ({exc})",
                "re-download or re-save the weights")


def _check_torch_zip(folder: Path, file: Path) -> None:
    try:
        with zipfile.ZipFile(file) as z:  # the central directory, not every member's CRC: a cheap check
            ok = any(n.endswith("data.pkl") for n in z.namelist())
    except (OSError, zipfile.BadZipFile):
        ok = False
    if not ok:
        _refuse(folder, f"weight file {file.name} is not a readable torch zip archive",
                "re-download it or save the weights as model.safetensors")


def _check_weights(folder: Path) -> None:
    found = [folder / n for n in _WEIGHTS if (folder / n).is_file()]
    if not found:
        _refuse(folder, f"has no weight file ({', '.join(_WEIGHTS)})", "add the weights or use a preset")
    first = found[0]
    files = [first]
    if first.name.endswith(".index.json"):
        try:
            shards = sorted(set(json.loads(first.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError) as exc:
            _refuse(folder, f"{first.name} is not a valid weight index ({exc})", "re-download it")
        missing = [s for s in shards if not (folder / s).is_file()]
        if missing:
            _refuse(folder, f"weight shard {missing[0]} named by {first.name} is missing", "re-download the checkpoint")
        files = [folder / s for s in shards]
    for f in files:
        (_check_safetensors if f.suffix == ".safetensors" else _check_torch_zip)(folder, f)


def _resolve_folder(folder: Path) -> ModelRef:
    raw = _read_config(folder)
    if raw.get("auto_map"):
        _refuse(folder, "declares custom model code (auto_map); transbench never runs code shipped with a checkpoint",
                "use a checkpoint of a family transformers ships")
    from transformers import AutoConfig, __version__
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    family = raw["model_type"]
    if family not in CONFIG_MAPPING_NAMES:
        _refuse(folder, f"model_type '{family}' is unknown to transformers {__version__}",
                "upgrade transformers or use a checkpoint of a family it ships (transbench models)")
    _check_weights(folder)
    try:
        cfg = AutoConfig.from_pretrained(str(folder), trust_remote_code=False)
    except (ValueError, TypeError, AttributeError, KeyError, OSError) as exc:
        _refuse(folder, f"transformers cannot read its config.json ({str(exc).splitlines()[0]})", "fix config.json")
    if getattr(cfg, "is_encoder_decoder", False):
        # Its forward needs decoder inputs that no task here defines (T5 fails without them, BART's classifier
        # wants an end-of-sequence token in every row): refused, not benchmarked half-way.
        _refuse(folder, f"{family} is an encoder-decoder family", "transbench benchmarks encoders and decoders")
    try:
        return ModelRef(str(folder), shape_from_config(str(folder), cfg), str(folder))
    except (ValueError, TypeError, AttributeError, KeyError) as exc:
        _refuse(folder, f"transformers cannot read its config.json ({str(exc).splitlines()[0]})", "fix config.json")


def resolve(model: str) -> ModelRef:
    if model in PRESETS:
        return ModelRef(model, PRESETS[model])
    path = Path(model).expanduser()
    if path.is_dir():
        return _resolve_folder(path)
    raise SpecError(
        f"unknown model '{model}': use a preset ({', '.join(PRESETS)}) or a local checkpoint folder"
    )


def missing_head(ref: ModelRef, task: str) -> str | None:
    """Why `ref` cannot run `task` (the family has no such head), or None."""
    if task not in TASKS:
        raise SpecError(f"unknown task '{task}': choose from {', '.join(TASKS)}")
    if task_class(ref.family, task):
        return None
    kind = "a decoder (causal LM) family" if task in ("causal-lm", "generate") else "a family with that head"
    return f"task '{task}' needs {kind}; {ref.name} is {ref.family}, which runs {', '.join(family_tasks(ref.family))}"


def check_task(ref: ModelRef, task: str) -> None:
    """One model, one task: bad input when the family has no such head."""
    reason = missing_head(ref, task)
    if reason:
        raise SpecError(reason)


@dataclass(frozen=True)
class InputKinds:
    """What a family's forward takes besides token ids."""

    token_types: bool  # token_type_ids (encoders with a token-type embedding)
    pad_id: int  # the id padding positions hold (RoBERTa derives positions from it: real tokens never use it)


def input_kinds(ref: ModelRef) -> InputKinds:
    cfg = hf_config(ref, "base")
    types = not ref.shape.decoder and (getattr(cfg, "type_vocab_size", 0) or 0) > 0
    pad = cfg.pad_token_id if isinstance(cfg.pad_token_id, int) and 0 <= cfg.pad_token_id < ref.shape.vocab else 0
    return InputKinds(types, pad)


def hf_config(ref: ModelRef, task: str, activation: str | None = None):
    import transformers

    if ref.path:
        cfg = transformers.AutoConfig.from_pretrained(ref.path, trust_remote_code=False)
    else:
        cfg = preset_config(ref.shape)
    if getattr(cfg, "pad_token_id", None) is None:  # sequence classification of decoders needs one
        eos = getattr(cfg, "eos_token_id", None)
        cfg.pad_token_id = (eos[0] if isinstance(eos, list) else eos) if eos is not None else 0
    cfg.num_labels = NUM_LABELS
    if activation is not None:
        name = activation_field(cfg)
        if name is None:
            raise Unsupported(f"--activation: {ref.family} names no activation transbench can set")
        setattr(cfg, name, ACTIVATIONS[activation])
    return cfg


def activation_field(cfg) -> str | None:
    """The name of the config field that holds the FFN's activation (families name it differently)."""
    return next((n for n in _ACT_NAMES if getattr(cfg, n, None) is not None), None)


def build_model(ref: ModelRef, task: str, *, attn: str = "eager", activation: str | None = None,
                device: str = "cpu", seed: int = 0):
    """An fp32 model in eval mode on `device`; random weights from `seed` unless `ref` has a folder."""
    import inspect

    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    reason = missing_head(ref, task)
    if reason:
        raise Unsupported(reason)
    cls = getattr(transformers, task_class(ref.family, task))
    cfg = hf_config(ref, task, activation)
    # The bare model without a pooler (BERT, RoBERTa, ...): `base` is the encoder's hidden states.
    extra = {"add_pooling_layer": False} if "add_pooling_layer" in inspect.signature(cls.__init__).parameters else {}
    if ref.path:
        # fp32 whatever dtype the checkpoint was saved in: this is the reference every cell is checked
        # against, and the backends cast it to the cell's dtype themselves.
        model = cls.from_pretrained(ref.path, config=cfg, attn_implementation=attn, trust_remote_code=False,
                                    dtype=torch.float32, **extra).to(device)
    else:
        torch.manual_seed(seed)
        cfg._attn_implementation = attn
        with torch.device(device):
            model = cls(cfg, **extra)
    return model.eval().requires_grad_(False)


def param_count(shape: Preset) -> int:
    """Parameters of the bare model (no task head), counted on a meta-device copy: nothing is allocated."""
    model = build_model(ModelRef(shape.name, shape), "base", device="meta")
    return sum(p.numel() for p in model.parameters())


def set_attention(model, attn: str, fallback: str | None = None) -> None:
    """Switch the model to transformers' `attn` implementation; a family that lacks it runs `fallback`
    where the backend allows one, else the cell is `unsupported`. (transformers may keep the old
    implementation without a word, as it does for DeBERTa-v2 and sdpa: what it runs is checked after.)"""
    if model.config._attn_implementation == attn:
        return
    why = "its model class does not support it"
    try:
        model.set_attn_implementation(attn)
    except (ValueError, ImportError) as exc:
        why = str(exc).splitlines()[0]
    if model.config._attn_implementation == attn:
        return
    if fallback is None:
        raise Unsupported(f"{model.config.model_type} has no '{attn}' attention in transformers ({why})")
    model.set_attn_implementation(fallback)
