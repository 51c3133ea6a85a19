"""tests/test_engine_configs.py's odd configs and inputs on CUDA, through the engine's GPU kernels (the Triton
embedding kernel fed RoBERTa's id-numbered positions, packing with the pooler's first-token check), in fp16 and
fp32 against transformers in fp32."""
import pytest
import torch

pytest.importorskip("triton", reason="the engine's GPU path needs Triton")
from test_engine_configs import MATCH, REFUSED_INPUTS, rel  # noqa: E402

from transbench.engine import EngineUnsupported, compile_model  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

# fp32 on the GPU runs TF32 GEMMs; fp16 carries a 10-bit mantissa through 2 layers.
TOLERANCE = {torch.float32: 5e-3, torch.float16: 1e-2}


@pytest.mark.parametrize("dtype", list(TOLERANCE))
@pytest.mark.parametrize("name", MATCH)
def test_engine_matches_transformers_on_cuda(name, dtype):
    torch.manual_seed(0)
    build, inputs = MATCH[name]
    model = build().eval().cuda()
    ids, mask = inputs()
    ids, mask = ids.cuda(), None if mask is None else mask.cuda()
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask)
    out = compile_model(model, dtype=dtype)(input_ids=ids, attention_mask=mask)
    for key in ("last_hidden_state", "pooler_output", "logits"):
        if getattr(ref, key, None) is not None:
            per_token = mask is not None and ref[key].shape[:mask.dim()] == mask.shape
            assert rel(out[key].float(), ref[key], mask if per_token else None) < TOLERANCE[dtype], key


@pytest.mark.parametrize("name", REFUSED_INPUTS)
def test_inputs_the_engine_cannot_match_are_refused_on_cuda(name):
    torch.manual_seed(0)
    build, inputs, reason = REFUSED_INPUTS[name]
    compiled = compile_model(build().eval().cuda(), dtype=torch.float16)
    ids, mask = inputs()
    with pytest.raises(EngineUnsupported, match=reason):
        compiled(input_ids=ids.cuda(), attention_mask=mask.cuda())
