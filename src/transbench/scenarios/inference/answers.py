"""A cell's task agreement (measure/agreement.py): its answers and fp32's, on the packaged real sentences where the
model is a checkpoint with a tokenizer (sentences.py), else on the cell's own benchmark inputs.

On the sentences the cell's backend prepares the cell's model (its dtype, its quant) a second time, for their
shape, before the cell's own preparation; the answers are kept per worker for the cells that share the model,
backend, dtype and quant (they differ in batch and sequence length only, so their answers on the sentences are the
same). On the benchmark inputs the answers are those of the call the correctness check reads, on its first
AGREEMENT_ROWS sequences, against an fp32 forward of them (in slices, reduced to answers as they come)."""

from __future__ import annotations

from dataclasses import replace

from ...backends.base import output_tensor
from ...cells import Cell
from ...errors import Unsupported
from ...measure import agreement
from ...measure import device as dev
from ...measure import memory
from ...models import build
from .sentences import sentence_inputs

# The sequences of a batch its agreement is measured on: 64 make 2,016 pairs of similarities and 64 neighbours to
# keep; an fp32 forward of every row of a large batch would cost more than the cell (bert-large 8,192 x 512: about
# a minute on an H100 without TF32, where the rel_err reference runs 4 rows).
AGREEMENT_ROWS = 64
# Elements of fp32 output a slice of those rows may hold (1 GiB): an MLM head's logits over 64 rows of 512 tokens
# are 4 GB.
SLICE_ELEMENTS = 1 << 28
LOGIT_TASKS = ("mlm", "causal-lm")  # outputs as wide as the vocabulary


def answers(out, task: str, lengths: list[int]):
    """What the task answers, from the tensor the correctness check compares (backends.base.output_tensor): a bare
    encoder's sentence embeddings; otherwise argmax labels, of each real token, each sequence's class, or each
    span's start and end position. Taken without a copy of the output, which may be a large batch's logits."""
    import torch

    if task in ("classification", "token-classification") and out.shape[-1] == 1:
        # A regression head (num_labels 1) answers a score, not a class: the argmax of one logit is always 0, so a
        # quantized cell agreed 100% whatever its scores, and on the sentences passed the gate with any rel_err.
        return torch.zeros(out.shape[0], 0, dtype=torch.long)
    if task == "classification":
        return agreement.labels(out)
    keep = torch.arange(out.shape[1], device=out.device)[None, :] < torch.tensor(lengths, device=out.device)[:, None]
    if task == "base":
        return agreement.sentence_embeddings(out, keep)
    if task == "qa":  # (batch, tokens, 2): the argmax over the real tokens of the start and of the end logits
        return agreement.labels(out.masked_fill(~keep[..., None], float("-inf")).transpose(1, 2))
    return out.argmax(-1)[keep].cpu()


def measures(got, want, task: str) -> dict:
    return agreement.of_embeddings(got, want) if task == "base" else agreement.of_labels(got, want)


def fp32_answers(model, inputs, task: str, device, vocab: int, hidden: int):
    """`model` (fp32, on the host) on every row of `inputs`, on the device, reduced to answers slice by slice."""
    import torch

    width = inputs.input_ids.shape[1]
    step = max(1, SLICE_ELEMENTS // (width * (vocab if task in LOGIT_TASKS else hidden)))
    dev.set_matmul_precision("fp32")
    parts = []
    try:
        model.to(device)
        with torch.inference_mode():
            for start in range(0, inputs.batch, step):
                sub = inputs.rows(list(range(start, min(start + step, inputs.batch))))
                out = output_tensor(model(**sub.to(device).model_kwargs()), task).float()
                parts.append(answers(out, task, sub.lengths))
    finally:
        model.to("cpu")
        dev.free_memory(device)
    return torch.cat(parts)


def _benchmark_key(cell: Cell) -> tuple:
    return ("answers", cell.model_key(), cell.batch, cell.seq, cell.seq_stdev, cell.embeddings)


def benchmark_reference(cache, cell: Cell, inputs, device) -> None:
    """fp32's answers on the first AGREEMENT_ROWS rows of the cell's inputs, kept with the reference outputs
    (inference.reference). Before the cell's model is built: the fp32 forward is no part of the cell's memory peak."""
    key = _benchmark_key(cell)
    if key not in cache.refs:
        shape = build.resolve(cell.model).shape
        rows = inputs.rows(list(range(min(inputs.batch, AGREEMENT_ROWS))))
        cache.refs[key] = fp32_answers(cache.base_model(cell), rows, cell.task, device, shape.vocab, shape.hidden)


def on_benchmark(cache, cell: Cell, inputs, out) -> dict:
    """The measures of the cell's checked call (`out`, its output tensor) on the cell's inputs, against fp32's."""
    n = min(inputs.batch, AGREEMENT_ROWS)
    got = answers(out[:n], cell.task, inputs.lengths[:n])
    return {**measures(got, cache.refs[_benchmark_key(cell)], cell.task), "agreement_inputs": "benchmark"}


def sentences(cache, cell: Cell, device) -> tuple | None:
    """The packaged sentences as the cell's model's inputs and fp32's answers on them, kept per worker; None where
    the model has no usable tokenizer (a preset: random weights). Before the cell's model is built, as the
    reference is."""
    key = cell.model_key()
    if key not in cache.sentences:
        ref = build.resolve(cell.model)
        inputs = sentence_inputs(ref)
        cache.sentences[key] = None if inputs is None else (inputs, fp32_answers(
            cache.base_model(cell), inputs, cell.task, device, ref.shape.vocab, ref.shape.hidden))
    return cache.sentences[key]


def on_sentences(cache, cell: Cell, backend, model, device) -> dict | None:
    """The measures of the cell's model as `backend` prepares it, on the packaged sentences (sentences() first);
    None where the backend cannot run their shape. Call before the cell's own preparation: what the sentences'
    preparation allocated is freed and the cell's memory peak restarted."""
    inputs, want = cache.sentences[cell.model_key()]
    key = (cell.model_key(), cell.backend, cell.dtype, cell.quant, cell.compile_mode)
    if key not in cache.agreements:
        dev.set_matmul_precision(cell.dtype)
        probe = replace(cell, batch=inputs.batch, seq=inputs.input_ids.shape[1], seq_stdev=0.0, embeddings=True,
                        first_call_budget=True)  # the fused engine tunes the sentences' shape as a server would
        try:
            prepared = backend.prepare(model, inputs.to(device), probe)
            got = answers(output_tensor(prepared.fn(), cell.task), cell.task, inputs.lengths)
            if prepared.release is not None:
                prepared.release()
            del prepared
            cache.agreements[key] = {**measures(got, want, cell.task), "agreement_inputs": "sentences"}
        except Unsupported:  # the cell itself may still run: it is judged by its rel_err then
            cache.agreements[key] = None
        finally:
            dev.free_memory(device)
            memory.restart_peak(device)
    return cache.agreements[key]
