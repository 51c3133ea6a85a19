"""Typed options of the four micro-benchmarks: defaults sized for the device, validated with one-line errors.

Fields left None are 'sized for the device': `resolved(device)` fills them (full grids on a GPU, a few
small points on a CPU) and checks everything before anything is measured or stored."""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field

from ...boundary import parse_bytes, parse_size
from ...declare import setting
from ...errors import SpecError
from ...measure.device import DTYPES
from ...measure.load import check_cpu_ranks, check_threads, threads_setting
from ...models import build, parts
from ...spec import check_once, split_list

GEMM_DTYPES = DTYPES
LAYER_DTYPES = tuple(d for d in DTYPES if d != "fp8")
STREAM_DTYPES = tuple(d for d in LAYER_DTYPES if d != "tf32")  # tf32 is a matrix-unit mode: no element-wise op
STREAM_OPS = ("copy", "scale", "add")
GPU_ONLY = {"tf32": "TF32 is a tensor-core mode of NVIDIA GPUs",
            "fp8": "fp8 GEMMs need an NVIDIA GPU of compute capability 8.9 or newer"}


def parse_sizes(text: str | None) -> list[int] | None:
    # Split as every other axis is (spec.py split_list): `--sizes 1,,2` dropped the empty item without a word.
    return None if text is None else [parse_size(p) for p in split_list(str(text))]


def _not_empty(opts, *axes: tuple[str, str]) -> None:
    """An axis given empty (`--ops ''`, `batches=[]`) is refused: it stored a run of no points and exited 0, or
    (layer) ran the device's default grid instead; None means 'not given' and gets the default."""
    for field_name, option in axes:
        if getattr(opts, field_name) == [] or getattr(opts, field_name) == "":
            raise SpecError(f"{option} is empty: give at least one value, or leave it out for the default")


# The largest size of each micro-benchmark: past every GPU's memory already (an `oom` cell), and far below where the
# tensor's byte count overflows (`micro gemm --sizes 2^40` or `bandwidth --sizes 2^62` stored an `error` cell,
# "Storage size calculation overflowed"). GEMM: n x n fp32 of 2^20 is 4 TiB; bandwidth: 2^40 elements, 4 TiB and
# more (collectives: MAX_COLLECTIVE_BYTES).
MAX_GEMM_SIZE = 2**20
MAX_VECTOR_SIZE = 2**40


def _positive(values, what: str, example: str, most: int | None = None) -> None:
    for v in values:
        if v < 1:
            raise SpecError(f"{what} {v} is not allowed: give whole numbers >= 1 (e.g. {example})")
        if most is not None and v > most:
            raise SpecError(f"{what} {v:,} is above its limit of {most:,} (2^{most.bit_length() - 1}): past any GPU's "
                            f"memory (e.g. {example})")


def _once(opts, *axes: tuple[str, str]) -> None:
    for field_name, option in axes:
        check_once(getattr(opts, field_name), option)


def _dtypes(values, allowed: tuple[str, ...], device) -> None:
    for d in values:
        if d not in allowed:
            raise SpecError(f"unknown dtype '{d}' here: choose from {', '.join(allowed)}")
        if device.type != "cuda" and d in GPU_ONLY:
            raise SpecError(f"dtype {d} needs a CUDA GPU ({GPU_ONLY[d]}): drop it or use --device cuda")


LAYER_FAMILIES = ("bert", "gpt2")  # micro layer/breakdown build these families' layer modules and parts


def _model(name: str, seq: int | None = None, layer: bool = False):
    if layer and "," in name and not os.path.exists(name):
        # layer and breakdown take one model, not gemm's list: `bert-tiny,gpt2-tiny` read "unknown model", both known
        raise SpecError(f"--model {name}: micro layer and breakdown time one model's layer: give one, and run the "
                        "command once for each")
    ref = build.resolve(name)  # SpecError for an unknown preset or folder
    if layer and ref.family not in LAYER_FAMILIES:
        raise SpecError(f"{name} is a {ref.family} model; micro layer and breakdown time one bert or gpt2 layer: "
                        f"use a bert or gpt2 model (run --model {name} benchmarks the whole model)")
    if seq is not None and seq > ref.shape.max_positions:
        raise SpecError(f"seq {seq} is longer than {ref.name} allows ({ref.shape.max_positions}): lower --seq")
    return ref


@dataclass
class MicroCommon:
    device: str = setting("auto", "auto|cpu|cuda|cuda:N")
    min_time: float | None = setting(None, "seconds of timed calls per point", shown="1 on GPU, 0.1 on CPU")
    warmup: int = setting(2, "untimed calls before timing each point")
    seed: int = setting(0, "seed of the random inputs", cli=False)
    # On a CPU shared with other work, a part of a layer waited for a thread that had lost its core and read 1,000 to
    # 4,000% of the whole layer (micro breakdown on 2 cores): one thread each avoids that wait, as run --threads does.
    threads: int | None = threads_setting()
    shard: str | None = setting(None, "I/N: measure slice I of N of the points (whole units: a layer's passes, an "
                                "op's sizes); auto: from the Slurm array task or Kubernetes Indexed Job pod")
    shard_count: int | None = setting(None, "--shard auto in a Kubernetes Indexed Job: its completions (else "
                                      "TRANSBENCH_SHARD_COUNT)")
    name: str | None = setting(None, "run name")

    def _common(self, device) -> dict:
        if self.min_time is not None and not self.min_time > 0:
            raise SpecError(f"--min-time {self.min_time} must be > 0 seconds")
        if self.warmup < 0:
            raise SpecError(f"--warmup {self.warmup} must be >= 0")
        check_threads(self.threads)
        gpu = device.type == "cuda"
        from ...runner import shard as sharding

        which = sharding.resolve(self.shard, self.shard_count)  # `auto` becomes this task's I/N, stored with the run
        # A second per point on a GPU: sustained figures (a GPU at its power cap slows within a fraction of a
        # second) and a long enough region for the energy counter (measure/context.py).
        return {"min_time": self.min_time if self.min_time is not None else (1.0 if gpu else 0.1),
                "shard": None if which is None else f"{which[0]}/{which[1]}", "shard_count": None}

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class GemmOptions(MicroCommon):
    """Square n x n x n products over `sizes`, plus each model's four layer GEMMs at `tokens` rows."""

    sizes: list[int] | None = setting(None, "square sizes n, e.g. 1024,2^12 (GPU default 128..16384; at most 2^20)",
                                      read=lambda text: parse_sizes(text))
    dtypes: list[str] | None = setting(None, "", option="--dtype", choices=GEMM_DTYPES,
                                       shown="all on GPU, fp32 on CPU")
    # transformer-shaped GEMMs of these presets; [] for none
    models: list[str] | None = setting(None, "presets whose 4 layer GEMMs to add; '' for none", option="--model",
                                       short="-m", shown="bert-base-uncased,bert-large-uncased on GPU, none on CPU",
                                       axis=False)
    tokens: int | None = setting(None, "rows (batch x seq) of the layer GEMMs (default 8192 on GPU)")

    def resolved(self, device) -> GemmOptions:
        gpu = device.type == "cuda"
        _not_empty(self, ("dtypes", "--dtype"))  # sizes or models may be empty (`--model ''`), not both (below)
        out = dataclasses.replace(self, **self._common(device))
        if out.sizes is None:
            out.sizes = [2**p for p in range(7, 15)] if gpu else [128, 256, 512]
        if out.dtypes is None:
            out.dtypes = list(GEMM_DTYPES) if gpu else ["fp32"]
        if out.models is None:
            out.models = ["bert-base-uncased", "bert-large-uncased"] if gpu else []
        if out.tokens is None:
            out.tokens = 64 * 128 if gpu else 256
        _positive(out.sizes, "size", "--sizes 1024,4096", MAX_GEMM_SIZE)
        _positive([out.tokens], "token count", "--tokens 8192")
        _once(out, ("sizes", "--sizes"), ("dtypes", "--dtype"), ("models", "--model"))
        _dtypes(out.dtypes, GEMM_DTYPES, device)
        for m in out.models:
            _model(m)
        if not out.sizes and not out.models:
            raise SpecError("nothing to measure: give --sizes or --model")
        if self.tokens is not None and not out.models:  # an option no point uses is refused, as run's are
            raise SpecError("--tokens sets the rows of --model's layer GEMMs, and no model is measured: "
                            "give --model bert-base-uncased or drop --tokens")
        return out


@dataclass
class BandwidthOptions(MicroCommon):
    """Element-wise copy (y = x), scale (y = a x) and add (z = x + y) over vectors of `sizes` elements."""

    sizes: list[int] | None = setting(None, "elements per vector, e.g. 2^20,2^24 (GPU default 2^14..2^28; at most "
                                      "2^40)",
                                      read=lambda text: parse_sizes(text))
    ops: list[str] | None = setting(None, "", choices=STREAM_OPS)
    dtype: str = setting("fp32", "", choices=STREAM_DTYPES)

    def resolved(self, device) -> BandwidthOptions:
        gpu = device.type == "cuda"
        _not_empty(self, ("sizes", "--sizes"), ("ops", "--ops"))
        out = dataclasses.replace(self, **self._common(device))
        if out.sizes is None:
            out.sizes = [2**p for p in range(14, 29)] if gpu else [2**p for p in range(14, 23, 2)]
        if out.ops is None:
            out.ops = list(STREAM_OPS)
        _positive(out.sizes, "size", "--sizes 2^20,2^24", MAX_VECTOR_SIZE)
        _once(out, ("sizes", "--sizes"), ("ops", "--ops"))
        for op in out.ops:
            if op not in STREAM_OPS:
                raise SpecError(f"unknown op '{op}': choose from {', '.join(STREAM_OPS)}")
        _dtypes([out.dtype], STREAM_DTYPES, device)
        return out


@dataclass
class LayerOptions(MicroCommon):
    """One transformer layer of `model` (transformers' own module, sdpa attention), forward and
    forward+backward, over batches x seqs."""

    model: str = setting("bert-large-uncased", "preset or local checkpoint folder", short="-m")
    dtype: str | None = setting(None, "", choices=LAYER_DTYPES, shown="fp16 on GPU, fp32 on CPU")
    batches: list[int] | None = setting(None, "batch sizes", option="--batch", shown="4,8,...,128 on GPU, 1,4 on CPU")
    seqs: list[int] | None = setting(None, "sequence lengths", option="--seq", shown="128,512 on GPU, 128 on CPU")

    def resolved(self, device) -> LayerOptions:
        gpu = device.type == "cuda"
        _not_empty(self, ("dtype", "--dtype"), ("batches", "--batch"), ("seqs", "--seq"))
        out = dataclasses.replace(self, **self._common(device))
        out.dtype = out.dtype or ("fp16" if gpu else "fp32")
        out.batches = out.batches or ([4, 8, 16, 32, 64, 128] if gpu else [1, 4])
        out.seqs = out.seqs or ([128, 512] if gpu else [128])
        _positive(out.batches, "batch", "--batch 4,8")
        _positive(out.seqs, "seq", "--seq 128,512")
        _once(out, ("batches", "--batch"), ("seqs", "--seq"))
        _dtypes([out.dtype], LAYER_DTYPES, device)
        _model(out.model, max(out.seqs), layer=True)
        return out


@dataclass
class BreakdownOptions(MicroCommon):
    """The parts of one layer of `model` at one batch x seq (see models/parts.py)."""

    model: str = setting("bert-large-uncased", "preset or local checkpoint folder", short="-m")
    dtype: str | None = setting(None, "", choices=LAYER_DTYPES, shown="fp16 on GPU, fp32 on CPU")
    batch: int | None = setting(None, "batch size", shown="64 on GPU, 4 on CPU")
    seq: int | None = setting(None, "sequence length", shown="128")

    def resolved(self, device) -> BreakdownOptions:
        gpu = device.type == "cuda"
        _not_empty(self, ("dtype", "--dtype"))
        out = dataclasses.replace(self, **self._common(device))
        out.dtype = out.dtype or ("fp16" if gpu else "fp32")
        out.batch = out.batch if out.batch is not None else (64 if gpu else 4)
        out.seq = out.seq if out.seq is not None else 128
        _positive([out.batch], "batch", "--batch 64")
        _positive([out.seq], "seq", "--seq 128")
        _dtypes([out.dtype], LAYER_DTYPES, device)
        parts.activation_flops(_model(out.model, out.seq, layer=True).shape)  # its parts' FLOPs count it
        return out


COLLECTIVE_OPS = ("all-reduce", "all-gather", "reduce-scatter")
COLLECTIVE_DTYPES = ("fp32", "fp16", "bf16")
ELEMENT_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


def buffer_elements(op: str, nbytes: int, esize: int, n: int) -> int:
    """Elements of a collective's full buffer: `nbytes` of them, a multiple of n where it is split over the ranks."""
    count = max(1, nbytes // esize)
    return count if op == "all-reduce" else max(n, count - count % n)
MAX_COLLECTIVE_BYTES = 2**40  # 1 TiB: no GPU holds a buffer this large; a typo (2^60) is refused, not allocated


def parse_byte_sizes(text: str | None) -> list[int] | None:
    """A comma list of sizes, each a size or a doubling range 'FROM..TO' (1KiB..1GiB: 1 KiB, 2 KiB, ..., 1 GiB)."""
    if text is None:
        return None
    out: list[int] = []
    for part in split_list(str(text)):
        if ".." in part:
            lo, hi = (parse_bytes(p) for p in part.split("..", 1))
            if not 1 <= lo <= hi:
                raise SpecError(f"size range '{part}': write FROM..TO with 1 <= FROM <= TO, e.g. 1KiB..1GiB")
            while lo <= hi:
                out.append(lo)
                lo *= 2
        else:
            out.append(parse_bytes(part))
    return out


@dataclass
class CollectivesOptions(MicroCommon):
    """All-reduce, all-gather and reduce-scatter over `nproc` processes (torchrun: NCCL between GPUs, gloo on the
    CPU), per message size in bytes, with nccl-tests' algorithm and bus bandwidth."""

    ops: list[str] | None = setting(None, "", option="--op", choices=COLLECTIVE_OPS, shown="all three")
    # bytes: the all-reduced buffer, the gathered output, the scattered input
    sizes: list[int] | None = setting(None, "bytes per op, e.g. 1KiB..1GiB (doubling), 64MiB,1GiB or 2^20 (default "
                                      "1KiB..1GiB on GPU, 1KiB..1MiB on CPU; at most 2^40)",
                                      read=lambda text: parse_byte_sizes(text))
    dtype: str = setting("fp32", "", choices=COLLECTIVE_DTYPES)
    nproc: int | None = setting(None, "processes (GPUs), through torchrun: NCCL on GPUs, gloo on the CPU",
                                shown="every visible GPU, 2 on CPU")
    timeout: float = setting(900.0, "seconds one op (all its sizes) may take")

    def resolved(self, device) -> CollectivesOptions:
        gpu = device.type == "cuda"
        _not_empty(self, ("ops", "--op"), ("sizes", "--sizes"))
        out = dataclasses.replace(self, **self._common(device))
        if out.ops is None:
            out.ops = list(COLLECTIVE_OPS)
        if out.sizes is None:  # nccl-tests' range, doubling: 1 KiB .. 1 GiB on GPUs, up to 1 MiB on the CPU
            out.sizes = [2**p for p in range(10, 31 if gpu else 21, 1 if gpu else 2)]
        visible = 0
        if gpu:
            import torch

            visible = torch.cuda.device_count()
        if out.nproc is None:
            out.nproc = visible if gpu else 2
        _positive(out.sizes, "size", "--sizes 1KiB..1GiB")
        _once(out, ("ops", "--op"), ("sizes", "--sizes"))
        for op in out.ops:
            if op not in COLLECTIVE_OPS:
                raise SpecError(f"unknown op '{op}': choose from {', '.join(COLLECTIVE_OPS)}")
        _dtypes([out.dtype], COLLECTIVE_DTYPES, device)
        if too := [s for s in out.sizes if s > MAX_COLLECTIVE_BYTES]:
            raise SpecError(f"size {too[0]:,} bytes is over 1 TiB: give sizes like 1KiB..1GiB")
        if out.nproc < 2:
            raise SpecError(f"--nproc {out.nproc}: a collective needs 2 or more processes"
                            + (f" ({visible} GPU visible)" if gpu and visible < 2 else ""))
        if gpu and out.nproc > visible:
            raise SpecError(f"--nproc {out.nproc} needs that many GPUs; {visible} visible")
        if not gpu:
            check_cpu_ranks(out.nproc)
        if device.type == "cuda" and device.index not in (None, 0):
            raise SpecError(f"--device {device}: the collectives run on GPUs 0..nproc-1 (torchrun's local ranks): "
                            "give --device cuda, and CUDA_VISIBLE_DEVICES to choose the GPUs")
        if not (out.timeout > 0 and math.isfinite(out.timeout)):
            raise SpecError(f"--timeout {out.timeout}: give a positive number of seconds")
        _one_buffer_each(out)
        return out


def _one_buffer_each(opts: CollectivesOptions) -> None:
    """Sizes round down to whole elements (a multiple of the ranks for all-gather and reduce-scatter): `--sizes 1,3,4`
    measured one 4-byte all-reduce three times, stored as three cells whose table showed one row."""
    esize = ELEMENT_BYTES[opts.dtype]
    for op in opts.ops:
        seen: dict[int, int] = {}
        for size in opts.sizes:
            nbytes = buffer_elements(op, size, esize, opts.nproc) * esize
            if nbytes in seen:
                raise SpecError(f"--sizes {seen[nbytes]:,} and {size:,} are one {nbytes:,}-byte {op} of {opts.dtype} "
                                f"over {opts.nproc} ranks (whole elements, a multiple of the ranks where split): "
                                "give sizes that differ by more")
            seen[nbytes] = size
