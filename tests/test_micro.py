"""Micro-benchmarks on CPU at tiny sizes: every command stores rows, the part costs match hand counts,
the roofline classifies fixed numbers, and bad options are one-line errors with exit code 2."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from transbench.cli import app
from transbench.errors import SpecError
from transbench.measure import device as dev
from transbench.models import flops
from transbench.models.parts import ACTIVATION_FLOPS, PARTS, attention_ffn_ratio, layer_parts
from transbench.models.presets import PRESETS
from transbench.report.roofline import attainable_tflops, bound, plot_roofline, ridge_point
from transbench.scenarios import micro
from transbench.scenarios.micro import common, gemm
from transbench.store import Store

FAST = ["--device", "cpu", "--min-time", "0.01"]


def invoke(*args):
    return CliRunner().invoke(app, ["micro", *args, *FAST])


def cells(db, scenario):
    store = Store(db)
    try:
        return [c for r in store.runs() for c in store.cells(r["run_id"]) if c["scenario"] == scenario]
    finally:
        store.close()


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny ops on a shared 2-core machine: more threads only spin against each other."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def db(tmp_path):
    return str(tmp_path / "micro.db")


# --- the commands, end to end ---------------------------------------------------------------------

@pytest.mark.slow
def test_gemm_stores_square_and_layer_shapes(db, tmp_path):
    out_json = tmp_path / "g.json"
    res = invoke("gemm", "--sizes", "32,2^6", "--dtype", "fp32,bf16", "--model", "bert-tiny", "--tokens", "16",
                 "--db", db, "--json", str(out_json), "--plot", str(tmp_path / "g.png"))
    assert res.exit_code == 0, res.output
    rows = cells(db, "micro-gemm")
    assert len(rows) == (2 + 4) * 2
    assert {c["status"] for c in rows} == {"ok"}
    by = {(c["record"]["shape"], c["record"]["m"], c["record"]["dtype"]): c["record"] for c in rows}
    sq = by[("square", 64, "fp32")]
    assert (sq["n"], sq["k"], sq["flops"]) == (64, 64, 2 * 64**3)
    assert sq["bytes"] == 3 * 64 * 64 * 4 and sq["tflops"] > 0 and sq["n_samples"] >= 10
    assert sq["rel_err"] < 1e-5 and by[("square", 64, "bf16")]["bytes"] == 3 * 64 * 64 * 2
    qkv = by[("qkv", 16, "fp32")]
    assert (qkv["model"], qkv["n"], qkv["k"]) == ("bert-tiny", 3 * 48, 48)
    assert by[("ffn-down", 16, "fp32")]["k"] == 96
    assert sq["pct_of_peak"] is None  # no datasheet row for a CPU: nothing invented
    assert len(json.loads(out_json.read_text())["cells"]) == 12
    assert (tmp_path / "g.png").stat().st_size > 1000
    assert "n=64" in res.output


@pytest.mark.slow
def test_bandwidth_counts_bytes_read_and_written(db):
    res = invoke("bandwidth", "--sizes", "2^10,4096", "--dtype", "fp32", "--db", db)
    assert res.exit_code == 0, res.output
    recs = {(c["record"]["op"], c["record"]["elements"]): c for c in cells(db, "micro-bandwidth")}
    assert len(recs) == 6 and {c["status"] for c in recs.values()} == {"ok"}
    copy, add, scale = recs[("copy", 4096)]["record"], recs[("add", 4096)]["record"], recs[("scale", 1024)]["record"]
    assert copy["bytes"] == 2 * 4096 * 4 and copy["flops"] == 0 and copy["tflops"] == 0
    assert add["bytes"] == 3 * 4096 * 4 and add["flops"] == 4096
    assert scale["gbps"] == pytest.approx(scale["bytes"] / (scale["latency_ms"] / 1e3) / 1e9)
    assert recs[("copy", 1024)]["info"]["operand_sets"] == 1  # no rotation without a known L2


@pytest.mark.slow
def test_layer_forward_and_backward_flops(db):
    res = invoke("layer", "--model", "bert-tiny", "--batch", "1,2", "--seq", "8", "--db", db)
    assert res.exit_code == 0, res.output
    rows = cells(db, "micro-layer")
    assert len(rows) == 4 and {c["status"] for c in rows} == {"ok"}
    shape = PRESETS["bert-tiny"]
    for c in rows:
        r = c["record"]
        fwd = r["batch_size"] * flops.layer_flops(shape, 8)
        assert r["flops"] == (fwd if r["pass"] == "fwd" else 3 * fwd)
        assert r["rel_err"] < 1e-4
        assert c["info"]["attn_implementation"] == "sdpa" and c["info"]["training_mode"] is False
    assert "fwd+bwd seq=8" in res.output


@pytest.mark.slow
def test_breakdown_parts_shares_and_measured_ceilings(db, tmp_path):
    assert invoke("gemm", "--sizes", "64", "--db", db).exit_code == 0
    assert invoke("bandwidth", "--sizes", "2^12", "--ops", "copy", "--db", db).exit_code == 0
    plot = tmp_path / "b.png"
    res = invoke("breakdown", "--model", "bert-tiny", "--batch", "2", "--seq", "8", "--db", db, "--plot", str(plot))
    assert res.exit_code == 0, res.output
    rows = {c["record"]["part"]: c for c in cells(db, "micro-breakdown")}
    assert list(rows) == list(PARTS) and {c["status"] for c in rows.values()} == {"ok"}
    costs = layer_parts(PRESETS["bert-tiny"], 2, 8, 4)
    for part, c in rows.items():
        r = c["record"]
        assert r["flops"] == costs[part].flops and r["bytes"] == costs[part].min_bytes
        assert r["ceiling_source"] == "measured" and r["bound"] in ("compute", "memory")
        assert r["share"] == pytest.approx(r["latency_ms"] / rows["layer"]["record"]["latency_ms"])
    ceil = micro.measured_ceilings(db, "cpu")
    assert rows["qkv"]["record"]["peak_tflops"] == ceil["fp32 GEMM TFLOPS"]
    assert rows["qkv"]["record"]["peak_gbs"] == ceil["copy GB/s"]
    r = rows["layernorms"]["record"]
    assert r["bound"] == bound(r["intensity"], ceil["fp32 GEMM TFLOPS"], ceil["copy GB/s"])
    assert plot.stat().st_size > 1000
    assert "attention / FFN FLOP ratio" in res.output


@pytest.mark.slow
def test_breakdown_gpt2_and_no_ceilings(db):
    out = micro.run_micro("breakdown", micro.BreakdownOptions(model="gpt2-tiny", batch=1, seq=8, device="cpu",
                                                              min_time=0.01), db)
    recs = {r["part"]: r for r in out.records}
    assert {r["status"] for r in recs.values()} == {"ok"}
    assert recs["attention core"]["flops"] == layer_parts(PRESETS["gpt2-tiny"], 1, 8, 4)["attention core"].flops
    assert recs["qkv"]["bound"] is None and recs["qkv"]["ceiling_source"] is None  # CPU, nothing stored


@pytest.mark.slow
def test_oom_becomes_a_row_and_the_sweep_goes_on(db, monkeypatch):
    import torch

    real = gemm.build_calls

    def build(g, dtype, device, sets, seed):
        if g.m >= 64:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(g, dtype, device, sets, seed)

    from transbench.scenarios.micro import run as micro_run

    monkeypatch.setattr(gemm, "build_calls", build)  # the micro target, run in this process
    opts = micro.GemmOptions(sizes=[32, 64], device="cpu", min_time=0.01).resolved(torch.device("cpu"))
    state: dict = {}
    results = [micro_run.measure(c.to_dict(), state) for c in micro_run.cells("gemm", opts, "cpu", db)]
    assert [r.status for r in results] == ["ok", "oom"]
    assert "out of memory" in results[1].error and "tflops" not in results[1].record


@pytest.mark.slow
def test_micro_layer_resume_skips_batches_above_a_stored_oom(db):
    """A run killed after an OOM at batch 2: resumed by name, batch 4 is skipped, not run."""
    from transbench.cells import CellResult
    from transbench.runner.sweep import open_run, store_result
    from transbench.scenarios.micro import run as micro_run
    from transbench.store import Store

    import torch

    opts = micro.LayerOptions(model="bert-tiny", batches=[1, 2, 4], seqs=[8], device="cpu", min_time=0.01,
                              name="killed")
    resolved = opts.resolved(torch.device("cpu"))
    store = Store(db)
    spec = {"micro": "layer", **resolved.to_dict(), "device": "cpu"}
    spec.pop("name")
    run_id, _, _ = open_run(store, "micro", spec, "killed", lambda: {})
    for c in micro_run.cells("layer", resolved, "cpu", db):
        if c.batch == 2:
            store_result(store, run_id, c, CellResult("oom", error="CUDA out of memory"))
    store.close()
    out = micro.run_micro("layer", opts, db)
    status = {(r["batch_size"], r["pass"]): r["status"] for r in out.records}
    assert status == {(1, "fwd"): "ok", (1, "fwd+bwd"): "ok", (2, "fwd"): "oom",
                                                     (2, "fwd+bwd"): "oom", (4, "fwd"): "skipped",
                                                     (4, "fwd+bwd"): "skipped"}


def test_measured_ceilings_feed_env(db, monkeypatch):
    from transbench import api

    store = Store(db)
    run_id, _ = store.create_run("h100", "micro", {}, {})
    for dtype, tf in (("bf16", 700.0), ("bf16", 736.5), ("fp16", 741.0)):
        store.put_cell(run_id, f"{dtype}{tf}", "micro-gemm", "ok",
                       {"dtype": dtype, "tflops": tf, "gpu": "NVIDIA H100 80GB HBM3", "device": "cuda:0"}, cell={})
    store.put_cell(run_id, "bad", "micro-gemm", "wrong", {"dtype": "fp8", "tflops": 5000.0,
                                                         "gpu": "NVIDIA H100 80GB HBM3"}, cell={})
    store.put_cell(run_id, "copy", "micro-bandwidth", "ok", {"op": "copy", "gbps": 2860.0, "dtype": "fp32",
                                                            "gpu": "NVIDIA H100 80GB HBM3"}, cell={})
    store.put_cell(run_id, "no dtype", "micro-gemm", "ok", {"dtype": None, "tflops": 900.0,  # a TypeError in env
                                                           "gpu": "NVIDIA H100 80GB HBM3"}, cell={})
    store.close()
    expected = {"bf16 GEMM TFLOPS": 736.5, "fp16 GEMM TFLOPS": 741.0, "copy GB/s": 2860.0}
    assert micro.measured_ceilings(db, "NVIDIA H100 80GB HBM3") == expected
    assert micro.measured_ceilings(db, "NVIDIA A100-SXM4-80GB") == {}
    monkeypatch.setattr(api, "environment", lambda: {"gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3",
                                                               "peak": None}]})
    res = CliRunner().invoke(app, ["env", "--db", db, "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["gpus"][0]["measured"] == expected
    assert "cpu_measured" not in json.loads(res.output)


def test_env_json_has_the_cpus_measured_ceilings_as_its_table_does(db, monkeypatch):
    """Without a GPU the table printed the CPU's ceilings `micro` measured in --db; --json left them out."""
    from transbench import api

    store = Store(db)
    run_id, _ = store.create_run("cpu", "micro", {}, {})
    store.put_cell(run_id, "g", "micro-gemm", "ok", {"dtype": "fp32", "tflops": 0.08, "gpu": None, "device": "cpu"},
                   cell={})
    store.close()
    monkeypatch.setattr(api, "environment", lambda: {"gpus": []})
    res = CliRunner().invoke(app, ["env", "--db", db, "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["cpu_measured"] == micro.measured_ceilings(db, "cpu") == {"fp32 GEMM TFLOPS": 0.08}
    res = CliRunner().invoke(app, ["env", "--db", db])
    assert res.exit_code == 0 and "fp32 GEMM TFLOPS 0.08" in res.output, res.output


# --- counts by hand -----------------------------------------------------------------------------

def test_part_costs_by_hand():
    # bert-tiny: h=48, 3 heads, i=96; batch 2 x seq 8 -> T=16 tokens; fp16 (2 bytes)
    p = layer_parts(PRESETS["bert-tiny"], 2, 8, 2)
    assert (p["qkv"].matmul_flops, p["qkv"].elementwise_flops) == (2 * 16 * 48 * 144, 3 * 16 * 48)
    assert p["qkv"].min_bytes == 2 * (16 * 48 + 3 * 48 * 48 + 3 * 48 + 3 * 16 * 48)
    core = p["attention core"]
    assert (core.matmul_flops, core.elementwise_flops) == (4 * 2 * 64 * 48, 6 * 2 * 3 * 64)
    assert p["attention core"].min_bytes == 2 * 4 * 16 * 48
    assert p["output proj"].matmul_flops == 2 * 16 * 48 * 48
    assert p["dense"].flops == 2 * 16 * 48 * 96 + 16 * 96
    assert p["dense+act"].flops == 2 * 16 * 48 * 96 + 16 * 96 * 6  # bias + erf GELU (5)
    assert p["dense"].min_bytes == p["dense+act"].min_bytes == 2 * (16 * 48 + 48 * 96 + 96 + 16 * 96)
    assert p["layernorms"].flops == 2 * 7 * 16 * 48 and p["layernorms"].matmul_flops == 0
    assert p["ffn"].matmul_flops == 4 * 16 * 48 * 96
    assert p["layer"].matmul_flops == 2 * flops.layer_flops(PRESETS["bert-tiny"], 8)
    assert p["layer"].min_bytes == 2 * (2 * 16 * 48 + 4 * 48 * 48 + 4 * 48 + 2 * 48 * 96 + 96 + 48 + 4 * 48)
    assert p["dense"].intensity == pytest.approx(p["dense"].flops / p["dense"].min_bytes)
    g = layer_parts(PRESETS["gpt2-tiny"], 2, 8, 2)
    assert g["attention core"].matmul_flops == 2 * 2 * 8 * 9 * 48  # causal: s (s + 1) / 2 of the s^2 pairs
    assert g["dense+act"].elementwise_flops == 16 * 96 * 10  # bias + tanh GELU (9)


@settings(max_examples=30, deadline=None)
@given(act=st.sampled_from(sorted(ACTIVATION_FLOPS)), family=st.sampled_from(["bert-tiny", "gpt2-tiny"]))
def test_the_activations_flops_are_those_of_the_activation_the_layer_runs(act, family):
    # Before: counted by family, BERT's erf GELU (5) or GPT-2's tanh GELU (9), whatever config.json's activation:
    # a ReLU BERT's dense+act read 6 FLOPs an element where it runs 2 (bias, max).
    import dataclasses

    from transformers.activations import ACT2CLS

    from transbench.models import build

    shape = PRESETS[family]
    field = "hidden_act" if shape.family == "bert" else "activation_function"
    shape = dataclasses.replace(shape, config={**shape.config, field: act})
    assert act in ACT2CLS and getattr(build.preset_config(shape), field) == act  # the layer built runs it
    p = layer_parts(shape, 2, 8, 2)
    t, i = 16, shape.intermediate
    assert p["dense+act"].elementwise_flops == t * i * (1 + ACTIVATION_FLOPS[act])
    assert p["ffn"].elementwise_flops - p["dense+act"].elementwise_flops == 9 * t * shape.hidden


def test_breakdown_refuses_an_activation_it_has_no_count_for(tmp_path):
    import transformers

    folder = tmp_path / "laplace-bert"
    transformers.BertModel(transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
                                                   num_attention_heads=2, intermediate_size=64,
                                                   hidden_act="laplace")).save_pretrained(folder)
    db = tmp_path / "m.db"
    res = invoke("breakdown", "--model", str(folder), "--batch", "1", "--seq", "8", "--db", str(db))
    assert res.exit_code == 2 and "activation 'laplace' has no FLOP count" in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1 and not db.exists()


@pytest.mark.parametrize("dtype", ["int8", "float16"])
def test_a_checkpoints_layer_is_its_own_weights_in_fp32_whatever_dtype_config_json_names(tmp_path, dtype):
    # transformers' from_pretrained built the model in config.json's dtype: "int8" made every point an `error`
    # ("BertModel cannot be instantiated under `dtype=torch.int8`"), exit 0, where `run` of the folder measured it
    import torch
    import transformers

    from transbench.scenarios.micro.layer import build_layer

    folder = tmp_path / "bert"
    torch.manual_seed(0)
    model = transformers.BertForMaskedLM(transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
                                                                 num_attention_heads=4, intermediate_size=37))
    model.save_pretrained(folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "dtype": dtype}))
    layer, _ = build_layer(str(folder), "cpu", seed=1)
    want = model.bert.encoder.layer[0].state_dict()
    assert all(v.dtype == torch.float32 and torch.equal(v, want[k]) for k, v in layer.state_dict().items())


@pytest.mark.parametrize("model", ["bert-tiny", "llama-tiny", "qwen2-tiny", "modernbert-tiny", "smollm2-135m"])
def test_layer_gemms_are_the_models_own_widths(model):
    """Each layer GEMM of `micro gemm --model` has the widths its model computes, so their FLOPs are the layer's
    projections and FFN as models/flops.py counts them: grouped-query attention's keys and values at kv_heads, a gated
    MLP's up projection at twice the FFN width (llama-tiny's qkv was 3 x hidden wide, its ffn-up half as wide)."""
    shape = PRESETS[model]
    t = 16
    got = {g.shape: g for g in gemm.shapes(gemm.GemmOptions(sizes=[], models=[model], tokens=t))}
    projections = flops.layer_flops(shape, t) - flops.attention_flops(shape, t)
    assert sum(2 * g.m * g.n * g.k for g in got.values()) == projections
    assert got["qkv"].n == (shape.heads + 2 * shape.kv) * shape.dim and got["attn-out"].k == shape.heads * shape.dim


def test_attention_ffn_ratio_matches_the_seed():
    assert attention_ffn_ratio(PRESETS["bert-large-uncased"], 128) == pytest.approx(0.53125)


# --- roofline ------------------------------------------------------------------------------------

@pytest.mark.slow
def test_roofline_classification_on_fixed_numbers(tmp_path):
    assert ridge_point(989.4, 3350) == pytest.approx(295.34, rel=1e-3)
    assert bound(100.0, 989.4, 3350) == "memory"
    assert bound(300.0, 989.4, 3350) == "compute"
    assert bound(295.34, 989.4, 3350) == "memory" and bound(296.0, 989.4, 3350) == "compute"
    assert bound(1000.0, None, 3350) is None and bound(1.0, 989.4, None) is None
    assert attainable_tflops(10.0, 989.4, 3350) == pytest.approx(33.5)
    assert attainable_tflops(1e4, 989.4, 3350) == 989.4
    path = plot_roofline([{"label": "qkv", "intensity": 400.0, "tflops": 600.0, "group": "compute"},
                          {"label": "ln", "intensity": 0.9, "tflops": 2.5, "group": "memory"},
                          {"label": "zero", "intensity": 0.0, "tflops": 0.0}],
                         {"bf16": 989.4, "fp8": 1978.9}, 3350, str(tmp_path / "r.png"))
    assert (tmp_path / "r.png").stat().st_size > 1000 and path.endswith("r.png")


# --- measuring helpers ---------------------------------------------------------------------------

def test_operand_rotation_outgrows_l2(monkeypatch):
    import torch

    monkeypatch.setattr(common, "l2_bytes", lambda device: 1 << 20)
    assert common.operand_sets(64 << 10, torch.device("cuda")) == 32
    assert common.operand_sets(4 << 20, torch.device("cuda")) == 1
    order = []
    call = common.cycling([lambda i=i: order.append(i) for i in range(3)])
    for _ in range(7):
        call()
    assert order == [0, 1, 2, 0, 1, 2, 0]


def test_short_calls_are_timed_many_per_sample():
    import torch

    ctx = common.make_context(torch.device("cpu"), "", min_time=0.01, warmup=1)
    per_call, reps = common.time_calls(lambda: None, ctx)
    assert reps > 100 and per_call.stats.n >= 10 and max(per_call.samples_ms) < 0.1 and per_call.calls == per_call.stats.n * reps


def test_fp8_path_checks_its_output():
    import torch

    g = gemm.GemmShape("square", 32, 32, 32)
    try:
        calls, check, info = gemm.build_calls(g, "fp8", torch.device("cpu"), 2, 0)
        calls[1]()
        calls[0]()
    except (RuntimeError, NotImplementedError) as exc:  # CPU builds without fp8 matmul
        pytest.skip(f"no fp8 matmul on this CPU build: {exc}")
    out, ref = check()
    assert out.dtype == torch.bfloat16 and info["use_fast_accum"] is False
    assert 0 < common.rel_err(out, ref) < 0.05


# --- bad input -----------------------------------------------------------------------------------

@pytest.mark.parametrize("args, words", [
    (["gemm", "--sizes", "0,64"], "size 0"),
    (["gemm", "--sizes", "abc"], "cannot read size"),
    (["gemm", "--dtype", "fp64"], "unknown dtype 'fp64'"),
    (["gemm", "--dtype", "fp8"], "needs a CUDA GPU"),
    (["gemm", "--sizes", "64", "--model", "bert-huge"], "unknown model"),
    (["bandwidth", "--sizes", "-4"], "cannot read size"),
    (["bandwidth", "--ops", "triad"], "unknown op"),
    (["bandwidth", "--dtype", "tf32"], "unknown dtype"),
    (["layer", "--model", "bert-tiny", "--batch", "0"], "batch 0"),
    (["layer", "--model", "bert-tiny", "--seq", "4096"], "longer than"),
    (["breakdown", "--model", "gpt2-tiny", "--dtype", "tf32"], "needs a CUDA GPU"),
    (["layer", "--model", "bert-tiny", "--threads", "0"], "--threads must be between 1 and 4096, got 0"),
    (["layer", "--model", "bert-tiny,gpt2-tiny"], "time one model's layer: give one"),
    (["breakdown", "--model", "bert-tiny,bert-tiny"], "time one model's layer: give one"),
])
def test_bad_options_are_one_line_errors(db, args, words):
    res = CliRunner().invoke(app, ["micro", *args, "--db", db, *FAST])
    assert res.exit_code == 2, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], res.output
    import os

    assert not os.path.exists(db)  # refused before anything was stored


@pytest.mark.slow
def test_a_taken_name_resumes_its_grid_and_refuses_another(db):
    assert invoke("gemm", "--sizes", "32", "--db", db, "--name", "mine").exit_code == 0
    again = invoke("gemm", "--sizes", "32", "--db", db, "--name", "mine")
    assert again.exit_code == 0 and len(cells(db, "micro-gemm")) == 1  # resumed: nothing left to run
    res = invoke("gemm", "--sizes", "64", "--db", db, "--name", "mine")
    assert res.exit_code == 2 and "different grid" in res.output
    assert len(cells(db, "micro-gemm")) == 1


# --- the CPU allocator's out-of-memory, and micro's bad input ---------------------------------------------------------

runner = CliRunner()


def refused(res, *needles) -> str:
    """Exit 2, exactly one line on stderr that starts with `error:` and holds every needle, no traceback."""
    assert res.exit_code == 2, res.output
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert "Traceback" not in res.output
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]

# --- out of memory on the CPU ----------------------------------------------------------------------------

def test_the_cpu_allocators_refusal_is_out_of_memory():
    assert dev.is_oom(RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't "
                                   "allocate memory: you tried to allocate 4398046511104 bytes."))
    assert dev.is_oom(MemoryError())
    assert not dev.is_oom(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))


@pytest.mark.slow
def test_a_gemm_too_large_for_the_host_is_an_oom_row(tmp_path):
    """`micro gemm --sizes 2^20` on a CPU: 4 TB operands, refused by the allocator, stored as `error`."""
    import torch

    from transbench.scenarios.micro import run as micro_run

    opts = micro.GemmOptions(sizes=[2**20], models=[], device="cpu", min_time=0.01).resolved(torch.device("cpu"))
    [cell] = micro_run.cells("gemm", opts, "cpu", str(tmp_path / "t.db"))
    result = micro_run.measure(cell.to_dict(), {})
    assert result.status == "oom" and "can't allocate memory" in result.error


# --- micro: bad input --------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, words", [
    (["layer", "-m", "bert-tiny", "--batch", "1,1", "--seq", "8"], "--batch lists 1 twice"),
    (["layer", "-m", "bert-tiny", "--batch", "1", "--seq", "8,8"], "--seq lists 8 twice"),
    (["gemm", "--sizes", "64,2^6", "--model", ""], "--sizes lists 64 twice"),
    (["gemm", "--sizes", "64", "--dtype", "fp32,fp32", "--model", ""], "--dtype lists fp32 twice"),
    (["gemm", "--sizes", "64", "--model", "bert-tiny,bert-tiny"], "--model lists bert-tiny twice"),
    (["bandwidth", "--sizes", "1024,1024"], "--sizes lists 1024 twice"),
    (["bandwidth", "--sizes", "1024", "--ops", "copy,copy"], "--ops lists copy twice"),
    (["gemm", "--sizes", "", "--model", ""], "give --sizes or --model"),
    (["breakdown", "-m", "bert-tiny", "--batch", "0"], "batch 0 is not allowed: give whole numbers >= 1"),
])
def test_micro_refuses_a_value_listed_twice_and_says_what_to_give(tmp_path, args, words):
    db = tmp_path / "m.db"
    line = refused(runner.invoke(app, ["micro", *args, "--db", str(db), *FAST]), words)
    assert "--models" not in line and "batchs" not in line
    assert not db.exists()


def test_micro_min_time_help_shows_the_default_it_uses():
    import torch

    res = runner.invoke(app, ["micro", "gemm", "--help"], env={"COLUMNS": "200", "TERMINAL_WIDTH": "200"})
    assert res.exit_code == 0
    opts = micro.GemmOptions(sizes=[64], models=[], device="cpu")
    cpu = opts.resolved(torch.device("cpu")).min_time
    gpu = opts._common(torch.device("cuda"))["min_time"]  # what a GPU point gets (no GPU needed to ask)
    assert f"{gpu:g} on GPU, {cpu:g} on CPU" in " ".join(res.output.split()), res.output


def test_gemm_tokens_past_their_limit_are_refused(tmp_path):
    """1e18 rows stored four `error` cells (storage size overflowed), exit 0: the limit --help states."""
    db = tmp_path / "g.db"
    refused(runner.invoke(app, ["micro", "gemm", "--model", "bert-tiny", "--sizes", "64", "--tokens",
                                "1000000000000000000", "--db", str(db)]), "--tokens", "above its limit of 1,048,576")
    assert not db.exists()


def test_gemm_on_a_cpu_titles_its_percentage_by_the_measured_ceiling(db):
    """A CPU has no datasheet row: its GEMM table said "% of datasheet peak" and printed no percentage. Its
    ceiling is the best GEMM of the dtype measured on it (what `env` shows), and the title says so."""
    res = CliRunner().invoke(app, ["micro", "gemm", "--sizes", "16,32", "--model", "", "--db", db, *FAST],
                             env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "datasheet" not in text, res.output
    assert "% of the measured ceiling: the best GEMM of its dtype stored for cpu" in text
    assert "(100.0%)" in text  # the best point is the ceiling itself


# --- sizes: one reader for the command line and a spec file ------------------------------------------------------

_SIZE_TEXT = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=12),
    st.from_regex(r"\s?[0-9]{1,3}((\^|\*\*)[0-9]{1,2})?\s?(KiB|k|MB|gib|b|x)?"
                  r"((,|\.\.)[0-9]{1,3}((\^|\*\*)[0-9]{1,2})?(KiB|M|)?)?", fullmatch=True))


def _sizes_read(kind: str, given: list[str], monkeypatch) -> tuple[int, object]:
    """(exit code, the sizes the command would measure, or its one error line) of `micro KIND` given `given`."""
    seen = []

    def stop(kind, opts, db, on_point=None):
        seen.append(opts.sizes)
        raise SpecError("stopped before measuring")

    monkeypatch.setattr(micro, "run_micro", stop)
    res = CliRunner().invoke(app, ["micro", kind, *given, "--db", "never.db"])
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (given, res.output)
    return (0, seen[0]) if seen else (2, lines[0])


@pytest.mark.parametrize("kind", ["gemm", "collectives"])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=_SIZE_TEXT)
def test_a_spec_file_reads_sizes_as_the_command_line_does(kind, text, tmp_path, monkeypatch):
    """A spec file refused `sizes: "2^6"` and `sizes: "1KiB"`, which --sizes takes: both go through the setting's
    one reader (boundary.parse_size / parse_bytes), and agree on any text, taken or refused (exit 2, one line)."""
    monkeypatch.chdir(tmp_path)
    spec = tmp_path / "s.json"
    spec.write_text(json.dumps({"sizes": text}))
    cli, cli_out = _sizes_read(kind, [f"--sizes={text}"], monkeypatch)
    file, file_out = _sizes_read(kind, ["--spec", str(spec)], monkeypatch)
    assert cli == file, (text, cli_out, file_out)
    if cli == 0:
        assert cli_out == file_out
    assert not (tmp_path / "never.db").exists()


def test_a_spec_file_takes_the_command_lines_sizes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for kind, sizes, want in (("gemm", "2^6,128", [64, 128]), ("gemm", ["2**3", 16], [8, 16]),
                              ("collectives", "1KiB..4KiB", [1024, 2048, 4096]),
                              ("collectives", ["1KiB", 8], [1024, 8])):
        (tmp_path / "s.json").write_text(json.dumps({"sizes": sizes}))
        assert _sizes_read(kind, ["--spec", "s.json"], monkeypatch) == (0, want)
    (tmp_path / "s.json").write_text(json.dumps({"sizes": "2^99"}))
    code, line = _sizes_read("gemm", ["--spec", "s.json"], monkeypatch)
    assert code == 2 and "s.json: sizes: size '2^99' is larger than a 64-bit integer holds" in line


def test_the_measured_ceilings_own_point_reads_100_percent(monkeypatch):
    """100 t / t is not 100.0 for 7% of figures t (0.011033099297893681 among them): the best point read
    "(100.000000%)" against the ceiling it is itself."""
    from transbench.cli import micro as micro_cli

    t = 0.011033099297893681
    assert 100 * t / t != 100.0  # the figure still shows the rounding this guards against
    monkeypatch.setattr(micro_cli, "measured_ceilings", lambda db, hardware: {"fp32 GEMM TFLOPS": t})
    rec = {"dtype": "fp32", "tflops": t, "gpu": None, "pct_of_peak": None}
    title, of_ceiling = micro_cli._gemm_ceiling([rec], "unused.db")
    assert "measured ceiling" in title and of_ceiling(rec) == 100.0
    assert micro_cli._pct(t, of_ceiling(rec)).endswith("(100.0%)")


def test_breakdown_warns_where_a_part_runs_above_the_stored_ceilings(db):
    # `micro bandwidth --sizes 3` stored a copy of 0.009 GB/s (the call's overhead) as the CPU's memory ceiling;
    # the breakdown then showed parts at 293% of the roofline without a word
    store = Store(db)
    run_id, _ = store.create_run("tiny", "micro", {}, {})
    store.put_cell(run_id, "g", "micro-gemm", "ok", {"dtype": "fp32", "tflops": 1e-9, "gpu": None, "device": "cpu"},
                   cell={})
    store.put_cell(run_id, "c", "micro-bandwidth", "ok", {"op": "copy", "gbps": 1e-6, "dtype": "fp32", "gpu": None,
                                                          "device": "cpu"}, cell={})
    store.close()
    seen = []
    out = micro.run_micro("breakdown", micro.BreakdownOptions(model="bert-tiny", batch=1, seq=8, device="cpu",
                                                              min_time=0.01), db, on_point=seen.append)
    qkv = next(r for r in out.records if r["part"] == "qkv")
    assert qkv["ceiling_source"] == "measured" and qkv["pct_of_roofline"] > 110
    (warning,) = [w for p in seen if p.key["part"] == "qkv" for w in p.warnings if "roofline" in w]
    assert "above the roofline" in warning and "measure `micro gemm` and `micro bandwidth`" in warning
