"""engine/argmax.py: greedy decoding's argmax of each row, against torch.argmax: the first index of the largest
value across the parts a row is split over, NaN above every number, -0.0 equal to +0.0, rows of -inf; vocabularies of
odd widths (GPT-2's 50,257) in fp16, bf16 and fp32; with the step's position, the next one after the tokens."""
import pytest
import torch

from op_cases import cases, run

# (rows, width)
SHAPES = cases(cpu=[(3, 50257), (2, 700)], gpu=[(1, 50257), (4, 50257), (8, 32000), (3, 151936), (2, 5)],
               cpu_dtypes=(torch.float16, torch.float32), gpu_dtypes=(torch.float16, torch.bfloat16, torch.float32))


def _rows(device, dtype, B, N) -> torch.Tensor:
    """B random rows, then one row of each special case."""
    g = torch.Generator().manual_seed(B * N)
    x = torch.randn(B + 5, N, generator=g).to(dtype)
    n = N - 1
    x[B].fill_(1.0)                                                  # all equal: index 0
    x[B + 1, [n // 3, n]] = 9.0                                      # a tie in two parts: the earlier
    x[B + 2, [0, n // 2, n]] = torch.tensor([float("inf"), float("nan"), float("nan")]).to(dtype)  # the first NaN
    x[B + 3].fill_(float("-inf"))                                    # nothing but -inf: index 0
    x[B + 4].fill_(-1.0)
    x[B + 4, [n // 2, n]] = torch.tensor([-0.0, 0.0]).to(dtype)      # -0.0 first, equal to +0.0
    return x.to(device)


def check_argmax(device, dtype, B, N):
    from transbench.engine.argmax import argmax
    x = _rows(device, dtype, B, N)
    got, want = argmax(x), x.argmax(-1)
    assert got.dtype == torch.int64 and torch.equal(got, want), (got.tolist(), want.tolist())
    assert torch.equal(argmax(x[B + 1:B + 2]), want[B + 1:B + 2])  # one row alone
    # with the step's position (the tail of a greedy step's input, gpt2.Generator.decode_greedy): the next one after
    feed = torch.tensor([7, 8, 511], device=device)
    got = argmax(x, pos=feed[2:])
    assert torch.equal(got, torch.cat((want, torch.tensor([512], device=device)))), got.tolist()


@pytest.mark.parametrize("device,dtype,B,N", SHAPES)
def test_argmax(device, dtype, B, N):
    run(check_argmax, device, dtype, B, N)
