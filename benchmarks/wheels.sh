#!/usr/bin/env bash
# Rebuilds .whl/ (git-ignored): the wheels the GPU machine lacks for `train --strategy deepspeed`,
# `--optim ds-fused-adam`, `--kernels liger` and `run --quant` (torchao) (its image has torch, triton, ninja,
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
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
    -d .whl "$@"
}
get hjson annotated-types typing-inspection typing-extensions liger-kernel pydantic torchao starlette uvicorn httptools
# pydantic pins its compiled core exactly: take the version its metadata names.
CORE=$(unzip -p .whl/pydantic-*.whl '*/METADATA' | sed -n 's/^Requires-Dist: pydantic-core==\([0-9.]*\).*/\1/p')
get "pydantic-core==$CORE"
ls -la .whl
