"""engine/embeddings.py: BERT's embedding block (word + position + token-type gathers, sum, LayerNorm) in one
kernel, against ops.TorchOps.embed_layernorm: positions from the row (dense) or given, token types or none."""
import pytest
import torch

from op_cases import DTYPES, cases, randn, rel, run, tol

# (batch, seq, width, vocab, positions): widths 100 and 200 are not powers of two
SHAPES = cases(cpu=[(3, 13, 100, 50, 40)], gpu=[(5, 131, n, 1000, 512) for n in (200, 768, 1024)], cpu_dtypes=DTYPES)


def check_embed_layernorm(device, dtype, B, S, N, V, P):
    from transbench.engine.embeddings import embed_layernorm
    from transbench.engine.ops import Norm, TorchOps
    word, pos, typ, w, lb = (randn(device, dtype, *s, seed=i) for i, s in enumerate([(V, N), (P, N), (2, N), (N,),
                                                                                        (N,)]))
    g = torch.Generator().manual_seed(9)
    ids, pids, tt = (torch.randint(0, n, (B * S,), generator=g).to(device) for n in (V, P, 2))
    for label, p, t in [("dense", None, None), ("positions+types", pids, tt), ("types", None, tt)]:
        ref = TorchOps().embed_layernorm(ids, word.float(), p, pos.float(), t, typ.float(),
                                         Norm(w.float(), lb.float(), 1e-12), S)
        err = rel(embed_layernorm(ids, word, p, pos, t, typ, w, lb, 1e-12, S), ref)
        assert err < tol(device, dtype), (label, err)


@pytest.mark.parametrize("device,dtype,B,S,N,V,P", SHAPES)
def test_embed_layernorm(device, dtype, B, S, N, V, P):
    run(check_embed_layernorm, device, dtype, B, S, N, V, P)
