"""engine/packing.py: make_packing's two Triton launches (mask_counts, pack_rows) against its torch ops (the path
off CUDA), which must agree exactly: every index, count and mask, for ragged masks with an all-padding row and a
left-padded one, all-ones masks, random masks and strided views, in several mask dtypes. On the GPU through
make_packing itself, past PACK_MAX_S (S = 8200) and PACK_MAX_TOKENS (2048 x 200) too, where it takes the torch ops."""
import pytest
import torch

from op_cases import cases, run

# (batch, seq); the dtype is the mask's
SHAPES = cases(cpu=[(1, 1), (1, 128), (5, 77), (3, 16), (300, 20)],
               gpu=[(1, 128), (8, 128), (7, 77), (300, 33), (2, 8192), (2, 8200), (2048, 200)],
               cpu_dtypes=(torch.int32, torch.bool, torch.float32), gpu_dtypes=(torch.int64, torch.bool, torch.float16))


def masks(B: int, S: int) -> dict:
    g = torch.Generator().manual_seed(B * S)
    lengths = torch.randint(0, S + 1, (B,), generator=g)
    ragged = torch.arange(S)[None, :] < lengths[:, None]
    if B > 1:
        ragged[1] = False  # an all-padding row
    left = 2 if B > 2 else 0
    ragged[left] = ragged[left].flip(0)  # left padding
    if B == 1 and S > 1:
        ragged[0, S - 1] = False  # padding at batch 1 too
    return {"ragged": ragged, "all real": torch.ones(B, S, dtype=torch.bool),
            "random": torch.rand(B, S, generator=g) < 0.7, "strided view": ragged.t().contiguous().t()}


def check_packing(device, dtype, B, S):
    from transbench.engine.packing import make_packing, mask_counts, pack_rows
    for name, mask in masks(B, S).items():
        m = mask.to(dtype)
        for bucket in (1, 16) if device == "cpu" else (1, 16, 128):  # interpreted launches are slow
            ref = make_packing(m, B, S, bucket)  # the torch ops (a CPU mask)
            if device == "cuda":
                out = make_packing(m.cuda(), B, S, bucket)
                assert (out.dense, out.tokens, out.max_len, out.first_padded) == (
                    ref.dense, ref.tokens, ref.max_len, ref.first_padded), (name, bucket)
                for field in ("gidx", "sidx", "cu", "mask"):
                    a, b = getattr(out, field), getattr(ref, field)
                    assert (a is None and b is None) or torch.equal(a.cpu(), b), (name, bucket, field)
                continue
            # the interpreter: make_packing's CUDA path, its two kernels, by hand on the CPU mask
            real = m.ne(0)
            cu, counts = mask_counts(m)
            n = int(real.sum())
            assert counts.tolist() == [n, int(real[:, 0].sum())], (name, counts)
            assert cu[: B + 1].tolist() == [0, *real.sum(1).cumsum(0).tolist()], (name, cu)
            assert ref.dense == (n == B * S), name
            if not ref.dense:
                gidx, sidx, packed = pack_rows(m, cu, n, ref.tokens)
                for field, a in (("gidx", gidx), ("sidx", sidx), ("mask", packed), ("cu", cu)):
                    assert torch.equal(a, getattr(ref, field)), (name, bucket, field)


@pytest.mark.parametrize("device,dtype,B,S", SHAPES)
def test_packing_kernels_equal_the_torch_ops(device, dtype, B, S):
    run(check_packing, device, dtype, B, S)
