"""The sdpa model's forward captured once in a CUDA graph on static input buffers; timing replays it.

Warm-up runs on a side stream before capture, as PyTorch's CUDA-graph docs prescribe (lazy inits,
cuBLAS workspaces and allocator pools are set up outside the graph). The output is the graph's static
output: every replay overwrites it in place."""

from __future__ import annotations

import contextlib
import time

from ..errors import Unsupported
from .base import Backend, Prepared

WARMUP_CALLS = 3


def capture(call, device, warmup: int = WARMUP_CALLS):
    """Capture `call()` in a CUDA graph; returns (graph, its static output, capture seconds). Warm-up and capture
    run on the process's one capture stream (engine/capture.py side_stream), as the fused engine's do: a capture on
    a stream of its own after work on it cost the fused engine's graphs their programmatic dependent launch."""
    import torch

    from ..engine.capture import capture as graph_capture
    from ..engine.capture import side_stream

    index = torch.device(device).index
    stream = side_stream(torch.cuda.current_device() if index is None else index)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.inference_mode(), torch.cuda.stream(stream):
        for _ in range(warmup):
            call()
    torch.cuda.current_stream(device).wait_stream(stream)
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    t0 = time.perf_counter()
    with torch.inference_mode(), graph_capture(graph, stream=stream):
        out = call()
    torch.cuda.synchronize(device)
    return graph, out, time.perf_counter() - t0


@contextlib.contextmanager
def masks_as_outside_capture():
    """transformers builds a full attention mask while a CUDA stream captures (it may not read a mask's
    contents then), where outside capture it passes none and SDPA picks a fused kernel. With no padding
    mask there is nothing to read: let transformers decide as it does outside capture, so the graph runs
    the same attention kernels as the sdpa backend it replays."""
    import torch

    try:
        import transformers.masking_utils as mu
    except ImportError:
        yield False
        return
    original = getattr(mu, "is_tracing", None)
    if original is None:
        yield False
        return
    mu.is_tracing = lambda *args, **kwargs: (False if torch.cuda.is_current_stream_capturing()
                                             else original(*args, **kwargs))
    try:
        yield True
    finally:
        mu.is_tracing = original


def _prepare(model, inputs, cell) -> Prepared:
    kwargs = inputs.model_kwargs()  # already on the device: these tensors are the graph's input buffers
    device = next(model.parameters()).device
    unpadded = kwargs.get("attention_mask") is None
    with masks_as_outside_capture() if unpadded else contextlib.nullcontext(False) as same_masks:
        graph, out, capture_s = captured(lambda: model(**kwargs), model, device)

    def fn():
        graph.replay()
        return out

    mask = "none, as outside capture" if same_masks else "padding mask" if not unpadded else "built by transformers"
    return Prepared(fn, {"capture_s": capture_s, "graph_nodes": _nodes(graph), "attention_mask_in_graph": mask})


# What torch says when a forward does something a stream capture forbids. On an H100, deberta-v3-base failed so
# in every cell (transformers' make_log_bucket_position copies a CPU scalar tensor to the GPU on every call):
# the model cannot be graphed as transformers writes it, which is `unsupported`, not an error of this backend.
CAPTURE_REFUSALS = ("during CUDA graph capture", "operation not permitted when stream is capturing",
                    "cudaErrorStreamCaptureUnsupported", "cudaErrorStreamCaptureInvalidated")


def captured(call, model, device):
    """capture(call, device), or Unsupported where torch refuses to capture what the model's forward does."""
    try:
        return capture(call, device)
    except RuntimeError as exc:
        reason = capture_refusal(exc)
        if reason is None:
            raise
        raise Unsupported(f"{model.config.model_type}'s forward cannot be captured in a CUDA graph: {reason}") \
            from None


def capture_refusal(exc: BaseException) -> str | None:
    """The line of `exc` saying why capture was refused, or None for any other failure."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return next((ln for ln in lines if any(r in ln for r in CAPTURE_REFUSALS)), None)


def _nodes(graph) -> int | None:
    try:
        return int(graph.raw_cuda_graph().num_nodes) if hasattr(graph, "raw_cuda_graph") else None
    except Exception:  # introspection varies between torch builds; the count is informative only
        return None


def make_generator(model, cell):
    from .decoders import StaticGenerator

    def build_step(step, device):
        # A Mistral with a full sliding window copied a CPU tensor to the GPU in its decode step (H200, torch 2.11,
        # transformers 5.17): refused by the capture, so `unsupported` as _prepare says, not an `error` cell.
        graph, out, capture_s = captured(step, model, device)

        def replay():
            graph.replay()
            return out

        return replay, {"capture_s": capture_s}

    return StaticGenerator(model, cell.batch, cell.positions, build_step, step="cudagraph")


BACKEND = Backend(
    name="cudagraph",
    attn="sdpa",
    attn_fallback="eager",
    prepare=_prepare,
    devices=("cuda",),
    generator=make_generator,
    describe="the sdpa model captured in one CUDA graph, replayed",
    per_shape=True,
)
