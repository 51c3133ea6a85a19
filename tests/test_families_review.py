"""Review of "any transformers family" on the inference path (CPU, tiny random-weight checkpoint folders built
here): each test failed before the fix it names."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from transbench.cells import Cell
from transbench.models import build, flops
from transbench.runner import worker
from transbench.scenarios.inference.measure import ModelCache

FAST = dict(min_time=0.0, warmup=0, min_count=1)
SIZES = dict(hidden_size=48, num_attention_heads=4, intermediate_size=72, num_hidden_layers=2, vocab_size=1003,
             max_position_embeddings=64)


def _save(tmp_path, name, family, cls_name="AutoModelForCausalLM", **config):
    import transformers

    torch.manual_seed(0)
    model = getattr(transformers, cls_name).from_config(transformers.AutoConfig.for_model(family, **config))
    model.save_pretrained(tmp_path / name)
    return str(tmp_path / name)


def _cell(model, task, backend, cache, **kw):
    cell = Cell(model=model, task=task, backend=backend, dtype="fp32", batch=2, seq=16, device="cpu",
                **{**FAST, "new_tokens": 3, **kw})
    return worker.execute("transbench.scenarios.inference.target:measure", cell.to_dict(), {"models": cache})


def _eager_count(folder, task, seq, custom=None):
    """torch's counter over the real model's eager forward of one sequence."""
    ref = build.resolve(folder)
    model = build.build_model(ref, task, attn="eager")
    with FlopCounterMode(display=False, custom_mapping=custom or {}) as counter, torch.no_grad():
        model(input_ids=torch.randint(3, ref.shape.vocab - 1, (1, seq)))
    return counter.get_total_flops()


@pytest.fixture(scope="module")
def falcon(tmp_path_factory):
    # new_decoder_architecture: grouped-query attention with num_kv_heads (not num_key_value_heads)
    return _save(tmp_path_factory.mktemp("falcon"), "falcon", "falcon", hidden_size=48, num_attention_heads=4,
                 num_hidden_layers=2, vocab_size=1003, new_decoder_architecture=True, num_kv_heads=2)


# --- Falcon: every cell was `error` (FalconConfig.head_dim is a read-only property) ------------------------------

def test_a_falcon_checkpoint_runs_and_counts_its_flops(falcon):
    # Before: counting FLOPs rebuilt the config from the shape (preset_config), which sets head_dim, and
    # FalconConfig has no setter for it: "AttributeError: property 'head_dim' of 'FalconConfig' object has no
    # setter", so every Falcon cell that ran was `error`. Now the folder's own config.json is counted.
    shape = build.resolve(falcon).shape
    fl, method = flops.forward_flops(shape, [16], "base")
    # hand count: fused QKV (4 query + 2x2 kv heads of 12), dense, 4h MLP, causal attention, 2 layers
    s, h, q = 16, 48, 48
    per_layer = 2 * s * h * (q + 2 * 2 * 12) + 2 * s * h * h + 4 * s * h * 4 * h + 2 * s * (s + 1) * q
    assert (fl, method) == (2 * per_layer, "counted")


def test_falcon_runs_sdpa(falcon):
    # Before: `unsupported` ("falcon has no 'sdpa' attention in transformers"): FalconModel declares sdpa but
    # cannot switch to it once built (transformers 5 warns and keeps eager), so it is built again with sdpa.
    cache = ModelCache()
    for task in ("base", "causal-lm"):
        r = _cell(falcon, task, "sdpa", cache)
        assert r.status == "ok", (r.error, r.info.get("traceback"))
        assert r.info["attn_implementation"] == "sdpa"
        assert 0 < r.record["rel_err"] < 1e-5  # sdpa really ran: not bit-equal to the eager reference


def test_a_family_without_sdpa_stays_unsupported(tmp_path):
    # The rebuild is for classes that declare sdpa only: Bloom has none, and says so.
    folder = _save(tmp_path, "bloom", "bloom", hidden_size=48, n_head=4, n_layer=1, vocab_size=1003)
    r = _cell(folder, "base", "sdpa", ModelCache())
    assert r.status == "unsupported" and "bloom has no 'sdpa' attention" in r.error


# --- counted decoders: the causal half of attention, as the analytic families ------------------------------------

def test_a_counted_decoder_counts_the_causal_half_of_attention(tmp_path):
    # Before: a counted decoder family (Mistral, Phi, Gemma, GPT-NeoX, OPT, Bloom, ...) counted the s x s square its
    # eager attention computes and masks, while analytic decoders count s (s + 1) / 2 pairs: a Mistral read 4.0%
    # more FLOPs than the Llama of the very same shape at 16 tokens (1,204,224 against 1,158,144).
    gqa = dict(SIZES, num_key_value_heads=2, tie_word_embeddings=False)
    llama = build.resolve(_save(tmp_path, "llama", "llama", **gqa)).shape
    mistral = build.resolve(_save(tmp_path, "mistral", "mistral", **gqa, sliding_window=None)).shape
    for task in ("base", "causal-lm"):
        for lens in ([16], [16, 9], [1]):
            a, b = flops.forward_flops(llama, lens, task), flops.forward_flops(mistral, lens, task)
            assert (a[0], a[1], b[1]) == (b[0], "analytic", "counted"), (task, lens)


def test_the_counter_agrees_with_the_formulas_on_analytic_decoders():
    # The counted path, run on decoders the formulas cover, gives their very count (it read the full square).
    from transbench.models.presets import PRESETS

    for model in ("gpt2-tiny", "llama-tiny", "qwen2-tiny"):
        for task in ("base", "causal-lm", "classification"):
            shape = PRESETS[model]
            assert flops.counted_flops(shape, 16, task) == flops.analytic_forward_flops(shape, 16, task), model


def test_counted_decoder_flops_are_torchs_count_less_the_masked_half(tmp_path):
    # Against torch's counter on the real model (eager attention): the difference is exactly the masked upper
    # half of scores and values, layers x 4 x q x s (s - 1) / 2 (q = heads x head_dim = 48 here).
    phi = _save(tmp_path, "phi", "phi", **SIZES)
    bloom = _save(tmp_path, "bloom", "bloom", hidden_size=48, n_head=4, n_layer=2, vocab_size=1003)  # ALiBi baddbmm
    for folder in (phi, bloom):
        shape = build.resolve(folder).shape
        for s in (8, 16):
            masked = shape.layers * 4 * 48 * s * (s - 1) // 2
            assert flops.forward_flops(shape, [s], "causal-lm")[0] == _eager_count(folder, "causal-lm", s) - masked


def test_an_encoder_still_counts_the_full_square(tmp_path):
    folder = _save(tmp_path, "albert", "albert", "AutoModelForMaskedLM", embedding_size=16, **SIZES)
    shape = build.resolve(folder).shape
    assert flops.forward_flops(shape, [16], "mlm") == (_eager_count(folder, "mlm", 16), "counted")


# --- a checkpoint's backbone under a task class that names it otherwise -----------------------------------------

def test_qa_on_a_llama_checkpoint_loads_its_backbone(tmp_path):
    # Before: LlamaForQuestionAnswering holds its LlamaModel as `transformer.`, a Llama checkpoint as `model.`:
    # transformers loaded none of the checkpoint's tensors (a warning nobody sees) and `--task qa` timed a random
    # backbone, checked against a reference with the same random weights, so nothing said so.
    folder = _save(tmp_path, "llama", "llama", **SIZES, num_key_value_heads=2)
    ref = build.resolve(folder)
    saved = build.build_model(ref, "causal-lm").model.state_dict()
    for task in ("qa", "classification", "base"):
        backbone = build.build_model(ref, task).base_model.state_dict()
        assert backbone.keys() == saved.keys() and all(torch.equal(backbone[k], saved[k]) for k in saved), task


def test_every_documented_record_key_is_in_a_cpu_runs_export(tmp_path):
    # docs/records.md lists host_ms, mem_before_mb, sm_clock_mhz, avg_power_w, j_per_seq, seq_stdev and embeddings
    # among the keys every exported record has; a CPU run's JSON had none of the first five (null now: nothing measured).
    import json
    import re
    import subprocess
    import sys
    from pathlib import Path

    table = (Path(__file__).parents[1] / "docs" / "records.md").read_text()
    keys = re.findall(r"^\| `([a-z_0-9]+)` \|.*\| every record \|$", table, flags=re.M)
    assert {"host_ms", "mem_before_mb", "sm_clock_mhz", "avg_power_w", "j_per_seq", "seq_stdev"} <= set(keys)
    from transbench.store.export import RECORD_KEYS
    assert keys == list(RECORD_KEYS)  # the table lists the export's own keys, in its order
    out = tmp_path / "r.json"
    subprocess.run([sys.executable, "-m", "transbench", "run", "--model", "bert-tiny", "--backend", "sdpa", "--batch",
                    "1", "--seq", "8", "--min-time", "0", "--db", str(tmp_path / "x.db"), "--json", str(out)],
                   check=True, capture_output=True, timeout=300)
    rec = json.loads(out.read_text())["cells"][0]
    assert [k for k in keys if k not in rec] == []
