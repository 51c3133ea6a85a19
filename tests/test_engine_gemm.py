"""engine/gemm.py: the TMA GEMM with its fused epilogue (bias, exact or tanh GELU, residual) in every tile config,
and the split-K GEMM for few rows (each config twice: a counter left non-zero would corrupt only the second call),
against fp32 torch. The interpreter runs two small configs of each (the shipped tiles take minutes there)."""
import pytest
import torch
import torch.nn.functional as F

from op_cases import cases, randn, rel, residual_tile_does_not_fit, run, tol

# (M, N, K, act): act 0 also checks the residual epilogue and the GEMM without bias
# On the GPU every shape in fp16 and one in bf16 too (every config of every case is a compile and a run: the GPU
# part that runs these has ten minutes).
SHAPES = cases(cpu=[(m, n, k, a) for m, n, k in [(1, 64, 64), (77, 192, 128), (300, 128, 256)] for a in range(3)],
               gpu=[(m, n, k, a) for m, n, k in [(1, 1536, 384), (77, 3072, 768), (1000, 4096, 1024),
                                                 (4097, 6400, 1600)] for a in range(3)], gpu_dtypes=(torch.float16,)) \
    + cases(cpu=[], gpu=[(77, 3072, 768, a) for a in range(3)], gpu_dtypes=(torch.bfloat16,))
CPU_CONFIGS = [(64, 64, 64, 2, 4, True, True), (64, 32, 64, 2, 4, False, False)]
# N = 50257: a GPT-2 LM head, rows not 16-byte aligned; K = 160: the last of 4 splits gets 32 of 5 x 32
SPLITK_SHAPES = cases(cpu=[(1, 96, 128, a) for a in (0, 1)] + [(37, 64, 160, a) for a in (0, 1)],
                      gpu=[(m, n, k, a) for m, n, k in [(1, 2304, 768), (8, 50257, 768), (128, 768, 3072),
                                                        (200, 1000, 1600)] for a in range(3)],
                      gpu_dtypes=(torch.float16,)) \
    + cases(cpu=[], gpu=[(200, 1000, 1600, a) for a in range(3)], gpu_dtypes=(torch.bfloat16,))
CPU_SPLITK_CONFIGS = [(16, 32, 32, 2, 2, 4), (64, 64, 32, 4, 2, 4)]


def _case(device, dtype, M, N, K, act):
    """Operands of a linear layer, its fp32 result without activation, and with activation `act`."""
    x, w = randn(device, dtype, M, K), randn(device, dtype, N, K, scale=K**-0.5, seed=1)
    b, r = randn(device, dtype, N, seed=2), randn(device, dtype, M, N, seed=3)
    lin = x.float() @ w.float().t()
    ref = {0: lin + b.float(), 1: F.gelu(lin + b.float()), 2: F.gelu(lin + b.float(), approximate="tanh")}[act]
    return x, w, b, r, lin, ref


def check_linear(device, dtype, M, N, K, act):
    from transbench.engine import gemm
    x, w, b, r, lin, ref = _case(device, dtype, M, N, K, act)
    t = tol(device, dtype)
    for cfg in CPU_CONFIGS if device == "cpu" else gemm.CONFIGS:
        assert rel(gemm.linear(x, w, b, act, cfg=cfg), ref) < t, cfg
        if act:
            continue
        assert rel(gemm.linear(x, w, None, cfg=cfg), lin) < t, cfg
        if device == "cuda" and residual_tile_does_not_fit(cfg):
            from triton.runtime.errors import OutOfResources
            with pytest.raises(OutOfResources):
                gemm.linear(x, w, b, residual=r, cfg=cfg)
            continue
        assert rel(gemm.linear(x, w, b, residual=r, cfg=cfg), lin + b.float() + r.float()) < t, cfg


@pytest.mark.parametrize("device,dtype,M,N,K,act", SHAPES)
def test_linear_every_config(device, dtype, M, N, K, act):
    run(check_linear, device, dtype, M, N, K, act)


def check_linear_splitk(device, dtype, M, N, K, act):
    from transbench.engine import gemm
    x, w, b, r, lin, ref = _case(device, dtype, M, N, K, act)
    t = tol(device, dtype)
    for cfg in CPU_SPLITK_CONFIGS if device == "cpu" else gemm.SPLITK_CONFIGS:
        for call in range(2):
            assert rel(gemm.linear_splitk(x, w, b, act, cfg=cfg), ref) < t, (cfg, call)
        if act == 0:
            assert rel(gemm.linear_splitk(x, w, b, residual=r, cfg=cfg), lin + b.float() + r.float()) < t, cfg


@pytest.mark.parametrize("device,dtype,M,N,K,act", SPLITK_SHAPES)
def test_linear_splitk_every_config(device, dtype, M, N, K, act):
    from transbench.engine import gemm
    assert device == "cpu" or gemm.splitk_configs(M)  # the GPU shapes are ones it is offered for
    run(check_linear_splitk, device, dtype, M, N, K, act)


def test_splitk_is_offered_for_few_rows_only():
    from transbench.engine import gemm
    assert gemm.splitk_configs(37) and gemm.splitk_configs(1) and not gemm.splitk_configs(4096)
    assert all(c[0] == 16 for c in gemm.splitk_configs(1)) and not any(c[0] == 16 for c in gemm.splitk_configs(37))
