"""EngineOptions: the engine's launch and tuning switches, given to compile_model and passed down to every part that
reads them (ops, graph caches, packing, generators), checked on construction; and no script or test switches the
engine by writing its modules' state instead."""
import re
from pathlib import Path

import pytest
import torch
from transformers import BertConfig, BertModel, GPT2Config, GPT2LMHeadModel

from transbench.engine import EngineOptions, compile_model, tuning

ROOT = Path(__file__).resolve().parents[1]


def _bert():
    torch.manual_seed(0)
    return BertModel(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                vocab_size=100, max_position_embeddings=64)).eval()


def test_the_defaults_are_the_engine_as_shipped():
    from transbench.engine import gemm, packing
    o = EngineOptions()
    assert (o.pdl, o.refine, o.tuner, o.max_graphs, o.fp8_min_rows) == (True, True, None, None, None)
    assert (o.prefetch_max_m, o.race_budget_s) == (gemm.PREFETCH_MAX_M, tuning.RACE_BUDGET_S)
    assert (o.pack_max_s, o.pack_max_tokens) == (packing.PACK_MAX_S, packing.PACK_MAX_TOKENS)
    assert compile_model(_bert()).opts.options == o


def test_compile_model_passes_its_options_down(tmp_path):
    t = tuning.Tuner(tmp_path / "t.json")
    o = EngineOptions(pdl=False, refine=False, race_budget_s=1.0, tuner=t, max_graphs=3, fp8_min_rows=7,
                      pack_max_s=0)
    c = compile_model(_bert(), options=o)
    e = c.engine
    assert c.opts.options is o and e.ops.options is o and e.ops.fp8_min_rows == 7
    assert (e.graphs.tuner, e.graphs.refine, e.graphs.race_budget_s, e.graphs.max_entries) == (t, False, 1.0, 3)
    gpt = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=100, n_positions=32)).eval()
    gen = compile_model(gpt, options=o).generator(1, 8)  # the generator's graphs: the model's options
    assert (gen.graphs.tuner, gen.graphs.refine, gen.graphs.race_budget_s) == (t, False, 1.0)
    gen.set_tune_budget(0)  # a server's generator met under load: a capture only, for every generator of its shape
    assert gen.graphs.tune_budget_s == 0 and compile_model(gpt, options=o).generator(1, 8).graphs.tune_budget_s != 0
    for bad in (-1, float("nan"), True, "0"):
        with pytest.raises(ValueError, match="seconds must be"):
            gen.set_tune_budget(bad)


def test_the_triton_ops_launch_with_the_options():
    from transbench.engine import launch, ops
    if not launch.AVAILABLE:
        pytest.skip("Triton is not installed")
    t = ops.TritonOps(EngineOptions(pdl=False, prefetch_max_m=0), tuner=object())
    assert not t.pdl and t._linear.keywords == {"pdl": False, "prefetch_max_m": 0}
    assert t._splitk.keywords == {"pdl": False, "prefetch_max_m": 0} and t._linear_fp8.keywords == {"pdl": False}
    assert ops.TritonOps(tuner=object()).fp8_min_rows == ops.FP8_MIN_ROWS and ops.TorchOps().fp8_min_rows == 1
    # PDL off: neither the constexpr nor the launch option, whatever the GPU
    assert launch.launch_options(torch.device("cuda"), pdl=False) == {"PDL": False, "launch_pdl": False}
    assert launch.launch_options(torch.device("cpu")) == {"PDL": False, "launch_pdl": False}


@pytest.mark.parametrize("kw,message", [
    ({"pdl": "no"}, "pdl must be True or False"), ({"refine": 1}, "refine must be True or False"),
    ({"prefetch_max_m": -1}, "prefetch_max_m must be a whole number of at least 0"),
    ({"pack_max_s": 2.5}, "pack_max_s must be a whole number"), ({"max_graphs": 0}, "max_graphs must be None or"),
    ({"fp8_min_rows": True}, "fp8_min_rows must be None or"), ({"race_budget_s": float("nan")}, "race_budget_s must"),
    ({"tuner": "table.json"}, "tuner must be None or a transbench.engine.tuning.Tuner")])
def test_wrong_options_are_refused_on_construction(kw, message):
    with pytest.raises(ValueError, match=message):
        EngineOptions(**kw)


def test_compile_model_refuses_options_of_another_type():
    with pytest.raises(ValueError, match="options must be an EngineOptions"):
        compile_model(_bert(), options={"pdl": False})


def test_the_default_tuner_follows_the_cache_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("TRANSBENCH_CACHE_DIR", str(tmp_path / "a"))
    a = tuning.tuner()
    assert a is tuning.tuner() and a.path == tmp_path / "a" / tuning.TABLE_NAME
    monkeypatch.setenv("TRANSBENCH_CACHE_DIR", str(tmp_path / "b"))
    assert tuning.tuner().path == tmp_path / "b" / tuning.TABLE_NAME
    assert compile_model(_bert()).engine.graphs.tuner is tuning.tuner()


ENGINE_MODULES = ("kernels", "ops", "tuning", "gemm", "launch", "attention", "packing", "graphs", "capture",
                  "layernorm", "quantize", "activation", "embeddings", "decode_attention", "argmax", "gemv", "config")


def test_no_script_or_test_switches_the_engine_by_writing_its_modules():
    """Switches are EngineOptions fields: a benchmark writing `tuning.REFINE = False` or a test patching
    `tuning._TUNER` changed every engine in the process, and one that forgot to restore it changed the next ones."""
    mods = "|".join(ENGINE_MODULES)
    # an assignment statement with such a target (alone or among others: `a.X, b.Y = 1, 2`)
    write = re.compile(rf"^\s*(?:[\w.]+\s*,\s*)*(?:{mods})\.[A-Z_]\w*(?:\s*,\s*[\w.]+)*\s*=(?!=)")
    patch = re.compile(rf"setattr\(\s*(?:{mods})\s*,\s*[\"'][A-Z_]")
    files = [*ROOT.glob("benchmarks/**/*.py"), *ROOT.glob("benchmarks/**/*.sh"), *ROOT.glob("tests/**/*.py")]
    bad = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in files if p.name != Path(__file__).name
           for n, line in enumerate(p.read_text().splitlines(), 1) if write.search(line) or patch.search(line)]
    assert not bad, "\n".join(bad)


def test_without_triton_the_engine_runs_its_torch_ops_and_a_kernel_says_what_is_missing():
    import subprocess
    import sys

    code = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split('.')[0] == 'triton':
            raise ModuleNotFoundError(name)
sys.meta_path.insert(0, Block())
import torch
from transformers import BertConfig, BertModel
from transbench.engine import compile_model, launch
from transbench.engine.layernorm import add_layernorm
assert not launch.AVAILABLE
m = BertModel(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                         vocab_size=100)).eval()
c = compile_model(m, dtype=torch.float32)
assert c.engine.ops.name == 'torch'
ids = torch.randint(0, 100, (2, 8))
print(tuple(c(ids, attention_mask=torch.ones_like(ids)).last_hidden_state.shape))
try:
    add_layernorm(torch.ones(2, 4), None, None, torch.ones(4), torch.zeros(4), 1e-5)
except RuntimeError as e:
    print(e)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    shape, message = out.stdout.strip().splitlines()[-2:]
    assert shape == "(2, 8, 32)" and "Triton is not installed" in message, out.stdout
