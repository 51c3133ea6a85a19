"""The input boundary (src/transbench/boundary.py) against hostile and concurrent input, per kind of input: spec
files, model folders (config.json, safetensors headers, tokenizer.json), lengths files, the engine's tuning table,
store rows read back, environment variables, two writers on one run name, outputs that fail, and the counts users
give. Property tests (hypothesis) generate nested, huge, type-confused and unicode inputs; the contract for each:
one line on stderr, exit 2, no traceback, no hang, nothing stored changed."""

from __future__ import annotations

import ast
import hashlib
import json
import math
import os
import re
import signal
import sqlite3
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from process_helpers import first_line
from report_helpers import cell, make_run, ok_result
from test_cli_input import invoke, refused

from transbench import boundary
from transbench.declare import LIMITS
from transbench.errors import SpecError
from transbench.scenarios.inference.spec import RunSpec
from transbench.spec import load_file

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "src" / "transbench"
PY = sys.executable
FAST = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                        HealthCheck.too_slow])


def digest(folder: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())
            if p.is_file() and not p.name.endswith("-shm")}


def one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text and text, text
    return text


# --- generated documents: nested, huge, type-confused, unicode --------------------------------------------

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=20)
KEYS = ["models", "batches", "seqs", "backends", "min_time", "warmup", "min_count", "name", "timeout", "seed"]
documents = st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=10), values, max_size=5)
depths = st.integers(min_value=65, max_value=200_000)


def nested_json(depth: int) -> str:
    return '{"batches": ' + "[" * depth + "]" * depth + "}"


# --- spec files -------------------------------------------------------------------------------------------

@FAST
@given(doc=documents, suffix=st.sampled_from([".json", ".yaml", ".toml"]))
def test_any_spec_document_is_read_or_refused_in_one_line(tmp_path_factory, doc, suffix):
    """Type-confused and unicode documents: a RunSpec's fields, or one SpecError line; nothing else."""
    import yaml

    path = tmp_path_factory.mktemp("spec") / f"s{suffix}"
    if suffix == ".json":
        path.write_text(json.dumps(doc))
    elif suffix == ".yaml":
        path.write_text(yaml.safe_dump(doc, allow_unicode=True))
    else:
        path.write_text("".join(f"{json.dumps(k)} = {json.dumps(v)}\n" for k, v in doc.items()
                                if isinstance(v, (str, int, bool)) and not isinstance(v, float)))
    try:
        load_file(str(path), RunSpec)
    except SpecError as exc:
        one_line(exc)


@pytest.mark.parametrize("text", ["# a \x1f comment\nbatches: [1]\n", "name: \"a\x07b\"\n", "\x00"])
def test_a_yaml_spec_with_a_control_character_is_one_line(tmp_path, text):
    """PyYAML's reader refuses such characters as the loader is made, before the boundary's own checks: a traceback."""
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(SpecError, match="invalid YAML") as exc:
        load_file(str(path), RunSpec)
    one_line(exc.value)


SERVE_KEYS = ["model", "backends", "rates", "concurrency", "duration", "lengths", "arrivals", "max_batch_size",
              "request_timeout", "name", "url"]


@FAST
@given(doc=st.dictionaries(st.sampled_from(SERVE_KEYS) | st.text(max_size=10), values, max_size=5),
       mark=st.none() | st.sampled_from(["inference", "training", "serve", "micro"]) | st.text(max_size=12),
       command=st.sampled_from([("serve", "serve"), ("run", "inference"), ("train", "training")]))
def test_any_spec_file_given_to_serve_run_or_train_is_read_or_refused_in_one_line(tmp_path_factory, doc, mark,
                                                                                 command):
    """`serve --spec` reads a serve run's spec (runs --spec writes it with a first line naming the run's kind): any
    document, under any such line or none, given to any command's --spec, is that command's spec or one line."""
    import yaml

    from transbench.cli.options import build_spec
    from transbench.scenarios.serve.spec import ServeSpec
    from transbench.scenarios.training.spec import TrainSpec
    from transbench.store import export

    path = tmp_path_factory.mktemp("spec") / "s.yaml"
    head = "" if mark is None else export.spec_mark("r", mark).replace("\n", " ") + "\n"
    path.write_text(head + yaml.safe_dump(doc, allow_unicode=True))
    cls = {"serve": ServeSpec, "run": RunSpec, "train": TrainSpec}[command[0]]
    try:
        build_spec(cls, str(path), {}, kind=command[1])
    except SpecError as exc:
        one_line(exc)


@pytest.mark.parametrize("depth", [65, 400, 1_100, 5_000, 200_000])
@pytest.mark.parametrize("block", [False, True])
def test_deep_yaml_is_refused_from_its_tokens_before_it_is_composed(monkeypatch, capfd, depth, block):
    # Caught as a RecursionError from PyYAML's composer, depths past the recursion limit took up to a second each,
    # and under the CLI in a pytest worker finalizers printed "Exception ignored in sys.unraisablehook" beside the
    # error line. The composer must not even start on such a document.
    import yaml

    def composed(*args, **kw):
        raise AssertionError("composed a document deeper than the bound")

    monkeypatch.setattr(yaml.composer.Composer, "compose_node", composed)
    text = ("".join(f"{' ' * i}k{i}:\n" for i in range(min(depth, 2_000))) + " " * 2_000 + "x: 1\n" if block
            else "batches: " + "[" * depth + "]" * depth)
    start = time.monotonic()
    with pytest.raises(SpecError, match="nests deeper than 64 levels"):
        boundary.loads_yaml(text, "spec file s.yaml")
    assert time.monotonic() - start < 2
    assert capfd.readouterr().err == ""


@pytest.mark.parametrize("depth", [64, 400, 200_000])
def test_deep_toml_is_refused_from_its_brackets_before_it_is_parsed(monkeypatch, depth):
    # tomllib recurses into nested arrays, as PyYAML's composer does (the test above says why that is not clean)
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    def parsed(*args, **kw):
        raise AssertionError("parsed a document deeper than the bound")

    monkeypatch.setattr(tomllib, "loads", parsed)
    with pytest.raises(SpecError, match="nests deeper than 64 levels"):
        boundary.loads_toml("batches = " + "[" * depth + "]" * depth, "spec file s.toml")


def test_brackets_in_toml_strings_and_comments_open_nothing():
    lines = ['a = "[[[[ \\" [[[["', "b = '[[['", 'c = """', "[[[[[", '"""', "d = '''[[['''", "# [[[[[[[",
             'e = "' + "[" * 100 + '"', "[t]", "x = [1, [2]]", "[[arr]]", "y = {z = [1]}"]
    doc = boundary.loads_toml("\n".join(lines) + "\n", "spec file s.toml", depth=6)  # arr[0].y.z's 1: six levels
    assert doc["a"] == '[[[[ " [[[[' and doc["e"] == "[" * 100 and doc["t"] == {"x": [1, [2]]}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(depth=depths, kind=st.sampled_from(["json", "yaml", "yaml-block", "toml"]))
def test_deeply_nested_spec_files_are_refused_by_the_cli(tmp_path_factory, depth, kind):
    d = tmp_path_factory.mktemp("nest")
    text = {"json": nested_json(depth), "yaml": "batches: " + "[" * depth + "]" * depth,
            "yaml-block": "".join(f"{' ' * i}k{i}:\n" for i in range(min(depth, 3000))) + " " * 3000 + "x: 1\n",
            "toml": "batches = " + "[" * depth + "]" * depth}[kind]
    spec = d / f"s.{kind.split('-')[0]}"
    spec.write_text(text)
    start = time.monotonic()
    line = refused(invoke("run", "--spec", spec, "--db", d / "x.db"))
    assert time.monotonic() - start < 20
    assert "nests deeper" in line or "above the" in line or "invalid" in line
    assert not (d / "x.db").exists()


@pytest.mark.parametrize("text,needle", [
    ("1: 2\n", "key '1' at line 1 is not text"),
    ("null: 2\n", "key 'null' at line 1 is not text"),
    ("2024-01-01: [1]\n", "key '2024-01-01' at line 1 is not text"),
    ("? [1, 2]\n: 3\n", "is not text"),
    ("batches: &a [1]\n*a : 2\n", "is not text"),
    # YAML 1.1's number forms, which PyYAML read and the command line refuses (`--min-time 0_2`, `--batch 0x10`)
    ("models: [bert-tiny]\nmin_time: 0_2\n", "min_time: expected a number, got '0_2'"),  # read as 2.0
    ("models: [bert-tiny]\nbatches: [1:30]\n", "'1:30'"),  # base 60: batch 90
    ("models: [bert-tiny]\nbatches: [0x10]\n", "'0x10'"),
    ("models: [bert-tiny]\nbatches: [1_0]\n", "'1_0'"),
])
def test_yaml_keys_and_numbers_the_command_line_would_not_take_are_refused(tmp_path, text, needle):
    spec = tmp_path / "s.yaml"
    spec.write_text(text)
    assert needle in refused(invoke("run", "--spec", spec, "--db", tmp_path / "x.db"))
    assert not (tmp_path / "x.db").exists()


_DECIMAL = re.compile(r"[-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)(?:[eE][-+]?[0-9]+)?")


@FAST
@given(text=st.text(alphabet="0123456789_:.xXoObBeE+-", min_size=1, max_size=12))
@example(text="0_2")
@example(text="1:30")
def test_a_yaml_number_reads_as_its_decimal_value_or_is_refused_in_one_line(tmp_path, text):
    """Whatever number-like text a spec file gives min_time, it reads as Python reads that decimal, or the file
    is refused in one line: never a YAML 1.1 reading the command line would not make (0_2 as 2.0, 1:30 as 90)."""
    spec = tmp_path / "n.yaml"
    spec.write_text(f"models: [bert-tiny]\nmin_time: {text}\n")
    try:
        got = load_file(str(spec), RunSpec)["min_time"]
    except SpecError as exc:
        assert "\n" not in str(exc)
        return
    assert _DECIMAL.fullmatch(text) and got == float(text)


def test_yaml_numbers_in_their_decimal_forms_read_as_numbers(tmp_path):
    from transbench.spec import load_file

    spec = tmp_path / "s.yaml"
    spec.write_text("batches: [010, +2]\nmin_time: 1e-1\nwarmup: 3\nseq_stdev: .5\n")
    got = load_file(str(spec))
    assert (got["batches"], got["min_time"], got["seq_stdev"]) == ([10, 2], 0.1, 0.5)


@FAST
@given(width=st.integers(min_value=2, max_value=12), levels=st.integers(min_value=4, max_value=12))
def test_yaml_alias_bombs_are_refused_quickly(tmp_path_factory, width, levels):
    """Each level repeats the one before `width` times: a few hundred bytes that stand for width**levels values."""
    lines = ["l0: &l0 [" + ", ".join(["x"] * width) + "]"]
    lines += [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * width) + "]" for i in range(1, levels)]
    spec = tmp_path_factory.mktemp("bomb") / "s.yaml"
    spec.write_text("\n".join(lines) + "\n")
    start = time.monotonic()
    try:
        load_file(str(spec), RunSpec)
    except SpecError as exc:
        one_line(exc)
    assert time.monotonic() - start < 5
    if width ** levels > boundary.NODES:
        with pytest.raises(SpecError, match="once its aliases are expanded"):
            load_file(str(spec), RunSpec)


def test_a_huge_spec_file_and_a_named_pipe_are_refused_before_reading(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("batches: [" + "1, " * (boundary.SPEC_BYTES // 3) + "1]\n")
    assert "bytes read for it" in refused(invoke("run", "--spec", big, "--db", tmp_path / "x.db"))
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    assert "not a regular file" in refused(invoke("run", "--spec", fifo, "--db", tmp_path / "x.db"))
    assert not (tmp_path / "x.db").exists()


# --- model folders ----------------------------------------------------------------------------------------

TINY_BERT = {"model_type": "bert", "hidden_size": 48, "num_hidden_layers": 2, "num_attention_heads": 3,
             "intermediate_size": 96, "vocab_size": 1000, "max_position_embeddings": 128}


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    """bert-tiny's weights as one safetensors file (2 layers)."""
    from safetensors.torch import save_file

    from transbench.models import build

    path = tmp_path_factory.mktemp("w") / "model.safetensors"
    model = build.build_model(build.resolve("bert-tiny"), "base")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


def folder_with(tmp_path: Path, weights: Path, config) -> Path:
    d = tmp_path / "ckpt"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    target = d / "model.safetensors"
    if not target.exists():
        os.symlink(weights, target)
    return d


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edit=st.dictionaries(st.sampled_from(["hidden_size", "num_hidden_layers", "num_attention_heads",
                                             "vocab_size", "intermediate_size", "max_position_embeddings",
                                             "model_type", "architectures"]), values, min_size=1, max_size=3))
def test_config_json_of_any_type_confused_sizes_is_one_line(tmp_path_factory, weights, edit):
    from transbench.models import build

    d = folder_with(tmp_path_factory.mktemp("cfg"), weights, {**TINY_BERT, **edit})
    try:
        build.resolve(str(d))
    except SpecError as exc:
        one_line(exc)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(["layer_norm_eps", "initializer_range", "hidden_dropout_prob", "hidden_size"]),
       value=st.floats())
def test_a_config_number_json_does_not_allow_is_refused_in_one_line(tmp_path_factory, weights, field, value):
    """json.dumps writes NaN and Infinity, and Python's reader took them: a NaN epsilon built a model of NaN outputs,
    whose every cell read `wrong`. Standard JSON has no such numbers, so config.json's reader refuses them."""
    from transbench.models import build

    d = folder_with(tmp_path_factory.mktemp("cfg"), weights, {**TINY_BERT, field: value})
    try:
        build.resolve(str(d))
    except SpecError as exc:
        one_line(exc)
        assert math.isfinite(value) or "is not a number JSON allows" in str(exc)
    else:
        assert math.isfinite(value)


# Fields of a BERT config.json that transformers reads while building or running the model, besides the sizes above.
RUN_FIELDS = ["type_vocab_size", "layer_norm_eps", "initializer_range", "hidden_dropout_prob",
              "attention_probs_dropout_prob", "pad_token_id", "classifier_dropout", "chunk_size_feed_forward",
              "bos_token_id", "eos_token_id", "num_labels", "hidden_act", "position_embedding_type", "is_decoder",
              "use_cache", "torch_dtype", "tie_word_embeddings", "output_hidden_states", "output_attentions",
              "return_dict", "pruned_heads", "add_cross_attention", "problem_type", "id2label", "label2id"]
config_values = values | st.sampled_from([0, 1, -1, 2, 2**31, 2**63, 1e-300, 1e300, 0.5, 2.5, "gelu", "relu"])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(edit=st.dictionaries(st.sampled_from(RUN_FIELDS), config_values, min_size=1, max_size=2))
@example(edit={"chunk_size_feed_forward": None})
def test_any_config_field_a_forward_reads_is_refused_in_one_line_or_runs_a_cell(tmp_path_factory, weights, edit):
    """config.json with any of those fields set to any JSON value: refused in one line before anything is built, or
    the model builds and runs a cell's inputs. `chunk_size_feed_forward: null` built, and every cell was an `error`
    (TypeError in the forward), exit 0."""
    import torch

    from transbench.cells import Cell
    from transbench.models import build
    from transbench.scenarios.inference.measure import cell_inputs

    d = folder_with(tmp_path_factory.mktemp("cfg"), weights, {**TINY_BERT, **edit})
    try:
        ref = build.resolve(str(d))
    except SpecError as exc:
        one_line(exc)
        return
    model = build.build_model(ref, "base")
    inputs = cell_inputs(Cell(model=str(d), task="base", backend="eager", dtype="fp32", batch=1, seq=8,
                              device="cpu"), ref.shape)
    with torch.no_grad():
        model(**inputs.model_kwargs())


@pytest.fixture(scope="module")
def decoder(tmp_path_factory) -> Path:
    """A 1-layer GPT-2 folder as save_pretrained writes it (config.json, weights, generation_config.json)."""
    import transformers

    d = tmp_path_factory.mktemp("gpt2")
    cfg = transformers.GPT2Config(n_embd=32, n_head=2, n_layer=1, n_positions=64, vocab_size=100, bos_token_id=1,
                                  eos_token_id=1)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(d)
    return d


def decoder_with(tmp_path: Path, decoder: Path) -> Path:
    d = tmp_path / "ckpt"
    d.mkdir()
    for name in ("config.json", "model.safetensors"):
        os.symlink(decoder / name, d / name)
    return d


GENERATION_FIELDS = ["max_new_tokens", "max_length", "min_new_tokens", "eos_token_id", "pad_token_id",
                     "bos_token_id", "do_sample", "temperature", "top_k", "top_p", "num_beams", "use_cache"]
generation_documents = values | st.dictionaries(st.sampled_from(GENERATION_FIELDS), config_values, max_size=3)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(document=generation_documents)
@example(document=[1, 2])
@example(document={"max_new_tokens": "x"})
def test_any_generation_config_json_is_refused_in_one_line_or_read_by_transformers(tmp_path_factory, decoder,
                                                                                   document):
    """from_pretrained of a class that can generate reads generation_config.json in every cell: a list there, or a
    max_new_tokens of "x", made every causal-lm and generate cell of the folder an `error` ("TypeError: 'list' object
    is not a mapping"), exit 0. The folder's check reads it first: refused in one line, or transformers reads it."""
    from transformers import GenerationConfig

    from transbench.models import build

    d = decoder_with(tmp_path_factory.mktemp("gen"), decoder)
    (d / "generation_config.json").write_text(json.dumps(document))
    try:
        build.resolve(str(d))
    except SpecError as exc:
        assert "generation_config.json" in one_line(exc)
    else:
        GenerationConfig.from_pretrained(str(d))


@pytest.mark.parametrize("kind", ["folder", "fifo", "loop", "empty"])
def test_a_generation_config_json_that_is_no_json_file_is_refused_in_one_line(tmp_path, decoder, kind):
    from transbench.models import build

    d = decoder_with(tmp_path, decoder)
    path = d / "generation_config.json"
    {"folder": path.mkdir, "fifo": lambda: os.mkfifo(path), "loop": lambda: os.symlink(path.name, path),
     "empty": lambda: path.write_text("")}[kind]()
    with pytest.raises(SpecError) as exc:
        build.resolve(str(d))
    assert "generation_config.json" in one_line(exc.value)


def test_a_broken_generation_config_json_beside_an_encoder_is_not_read(tmp_path, weights):
    """No class of an encoder's tasks can generate, so transformers never reads the file there: its folder runs."""
    from transbench.models import build

    d = folder_with(tmp_path, weights, TINY_BERT)
    (d / "generation_config.json").write_text("[1, 2]")
    assert build.resolve(str(d)).family == "bert"


@pytest.mark.parametrize("config,needle", [
    (nested_json(100_000).replace('"batches"', '"model_type": "bert", "x"'), "nests deeper"),
    ("[" * 100_000, "nests deeper"),
    ({**TINY_BERT, "num_hidden_layers": 200_000}, "above the 4,096 transbench builds"),
    ({**TINY_BERT, "num_hidden_layers": 3000}, "but the weight files hold 2 layers"),
])
def test_config_json_deep_or_far_beyond_its_weights_is_refused_before_building(tmp_path, weights, config, needle):
    d = folder_with(tmp_path, weights, config)
    start = time.monotonic()
    line = refused(invoke("run", "--model", d, "--device", "cpu", "--db", tmp_path / "x.db"))
    assert needle in line and time.monotonic() - start < 30
    assert not (tmp_path / "x.db").exists()


@pytest.mark.parametrize("command", [["run"], ["serve", "--offline"], ["train"], ["micro", "layer"], ["server"]])
def test_a_model_folder_named_in_bytes_that_are_not_utf8_is_refused(tmp_path, weights, command):
    """Such a name reaches Python as lone surrogates: it resolved, and every cell was stored as an `error`
    (UnicodeEncodeError in the worker: safetensors opens UTF-8 paths only), exit 0."""
    d = folder_with(tmp_path, weights, TINY_BERT).rename(tmp_path / os.fsdecode(b"ckpt\xff"))
    line = refused(invoke(*command, "--model", d, "--device", "cpu", *(["--db", tmp_path / "x.db"]
                                                                        if command != ["server"] else [])))
    assert "is not UTF-8 text" in line and "\\udcff" in line
    assert not (tmp_path / "x.db").exists()


@pytest.mark.parametrize("option,content", [
    ("--trace", '{"timestamp": 0, "input_length": 8, "output_length": 1}\n'
                '{"timestamp": 500, "input_length": 8, "output_length": 1}\n'),
    ("--lengths", "8\n8\n"),
])
def test_a_file_named_in_bytes_that_are_not_utf8_is_refused_before_its_run_stores_it(tmp_path, monkeypatch, option,
                                                                                     content):
    """`serve --trace` of such a file measured, exit 0, and the run's spec held its name as a lone surrogate, which
    the TOML `runs --spec` wrote from it could not read back. Every text setting of a spec is refused so (spec.coerce),
    from the command line and a spec file alike."""
    monkeypatch.chdir(tmp_path)
    name = os.fsdecode(b"f\xff.txt")
    Path(name).write_text(content)
    value = name if option == "--trace" else f"counts:{name}"
    line = refused(invoke("serve", "--model", "bert-tiny", "--device", "cpu", "--warmup", "0",
                          *(["--offline", "--duration", "0.2"] if option == "--lengths" else []), option, value,
                          "--db", "x.db"))
    assert line.startswith(f"error: {option} ") and "is not UTF-8 text" in line
    spec = tmp_path / "s.json"
    spec.write_text(json.dumps({"models": ["bert-tiny"], "compile_mode": "\udcff"}))
    refused(invoke("run", "--spec", spec, "--db", "x.db"), "compile_mode: '\\udcff' is not UTF-8 text")
    assert not (tmp_path / "x.db").exists()


@FAST
@given(header=st.binary(max_size=200) | values.map(lambda v: json.dumps(v).encode())
       | depths.map(lambda n: nested_json(n).encode()),
       length=st.none() | st.integers(min_value=0, max_value=2**64 - 1))
def test_any_safetensors_header_is_read_or_refused_in_one_line(tmp_path_factory, header, length):
    path = tmp_path_factory.mktemp("st") / "model.safetensors"
    path.write_bytes(struct.pack("<Q", len(header) if length is None else length) + header)
    try:
        shapes = boundary.safetensors_shapes(path, "weight file")
    except SpecError as exc:
        one_line(exc)
    else:
        assert all(isinstance(s, tuple) for s in shapes.values())


def _lying(weights: Path, edit) -> bytes:
    """`weights` with its header edited by `edit(header)`; the data bytes as they were."""
    raw = weights.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    edit(header)
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + raw[8 + n:]


def _tensors(header):
    return [v for k, v in header.items() if k != "__metadata__"]


@pytest.mark.parametrize("edit, needle", [
    (lambda h: _tensors(h)[0].update(dtype="F64"), "needs"),  # its offsets still fit F32
    (lambda h: [t.update(dtype="ZZ") for t in _tensors(h)], "which safetensors does not know"),
    (lambda h: [t.update(data_offsets=[0, 4]) for t in _tensors(h)], "needs"),
    (lambda h: _tensors(h)[1].update(shape=_tensors(h)[0]["shape"], data_offsets=_tensors(h)[0]["data_offsets"]),
     "starts at byte"),
])
def test_a_safetensors_header_that_lies_is_refused_before_the_run(tmp_path, weights, edit, needle):
    """Headers whose dtype is unknown, whose offsets do not hold their shape, or whose tensors overlap passed the
    boundary: the run was stored and every cell was an `error` from the library."""
    d = folder_with(tmp_path, weights, TINY_BERT)
    (d / "model.safetensors").unlink()
    (d / "model.safetensors").write_bytes(_lying(weights, edit))
    line = refused(invoke("run", "--model", d, "--device", "cpu", "--db", tmp_path / "x.db"))
    assert needle in line and "model.safetensors" in line
    assert not (tmp_path / "x.db").exists()


@FAST
@given(dtype=st.sampled_from(sorted(boundary.SAFETENSORS_BITS)), data=st.data())
def test_a_float_parameter_of_any_stored_dtype_loads_its_values_or_is_refused(tmp_path_factory, weights, dtype, data):
    """A floating-point parameter stored in a float dtype loads as its stored values, in fp32; stored in any other
    (integers, bool, complex, packed 4- and 6-bit floats) it is refused in one line naming the tensor and its dtype.
    transformers read an int8 or bool tensor's numbers as the weights, and failed each cell of an F4 one."""
    import torch
    from safetensors import safe_open

    from transbench.models import build

    key = "embeddings.LayerNorm.weight"  # 48 floats
    header, blobs = {}, []
    with safe_open(str(weights), "pt") as f:
        for k in f.keys():
            t = f.get_tensor(k)
            kind, raw = ("F32", t.numpy().tobytes()) if k != key else (dtype, data.draw(st.binary(
                min_size=t.numel() * boundary.SAFETENSORS_BITS[dtype] // 8,
                max_size=t.numel() * boundary.SAFETENSORS_BITS[dtype] // 8)))
            start = sum(map(len, blobs))
            header[k] = {"dtype": kind, "shape": list(t.shape), "data_offsets": [start, start + len(raw)]}
            blobs.append(raw)
    text = json.dumps(header).encode()
    d = tmp_path_factory.mktemp("dtype") / "ckpt"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(TINY_BERT))
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    if dtype not in ("F64", "F32", "F16", "BF16", "F8_E5M2", "F8_E4M3", "F8_E8M0"):
        with pytest.raises(SpecError) as exc:
            build.resolve(str(d))
        assert f"tensor {key} is stored as {dtype} in the weight files, where the model holds floating-point " \
               "values" in one_line(exc.value)
        return
    loaded = build.build_model(build.resolve(str(d)), "base").state_dict()[key]
    with safe_open(str(d / "model.safetensors"), "pt") as f:
        stored = f.get_tensor(key).float()
    assert loaded.dtype == torch.float32 and torch.allclose(loaded, stored, rtol=0, atol=0, equal_nan=True)


@FAST
@given(data=st.data())
def test_any_header_the_boundary_takes_safetensors_opens(tmp_path_factory, weights, data):
    """Edits of a real header (dtypes, shapes, offsets): refused in one line, or the library reads every tensor."""
    from safetensors import safe_open

    def edit(header):
        for t in _tensors(header):
            field = data.draw(st.sampled_from(["dtype", "shape", "data_offsets", None]))
            if field == "dtype":
                t["dtype"] = data.draw(st.sampled_from(["F32", "F16", "F64", "I8", "BOOL", "F4", "ZZ"]))
            elif field == "shape":
                t["shape"] = data.draw(st.lists(st.integers(0, 64), max_size=3))
            elif field == "data_offsets":
                t["data_offsets"] = sorted(data.draw(st.lists(st.integers(0, 40_000), min_size=2, max_size=2)))

    path = tmp_path_factory.mktemp("st") / "model.safetensors"
    path.write_bytes(_lying(weights, edit))
    try:
        boundary.safetensors_shapes(path, "weight file")
    except SpecError as exc:
        one_line(exc)
        return
    with safe_open(str(path), "np") as f:
        for k in f.keys():
            f.get_slice(k)


@FAST
@given(text=values.map(json.dumps) | depths.map(nested_json)
       | values.map(lambda v: json.dumps({"model": {"type": v, "vocab": v}})))
def test_any_tokenizer_json_is_read_or_refused_in_one_line(tmp_path_factory, text):
    from transbench.models.build import read_tokenizer_json

    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    path.write_text(text)
    try:
        assert isinstance(read_tokenizer_json(path), str)
    except SpecError as exc:
        one_line(exc)


# --- lengths files ----------------------------------------------------------------------------------------

text_lines = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)


@FAST
@given(lines=st.lists(text_lines | st.integers(min_value=-5, max_value=10**30).map(str)
                      | st.sampled_from(["٣", "１２", "৪", "1e3", "0x10", " 7 ", "\ufeff5"]), max_size=30))
def test_any_counts_file_is_read_or_refused_in_one_line(tmp_path_factory, lines):
    from transbench.scenarios.serve import lengths

    path = tmp_path_factory.mktemp("len") / "counts.txt"
    content = "\n".join(lines)
    path.write_text(content, encoding="utf-8")
    try:
        out = lengths.parse(f"counts:{path}", 4096)
    except SpecError as exc:
        one_line(exc)
    else:
        assert all(1 <= c <= 4096 for c in out.counts)
        read = path.read_text(encoding="utf-8-sig").replace("\r\n", "\n").replace("\r", "\n").split("\n")
        assert all(x.strip().isascii() for x in read), f"{read} read as counts"


def test_non_ascii_digits_in_a_counts_file_are_refused(tmp_path):
    from transbench.scenarios.serve import lengths

    path = tmp_path / "counts.txt"
    path.write_text("12\n٣\n")
    with pytest.raises(SpecError, match="every line must be a token count"):
        lengths.parse(f"counts:{path}", 4096)


# --- the engine's tuning table ----------------------------------------------------------------------------

@FAST
@given(text=depths.map(nested_json) | values.map(json.dumps) | text_lines)
def test_any_tuning_table_is_a_problem_line_or_read(tmp_path_factory, text):
    from transbench.engine import tuning

    path = tmp_path_factory.mktemp("tune") / tuning.TABLE_NAME
    path.write_text(text)
    problem = tuning._table_problem(path)
    assert problem is None or "\n" not in problem
    tuning.Tuner(path)  # a table it cannot use is ignored (re-timed), never a traceback


def test_a_torch_errors_cpp_stack_is_cut_from_its_line():
    """torch's C++ errors carry where they were raised and a stack of frames, which every refusal and cell error
    that quotes an exception (boundary.exception_line) showed after the cause."""
    import torch

    with pytest.raises(Exception) as exc:
        torch.empty(2**70)
    assert "Exception raised from" in str(exc.value)  # what torch says (else the test tests nothing)
    line = boundary.exception_line(exc.value)
    assert line.endswith("Overflow when unpacking long long") and "frame #" not in line, line
    assert boundary.exception_line(ValueError("a\nb")) == "a b"


@pytest.mark.parametrize("reader", ["boundary", "safetensors", "tuning table"])
def test_a_pipe_put_in_a_files_place_after_its_check_does_not_block(tmp_path, monkeypatch, reader):
    """A file changed while it is read: a FIFO in its place after the stat that found a regular file held the
    blocking open() for ever (boundary.read_bytes, boundary.safetensors_tensors, tuning.read_table). The stat is
    faked to say a regular file."""
    from transbench.engine import tuning

    fifo = tmp_path / "x.json"
    os.mkfifo(fifo)
    regular, real_stat = os.stat(__file__), os.stat
    monkeypatch.setattr(os, "stat", lambda p, *a, **k: regular if str(p) == str(fifo) else real_stat(p, *a, **k))
    got = {}

    def read():
        try:
            {"boundary": lambda: boundary.read_bytes(fifo, "x.json", limit=2**20),
             "safetensors": lambda: boundary.safetensors_tensors(fifo, "x.json"),
             "tuning table": lambda: tuning.read_table(fifo)}[reader]()
        except (SpecError, ValueError) as exc:
            got["error"] = str(exc)

    reading = threading.Thread(target=read, daemon=True)
    reading.start()
    reading.join(10)
    if reading.is_alive():
        with open(fifo, "w"):  # a writer releases the blocked open()
            pass
        pytest.fail("the read of a FIFO blocked")
    assert "not a regular file" in got["error"]


def test_a_named_pipe_as_the_tuning_table_does_not_block(tmp_path):
    from transbench.engine import tuning

    fifo = tmp_path / tuning.TABLE_NAME
    os.mkfifo(fifo)
    assert "not a regular file" in tuning._table_problem(fifo)
    assert tuning.Tuner(fifo).table == {}


# --- store rows read back ---------------------------------------------------------------------------------

def _store(tmp_path: Path) -> Path:
    db = tmp_path / "s.db"
    make_run(str(db), "A", [(cell(), ok_result([1.0, 1.1, 0.9] * 5, 1))])
    return db


COLUMN_VALUES = values | depths.map(lambda n: "[" * n + "]" * n) | st.text(max_size=30)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(column=st.sampled_from(["cells.record", "cells.samples", "cells.info", "cells.warnings", "cells.cell",
                               "runs.spec", "runs.env", "cells.key", "runs.name", "record.latency_ms",
                               "record.model", "env.gpus", "env.torch"]),
       value=COLUMN_VALUES)
def test_any_stored_row_is_read_or_reported_damaged_and_never_merged(tmp_path_factory, column, value):
    """A row edited by hand or by another program: `runs`, `report --format md`-like reading (export) and `compare`
    read it or refuse in one line; `merge` copies nothing from a store it refuses."""
    from transbench.store import Store, export

    d = tmp_path_factory.mktemp("rows")
    db = _store(d)
    con = sqlite3.connect(db)
    table, col = column.split(".")
    text = value if isinstance(value, str) and value.startswith("[") else json.dumps(value)
    if table in ("record", "env"):
        outer = "cells" if table == "record" else "runs"
        row = json.loads(con.execute(f"SELECT {table} FROM {outer}").fetchone()[0])
        row[col] = "__VALUE__"  # spliced as text: json_set() refuses what it cannot parse (2,000 levels deep)
        con.execute(f"UPDATE {outer} SET {table} = ?", (json.dumps(row).replace('"__VALUE__"', text),))
    elif col in ("key", "name"):
        con.execute(f"UPDATE {table} SET {col} = ?", (value if isinstance(value, (str, int, float)) and not
                                                       isinstance(value, bool) else text,))
    else:
        con.execute(f"UPDATE {table} SET {col} = ?", (text,))
    con.commit()
    con.close()
    before = digest(d)
    for args in (["runs", "--db", db], ["compare", "A", "A", "--db", db]):
        res = invoke(*args)
        assert "Traceback" not in res.output
        assert res.exit_code in (0, 1, 2), res.output
        if res.exit_code == 2:
            refused(res)
    store = Store(str(db), readonly=True)
    try:
        export.records(store)
    except SpecError as exc:
        one_line(exc)
    finally:
        store.close()
    into = d / "into.db"
    make_run(str(into), "B", [(cell(backend="sdpa"), ok_result([2.0] * 10, 1))])
    target = digest(d)["into.db"]
    res = invoke("merge", db, "--into", into)
    assert "Traceback" not in res.output
    if res.exit_code == 2:
        refused(res)
        assert digest(d)["into.db"] == target
    assert digest(d)["s.db"] == before["s.db"]


def test_a_figure_stored_as_text_is_damage_naming_the_run_and_cell(tmp_path):
    db = _store(tmp_path)
    con = sqlite3.connect(db)
    con.execute("UPDATE cells SET record = json_set(record, '$.latency_ms', 'fast')")
    con.commit()
    con.close()
    line = refused(invoke("report", "A", "--db", db, "--out", tmp_path / "rep"))
    assert "damaged" in line and "run 'A'" in line and "cell 'backend eager" in line and "latency_ms" in line
    into = tmp_path / "into.db"
    make_run(str(into), "B", [])
    before = digest(tmp_path)["into.db"]
    assert "latency_ms" in refused(invoke("merge", db, "--into", into))
    assert digest(tmp_path)["into.db"] == before


def test_every_number_key_the_export_knows_is_checked_as_a_number():
    from transbench.store import db, export

    assert set(export.SPEED_KEYS) <= db.NUMBER_KEYS


# --- environment variables --------------------------------------------------------------------------------

@FAST
@given(value=st.text(max_size=12) | st.integers().map(str) | st.sampled_from(["0", "-5", "99999999", "٣", "1e9"]))
def test_any_columns_value_gives_a_sane_width(monkeypatch, value):
    from transbench.cli import tables

    if "\0" in value:
        return
    monkeypatch.setenv("COLUMNS", value)
    assert tables.MIN_WIDTH <= tables._width() <= tables.MAX_WIDTH


@pytest.mark.parametrize("value", ["0", "-5", "99999999"])
def test_absurd_terminal_widths_still_print_a_table(tmp_path, value):
    db = _store(tmp_path)
    out = subprocess.run([PY, "-m", "transbench", "runs", "--db", str(db)], capture_output=True, text=True,
                         env={**os.environ, "COLUMNS": value}, timeout=120)
    assert out.returncode == 0 and "A" in out.stdout and len(max(out.stdout.splitlines(), key=len)) <= 1000


@pytest.mark.parametrize("var,value", [("TRANSBENCH_EXTRA_BACKENDS", "no_such_module"),
                                       ("TRANSBENCH_EXTRA_BACKENDS", "a,,b"),
                                       ("TRANSBENCH_EXTRA_BACKENDS", "x" * 5000),
                                       # a module whose own import fails: ImportError, not ModuleNotFoundError
                                       ("TRANSBENCH_EXTRA_BACKENDS", "asyncio.windows_events")])
def test_bad_environment_variables_are_one_line(tmp_path, monkeypatch, var, value):
    from transbench import backends

    monkeypatch.setenv(var, value)
    monkeypatch.setattr(backends, "_REGISTRY", None)
    line = refused(invoke("run", "--model", "bert-tiny", "--device", "cpu", "--db", tmp_path / "x.db"))
    assert var in line
    monkeypatch.setattr(backends, "_REGISTRY", None)


def _bad_cache_dir(tmp_path: Path, kind: str) -> tuple[str, str]:
    """A TRANSBENCH_CACHE_DIR of `kind` and the words its refusal holds."""
    a_file = tmp_path / "notes.txt"
    a_file.write_text("x")
    if kind == "fifo":
        os.mkfifo(tmp_path / "pipe")
    return {"file": (str(a_file), f"{a_file} is a file, not a folder"),
            "fifo": (str(tmp_path / "pipe"), "pipe is a file, not a folder"),
            "under a file": (str(a_file / "cache"), f"{a_file} is a file, not a folder"),
            # /proc takes no new file, not even root's (a folder's permissions do not stop root)
            "unwritable": ("/proc/self/cache", "a file made in /proc/self failed"),
            "damaged table": (str(tmp_path / "damaged"), "it is not valid JSON"),
            "long": ("x" * 4097, "is 4,097 characters long"),
            "newline": (f"{tmp_path}/a\nb", "a character that does not print"),
            "escape": (f"{tmp_path}/\x1b[2J", "\\x1b[2J holds a character that does not print"),
            "not utf-8": (f"{tmp_path}/caf\udce9", "is not UTF-8"),
            "tilde": ("~/cache", "opens with a '~' no shell expanded")}[kind]


@pytest.mark.parametrize("kind", ["file", "fifo", "under a file", "unwritable", "damaged table", "long", "newline",
                                  "escape", "not utf-8", "tilde"])
def test_a_bad_cache_dir_in_the_environment_is_refused_before_anything_runs(tmp_path, monkeypatch, kind):
    """$TRANSBENCH_CACHE_DIR, the folder of the fused engine's tuning table, read through the boundary by every
    command that builds the engine: `run --backend fused` ran its cells with their tuning kept nowhere, without a
    word, and one of a newline made a folder so named. Nothing is created or changed."""
    value, words = _bad_cache_dir(tmp_path, kind)
    if kind == "damaged table":
        (tmp_path / "damaged").mkdir()
        (tmp_path / "damaged" / "engine-tuning.json").write_text('{"cut')
    monkeypatch.setenv("TRANSBENCH_CACHE_DIR", value)
    before = sorted(os.walk(tmp_path))
    db = tmp_path / "x.db"
    for args in (["run", "--model", "bert-tiny", "--backend", "eager,fused", "--device", "cpu", "--db", db],
                 ["serve", "--model", "bert-tiny", "--backend", "fused", "--device", "cpu", "--duration", "0.1",
                  "--db", db],
                 ["demo", "--model", "bert-tiny", "--backend", "fused", "--device", "cpu", "--prompt", "a"],
                 ["tune", "--model", "bert-tiny", "--batch", "1", "--seq", "8"]):
        refused(invoke(*args), "TRANSBENCH_CACHE_DIR", words)
    assert sorted(os.walk(tmp_path)) == before


def test_the_default_table_follows_the_xdg_rules_and_a_user_with_no_home_is_told(tmp_path, monkeypatch):
    """XDG_CACHE_HOME empty or relative is not set (an empty one kept the table in ./transbench of each working
    folder); and a user with no HOME and no passwd entry (a container run as an arbitrary uid), whose Path.home()
    raises RuntimeError, was a traceback from `tune` and an `error` of every fused cell: now one line."""
    import pwd

    from transbench.engine import tuning

    monkeypatch.delenv("TRANSBENCH_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    for xdg in ("", "relative/cache"):
        monkeypatch.setenv("XDG_CACHE_HOME", xdg)
        assert tuning.cache_path() == tmp_path / ".cache" / "transbench" / tuning.TABLE_NAME
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert tuning.cache_path() == tmp_path / "xdg" / "transbench" / tuning.TABLE_NAME

    def no_entry(uid):
        raise KeyError(f"getpwuid(): uid not found: {uid}")
    monkeypatch.delenv("HOME")
    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    assert tuning.cache_path() == tmp_path / "xdg" / "transbench" / tuning.TABLE_NAME  # no home needed
    monkeypatch.delenv("XDG_CACHE_HOME")
    for args in (["run", "--model", "bert-tiny", "--backend", "fused", "--device", "cpu", "--db", tmp_path / "x.db"],
                 ["tune", "--model", "bert-tiny", "--batch", "1", "--seq", "8"]):
        refused(invoke(*args), "no folder for its tuning table: HOME is unset", "set TRANSBENCH_CACHE_DIR")
    assert not (tmp_path / "x.db").exists()


def test_a_cache_dir_is_read_only_where_the_engine_runs(tmp_path, monkeypatch):
    """A backend other than the fused engine reads no tuning table: a bad $TRANSBENCH_CACHE_DIR is not its concern."""
    from transbench import backends

    monkeypatch.setenv("TRANSBENCH_CACHE_DIR", str(tmp_path / "a\nb"))
    assert backends.get("eager").name == "eager"
    with pytest.raises(SpecError, match="TRANSBENCH_CACHE_DIR"):
        backends.get("fused")


@FAST
@given(value=st.text(st.characters(blacklist_characters="\x00"), max_size=40)
       | st.integers(4090, 4200).map(lambda n: "/" * n))
def test_any_folder_an_environment_variable_names_is_a_path_or_one_short_line(monkeypatch, value):
    """boundary.env_folder: any value is unset (None), the path as given, or refused in one line of bounded length
    that names the variable."""
    monkeypatch.setenv("TRANSBENCH_CACHE_DIR", value)
    try:
        folder = boundary.env_folder("TRANSBENCH_CACHE_DIR")
    except boundary.BadInput as exc:
        assert "\n" not in str(exc) and str(exc).isprintable() and len(str(exc)) < 400
        assert "TRANSBENCH_CACHE_DIR" in str(exc)
        return
    assert folder == (Path(value) if value else None)
    assert value.isprintable() and len(value) <= boundary.ENV_CHARS and not value.startswith("~")


# What a module named in TRANSBENCH_EXTRA_BACKENDS may hold where a Backend belongs, or do when it is imported.
NOT_A_BACKEND = st.one_of(st.integers(), st.text(max_size=8), st.lists(st.integers(), max_size=2), st.just({}))
EXTRA_MODULE = st.one_of(
    NOT_A_BACKEND.map(lambda v: f"BACKEND = {v!r}\n"),
    st.one_of(st.integers(), st.text(max_size=4), st.lists(st.integers(), min_size=1, max_size=2)).map(
        lambda v: f"FORCED = {v!r}\n"),
    st.one_of(st.none(), st.integers(-3, 3), st.text(max_size=6)).map(lambda code: f"import sys\nsys.exit({code!r})\n"))
_extra_count = iter(range(10**9))


@FAST
@given(source=EXTRA_MODULE)
def test_any_module_named_as_an_extra_backend_is_read_or_refused_in_one_line(tmp_path_factory, monkeypatch, source):
    """A module's BACKEND of any other type (mpmath.libmp.backend's is 'python') was a traceback, and one that calls
    sys.exit() on import ended `run` there, exit 0, nothing measured."""
    from transbench import backends

    folder = tmp_path_factory.mktemp("extra")
    name = f"extra_backend_{next(_extra_count)}"
    (folder / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("TRANSBENCH_EXTRA_BACKENDS", name)
    monkeypatch.setattr(backends, "_REGISTRY", None)
    try:
        line = refused(invoke("run", "--model", "bert-tiny", "--device", "cpu", "--db", folder / "x.db"))
    finally:
        monkeypatch.setattr(backends, "_REGISTRY", None)
    assert "TRANSBENCH_EXTRA_BACKENDS" in line and name in line
    assert not (folder / "x.db").exists()


# --- two writers on one run name --------------------------------------------------------------------------

HOLDER = """
import sys, time
from transbench.store.db import Store
store = Store(sys.argv[1])
store.claim(sys.argv[2], *sys.argv[3:])  # what open_run does first for a named run, before anything is measured
print("holding", flush=True)
time.sleep(120)
"""


@pytest.mark.slow
def test_a_second_writer_on_a_run_name_is_refused_and_a_dead_one_is_taken_over(tmp_path, quick):
    from transbench import api

    db = tmp_path / "s.db"
    holder = subprocess.Popen([PY, "-c", HOLDER, str(db), "shared"], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    try:
        assert first_line(holder) == "holding"
        before = digest(tmp_path)
        line = refused(invoke("run", "--model", "bert-tiny", "--batch", "1", "--seq", "8", "--name", "shared",
                              "--db", db, *[f"--{k.replace('_', '-')}={v}" for k, v in quick.items()]))
        assert "is being written to store" in line and f"pid {holder.pid}" in line
        assert sqlite3.connect(db).execute("SELECT COUNT(*) FROM cells").fetchone()[0] == 0
        assert digest(tmp_path)["s.db"] == before["s.db"]
        # another shard of the same name is another writer's cells: allowed
        spec = RunSpec(models=["bert-tiny"], batches=[1], seqs=[8], name="shared", shard="1/1", **quick)
        with pytest.raises(SpecError, match="being written"):  # 1/1 is the whole grid the holder holds
            api.run(spec, str(db))
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # the holder died without releasing: its lock is stale and taken over
    out = api.run(RunSpec(models=["bert-tiny"], backends=["eager"], batches=[1], seqs=[8], name="shared", **quick),
                  str(db))
    assert [r["status"] for r in out.records] == ["ok"]
    from transbench.store import Store

    again = Store(str(db))  # released at the end: another writer takes it
    again.claim("shared")
    again.close()


def test_shards_of_one_name_write_side_by_side_and_the_whole_grid_waits_for_them(tmp_path):
    from transbench.store import Store

    db = str(tmp_path / "s.db")
    Store(db).close()
    holders = [subprocess.Popen([PY, "-c", HOLDER, db, "s", part], stdout=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONPATH": str(ROOT / "src")}) for part in ("1/3", "2/3")]
    store = Store(db)
    try:
        assert all(first_line(h) == "holding" for h in holders)
        with pytest.raises(SpecError, match=r"run 's' \(shard 1/3\) is being written"):
            store.claim("s", "1/3")
        with pytest.raises(SpecError, match="being written"):
            store.claim("s")
        store.claim("s", "3/3")  # the third shard writes beside them
    finally:
        store.close()
        for h in holders:
            h.kill()
            h.wait()
    store = Store(db)
    store.claim("s")  # they ended: the whole grid is free
    store.close()


def test_two_writer_processes_race_for_one_name_and_exactly_one_wins(tmp_path):
    """Both claim at once: the claim is one IMMEDIATE transaction, so one holds the name and the other refuses."""
    db = tmp_path / "s.db"
    from transbench.store import Store

    Store(str(db)).close()
    script = HOLDER.replace("time.sleep(120)", "time.sleep(8)")
    procs = [subprocess.Popen([PY, "-c", script, str(db), "race"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")}) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    won = [o for o in outs if "holding" in o[0]]
    lost = [o for o in outs if "is being written" in o[1]]
    assert len(won) == 1 and len(lost) == 1, outs


# --- outputs that fail ------------------------------------------------------------------------------------

def test_stdout_on_a_full_disk_is_one_line(tmp_path):
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full")
    db = _store(tmp_path)
    with open("/dev/full", "w") as full:
        out = subprocess.run([PY, "-m", "transbench", "runs", "--db", str(db)], stdout=full, stderr=subprocess.PIPE,
                             text=True, timeout=120)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.count("\n") == 1 and "No space left on device" in out.stderr


def test_a_closed_pipe_ends_quietly(tmp_path):
    proc = subprocess.Popen([PY, "-m", "transbench", "models"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.read(10)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    proc.wait(timeout=120)
    assert "Traceback" not in err and "Exception ignored" not in err


def test_a_unicode_run_name_under_an_ascii_terminal_prints(tmp_path):
    db = tmp_path / "s.db"
    make_run(str(db), "日本語-ラン", [(cell(), ok_result([1.0] * 10, 1))])
    out = subprocess.run([PY, "-m", "transbench", "runs", "--db", str(db)], capture_output=True, timeout=120,
                         env={**os.environ, "PYTHONIOENCODING": "ascii"})
    assert out.returncode == 0, out.stderr
    assert b"\\u65e5" in out.stdout and b"Traceback" not in out.stderr


def test_a_named_pipe_with_no_reader_as_an_output_file_does_not_hang(tmp_path):
    from transbench.store import export

    fifo = tmp_path / "out.json"
    os.mkfifo(fifo)
    result: list = []

    def write():
        try:
            with export.writing(fifo):
                export.write_text(fifo, "[]")
            result.append("written")
        except SpecError as exc:
            result.append(str(exc))

    t = threading.Thread(target=write, daemon=True)
    t.start()
    t.join(10)
    assert result and "named pipe that no process reads" in result[0]


# --- counts users give ------------------------------------------------------------------------------------

@pytest.mark.parametrize("args,needle", [
    (["run", "--model", "bert-tiny", "--device", "cpu", "--warmup", "1000000000"], "--warmup 1,000,000,000 is above"),
    (["run", "--model", "bert-tiny", "--device", "cpu", "--min-count", "99999999"], "--min-count 99,999,999 is above"),
    (["run", "--model", "bert-tiny", "--device", "cpu", "--batch", "99999999"], "--batch 99,999,999 is above"),
    (["serve", "--model", "bert-tiny", "--device", "cpu", "--offline", "--max-batch-size", "100000000"],
     "--max-batch-size 100,000,000 is above"),
    (["serve", "--model", "bert-tiny", "--device", "cpu", "--offline", "--duration", "1e9"], "--duration"),
    (["run", "--model", "bert-tiny", "--device", "cpu", "--name", "\u200b"], "only invisible characters"),
    (["run", "--model", "bert-tiny", "--device", "cpu", "--name", "\u2060\ufeff "], "only invisible characters"),
    # a name of bytes that are not UTF-8 alone (`--name $'\\xff'`): it was told it held only invisible characters
    (["run", "--model", "bert-tiny", "--device", "cpu", "--name", "\udcff"], "run name '\\udcff' is not UTF-8 text"),
    (["train", "--model", "bert-tiny", "--device", "cpu", "--name", "\udcff\udcfe"], "is not UTF-8 text"),
    # the largest-batch search doubled past --batch's limit (2^21, 2^22, ...) until a batch ran out of the host's memory
    (["train", "--model", "bert-tiny", "--device", "cpu", "--ladder", "--max-batch-limit", "99999999999"],
     "--max-batch-limit 99,999,999,999 is above its limit of 1,048,576"),
    # a world size no rank takes: the cell was launched and stored as an `error`, exit 0
    (["train", "--model", "bert-tiny", "--device", "cpu", "--nnodes", "9223372036854775807", "--rdzv-endpoint", "h:1"],
     "--nnodes 9,223,372,036,854,775,807 is above its limit of 1,048,576"),
    # each within its limit, their product past it
    (["train", "--model", "bert-tiny", "--device", "cpu", "--nnodes", "2048", "--nproc", "1024", "--rdzv-endpoint",
      "h:1"], "--nnodes 2048 x --nproc 1024 is 2,097,152 ranks, above the 1,048,576 a run takes"),
])
def test_counts_past_their_limit_and_invisible_names_are_refused(tmp_path, args, needle):
    assert needle in refused(invoke(*args, "--db", tmp_path / "x.db"))
    assert not (tmp_path / "x.db").exists()


@pytest.mark.parametrize("command,options", [("run", ["--warmup", "--min-count", "--batch", "--new-tokens"]),
                                             ("serve", ["--max-batch-size", "--concurrency"]),
                                             ("train", ["--steps", "--warmup", "--max-batch-limit", "--nnodes"])])
def test_help_states_each_limit(command, options):
    text = " ".join(invoke(command, "--help").output.split())
    assert text.count("at most") >= len(options)


def test_a_serve_resume_refuses_a_lengths_file_that_changed(tmp_path, monkeypatch):
    counts = tmp_path / "counts.txt"
    counts.write_text("8\n12\n")
    db = tmp_path / "s.db"
    calls = []
    from transbench.scenarios.serve import run as serve_run

    monkeypatch.setattr(serve_run, "run_grid", lambda *a, **k: calls.append(a))  # the resume check is what is tested
    args = ["serve", "--model", "bert-tiny", "--device", "cpu", "--concurrency", "1", "--duration", "0.1",
            "--lengths", f"counts:{counts}", "--name", "L", "--db", db]
    invoke(*args)
    counts.write_text("8\n16\n")
    line = refused(invoke(*args))
    assert "lengths_source" in line and "counts.txt@" in line


# --- every external reader goes through the boundary ------------------------------------------------------

READERS = {("json", "load"), ("json", "loads"), ("yaml", "load"), ("yaml", "safe_load"), ("yaml", "full_load"),
           ("yaml", "unsafe_load"), ("tomllib", "load"), ("tomllib", "loads"), ("tomli", "load"), ("tomli", "loads")}
# Reads of what transbench itself wrote a moment ago, never a user's path: each with its reason.
INTERNAL = {
    "cli/reference.py": "the generated docs pages of this repository, compared with what the declarations generate",
    "engine/tuning.py": "the engine's own bounded reader of its table (read_table): it imports nothing of the benchmark",
    "report/html.py": "the PNG plots the report has just drawn, embedded in its HTML",
    "runner/launch.py": "a launched cell's own log and result files, in the temporary folder it made",
    "runner/rank.py": "the cell a launcher wrote for its ranks, in that temporary folder",
    "runner/sweep.py": "a cell's key, made by the cell itself",
    "scenarios/micro/run.py": "a micro cell's own fields, serialized by the parent for its worker",
}


def external_reads(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        f = node.func
        base = f.value.id if isinstance(f.value, ast.Name) else None
        if base == "boundary":
            continue
        if (base, f.attr) in READERS:
            out.append(f"{node.lineno}: {base}.{f.attr}")
        elif f.attr in ("read_text", "read_bytes"):
            out.append(f"{node.lineno}: .{f.attr}()")
        elif f.attr == "read" and isinstance(f.value, ast.Call) and getattr(f.value.func, "id", None) == "open":
            out.append(f"{node.lineno}: open(...).read()")
    return out


def test_every_external_reader_goes_through_the_boundary():
    found = {}
    for p in sorted(PKG.rglob("*.py")):
        rel = p.relative_to(PKG).as_posix()
        if rel == "boundary.py" or rel in INTERNAL:
            continue
        reads = external_reads(p)
        if reads:
            found[rel] = reads
    assert not found, f"readers outside src/transbench/boundary.py (route them through it, or list them in " \
                      f"INTERNAL with the reason): {found}"


def test_the_scan_sees_readers():
    assert external_reads(PKG / "runner" / "rank.py") and external_reads(PKG / "engine" / "tuning.py")
    assert all((PKG / rel).exists() for rel in INTERNAL)


# Environment variables read outside boundary.py (env_text, env_int, env_folder), each with its reason: values the
# sweep set for its own workers, or values recorded or filtered as they are, never taken as a path or a number.
ENV_INTERNAL = {
    "runner/worker.py:TRANSBENCH_CPUS": "the sweep's own value, set for every worker (runner/launch.py)",
    "runner/worker.py:TRANSBENCH_THREADS": "the sweep's own value, set for every worker",
    "runner/rank.py:TRANSBENCH_THREADS": "the sweep's own value, set for every rank",
    "runner/rank.py:*": "the NCCL, gloo and NVSHMEM variables (ENV_PREFIXES), recorded with a cell as they are",
    "engine/tuning.py:TRANSBENCH_CACHE_DIR": "the engine imports nothing of the benchmark; backends/fused.py "
                                             "check_cache_dir reads it through the boundary before any engine is built",
    "engine/tuning.py:XDG_CACHE_HOME": "the engine's default folder, a cache whose failures cost only re-tuning",
    "scenarios/training/loop.py:TORCH_CUDA_ARCH_LIST": "torch's own variable, recorded as torch read it",
    "measure/env.py:CUDA_VISIBLE_DEVICES": "recorded with the run as it is",
    "measure/env.py:*": "the scheduler's variables, recorded with the run as they are",
    "measure/device.py:CUDA_VISIBLE_DEVICES": "only its items of ASCII digits are read, as NVML indexes",
}


def environment_reads(path: Path) -> list[str]:
    """`os.environ.get(X)`, `os.environ[X]`, `os.getenv(X)` and `os.environ.items()` in a module, as NAME (the
    variable, * for all of them, ? for a name computed at run time)."""
    def name(args) -> str:
        return args[0].value if args and isinstance(args[0], ast.Constant) else "?"

    def is_environ(node) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "environ" and getattr(node.value, "id", None) == "os"

    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if is_environ(node.func.value) and node.func.attr in ("get", "items", "values"):
                out.append(name(node.args) if node.func.attr == "get" else "*")
            elif node.func.attr == "getenv" and getattr(node.func.value, "id", None) == "os":
                out.append(name(node.args))
        elif isinstance(node, ast.Subscript) and is_environ(node.value) and isinstance(node.ctx, ast.Load):
            out.append(name([node.slice]))
    return out


def test_every_environment_variable_goes_through_the_boundary():
    """A variable read raw was taken whole: $TRANSBENCH_CACHE_DIR of a newline made a folder so named, one of 4,097
    characters was echoed whole, and a TRANSBENCH_PARENT_PID of 5,000 digits was int()'s traceback (measure/load.py)."""
    found = [f"{rel}:{var}" for p in sorted(PKG.rglob("*.py"))
             if (rel := p.relative_to(PKG).as_posix()) != "boundary.py" for var in environment_reads(p)]
    assert environment_reads(PKG / "engine" / "tuning.py")  # the scan sees them
    bad = sorted(set(found) - set(ENV_INTERNAL))
    assert not bad, ("environment variables read outside src/transbench/boundary.py (read them with env_text, "
                     f"env_int or env_folder, or list them in ENV_INTERNAL with the reason): {bad}")
    assert not set(ENV_INTERNAL) - set(found), "ENV_INTERNAL lists reads that are no longer there"


def test_the_concurrency_limit_in_help_is_the_one_serve_checks():
    from transbench.scenarios.serve.spec import MAX_REQUESTS
    from transbench.spec import LIMITS

    assert LIMITS["--concurrency"] == MAX_REQUESTS


# --- options checked where every spec is read, endpoint URLs, arrivals, output files ------------------------------

@FAST
@given(data=st.data())
def test_any_count_past_its_limit_is_refused_by_every_spec(data):
    """declare.LIMITS, held for every command's spec (spec.coerce): a count past its limit is one line naming it."""
    from transbench.declare import declared, item_type, option_of
    from transbench.scenarios.micro.options import BreakdownOptions, GemmOptions, LayerOptions
    from transbench.scenarios.serve.spec import ServeSpec
    from transbench.scenarios.training.spec import TrainSpec
    from transbench.spec import coerce

    cls = data.draw(st.sampled_from([RunSpec, TrainSpec, ServeSpec, GemmOptions, LayerOptions, BreakdownOptions]))
    limited = [(f.name, option_of(f, s)) for f, s in declared(cls)
               if option_of(f, s) in LIMITS and item_type(cls, f.name)[0] is int]
    if not limited:
        return
    name, option = data.draw(st.sampled_from(limited))
    value = data.draw(st.integers(min_value=LIMITS[option] + 1, max_value=2**63 - 1))
    with pytest.raises(SpecError) as e:
        coerce(cls, {name: value if not item_type(cls, name)[1] else [value]})
    assert f"{option} {value:,} is above its limit of {LIMITS[option]:,}" in one_line(e.value)


@FAST
@given(url=st.text(max_size=40) | st.builds(lambda host, port: f"http://{host}:{port}", st.text(max_size=20),
                                            st.integers(min_value=-5, max_value=10**6)))
def test_any_endpoint_url_is_a_root_a_client_reads_or_refused(url):
    """serve --url: any text is a yes or a no, never an exception; what is taken, httpx (the client) reads too."""
    from transbench.scenarios.serve.endpoint_spec import _is_root

    if _is_root(url):
        httpx = pytest.importorskip("httpx")
        assert httpx.URL(url).host


@FAST
@given(b=st.text(max_size=12) | st.floats(allow_nan=True, allow_infinity=True).map(repr))
def test_any_burstiness_is_refused_or_plans_a_bounded_list_quickly(b):
    """--arrivals gamma:B: one line as the CLI prints it (control characters escaped), or a plan of arrivals that ends
    (gamma:1e-300 planned for ever)."""
    from transbench.cli.tables import visible
    from transbench.scenarios.serve import arrivals

    try:
        plan = arrivals.parse(f"gamma:{b}")
    except SpecError as exc:
        assert "\n" not in visible(str(exc))
        return
    start = time.monotonic()
    times = plan.times(rate=50.0, span_s=10.0, seed=0)
    assert time.monotonic() - start < 5 and len(times) < 100_000 and all(t >= 0 for t in times)


@FAST
@given(content=st.binary(max_size=600), kind=st.sampled_from(["json", "benchmark", "csv", "spec", "report.md",
                                                               "report.html", "plot"]),
       suffix=st.sampled_from([".json", ".csv", ".yaml", ".md", ".html", ".png", ".svg", ".pdf"]))
@example(content=b"\r\x00", kind="csv", suffix=".json")  # a carriage return csv.reader raised on: a traceback
def test_any_existing_file_is_ours_or_refused_and_left_as_it_was(tmp_path_factory, content, kind, suffix):
    """An output path holding anything at all: recognised as ours (and then replaced), or refused in one line before
    any work, the file unchanged (store/export.py ours)."""
    from transbench.store import export

    path = tmp_path_factory.mktemp("out") / f"f{suffix}"
    path.write_bytes(content)
    try:
        export.check_output(str(path), "--out", writes=kind)
    except SpecError as exc:
        one_line(exc)
    assert path.read_bytes() == content


@FAST
@given(text=st.text(max_size=10).filter(lambda t: not t.startswith("-")))
def test_any_text_for_a_typed_number_is_read_as_python_reads_ascii_or_refused(tmp_path_factory, text):
    """A typed option's number (here `compare --alpha`): refused in one line naming the option unless it is ASCII
    without `_` and float() reads it (cli/options.py _ascii_number); what is read goes on to the next check."""
    from transbench.spec import read_number

    db = tmp_path_factory.mktemp("db") / "none.db"
    line = refused(invoke("compare", "a", "b", "--alpha", text, "--db", db))
    try:
        read_number(text.strip(), float)
    except ValueError:
        assert "--alpha" in line and "expected a number" in line
    else:
        assert "expected a number" not in line
    assert not db.exists()


def _single_value_options() -> list[tuple[list[str], str, bool]]:
    """(command, option, takes a value) for every option of one value of every command, read from the CLI itself."""
    import typer.main

    from transbench.cli import app

    def walk(group, path):
        for name, cmd in group.commands.items():
            if hasattr(cmd, "commands"):
                yield from walk(cmd, [*path, name])
                continue
            for p in cmd.params:
                if p.param_type_name == "option" and not getattr(p, "multiple", False) and p.name != "help":
                    yield [*path, name], p.opts[0], not getattr(p, "is_flag", False)

    return list(walk(typer.main.get_command(app), []))


@FAST
@given(case=st.sampled_from(_single_value_options()), value=st.text(max_size=8).filter(lambda t: not t.startswith("-")))
def test_any_option_of_one_value_given_twice_is_refused_before_anything_runs(tmp_path_factory, case, value):
    """cli/options.py _once: click kept the last of a repeated option without a word."""
    from transbench.cli.tables import visible

    command, option, takes_value = case
    given = [option, value] if takes_value else [option]
    cwd = tmp_path_factory.mktemp("twice")
    here = os.getcwd()
    os.chdir(cwd)  # where a default store (./transbench.db) would be made
    try:
        line = refused(invoke(*command, *given, *given))
    finally:
        os.chdir(here)
    # the first value, read before the second option, may be refused first: named as typed
    assert f"{option} was given twice: give it once" in line or line.startswith(f"error: {option} {visible(repr(value))}")
    assert not any(cwd.iterdir())


def _old_spellings():
    """(command, old spelling, today's) of every option an older spelling still reaches (cli/options.py ALIASES)."""
    import typer.main

    from transbench.cli import app
    from transbench.cli.options import ALIASES

    def walk(group, path):
        for name, cmd in group.commands.items():
            if hasattr(cmd, "commands"):
                yield from walk(cmd, [*path, name])
                continue
            opts = {o for p in cmd.params if p.param_type_name == "option" for o in p.opts}
            yield from ((tuple([*path, name]), old, new) for old, new in ALIASES.items()
                        if new in opts and old not in opts)

    return sorted(walk(typer.main.get_command(app), []))


@FAST
@given(case=st.sampled_from(_old_spellings()), order=st.sampled_from(["old new", "new old", "old old"]),
       value=st.sampled_from(["1", "fp32", "x"]))
def test_an_old_spelling_given_twice_is_named_as_typed_with_one_notice(tmp_path_factory, case, order, value):
    """The old spelling is read as today's: a repeat was "--dtype was given twice" after `--precision fp32 --dtype
    fp32`, and `--batches 1 --batches 2` printed its notice twice."""
    command, old, new = case
    spelled = [{"old": old, "new": new}[w] for w in order.split()]
    cwd = tmp_path_factory.mktemp("old")
    here = os.getcwd()
    os.chdir(cwd)
    try:
        res = invoke(*command, spelled[0], value, spelled[1], value)
    finally:
        os.chdir(here)
    line = refused(res)
    twice = (f"{old} was given twice" if spelled[0] == spelled[1] else f"{spelled[0]} and {spelled[1]} were both given")
    if twice not in line:  # the first value, read before the second option, may be refused first: named as typed
        assert line.startswith(f"error: {spelled[0]} "), line
    assert res.stderr.count(f"note: {old} is now {new}") == (twice in line or spelled[0] == old), res.stderr
    assert not any(cwd.iterdir())


@FAST
@given(usage=values | st.dictionaries(st.sampled_from(["prompt_tokens", "completion_tokens"]), values, max_size=2))
def test_any_usage_an_endpoint_sends_is_counted_or_malformed(usage):
    """serve --url: an answer's `usage` sets whole token counts in 0..MAX_TOKENS, or makes the request malformed."""
    from transbench.scenarios.serve import http_client

    r = http_client.Sent(0, 0.0, 4)
    try:
        http_client._usage(r, usage)
    except http_client.Malformed:
        return
    for count in (r.prompt_tokens, r.completion_tokens):
        assert count is None or type(count) is int and 0 <= count <= http_client.MAX_TOKENS


@FAST
@given(vector=values | st.lists(st.floats(allow_nan=True, allow_infinity=True) | st.integers(), max_size=6))
def test_any_embedding_an_endpoint_sends_is_finite_float32_or_refused(vector):
    from transbench.scenarios.serve import http_client

    try:
        got = http_client.embedding_values(vector)
    except ValueError:
        return
    assert got and all(abs(v) <= http_client.F32_MAX for v in got)


@pytest.mark.parametrize("command", [["run", "--model", "bert-tiny", "--backend", "eager"],
                                     ["train", "--model", "bert-tiny"], ["micro", "layer", "--model", "bert-tiny"]])
def test_a_grid_past_the_cells_one_run_takes_is_refused_before_it_is_built(tmp_path, command):
    """Each axis within its limit, their product was not: 60,000 batches x 128 seqs held 4.5 GB before a cell ran."""
    batches, seqs = ",".join(map(str, range(1, 401))), ",".join(map(str, range(1, 301)))
    db = tmp_path / "t.db"
    refused(invoke(*command, "--batch", batches, "--seq", seqs, "--device", "cpu", "--db", db),
            "the grid has 120,000 cells (400 --batch x 300 --seq), above the 100,000 one run takes")
    assert not db.exists()


@settings(max_examples=40, deadline=None)
@given(a=st.integers(1, 2000), b=st.integers(1, 2000))
def test_a_grid_is_refused_exactly_when_its_cells_pass_the_limit(a, b):
    """spec.checked: the product of the axes' lengths against declare.MAX_CELLS, in one line naming each axis."""
    from transbench.declare import MAX_CELLS
    from transbench.spec import checked

    spec = RunSpec(models=["bert-tiny"], backends=["eager"], batches=list(range(1, a + 1)), seqs=list(range(1, b + 1)))
    if a * b > MAX_CELLS:
        with pytest.raises(SpecError, match=f"the grid has {a * b:,} cells .{a:,} --batch x {b:,} --seq."):
            checked(RunSpec, spec)
    else:
        assert checked(RunSpec, spec).batches == list(range(1, a + 1))


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 4), st.booleans())
def test_a_link_that_leads_nowhere_is_named_as_one(tmp_path_factory, links, loop):
    # a loop of links was "unable to open database file: check that the file and its folder are writable" as a
    # store, and "not found" as a spec file; a link to a missing file was "no store at" alone
    from transbench.errors import SpecError
    from transbench.spec import load_file
    from transbench.store.db import Store

    d = tmp_path_factory.mktemp("links")
    names = [d / f"l{i}.yaml" for i in range(links)]
    for a, b in zip(names, names[1:] + [names[0] if loop else d / "missing.yaml"]):
        a.symlink_to(b.name)
    why = boundary.link_nowhere(names[0])
    missing = os.path.realpath(d / "missing.yaml")
    assert why == ("is a loop of symbolic links" if loop else f"is a symbolic link to {missing}, which is missing"), why
    with pytest.raises(boundary.BadInput, match="loop of symbolic links" if loop else "which is missing"):
        boundary.read_bytes(names[0], "x", limit=10)
    with pytest.raises(SpecError, match="loop of symbolic links" if loop else "which is missing"):
        load_file(str(names[0]))
    with pytest.raises(SpecError, match="loop of symbolic links" if loop else "which is missing"):
        Store(str(names[0]), readonly=True)
    # serve --trace and --lengths counts: said "no such file" of either
    from transbench.scenarios.serve import lengths as serve_lengths, trace as serve_trace

    with pytest.raises(SpecError, match="loop of symbolic links" if loop else "which is missing"):
        serve_trace.read(str(names[0]))
    with pytest.raises(SpecError, match="loop of symbolic links" if loop else "which is missing"):
        serve_lengths.parse(f"counts:{names[0]}", 128, None)
    if loop:
        with pytest.raises(SpecError, match="loop of symbolic links"):
            Store(str(names[0]))
    assert sorted(p.name for p in d.iterdir()) == sorted(p.name for p in names)  # nothing made beside them


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=400), limit=st.integers(1, 120))
def test_one_line_is_one_printable_line_cut_at_its_limit(text, limit):
    said = boundary.one_line(text, limit)
    assert said.isprintable()
    whole = boundary.one_line(text)
    if len(whole) <= limit:
        assert said == whole
    else:  # cut on whole characters (an escape is never split) and says how long the value was
        head, tail = said.rsplit("... (", 1)
        assert len(head) <= limit and whole.startswith(head) and tail == f"{len(text):,} characters)"


@settings(max_examples=50, deadline=None)
@given(user=st.text(st.characters(whitelist_categories=("Ll", "Lu", "Nd")), min_size=1, max_size=30),
       rest=st.sampled_from(["", "/", "/a/b.txt"]))
def test_any_tilde_path_is_expanded_or_refused_in_one_line(user, rest):
    """boundary.user_path: `~user` of no such user raised RuntimeError in Path.expanduser, a traceback of
    `serve --trace`, `--lengths counts:`, `--tokenizer` and `--model` alike."""
    import pwd

    from transbench.boundary import user_path

    try:
        pwd.getpwnam(user)
        exists = True
    except (KeyError, ValueError):
        exists = False
    try:
        got = user_path(f"~{user}{rest}", "--trace x")
    except SpecError as exc:
        assert not exists and "\n" not in str(exc) and str(exc).startswith("--trace x: cannot expand")
    else:
        assert exists and not str(got).startswith("~")
