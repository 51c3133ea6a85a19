"""Transformers models for (preset or local checkpoint, task), with random or real weights, offline.

Any family transformers ships runs: the task head is the class transformers' own Auto mappings name for
the family (`MODEL_FOR_MASKED_LM_MAPPING_NAMES`, ...), so a family without such a head is `unsupported`,
never guessed. A checkpoint folder is checked before anything runs (`resolve`): its config parses, its
model_type is one transformers knows, it brings no custom code (auto_map: never executed,
trust_remote_code stays False), transformers builds the model it describes, and its weight files are there
with readable headers whose tensors fit that model."""

from __future__ import annotations

import copy
import functools
import json
import math
import os
import re
import stat
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .. import boundary
from ..errors import SpecError, Unsupported
from .presets import PRESETS, Preset


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
# RoBERTa's function numbering positions from pad_token_id + 1: a family whose modeling module has it (transformers
# copies it into each: ESM, MPNet, I-BERT, Longformer and others beside RoBERTa's) has a max_position_embeddings of
# the longest sequence plus that offset. A fixed list of RoBERTa's kin missed the others, whose sequences one or two
# past their length ran into an IndexError cell.
_POSITIONS_FROM_PAD = "create_position_ids_from_input_ids"
# Keys of a config's dict that describe the file, not the model (and model_type is the family).
_NOT_CONFIG = ("model_type", "architectures", "transformers_version", "_name_or_path", "auto_map", "dtype",
               "torch_dtype", "_attn_implementation_autoset", "num_hidden_layers", "hidden_size",
               "num_attention_heads", "vocab_size", "max_position_embeddings", "num_key_value_heads", "head_dim",
               "n_layer", "n_embd", "n_head", "n_positions", "dim", "n_layers", "n_heads", *_FFN_NAMES)
# The most classes a checkpoint's head may have (config.json's num_labels): extreme classifiers reach the millions.
MAX_LABELS = 1_000_000
_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
# The config's sizes a shape is made of (shape_from_config): each a positive integer where the config has it.
_SIZES = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size", "max_position_embeddings",
          "num_key_value_heads", "head_dim", *_FFN_NAMES)


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


@functools.cache
def positions_from_pad(family: str) -> bool:
    """Whether `family` numbers positions from pad_token_id + 1 (_POSITIONS_FROM_PAD), told by its modeling module,
    which holds the function or a class with it as a method."""
    import importlib

    import transformers

    try:
        config_module = transformers.CONFIG_MAPPING[family].__module__
        module = importlib.import_module(config_module.replace(".configuration_", ".modeling_"))
    except Exception:  # noqa: BLE001 - no such family or module, or one whose optional imports fail: no offset known
        return False
    return hasattr(module, _POSITIONS_FROM_PAD) or any(
        isinstance(v, type) and hasattr(v, _POSITIONS_FROM_PAD) for v in vars(module).values())


def position_offset(family: str, pad_token_id) -> int:
    """What a family's position numbering spends of max_position_embeddings before the first token."""
    return (pad_token_id or 0) + 1 if positions_from_pad(family) else 0


def built_pad_token_id(cfg) -> int:
    """The pad_token_id of the model `hf_config` builds from `cfg`: its own, else (a config that names none) its
    end-of-sequence id where that is in the vocabulary, else 0. A decoder's sequence classifier needs one, and a
    family that numbers positions from it (RoBERTa's) spends that many of max_position_embeddings: the longest
    --seq is counted with the id the model is built with, not the config's null."""
    pad = getattr(cfg, "pad_token_id", None)
    if pad is not None:
        return pad
    eos = getattr(cfg, "eos_token_id", None)
    eos = eos[0] if isinstance(eos, list) and eos else eos
    # An end-of-sequence id outside the vocabulary (a config whose defaults name another model's ids) would make
    # the embedding's padding_idx fail transformers' assertion, for a model transformers itself builds.
    return eos if isinstance(eos, int) and 0 <= eos < (getattr(cfg, "vocab_size", 0) or 0) else 0


def shape_from_config(name: str, cfg) -> Preset:
    """The benchmark's view of a transformers config (attribute_map makes GPT-2's n_embd read as hidden_size)."""
    hidden, heads = cfg.hidden_size, cfg.num_attention_heads
    positions = getattr(cfg, "max_position_embeddings", None)
    if not positions or positions < 0:  # none, or XLNet's -1: its config class says "no sequence length limit"
        positions = 1 << 20
    else:
        positions -= position_offset(cfg.model_type, built_pad_token_id(cfg))
    head_dim = getattr(cfg, "head_dim", None)
    kv = getattr(cfg, "num_key_value_heads", None)
    if cfg.model_type == "falcon" and getattr(cfg, "multi_query", False) and \
            not getattr(cfg, "new_decoder_architecture", False):
        # Falcon's first layout (falcon-7b) projects and caches one key and value head for all its query heads
        # (transformers' FalconAttention); its config names no num_key_value_heads, and the analytic KV cache and a
        # decode step's bandwidth counted 71 heads.
        kv = 1
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

    offset = position_offset(shape.family, shape.config.get("pad_token_id"))
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
    try:
        present = path.exists()
    except OSError as exc:  # a folder that cannot be searched: was a traceback
        _refuse(folder, f"config.json cannot be read ({exc.strerror or exc})", "check the permissions of the folder "
                "and its files")
    if not present:
        nowhere = boundary.link_nowhere(path)  # a link to a missing file, or a loop: said to be missing
        _refuse(folder, f"config.json {nowhere}" if nowhere else "has no config.json",
                "point --model at a transformers checkpoint folder")
    where = f"checkpoint {folder}: config.json"
    cfg = boundary.load_json_file(path, where, limit=boundary.CONFIG_BYTES, fix="fix or re-download it", finite=True)
    if not isinstance(cfg, dict) or "model_type" not in cfg:
        _refuse(folder, "config.json names no model_type", "re-download the checkpoint's config.json")
    if not isinstance(cfg["model_type"], str):  # `5` or null was said to be missing
        _refuse(folder, f"config.json's model_type is {json.dumps(cfg['model_type'])[:60]}, not a family name "
                "such as \"bert\"", "fix or re-download the checkpoint's config.json")
    return cfg


# The files transformers reads a tokenizer from beside tokenizer.json, each whole and unbounded: a FIFO named
# tokenizer_config.json held the load for ever, and a file of gigabytes was read into memory before any error.
TOKENIZER_SIDE_FILES = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.txt",
                        "vocab.json", "merges.txt", "spiece.model", "tokenizer.model", "sentencepiece.bpe.model")


def read_tokenizer_json(path: Path) -> str | None:
    """The model type a tokenizer.json declares (BPE, WordPiece, Unigram, ...), read through the input boundary
    before transformers or tokenizers sees the file (a file without its fields was a KeyError traceback there);
    None without the file. The tokenizer's other files beside it are checked first: regular files within
    boundary.TOKENIZER_BYTES each."""
    for name in TOKENIZER_SIDE_FILES:
        side = path.parent / name
        try:
            st = os.stat(side)
        except OSError:  # absent (or unreadable: transformers' own error says so, caught where it loads)
            continue
        if not stat.S_ISREG(st.st_mode):
            raise SpecError(f"{side} is not a regular file (a folder, a pipe or a device): replace it with the "
                            "checkpoint's own")
        if st.st_size > boundary.TOKENIZER_BYTES:
            raise SpecError(f"{side}: {st.st_size:,} bytes is above the {boundary.TOKENIZER_BYTES:,} bytes read for a "
                            "tokenizer file: replace it with the checkpoint's own")
    try:
        if not path.exists():
            return None
    except OSError:
        return None
    data = boundary.load_json_file(path, f"{path}", limit=boundary.TOKENIZER_BYTES, depth=16,
                                   fix="replace it with the checkpoint's own tokenizer.json")
    model = data.get("model") if isinstance(data, dict) else None
    kind = model.get("type") if isinstance(model, dict) else None
    if not isinstance(kind, str) or not isinstance(model.get("vocab"), (dict, list)):
        raise SpecError(f"{path} is not a tokenizer.json (no model type and vocabulary in it): replace it with the "
                        "checkpoint's own")
    return kind


# The dtypes a weight file may store a floating-point parameter in: values transformers converts to the model's
# floats as numbers (safetensors' names, and torch's for .bin files). An integer, bool or complex tensor, or a packed
# 4- or 6-bit float (F4, F6_*), is no such value: transformers loaded an int8 or bool tensor as those integers
# (quantized codes read as weights, without their scales), dropped a complex one's imaginary part with a warning on
# stderr, and failed each cell of an F4 one ("shape '[32, 32]' is invalid for input of size 512"), exit 0.
_FLOAT_STORED = {"F64", "F32", "F16", "BF16", "F8_E5M2", "F8_E4M3", "F8_E8M0"}


def _check_safetensors(folder: Path, file: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Each tensor's dtype and shape, as the header declares them, read through the input boundary (bounded header,
    offsets checked against the file's size)."""
    return boundary.safetensors_tensors(file, f"checkpoint {folder}: weight file {file.name} is not a readable "
                                              "safetensors file")


def _check_torch_zip(folder: Path, file: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    try:
        with zipfile.ZipFile(file) as z:  # the central directory, not every member's CRC: a cheap check
            ok = any(n.endswith("data.pkl") for n in z.namelist())
    except OSError as exc:  # a file this user may not read was said to be no torch zip archive
        _refuse(folder, f"weight file {file.name} cannot be read ({exc.strerror or exc})", "check its permissions")
    except zipfile.BadZipFile:
        ok = False
    if not ok:
        _refuse(folder, f"weight file {file.name} is not a readable torch zip archive",
                "re-download it or save the weights as model.safetensors")
    return _torch_shapes(folder, file)


def _torch_shapes(folder: Path, file: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Each tensor's dtype (its safetensors name where it is a float safetensors has, else torch's) and shape in a
    torch zip archive. weights_only: no code in the pickle ever runs (transformers
    loads .bin files the same way, so what it refuses here it would refuse later); mmap: the tensors' bytes
    are mapped, never read, so this costs the pickle's size whatever the checkpoint's."""
    import torch

    try:
        with warnings.catch_warnings():  # torch's deprecation notes on stderr (a quantized tensor's TypedStorage)
            warnings.simplefilter("ignore")
            state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # torch raises UnpicklingError, RuntimeError, ... for what it cannot read
        why = boundary.exception_line(exc)
        why = why.split("WeightsUnpickler error: ", 1)[-1].split(". ", 1)[0]
        _refuse(folder, f"weight file {file.name} cannot be read as plain tensors with torch.load(weights_only=True) "
                        f"({why})", "re-save the weights as model.safetensors (save_pretrained does)")
    if not isinstance(state, dict):
        _refuse(folder, f"weight file {file.name} holds a {type(state).__name__}, not a state dict of tensors",
                "re-save the weights with save_pretrained")
    tensors = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    odd = next(((k, v) for k, v in tensors.items() if v.is_meta or v.layout != torch.strided), None)
    if odd is not None:
        # A sparse tensor, or a meta one (a shape without data), passed the shape check, and every cell was an
        # `error` in the loader ("Cannot access storage of SparseTensorImpl", "Cannot copy out of meta tensor")
        kind = "a meta tensor, a shape without data" if odd[1].is_meta else f"a {odd[1].layout} tensor, not a dense one"
        _refuse(folder, f"weight file {file.name} holds {odd[0]} as {kind}",
                "re-save the weights with save_pretrained")
    return {k: (_stored_dtype(v.dtype), tuple(v.shape)) for k, v in tensors.items()}


def _stored_dtype(dtype) -> str:
    """A torch dtype by its safetensors name where it is one of _FLOAT_STORED (float16: F16), else torch's own."""
    return _safetensors_names().get(dtype) or str(dtype).removeprefix("torch.")


@functools.cache
def _safetensors_names() -> dict:
    import torch

    return {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
            getattr(torch, "float8_e5m2", None): "F8_E5M2", getattr(torch, "float8_e4m3fn", None): "F8_E4M3",
            getattr(torch, "float8_e8m0fnu", None): "F8_E8M0"}


def _not_a_file(path: Path) -> str:
    """Why a name that is there (os.path.lexists) is no file to read: a link to nothing or a loop, a folder, or
    another kind (a pipe, a device, a socket)."""
    return boundary.link_nowhere(path) or ("is a folder" if path.is_dir() else
                                           "is not a regular file (a pipe, a device or a socket)")


def _check_weights(folder: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The weight files are there and readable; returns every tensor's dtype and shape across them (shards
    included)."""
    found = [folder / n for n in _WEIGHTS if (folder / n).is_file()]
    if not found:
        # A weight file's name taken by a folder, a pipe, a device or a link to nothing was said not to be there.
        for p in (folder / n for n in _WEIGHTS if os.path.lexists(folder / n)):
            _refuse(folder, f"weight file {p.name} {_not_a_file(p)}", "give the weights as a plain file")
        _refuse(folder, f"has no weight file ({', '.join(_WEIGHTS)})", "add the weights or use a preset")
    first = found[0]
    files = [first]
    if first.name.endswith(".index.json"):
        index = boundary.load_json_file(first, f"checkpoint {folder}: {first.name}", limit=boundary.INDEX_BYTES,
                                        depth=8, fix="re-download it")
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not (isinstance(weight_map, dict) and weight_map and all(isinstance(v, str) and v
                                                                    for v in weight_map.values())):
            _refuse(folder, f"{first.name} is not a valid weight index (no weight_map of file names)", "re-download it")
        outside = next((v for v in weight_map.values()
                        if os.path.isabs(v) or ".." in Path(v).parts or v in (".", "") or "\\" in v), None)
        if outside is not None:  # a shard is a file in the folder (a subfolder too), never a path out of it
            _refuse(folder, f"{first.name} names a weight shard outside the folder ({outside[:80]!r})",
                    "re-download it")
        shards = sorted(set(weight_map.values()))
        # os.path.isfile, not Path.is_file: before Python 3.13 the latter raises for a name too long (ENAMETOOLONG),
        # and an index naming a shard of 5,000 characters was an OSError traceback, exit 1
        missing = [s for s in shards if not os.path.isfile(folder / s)]
        if missing:
            why = _not_a_file(folder / missing[0]) if os.path.lexists(folder / missing[0]) else "is missing"
            _refuse(folder, f"weight shard {boundary.one_line(missing[0], 200)} named by {first.name} {why}",
                    "re-download the checkpoint")
        files = [folder / s for s in shards]
    tensors: dict[str, tuple[str, tuple[int, ...]]] = {}
    for f in files:
        tensors.update((_check_safetensors if f.suffix == ".safetensors" else _check_torch_zip)(folder, f))
    return tensors


def _load_config(folder: Path):
    """transformers' own reading of config.json: whatever it raises (a strict field's wrong type, a value its
    config class rejects, ...) is the folder's fault, so one line, never a traceback."""
    from transformers import AutoConfig
    from transformers.utils import logging as hf_logging

    # Its warnings about the file (a pad_token_id outside a vocab_size of -5) would print before the one line that
    # refuses the folder; the checks after it say what is wrong. Python's warnings too: a key it has renamed since
    # (rope_scaling, in every Llama 3.2 checkpoint) printed a FutureWarning with its source line, twice, at every
    # run of the folder, about transformers' own API rather than anything the user could change.
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return AutoConfig.from_pretrained(str(folder), trust_remote_code=False, local_files_only=True)
    except Exception as exc:
        _refuse(folder, f"transformers cannot read its config.json ({boundary.exception_line(exc)})", "fix config.json")
    finally:
        hf_logging.set_verbosity(level)


def _check_generation_config(folder: Path) -> None:
    """generation_config.json, where the folder has one, read through the input boundary and then by transformers'
    GenerationConfig: from_pretrained of every class that can generate (a decoder's causal-lm and generate tasks,
    train's causal-lm) reads it in each cell, so a list or a max_new_tokens of "x" there made every such cell an
    `error` ("TypeError: 'list' object is not a mapping"), exit 0, and no limit bounded what it read."""
    path = folder / "generation_config.json"
    if not os.path.lexists(path):
        return
    where = f"checkpoint {folder}: generation_config.json"
    raw = boundary.load_json_file(path, where, limit=boundary.CONFIG_BYTES, fix="fix, re-download or remove it",
                                  finite=True)
    if not isinstance(raw, dict):
        _refuse(folder, f"generation_config.json holds a JSON {type(raw).__name__}, not an object",
                "fix, re-download or remove it")
    from transformers import GenerationConfig
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            GenerationConfig.from_dict(copy.deepcopy(raw))
    except Exception as exc:  # noqa: BLE001 - whatever it raises is the file's fault (TypeError, ValueError, ...)
        _refuse(folder, f"transformers cannot read its generation_config.json ({boundary.exception_line(exc)})",
                "fix, re-download or remove it")
    finally:
        hf_logging.set_verbosity(level)


def _bad_size(value) -> bool:
    if isinstance(value, list):  # per-layer sizes (Gemma 3n's intermediate_size)
        return not value or any(_bad_size(v) for v in value)
    return isinstance(value, bool) or not isinstance(value, int) or value < 1


def _huge_int(raw: dict) -> tuple[str, int] | None:
    """The first integer of config.json (nested objects and lists included, as `key.sub` / `key[i]`) beyond what
    torch's 64-bit integers hold, or None. No size, token id or count of a model is that large; torch's refusal of
    one was its C++ stack in the line ("Overflow when unpacking long long Exception raised from THPUtils_unpackLong
    ... frame #"), and a GPT-2 pad_token_id of 2^70 built, then failed every cell ("int too big to convert"), exit 0."""
    stack: list[tuple[str, object]] = [(k, v) for k, v in reversed(raw.items())]
    while stack:
        path, value = stack.pop()
        if isinstance(value, dict):
            stack.extend((f"{path}.{k}", v) for k, v in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", v) for i, v in reversed(list(enumerate(value))))
        elif isinstance(value, int) and not isinstance(value, bool) and not -boundary.INT_MAX - 1 <= value <= \
                boundary.INT_MAX:
            return path, value
    return None


def _check_sizes(folder: Path, cfg, raw: dict) -> None:
    """The sizes the benchmark's shape is made of are positive integers. transformers builds a model of
    0 layers, 0 positions or -2 heads without a word and fails (or runs an empty model) only in the forward."""
    huge = _huge_int(raw) if isinstance(raw, dict) else None
    if huge is not None:
        _refuse(folder, f"config.json sets {huge[0][:200]} to {boundary.one_line(repr(huge[1]), 60)}, beyond the "
                        f"64-bit integers torch holds (at most {boundary.INT_MAX:,})", "fix config.json")
    for name in _SIZES:
        value = getattr(cfg, name, None)
        if name == "max_position_embeddings" and value == -1 and name not in raw:
            # Not the file's: XLNetConfig's read-only property, transformers' "no sequence length limit" (every
            # XLNet checkpoint was refused with "config.json sets max_position_embeddings to -1; fix config.json").
            continue
        if value is not None and _bad_size(value):
            key = getattr(cfg, "attribute_map", {}).get(name, name)  # GPT-2's n_head is num_attention_heads
            _refuse(folder, f"config.json sets {key} to {value!r}, and it must be a positive integer",
                    "fix config.json")
    for key, value in _rope_values(cfg):
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not (math.isfinite(value) and value > 0):
            # rotary frequencies of base 0, or positions scaled by 0: transformers builds and runs it, and every
            # cell read `wrong` (rel_err inf)
            _refuse(folder, f"config.json sets {key} to {value!r}, and it must be a positive number", "fix config.json")
    for key, value in _norm_eps_values(cfg):
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not value >= 0:
            # a LayerNorm or RMSNorm dividing by sqrt(variance + eps) of a negative eps: transformers builds and runs
            # it, NaN wherever a token's variance is below -eps, and every cell read `wrong` (rel_err inf), eager too
            _refuse(folder, f"config.json sets {key} to {value!r}, and it must be a number of 0 or more",
                    "fix config.json")
    chunk = getattr(cfg, "chunk_size_feed_forward", 0)
    if isinstance(chunk, bool) or not isinstance(chunk, int):
        # transformers' feed-forward chunking compares it with 0 in every forward: null (or 2.5) built, and every cell
        # was an `error` ("'>' not supported between instances of 'NoneType' and 'int'"), exit 0
        _refuse(folder, f"config.json sets chunk_size_feed_forward to {chunk!r}, and it must be a whole number "
                        "(0: no chunking)", "fix config.json")
    if getattr(cfg, "vocab_size", None) == 1:
        # The cells' random tokens avoid the padding id (RoBERTa numbers positions by it): one id leaves none to
        # draw, and every cell was an `error` ("random_ expects 'from' to be less than 'to'").
        key = getattr(cfg, "attribute_map", {}).get("vocab_size", "vocab_size")
        _refuse(folder, f"config.json sets {key} to 1, which leaves the random tokens no id but the padding id",
                "use a vocabulary of 2 or more")


def _check_kv_heads(folder: Path, family: str, cfg, raw: dict) -> None:
    """Grouped-query attention gives each key/value head a whole group of query heads (transformers' repeat_kv, by
    num_key_value_groups = heads // kv heads). A Qwen2 config of 4 heads that kept its class's 32 key/value heads
    (a group of 0), or a Llama of 4 over 3, built, and the meta forward refused it in torch's words ("The size of
    tensor a (4) must match the size of tensor b (0) at non-singleton dimension 1")."""
    kv, heads = getattr(cfg, "num_key_value_heads", None), getattr(cfg, "num_attention_heads", None)
    if not (isinstance(kv, int) and isinstance(heads, int) and kv > 0 and heads > 0) or heads % kv == 0:
        return
    if not _modeling_reads(family, "num_key_value_groups"):  # a family that shares keys and values otherwise
        return
    key = getattr(cfg, "attribute_map", {}).get("num_key_value_heads", "num_key_value_heads")
    default = "" if key in raw else f" (config.json names none: {family}'s default)"
    _refuse(folder, f"config.json gives {family} {heads} attention heads over {kv} key/value heads{default}, and "
                    "each key/value head serves a whole group of query heads",
            f"give num_key_value_heads a divisor of {heads}")


@functools.cache
def _modeling_reads(family: str, field: str) -> bool:
    """Whether `family`'s transformers modeling module names the config field `field` (its source text does); True
    where the module cannot be read, so that nothing is refused on a guess."""
    import importlib
    import inspect

    import transformers

    try:
        config_module = transformers.CONFIG_MAPPING[family].__module__
        module = importlib.import_module(config_module.replace(".configuration_", ".modeling_"))
        return field in inspect.getsource(module)
    except Exception:  # noqa: BLE001 - no such module, optional imports failing, no source on disk: not known
        return True


def _check_positions_kind(folder: Path, family: str, cfg) -> None:
    """Relative positions (position_embedding_type relative_key or relative_key_query) a family's code no longer
    reads: transformers 5 dropped them from BERT, RoBERTa and their kin and builds the model with absolute positions
    without a word (a relative checkpoint's distance_embedding tensors are left unused), so every eager and sdpa
    cell ran `ok` on a model other than the checkpoint's."""
    from transformers import __version__

    kind = getattr(cfg, "position_embedding_type", None)
    if isinstance(kind, str) and kind != "absolute" and not _modeling_reads(family, "position_embedding_type"):
        _refuse(folder, f"config.json sets position_embedding_type to {kind!r}, which transformers {__version__}'s "
                        f"{family} does not implement (it would run absolute positions)",
                "use a checkpoint of absolute positions, or a transformers version that implements them")


def _norm_eps_values(cfg):
    """(name, value) of each normalisation epsilon config.json sets: families name it layer_norm_eps,
    layer_norm_epsilon, rms_norm_eps, norm_eps, norm_epsilon, ..."""
    for key, value in vars(cfg).items():
        if key.endswith(("_eps", "_epsilon")):
            yield key, value


def _rope_values(cfg):
    """(name, value) of the rotary base and scaling factors config.json sets: top-level rope_theta, and rope_parameters'
    or rope_scaling's rope_theta and factors, per layer type where a family nests them (Gemma 3)."""
    yield "rope_theta", getattr(cfg, "rope_theta", None)
    for field in ("rope_parameters", "rope_scaling"):
        params = getattr(cfg, field, None)
        tables = [params] if isinstance(params, dict) else []
        tables += [v for v in (params or {}).values() if isinstance(v, dict)] if isinstance(params, dict) else []
        for table in tables:
            for key in ("rope_theta", "factor"):
                if key in table:
                    yield f"{field}.{key}", table[key]


def _size(raw: dict, default, name: str):
    """config.json's value of the size `name` under the key its family stores it by (GPT-2's n_head), else None."""
    value = raw.get(getattr(default, "attribute_map", {}).get(name, name), raw.get(name))
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _rotary_head(family: str, raw: dict) -> tuple[int, str] | None:
    """(head size, where config.json gives it) of a family whose attention turns each whole head by rotary positions
    (Llama, Qwen2, Mistral, Phi-3, ModernBERT, ...), or None: no rotary embedding, a rotated part smaller than the head
    (partial_rotary_factor, where the family reads it), or sizes config.json does not give as positive integers (the
    checks after transformers reads it say so)."""
    from transformers import CONFIG_MAPPING

    try:
        default = CONFIG_MAPPING[family]()
    except Exception:  # noqa: BLE001 - a config class that cannot be built from its defaults: not known to rotate
        return None
    params = getattr(default, "rope_parameters", None)
    if not params and getattr(default, "rope_theta", None) is None:
        return None
    head = raw.get("head_dim")
    if isinstance(head, int) and not isinstance(head, bool) and head > 0:
        where = f"head_dim {head}"
    else:
        hidden, heads = _size(raw, default, "hidden_size"), _size(raw, default, "num_attention_heads")
        own = getattr(default, "head_dim", None)
        derived = own is None or own == default.hidden_size // default.num_attention_heads
        if not (hidden and heads and derived):  # Gemma's head_dim is its own setting (256), not hidden / heads
            return None
        head, where = hidden // heads, f"hidden_size {hidden} / num_attention_heads {heads}"
    if _modeling_reads(family, "partial_rotary_factor"):
        tables = [raw, *(t for t in (raw.get("rope_parameters"), raw.get("rope_scaling")) if isinstance(t, dict))]
        given = [t["partial_rotary_factor"] for t in tables if "partial_rotary_factor" in t]
        factor = given[0] if given else (params or {}).get("partial_rotary_factor",
                                                             getattr(default, "partial_rotary_factor", 1.0))
        if not isinstance(factor, (int, float)) or isinstance(factor, bool) or int(head * factor) != head:
            return None
    return head, where


def _check_rotary_head(folder: Path, family: str, raw: dict) -> None:
    """A rotary embedding turns a head's dimensions in pairs, so a head it rotates whole must have an even size. An odd
    one was refused by transformers 5.24's config check ("RoPE requires an even rotary dimension"), passed 5.17's
    (and 5.24's for a head of 4 or fewer, or where the family's config has no head_dim: Qwen2) and failed in torch
    ("Attempting to broadcast a dimension of length 26"): one line here, the same on every version."""
    found = _rotary_head(family, raw)
    if found is not None and found[0] % 2:
        _refuse(folder, f"config.json gives {family} attention heads of {found[0]} dimensions ({found[1]}), and its "
                        "rotary position embedding turns a head's dimensions in pairs, so it cannot run an odd "
                        "head size", "use an even head size")


def _encoder_decoder_family(family: str) -> bool:
    """Whether transformers' default config of `family` is an encoder-decoder's (T5, BART, ...)."""
    from transformers import CONFIG_MAPPING

    try:
        return bool(getattr(CONFIG_MAPPING[family](), "is_encoder_decoder", False))
    except Exception:  # noqa: BLE001 - a config class that cannot be built from its defaults: not known to be one
        return False


def _check_text_transformer(folder: Path, family: str, cfg) -> None:
    """The model takes token ids and has attention heads: what every task here feeds and counts. A vision or audio
    model, a multimodal one, or one without attention was refused with a line that blamed config.json ("transformers
    cannot read its config.json ('ViTConfig' object has no attribute 'vocab_size'); fix config.json"), and one whose
    config has every size a text model has (wav2vec2) passed, then every cell was an `error` (no `input_values`)."""
    import inspect

    import transformers

    fix = "transbench benchmarks text encoders and decoders: use such a checkpoint"
    name = _auto("MODEL_MAPPING_NAMES").get(family)
    cls = getattr(transformers, name, None) if isinstance(name, str) else None
    params = list(inspect.signature(cls.forward).parameters)[1:] if cls is not None else []
    if params and "input_ids" not in params:
        _refuse(folder, f"{family} is not a text model: {name} takes {params[0]}, not token ids", fix)
    nested = [k for k in getattr(cfg, "sub_configs", None) or {} if getattr(cfg, k, None) is not None]
    if nested and getattr(cfg, "hidden_size", None) is None:
        # Gemma 3 (4B and up), LLaVA, CLIP, ...: a text model and a vision model under one config.json.
        _refuse(folder, f"{family} is a multimodal model: its config.json nests {', '.join(nested)}",
                "use a text-only checkpoint (transbench benchmarks text encoders and decoders)")
    if getattr(cfg, "num_attention_heads", None) is None:  # Mamba, Mamba-2, RWKV, FalconMamba: no attention
        _refuse(folder, f"{family} has no attention heads (its config names no num_attention_heads)",
                "transbench benchmarks transformer encoders and decoders: use such a checkpoint")


def _meta_model(folder: Path, ref: ModelRef):
    """The model config.json describes, built by transformers on the meta device (no memory, no weights read):
    transformers checks the config as it builds (hidden size a multiple of the heads, ...)."""
    tasks = family_tasks(ref.family)
    if not tasks:  # no class this benchmark runs: missing_head says so per task, as for any family
        return None
    try:
        return build_model(ref, tasks[0], device="meta")
    except Exception as exc:
        unknown = _unknown_rope_type(exc)
        if unknown:
            _refuse(folder, unknown, "use one transformers knows, or \"default\"")
        _refuse(folder, f"transformers cannot build the model its config.json describes ({boundary.exception_line(exc)})",
                "fix config.json")


def _unknown_rope_type(exc: Exception) -> str | None:
    """What a build that failed on a rope_type transformers has no rotary function for is told, or None. Its rotary
    code looks the type up in ROPE_INIT_FUNCTIONS, and the KeyError said only "('foo')"."""
    try:
        from transformers import __version__
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    except ImportError:  # a transformers without the table: its own words
        return None
    name = exc.args[0] if isinstance(exc, KeyError) and len(exc.args) == 1 else None
    if not isinstance(name, str) or name in ROPE_INIT_FUNCTIONS:
        return None
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    where = type(tb.tb_frame.f_locals.get("self")).__name__ if tb is not None else ""
    if not any(word in where.lower() for word in ("rotary", "rope")):  # a KeyError of other code: not a rotary type
        return None
    known = ", ".join(["default", *ROPE_INIT_FUNCTIONS])
    return (f"config.json names the rotary embedding type {name!r}, which transformers {__version__} does not know "
            f"({known})")


# torch's messages for operands whose shapes do not fit: on the meta device they depend on the shapes alone, so a
# forward that raises one there raises it for every input (any other failure there is left to the cells: code that
# reads values cannot run on the meta device at all).
_SHAPE_ERRORS = re.compile(r"must match the size of tensor|Attempting to broadcast a dimension|shapes cannot be "
                           r"multiplied|mat1 and mat2 shapes|is invalid for input of size")


# The length of the meta-device forward that tells whether a model transformers built can run at all.
CHECK_TOKENS = 8


def _check_runs(folder: Path, ref: ModelRef, cfg, model) -> None:
    """The model transformers built can run a forward. transformers builds some it cannot run: a BERT of
    type_vocab_size 0 (a token-type embedding of no rows that every forward looks up: "index_select(): self
    indexing axis dim should be positive"), a Phi-3 whose head size is odd (its rotary code pairs the head's
    dimensions: "The size of tensor a (25) must match the size of tensor b (26)"); every cell was an `error`."""
    import torch

    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Embedding) and module.num_embeddings == 0:
            # Families that allow no token types build no such embedding (DeBERTa, GTE); the others look it up.
            if getattr(cfg, "type_vocab_size", None) == 0 and "token_type" in name:
                _refuse(folder, f"config.json sets type_vocab_size to 0, but every {ref.family} forward looks up token "
                                f"type 0 ({name})", "set it to 1 (as RoBERTa's checkpoints do) or more")
            _refuse(folder, f"config.json makes {name} an embedding of 0 rows, which every {ref.family} forward looks "
                            "up", "fix config.json")
    # Eight tokens, not two: a Mistral of sliding_window w of 0 or below builds a mask short of the sequence
    # (1 - w keys short), which two tokens fit and three do not: every cell of any longer --seq was an `error`.
    ids = torch.ones(1, min(CHECK_TOKENS, ref.shape.max_positions), dtype=torch.long, device="meta")
    for kwargs in ({}, {"attention_mask": torch.ones_like(ids)}):  # DeBERTa reads the ids without a mask
        try:
            with torch.no_grad():
                model(input_ids=ids, **kwargs)
            return
        except Exception as exc:  # noqa: BLE001 - only a shape error is the config's: the rest is left to the cells
            if _SHAPE_ERRORS.search(str(exc)):
                _refuse(folder, f"transformers builds the model its config.json describes but cannot run it "
                                f"({boundary.exception_line(exc)})", "fix config.json")
            if "meta" not in str(exc):
                return


def _backbone_names(model, family: str) -> list[str]:
    """What this family's checkpoints call the bare model: each task class's base_model_prefix, the loaded
    model's first (LlamaForCausalLM holds its LlamaModel as `model.`, LlamaForQuestionAnswering as `transformer.`)."""
    import transformers

    names = [model.base_model_prefix, *(getattr(transformers, task_class(family, t)).base_model_prefix
                                        for t in family_tasks(family))]
    return [n for n in dict.fromkeys(names) if n]


def _key_renamer(model, expected: dict, prefixes: list[str]):
    """Checkpoint tensor name -> (the model's name for it, whether transformers reshapes it on load), as
    transformers' loader maps them: a base-model prefix added or dropped (a BertForMaskedLM checkpoint's
    `bert.` tensors fit a BertModel and back), legacy names (LayerNorm gamma/beta) and families whose files
    are converted (fused MoE experts) renamed. Without transformers 5's loader: the prefixes alone."""
    def plain(key: str) -> tuple[str, bool]:
        names = [key] + [key.removeprefix(f"{p}.") for p in prefixes] + [f"{p}.{key}" for p in prefixes]
        return next((n for n in names if n in expected), key), False

    # The loader's helpers are not public API: where they are missing or changed, the prefixes alone.
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

        mapping = get_model_conversion_mapping(model)
    except Exception:  # noqa: BLE001
        return plain
    renamings = [m for m in mapping if isinstance(m, WeightRenaming)]
    converters = [m for m in mapping if isinstance(m, WeightConverter)]

    def rename(key: str) -> tuple[str, bool]:
        try:
            for prefix in prefixes or [None]:
                name, converted = rename_source_key(key, renamings, converters, prefix, expected)
                if name in expected:
                    return name, converted is not None
        except (TypeError, ValueError, AttributeError):
            return plain(key)
        return key, False  # the name as it is (the loader's own fallback), in the model or not
    return rename


def _check_shapes(folder: Path, model, family: str, shapes: dict[str, tuple[int, ...]], dtypes: dict[str, str]):
    """Each tensor of the weight files that `model` has is of the shape config.json makes it, and a floating-point
    one is stored as floats (_FLOAT_STORED); (the model's tensor shapes, the renamer of file names to the model's,
    the files' tensors found by the model's name)."""
    state = model.state_dict()
    expected = {k: tuple(v.shape) for k, v in state.items()}
    rename = _key_renamer(model, expected, _backbone_names(model, family))
    found = {}
    for key, shape in shapes.items():
        name, converted = rename(key)
        if name in expected:
            found.setdefault(name, (key, None if converted else shape))  # converted: its file shape is not its own
    for name, want in expected.items():  # the model's order: the first differing tensor is the earliest one
        key, have = found.get(name, (None, None))
        if have is not None and have != want:
            _refuse(folder, f"config.json does not fit its weights: tensor {key} is {list(have)} in the weight "
                            f"files, but config.json makes it {list(want)}",
                    "use the config.json saved with these weights")
        if key is not None and state[name].is_floating_point() and dtypes.get(key, "F32") not in _FLOAT_STORED:
            # An integer buffer (position ids) may be stored in any dtype: torch converts whole numbers exactly.
            _refuse(folder, f"tensor {key} is stored as {dtypes[key]} in the weight files, where the model holds "
                            "floating-point values (F32, F16, BF16, F64 or F8)", "re-save the weights in a float "
                    "dtype (save_pretrained does), or give a quantized checkpoint its quantization_config")
    return expected, rename, found


def _own_head(ref: ModelRef, raw: dict):
    """The model of the task class config.json's `architectures` names (a BertForSequenceClassification's), on the
    meta device, where it is another task's than the bare model's; else None. Its head's tensors are checked against
    the files too: a config.json whose num_labels differs from its classifier's rows (3 against 7) built the bare
    model, which has no head, and transformers refused the head in every classification cell ("You set
    `ignore_mismatched_sizes` to `False`"), each an `error`."""
    names = raw.get("architectures")
    own = names[0] if isinstance(names, list) and names else None
    task = next((t for t in family_tasks(ref.family) if task_class(ref.family, t) == own), None)
    if task is None or task == family_tasks(ref.family)[0]:  # the bare model's tensors are checked already
        return None
    try:
        return build_model(ref, task, device="meta")
    except Exception:  # noqa: BLE001 - a head transformers cannot build is the cells' to report, as before
        return None


def _check_against_weights(folder: Path, model, family: str, shapes: dict[str, tuple[int, ...]],
                           dtypes: dict[str, str]) -> None:
    """The weight files fit the model config.json describes. transformers would refuse a shape that differs
    only when loading, in a cell (`ignore_mismatched_sizes`), and would load a folder whose tensors all have
    other names (a BERT config.json next to GPT-2 weights) with every weight random and a warning nobody
    sees. Tensors the model lacks (a task head it does not run) or the files lack (a head the task adds)
    are normal."""
    expected, rename, found = _check_shapes(folder, model, family, shapes, dtypes)
    # More copies of a repeated module (layers, blocks) in the files than config.json builds: transformers leaves
    # them unused with a note nobody sees, and a config.json of 1 layer over 2 layers' weights measured half the
    # model its files hold. A head the model lacks is no repeated module of it, so it passes.
    built = {_LAYER_INDEX.sub(_any_index, name) for name in expected}
    prefixes = _backbone_names(model, family)

    def unbuilt_layer(key: str) -> bool:  # the key under its own name or without its backbone's (`bert.`)
        name = rename(key)[0]
        names = [name, *(name.removeprefix(f"{p}.") for p in prefixes if name.startswith(f"{p}."))]
        return (name not in expected and any(n not in expected and _LAYER_INDEX.search(n)
                                             and _LAYER_INDEX.sub(_any_index, n) in built for n in names))
    extra = [key for key in shapes if unbuilt_layer(key)]
    if extra:
        _refuse(folder, f"its weights hold layers config.json does not build ({extra[0]}, {len(extra)} tensors): its "
                        "layer count is lower than the weights'", "use the config.json saved with these weights")
    if not found:
        _refuse(folder, f"its weights hold none of the tensors of the {type(model).__name__} that config.json "
                        f"describes (its first is {next(iter(expected), 'none')}, "
                        f"the files' {next(iter(shapes), 'none')})", "use the config.json saved with these weights")
    # Some of the bare model's parameters and not others: a checkpoint cut short or hand-pruned. transformers fills
    # what is missing with random values and a note nobody sees, and a folder missing one layer's query ran `ok`,
    # measured as the checkpoint. Buffers may be missing (position ids that older files did not save); so may the
    # input embeddings of a tied model whose files keep them only as its LM head.
    tied = getattr(model.config, "tie_word_embeddings", False) and any(k.endswith("lm_head.weight") for k in shapes)
    skip = {id(model.get_input_embeddings().weight)} if tied and model.get_input_embeddings() is not None else set()
    lacking = [name for name, param in model.named_parameters() if name not in found and id(param) not in skip]
    if lacking:
        _refuse(folder, f"its weights lack {len(lacking)} of the {type(model).__name__}'s parameters that config.json "
                        f"describes ({', '.join(lacking[:3])}{', ...' if len(lacking) > 3 else ''}), which would run "
                        "random", "restore the missing weights (re-download the checkpoint), or use the config.json "
                        "saved with these weights")


# Where a family numbers its layers in tensor names: BERT's `encoder.layer.3.`, GPT-2's `h.3.`, Llama's
# `layers.3.`, MPT's `blocks.3.`. ALBERT's shared layers (`albert_layers.0`) match none, and are left alone.
_LAYER_INDEX = re.compile(r"(?:^|\.)(?:layer|layers|h|block|blocks)\.(\d+)\.")


def _any_index(m: re.Match) -> str:
    """A layer's index in a tensor name replaced by `#`: `encoder.layer.3.` and `encoder.layer.0.` alike."""
    return m.group(0)[:m.start(1) - m.start(0)] + "#."


# Building is bounded before it starts: transformers builds one module per layer, so a config.json of 200,000
# layers took minutes on the meta device before any check could read a shape. The deepest public text models
# have under 200 layers.
MAX_LAYERS = 4096


def _check_sizes_fit_weights(folder: Path, cfg, shapes: dict[str, tuple[int, ...]]) -> None:
    """config.json's layer count against the weight files, from the headers alone and before transformers builds
    anything: the build's cost grows with the layers (one module each), not with the widths (the meta device
    allocates nothing). The widths (hidden, FFN, vocabulary, heads) are checked tensor by tensor once the model is
    built on the meta device (_check_against_weights), which names the first tensor that differs."""
    fix = "use the config.json saved with these weights"
    layers = getattr(cfg, "num_hidden_layers", None)
    if isinstance(layers, int) and layers > MAX_LAYERS:
        _refuse(folder, f"config.json sets {layers:,} layers, above the {MAX_LAYERS:,} transbench builds", fix)
    found = {int(m.group(1)) for k in shapes for m in [_LAYER_INDEX.search(k)] if m}
    if found and isinstance(layers, int) and layers > max(found) + 1:
        key = getattr(cfg, "attribute_map", {}).get("num_hidden_layers", "num_hidden_layers")
        _refuse(folder, f"config.json sets {key} to {layers:,}, but the weight files hold {max(found) + 1} layers", fix)


def _resolve_folder(folder: Path) -> ModelRef:
    raw = _read_config(folder)
    if raw.get("auto_map"):
        _refuse(folder, "declares custom model code (auto_map); transbench never runs code shipped with a checkpoint",
                "use a checkpoint of a family transformers ships")
    from transformers import __version__
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    family = raw["model_type"]
    if family not in CONFIG_MAPPING_NAMES:
        _refuse(folder, f"model_type '{family}' is unknown to transformers {__version__}",
                "upgrade transformers or use a checkpoint of a family it ships (transbench models)")
    labels = raw.get("num_labels")
    if isinstance(labels, int) and labels > MAX_LABELS:
        # transformers makes an id2label entry per label as it reads the config: 1e9 took every byte of memory
        # before any check (the process was killed, nothing printed).
        _refuse(folder, f"config.json sets num_labels to {labels:,}, above the {MAX_LABELS:,} a classifier here "
                "may have", "fix config.json")
    tensors = _check_weights(folder)
    shapes = {name: shape for name, (_, shape) in tensors.items()}
    dtypes = {name: dtype for name, (dtype, _) in tensors.items()}
    _check_rotary_head(folder, family, raw)  # before transformers reads it: some versions refuse it there, some not
    cfg = _load_config(folder)
    if is_decoder(family):  # the classes that can generate are decoders': an encoder's folder never reads it
        _check_generation_config(folder)
    quantized = _check_quantizer(folder, cfg)
    if getattr(cfg, "is_encoder_decoder", False) or _encoder_decoder_family(family):
        # Its forward needs decoder inputs that no task here defines (T5 fails without them, BART's classifier
        # wants an end-of-sequence token in every row): refused, not benchmarked half-way. A T5EncoderModel's
        # folder says is_encoder_decoder false, and was built as a T5Model whose decoder's weights it lacks ("restore
        # the missing weights": the checkpoint was whole).
        named = ", ".join(map(str, raw.get("architectures") or [])) or "no architecture named"
        alone = "" if getattr(cfg, "is_encoder_decoder", False) else f" (this folder holds a part of one: {named})"
        _refuse(folder, f"{family} is an encoder-decoder family{alone}", "transbench benchmarks encoders and decoders")
    _check_text_transformer(folder, family, cfg)
    _check_sizes(folder, cfg, raw)
    _check_kv_heads(folder, family, cfg, raw)
    _check_positions_kind(folder, family, cfg)
    try:
        ref = ModelRef(str(folder), shape_from_config(str(folder), cfg), str(folder))
    except (ValueError, TypeError, AttributeError, KeyError) as exc:
        _refuse(folder, f"transformers cannot read its config.json ({str(exc).splitlines()[0]})", "fix config.json")
    if ref.shape.max_positions < 1:
        # A family numbering positions from pad_token_id + 1 whose pad id is its last position: no token has a
        # position, and `run --seq 8` advised "--seq and --new-tokens that add up to 1 or less".
        pad = built_pad_token_id(cfg)
        _refuse(folder, f"config.json leaves no position for a token: {family} numbers positions from pad_token_id + 1 "
                        f"({pad} + 1), and max_position_embeddings is {cfg.max_position_embeddings}",
                "use the checkpoint's own pad_token_id and max_position_embeddings")
    if not quantized:  # packed tensors: their shapes differ by design
        _check_sizes_fit_weights(folder, cfg, shapes)
    model = _meta_model(folder, ref)
    if model is not None:
        _check_runs(folder, ref, cfg, model)
    # A quantized checkpoint's files hold packed tensors whose shapes differ from the model's by design.
    if model is not None and not quantized:
        _check_against_weights(folder, model, family, shapes, dtypes)
        head = _own_head(ref, raw)
        if head is not None:
            _check_shapes(folder, head, family, shapes, dtypes)
    return ref


def _check_quantizer(folder: Path, cfg) -> bool:
    """Whether transformers loads the weights through a quantizer: config.json's quantization_config names a method
    it knows. Only then do the files hold packed tensors whose shapes and dtypes differ from the model's by design; a
    method it does not know it skips ("Hence, we will skip the quantization") and loads the files as plain weights,
    which are then checked as any (a "homemade" method over int8 codes, or over a config.json of 4 layers and weights
    of 2, ran `ok` unchecked: codes read as weights, two layers random). A quantization_config without a quant_method
    failed every cell in transformers' own words, and so did one quantized by a library this environment lacks
    (bitsandbytes without accelerate, GPTQ without its kernels): both are refused here, in those words."""
    if getattr(cfg, "quantization_config", None) is None:  # transformers' own test: {} is a config without a method
        return False
    qc = cfg.quantization_config
    from transformers.quantizers import AutoHfQuantizer
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its warning about an unknown method, above the line or the table
    try:
        if not AutoHfQuantizer.supports_quant_method(qc):  # transformers loads it as plain weights
            return False
    except Exception as exc:  # noqa: BLE001 - no quant_method (a ValueError), a value of another type
        _refuse(folder, f"transformers cannot read config.json's quantization_config ({boundary.exception_line(exc)})",
                "fix it, or remove it from a checkpoint that is not quantized")
    finally:
        hf_logging.set_verbosity(level)
    try:
        quantizer = AutoHfQuantizer.from_config(qc, pre_quantized=True)
        quantizer.validate_environment(device_map=None, weights_only=True)
    except ImportError as exc:
        method = qc.get("quant_method") if isinstance(qc, dict) else getattr(qc, "quant_method", None)
        _refuse(folder, f"its weights are quantized ({getattr(method, 'value', method)}, config.json's "
                        f"quantization_config), which transformers cannot load here: {boundary.exception_line(exc)}",
                "install what it names, or give an unquantized checkpoint")
    except Exception:  # noqa: BLE001 - a device the quantizer wants (a GPU) or a setting it refuses: the cell says so
        pass
    return True


# Folders this process resolved, by what their checks read: a worker resolves its model for every cell, and
# building the meta model each time would cost a tenth of a second per call for a 1B model.
_RESOLVED: dict[tuple, ModelRef] = {}


def _fingerprint(model: str, folder: Path) -> tuple | None:
    """The folder's config and weight files by name, size and modification time (stat only), or None."""
    try:
        files = sorted((p.name, st.st_size, st.st_mtime_ns) for p in folder.iterdir()
                       if p.suffix in (".json", ".safetensors", ".bin") for st in (p.stat(),))
    except OSError:  # a file gone between the listing and its stat: check it afresh, the checks will say why
        return None
    return model, tuple(files)


def resolve(model: str) -> ModelRef:
    if model in PRESETS:
        return ModelRef(model, PRESETS[model])
    if not model.strip():  # Path("") is the current folder: `--model ''` benchmarked whatever checkpoint was there
        raise SpecError(f"a model name is empty: use a preset ({', '.join(PRESETS)}) or a local checkpoint "
                        "folder (./ for the current one)")
    if not boundary.is_utf8(model):
        # A folder named in bytes that are not UTF-8 resolved, and every cell of it was stored as an `error`
        # (UnicodeEncodeError: safetensors and the tokenizers open UTF-8 paths only), exit 0.
        raise SpecError(f"model {model!r} is not UTF-8 text (bytes the terminal could not decode): transformers "
                        "and safetensors open UTF-8 paths only; rename the folder (or link to it) with a UTF-8 name")
    path = boundary.user_path(model, f"model {model}")
    # os.path.isdir, not Path.is_dir: before Python 3.13 the latter raises for a name too long (ENAMETOOLONG) or a
    # folder that cannot be searched (EACCES), and `--model` of a 10,000-character name was a traceback
    if os.path.isdir(path):
        key = _fingerprint(model, path)
        if key is None:
            return _resolve_folder(path)
        if key not in _RESOLVED:
            _RESOLVED[key] = _resolve_folder(path)
        return _RESOLVED[key]
    nowhere = boundary.link_nowhere(path)
    if nowhere:  # a link to nothing, or a loop of links, was called "not a folder" with a folder to try instead
        raise SpecError(f"model '{model}' {nowhere}: give the checkpoint folder that holds config.json and the weights")
    if os.path.lexists(path):
        # A file of a checkpoint (its config.json, its weights) was called an unknown model, and the line listed every
        # preset, as if the path had not been found.
        raise SpecError(f"model '{model}' is not a folder: give the checkpoint folder that holds config.json and the "
                        f"weights ({os.path.dirname(os.path.abspath(path))} if this file is one of them)")
    raise SpecError(
        f"unknown model '{model}': use a preset ({', '.join(PRESETS)}) or a local checkpoint folder"
    )


# Task classes whose forward needs more than the random tokens every cell draws: LongformerForQuestionAnswering
# gives global attention to the question, which it finds by separator tokens, and asserts when a row has not three
# (every `--task qa` cell of a Longformer was an `error`).
_NEEDS_MORE_INPUT = {"LongformerForQuestionAnswering": "needs a question and a context split by its separator "
                                                       "tokens (global attention), which random tokens are not"}


def missing_head(ref: ModelRef, task: str) -> str | None:
    """Why `ref` cannot run `task` (the family has no such head, or one whose inputs the cells do not make), or None."""
    if task not in TASKS:
        raise SpecError(f"unknown task '{task}': choose from {', '.join(TASKS)}")
    name = task_class(ref.family, task)
    if name in _NEEDS_MORE_INPUT:
        return f"task '{task}' of {ref.name}: {name} {_NEEDS_MORE_INPUT[name]}"
    if name:
        return None
    kind = "a decoder (causal LM) family" if task in ("causal-lm", "generate") else "a family with that head"
    return f"task '{task}' needs {kind}; {ref.name} is {ref.family}, which runs {', '.join(family_tasks(ref.family))}"


def too_long(ref: ModelRef, seq: int, new_tokens: int = 0) -> str | None:
    """Why a cell of `seq` prompt positions, generating `new_tokens` after them (0: no generation), does not fit
    `ref`'s positions, or None. Generation feeds each new token but the last, read from the logits (Cell.positions).
    One wording for the grid's refusal and for the cell a grid records `unsupported` while its other cells run."""
    extra = max(new_tokens - 1, 0)
    top = ref.shape.max_positions
    if seq + extra <= top:
        return None
    what = (f"seq {seq} + {new_tokens} new tokens needs {seq + extra} positions, more" if extra
            else f"seq {seq} is longer")
    return f"{what} than {ref.name} allows ({top} position{'' if top == 1 else 's'})"


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


def dropout_fields(cfg) -> list[str]:
    """The config fields that hold a dropout probability (families name them differently: BERT's
    hidden_dropout_prob and attention_probs_dropout_prob, GPT-2's resid_pdrop, embd_pdrop and attn_pdrop, others'
    dropout, attention_dropout, classifier_dropout): every number-valued field whose name says dropout."""
    return sorted(k for k, v in vars(cfg).items()
                  if ("dropout" in k or k.endswith("pdrop")) and isinstance(v, (int, float)) and not isinstance(v, bool))


def hf_config(ref: ModelRef, task: str, activation: str | None = None, dropout: float | None = None):
    import transformers

    if ref.path:
        cfg = _load_config(Path(ref.path))  # read and checked by resolve() through the same function
    else:
        cfg = preset_config(ref.shape)
    cfg.pad_token_id = built_pad_token_id(cfg)  # sequence classification of decoders needs one
    # A cell measures its task's output. A config.json that asks for every layer's hidden states or attention maps
    # made eager return them, SDPA fall back to eager attention for the maps, and every fused cell an error.
    cfg.output_hidden_states = cfg.output_attentions = False
    # Outputs as ModelOutputs, as every cell reads them (out.logits): a config.json of return_dict false made Llama's
    # own causal LM head fail on its backbone's tuple ("'tuple' object has no attribute 'last_hidden_state'"), every
    # eager and sdpa cell an `error`. torchscript (an export setting) implies tuples too.
    cfg.return_dict, cfg.torchscript = True, False
    # A chunked FFN (chunk_size_feed_forward) is a memory knob, the same function over slices of the sequence, which
    # transformers runs only where every call's length is a multiple of the chunk: at seq 8 and chunk 3 (or any decode
    # step, or a padded batch's width) every cell of every command was an `error`. The FFN runs whole instead: the
    # same outputs and FLOPs, a memory peak of the whole FFN's activation (docs/models.md says so where loading is).
    if getattr(cfg, "chunk_size_feed_forward", 0):
        cfg.chunk_size_feed_forward = 0
    if not (ref.path and (getattr(cfg, "num_labels", 0) or 0) >= 1):
        # A checkpoint's own classifier keeps its classes (a 3-label head would not load into 2), one included: a
        # regression head (num_labels 1) was refused by the loader ("ignore_mismatched_sizes"), every cell an
        # `error`. `num_labels` and `train_labels` follow the same rule.
        cfg.num_labels = NUM_LABELS
    if task == "qa":
        # A question-answering head is a start and an end logit per token: BertForQuestionAnswering splits its
        # num_labels outputs in two ("too many values to unpack" for a 3-class checkpoint's config).
        cfg.num_labels = 2
    if activation is not None:
        name = activation_field(cfg)
        if name is None:
            raise Unsupported(f"--activation: {ref.family} names no activation transbench can set")
        setattr(cfg, name, ACTIVATIONS[activation])
    if dropout is not None:
        names = dropout_fields(cfg)
        if not names:
            raise Unsupported(f"--dropout: {ref.family} names no dropout transbench can set")
        for name in names:
            setattr(cfg, name, dropout)
    return cfg


def num_labels(shape: Preset) -> int:
    """Classes of the classification heads `hf_config` builds for `shape`: a checkpoint folder's own (its config's
    id2label, which transformers' num_labels counts), else NUM_LABELS. The FLOPs of a head count them: a
    1000-class checkpoint's token classifier is as wide as an LM head over 1000 ids."""
    labels = shape.config.get("id2label")
    return len(labels) if isinstance(labels, dict) and labels else NUM_LABELS


def train_labels(shape: Preset, batch: int, generator):
    """Random labels of `batch` sequences that fit the classification head's loss, as transformers picks it
    (ForSequenceClassificationLoss): floats for a regression head (num_labels 1, or problem_type "regression") and
    a multi-label one (one 0/1 target per class), else class ids below NUM_LABELS (every head has that many
    classes or more, as long as it is not a regression head). Class ids into a 1-label head failed in MSELoss."""
    import torch

    classes, problem = num_labels(shape), shape.config.get("problem_type")
    if problem == "regression" or (problem is None and classes == 1):
        return torch.rand((batch,) if classes == 1 else (batch, classes), generator=generator)
    if problem == "multi_label_classification":
        return torch.randint(0, 2, (batch, classes), generator=generator).float()
    return torch.randint(0, min(NUM_LABELS, classes), (batch,), generator=generator)


def activation_field(cfg) -> str | None:
    """The name of the config field that holds the FFN's activation (families name it differently)."""
    return next((n for n in _ACT_NAMES if getattr(cfg, n, None) is not None), None)


def _backbone_mapping(model, family: str, info: dict) -> dict[str, str] | None:
    """The key_mapping that loads a checkpoint's backbone into a task class that names it otherwise, or None.
    LlamaForQuestionAnswering (Qwen2's, Qwen3's, Mistral's, ...) holds its LlamaModel as `transformer.`, the
    family's checkpoints as `model.`: transformers loads none of those tensors, with a warning nobody sees, and
    `--task qa` on a checkpoint ran a random backbone."""
    prefix = model.base_model_prefix
    if not prefix or not any(k.startswith(f"{prefix}.") for k in info.get("missing_keys", ())):
        return None
    unexpected = info.get("unexpected_keys", ())
    for name in _backbone_names(model, family):
        if name != prefix and any(k.startswith(f"{name}.") for k in unexpected):
            return {rf"^{re.escape(name)}\.": f"{prefix}."}
    return None


def takes(model, name: str) -> bool:
    """Whether the model's forward has a parameter of this name (transformers renames them across versions)."""
    import inspect

    return name in inspect.signature(model.forward).parameters


def cache_kw(model) -> str:
    """The forward's name for the KV cache: transformers 5.24 calls it `cache`; `past_key_values`, the name of
    earlier versions (the device image's 5.17), warns there and is removed in 5.40. A forward that takes neither
    (GPT-1's OpenAIGPTLMHeadModel, XLNet's memory) swallowed the cache in its **kwargs: each decode step then ran
    the new token alone, without its context, and the cell was `ok` with an empty cache and a per-token time of
    that context-free step."""
    for name in ("cache", "past_key_values"):
        if takes(model, name):
            return name
    raise Unsupported(f"generation: {type(model).__name__}.forward takes no KV cache (past_key_values), so a decode "
                      "step could not attend to the tokens before it")


def build_model(ref: ModelRef, task: str, *, attn: str = "eager", activation: str | None = None,
                dropout: float | None = None, device: str = "cpu", seed: int = 0):
    """An fp32 model in eval mode on `device`; random weights from `seed` unless `ref` has a folder."""
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    reason = missing_head(ref, task)
    if reason:
        raise Unsupported(reason)
    cls = getattr(transformers, task_class(ref.family, task))
    cfg = hf_config(ref, task, activation, dropout)
    # The bare model without a pooler (BERT, RoBERTa, ...): `base` is the encoder's hidden states.
    extra = _init_kwargs(cls)
    if ref.path and device != "meta":  # a meta model holds no data: the folder's config alone builds it
        # fp32 whatever dtype the checkpoint was saved in: this is the reference every cell is checked
        # against, and the backends cast it to the cell's dtype themselves.
        kw = dict(config=cfg, attn_implementation=attn, trust_remote_code=False, dtype=torch.float32,
                  local_files_only=True, **extra)
        model, info = cls.from_pretrained(ref.path, output_loading_info=True, **kw)
        mapping = _backbone_mapping(model, ref.family, info)
        if mapping:
            model = cls.from_pretrained(ref.path, key_mapping=mapping, **kw)
        model = model.to(device)
    else:
        if device != "meta":  # a meta model draws no random numbers: the global generator stays as it was
            torch.manual_seed(seed)
        cfg._attn_implementation = attn
        with torch.device(device):
            model = cls(cfg, **extra)
    _experts_route(model)
    return model.eval().requires_grad_(False)


# torch's grouped_mm, transformers' default route for mixture-of-experts layers, takes matrices whose rows start on
# 16-byte boundaries: an expert width that is not a multiple of 16 bytes' elements raised "strides should be multiple
# of 16 bytes" in every cell of the model (a Mixtral of intermediate_size 37), eager included. The multiple is the
# element size's (4 in fp32, 8 in fp16 and bf16), and the route is chosen here, once, on the fp32 model that every
# cell then casts to its own dtype: so it is the narrowest element's, 2 bytes. fp32's 4 would keep a width of 12 on
# grouped_mm, and each fp16 and bf16 cell of it failed. No cell casts the experts narrower: --quant swaps nn.Linear
# layers only (experts are 3-D parameters), and the fused engine, whose fp8 is the one 1-byte dtype, runs no
# mixture of experts. One route per model also keeps an fp32-against-bf16 comparison a comparison of dtypes alone.
GROUPED_MM_BYTES = 16
NARROWEST_ELEMENT_BYTES = 2  # fp16 and bf16
GROUPED_MM_ALIGN = GROUPED_MM_BYTES // NARROWEST_ELEMENT_BYTES


def _experts_route(model) -> None:
    """Such a model's experts run transformers' own `eager` route (one matrix product per expert): the same
    function, which takes any width."""
    if getattr(model.config, "_experts_implementation", None) != "grouped_mm":
        return
    # Expert modules are the ones transformers' use_experts_implementation decorates (it sets is_concatenated).
    if any(p.dim() == 3 and any(n % GROUPED_MM_ALIGN for n in p.shape[1:])
           for m in model.modules() if hasattr(m, "is_concatenated") for p in m.parameters(recurse=False)):
        model.set_experts_implementation("eager")


def param_count(shape: Preset) -> int:
    """Parameters of the bare model (no task head), counted on a meta-device copy: nothing is allocated."""
    model = build_model(ModelRef(shape.name, shape), "base", device="meta")
    return sum(p.numel() for p in model.parameters())


# The class flag that says a transformers model class has an attention implementation.
_SUPPORTS = {"sdpa": "_supports_sdpa", "flash_attention_2": "_supports_flash_attn"}


def missing_attention(family: str, task: str, attn: str) -> str | None:
    """Why `family`'s class for `task` has no transformers `attn` attention ('sdpa', 'flash_attention_2'), or None
    (eager, or a class that declares it). A class that lacks it refuses to be built with it (a ValueError)."""
    import transformers

    cls = getattr(transformers, task_class(family, task) or "", None)
    flag = _SUPPORTS.get(attn)
    if cls is not None and flag and not getattr(cls, flag, False):
        return f"{family} has no '{attn}' attention in transformers"
    return None


def _init_kwargs(cls) -> dict:
    """What build_model passes a class besides its config: the bare model without a pooler (BERT, RoBERTa, ...)."""
    import inspect

    return {"add_pooling_layer": False} if "add_pooling_layer" in inspect.signature(cls.__init__).parameters else {}


def _rebuilt(model, attn: str):
    """`model` built again with `attn` chosen at construction, its tensors moved over (no copy), or None. For a
    class that has `attn` but cannot switch to it once built: transformers 5 switches only classes whose
    attention goes through its AttentionInterface and keeps the old one otherwise (a warning, no error), so
    Falcon's sdpa cells were `unsupported` though FalconModel declares sdpa."""
    import torch

    cls = type(model)
    if not getattr(cls, _SUPPORTS.get(attn, ""), False):
        return None
    cfg = copy.deepcopy(model.config)
    cfg._attn_implementation = attn
    try:
        with torch.device("meta"):
            new = cls(cfg, **_init_kwargs(cls))
        new.load_state_dict(model.state_dict(), strict=True, assign=True)
        persistent = set(new.state_dict())
        for name, buf in model.named_buffers():  # non-persistent ones (rotary frequencies) are no state dict's
            if name not in persistent:
                owner, _, leaf = name.rpartition(".")
                new.get_submodule(owner).register_buffer(leaf, buf, persistent=False)
    except Exception:  # noqa: BLE001 - any failure leaves the cell `unsupported`, as without the rebuild
        return None
    if new.config._attn_implementation != attn or any(t.is_meta for t in (*new.parameters(), *new.buffers())):
        return None
    return new.eval().requires_grad_(False)


def set_attention(model, attn: str, fallback: str | None = None):
    """Switch the model to transformers' `attn` implementation and return it (a new model where the class
    chooses its attention only when built); a family that lacks it runs `fallback` where the backend allows
    one, else the cell is `unsupported`. (transformers may keep the old implementation without a word, as it
    does for DeBERTa-v2 and sdpa: what it runs is checked after.)"""
    if model.config._attn_implementation == attn:
        return model
    why = "its model class does not support it"
    try:
        model.set_attn_implementation(attn)
    except (ValueError, ImportError) as exc:
        # its first sentence: Gemma 2's goes on with a link, a request and an example loading openai/whisper-tiny
        why = re.split(r"(?<=\.)\s", str(exc).strip(), maxsplit=1)[0].splitlines()[0]
    if model.config._attn_implementation == attn:
        return model
    rebuilt = _rebuilt(model, attn)
    if rebuilt is not None:
        return rebuilt
    if fallback is None:
        raise Unsupported(f"{model.config.model_type} has no '{attn}' attention in transformers ({why})")
    model.set_attn_implementation(fallback)
    return model
