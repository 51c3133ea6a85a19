"""GPU checks of `transbench server` (run on the device: python3 -m pytest tests/gpu/test_server_gpu.py -m gpu): the
fused engine and sdpa behind the server, fp16, measured by `serve --url` with the fp32 reference check; a clean
stop on SIGTERM."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("starlette")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from typer.testing import CliRunner  # noqa: E402

from transbench.cli import app  # noqa: E402


# A fused server's first start on a fresh GPU machine compiles every Triton kernel it prepares: one took more than
# the CPU tests' 120 s to answer /health, where one whose kernels were cached was healthy in 43 s (H200).
HEALTH_S = 400


@pytest.fixture
def server_cls():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from test_serve_http import Server

    return Server


@pytest.mark.parametrize("backend", ["sdpa", "fused"])
def test_embeddings_behind_the_server(tmp_path, server_cls, backend):
    from transbench.models import build

    ckpt = tmp_path / "bert"
    build.build_model(build.resolve("bert-tiny"), "base").save_pretrained(ckpt)
    server = server_cls("--model", str(ckpt), "--backend", backend, "--dtype", "fp16", "--device", "cuda",
                        "--max-length", "64", "--max-batch-size", "8", health_s=HEALTH_S)
    try:
        res = CliRunner().invoke(app, ["serve", "--url", server.url, "--api", "openai-embeddings", "--rate", "200",
                                       "--duration", "2", "--warmup", "0.5", "--lengths", "lognormal:24:64",
                                       "--reference-model", str(ckpt), "--db", str(tmp_path / "t.db"),
                                       "--json", str(tmp_path / "t.json")])
        assert res.exit_code == 0, res.output
        rec = json.loads((tmp_path / "t.json").read_text())["cells"][0]
        assert rec["status"] == "ok" and rec["failed"] == 0, rec.get("error")
        assert rec["reference_cosine_min"] > 0.99 and rec["achieved_rate"] == pytest.approx(200, rel=0.3)
    finally:
        code, err = server.stop()
    assert code == 0, err


@pytest.mark.parametrize("backend", ["sdpa", "fused"])
def test_streamed_completions_behind_the_server(tmp_path, server_cls, backend):
    from transbench.models import build

    ckpt = tmp_path / "gpt2"
    build.build_model(build.resolve("gpt2-tiny"), "causal-lm").save_pretrained(ckpt)
    server = server_cls("--model", str(ckpt), "--backend", backend, "--dtype", "fp16", "--device", "cuda",
                        "--max-tokens", "8", "--max-batch-size", "4", "--warm-lengths", "16", health_s=HEALTH_S)
    try:
        res = CliRunner().invoke(app, ["serve", "--url", server.url, "--api", "openai-completions", "--rate", "50",
                                       "--duration", "2", "--warmup", "0.5", "--lengths", "fixed:16",
                                       "--new-tokens", "8", "--reference-model", str(ckpt),
                                       "--db", str(tmp_path / "t.db"), "--json", str(tmp_path / "t.json")])
        assert res.exit_code == 0, res.output
        rec = json.loads((tmp_path / "t.json").read_text())["cells"][0]
        assert rec["status"] == "ok" and rec["failed"] == 0, rec.get("error")
        assert rec["completion_tokens_mean"] == 8 and rec["ttft_p50_ms"] > 0
        assert rec["reference_first_token_agreement"] >= 0.5
    finally:
        code, err = server.stop()
    assert code == 0, err
