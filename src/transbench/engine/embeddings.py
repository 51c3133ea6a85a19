"""An embedding block in one kernel: word + position (+ token-type) rows gathered, summed and (BERT) normalised."""
from __future__ import annotations

from .launch import jit, launch_options, pdl_enter, tl, triton, warps


@jit(do_not_specialize=["S"])
def _embed_layernorm_kernel(IDS, WORD, POS_IDS, POS, TT, TYPE, W, B, Y, S, N, eps, POS_STRIDE,
                            HAS_POS_IDS: tl.constexpr, HAS_TT: tl.constexpr, HAS_TYPE: tl.constexpr,
                            NORM: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    # The gathers, the sum and the LayerNorm in registers. In torch it is five to seven launches (three gathers, the
    # positions' arange, adds, the LayerNorm), which at 1 x 128 made the whole model call 1.28x the encoder layers
    # alone (0.457 vs 0.356 ms).
    pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < N
    tok = tl.load(IDS + row).to(tl.int64)
    # dense rows: position = column; a stride of 0: one position for every row (a decode step's)
    p = tl.load(POS_IDS + row * POS_STRIDE).to(tl.int64) if HAS_POS_IDS else row % S
    t = tl.load(TT + row).to(tl.int64) if HAS_TT else 0
    x = tl.load(WORD + tok * N + cols, mask=m, other=0.0).to(tl.float32)
    x += tl.load(POS + p * N + cols, mask=m, other=0.0).to(tl.float32)
    if HAS_TYPE:
        x += tl.load(TYPE + t * N + cols, mask=m, other=0.0).to(tl.float32)
    if not NORM:  # GPT-2: the sum is the residual stream; its LayerNorm runs in the projection after it
        tl.store(Y + row * N + cols, x.to(Y.dtype.element_ty), mask=m)
        return
    mean = tl.sum(x, 0) / N
    d = tl.where(m, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(d * d, 0) / N + eps)
    w = tl.load(W + cols, mask=m, other=0.0).to(tl.float32)
    b = tl.load(B + cols, mask=m, other=0.0).to(tl.float32)
    tl.store(Y + row * N + cols, (d * rstd * w + b).to(Y.dtype.element_ty), mask=m)


def embed_layernorm(ids, word, pos_ids, pos, tt, type_, weight, ln_bias, eps, S: int, pdl: bool = True):
    """LayerNorm(word[ids] + pos[pos_ids] + type_[tt]) per row of the flat (T,) ids; pos_ids None: row % S (dense
    (B, S) rows), one element: that position for every row; tt None: token type 0; type_ None: no token types;
    weight None: the sum, not normalised. ops.TorchOps.embed_layernorm is the reference. pdl: EngineOptions.pdl."""
    n = word.shape[1]
    ids, pos_ids, tt = (None if t is None else t.contiguous() for t in (ids, pos_ids, tt))
    y = word.new_empty(ids.shape[0], n)
    block = triton.next_power_of_2(n)
    _embed_layernorm_kernel[(ids.shape[0],)](
        ids, word, pos_ids if pos_ids is not None else ids, pos, tt if tt is not None else ids,
        type_ if type_ is not None else word, weight if weight is not None else word,
        ln_bias if ln_bias is not None else word, y, S, n, eps,
        int(pos_ids is not None and pos_ids.numel() > 1), HAS_POS_IDS=pos_ids is not None, HAS_TT=tt is not None,
        HAS_TYPE=type_ is not None, NORM=weight is not None, BLOCK=block, num_warps=warps(block),
        **launch_options(ids.device, pdl))
    return y
