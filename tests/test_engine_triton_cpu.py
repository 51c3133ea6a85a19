"""The engine's Triton kernels (GEMMs with fused epilogues, attention, LayerNorm, GELU) in Triton's CPU interpreter.

The same kernel source that runs on the GPU, checked against torch without one; tests/gpu repeats this on
the device at real sizes."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="Triton is not installed (it is part of the [test] extra on Linux)")
pytestmark = pytest.mark.slow  # every kernel through the interpreter: the longest CPU test


def test_triton_kernels_match_torch_in_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join(filter(None, [
        str(Path(__file__).parents[1] / "src"), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, str(Path(__file__).with_name("triton_interpret_checks.py"))],
                         env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    errors = json.loads(out.stdout.strip().splitlines()[-1])
    from transbench.engine.gemm import CONFIGS, FP8_CONFIGS, splitk_configs
    from transbench.engine.kernels import ATTENTION_CONFIGS
    packing = {k: errors.pop(k) for k in list(errors) if k.startswith("packing ")}
    assert len(packing) == 16 and not any(packing.values()), packing  # make_packing's two kernels, indices exact
    routes = [k for k in errors if k.startswith("route ")]
    fp8 = {k: errors.pop(k) for k in list(errors) if k.startswith("fp8")}
    # every case ran: GEMM, split-K GEMM, decode attention, attention, LayerNorm and GELU kernels, the embedding block,
    # then each op's routes
    # (cuBLAS ones and one per Triton config; the routes' M = 37 also gets the split-K configs)
    assert len(errors) - len(routes) == 2 * 3 * 3 + 2 * 3 + 2 * 2 * 2 + 3 * 2 + 2 * 2 * len(ATTENTION_CONFIGS) + 2 * 4 + 3
    ours = len(CONFIGS) + len(splitk_configs(37))
    assert splitk_configs(37) and splitk_configs(1) and not splitk_configs(4096)
    assert len(routes) == 2 * (2 + ours) + (1 + ours) + (2 + ours) + (1 + ours)
    bad = {k: v for k, v in errors.items() if not v < 2e-3}  # fp16 outputs: ~3e-4 expected
    assert not bad, bad
    # fp8: the kernels' e4m3 values equal torch's rounding of the same fp32 values (at most a few in a thousand
    # apart where both round a tie differently), scales exact; every route of an fp8 layer (fp8 and fp16 ones) within e4m3's error of its reference
    # (the attention kernel that writes e4m3 instead: on the bound's scales, ops.attention_scale)
    kernels8 = {k: v for k, v in fp8.items() if not k.startswith("fp8route")}
    assert len(kernels8) == 2 * 2 + 2 * 3 + 2 * 2 * len(ATTENTION_CONFIGS), kernels8
    assert not {k: v for k, v in kernels8.items() if not v < 1e-2}, kernels8
    routes8 = {k: v for k, v in fp8.items() if k.startswith("fp8route")}
    assert any("fp8+gelu_q" in k for k in routes8) and any("fp8+ln" in k for k in routes8), routes8
    # the fp8 GEMM with the GELU and the quantization in its epilogue, every config, and its row scales exact
    scales = {k: routes8.pop(k) for k in list(routes8) if k.endswith(" scale")}
    assert len(scales) == len(FP8_CONFIGS) and not {k: v for k, v in scales.items() if not v < 1e-6}, scales
    # (e4m3 rounding, ~3%, and the interpreter's carry slip above in the routes that quantize in Triton)
    assert not {k: v for k, v in routes8.items() if not v < 1e-1}, routes8
