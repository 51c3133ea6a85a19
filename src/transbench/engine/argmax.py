"""Greedy decoding's argmax over each row of a decode step's logits, inside the step's captured graph.

torch.argmax after the step's graph cost more than the step's last kernels: on an H200 it added 19 us to a gpt2 step
at batch 1 (0.1810 ms replayed, 0.2003 with it), where this kernel added 7 us launched the same way, and the logits
clone before it 6 to 9 us more (benchmarks/results/engine_limits_h200_2026-11.md). Inside the graph, under
programmatic dependent launch, it launches while the LM head runs. Same answer as torch.argmax: the first index of
the largest value, NaN above every number. Given the step's position it also writes the next one after the tokens,
so the step's output is the next step's input (gpt2.Generator.decode_greedy). ops.TorchOps.argmax is the
reference."""
from __future__ import annotations

import torch

from .launch import jit, launch_options, pdl_enter, scratch, tl, triton

# Values a program reads per step of its loop (4 warps x 32 threads x 4), and programs a row is split over: a
# vocabulary of 50,257 is 50 programs of 1,024 values, so the read is spread over as many SMs.
BLOCK = 512
PARTS = 64


@jit
def _key(v):
    # The float's bits as an int32 that orders as the float does: negative floats' magnitude bits flipped. -0.0 is
    # first made +0.0 (torch.argmax finds them equal), and every NaN gets the largest key (it finds NaN largest).
    b = tl.where(v == 0.0, 0.0, v).to(tl.int32, bitcast=True)
    return tl.where(v != v, 2147483647, b ^ ((b >> 31) & 0x7FFFFFFF))


@jit
def _first_of_top(keys, idx, n: tl.constexpr):
    # (largest key, smallest index holding it) of n lanes; an unused lane holds the lowest key and index 2^31 - 1.
    top = tl.max(keys, 0)
    return top, tl.min(tl.where(keys == top, idx, tl.full([n], 2147483647, tl.int32)), 0)


@jit
def _argmax_kernel(X, PART, ARRIVED, OUT, POS, N, SPAN, HAS_POS: tl.constexpr, PARTS_P2: tl.constexpr,
                   BLOCK: tl.constexpr, PDL: tl.constexpr):
    # Program (row, part): its part's largest key and first index, then the row's last program to finish merges the
    # parts' in a fixed order and resets its arrival counter. PART is fp32 scratch: int32 scratch holds only
    # counters, which every kernel leaves at zero (launch.scratch).
    r, c = tl.program_id(0), tl.program_id(1)
    parts = tl.num_programs(1)
    pdl_enter(PDL)  # the logits are the previous kernel's output
    start = c * SPAN
    low = tl.full([BLOCK], -2147483648, tl.int32)
    best = low
    at = tl.full([BLOCK], 2147483647, tl.int32)
    for off in range(start, tl.minimum(start + SPAN, N), BLOCK):
        i = off + tl.arange(0, BLOCK)
        m = (i < N) & (i < start + SPAN)
        k = tl.where(m, _key(tl.load(X + r.to(tl.int64) * N + i, mask=m, other=0.0).to(tl.float32)), low)
        take = k > best  # a lane's indices rise, so a later equal key keeps the earlier index
        best = tl.where(take, k, best)
        at = tl.where(take, i, at)
    top, first = _first_of_top(best, at, BLOCK)
    part = PART + (r * parts + c) * 2
    tl.store(part, top.to(tl.float32, bitcast=True))
    tl.store(part + 1, first.to(tl.float32, bitcast=True))
    tl.debug_barrier()  # the part's two values are written before this program announces itself
    if tl.atomic_add(ARRIVED + r, 1, sem="acq_rel") == parts - 1:
        cs = tl.arange(0, PARTS_P2)
        cm = cs < parts
        keys = tl.load(PART + (r * parts + cs) * 2, mask=cm, other=0.0, cache_modifier=".cg").to(tl.int32, bitcast=True)
        idx = tl.load(PART + (r * parts + cs) * 2 + 1, mask=cm, other=0.0, cache_modifier=".cg").to(tl.int32,
                                                                                                  bitcast=True)
        top, first = _first_of_top(tl.where(cm, keys, tl.full([PARTS_P2], -2147483648, tl.int32)), idx, PARTS_P2)
        tl.store(OUT + r, first.to(tl.int64))
        if HAS_POS and r == 0:
            tl.store(OUT + tl.num_programs(0), tl.load(POS).to(tl.int64) + 1)
        tl.store(ARRIVED + r, 0)


def argmax(x: torch.Tensor, pdl: bool = True, pos: torch.Tensor | None = None) -> torch.Tensor:
    """(B, N) fp16/bf16/fp32 -> (B,) int64: the first index of each row's largest value; pos (a 1-element integer
    tensor): (B + 1,), pos + 1 after them. pdl: EngineOptions.pdl."""
    B, N = x.shape
    x = x.contiguous()
    span = triton.cdiv(triton.cdiv(N, PARTS), BLOCK) * BLOCK
    parts = triton.cdiv(N, span)
    out = torch.empty(B + (pos is not None), device=x.device, dtype=torch.int64)
    _argmax_kernel[(B, parts)](x, scratch(x.device, torch.float32, 2 * B * parts), scratch(x.device, torch.int32, B),
                               out, out if pos is None else pos, N, span, HAS_POS=pos is not None,
                               PARTS_P2=triton.next_power_of_2(parts), BLOCK=BLOCK, num_warps=4,
                               **launch_options(x.device, pdl))
    return out
