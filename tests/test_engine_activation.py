"""engine/activation.py: bias + GELU (exact and tanh forms) in place after a GEMM, against torch."""
import pytest
import torch.nn.functional as F

from op_cases import DTYPES, cases, randn, rel, run, tol

# (rows, width, tanh form): widths past one 1,024-column block (6400) and not a power of two (100, 1000)
SHAPES = cases(cpu=[(n, w, t) for n, w in [(3, 96), (33, 100)] for t in (False, True)],
               gpu=[(n, w, t) for n, w in [(1, 1536), (7, 3072), (333, 4096), (1025, 6400), (5, 1000)]
                    for t in (False, True)], cpu_dtypes=DTYPES)


def check_bias_gelu(device, dtype, T, N, tanh):
    from transbench.engine.activation import bias_gelu
    x, b = randn(device, dtype, T, N, scale=3.0), randn(device, dtype, N, seed=1)
    ref = F.gelu(x.float() + b.float(), approximate="tanh" if tanh else "none")
    out = bias_gelu(x.clone(), b, tanh)
    assert out.shape == x.shape and out.dtype == dtype
    assert rel(out, ref) < tol(device, dtype), rel(out, ref)


@pytest.mark.parametrize("device,dtype,T,N,tanh", SHAPES)
def test_bias_gelu(device, dtype, T, N, tanh):
    run(check_bias_gelu, device, dtype, T, N, tanh)
