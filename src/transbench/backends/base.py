"""What a backend is: how the model is built for it, whether it can run a cell, and how to call it."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Prepared:
    """A ready-to-time forward: `fn()` runs one batch and returns the model's output."""

    fn: Callable[[], Any]
    info: dict = field(default_factory=dict)  # what really ran (kernel, compile seconds, ...), stored with the cell
    # What really ran that only the first call settles (the fused engine's tuned kernel routes), for the cell's info.
    ran: Callable[[], dict] | None = None
    # A packing backend with a graph per packed token count (the fused engine on CUDA: CompiledModel.token_bucket):
    # a batch runs its real tokens only, their count rounded up to a multiple of this; 0: no such graphs.
    token_bucket: int = 0
    graphs: Callable[[], int] | None = None  # graphs captured so far (serving counts those captured under load)
    # Drops what the first call captured (the fused engine's graphs), so the scenario can restart the memory peak
    # and capture again: that first call may also have timed kernel routes, whose memory no later call needs.
    release: Callable[[], None] | None = None
    # The packed token counts a padded call of the prepared shape can run, each a graph (the fused engine's ladder
    # when prepared for a server, engine/packing.py token_ladder); empty: token_bucket's multiples, or no graphs.
    token_sizes: tuple[int, ...] | list[int] = ()
    # Sets the tuning seconds a new shape's first call may take (0: borrowed routes, a capture only): a server's
    # shapes first met under load capture without racing kernels for seconds.
    tune_budget: Callable[[float | None], None] | None = None
    # Makes a padded call reuse the smallest captured graph that holds it rather than capture its own (True: a
    # server once its load starts; engine/packing.py reuse_sizes).
    reuse_captured: Callable[[bool], None] | None = None

    def what_ran(self) -> dict:
        """info and, after the first call, what that call settled."""
        return {**self.info, **(self.ran() if self.ran else {})}


@dataclass(frozen=True)
class Backend:
    name: str
    prepare: Callable[..., Prepared]  # (model, inputs, cell) -> Prepared
    attn: str = "sdpa"  # the attention implementation transformers runs the model with
    # The one a family lacking `attn` runs instead (DeBERTa-v2 has no sdpa), where the backend's point is not
    # the attention kernel (compile, CUDA graphs, ONNX); None: such a cell is `unsupported`.
    attn_fallback: str | None = None
    devices: tuple[str, ...] = ("cpu", "cuda")
    dtypes: tuple[str, ...] = ("fp32", "tf32", "fp16", "bf16")
    tasks: tuple[str, ...] | None = None  # None: every task
    requires: tuple[str, ...] = ()  # importable modules this backend needs
    extra: str | None = None  # the pip extra that brings them
    describe: str = ""
    # (model, cell) -> an object with prefill(ids)->(B,V) logits and decode(next_ids)->(B,V) logits, for
    # --task generate; None: transformers' own forward with a DynamicCache (scenarios/generation/measure.py)
    generator: Callable[..., Any] | None = None
    packs: bool = False  # runs only the real tokens of a padded batch (no padding work): serving pads no width
    # A graph, compiled program or export per (batch, width) bucket: preparing one under load stalls the queue behind
    # it, so serving runs a batch in the smallest prepared bucket that holds it (serve/measure.py holder). Backends
    # without one (eager, sdpa) run each batch in its own bucket: padding a 5-token request to 128 bought nothing.
    per_shape: bool = False
    # Why the backend takes `--quant none` only (models/quant.py quantizes the transformers model it is given);
    # None: it runs the quantized model.
    quant_refusal: str | None = None
    # Checks the environment variables the backend reads (SpecError, one line), called by backends.get: so before
    # any cell of run, serve, server and demo, which look each backend up first. None: it reads none.
    check_environment: Callable[[], None] | None = None

    def unsupported_reason(self, device_type: str, dtype: str, task: str, quant: str = "none") -> str | None:
        """Why this backend cannot run such a cell here, or None when it can."""
        missing = [m for m in self.requires if importlib.util.find_spec(m) is None]
        if missing:
            how = f"pip install 'transbench[{self.extra}]'" if self.extra else f"pip install {' '.join(missing)}"
            return f"{self.name} needs {', '.join(missing)}: {how}"
        if device_type not in self.devices:
            return f"{self.name} runs on {', '.join(self.devices)} only"
        if dtype == "fp8" and dtype not in self.dtypes:
            return "fp8 runs on the fused backend only"
        if dtype not in self.dtypes:
            return f"{self.name} runs {', '.join(self.dtypes)} only"
        if self.tasks is not None and task not in self.tasks:
            return f"{self.name} does not run task {task}"
        if quant != "none" and self.quant_refusal:
            return self.quant_refusal
        return None


def hf_call(model, inputs) -> Callable[[], Any]:
    """A plain call of the transformers model on the cell's inputs."""
    import torch

    kwargs = inputs.model_kwargs()

    def fn():
        with torch.inference_mode():
            return model(**kwargs)

    return fn


def output_tensor(out, task: str):
    """The tensor the correctness check compares: logits for heads, last hidden state otherwise."""
    import torch

    if isinstance(out, torch.Tensor):
        return out
    if task == "qa":
        return torch.stack([out.start_logits, out.end_logits], -1)
    for name in ("logits", "last_hidden_state"):
        value = getattr(out, name, None)
        if value is None and isinstance(out, dict):
            value = out.get(name)
        if value is not None:
            return value
    return out[0]
