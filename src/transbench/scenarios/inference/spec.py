"""The inference grid's spec: every setting of `transbench run`, each declared once (declare.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ...declare import setting
from ...measure.device import DTYPES
from ...measure.load import threads_setting
from ...models.quant import QUANTS
from ...runner.worker import timeout_setting
from ...spec import coerce

TASKS = ("base", "mlm", "classification", "token-classification", "qa", "causal-lm", "generate")
MODEL_HELP = "preset or local checkpoint folder"


@dataclass
class RunSpec:
    """Everything that defines an inference sweep. Lists are sweep axes; None means 'sized for the device'."""

    models: list[str] = setting(["bert-base-uncased"], MODEL_HELP, option="--model", short="-m", aliases=("--models",))
    tasks: list[str] = setting(["base"], "what the model computes", option="--task", choices=TASKS)
    # every built-in backend by name: `transbench env`, which this help once pointed to, lists none
    backends: list[str] = setting(["eager", "sdpa"], "eager, sdpa, sdpa-math, sdpa-efficient, sdpa-flash, sdpa-cudnn, "
                                  "flash-attn2, compile, cudagraph, onnxruntime, fused (docs/run.md: what each runs)",
                                  option="--backend", short="-b", aliases=("--backends", "--attn"))
    dtypes: list[str] | None = setting(None, "fp8: the fused backend only", option="--dtype", choices=DTYPES,
                                       shown="fp16 on GPU, fp32 on CPU",
                                       aliases=("--dtypes", "--precision", "--precisions"))
    quants: list[str] = setting(["none"], "quantize the linear layers with torchao (nf4: bitsandbytes), on every "
                                "backend but fused and onnxruntime; pip install 'transbench[quant]'", option="--quant",
                                choices=QUANTS)
    batches: list[int] | None = setting(None, "batch sizes", option="--batch", aliases=("--batches",),
                                        shown="1,8,64,256 on GPU, 1,2 on CPU")
    seqs: list[int] | None = setting(None, "sequence lengths", option="--seq", aliases=("--seqs",),
                                     shown="128,384 on GPU, 128 on CPU")
    seq_stdev: float = setting(0.0, "variable lengths: stdev of lengths drawn around --seq, padded with a mask")
    device: str = setting("auto", "auto|cpu|cuda|cuda:N")
    activation: str | None = setting(None, "gelu|gelu-tanh", shown="the model's own")
    embeddings: bool = setting(True, "time the embedding layer too, or the encoder stack only",
                               flag="--embeddings/--encoders-only", shown="--embeddings")
    min_time: float | None = setting(None, "seconds of timed calls per cell, at least", shown="1 on GPU, 0.5 on CPU")
    min_count: int | None = setting(None, "timed calls per cell, at least", shown="20 on GPU, 5 on CPU")
    warmup: int | None = setting(None, "untimed calls before timing", shown="5 on GPU, 2 on CPU",
                                 aliases=("--warmup-steps",))
    timeout: float = timeout_setting()
    baseline: str | None = setting(None, "backend to compute speedup and mem_saved against")
    new_tokens: int = setting(128, "tokens to generate (--task generate)")
    compile_mode: str = setting("default", "torch.compile mode for the compile backend")
    max_batch: bool = setting(False, "also search the largest batch that fits", flag="--max-batch")
    max_batch_limit: int = setting(65536, "the largest-batch search stops at this batch", cli=False)
    shard: str | None = setting(None, "I/N: run slice I of N of the grid; auto: the slice of this Slurm array task "
                                "or Kubernetes Indexed Job pod")
    shard_count: int | None = setting(None, "--shard auto in a Kubernetes Indexed Job: its completions (else "
                                      "TRANSBENCH_SHARD_COUNT)")
    gpus: list[int] | None = setting(None, "run cells in parallel, one worker per listed GPU (0,1,...)", axis=False)
    nproc: int = setting(1, "data-parallel inference over N GPUs through torchrun")
    seed: int = setting(0, "seed of the random weights and tokens")
    threads: int | None = threads_setting()
    repeat: int = setting(1, "measure each cell N times, each in a fresh process, one after another; tables and "
                          "compare use the spread of the N medians")
    name: str | None = setting(None, "run name; rerunning a name resumes it")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> RunSpec:
        return cls(**coerce(cls, data))


def device_defaults(spec: RunSpec, device_type: str) -> RunSpec:
    """Fill the 'sized for the device' values. On a 2-core CPU the default sweep ends within two minutes."""
    gpu = device_type == "cuda"
    out = dataclasses.replace(spec)
    if out.dtypes is None:
        out.dtypes = ["fp16"] if gpu else ["fp32"]
    if out.batches is None:
        out.batches = [1, 8, 64, 256] if gpu else [1, 2]
    if out.seqs is None:
        out.seqs = [128, 384] if gpu else [128]
    if out.min_time is None:
        out.min_time = 1.0 if gpu else 0.5
    if out.min_count is None:
        out.min_count = 20 if gpu else 5
    if out.warmup is None:
        out.warmup = 5 if gpu else 2
    return out
