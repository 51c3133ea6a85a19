"""torch.compile of the whole transformers model, one static shape per cell.

Compile time is measured around the first call (which traces, compiles and runs) and stored apart from
run time. Dynamo's caches are reset per cell so every cell compiles from scratch (a worker runs many
cells, and reused caches would hit the recompile limit and silently fall back to eager). The timed calls
run under the "fail_on_recompile" stance: a recompile inside the timed region is an error, not a number."""

from __future__ import annotations

import time

from ..errors import Unsupported
from .base import Backend, Prepared

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# Modes whose CUDA-graph trees capture on streams torch chooses. After such a cell the fused engine's graphs lost their
# programmatic dependent launch for the rest of the process: bert-base fp16 8 x 128 read 0.6281 ms alone and 0.6646
# after a reduce-overhead cell in one worker (H100, benchmarks/results/sampler_host_h100_2026-11.md; the engine's own
# captures share one stream for this reason, engine/capture.py side_stream). The sweep ends the worker after them.
GRAPH_MODES = ("reduce-overhead", "max-autotune")


def fresh_worker_after(mode: str, device) -> dict:
    """The info that makes the sweep replace the worker after a cell in `mode` (runner/sweep.py _Lane)."""
    if mode not in GRAPH_MODES or getattr(device, "type", None) != "cuda":
        return {}
    return {"fresh_worker_after": f"torch.compile mode {mode} captured CUDA graphs on streams of its own"}


def check_mode(mode: str) -> str:
    if mode not in MODES:
        from ..errors import SpecError

        raise SpecError(f"unknown --compile-mode '{mode}': choose from {', '.join(MODES)}")
    return mode


def compiled_call(model, kwargs: dict, mode: str, device):
    """The compiled model's forward on fixed inputs, its compile seconds, and dynamo's counts."""
    import torch
    from torch._dynamo.utils import counters

    from ..measure import device as dev

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, mode=check_mode(mode), dynamic=False)

    def first():
        with torch.inference_mode():
            return compiled(**kwargs)

    t0 = time.perf_counter()
    first()
    dev.synchronize(device)
    compile_s = time.perf_counter() - t0
    info = {
        "compile_mode": mode, "compile_s": compile_s,
        "graphs": int(counters["stats"]["unique_graphs"]),
        "graph_breaks": int(sum(counters["graph_break"].values())), **fresh_worker_after(mode, device),
    }

    def fn():
        with torch.inference_mode(), torch.compiler.set_stance("fail_on_recompile"):
            return compiled(**kwargs)

    return fn, info


def _prepare(model, inputs, cell) -> Prepared:
    device = next(model.parameters()).device
    fn, info = compiled_call(model, inputs.model_kwargs(), cell.compile_mode, device)
    return Prepared(fn, info)


def make_generator(model, cell):
    from .decoders import StaticGenerator

    def build_step(step, device):
        import torch

        from ..measure import device as dev

        torch._dynamo.reset()
        compiled = torch.compile(step, mode=check_mode(cell.compile_mode), dynamic=False)
        t0 = time.perf_counter()
        with torch.inference_mode():
            compiled()  # compiles; the replayed step runs the same positions again
        dev.synchronize(device)

        def decode():
            # As the forwards' timed calls: a recompile is no step of the compiled model. transformers' sliding-window
            # cache guards the step on the tokens written (`cumulative_length_int`), so a Mistral's step recompiled
            # at every position until dynamo's limit, then ran eagerly: an `ok` cell timing compilations and eager
            # steps under the name compile.
            try:
                with torch.compiler.set_stance("fail_on_recompile"):
                    return compiled()
            except RuntimeError as exc:
                if "Detected recompile" not in str(exc):
                    raise
                guard = next((line.strip(" -") for line in str(exc).splitlines() if "==" in line), "")
                guard = guard.split("#")[0].strip()  # the guard, without dynamo's comment on where it came from
                raise Unsupported("generation under compile: the decode step recompiles at each position"
                                  f"{f' (guard {guard})' if guard else ''}, so its steps would time compilations; "
                                  "sdpa generates it") from None

        return decode, {"compile_s": time.perf_counter() - t0, "compile_mode": cell.compile_mode,
                        **fresh_worker_after(cell.compile_mode, device)}

    return StaticGenerator(model, cell.batch, cell.positions, build_step, step="compile")


BACKEND = Backend(
    name="compile",
    attn="sdpa",
    attn_fallback="eager",
    prepare=_prepare,
    generator=make_generator,
    describe="torch.compile of the transformers model (sdpa attention), mode from --compile-mode",
    per_shape=True,
)
