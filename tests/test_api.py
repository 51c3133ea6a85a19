"""The Python API as docs/python-api.md documents it: what each call leaves behind in the
caller's process (no global state changed) and the arguments it refuses before any store or file exists."""

import os
import re

import pytest
import torch

from transbench import api
from transbench.errors import SpecError
from transbench.measure import device
from transbench.scenarios.serve.spec import ServeSpec
from transbench.scenarios.training.spec import TrainSpec
from transbench.scenarios.inference.spec import RunSpec

RUN = dict(models=["bert-tiny"], backends=["sdpa"], batches=[1], seqs=[8], device="cpu", min_time=0.01, warmup=1)
TRAIN = dict(models=["bert-tiny"], batches=[2], seqs=[8], steps=1, warmup_steps=1, device="cpu")
SERVE = dict(model="bert-tiny", device="cpu", lengths="fixed:8", offline=True, duration=0.2, warmup=0.0)


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def nothing_written(tmp_path):
    assert os.listdir(tmp_path) == [], os.listdir(tmp_path)


class Reached(Exception):
    """Raised in place of the sweep: the call got past every check."""


@pytest.mark.parametrize("call", [
    lambda db: api.run(RunSpec(**RUN), db),
    lambda db: api.train(TrainSpec(**TRAIN), db),
    lambda db: api.serve(ServeSpec(**SERVE), db),
])
def test_validation_leaves_the_callers_random_stream_alone(tmp_path, monkeypatch, call):
    """The dtype check (measure/device.dtype_runs) ran its probe layer on torch.randn in the caller's process:
    a script that seeded torch and called api.run got other random numbers afterwards."""
    from transbench.store import db as store_db

    def reached(self, *args, **kwargs):
        raise Reached

    monkeypatch.setattr(store_db.Store, "__init__", reached)  # validation only: no worker, no store
    device.check_dtype_runs.cache_clear()  # its answer is kept per process: probe again here
    torch.manual_seed(1234)
    expected = torch.get_rng_state().clone()
    with pytest.raises(Reached):
        call(str(tmp_path / "x.db"))
    assert torch.equal(torch.get_rng_state(), expected)


def tiny_bert():
    from transformers import BertConfig, BertModel

    return BertModel(BertConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=2, intermediate_size=128,
                                vocab_size=100, max_position_embeddings=64)).eval()


@pytest.mark.parametrize("kw, needle", [
    # docs/engine.md: a ValueError for an argument of the wrong type; these were an AttributeError ('NoneType' object
    # has no attribute 'parameters'), an AssertionError from deep in the weight loading ("Torch not compiled with
    # CUDA enabled"), or an EngineUnsupported (a model the engine cannot run) for an argument that is not a dtype
    ({"hf_model": None}, "hf_model must be a transformers model"),
    ({"hf_model": "bert-tiny"}, "hf_model must be a transformers model"),
    ({"dtype": None}, "dtype must be a torch dtype"),
    ({"dtype": 16}, "dtype must be a torch dtype"),
    ({"device": "cuda"}, "no CUDA GPU is visible"),
])
def test_compile_model_refuses_wrong_arguments_with_a_value_error(kw, needle, monkeypatch):
    from transbench.engine import compile_model

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on this CPU host, also on a GPU one
    kw = {"hf_model": tiny_bert(), "dtype": torch.float32, **kw}
    with pytest.raises(ValueError, match=needle):
        compile_model(kw.pop("hf_model"), **kw)


@pytest.mark.parametrize("call, needle", [
    # callbacks were first called once the store held the new run: a TypeError after the store was made
    (lambda db: api.run(RunSpec(**RUN), db, on_start=None), "on_start must be a function, got None"),
    (lambda db: api.run(RunSpec(**RUN), db, on_cell=5), "on_cell must be a function, got 5"),
    (lambda db: api.run(RunSpec(**RUN), db, on_probe="print"), "on_probe must be a function"),
    (lambda db: api.train(TrainSpec(**TRAIN), db, on_start=None), "on_start must be a function, got None"),
    (lambda db: api.train(TrainSpec(**TRAIN), db, on_cell=[]), "on_cell must be a function"),
    (lambda db: api.serve(ServeSpec(**SERVE), db, on_cell=None), "on_cell must be a function, got None"),
    # resume="no" is a true value: it asked for a resume
    (lambda db: api.run(RunSpec(**RUN), db, resume="no"), "resume must be True or False, got 'no'"),
    # pathlib's TypeError, naming no argument
    (lambda db: api.tune("bert-tiny", [1], [8], cache_dir=5), "cache_dir must be a folder path"),
    # called only after the first shape's tuning (minutes on a GPU)
    (lambda db: api.tune("bert-tiny", [1], [8], progress="print"), "progress must be a function"),
])
def test_api_wrong_arguments_are_one_spec_error_before_any_file(tmp_path, call, needle):
    with pytest.raises(SpecError, match=needle):
        call(str(tmp_path / "x.db"))
    nothing_written(tmp_path)


@pytest.mark.slow
def test_resume_without_a_name_refuses_fields_it_would_ignore(tmp_path, monkeypatch):
    """The CLI refuses `--resume --batch 2` when the newest run holds another grid; api.run resumed the newest run
    with its own grid, measured nothing and came back `resumed`, as if batch 2 had been measured."""
    db = str(tmp_path / "s.db")
    first = api.run(RunSpec(**RUN, name="a"), db)
    before = open(db, "rb").read()
    with pytest.raises(SpecError, match=r"resumes the newest run, 'a', with its own options, and these differ "
                                        r"\(batches \[1\] -> \[2\]\)"):
        api.run(RunSpec(**{**RUN, "batches": [2]}), db, resume=True)
    assert open(db, "rb").read() == before
    # the same fields, or fields left at their defaults (RunSpec() holds every field), resume it
    assert api.run(RunSpec(**RUN), db, resume=True).resumed
    again = api.run(RunSpec(), db, resume=True)
    assert (again.name, again.resumed, len(again.records)) == ("a", True, len(first.records))


@pytest.mark.slow
def test_readers_refuse_an_empty_run_name_and_a_baseline_no_record_has(tmp_path):
    """api.report(db, "") reported the newest run (records(db, "") and `report ''` refuse the name); records() took a
    misspelt or non-text baseline and left every speedup None without a word (api.report refuses it)."""
    db = str(tmp_path / "s.db")
    api.run(RunSpec(**RUN, name="a"), db)
    before = sorted(os.listdir(tmp_path))
    for call, needle in [
        (lambda: api.report(db, "", str(tmp_path / "out")), "no run '' in"),
        (lambda: api.records(db, ["a"], baseline="sdpaa"), "baseline 'sdpaa' is not a backend of these runs: use one "
                                                            "of sdpa"),
        (lambda: api.records(db, ["a"], baseline=""), "baseline '' is not a backend"),
        (lambda: api.records(db, ["a"], baseline=5), "baseline must be a backend name"),
    ]:
        with pytest.raises(SpecError, match=needle):
            call()
    assert sorted(os.listdir(tmp_path)) == before
    assert len(api.records(db, ["a"], baseline="sdpa")) == 1
    assert api.report(db, [], str(tmp_path / "out")).markdown.exists()  # no run named: the newest, as before


def test_generator_checks_its_arguments_and_a_decode_before_prefill():
    """docs/engine.md `fast.generator(batch, max_total_len)`: batch 0 was taken, "1" a TypeError of torch.zeros; a decode
    on a generator that never ran prefill was told another generator had run prefill since."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from transbench.engine import compile_model

    model = GPT2LMHeadModel(GPT2Config(n_embd=64, n_layer=1, n_head=4, vocab_size=100, n_positions=64)).eval()
    fast = compile_model(model, torch.float32, max_batch=2, max_seq=16)
    for args, needle in [((0, 8), "batch_size must be a whole number of at least 1, got 0"),
                         (("1", 8), "batch_size must be a whole number"), ((1, 0), "max_total_len must be a whole"),
                         ((True, 8), "batch_size must be a whole number")]:
        with pytest.raises(ValueError, match=needle):
            fast.generator(*args)
    gen = fast.generator(2, 12)
    with pytest.raises(ValueError, match="decode before prefill"):
        gen.decode(torch.tensor([1, 2]))
    ids = torch.randint(0, 100, (2, 5))
    with torch.no_grad():
        logits = gen.prefill(ids)
        assert ((logits - model(input_ids=ids).logits[:, -1]).norm() / logits.norm()).item() < 1e-5
        gen.decode(logits.argmax(-1))
        fast.generator(2, 12).prefill(ids)  # a newer generator of the shape owns the cache now
    with pytest.raises(ValueError, match="holds another sequence now"):
        gen.decode(logits.argmax(-1))


def test_the_engine_checks_the_inputs_it_is_given():
    """Out-of-vocabulary ids indexed the embedding table out of bounds (an IndexError here; on a GPU a device-side
    assert that ends the CUDA context), a list was an AttributeError, an empty batch a RuntimeError in attention."""
    from transformers import BertConfig, BertModel, GPT2Config, GPT2LMHeadModel

    from transbench.engine import compile_model

    bert = compile_model(BertModel(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                              intermediate_size=64, vocab_size=100)).eval(), torch.float32,
                         max_batch=2, max_seq=16)
    ids = torch.randint(0, 100, (2, 8))
    for kwargs, needle in [({"input_ids": torch.full((2, 8), 100)}, "input_ids holds 100, outside the 100 rows"),
                           ({"input_ids": torch.full((2, 8), -1)}, "input_ids holds -1"),
                           ({"input_ids": ids.float()}, "must hold integer token ids"),
                           ({"input_ids": [[1, 2]]}, "must be a torch tensor of token ids, got list"),
                           ({"input_ids": ids[0]}, "must have 2 dimension"),
                           ({"input_ids": ids[:0]}, "input_ids is empty"),
                           ({"input_ids": ids, "attention_mask": torch.ones(3, 3)}, "attention_mask must be a (2, 8)"),
                           ({"input_ids": ids, "token_type_ids": torch.full((2, 8), 5)}, "token_type_ids holds 5"),
                           ({"inputs_embeds": torch.randn(2, 8, 5)}, "inputs_embeds must be (batch, seq, 32)")]:
        with pytest.raises(ValueError, match=re.escape(needle)):
            bert(**kwargs)
    with pytest.raises(ValueError, match="hidden_states must be a floating-point torch tensor"):
        bert.engine.encode(None)
    gpt = compile_model(GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=100,
                                                   n_positions=64)).eval(), torch.float32, max_batch=2, max_seq=16)
    gen = gpt.generator(2, 12)
    with torch.no_grad():
        gen.prefill(ids[:, :5])
        for bad, needle in [(torch.tensor([1, 2, 3]), "next_ids holds 3 tokens, and this generator decodes 2"),
                            (torch.tensor([1, 500]), "next_ids holds 500"), ([1, 2], "got list")]:
            with pytest.raises(ValueError, match=re.escape(needle)):
                gen.decode(bad)
            with pytest.raises(ValueError, match=re.escape(needle)):
                gen.decode_greedy(bad)


@pytest.mark.slow
def test_the_api_leaves_the_callers_environment_alone_and_reads_folders_offline(tmp_path):
    """Importing transbench.api set HF_HUB_OFFLINE=1 in the caller's process (models/build.py, demo.py), which
    turned off the hub for the caller's own transformers code. The library now reads folders with
    local_files_only; only the `transbench` command sets the variable, in its own process."""
    import subprocess
    import sys

    from transbench.models import build

    build.build_model(build.resolve("bert-tiny"), "base").save_pretrained(tmp_path / "ckpt")
    script = (
        "import os, sys\n"
        "from transbench import api, demo\n"
        "from transbench.models import build\n"
        "import transformers, huggingface_hub.constants as c\n"
        "assert 'HF_HUB_OFFLINE' not in os.environ, 'api import set HF_HUB_OFFLINE'\n"
        "assert not c.HF_HUB_OFFLINE\n"
        "m = build.build_model(build.resolve(sys.argv[1]), 'base')\n"
        "assert 'HF_HUB_OFFLINE' not in os.environ\n"
        "print('ok', type(m).__name__)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    # A hub that cannot be reached: any try to reach it would fail fast instead of passing by luck.
    env["HF_ENDPOINT"] = "http://127.0.0.1:9"
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "ckpt")], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "ok BertModel"


def test_the_command_still_sets_hf_hub_offline_in_its_own_process():
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    script = ("import os, transbench.cli, huggingface_hub.constants as c\n"
              "assert os.environ['HF_HUB_OFFLINE'] == '1' and c.HF_HUB_OFFLINE\n")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
