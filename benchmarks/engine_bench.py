"""Development benchmark of transbench.engine against transformers on one GPU (random weights, fp16).

Times with CUDA events after warm-up (median of many); checks each output against an fp32 reference.
  PYTHONPATH=src python benchmarks/engine_bench.py [--quick] [--parts bert-base,profile,pdl,refine,call,...]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch
from transformers import BertConfig, BertModel, GPT2Config, GPT2LMHeadModel

from transbench.engine import EngineOptions, compile_model
from transbench.engine.tuning import replay_ms

# Under programmatic dependent launch a kernel's profiler span includes its wait for the previous one: the spans
# would overlap and their sum overstate the work, so the engines profiled (_kernel_table) run without it.
NO_PDL = EngineOptions(pdl=False)
SHAPES = {"bert-base": (12, 768, 12), "bert-large": (24, 1024, 16)}


def bench(fn, budget_s=0.25, min_reps=5, max_reps=200) -> float:
    """Median ms of fn() over CUDA-event-timed repetitions, after warm-up."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    reps = int(min(max_reps, max(min_reps, budget_s / max(time.perf_counter() - t0, 1e-6))))
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for a, b in ev:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in ev)


def rel(out, ref, mask=None):
    out, ref = out.double(), ref.double()
    if mask is not None:
        out, ref = out[mask.bool()], ref[mask.bool()]
    return ((out - ref).norm() / ref.norm()).item()


def graphed(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn(), fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def bert(name, attn="sdpa"):
    L, H, nh = SHAPES[name]
    cfg = BertConfig(hidden_size=H, num_hidden_layers=L, num_attention_heads=nh, intermediate_size=4 * H,
                     attn_implementation=attn)
    with torch.device("cuda"):
        return BertModel(cfg).eval()


def flops(L, H, S):
    return L * (24 * S * H * H + 4 * S * S * H)


@torch.inference_mode()
def encoders(name, batches, seqs, fp8=False):
    L, H, _ = SHAPES[name]
    ref32 = bert(name)
    sdpa16 = bert(name).half()
    sdpa16.load_state_dict(ref32.state_dict())
    eager16 = bert(name, "eager").half()
    eager16.load_state_dict(ref32.state_dict())
    eng = compile_model(sdpa16, dtype=torch.float16, max_batch=max(batches), fp8=fp8)
    print(f"\n## {name} encoders-only fp16{' fp8' if fp8 else ''} (ms, median; engine seq/s and TFLOPS)", flush=True)
    print(f"{'B':>4} {'S':>4} | {'eager':>8} {'sdpa':>8} {'sdpa+g':>8} {'engine':>8} | {'seq/s':>9} {'TFLOPS':>7}"
          f" {'xbest':>6} | rel_err eager/sdpa/engine", flush=True)
    for S in seqs:
        for B in batches:
            x = torch.randn(B, S, H, device="cuda", dtype=torch.float16)
            r = {}
            r["eager"] = bench(lambda: eager16.encoder(x))
            r["sdpa"] = bench(lambda: sdpa16.encoder(x))
            g = graphed(lambda: sdpa16.encoder(x))
            r["sdpa+g"] = bench(g.replay)
            del g
            r["engine"] = bench(lambda: eng.encode(x))
            n = min(B, 8)  # rows are independent: an fp32 reference of the first few is enough
            ref = ref32.encoder(x[:n].float()).last_hidden_state
            errs = [rel(eager16.encoder(x[:n]).last_hidden_state, ref), rel(sdpa16.encoder(x[:n]).last_hidden_state, ref),
                    rel(eng.encode(x)[:n], ref)]
            best_hf = min(r["eager"], r["sdpa"], r["sdpa+g"])
            ms = r["engine"]
            print(f"{B:>4} {S:>4} | {r['eager']:8.3f} {r['sdpa']:8.3f} {r['sdpa+g']:8.3f} {ms:8.3f} | "
                  f"{B / ms * 1e3:9.0f} {flops(L, H, S) * B / ms / 1e9:7.1f} {best_hf / ms:6.2f} | "
                  + "/".join(f"{e:.1e}" for e in errs), flush=True)
            torch.cuda.empty_cache()
    torch.cuda.empty_cache()


@torch.inference_mode()
def varlen(name, cases):
    L, H, _ = SHAPES[name]
    m = bert(name).half()
    eng = compile_model(m, dtype=torch.float16)
    print(f"\n## {name} varlen (lengths uniform in [0.2, 1.0] x max, mean ~0.6) vs padded, full model fp16", flush=True)
    print(f"{'B':>4} {'S':>4} | {'mean':>5} {'padded ms':>10} {'varlen ms':>10} {'speedup':>8} {'hf-sdpa mask ms':>16} | rel_err", flush=True)
    for B, S in cases:
        g = torch.Generator().manual_seed(B * S)
        ids = torch.randint(0, 30000, (B, S), generator=g).cuda()
        lens = (S * (0.2 + 0.8 * torch.rand(B, generator=g))).long().clamp(1, S)
        mask = (torch.arange(S)[None] < lens[:, None]).long().cuda()
        full = torch.ones_like(mask)
        t_pad = bench(lambda: eng(ids, attention_mask=full))
        t_var = bench(lambda: eng(ids, attention_mask=mask))
        t_hf = bench(lambda: m(ids, attention_mask=mask))
        n = min(B, 8)
        ref = bert(name)
        ref.load_state_dict(m.state_dict())
        err = rel(eng(ids, attention_mask=mask).last_hidden_state[:n],
                  ref(ids[:n], attention_mask=mask[:n]).last_hidden_state, mask[:n])
        del ref
        print(f"{B:>4} {S:>4} | {lens.float().mean().item() / S:5.2f} {t_pad:10.3f} {t_var:10.3f} "
              f"{t_pad / t_var:8.2f} {t_hf:16.3f} | {err:.1e}", flush=True)
    # The host sync that sizes packed batches: cost of passing an all-ones mask instead of none at batch 1.
    ids = ids[:1, :128].contiguous()
    t_none = bench(lambda: eng(ids))
    t_ones = bench(lambda: eng(ids, attention_mask=torch.ones_like(ids)))
    print(f"1x128 full model: no mask {t_none:.3f} ms, all-ones mask {t_ones:.3f} ms", flush=True)


@torch.inference_mode()
def generation(prompt_len=512, new_tokens=128):
    with torch.device("cuda"):
        ref32 = GPT2LMHeadModel(GPT2Config(attn_implementation="sdpa")).eval()
    m = GPT2LMHeadModel(GPT2Config(attn_implementation="sdpa")).cuda().half().eval()
    m.load_state_dict(ref32.state_dict())
    eng = compile_model(m, dtype=torch.float16)
    ids = torch.randint(0, 50257, (1, prompt_len), device="cuda")
    gen = eng.generator(1, prompt_len + new_tokens)
    t_pre = bench(lambda: gen.prefill(ids))
    t_hf_pre = bench(lambda: m(ids, use_cache=True))
    logits = gen.prefill(ids)
    err = rel(logits, ref32(ids).logits[:, -1])
    nxt = logits.argmax(-1)
    starts, ends = [], []
    for _ in range(new_tokens):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        logits = gen.decode(nxt)
        nxt = logits.argmax(-1)
        b.record()
        starts.append(a), ends.append(b)
    torch.cuda.synchronize()
    dec = statistics.median(a.elapsed_time(b) for a, b in zip(starts[8:], ends[8:]))  # first steps capture graphs
    # HF decode step: eager with its DynamicCache (what transformers.generate runs per token).
    out = m(ids, use_cache=True)
    past, tok = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
    hf_times = []
    for _ in range(32):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        out = m(tok, past_key_values=past, use_cache=True)
        past, tok = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        b.record()
        hf_times.append((a, b))
    torch.cuda.synchronize()
    hf_dec = statistics.median(a.elapsed_time(b) for a, b in hf_times[4:])
    replay = bench(gen.graphs.entries["decode"].graph.replay)  # the step's GPU work alone, no host round trip
    print(f"\n## gpt2 generation batch 1, prompt {prompt_len}, {new_tokens} new tokens (fp16)", flush=True)
    print(f"prefill: engine {t_pre:.3f} ms, HF sdpa {t_hf_pre:.3f} ms | decode: engine {dec:.3f} ms/token "
          f"(its graph replay alone {replay:.3f} ms), HF sdpa eager {hf_dec:.3f} ms/token | prefill logits rel_err "
          f"{err:.1e}", flush=True)
    eng = compile_model(m, dtype=torch.float16, cuda_graphs=False, options=NO_PDL)
    gen = eng.generator(1, prompt_len + new_tokens)
    nxt = gen.prefill(ids).argmax(-1)
    _kernel_table("gpt2 decode step at position 512", lambda: gen.decode(nxt), 5)


@torch.inference_mode()
def pdl_effect(name, shapes, rounds=5):
    """The engine with and without programmatic dependent launch (same tuned routes; graphs captured each way),
    timed in alternation so clock drift cannot favour either, and whether the outputs are bit-identical. The graph replay
    alone is timed: the figures of benchmarks/results/fused_h100_2026-11.md (programmatic dependent launch) timed
    encode(), input copy and output clone included."""
    print(f"\n## programmatic dependent launch on / off: {name} encoders-only and gpt2 decode, fp16 "
          f"(ms, median of {rounds} alternating medians)", flush=True)
    modes = {"pdl (shipped)": EngineOptions(), "pdl, no prefetch": EngineOptions(prefetch_max_m=0),
             "off": EngineOptions(pdl=False, prefetch_max_m=0)}

    def compare(label, make):  # make(options) -> (graph replay to time, its output)
        runs = {}
        for mode, options in modes.items():  # each mode compiles its own kernels and captures its own graphs
            runs[mode] = make(options)
        samples = {m: [] for m in modes}
        for _ in range(rounds):  # alternate: a mode timed first in every round would carry any warm-up drift
            for m in modes:
                samples[m].append(bench(runs[m][0]))
        t = {m: statistics.median(v) for m, v in samples.items()}
        same = all(torch.equal(runs[m][1], runs["off"][1]) for m in modes)
        print(f"{label:>22}  " + "  ".join(f"{m} {v:7.3f}" for m, v in t.items()) + f"  bit-identical: {same}",
              flush=True)

    _engine_cases(name, shapes, compare)


@torch.inference_mode()
def tuned_modes(name, shapes, title, modes, rounds=5):
    """The engine in each of `modes` (name -> its EngineOptions), each tuning from an empty table of
    its own and capturing its own graphs, then timed in alternation (graph replay). Prints the routes that differ
    between the first two modes and how far the outputs are apart (different kernels: not bit-identical)."""
    from transbench.engine import tuning

    print(f"\n## {title}: {name} encoders-only, gpt2 decode, fp16 (ms, median of {rounds} alternating medians)",
          flush=True)

    def compare(label, make):  # make(options) -> (graph replay to time, its output)
        runs, tables = {}, {}
        for mode, options in modes.items():
            tuner = tuning.Tuner(Path(tempfile.mkdtemp()) / "tuning.json")
            t0 = time.perf_counter()
            runs[mode] = make(replace(options, tuner=tuner))
            tables[mode] = dict(tuner.table)
            print(f"{label:>22}  {mode}: tuned and captured in {time.perf_counter() - t0:.1f} s", flush=True)
        samples = {mode: [] for mode in runs}
        for _ in range(rounds):
            for mode in runs:
                samples[mode].append(bench(runs[mode][0]))
        t = {mode: statistics.median(v) for mode, v in samples.items()}
        a, b = list(runs)[:2]
        print(f"{label:>22}  " + "  ".join(f"{mode} {v:7.4f}" for mode, v in t.items())
              + f"  outputs apart: {rel(runs[b][1], runs[a][1]):.1e}", flush=True)
        for key in sorted(set(tables[a]) | set(tables[b])):
            if tables[a].get(key) != tables[b].get(key):
                print(f"{'':>24}{key.split('|', 2)[-1]:50s} {tables[a].get(key)} -> {tables[b].get(key)}")

    _engine_cases(name, shapes, compare)


def refine_effect(name, shapes):
    """Routes chosen by timing each op alone vs settled in the whole captured forward (EngineOptions.refine)."""
    tuned_modes(name, shapes, "routes settled alone vs in the whole forward",
                {"alone": EngineOptions(refine=False), "refined": EngineOptions(refine=True)})


def _engine_cases(name, shapes, compare):
    """compare(label, make) for the encoder of each (batch, seq) and a gpt2 decode step at position 512:
    make(options) builds the engine anew with those EngineOptions and returns (its captured graph's replay, the
    output)."""
    H = SHAPES[name][1]
    m = bert(name).half()
    for B, S in shapes:
        x = torch.randn(B, S, H, device="cuda", dtype=torch.float16)

        def encoder(options):
            eng = compile_model(m, dtype=torch.float16, max_batch=B, options=options)
            out = eng.encode(x)
            return next(iter(eng.engine.graphs.entries.values())).graph.replay, out
        compare(f"{B} x {S}", encoder)
    gpt = GPT2LMHeadModel(GPT2Config(attn_implementation="sdpa")).cuda().half().eval()
    ids = torch.randint(0, 50257, (1, 512), device="cuda")

    def decoder(options):
        gen = compile_model(gpt, dtype=torch.float16, options=options).generator(1, 640)
        nxt = gen.prefill(ids).argmax(-1)
        out = gen.decode(nxt)
        return gen.graphs.entries["decode"].graph.replay, out
    compare("gpt2 decode step @512", decoder)


@torch.inference_mode()
def call_cost(name, shapes):
    """Where a synchronized call's time goes beyond the GPU work, timed as transbench times a cell (CUDA events
    around one call on an idle device, then a synchronize; measure.timer.sample): the captured graph replayed
    back to back, the same graph replayed once from idle, engine.encode, and the whole call the fused backend
    makes (HF-style outputs, pooler); then the host time to enqueue that call, without synchronizing."""
    from transbench.measure.timer import TimerConfig, sample

    cfg, dev = TimerConfig(min_time_s=0.3, min_count=50), torch.device("cuda")
    med = lambda fn: statistics.median(sample(fn, dev, cfg))  # noqa: E731
    tiny = torch.zeros(1, device="cuda")
    g = graphed(lambda: tiny.add_(1))
    print(f"\n## one synchronized call, {name} encoders-only fp16 (ms, median): a one-kernel graph from idle "
          f"{med(g.replay):.4f}", flush=True)
    m = bert(name).half()
    for B, S in shapes:
        eng = compile_model(m, dtype=torch.float16, max_batch=B)
        ids = torch.randint(1, 30000, (B, S), device="cuda")
        eng.backbone.fixed_embeddings = m.embeddings(input_ids=ids)
        types = torch.zeros_like(ids)
        call = lambda: eng(input_ids=ids, attention_mask=None, token_type_ids=types)  # noqa: E731
        call()
        replay = next(iter(eng.engine.graphs.entries.values())).graph.replay
        host = []
        for _ in range(200):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            call()
            host.append((time.perf_counter() - t0) * 1e3)
        torch.cuda.synchronize()
        print(f"{B:>4} x {S:<4} replay back to back {replay_ms(replay):.4f} | from idle: replay {med(replay):.4f}, "
              f"encode {med(lambda: eng.engine.encode(eng.backbone.fixed_embeddings)):.4f}, whole call {med(call):.4f}"
              f" | host enqueue of the call {statistics.median(host):.4f}", flush=True)


@torch.inference_mode()
def profile(name, shapes, fp8=False):
    """Where the engine's GPU time goes (eager engine, kernels grouped by kind), per forward."""
    L, H, _ = SHAPES[name]
    m = bert(name).half()
    eng = compile_model(m, dtype="fp8" if fp8 else torch.float16, cuda_graphs=False, options=NO_PDL)
    for B, S in shapes:
        x = torch.randn(B, S, H, device="cuda", dtype=torch.float16)
        _kernel_table(f"{name} {B}x{S}{' fp8' if fp8 else ''}", lambda: eng.encode(x), 5)


def _kernel_table(title, fn, reps):
    """GPU kernel time per fn() call, grouped by kind, and the top kernels (profiler, engine without graphs, built
    with NO_PDL)."""
    from collections import defaultdict

    from torch.profiler import ProfilerActivity, profile as prof

    kinds = [("attention", ("flash", "fmha", "cudnn", "attention", "attn")), ("triton gemm", ("_linear_kernel", "_linear_splitk")),
             ("layernorm", ("_add_layernorm",)), ("bias+gelu", ("_bias_gelu",)),
             ("quantize", ("_quantize_rows",)),
             ("gemm", ("gemm", "xmma", "cutlass", "nvjet", "splitk", "gemv"))]  # first match wins
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with prof(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    per, names, count = defaultdict(float), defaultdict(float), 0
    for e in p.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t <= 0 or e.key.startswith("cuda") or "Activity Buffer" in e.key:
            continue
        kind = next((k for k, pats in kinds if any(q in e.key.lower() for q in pats)), "other")
        per[kind] += t / reps / 1e3
        names[e.key[:60]] += t / reps / 1e3
        count += e.count
    tot = sum(per.values())
    print(f"\n## profile {title} (engine without graphs or PDL): kernels {tot:.3f} ms, {count / reps:.0f} kernels "
          "per call", flush=True)
    print("  " + " | ".join(f"{k} {v:.3f} ms ({v / tot:.0%})" for k, v in sorted(per.items(), key=lambda kv: -kv[1])))
    for k, v in sorted(names.items(), key=lambda kv: -kv[1])[:10]:
        print(f"  {v:8.3f} ms  {k}")


@torch.inference_mode()
def timeline(name, B, S, fp8=True, reps=10):
    """graph_timeline of a bert encoders-only forward."""
    L, H, _ = SHAPES[name]
    eng = compile_model(bert(name).half(), dtype="fp8" if fp8 else torch.float16, max_batch=B)
    x = torch.randn(B, S, H, device="cuda", dtype=torch.float16)
    eng.encode(x), eng.encode(x)
    graph_timeline(f"{name} {B}x{S}{' fp8' if fp8 else ''}", next(iter(eng.engine.graphs.entries.values())).graph,
                   reps)


GPT2_SIZES = {"gpt2": GPT2Config(), "gpt2-medium": GPT2Config(n_embd=1024, n_layer=24, n_head=16)}


def decode_bytes(m, B, pos):
    """(weights, KV cache) bytes a decode step of gpt2-family `m` at batch B and position `pos` reads: the weights
    as generation cells count them (scenarios/generation/measure.weight_bytes), K and V of every layer up to pos."""
    from transbench.scenarios.generation.measure import weight_bytes

    c = m.config
    return weight_bytes(m), 2 * c.n_layer * B * pos * c.n_embd * m.dtype.itemsize


@torch.inference_mode()
def timeline_decode(model, B, prompt, reps=20):
    """graph_timeline of a gpt2-family decode step at position `prompt` (fp16, random weights), with the HBM
    bandwidth its weights and KV cache would take alone: what the step's floor is."""
    cfg = GPT2_SIZES[model]
    m = GPT2LMHeadModel(cfg).cuda().half().eval()
    eng = compile_model(m, dtype=torch.float16)
    gen = eng.generator(B, prompt + 64)
    nxt = gen.prefill(torch.randint(0, cfg.vocab_size, (B, prompt), device="cuda")).argmax(-1)
    for _ in range(4):  # the first steps tune and capture
        nxt = gen.decode(nxt).argmax(-1)
    graph = gen.graphs.entries["decode"].graph
    weights, kv = decode_bytes(m, B, prompt + 4)
    graph_timeline(f"{model} decode step, batch {B} at position {prompt} (weights {weights / 1e6:.0f} MB, KV read "
                   f"{kv / 1e6:.1f} MB)", graph, reps)


def decode_step(model, B, prompt, steps=100):
    """A gpt2-family decode step at batch B after `prompt` tokens (fp16, random weights, tuned unbudgeted as
    `transbench tune` does): its captured graph's replay alone at position prompt; a plain loop of `steps`
    back-to-back decode() calls and their argmax between two CUDA events (host included; positions prompt to prompt +
    steps), then as many decode_greedy() calls (the argmax in the step's graph, as a generation cell runs); the HBM
    bandwidth the step's weights and KV cache take at the replay's time against the device's; the kernels in the
    graph; and the last step's logits against fp32 transformers over the same tokens, with the greedy tokens'
    agreement."""
    from types import SimpleNamespace

    from transbench.scenarios.generation.measure import decode_bandwidth

    cfg = GPT2_SIZES[model]
    with torch.device("cuda"):
        ref = GPT2LMHeadModel(cfg).eval()
    m = GPT2LMHeadModel(cfg).cuda().half().eval()
    m.load_state_dict(ref.state_dict())
    eng = compile_model(m, dtype=torch.float16)
    gen = eng.generator(B, prompt + steps + 16)
    ids = torch.randint(0, cfg.vocab_size, (B, prompt), device="cuda")
    nxt, toks = gen.prefill(ids).argmax(-1), []
    for _ in range(8):  # the first step tunes and captures
        toks.append(nxt)
        logits = gen.decode(nxt)
        nxt = logits.argmax(-1)
    full = torch.cat([ids, torch.stack(toks, 1)], 1)
    want = ref(full).logits[:, -1].float()
    err, agree = rel(logits.float(), want), (logits.argmax(-1) == want.argmax(-1)).float().mean().item()
    entry = gen.graphs.entries["decode"]
    graph = entry.graph
    with torch.inference_mode():  # the graph reads the generator's position tensor
        gen.pos_t.fill_(prompt)
    replay = replay_ms(graph.replay)
    gen.pos = prompt + 8
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(steps):
        nxt = gen.decode(nxt).argmax(-1)
    b.record()
    torch.cuda.synchronize()
    loop = a.elapsed_time(b) / steps
    gen.pos = prompt + 8  # the same positions again, the argmax in the step's graph (what a generation cell runs)
    gen.decode_greedy(nxt)
    gen.pos = prompt + 8
    a.record()
    for _ in range(steps):
        nxt = gen.decode_greedy(nxt)
    b.record()
    torch.cuda.synchronize()
    greedy = a.elapsed_time(b) / steps
    weights, kv = decode_bytes(m, B, prompt)
    gpu = SimpleNamespace(name=torch.cuda.get_device_name(),
                          memory_gb=torch.cuda.get_device_properties(0).total_memory / 2**30)
    bw = decode_bandwidth(weights + kv, replay, gpu)
    gbs, frac = bw["decode_gbs"], bw["decode_hbm_share"]
    share = f" = {frac:.0%} of {gbs / frac:,.0f}" if frac else ""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
        graph.replay()
        torch.cuda.synchronize()
    kernels = sum(1 for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    print(f"\n## decode {model} batch {B} at position {prompt}: replay {replay:.4f} ms, plain loop of {steps} decode() "
          f"calls {loop:.4f} ms/token (decode_greedy() calls {greedy:.4f}), {kernels} kernels, HBM {gbs:,.0f} "
          f"GB/s{share} (weights {weights / 1e6:.0f} MB, "
          f"KV {kv / 1e6:.1f} MB); last step's logits rel_err {err:.2e} against fp32, argmax agreement {agree:.0%}",
          flush=True)
    for key, route in sorted((gen.info["engine_tuning"].get("decode") or {}).get("routes", {}).items()):
        print(f"  {key[:80]:80s} {route}")
    eng = compile_model(m, dtype=torch.float16, cuda_graphs=False, options=NO_PDL)  # the routes tuned above
    gen = eng.generator(B, prompt + 16)
    nxt = gen.prefill(ids).argmax(-1)
    _kernel_table(f"{model} decode step, batch {B} at position {prompt}", lambda: gen.decode(nxt), 5)


def gemv_chains(layers=24):
    """Each decode projection of gpt2 (batch 1) and gpt2-medium (batch 4) alone: `layers` launches of one config in a
    CUDA graph (PDL on), each on its own weights so every launch reads them from HBM as a step does, replayed back to
    back; us a launch and the weights' GB/s, every GEMV config against cuBLAS's F.linear (the product alone, no
    LayerNorm or epilogue). A config whose output is off fp32's by more than 1e-2 prints no time."""
    from transbench.engine import gemv

    for model, B in (("gpt2", 1), ("gpt2-medium", 4)):
        h = GPT2_SIZES[model].n_embd
        for name, N, K, ln, act, res in (("qkv", 3 * h, h, True, 0, False), ("out", h, h, False, 0, True),
                                         ("fc1", 4 * h, h, True, 2, False), ("fc2", h, 4 * h, False, 0, True)):
            ws = [torch.randn(N, K, device="cuda", dtype=torch.float16) * K**-0.5 for _ in range(layers)]
            x, bias = torch.randn(B, K, device="cuda", dtype=torch.float16), torch.randn(N, device="cuda").half()
            r = torch.randn(B, N, device="cuda", dtype=torch.float16)
            g, gb = torch.rand(K, device="cuda").half() + 0.5, torch.randn(K, device="cuda").half()
            norm = (g, gb, 1e-5) if ln else None
            hx = torch.nn.functional.layer_norm(x.float(), (K,), g.float(), gb.float(), 1e-5) if ln else x.float()
            want = hx @ ws[0].float().t() + bias.float()
            want = torch.nn.functional.gelu(want, approximate="tanh") if act == 2 else want
            want = want + r.float() if res else want
            times = {}

            def chain(one):
                one(ws[0])  # compiles
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    for w in ws:
                        one(w)
                return replay_ms(graph.replay) * 1e3 / layers

            for cfg in gemv.configs(B, K):
                def one(w, cfg=cfg):
                    return gemv.gemv(x, w, bias, act, r if res else None, norm, cfg)
                if rel(one(ws[0]).float(), want) > 1e-2:
                    times["gemv" + "x".join(map(str, cfg))] = None
                    continue
                times["gemv" + "x".join(map(str, cfg))] = chain(one)
            times["cublas F.linear"] = chain(lambda w: torch.nn.functional.linear(x, w))
            floor = N * K * 2 / hbm_bytes_per_s() * 1e6
            print(f"\n## {model} {name} at {B} row(s), {N} x {K} ({N * K * 2 / 1e6:.1f} MB): us a launch in a chain of "
                  f"{layers}, HBM floor {floor:.2f} us", flush=True)
            ranked = sorted((v, k) for k, v in times.items() if v is not None)
            shown = ranked[:6] + [r for r in ranked[6:] if r[1] == "cublas F.linear" or r == ranked[-1]]
            for us, k in shown:  # the six fastest, cuBLAS, the slowest
                print(f"  {k:18s} {us:7.2f} us  {N * K * 2 / us / 1e3:7.0f} GB/s", flush=True)
            for k in (k for k, v in times.items() if v is None):
                print(f"  {k:18s} failed its check against fp32", flush=True)
            del ws


def hbm_bytes_per_s() -> float:
    """The device's datasheet HBM bandwidth (measure/peaks.py), bytes/s."""
    from transbench.measure import peaks
    row = peaks.lookup(torch.cuda.get_device_name(), torch.cuda.get_device_properties(0).total_memory / 2**30)
    return row.bandwidth_gbs * 1e9


def graph_timeline(title, graph, reps=10):
    """Where a captured graph's wall time goes beyond its kernels: the profiler's kernel spans inside graph
    replays (PDL on, as transbench runs), their union (busy) against the replay's span, the idle gaps between
    kernels and the kernels they sit between; then the SM clock and power over 3 s of back-to-back replays."""
    import json
    import threading
    from collections import defaultdict

    from torch.profiler import ProfilerActivity, profile as prof

    from transbench.measure.device import nvml_handle

    print(f"\n## timeline {title}: replay back to back {replay_ms(graph.replay):.4f} ms", flush=True)
    with prof(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(reps):
            graph.replay()
            torch.cuda.synchronize()
            time.sleep(0.002)  # each replay from idle, 2 ms apart: the gap that tells the replays apart
    path = Path(tempfile.mkdtemp()) / "trace.json"
    p.export_chrome_trace(str(path))
    ks = sorted((e["ts"], e["ts"] + e["dur"], e["name"]) for e in json.loads(path.read_text())["traceEvents"]
                if e.get("cat") == "kernel")
    if not ks:
        print("  the profiler recorded no kernel inside the graph replays")
        return
    runs, last = [], -1e18  # a gap over 1 ms splits two replays
    for k in ks:
        if k[0] - last > 1000:
            runs.append([])
        runs[-1].append(k)
        last = max(last, k[1])
    span, busy, ksum, gaps = [], [], [], defaultdict(float)
    for run in runs:
        end, b = run[0][0], 0.0
        prev = None
        for s0, e0, n in run:
            if s0 > end and prev is not None:
                gaps[f"{prev[:40]} -> {n[:40]}"] += (s0 - end) / len(runs)
            b += max(0.0, e0 - max(s0, end))
            end, prev = max(end, e0), n
        span.append((end - run[0][0]) / 1e3), busy.append(b / 1e3), ksum.append(sum(e - s for s, e, _ in run) / 1e3)
    print(f"  {len(runs)} replays, {len(ks) / len(runs):.0f} kernels each: span {statistics.median(span):.3f} ms, "
          f"busy {statistics.median(busy):.3f}, kernel spans summed {statistics.median(ksum):.3f} (overlap under PDL)")
    print(f"  idle between kernels {statistics.median(span) - statistics.median(busy):.3f} ms per replay; largest:")
    for k, v in sorted(gaps.items(), key=lambda kv: -kv[1])[:8]:
        print(f"    {v:7.1f} us  {k}")
    per = defaultdict(lambda: [0.0, 0])  # kernel name -> [us per replay, launches per replay]
    for s0, e0, n in ks:
        per[n[:60]][0] += (e0 - s0) / len(runs)
        per[n[:60]][1] += 1 / len(runs)
    print("  kernels by time per replay (spans, with their PDL waits):")
    for n, (us, c) in sorted(per.items(), key=lambda kv: -kv[1][0])[:10]:
        print(f"    {us:8.1f} us  x{c:4.0f}  {n}")
    nv, h = nvml_handle(torch.cuda.current_device())
    if nv is None:
        return
    samples, stop = [], threading.Event()

    def watch():
        while not stop.wait(0.05):
            samples.append((nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM), nv.nvmlDeviceGetPowerUsage(h) / 1e3))
    t = threading.Thread(target=watch)
    t.start()
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < 3:
        for _ in range(10):
            graph.replay()
        torch.cuda.synchronize()
        n += 10
    stop.set(), t.join()
    ms = (time.perf_counter() - t0) * 1e3 / n
    late = samples[len(samples) // 2:]
    print(f"  3 s of replays: {ms:.3f} ms each; last half: SM clock {min(c for c, _ in late)}-"
          f"{max(c for c, _ in late)} MHz, power {statistics.median(w for _, w in late):.0f} W", flush=True)


@torch.inference_mode()
def gemms():
    """The engine's GEMM routes per bert-base shape: cuBLAS (+ separate GELU) vs each Triton config, GPU time
    from CUDA-graph replays (tuning._gpu_ms), TFLOPS and weight GB/s. (Triton 3.6's warp specialisation of
    the tile loop ran no faster on an H100, 2026-11-23: on Hopper the GELU epilogue still runs between tiles.)"""
    from transbench.engine import activation, gemm
    from transbench.engine.tuning import _gpu_ms

    print("\n## GEMM routes (us per call, graph-replayed; TFLOPS; weight GB/s)", flush=True)
    for M, N, K in [(32768, 3072, 768), (32768, 768, 3072), (32768, 2304, 768), (128, 2304, 768), (128, 3072, 768),
                    (128, 768, 3072), (3072, 3072, 768), (1, 3072, 768)]:
        x = torch.randn(M, K, device="cuda", dtype=torch.float16)
        w = torch.randn(N, K, device="cuda", dtype=torch.float16) / K**0.5
        b = torch.randn(N, device="cuda", dtype=torch.float16)
        ref = torch.nn.functional.gelu(x.float() @ w.float().t() + b.float())
        cands = {"cublas": lambda: torch.nn.functional.linear(x, w, b),
                 "cublas+gelu": lambda: activation.bias_gelu(torch.nn.functional.linear(x, w), b, False)}
        for cfg in gemm.CONFIGS:
            cands[f"triton{cfg} none"] = lambda cfg=cfg: gemm.linear(x, w, b, 0, cfg=cfg)
            cands[f"triton{cfg} gelu"] = lambda cfg=cfg: gemm.linear(x, w, b, 1, cfg=cfg)
        rows = []
        for name, fn in cands.items():
            try:
                us = _gpu_ms(fn, 20) * 1e3
                err = rel(fn(), ref) if "gelu" in name else float("nan")
                rows.append((us, name, err))
            except Exception as e:  # noqa: BLE001 - a config this Triton cannot build
                rows.append((float("inf"), name, f"{type(e).__name__}: {str(e)[:80]}"))
        print(f"M={M} N={N} K={K}", flush=True)
        shown = sorted(rows, key=lambda r: r[0])[:8] + [r for r in rows if r[1].startswith("cublas")]
        for us, name, err in dict.fromkeys(shown):
            print(f"  {us:9.1f} us {2 * M * N * K / us / 1e6:7.1f} TFLOPS {N * K * 2 / us / 1e3:7.0f} GB/s  {name}  "
                  f"{err if isinstance(err, str) else f'{err:.1e}'}", flush=True)


@torch.inference_mode()
def routes(rows_list=(1, 128, 1024)):
    """Every route the engine's ops offer for bert-base's (and gpt2's) four GEMMs at few rows, each timed alone
    (tuning._gpu_ms, graph-replayed), fastest first: the ten fastest and the cuBLAS ones."""
    from transbench.engine import ops
    from transbench.engine.tuning import _gpu_ms

    class TimeEvery:  # stands in for the tuner: times every candidate, prints them, returns the fastest
        def choose(self, key, cands):
            times = {}
            for name, fn in cands.items():
                try:
                    times[name] = _gpu_ms(fn, 20) * 1e3
                except Exception as e:  # noqa: BLE001 - a config this Triton or GPU cannot build
                    print(f"    {name}: {type(e).__name__}")
            ranked = sorted(times, key=times.get)
            shown = dict.fromkeys(ranked[:10] + [n for n in ranked if "cublas" in n])
            print(f"  {key}", flush=True)
            for n in shown:
                print(f"    {times[n]:8.2f} us  {n}", flush=True)
            return ranked[0]

    t = ops.TritonOps(tuner=TimeEvery())
    print("\n## bert-base GEMM routes alone (us)", flush=True)
    for M in rows_list:
        f16 = dict(device="cuda", dtype=torch.float16)
        lin = lambda n, k: ops.Linear(torch.randn(n, k, **f16) / k**0.5, torch.randn(n, **f16))  # noqa: E731
        norm = ops.Norm(torch.randn(768, **f16), torch.randn(768, **f16), 1e-12)
        x, inner, res = torch.randn(M, 768, **f16), torch.randn(M, 3072, **f16), torch.randn(M, 768, **f16)
        t.linear(x, lin(2304, 768))
        t.linear_add_layernorm(x, lin(768, 768), res, norm)
        t.linear_gelu(x, lin(3072, 768), "exact")
        t.linear_add_layernorm(inner, lin(768, 3072), res, norm)


@torch.inference_mode()
def fp8_gemms():
    """The fp8 MLP's first GEMM with bias, GELU and the e4m3 output in its epilogue (gemm.linear_fp8), per tile
    config and with no activation (what the epilogue's GELU costs), against torch._scaled_mm alone (fp16 output,
    no bias) and the route it replaces (_scaled_mm, then the bias + GELU + quantize pass): ms and TFLOPS."""
    from transbench.engine import gemm, quantize
    from transbench.engine.ops import fp8_bounds, quantize_rows

    extra = [(128, 256, 128, 3, 8, True, False), (128, 128, 128, 5, 8, True, False), (256, 128, 128, 3, 8, True, True)]
    print("\n## fp8 GEMM + GELU + e4m3 epilogue (ms, TFLOPS)", flush=True)
    for M, N, K in [(32768, 3072, 768), (49152, 4096, 1024)]:
        torch.manual_seed(0)
        x8, xs = quantize_rows(torch.randn(M, K, device="cuda"))
        w8, ws = quantize_rows(torch.randn(N, K, device="cuda") * K**-0.5)
        ws = ws.t().contiguous()
        b = torch.randn(N, device="cuda", dtype=torch.float16)
        gain, bias_max = fp8_bounds(w8, ws, b)
        tf = 2 * M * N * K / 1e9

        def line(label, ms):
            print(f"  {M}x{N}x{K} {label:42s} {ms:7.4f} ms {tf / ms:7.1f} TFLOPS", flush=True)

        def scaled():
            return torch._scaled_mm(x8, w8.t(), scale_a=xs, scale_b=ws, out_dtype=torch.float16)
        line("_scaled_mm (fp16 out)", bench(scaled))
        line("_scaled_mm + bias/GELU/quantize pass", bench(lambda: quantize.quantize_rows(scaled(), b, 1)))
        for cfg in gemm.FP8_CONFIGS + extra:
            for act in (1, 0):
                try:
                    ms = bench(lambda: gemm.linear_fp8(x8, xs, w8, ws, b, gain, bias_max, act, cfg=cfg))
                except Exception as e:  # noqa: BLE001 - a config this GPU refuses (shared memory) is reported
                    print(f"  {cfg} act {act}: {type(e).__name__} {str(e)[:80]}")
                    continue
                line(f"{'x'.join(map(str, cfg))} {'gelu' if act else 'none'}", ms)


def quant_kernels():
    """The per-token fp8 quantize pass (bias + GELU + e4m3 of the fp8 MLP's middle, quantize.quantize_rows) against
    a plain bias + GELU pass and the LayerNorm at the same rows: GB/s of each, and the pass's variants (warps per
    row, libdevice erf or activation.erf, rows per program) to see what bounds it (1.27 TB/s, against 3 TB/s for the
    LayerNorm: benchmarks/results/fp8_engine_h100_2026-11.md)."""
    import triton
    import triton.language as tl

    from transbench.engine import activation, gemm, layernorm, quantize
    from transbench.engine.tuning import _gpu_ms

    @triton.jit
    def variant(X, BIAS, Q, QS, M, N, ROWS: tl.constexpr, BLOCK: tl.constexpr, FAST: tl.constexpr):
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        cols = tl.arange(0, BLOCK)
        m = (rows < M)[:, None] & (cols < N)[None, :]
        offs = rows.to(tl.int64)[:, None] * N + cols[None, :]
        x = tl.load(X + offs, mask=m, other=0.0).to(tl.float32)
        x += tl.load(BIAS + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
        if FAST:
            x = 0.5 * x * (1.0 + activation.erf(x * 0.7071067811865476))
        else:
            x = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
        scale = tl.maximum(tl.max(tl.abs(tl.where(m, x, 0.0)), 1) / 448.0, 1e-12 / 448.0)
        tl.store(Q + offs, (x / scale[:, None]).to(Q.dtype.element_ty), mask=m)
        tl.store(QS + rows, scale, mask=rows < M)

    print("\n## fp8 quantize pass (us, GB/s)", flush=True)
    for M, N in [(32768, 3072), (49152, 4096), (32768, 768)]:
        x = torch.randn(M, N, device="cuda", dtype=torch.float16)
        b = torch.randn(N, device="cuda", dtype=torch.float16)
        xg = x.clone()
        moved = M * N * 3  # read fp16, write e4m3
        q = torch.empty(M, N, device="cuda", dtype=torch.float8_e4m3fn)
        qs = torch.empty(M, 1, device="cuda", dtype=torch.float32)
        ref_q, ref_s = quantize.quantize_rows(x, b, gemm.ACT_GELU)
        cands = {"package quantize_rows": (lambda: quantize.quantize_rows(x, b, gemm.ACT_GELU), moved),
                 "bias_gelu fp16 (in place, on a copy)": (lambda: activation.bias_gelu(xg, b, False), M * N * 4),
                 "add_layernorm+fp8 (768 wide)": (lambda: layernorm.add_layernorm(
                     x[:, :768].contiguous(), None, None, b[:768], b[:768], 1e-12, quant=True), M * 768 * 5)}
        block = triton.next_power_of_2(N)
        for rows in (1, 2, 4):
            for warps in (4, 8, 16):
                for fast in (False, True):
                    def launch(rows=rows, warps=warps, fast=fast):
                        variant[(triton.cdiv(M, rows),)](x, b, q, qs, M, N, ROWS=rows, BLOCK=block, FAST=fast,
                                                         num_warps=warps)
                    cands[f"rows={rows} warps={warps} erf={'A&S' if fast else 'libdevice'}"] = (launch, moved)
        print(f"M={M} N={N}", flush=True)
        rows_out = []
        for name, (fn, nbytes) in cands.items():
            try:
                us = _gpu_ms(fn, 20) * 1e3
            except Exception as e:  # noqa: BLE001 - a variant this Triton cannot build
                print(f"  {name}: {type(e).__name__}: {str(e)[:80]}")
                continue
            rows_out.append((us, name, nbytes / us / 1e3))
            if name.startswith("rows"):  # same e4m3 codes as the package kernel (up to a rounding step)
                err = (q.float() * qs - ref_q.float() * ref_s).abs().max().item()
                rows_out[-1] += (err,)
        for r in sorted(rows_out)[:10] + [r for r in rows_out if not r[1].startswith("rows")]:
            print(f"  {r[0]:8.1f} us {r[2]:7.0f} GB/s  {r[1]}" + (f"  max|diff| {r[3]:.2e}" if len(r) > 3 else ""),
                  flush=True)


def attention_kernels():
    """The attention routes at the fp8 targets' shapes: SDPA's kernels, ours, ours writing the output projection's
    e4m3 input instead (attention.triton_attention bound=...), and cuDNN or ours followed by a quantize pass, in us
    and GB/s (of an fp16 output's bytes read + written, so the e4m3 route's figure is comparable, not its own
    traffic)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from transbench.engine import attention, quantize
    from transbench.engine.ops import AttnBound
    from transbench.engine.tuning import _gpu_ms

    def table(title, cands, nbytes, rounds=3):
        # Every variant compiled and run first, then timed in alternating rounds (median), so that none is timed
        # on clocks that dropped while the GPU sat idle during a compile.
        print(title, flush=True)
        for name, fn in list(cands.items()):
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - a variant this GPU refuses
                print(f"  {name}: {type(e).__name__}: {str(e)[:80]}")
                del cands[name]
        torch.cuda.synchronize()
        times = {name: [] for name in cands}
        for _ in range(rounds):
            for name, fn in cands.items():
                times[name].append(_gpu_ms(fn, 20) * 1e3)
        for us, name in sorted((statistics.median(v), n) for n, v in times.items()):
            print(f"  {us:8.1f} us {nbytes / us / 1e3:7.0f} GB/s  {name}", flush=True)

    print("\n## attention kernels", flush=True)
    for B, S, H in [(256, 128, 12), (128, 384, 16)]:
        D, T = 64, B * S
        qkv = torch.randn(T, 3 * H * D, device="cuda", dtype=torch.float16)
        q, k, v = qkv.view(B, S, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)

        def sdpa(backend):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, scale=0.125).transpose(1, 2).reshape(T, -1)
        cands = {"sdpa flash": lambda: sdpa(SDPBackend.FLASH_ATTENTION),
                 "sdpa cudnn": lambda: sdpa(SDPBackend.CUDNN_ATTENTION),
                 "sdpa cudnn + quantize pass": lambda: quantize.quantize_rows(sdpa(SDPBackend.CUDNN_ATTENTION))}
        # the e4m3 route's bound as a forward gives it: here every V value of row r is at most 448 * x_scale[r]
        bound = AttnBound(v.float().abs().amax(dim=(1, 3)).reshape(-1, 1) / 448, 1.0, 0.0)
        for cfg in attention.ATTENTION_CONFIGS + [(128, 128, 8), (64, 128, 4)]:
            cands[f"ours {cfg}"] = lambda cfg=cfg: attention.triton_attention(qkv, B, S, H, 0.125, False, cfg)
            cands[f"ours e4m3 {cfg}"] = lambda cfg=cfg: attention.triton_attention(qkv, B, S, H, 0.125, False, cfg,
                                                                                  bound)
        cands["ours (64, 64, 4) + quantize pass"] = lambda: quantize.quantize_rows(
            attention.triton_attention(qkv, B, S, H, 0.125, False))
        ref = sdpa(SDPBackend.CUDNN_ATTENTION).float()
        q8, qs = attention.triton_attention(qkv, B, S, H, 0.125, False, bound=bound)
        print(f"{B}x{S} heads {H}: e4m3 route, dequantized, rel_err {rel(q8.float() * qs, ref):.2e}")
        table(f"attention {B}x{S}x{H}x{D}", cands, T * H * D * 2 * 4)  # read q, k, v; write out


def attention_sweep():
    """Our attention kernel (fp16 output) per tile config and pipeline depth at bert-large's fp8 target shape
    (128 x 384 x 16 heads), against cuDNN: the ten fastest, us (graph-replayed, median of alternating rounds)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from transbench.engine import attention
    from transbench.engine.tuning import _gpu_ms

    B, S, H, D = 128, 384, 16, 64
    qkv = torch.randn(B * S, 3 * H * D, device="cuda", dtype=torch.float16)
    q, k, v = qkv.view(B, S, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, scale=0.125).transpose(1, 2).reshape(B * S, -1)
    cands = {"cudnn": cudnn}
    for bm in (64, 128):
        for bn in (32, 64, 128):
            for warps in (4, 8):
                for stages in (1, 2, 3, 4):
                    cfg = (bm, bn, warps, stages)
                    cands[str(cfg)] = lambda cfg=cfg: attention.triton_attention(qkv, B, S, H, 0.125, False, cfg)
    ref = cudnn().float()
    for name, fn in list(cands.items()):
        try:
            assert rel(fn(), ref) < 1e-2
        except Exception as e:  # noqa: BLE001 - a config this GPU refuses (shared memory) is left out
            print(f"  {name}: {type(e).__name__}: {str(e)[:80]}")
            del cands[name]
    times = {name: [] for name in cands}
    for _ in range(3):
        for name, fn in cands.items():
            times[name].append(_gpu_ms(fn, 20) * 1e3)
    print(f"\n## attention configs {B}x{S}x{H}x{D} (BM, BN, warps, stages), us", flush=True)
    for us, name in sorted((statistics.median(v), n) for n, v in times.items())[:10]:
        print(f"  {us:8.1f} us  {name}", flush=True)


PARTS = ("bert-base", "bert-large", "gemm", "routes", "bert-large-target", "varlen", "generate", "profile", "call",
         "timeline", "timeline-1x128", "timeline-large", "refine", "refine-large", "pdl", "fp8", "profile-fp8", "quant",
         "fp8gemm", "attn", "attn-sweep", "timeline-decode", "decode", "gemv")


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a few points only")
    ap.add_argument("--parts", default="bert-base,generate,varlen,profile,bert-large,fp8",
                    help=f"run in this order, any of: {','.join(PARTS)}")
    a = ap.parse_args(argv)
    unknown = sorted(set(a.parts.split(",")) - set(PARTS))
    if unknown:  # before any GPU work: a typo must not cost a device call
        ap.error(f"unknown part {', '.join(unknown)} (choose from {', '.join(PARTS)})")
    torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 reference stays fp32
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    batches, seqs = ([1, 256], [128]) if a.quick else ([1, 8, 64, 256], [128, 384, 512])
    for part in a.parts.split(","):
        if part == "bert-base":
            encoders(part, batches, seqs)
        elif part == "bert-large":
            encoders(part, batches if a.quick else [1, 8, 64, 128, 256], seqs)
        elif part == "gemm":
            gemms()
        elif part == "routes":
            routes()
        elif part == "bert-large-target":
            encoders("bert-large", [128], [384])
        elif part == "varlen":
            varlen("bert-base", [(64, 512), (256, 128), (16, 512)])
        elif part == "generate":
            generation()
        elif part == "profile":
            profile("bert-base", [(1, 128), (256, 128)])
            profile("bert-large", [(128, 384)])
        elif part == "quant":
            quant_kernels()
        elif part == "fp8gemm":
            fp8_gemms()
        elif part == "attn":
            attention_kernels()
        elif part == "attn-sweep":
            attention_sweep()
        elif part == "profile-fp8":
            profile("bert-base", [(256, 128)], fp8=True)
            profile("bert-large", [(128, 384)], fp8=True)
        elif part == "timeline":
            timeline("bert-base", 256, 128)
        elif part == "timeline-1x128":
            timeline("bert-base", 1, 128, fp8=False)
        elif part == "timeline-large":
            timeline("bert-large", 128, 384)
        elif part == "timeline-decode":
            timeline_decode("gpt2", 1, 512)
            timeline_decode("gpt2-medium", 4, 256)
            timeline("bert-base", 1, 128, fp8=False)
        elif part == "decode":
            decode_step("gpt2", 1, 512)
            decode_step("gpt2-medium", 4, 256)
        elif part == "gemv":
            gemv_chains()
        elif part == "call":
            call_cost("bert-base", [(1, 128), (8, 128), (1, 512), (8, 512)])
        elif part == "refine":
            refine_effect("bert-base", [(1, 128), (8, 128), (1, 512), (8, 512)])
        elif part == "refine-large":
            refine_effect("bert-large", [(1, 128), (8, 512), (128, 384)])
        elif part == "pdl":
            pdl_effect("bert-base", [(1, 128), (8, 128), (1, 512), (8, 512)])
        elif part == "fp8" and torch.cuda.get_device_capability() >= (8, 9):
            encoders("bert-base", [1, 256], [128], fp8=True)
    from transbench.engine.tuning import tuner
    print("\n## routes the tuner chose")
    for key, choice in sorted(tuner().table.items()):
        print(f"  {key.split('|', 2)[-1]:60s} {choice}")


if __name__ == "__main__":
    main()
