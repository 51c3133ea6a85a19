"""What `transbench server` is asked for (ServerSpec), checked before the model is built."""

from __future__ import annotations

import dataclasses
import ipaddress
import math
from dataclasses import dataclass

from ...declare import setting
from ...errors import SpecError
from ...measure.device import DTYPES
from ...models import build
from ...spec import check_once, checked
from .spec import MAX_WAIT_MS, max_wait_setting, prepare_budget_setting

MAX_BATCH = 4096


@dataclass
class ServerSpec:
    model: str = setting("bert-base-uncased", "preset or local checkpoint folder (an encoder serves /v1/embeddings, a "
                         "decoder /v1/completions)", short="-m")
    backend: str = setting("sdpa", "the backend that runs it (fused included)", short="-b")
    dtype: str | None = setting(None, "default fp16 on GPU, fp32 on CPU", choices=DTYPES)
    device: str = setting("auto", "auto|cpu|cuda|cuda:N")
    host: str = setting("127.0.0.1", "the address to listen on (0.0.0.0: every interface; only where you mean it)")
    port: int = setting(8000, "the port to listen on")
    served_model_name: str | None = setting(None, "the name requests give as `model` (default: --model's name)")
    max_batch_size: int = setting(32, "the batcher's largest batch")
    max_wait_ms: float = max_wait_setting()
    max_length: int | None = setting(None, "the longest input in tokens (default: the model's positions; decoders: "
                                     "less --max-tokens)")
    max_tokens: int = setting(64, "the most tokens a completion may ask for")
    warm_lengths: list[int] = setting([], "decoders: prompt lengths whose generators are prepared for every batch size "
                                      "before the server reports healthy (others are prepared at their first request)",
                                      axis=False)
    # Encoders: the largest bucket first (it holds every batch), then the likeliest within the budget; the server
    # reports healthy then. Tuning every shape of bert-base fused up to 32 x 256 from an empty table took 164.4 s on
    # an H200 (benchmarks/results/http_serving_h200_2026-11.md).
    prepare_budget: float = prepare_budget_setting()
    seed: int = setting(0, "seed of a preset's random weights")


def check(spec: ServerSpec):
    """(spec with device, dtype and name resolved, the model's resolved reference, is it a decoder)."""
    from ... import backends
    from ...measure import device as dev
    from ..inference.measure import TOLERANCE

    spec = checked(ServerSpec, spec)
    ref = build.resolve(spec.model)
    decoder = ref.shape.decoder if hasattr(ref.shape, "decoder") else _is_decoder(ref)
    build.check_task(ref, "generate" if decoder else "base")
    backends.get(spec.backend)
    device = str(dev.resolve(spec.device))
    dtype = spec.dtype if spec.dtype is not None else ("fp16" if device.startswith("cuda") else "fp32")
    if dtype not in TOLERANCE:
        raise SpecError(f"unknown dtype '{dtype}': choose from {', '.join(TOLERANCE)}")
    dev.check_dtype_runs(device, dtype)
    try:
        ipaddress.ip_address(spec.host)
    except ValueError:
        if spec.host != "localhost":
            raise SpecError(f"--host {spec.host}: give an IP address to listen on (127.0.0.1, ::1, 0.0.0.0)") from None
    if not 0 < spec.port < 65536:
        raise SpecError(f"--port {spec.port}: give a port in 1..65535")
    if not math.isfinite(spec.max_wait_ms):  # NaN passes every range check; inf never ends a wait
        raise SpecError(f"--max-wait-ms {spec.max_wait_ms}: give a finite number")
    if spec.max_batch_size < 1 or not 0 <= spec.max_wait_ms <= MAX_WAIT_MS:
        raise SpecError(f"--max-batch-size must be at least 1 and --max-wait-ms in 0..{MAX_WAIT_MS:,.0f}")
    if spec.max_batch_size > MAX_BATCH:
        raise SpecError(f"--max-batch-size {spec.max_batch_size} is above {MAX_BATCH}: every batch size up to it is "
                        "prepared before the server listens")
    if not 0 <= spec.prepare_budget < math.inf:  # NaN fails both
        raise SpecError(f"--prepare-budget {spec.prepare_budget}: give a finite number of seconds, 0 or more")
    name = spec.served_model_name
    if name is not None and (not name or len(name) > 256 or any(c.isspace() or not c.isprintable() for c in name)):
        raise SpecError("--served-model-name: give a name of 1 to 256 characters without spaces or control "
                        "characters")
    check_once(spec.warm_lengths, "--warm-lengths")
    if spec.max_tokens < 1:
        raise SpecError("--max-tokens must be at least 1")
    positions = ref.shape.max_positions - (spec.max_tokens if decoder else 0)
    if positions < 1:
        raise SpecError(f"--max-tokens {spec.max_tokens} leaves no room for a prompt in {ref.name}'s "
                        f"{ref.shape.max_positions} positions")
    length = spec.max_length if spec.max_length is not None else positions
    if not 1 <= length <= positions:
        raise SpecError(f"--max-length {length}: give 1..{positions} (" + (
            f"{ref.name}'s {ref.shape.max_positions} positions less --max-tokens)" if decoder else
            f"{ref.name}'s positions)"))
    if not decoder and spec.warm_lengths:
        raise SpecError("--warm-lengths applies to a decoder: an encoder prepares the shapes up to --max-length")
    if not decoder and spec.max_tokens != ServerSpec.max_tokens:  # the dataclass keeps the default as its attribute
        raise SpecError(f"--max-tokens {spec.max_tokens} applies to a decoder: {ref.name} is an encoder, which serves "
                        "embeddings, not completions")
    bad = [n for n in spec.warm_lengths if not 1 <= n <= length]
    if bad:
        raise SpecError(f"--warm-lengths {bad[0]} is outside 1..{length} (--max-length)")
    name = spec.served_model_name or ref.name
    return dataclasses.replace(spec, device=device, dtype=dtype, max_length=length, served_model_name=name), ref, \
        decoder


def _is_decoder(ref) -> bool:
    try:
        build.check_task(ref, "generate")
        return True
    except SpecError:
        return False
