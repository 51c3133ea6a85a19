"""engine/decode_attention.py: one new token per sequence written into the KV cache at pos and attended over
positions 0..pos, against ops.TorchOps.decode_attention: positions at the cache's start, inside its first chunk, past
it and at its end; head sizes 24, 25, 40 and 96 among them; every config the tuner may race at the head size."""
import pytest
import torch

from op_cases import cases, randn, rel, run, tol

# (batch, heads, cache length, head size)
SHAPES = cases(cpu=[(2, 3, 300, 24)],
               gpu=[(1, 12, 640, 64), (4, 25, 1024, 64), (3, 5, 200, 40), (2, 4, 130, 25), (2, 3, 260, 96)])


def check_decode_attention(device, dtype, B, H, L, D):
    from transbench.engine.decode_attention import configs, decode_attention
    from transbench.engine.ops import TorchOps
    for i, (cfg, pos) in enumerate((cfg, pos) for cfg in configs(D) for pos in (0, 5, 77, L - 1)):
        qkv = randn(device, dtype, B, 3 * H * D, seed=3 * i)
        kc, vc = randn(device, dtype, B, H, L, D, seed=3 * i + 1), randn(device, dtype, B, H, L, D, seed=3 * i + 2)
        want = [kc.float(), vc.float()]
        p = torch.tensor([pos], device=device)
        ref = TorchOps().decode_attention(qkv.float(), want[0], want[1], p, D**-0.5)
        out = decode_attention(qkv, kc, vc, p, D**-0.5, cfg=cfg)
        assert rel(out, ref) < tol(device, dtype), (cfg, pos, rel(out, ref))
        # the new k and v at pos, nothing else touched
        assert torch.equal(kc.float(), want[0]) and torch.equal(vc.float(), want[1]), (cfg, pos)


def test_configs_fit_every_head_size():
    """Head sizes past what one warp's registers hold still get configs; one of four warps always."""
    pytest.importorskip("triton")
    from transbench.engine.decode_attention import CONFIGS, configs
    assert configs(64)[0] == CONFIGS[0] and configs(25) == CONFIGS
    assert (64, 64, 1) not in configs(96) and CONFIGS[-1] in configs(96)
    assert configs(512) == [CONFIGS[-1]]


@pytest.mark.parametrize("device,dtype,B,H,L,D", SHAPES)
def test_decode_attention(device, dtype, B, H, L, D):
    run(check_decode_attention, device, dtype, B, H, L, D)
