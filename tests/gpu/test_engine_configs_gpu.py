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
    kw = inputs()  # (ids, mask), or the call's arguments (labels, a QA head's positions), as the CPU test reads them
    kw = kw if isinstance(kw, dict) else dict(zip(("input_ids", "attention_mask"), kw))
    kw = {k: v.cuda() for k, v in kw.items() if v is not None}
    mask = kw.get("attention_mask")
    with torch.no_grad():
        ref = model(**kw)
    out = compile_model(model, dtype=dtype)(**kw)
    for key in ("last_hidden_state", "pooler_output", "logits", "start_logits", "end_logits", "loss"):
        if getattr(ref, key, None) is not None:
            per_token = mask is not None and ref[key].shape[:mask.dim()] == mask.shape
            assert rel(out[key].float(), ref[key], mask if per_token else None) < TOLERANCE[dtype], key


@pytest.mark.parametrize("name", REFUSED_INPUTS)
def test_inputs_the_engine_cannot_match_are_refused_on_cuda(name):
    torch.manual_seed(0)
    build, inputs, reason = REFUSED_INPUTS[name]
    compiled = compile_model(build().eval().cuda(), dtype=torch.float16)
    kw = inputs()  # (ids, mask), or the call's arguments (labels, inputs_embeds), as the CPU test reads them
    kw = kw if isinstance(kw, dict) else dict(zip(("input_ids", "attention_mask"), kw))
    kw = {k: v.cuda().half() if v.is_floating_point() and k == "inputs_embeds" else v.cuda() for k, v in kw.items()}
    with pytest.raises(EngineUnsupported, match=reason):
        compiled(**kw)
    with pytest.raises(EngineUnsupported, match=reason):  # a fixed call (a benchmark's) too
        compiled.fixed_call(**kw)()


def test_argument_checks_and_generator_ownership_on_cuda():
    """tests/test_api.py's argument checks on a CUDA model (compile_model, generator) and a generator's
    graphs on CUDA: a newer generator of one shape owns the KV cache, an older one must prefill again; its
    greedy tokens match transformers' fp32 ones for the first steps."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_embd=128, n_layer=2, n_head=4, vocab_size=300, n_positions=64)).eval().cuda()
    for kw, needle in (({"dtype": None}, "dtype must be a torch dtype"), ({"dtype": 16}, "dtype must be a torch dtype")):
        with pytest.raises(ValueError, match=needle):
            compile_model(model, **kw)
    with pytest.raises(ValueError, match="hf_model must be a transformers model"):
        compile_model(None, dtype=torch.float16)
    fast = compile_model(model, dtype=torch.float16, max_batch=2, max_seq=32)
    for args, needle in (((0, 8), "batch_size must be a whole number of at least 1, got 0"),
                         (("1", 8), "batch_size must be a whole number"), ((1, 0), "max_total_len must be a whole")):
        with pytest.raises(ValueError, match=needle):
            fast.generator(*args)
    gen = fast.generator(2, 24)
    with pytest.raises(ValueError, match="decode before prefill"):
        gen.decode(torch.tensor([1, 2], device="cuda"))
    ids = torch.randint(0, 300, (2, 8), device="cuda")
    with torch.no_grad():
        logits = gen.prefill(ids)
        ref = model(input_ids=ids).logits[:, -1]
        assert rel(logits.float(), ref) < 1e-2
        gen.decode(logits.argmax(-1))
        fast.generator(2, 24).prefill(ids)  # a newer generator of the shape owns the cache now
        with pytest.raises(ValueError, match="holds another sequence now"):
            gen.decode(logits.argmax(-1))
