"""engine/embeddings.py: BERT's embedding block (word + position + token-type gathers, sum, LayerNorm) in one
kernel, against ops.TorchOps.embed_layernorm: positions from the row (dense), given, or one for every row (GPT-2's
decode step), token types or none, the LayerNorm or the sum alone."""
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
    # GPT-2's decode step: one position for every row, no token types, the sum not normalised
    one = pids[:1]
    ref = TorchOps().embed_layernorm(ids, word.float(), one, pos.float(), None, None, None, S)
    err = rel(embed_layernorm(ids, word, one, pos, None, None, None, None, 0.0, S), ref)
    assert err < tol(device, dtype), ("one position, no types, no norm", err)
    assert torch.allclose(ref, word.float()[ids] + pos.float()[one]), "the reference's sum"


@pytest.mark.parametrize("device,dtype,B,S,N,V,P", SHAPES)
def test_embed_layernorm(device, dtype, B, S, N, V, P):
    run(check_embed_layernorm, device, dtype, B, S, N, V, P)
