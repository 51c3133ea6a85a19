"""engine/decode_attention.py: one new token per sequence written into the KV cache at pos and attended over
positions 0..pos, against ops.TorchOps.decode_attention: positions at the cache's start, inside its first chunk, past
it and at its end; head sizes 24, 25 and 40 among them."""
import pytest
import torch

from op_cases import cases, randn, rel, run, tol

# (batch, heads, cache length, head size)
SHAPES = cases(cpu=[(2, 3, 300, 24)], gpu=[(1, 12, 640, 64), (4, 25, 1024, 64), (3, 5, 200, 40), (2, 4, 130, 25)])


def check_decode_attention(device, dtype, B, H, L, D):
    from transbench.engine.decode_attention import decode_attention
    from transbench.engine.ops import TorchOps
    for i, pos in enumerate((0, 5, 77, L - 1)):
        qkv = randn(device, dtype, B, 3 * H * D, seed=3 * i)
        kc, vc = randn(device, dtype, B, H, L, D, seed=3 * i + 1), randn(device, dtype, B, H, L, D, seed=3 * i + 2)
        want = [kc.float(), vc.float()]
        p = torch.tensor([pos], device=device)
        ref = TorchOps().decode_attention(qkv.float(), want[0], want[1], p, D**-0.5)
        out = decode_attention(qkv, kc, vc, p, D**-0.5)
        assert rel(out, ref) < tol(device, dtype), (pos, rel(out, ref))
        # the new k and v at pos, nothing else touched
        assert torch.equal(kc.float(), want[0]) and torch.equal(vc.float(), want[1]), pos


@pytest.mark.parametrize("device,dtype,B,H,L,D", SHAPES)
def test_decode_attention(device, dtype, B, H, L, D):
    run(check_decode_attention, device, dtype, B, H, L, D)
