"""The inference scenario: build, check against an fp32 reference, time, and count one cell."""

from __future__ import annotations

import copy
import time

from ... import backends
from ...backends.base import output_tensor
from ...measure import device as dev
from ...measure import agreement, memory, timer
from ...measure.record import timing_record
from ...models import build, flops
from ...models import quant as quantization
from ...cells import Cell, CellResult
from ..inputs import Inputs, make_inputs, point_seed
from . import answers

# Relative error allowed against the fp32 reference, by dtype. Half precision over 12-48 layers
# lands near 1e-3..1e-2; a broken kernel lands near 1.
# fp8 (the fused engine's e4m3 GEMMs with per-channel weight and per-token activation scales): the same math
# emulated in fp32 on the CPU (benchmarks/studies/fp8_accuracy.py) gave rel_err 7.0e-2 on bert-base (2x128, 4x512),
# 6.9e-2 roberta-base, 9.8e-2 gpt2, 1.05e-1 gpt2-medium, 1.07e-1 gpt2-large, 1.11e-1 gpt2-xl, and the most,
# 1.30e-1 on bert-large (1x384, 4x128, 1x512; 1.26e-1 measured on an H100). That is e4m3's 3-bit mantissa (each
# GEMM kind alone adds 2-7e-2; docs/engine.md, fp8), not a scale choice, so 1.5e-1 keeps 15% over the largest;
# a wrong scale or kernel lands near 1. Below ops.FP8_MIN_ROWS tokens an fp8 cell runs fp16 and lands near 1e-3.
TOLERANCE = {"fp32": 1e-3, "tf32": 1e-2, "fp16": 2e-2, "bf16": 4e-2, "fp8": 1.5e-1}
# The same for a --quant cell of a random-weight model (the larger of this and its dtype's). Measured on the CPU in
# fp32 and bf16 (bert-base, roberta-base, gpt2 2 x 128; bert-large 1 x 384; gpt2-medium 1 x 128; docs/quantization.md):
# int8-weight 1.6e-2 to 3.5e-2, int8-dynamic 2.3e-2 to 4.2e-2, nf4 0.19 to 0.38, the largest each bert-large's in
# bf16. fp8-dynamic is the fused fp8's recipe (e4m3, per-token activation and per-channel weight scales), so its
# tolerance. A wrong scale or kernel lands near 1.
QUANT_TOLERANCE = {"int8-weight": 5e-2, "int8-dynamic": 6e-2, "fp8-dynamic": 1.5e-1, "nf4": 4.5e-1}
# A trained checkpoint's reduced-precision cell is judged by its answers on the packaged sentences, which a second
# preparation computes; its own checked call must still be nearer fp32 than an output of zeros (rel_err 1). Trained
# weights carry outlier features that per-token int8 or e4m3 scales blur: all-MiniLM-L6-v2 read rel_err 0.09 in
# int8-dynamic and 0.28 in nf4 on random tokens, with every sentence's neighbour kept.
BROKEN = 1.0
# Past its dtype's tolerance, an fp16 or bf16 cell is held to the same model's eager forward in that dtype: a deep
# random-weight model moves further from fp32 than TOLERANCE's presets did (llama-3.2-1b bf16 at batch 8: 0.0401,
# benchmarks/results/quantization_h200_2026-11.md), and a backend is right when it moves it no further than PyTorch's
# own forward does, within this factor. A wrong kernel still lands near 1.
EAGER_SLACK = 1.25


class ModelCache:
    """Per worker: the fp32 model of each (model, task, activation), kept on the CPU, and the reference
    outputs computed from it, so cells that share them build them once."""

    def __init__(self):
        self.models: dict[tuple, object] = {}
        self.refs: dict[tuple, object] = {}
        self.sentences: dict[tuple, tuple] = {}  # the packaged sentences as inputs, and fp32's answers on them
        self.agreements: dict[tuple, dict | None] = {}  # a prepared model's measures on them (answers.on_sentences)
        self.eager_errs: dict[tuple, float | None] = {}  # eager_dtype_err's, computed where a cell needs one

    def base_model(self, cell: Cell):
        key = cell.model_key()
        if key not in self.models:
            self.models.clear()  # one model family at a time: keeps host memory bounded
            self.refs.clear()
            self.sentences.clear()
            self.agreements.clear()
            self.eager_errs.clear()
            ref = build.resolve(cell.model)
            self.models[key] = build.build_model(ref, cell.task, attn="eager", activation=cell.activation,
                                                 seed=cell.seed)
        return self.models[key]


NONFINITE_REFERENCE = ("the model's own fp32 output (eager attention, the reference every backend is checked "
                      "against) is not finite on these inputs: the checkpoint's weights hold NaN or infinite values, "
                      "or its config makes them; no backend can be judged")


def reference_rows(batch: int) -> list[int]:
    """The sequences the reference is computed for: the first two and the last two."""
    return sorted({0, 1, batch - 2, batch - 1} & set(range(batch)))


def rel_err(out, ref, lengths: list[int] | None, width: int | None = None) -> float:
    """||out - ref|| / ||ref|| in float64 over real tokens only (padding positions are undefined)."""
    import torch

    o, r = out.detach().double().cpu(), ref.detach().double().cpu()
    # Per-token outputs are (rows, width, ...), width the padded batch's: these rows may all be shorter.
    if lengths is not None and o.dim() >= 2 and o.shape[1] == (width or max(lengths)) and o.shape[0] == len(lengths):
        keep = torch.arange(o.shape[1])[None, :] < torch.tensor(lengths)[:, None]
        o, r = o[keep], r[keep]
    if not torch.isfinite(o).all():
        return float("inf")
    return float(torch.linalg.vector_norm(o - r) / torch.linalg.vector_norm(r).clamp_min(1e-30))


def cell_inputs(cell: Cell, shape) -> Inputs:
    seed = point_seed(cell.model, cell.batch, cell.seq, cell.seq_stdev, cell.seed)
    kinds = build.input_kinds(build.resolve(cell.model))
    return make_inputs(shape.vocab, cell.batch, cell.seq, token_types=kinds.token_types, pad_id=kinds.pad_id,
                       stdev=cell.seq_stdev, max_len=shape.max_positions, seed=seed)


def _rows_forward(cache: ModelCache, cell: Cell, inputs: Inputs, device, dtype: str):
    """The cell's fp32 model run eagerly on the rows of `reference_rows`, on the device, no TF32: in fp32 the cached
    model itself (moved back to the CPU after), in another dtype a cast copy (freed after)."""
    import torch

    base = cache.base_model(cell)
    model = base if dtype == "fp32" else copy.deepcopy(base)
    dev.set_matmul_precision("fp32")
    sub = inputs.rows(reference_rows(cell.batch))
    try:
        model.to(device=device, dtype=dev.torch_dtype(dtype))
        with torch.inference_mode():
            return output_tensor(model(**sub.to(device).model_kwargs()), cell.task).float().cpu()
    finally:
        base.to("cpu")
        del model
        dev.free_memory(device)


def reference(cache: ModelCache, cell: Cell, inputs: Inputs, device):
    """fp32, eager attention, no TF32, on the device: the rows of `reference_rows` only."""
    rows = reference_rows(cell.batch)
    key = (cell.model_key(), cell.batch, cell.seq, cell.seq_stdev, cell.embeddings)
    if key not in cache.refs:
        cache.refs[key] = _rows_forward(cache, cell, inputs, device, "fp32")
    return rows, cache.refs[key]


def eager_dtype_err(cache: ModelCache, cell: Cell, inputs: Inputs, device) -> float | None:
    """rel_err against the reference of the same model's eager forward in the cell's dtype, on the reference's rows:
    how far the dtype itself moves this model (EAGER_SLACK). None where it cannot run."""
    key = (cell.model_key(), cell.batch, cell.seq, cell.seq_stdev, cell.dtype)
    if key not in cache.eager_errs:
        rows, ref = reference(cache, cell, inputs, device)
        try:
            out = _rows_forward(cache, cell, inputs, device, cell.dtype)
            cache.eager_errs[key] = rel_err(out, ref, [inputs.lengths[i] for i in rows], inputs.input_ids.shape[1])
        except RuntimeError:  # out of memory beside the cell's model, or an op the dtype lacks here: no relief
            cache.eager_errs[key] = None
    return cache.eager_errs[key]


def encoders_only(model, inputs: Inputs, family: str) -> None:
    """Move the embedding layer out of the timed region: BERT's whole embedding block is computed once
    and replayed (the fused engine mirrors it); every other family gets its token embeddings passed in as
    `inputs_embeds` (what it adds to them, positions or token types, stays inside)."""
    import inspect

    import torch

    with torch.inference_mode():
        if family == "bert":
            emb = model.base_model.embeddings
            cached = emb(input_ids=inputs.input_ids, token_type_ids=inputs.token_type_ids)
            emb.forward = lambda *args, **kwargs: cached
        elif "inputs_embeds" in inspect.signature(model.forward).parameters:
            _check_last_position_read(model, inputs, family)
            inputs.inputs_embeds = model.get_input_embeddings()(inputs.input_ids)
        else:
            from ...errors import Unsupported

            raise Unsupported(f"--encoders-only: {type(model).__name__} takes no inputs_embeds")


def _check_last_position_read(model, inputs: Inputs, family: str) -> None:
    """A decoder's sequence classifier finds each row's last real token from its input ids; from inputs_embeds it
    takes the last position. Where padding sits there, the cell's head read padding and the fp32 reference (from the
    ids) a real token: every backend, eager included, read `wrong` (gpt2 --seq-stdev 3: rel_err 0.62)."""
    from ...errors import Unsupported

    mask = inputs.attention_mask
    if (build.is_decoder(family) and type(model).__name__.endswith("ForSequenceClassification") and mask is not None
            and not bool(mask[:, -1].all())):
        raise Unsupported("--encoders-only: a decoder's classification head reads each sequence's last position when "
                          "given inputs_embeds (it finds the last real token from the ids), and this batch has padding "
                          "there: leave out --encoders-only, or --seq-stdev")


def model_for(cache: ModelCache, cell: Cell, backend, device):
    """A copy of the cell's fp32 model, in the cell's dtype on the device, with the backend's attention;
    the memory peak starts here, so the cell's peak is this model plus what running it takes."""
    dev.free_memory(device)
    memory.reset_peak(device)
    dev.set_matmul_precision(cell.dtype)
    model = copy.deepcopy(cache.base_model(cell)).to(device=device, dtype=dev.torch_dtype(cell.dtype))
    return build.set_attention(model, backend.attn, backend.attn_fallback)


def unsupported_reason(cell: Cell, backend, device) -> str | None:
    """Why the cell cannot run here: its prompt longer than its model's positions (cells.py check_lengths), its
    backend's reason, or its quant's."""
    reason = build.too_long(build.resolve(cell.model), cell.seq) or \
        backend.unsupported_reason(device.type, cell.dtype, cell.task, cell.quant)
    if reason or cell.quant == "none":
        return reason
    capability = dev.nvml_capability(device.index or 0) if device.type == "cuda" else None
    return quantization.unsupported_reason(cell.quant, cell.dtype, device.type, capability)


def reduced(cell: Cell) -> bool:
    """A cell whose arithmetic is coarser than its storage dtype's: fp8 GEMMs, or quantized linear layers."""
    return cell.dtype == "fp8" or cell.quant != "none"


def eager_judged(cell: Cell) -> bool:
    """A cell that may be held to its model's eager forward in its dtype past the tolerance (EAGER_SLACK): fp16 or
    bf16, unquantized, the whole model (an encoders-only cell's output is not the reference's)."""
    return cell.dtype in ("fp16", "bf16") and cell.quant == "none" and cell.embeddings


def wrong(cell: Cell, err: float, agreed: dict | None, eager_err: float | None = None) -> str | None:
    """The correctness gate: why the cell's checked output is wrong, or None. A reduced-precision cell of a trained
    checkpoint (task agreement measured on the packaged sentences) is held to agreement.TARGETS, its rel_err only
    to BROKEN; every other cell to the rel_err tolerance of its dtype (and quant), or, where eager_judged and past
    it, to EAGER_SLACK times eager_err (eager_dtype_err). A random-weight model's answers are near-ties that even
    bf16 splits (docs/quantization.md), so its agreement is recorded, not gated on. A head with no answer to agree on
    (a regression score) is held to its rel_err tolerance wherever it ran."""
    on_sentences = agreed and agreed["agreement_inputs"] == "sentences" and agreed.get("task_agreement") is not None
    if reduced(cell) and on_sentences:
        short = agreement.shortfall(agreed)
        if short:
            return f"{short} on the packaged sentences"
        return None if err < BROKEN else f"rel_err {err:.3g}: no nearer fp32 than an output of zeros ({BROKEN:g})"
    tol = TOLERANCE[cell.dtype] if cell.quant == "none" else max(TOLERANCE[cell.dtype], QUANT_TOLERANCE[cell.quant])
    what = cell.dtype if cell.quant == "none" else f"{cell.quant} {cell.dtype}"
    if err <= tol:
        return None
    # an eager forward that overflowed or lost the model (at or past BROKEN) vouches for nothing
    if eager_err is not None and eager_judged(cell) and eager_err < BROKEN:
        if err <= EAGER_SLACK * eager_err:
            return None
        return (f"rel_err {err:.3g} over the {what} tolerance {tol:g} and over {EAGER_SLACK:g} x the eager {cell.dtype} "
                f"forward's {eager_err:.3g}")
    return f"rel_err {err:.3g} over the {what} tolerance {tol:g}"


def settle(prepared, device) -> None:
    """Before timing: where the backend can drop what its first call captured, drop it, restart the memory peak
    (memory.restart_peak) and call again. A fused cell's first call times kernel routes unless they are on disk,
    and what that tuning left made a cell's peak depend on what ran before it (H100, bert-base fp16 8 x 128: 335.6
    MiB tuning, 301.6 with its routes on disk; 303.6 tuning with this,
    benchmarks/results/fp8_power_cap_h100_2026-11.md). The second call captures without timing."""
    if prepared.release is not None:
        prepared.release()
        memory.restart_peak(device)
        prepared.fn()
        dev.synchronize(device)


def peak_dtype(cell: Cell, info: dict) -> str:
    """The dtype whose datasheet peak MFU is measured against: the cell's, except an fp8 cell whose engine ran no
    GEMM in fp8 (under engine/ops.py FP8_MIN_ROWS tokens it runs the fp16 forward, backends/fused.py counts
    `fp8_gemm_ops`): against the fp8 peak, twice fp16's on an H100, its MFU read half of what the work reached."""
    if cell.dtype == "fp8" and info.get("fp8_gemm_ops") == 0:
        info["mfu_peak_dtype"] = "fp16"
        return "fp16"
    return cell.dtype


def run(cell: Cell, cache: ModelCache) -> CellResult:

    device = dev.resolve(cell.device)
    backend = backends.get(cell.backend)
    reason = unsupported_reason(cell, backend, device)
    if reason:
        return CellResult("unsupported", error=reason)
    shape = build.resolve(cell.model).shape
    inputs = cell_inputs(cell, shape)
    rows, ref = reference(cache, cell, inputs, device)
    if not bool(ref.isfinite().all()):
        # A NaN or an infinity in a checkpoint's weights reaches every output: each cell, eager's too, read `wrong`
        # (rel_err inf), as if its backend had computed badly.
        return CellResult("error", error=NONFINITE_REFERENCE)
    on_sentences = answers.sentences(cache, cell, device) is not None
    if not on_sentences:
        answers.benchmark_reference(cache, cell, inputs, device)

    model = model_for(cache, cell, backend, device)
    quant_info = quantization.apply(model, cell.quant)  # inside the cell's memory peak: it is the model timed
    # None where the backend cannot run the sentences' shape: the cell is then judged by its rel_err alone
    agreed = answers.on_sentences(cache, cell, backend, model, device) if on_sentences else None
    inputs = inputs.to(device)
    if not cell.embeddings:
        encoders_only(model, inputs, shape.family)

    t0 = time.perf_counter()
    prepared = backend.prepare(model, inputs, cell)
    out = prepared.fn()  # the first call also compiles or captures where the backend does that
    dev.synchronize(device)
    prepare_s = time.perf_counter() - t0
    checked = output_tensor(out, cell.task)
    err = rel_err(checked[rows], ref, [inputs.lengths[i] for i in rows], inputs.input_ids.shape[1])
    if not on_sentences:
        agreed = answers.on_benchmark(cache, cell, inputs, checked)
    info = {"attn_implementation": model.config._attn_implementation, "prepare_s": prepare_s,
            "param_dtype": str(next(model.parameters()).dtype), "device": str(device), **quant_info,
            **prepared.what_ran()}
    record = {"rel_err": err, **(agreed or {})}
    why, judged = wrong(cell, err, agreed), []
    if why and eager_judged(cell):  # past the tolerance: how far the dtype itself moves this model
        info["eager_dtype_rel_err"] = eager = eager_dtype_err(cache, cell, inputs, device)
        why = wrong(cell, err, agreed, eager)
        if not why:
            # The eager copy sat beside the cell's model: the peak starts again, and one call puts the cell's own back.
            memory.restart_peak(device)
            prepared.fn()
            dev.synchronize(device)
            judged = [f"rel_err {err:.3g} is over the {cell.dtype} tolerance {TOLERANCE[cell.dtype]:g}, and within "
                      f"{EAGER_SLACK:g} x the same model's eager {cell.dtype} forward ({eager:.3g}): judged by that"]
    if why:
        return CellResult("wrong", record=record, info=info, error=why)

    settle(prepared, device)
    sampled = timer.sample(prepared.fn, device, timer.TimerConfig(cell.warmup, cell.min_time, cell.min_count))
    mem = memory.snapshot(device)
    gpu = dev.gpu_info(device)
    fl, method = flops.forward_flops(shape, inputs.lengths, cell.task)
    timing, warnings = timing_record(sampled, items=cell.batch, tokens=inputs.real_tokens, flops=fl, gpu=gpu,
                                     dtype=peak_dtype(cell, info))
    record.update(timing, peak_mem_mb=mem["peak_mem_mb"], gpu=gpu.name if gpu else None, flops_method=method)
    if cell.task == "causal-lm":  # time per step of the whole context, as the seeds' notes quote it
        record["ms_per_token"] = sampled.stats.median_ms / inputs.input_ids.shape[1]
    info.update({"stats": sampled.stats.as_dict(), "memory": mem, "flops_per_batch": fl,
                 "real_tokens": inputs.real_tokens, "device_context": sampled.context.summary()})
    del model, prepared, out, checked
    return CellResult("ok", record=record, samples_ms=sampled.samples_ms, info=info, warnings=judged + warnings)
