"""ONNX Runtime: the model exported once per shape with torch.onnx (the dynamo exporter), run by the
CUDA execution provider on GPU and the CPU provider on CPU.

Export: torch.onnx.export(dynamo=True) is the one that works with transformers 5 models on torch 2.11+
(the classic TorchScript exporter rejects the cache objects of GPT-2 and, on BERT with a padding mask,
bakes one branch of the mask code into the graph and gives wrong numbers). The model is wrapped so the
graph returns exactly the tensor the correctness check compares, with a decoder's KV cache turned off.
A model the exporter cannot handle (its coverage differs by family) is `unsupported` with the exporter's
reason.
On a GPU cell the inputs and output are bound to torch's own device buffers (IO binding) and ORT runs
on torch's current stream, so a timed call is the device work, not host copies. A GPU cell never falls
back to the CPU provider: no CUDA provider means `unsupported`."""

from __future__ import annotations

import inspect
import os
import tempfile
import time

from ..errors import Unsupported
from .base import Backend, Prepared

_EXPORTS: dict[tuple, str] = {}  # per worker process: (cell shape, dtype, ...) -> .onnx path
_DIR: tempfile.TemporaryDirectory | None = None



def _export_dir() -> str:
    global _DIR
    if _DIR is None:
        _DIR = tempfile.TemporaryDirectory(prefix="transbench-onnx-")
    return _DIR.name


# The graph input that stands for BERT's frozen embedding block under --encoders-only (see _prepare).
EMBEDDED = "embedding_output"


def _wrapper(model, task: str, names: list[str]):
    import torch

    from .base import output_tensor

    no_cache = "use_cache" in inspect.signature(model.forward).parameters  # decoders: no KV cache outputs

    class Exported(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *args):
            kwargs = dict(zip(names, args))
            if no_cache:
                kwargs["use_cache"] = False
            if EMBEDDED not in kwargs:
                return output_tensor(self.model(**kwargs), task)
            emb = self.model.base_model.embeddings
            frozen, hidden = emb.forward, kwargs.pop(EMBEDDED)
            emb.forward = lambda *a, **k: hidden
            try:
                return output_tensor(self.model(**kwargs), task)
            finally:
                emb.forward = frozen

    return Exported().eval()


def export(model, feeds: dict, cell) -> tuple[str, float, bool]:
    """The .onnx of this model at this shape: (path, export seconds, whether it came from the cache)."""
    import torch

    key = (cell.model, cell.task, cell.batch, cell.seq, cell.seq_stdev, cell.dtype, cell.activation,
           cell.embeddings, cell.seed, str(next(model.parameters()).device))
    if key in _EXPORTS:
        return _EXPORTS[key], 0.0, True
    path = os.path.join(_export_dir(), f"model-{len(_EXPORTS)}.onnx")
    names = list(feeds)
    t0 = time.perf_counter()
    try:
        with torch.inference_mode(False), torch.no_grad():
            torch.onnx.export(_wrapper(model, cell.task, names), tuple(feeds.values()), path, input_names=names,
                              output_names=["out"], dynamo=True, verbose=False)
    except Exception as exc:  # the exporter's coverage differs by family: a model it cannot export is not a crash
        first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise Unsupported(f"torch.onnx cannot export {model.config.model_type} ({type(exc).__name__}: {first[:200]})") from None
    _EXPORTS[key] = path
    return path, time.perf_counter() - t0, False


def _session(path: str, device, dtype: str):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if device.type == "cuda":
        import torch

        stream = torch.cuda.current_stream(device).cuda_stream
        cuda = {"device_id": device.index or 0, "user_compute_stream": str(stream),
                "use_tf32": 1 if dtype == "tf32" else 0}
        providers = [("CUDAExecutionProvider", cuda)]
    else:
        providers = ["CPUExecutionProvider"]
    sess = ort.InferenceSession(path, opts, providers=providers)
    want = "CUDAExecutionProvider" if device.type == "cuda" else "CPUExecutionProvider"
    if sess.get_providers()[0] != want:
        raise Unsupported(f"onnxruntime could not start its {want} here (it offered {sess.get_providers()})")
    return sess


def _check_available(device, dtype: str) -> None:
    import onnxruntime as ort

    if device.type == "cuda" and "CUDAExecutionProvider" not in ort.get_available_providers():
        raise Unsupported("the installed onnxruntime has no CUDA execution provider: "
                          "pip uninstall onnxruntime && pip install onnxruntime-gpu")
    if device.type == "cpu" and dtype != "fp32":
        raise Unsupported(f"onnxruntime on the CPU runs fp32 here, not {dtype}")


def _prepare(model, inputs, cell) -> Prepared:
    import onnxruntime as ort
    import torch

    device = next(model.parameters()).device
    _check_available(device, cell.dtype)
    feeds = {k: v for k, v in inputs.model_kwargs().items() if v is not None}
    if not cell.embeddings and model.config.model_type == "bert":
        # The scenario froze BERT's embedding block (encoders-only): exported as it is, its output is a constant
        # of the graph and ONNX Runtime folds the whole encoder into it (bert-tiny 8 x 64 read 0.019 ms on two
        # CPU cores, against 6.0 with embeddings). The block's output goes in as a graph input instead.
        with torch.no_grad():
            feeds[EMBEDDED] = model.base_model.embeddings(input_ids=inputs.input_ids,
                                                          token_type_ids=inputs.token_type_ids)
    path, export_s, cached = export(model, feeds, cell)
    sess = _session(path, device, cell.dtype)
    graph_inputs = [i.name for i in sess.get_inputs()]  # the exporter drops inputs the graph never reads
    info = {"export_s": export_s, "export_cached": cached, "onnx_exporter": "dynamo",
            "ort_version": ort.__version__, "ort_provider": sess.get_providers()[0],
            "onnx_inputs": graph_inputs}
    if device.type != "cuda":
        numpy_feeds = {k: feeds[k].cpu().numpy() for k in graph_inputs}

        def fn():
            return torch.from_numpy(sess.run(None, numpy_feeds)[0])

        return Prepared(fn, info)

    import numpy as np

    as_numpy = {torch.float32: np.float32, torch.float16: np.float16, torch.int64: np.int64}
    first = torch.from_numpy(sess.run(None, {k: feeds[k].cpu().numpy() for k in graph_inputs})[0])
    out = torch.empty(first.shape, dtype=first.dtype, device=device)
    binding = sess.io_binding()
    keep = [feeds[n].contiguous() for n in graph_inputs]  # the bound buffers must outlive the binding
    for name, t in zip(graph_inputs, keep):
        binding.bind_input(name, "cuda", device.index or 0, as_numpy[t.dtype], tuple(t.shape), t.data_ptr())
    binding.bind_output("out", "cuda", device.index or 0, as_numpy[out.dtype], tuple(out.shape), out.data_ptr())

    def fn():
        sess.run_with_iobinding(binding)
        _ = keep
        return out

    info["io_binding"] = True
    return Prepared(fn, info)


BACKEND = Backend(
    name="onnxruntime",
    attn="sdpa",
    attn_fallback="eager",
    prepare=_prepare,
    dtypes=("fp32", "tf32", "fp16"),
    tasks=("base", "mlm", "classification", "token-classification", "qa", "causal-lm"),
    requires=("onnxruntime", "onnx", "onnxscript"),
    extra="onnx",
    # torch.onnx exports plain tensors; torchao's and bitsandbytes' quantized weights are tensor subclasses and
    # modules it has no ONNX operators for.
    quant_refusal="onnxruntime runs an ONNX export, which quantized weights do not survive: --quant none only",
    describe="ONNX Runtime (CUDA or CPU execution provider) on a torch.onnx dynamo export",
    per_shape=True,
)
