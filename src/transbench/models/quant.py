"""`--quant`: the model's linear layers quantized after it is cast to the cell's dtype, by a library's own recipe:
torchao's `quantize_` (int8 weight-only; int8 dynamic activations with int8 weights; float8 dynamic activations
with float8 weights), or bitsandbytes' 4-bit NormalFloat weights (nf4). Every nn.Linear is quantized, the task's
head included; GPT-2's Conv1D layers (transformers' transposed linear) become nn.Linear first, or its blocks would
be left out without a word. The libraries are imported only when a cell asks for a quant other than none."""

from __future__ import annotations

import importlib.metadata
import importlib.util

from ..errors import SpecError, Unsupported

QUANTS = ("none", "int8-weight", "int8-dynamic", "fp8-dynamic", "nf4")
LIBRARY = {"int8-weight": "torchao", "int8-dynamic": "torchao", "fp8-dynamic": "torchao", "nf4": "bitsandbytes"}
INSTALL = {"torchao": "pip install 'transbench[quant]'", "bitsandbytes": "pip install 'transbench[nf4]'"}
# The AOBaseConfig classes (Int8WeightOnlyConfig, ...) that quantize_ takes came with torchao 0.10.
MIN_VERSION = {"torchao": (0, 10)}
FP8_CAPABILITY = (8, 9)  # e4m3 tensor cores: Ada and Hopper on


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _release(version: str) -> tuple[int, ...]:
    parts = []
    for p in version.split("+")[0].split("."):
        if not p.isdigit():
            break
        parts.append(int(p))
    return tuple(parts)


def check(quants: list[str], device_type: str, capability: tuple[int, int] | None) -> None:
    """Bad input, before anything runs: an unknown quant, its library missing or too old, or a quant this device
    cannot run at all (fp8-dynamic on a CPU, as --dtype fp8 is refused there). Found without importing the library."""
    for q in quants:
        if q not in QUANTS:
            raise SpecError(f"unknown --quant '{q}': choose from {', '.join(QUANTS)}")
        lib = LIBRARY.get(q)
        if lib is None:
            continue
        version = _version(lib) if importlib.util.find_spec(lib) is not None else None
        if version is None:
            raise SpecError(f"--quant {q} needs {lib}: {INSTALL[lib]}")
        low = MIN_VERSION.get(lib)
        if low and _release(version) < low:
            raise SpecError(f"--quant {q} needs {lib} {'.'.join(map(str, low))} or newer (this is {version}): "
                            f"{INSTALL[lib]}")  # the extra's pin upgrades it
        if q == "fp8-dynamic":
            reason = _fp8_device_reason(device_type, capability)
            if reason:
                raise SpecError(f"{reason}: leave fp8-dynamic out of --quant here")


def _fp8_device_reason(device_type: str, capability: tuple[int, int] | None) -> str | None:
    if device_type != "cuda":
        return f"--quant fp8-dynamic needs a CUDA GPU of compute capability 8.9 or newer, not the {device_type}"
    if capability is not None and capability < FP8_CAPABILITY:
        return (f"--quant fp8-dynamic needs a CUDA GPU of compute capability 8.9 or newer; this one is "
                f"{capability[0]}.{capability[1]}")
    return None


def unsupported_reason(quant: str, dtype: str, device_type: str, capability: tuple[int, int] | None = None) -> str | None:
    """Why this quant cannot run a cell of `dtype` here (its `unsupported` line), or None when it can."""
    if quant == "none":
        return None
    if dtype == "fp8":
        return "--dtype fp8 is the fused engine's own fp8: --quant applies to fp32, tf32, fp16 and bf16 cells"
    if quant == "fp8-dynamic":
        reason = _fp8_device_reason(device_type, capability)
        if reason:
            return reason
        if dtype != "bf16":
            # torchao's per-row float8 scales (one per token, one per output channel: the fused engine's recipe)
            # need bf16 weights; a per-tensor scale would be another, less accurate recipe under the same name.
            return "fp8-dynamic runs bf16 cells only (torchao's per-row float8 scales need bf16 weights): --dtype bf16"
    return None


def as_linear(model) -> int:
    """Replace GPT-2's Conv1D layers (y = x W + b, W stored in x out) by equal nn.Linear layers; how many."""
    import torch
    from transformers.pytorch_utils import Conv1D

    count = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, Conv1D):
                n_in, n_out = child.weight.shape
                lin = torch.nn.Linear(n_in, n_out, bias=child.bias is not None, device=child.weight.device,
                                      dtype=child.weight.dtype)
                with torch.no_grad():
                    lin.weight.copy_(child.weight.t())
                    if child.bias is not None:
                        lin.bias.copy_(child.bias)
                setattr(module, name, lin)
                count += 1
    return count


def _torchao_config(quant: str):
    from torchao.quantization import (Float8DynamicActivationFloat8WeightConfig,
                                      Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig, PerRow)

    # set_inductor_config=False: True changes torch inductor's global settings for the rest of the worker, so a
    # later compile cell of the same process would be compiled otherwise than when it runs alone.
    if quant == "int8-weight":
        return Int8WeightOnlyConfig(set_inductor_config=False)
    if quant == "int8-dynamic":
        return Int8DynamicActivationInt8WeightConfig(set_inductor_config=False)
    return Float8DynamicActivationFloat8WeightConfig(granularity=PerRow(), set_inductor_config=False)


def _nf4(model) -> None:
    """Every nn.Linear as bitsandbytes' Linear4bit (NormalFloat-4 weights in blocks of 64, computed in the model's
    dtype); the weights are quantized as they move to the device."""
    import bitsandbytes as bnb
    import torch

    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is torch.nn.Linear:
                w = child.weight
                q = bnb.nn.Linear4bit(child.in_features, child.out_features, bias=child.bias is not None,
                                      compute_dtype=w.dtype, quant_type="nf4", device="meta")
                q.weight = bnb.nn.Params4bit(w.detach().cpu(), requires_grad=False, quant_type="nf4")
                if child.bias is not None:
                    q.bias = torch.nn.Parameter(child.bias.detach(), requires_grad=False)
                setattr(module, name, q.to(w.device))


def _counts(model, quant: str) -> tuple[int, int]:
    """(quantized linear layers, all linear layers)."""
    import torch

    if quant == "nf4":
        import bitsandbytes as bnb

        layers = [m for m in model.modules() if isinstance(m, (torch.nn.Linear, bnb.nn.Linear4bit))]
        return sum(isinstance(m, bnb.nn.Linear4bit) for m in layers), len(layers)
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    # quantize_ swaps the weight for a tensor subclass (Int8Tensor, Float8Tensor); a layer it skipped (fp8: sizes
    # not divisible by 16) keeps a plain tensor
    return sum(type(m.weight.data) is not torch.Tensor for m in layers), len(layers)


def apply(model, quant: str) -> dict:
    """Quantize `model` in place (on its device, in its dtype); what ran, for the cell's info. A model none of whose
    linear layers the recipe took is `unsupported`: its figures would be the unquantized model's."""
    if quant == "none":
        return {}
    converted = as_linear(model)
    lib, kept = LIBRARY[quant], []
    if lib == "torchao":
        import torch
        from torchao.quantization import quantize_

        config = _torchao_config(quant)
        kept = _kept_layers(model, quant)
        quantize_(model, config, filter_fn=(lambda m, name: isinstance(m, torch.nn.Linear) and name not in kept)
                  if kept else None)
        recipe = type(config).__name__ + ("(granularity=PerRow)" if quant == "fp8-dynamic" else "")
    else:
        _nf4(model)
        recipe = "Linear4bit(quant_type=nf4)"
    done, total = _counts(model, quant)
    if done == 0:
        raise Unsupported(f"--quant {quant}: {lib} quantized none of the model's {total} linear layers")
    info = {"quant": quant, "quant_library": f"{lib} {_version(lib)}", "quant_recipe": recipe,
            "quantized_layers": done, "linear_layers": total}
    if converted:
        info["conv1d_as_linear"] = converted
    if kept:
        info["kept_layers"] = kept
    return info


def _kept_layers(model, quant: str) -> list[str]:
    """Linear layers a torchao recipe would break, kept in the dtype. One of a single input feature (a Llama of
    intermediate_size 1: its down_proj): torchao's per-row int8 scales of a one-element row fail to reshape ("shape
    '[48, 1]' is invalid for input of size 1"), in quantize_ for the weight and, under int8-dynamic, at run time for
    the activations, and every cell of such a model was an `error`. Under fp8-dynamic, one with an all-zero output
    row: torchao's per-row scale of that row is 0, and its quantized row not finite. A head tied to an embedding with
    a padding row has one: llama-3.2-1b's lm_head gave non-finite logits on an H200
    (benchmarks/results/quantization_h200_2026-11.md)."""
    import torch

    return [name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear) and (
        m.in_features == 1 or quant == "fp8-dynamic" and bool((m.weight.detach() == 0).all(dim=1).any()))]
