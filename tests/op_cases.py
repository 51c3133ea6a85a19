"""Shared by the engine's per-op test files (tests/test_engine_<op>.py): each check runs on the CPU in Triton's
interpreter and, where CUDA is, on the GPU, from the same test function.

Triton decides at kernel definition whether a kernel is interpreted (TRITON_INTERPRET=1), so the CPU runs happen in
one worker process started with it set, before anything there imports the engine; the check function travels there
by name (its test module) with plain arguments. Interpreted kernels are slow: the CPU cases are a few small shapes
(odd ones among them), the GPU cases more and at real sizes. Whole-model engine tests share random_norms,
bare_norms and greedy_feed_steps."""
from __future__ import annotations

import atexit
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

import pytest
import torch

DTYPES = (torch.float16, torch.bfloat16)
GPU = (pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))
_pool: ProcessPoolExecutor | None = None


def cases(cpu, gpu, cpu_dtypes=(torch.float16,), gpu_dtypes=DTYPES) -> list:
    """pytest params (device, dtype, *case): each CPU case in each cpu_dtype, each GPU case (marked gpu) in each
    gpu_dtype. A case is a tuple of plain values (shapes, flags)."""
    out = []
    for device, shapes, dtypes, marks in (("cpu", cpu, cpu_dtypes, ()), ("cuda", gpu, gpu_dtypes, GPU)):
        for case in shapes:
            for dtype in dtypes:
                name = "-".join(str(v) for v in (device, str(dtype).removeprefix("torch."), *case))
                out.append(pytest.param(device, dtype, *case, marks=marks, id=name))
    return out


def _interpret() -> None:
    os.environ["TRITON_INTERPRET"] = "1"
    torch.set_num_threads(1)  # the machine's cores are shared; the interpreter is numpy on one core anyway


def _worker() -> ProcessPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=_interpret)
        atexit.register(_pool.shutdown)
    return _pool


def run(check, device: str, *args) -> None:
    """check(device, *args): on "cpu" in the interpreter worker (its exception raised here), else in this process.
    check must be a module-level function of a test module and assert with messages (the worker's asserts are
    not rewritten by pytest)."""
    if device == "cpu":
        pytest.importorskip("triton", reason="Triton is not installed (it is part of the [test] extra on Linux)")
        return _worker().submit(check, device, *args).result(timeout=900)
    return check(device, *args)


def randn(device, dtype, *shape, scale=1.0, seed=0) -> torch.Tensor:
    """Normal values made on the CPU from `seed` (the same on every device), in dtype on device."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)


def rel(out, ref, mask=None) -> float:
    """Relative error (Frobenius) of out against ref, in float64; inf where out is not finite."""
    out, ref = out.double().cpu(), ref.double().cpu()
    if mask is not None:
        out, ref = out[mask.bool().cpu()], ref[mask.bool().cpu()]
    return ((out - ref).norm() / ref.norm()).item() if torch.isfinite(out).all() else float("inf")


def tol(device: str, dtype: torch.dtype) -> float:
    """Relative error allowed an fp16/bf16 output against its fp32 reference: the interpreter's small fp16 cases
    land near 3e-4; real sizes on the GPU, and bf16 (an 8-bit mantissa), up to a few 1e-3."""
    return 2e-3 if device == "cpu" and dtype == torch.float16 else 1e-2


def e4m3_off(q, qs, ref, device) -> float:
    """The kernel's e4m3 rows against ops.quantize_rows of the fp32 reference: the scales to fp32 rounding (checked
    here), every code within one e4m3 step (the two divisions may land either side of a rounding tie), and the
    fraction of codes that differ at all, returned."""
    from transbench.engine.ops import quantize_rows
    rq, rs = quantize_rows(ref.float().cpu())
    q, qs, ref = q.float().cpu(), qs.cpu(), ref.float().cpu()
    assert rel(qs, rs) < 1e-6, rel(qs, rs)
    d = (q - rq.float()).abs()
    if device == "cpu":
        # Triton 3.9's interpreter rounds a value just under a power of two (124.3 -> 64, not 128) when its mantissa
        # carries into the exponent; the GPU's cvt does not. Those elements are left out on the CPU.
        r = rq.float().abs()
        carry = (r == 2.0 ** torch.log2(r.clamp(min=1e-30)).round()) & ((ref / rs).abs() < r)
        d = torch.where(carry, 0.0, d)
    step = (rq.float().abs() * 2.0**-3).clamp(min=2.0**-9)
    assert (d <= step * 1.01).all(), "an e4m3 code more than one step off"
    return (d > 0).float().mean().item()


def skip_without_fp8(device: str) -> None:
    """e4m3 kernels need compute capability 8.9 (Ada/Hopper) on the GPU; the interpreter runs them anywhere."""
    if device == "cuda" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 needs compute capability 8.9+")


def residual_tile_does_not_fit(cfg) -> bool:
    """The residual's tile needs shared memory next to the output tile and the load stages; where the three
    exceed the GPU's, Triton refuses the config for the residual epilogue and the tuner skips that candidate."""
    bm, bn, bk, stages, _, _, subtile = cfg
    need = 2 * (stages * (bm + bn) * bk + 2 * bm * (bn // 2 if subtile else bn))  # fp16/bf16 bytes
    return need > torch.cuda.get_device_properties(0).shared_memory_per_block_optin


def random_norms(m):
    """m with its LayerNorms' gamma and beta drawn away from transformers' 1 and 0 (in place), so that the engine's
    fold of GPT-2's ln_1 and ln_2 into QKV and FC1 (engine/weights.fold) changes values that a test checks."""
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, torch.nn.LayerNorm):
                mod.weight.normal_(1.0, 0.5)
                mod.bias.normal_(0.0, 0.5)
    return m


def bare_norms(m):
    """m with each LayerNorm replaced (in place) by one built with bias=False, keeping its weights, or, every second
    one in module order, with elementwise_affine=False: what the engine's converter takes as 1 and 0."""
    norms = [(name, mod) for name, mod in m.named_modules() if isinstance(mod, torch.nn.LayerNorm)]
    for i, (name, mod) in enumerate(norms):
        parent = m.get_submodule(name.rsplit(".", 1)[0]) if "." in name else m
        bare = torch.nn.LayerNorm(mod.normalized_shape, mod.eps, elementwise_affine=i % 2 == 0, bias=False,
                                  device=mod.weight.device)
        if i % 2 == 0:
            bare.weight.data.copy_(mod.weight.data)
        setattr(parent, name.rsplit(".", 1)[-1], bare)
    return m


def greedy_feed_steps(gen, prompt, want) -> None:
    """Greedy steps of the GPT-2 generator `gen` (batch 2, 16 tokens) after `prompt` (2, 5), each against want(the
    tokens fed so far): the tokens a step returned given back, then changed in place, another tensor of another
    integer dtype, a decode() between, tokens of an earlier step, and a new prefill (decode_greedy reads the position
    from the step before's output only when given the tokens that step returned, at the position it left)."""
    fed = [gen.prefill(prompt).argmax(-1)]
    fed.append(gen.decode_greedy(fed[-1]))
    assert torch.equal(fed[-1], want(fed[:1]))
    with torch.inference_mode():  # (the tokens are inference tensors: changed in place only in inference mode)
        fed[-1][1] = 3  # forced in place, then given back
    fed.append(gen.decode_greedy(fed[-1]))
    assert torch.equal(fed[-1], want(fed[:2]))
    forced = torch.tensor([4, 5], dtype=torch.int32)
    fed.append(gen.decode_greedy(forced))
    fed[-2] = forced.long().to(fed[-1].device)
    assert torch.equal(fed[-1], want(fed[:3]))
    stale = fed[-1]
    fed.append(gen.decode(stale).argmax(-1))
    assert torch.equal(fed[-1], want(fed[:4]))
    fed.append(gen.decode_greedy(stale))  # taken at the generator's position, not at the one after `stale`
    fed[-2] = stale
    assert torch.equal(fed[-1], want(fed[:5])) and gen.pos == 5 + 5
    gen.prefill(prompt)
    assert torch.equal(gen.decode_greedy(fed[-1]), want(fed[-1:]))  # a new sequence: the position is the prompt's
