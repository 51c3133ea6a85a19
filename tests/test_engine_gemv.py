"""engine/gemv.py: act(LayerNorm(x) W^T + b) [+ residual] of a few rows in one kernel, against torch in fp32: with and
without the LayerNorm, each activation, the residual, no bias; one to eight rows, widths not a power of two (200,
1600, 2304) and a vocabulary-sized output (50,257 columns), each config."""
import pytest
import torch
import torch.nn.functional as F

from op_cases import cases, randn, rel, run, tol

# (rows, out, in): one row and odd counts; widths 200 and 1,600 (hidden sizes not a power of two), gpt2's QKV
# (2,304 x 768), FC2 (768 x 3,072) and head (50,257 x 768)
SHAPES = cases(cpu=[(1, 40, 200), (3, 24, 96)],
               gpu=[(1, 2304, 768), (1, 768, 3072), (4, 4096, 1024), (3, 200, 200), (8, 1600, 1600), (5, 96, 2000), (1, 1600, 6400),
                    (1, 50257, 768)])
# (LayerNorm, activation, residual, bias): the four forms a GPT-2 decode step runs (QKV and head, output
# projection and FC2, FC1 with each GELU), a projection without bias, and LayerNorms without weights (GPT-2's
# ln_1 and ln_2, whose gamma and beta are folded into QKV and FC1: weights.fold)
FORMS = [(True, 0, False, True), (False, 0, True, True), (True, 1, False, True), (True, 2, False, True),
         (False, 0, False, False), ("bare", 0, False, True), ("bare", 2, False, False)]


def check_gemv(device, dtype, M, N, K):
    from transbench.engine.gemv import configs, gemv
    x, w, b = randn(device, dtype, M, K, scale=2.0, seed=1), randn(device, dtype, N, K, scale=K**-0.5, seed=2), \
        randn(device, dtype, N, seed=3)
    r, g, gb = randn(device, dtype, M, N, seed=4), randn(device, dtype, K, seed=5), randn(device, dtype, K, seed=6)
    x = x + 3.0  # a mean far from 0: what a one-pass variance would lose
    x[-1] += 500.0  # mean about 250 times the spread: the kernel's statistics are of the row less its first value
    cfgs = configs(M, K)
    assert cfgs, M
    # every form and every config, each config in one form (forms and configs in turn): a kernel compiles apart
    # for each pair, and the interpreter is slow
    pairs = range(max(len(cfgs), len(FORMS)) if device == "cuda" else len(FORMS))
    for i in pairs:
        (ln, act, res, bias), cfg = FORMS[i % len(FORMS)], cfgs[i % len(cfgs)]
        bare = ln == "bare"
        h = F.layer_norm(x.float(), (K,), None if bare else g.float(), None if bare else gb.float(), 1e-5) \
            if ln else x.float()
        ref = F.linear(h, w.float(), b.float() if bias else None)
        ref = F.gelu(ref) if act == 1 else F.gelu(ref, approximate="tanh") if act == 2 else ref
        ref = ref + r.float() if res else ref
        norm = (None, None, 1e-5) if bare else (g, gb, 1e-5) if ln else None
        out = gemv(x, w, b if bias else None, act, r if res else None, norm, cfg)
        assert out.shape == (M, N) and out.dtype == dtype
        assert rel(out, ref) < tol(device, dtype), (ln, act, res, bias, cfg, rel(out, ref))


@pytest.mark.parametrize("device,dtype,M,N,K", SHAPES)
def test_gemv(device, dtype, M, N, K):
    run(check_gemv, device, dtype, M, N, K)


def test_gemv_refuses_what_it_cannot_run():
    pytest.importorskip("triton", reason="Triton is not installed (it is part of the [test] extra on Linux)")
    from transbench.engine.gemv import MAX_ROWS, gemv, supported
    w = torch.zeros(8, 16, dtype=torch.float16)
    assert not supported(torch.zeros(MAX_ROWS + 1, 16, dtype=torch.float16), w)  # the GEMMs' rows
    assert not supported(torch.zeros(2, 16), w)  # fp32 input
    assert not supported(torch.zeros(1, 9000, dtype=torch.float16), torch.zeros(8, 9000, dtype=torch.float16))
    with pytest.raises(ValueError, match="not supported"):
        gemv(torch.zeros(2, 15, dtype=torch.float16), w, None)  # K differs
    with pytest.raises(ValueError, match="not supported"):
        gemv(torch.zeros(2, 16, dtype=torch.float16), w, None, residual=torch.zeros(2, 9, dtype=torch.float16))


def test_torch_norm_linear_is_the_layernorm_then_the_projection():
    """ops.TorchOps.norm_linear, the reference the GPU routes are checked against and what runs on the CPU: each
    form a GPT-2 decode step uses."""
    from transbench.engine.ops import Linear, Norm, TorchOps
    g = torch.Generator().manual_seed(0)
    x, r = torch.randn(3, 16, generator=g), torch.randn(3, 8, generator=g)
    lin, norm = Linear(torch.randn(8, 16, generator=g), torch.randn(8, generator=g)), \
        Norm(torch.randn(16, generator=g), torch.randn(16, generator=g), 1e-5)
    h = F.layer_norm(x, (16,), norm.weight, norm.bias, 1e-5)
    ops = TorchOps()
    torch.testing.assert_close(ops.norm_linear(x, lin, norm), F.linear(h, lin.weight, lin.bias))
    torch.testing.assert_close(ops.norm_linear(x, lin, norm, "exact"), F.gelu(F.linear(h, lin.weight, lin.bias)))
    torch.testing.assert_close(ops.norm_linear(x, lin, norm, "tanh"),
                               F.gelu(F.linear(h, lin.weight, lin.bias), approximate="tanh"))
    torch.testing.assert_close(ops.norm_linear(x, lin, residual=r), F.linear(x, lin.weight, lin.bias) + r)
    # every part at once, as the GEMV's epilogue applies them: the activation, then the residual
    torch.testing.assert_close(ops.norm_linear(x, lin, norm, "exact", r), F.gelu(F.linear(h, lin.weight, lin.bias)) + r)


def test_fold_norm_is_the_layernorms_weights_through_the_projection():
    """LayerNorm(x) W^T + b == rstd ((x - mean) gamma W^T) + W beta + b: fold_norm's two vectors are W gamma and
    W beta + b (fp32), without a bias too; and ops keeps them on the Linear for its Norm, anew for another."""
    pytest.importorskip("triton", reason="Triton is not installed (it is part of the [test] extra on Linux)")
    from transbench.engine.gemv import fold_norm
    from transbench.engine.ops import Linear, Norm, norm_sums
    w, b = randn("cpu", torch.float16, 6, 10, seed=1), randn("cpu", torch.float16, 6, seed=2)
    gamma, beta = randn("cpu", torch.float16, 10, seed=3), randn("cpu", torch.float16, 10, seed=4)
    wg, wb = fold_norm(w, b, gamma, beta)
    assert wg.dtype == wb.dtype == torch.float32 and wg.shape == wb.shape == (6,)
    torch.testing.assert_close(wg, w.float() @ gamma.float())
    torch.testing.assert_close(wb, w.float() @ beta.float() + b.float())
    torch.testing.assert_close(fold_norm(w, None, gamma, beta)[1], w.float() @ beta.float())
    wg, wb = fold_norm(w, b, None, None)  # a LayerNorm without weights: gamma 1, beta 0
    torch.testing.assert_close(wg, w.float().sum(1))
    torch.testing.assert_close(wb, b.float())
    lin, n1, n2 = Linear(w, b), Norm(gamma, beta, 1e-5), Norm(beta, gamma, 1e-5)
    first = norm_sums(lin, n1)
    assert norm_sums(lin, n1)[0] is first[0]  # kept
    torch.testing.assert_close(norm_sums(lin, n2)[0], w.float() @ beta.float())  # another Norm: made anew


# (rows, K): the warps a program may have. K of 256 or less: one warp (a thread holds 8 of a row's values); gpt2's 768
# and gpt2-medium's 1,024: up to 4; 4,096 at 4 rows: 8 or more, for the slice to fit in registers.
WARPS = {(1, 40): {1}, (3, 200): {1}, (1, 768): {1, 2, 4}, (4, 1024): {2, 4}, (4, 4096): {8, 16}, (8, 1600): {8}}


@pytest.mark.parametrize("M,K", list(WARPS))
def test_configs_keep_every_thread_on_a_vector_of_each_row_and_in_registers(M, K):
    # Past one warp, a program whose threads outnumber the 8-wide vectors of a row has Triton spread warps over the
    # rows, and the weight slice is re-laid out through shared memory after the wait (gemv.py's kernel says why).
    pytest.importorskip("triton", reason="Triton is not installed (it is part of the [test] extra on Linux)")
    from transbench.engine.gemv import CONFIGS, configs
    got = configs(M, K)
    assert {w for _, w in got} == WARPS[M, K]
    assert got == [c for c in CONFIGS if c in got]  # CONFIGS' order: tuning.rule_route takes the first
