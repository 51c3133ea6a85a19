"""Where a training step's GPU time goes: torch.profiler over a few steps of one training cell, built and
stepped by transbench's own Trainer (scenarios/training/loop.py), kernels grouped as GEMM / attention /
cross-entropy / norm / elementwise / optimizer / other.

    PYTHONPATH=src python3 benchmarks/train_profile.py --model gpt2 --task causal-lm --seq 1024 --batch 16 \
        --dtype bf16 --optim adamw-fused [--compile] [--kernels liger] [--head masked] [--activation gelu-tanh] [--dropout 0] \
        --out /tmp/prof

Prints the step's wall time (CUDA events), the GPU's busy time per step (the kernels' summed time: below
the wall time means the GPU waited on the host), each group's time and share, and the top kernels; writes
the grouped numbers as JSON and a Chrome trace under --out. On a CPU (tests) the groups hold aten ops'
own CPU time instead of kernels."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

# First match wins, so the specific names come before the generic ones (a Triton kernel that torch.compile
# fused from a LayerNorm is named triton_per_fused_native_layer_norm...: a norm, not elementwise).
GROUPS: tuple[tuple[str, re.Pattern], ...] = (
    ("optimizer", re.compile(r"adam|multi_tensor|foreach|_fused_sgd|lamb", re.I)),
    # The loss's log-softmax over the vocabulary (cunn_SoftMaxForward<..., LogSoftMaxForwardEpilogue>)
    # before attention's softmax.
    ("cross-entropy", re.compile(r"cross_entropy|nll_loss|log_?soft_?max|logsumexp|liger.*(ce|cross)", re.I)),
    # SDPA's math path under torch.compile: inductor's kernels named after _safe_softmax and its backward (with the
    # dropout fused in) are attention's, though their names also say dropout (bert-large compiled:
    # benchmarks/results/fp8_engine_h100_2026-11.md).
    ("attention", re.compile(r"flash|fmha|attention|sdpa|_efficient_attention|softmax_warp|cudnn.*mha|"
                             r"_safe_softmax|_softmax_backward_data", re.I)),
    ("norm", re.compile(r"layer_norm|layernorm|rms_norm|rmsnorm", re.I)),
    ("GEMM", re.compile(r"gemm|cutlass|xmma|cublas|nvjet|matmul|\bmm\b|addmm|bmm|linear|sm\d+_.*_tn|wgmma", re.I)),
    ("elementwise", re.compile(r"elementwise|vectorized|triton_|unrolled|dropout|bernoulli|gelu|tanh|fill|copy|cast|"
                               r"\badd\b|\bmul\b|where|pow|native_dropout|reduce|index|gather|scatter|embedding",
                               re.I)),
)


def group_of(name: str) -> str:
    for group, pattern in GROUPS:
        if pattern.search(name):
            return group
    return "other"


def grouped(kernels: list[tuple[str, float]], steps: int) -> dict:
    """{"groups": {group: ms per step}, "busy_ms": summed per step, "top": [(name, group, ms per step)]}
    from (kernel name, total ms over `steps` steps) pairs."""
    groups: dict[str, float] = {}
    for name, ms in kernels:
        g = group_of(name)
        groups[g] = groups.get(g, 0.0) + ms / steps
    top = sorted(kernels, key=lambda k: -k[1])[:25]
    return {"groups": dict(sorted(groups.items(), key=lambda kv: -kv[1])), "busy_ms": sum(groups.values()),
            "top": [(n, group_of(n), ms / steps) for n, ms in top]}


def _kernels(prof, cuda: bool) -> list[tuple[str, float]]:
    """(name, total ms) of every GPU kernel (CUDA), or of every aten op's own CPU time (CPU)."""
    out = []
    for e in prof.key_averages():
        if cuda:
            us = getattr(e, "self_device_time_total", None)
            if us is None:  # torch before 2.4
                us = getattr(e, "self_cuda_time_total", 0)
            # Kernels (and copies) only. With torch 2.11 on an H100 the aten ops that launch them carry their
            # kernels' time as their own too (aten::mm 38 ms beside its cutlass kernels): counting both put the
            # GPU's busy time at 163% of the step. Ops run on the CPU; kernels do not.
            on_cpu = str(getattr(e, "device_type", "")).endswith("CPU") or e.key.startswith("aten::")
            if us > 0 and not on_cpu:
                out.append((e.key, us / 1e3))
        elif e.key.startswith("aten::") and e.self_cpu_time_total > 0:
            out.append((e.key, e.self_cpu_time_total / 1e3))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gpt2")
    p.add_argument("--task", default=None, help="default: the model's LM task")
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--optim", default="adamw-fused")
    p.add_argument("--backend", default="sdpa", help="attention (training_cell.ATTENTION)")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--kernels", default="torch")
    p.add_argument("--head", default="all")
    p.add_argument("--activation", default=None, help="gelu|gelu-tanh (default: the model's own)")
    p.add_argument("--pad-vocab", type=int, default=1, help="vocabulary rows padded to a multiple of this")
    p.add_argument("--dropout", type=float, default=None, help="every dropout probability (default: the model's own)")
    p.add_argument("--grad-ckpt", action="store_true")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (compile happens here)")
    p.add_argument("--steps", type=int, default=3, help="profiled steps")
    p.add_argument("--device", default="auto")
    p.add_argument("--out", default=None, help="folder for profile.json and trace.json")
    args = p.parse_args(argv)

    import torch
    from torch.profiler import ProfilerActivity, profile

    from transbench.measure import device as dev
    from transbench.models import build
    from transbench.runner.rank import RankInfo
    from transbench.scenarios.training import loop as training_loop
    from transbench.scenarios.training.spec import default_task
    from transbench.scenarios.training.cell import TrainCell

    device = dev.resolve(args.device)
    cuda = device.type == "cuda"
    task = args.task or default_task(build.resolve(args.model).shape)
    cell = TrainCell(model=args.model, task=task, backend=args.backend, dtype=args.dtype, optim=args.optim,
                     batch=args.batch, seq=args.seq, grad_ckpt=args.grad_ckpt, compile=args.compile,
                     kernels=args.kernels, head=args.head, activation=args.activation,
                     dropout=args.dropout, pad_vocab=args.pad_vocab, device=device.type)
    training_loop.check_supported(cell, device.type)
    trainer = training_loop.Trainer(cell, RankInfo(), device)
    for _ in range(args.warmup):
        trainer.step()
    if cuda:
        torch.cuda.synchronize()
    clock = training_loop.PhaseClock(device)
    walls, phases = [], []
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(args.steps):
            clock.start()
            trainer.step(mark=clock.mark)
            ms, parts = clock.finish()
            walls.append(ms)
            phases.append(parts)
    step_ms = sum(walls) / len(walls)
    summary = grouped(_kernels(prof, cuda), args.steps)
    needed, ran = training_loop.step_flops(cell, trainer.shape)
    gpu = dev.gpu_info(device)
    from transbench.measure import peaks

    tflops = needed / (step_ms / 1e3) / 1e12
    mfu = peaks.mfu(tflops * 1e12, gpu and gpu.name, cell.dtype, gpu and gpu.memory_gb)
    summary.update({
        "cell": cell.to_dict(), "step_ms": step_ms, "samples_per_s": cell.batch / (step_ms / 1e3),
        "tflops": tflops, "mfu": mfu, "flops_per_step": needed, "hw_flops_per_step": ran,
        "phases_ms": {k: sum(p[k] for p in phases) / len(phases) for k in phases[0]},
        "gpu": gpu.name if gpu else None, "unit": "GPU kernel time" if cuda else "aten ops' own CPU time",
        "kernels_replaced": trainer.info.get("kernels_replaced"),
    })
    print(f"{cell.model} {cell.task} b{cell.batch} s{cell.seq} {cell.dtype} {cell.optim}"
          f"{' compile' if cell.compile else ''} kernels {cell.kernels} head {cell.head}"
          f"{' ' + cell.activation if cell.activation else ''} attention {cell.backend}"
          f"{f' vocabulary padded to {cell.pad_vocab}' if cell.pad_vocab > 1 else ''} on {summary['gpu'] or 'cpu'}")
    print(f"step {step_ms:.1f} ms ({summary['samples_per_s']:.1f} samples/s, {tflops:.1f} TFLOPS"
          f"{f', MFU {mfu:.1%}' if mfu else ''}); phases " +
          ", ".join(f"{k[:-3]} {v:.1f} ms" for k, v in summary["phases_ms"].items()))
    busy = summary["busy_ms"]
    print(f"{summary['unit']}: {busy:.1f} ms per step ({busy / step_ms:.0%} of the step"
          f"{'; the rest the GPU waited on the host' if cuda and busy < 0.95 * step_ms else ''})")
    print(f"{'group':14} {'ms/step':>8} {'share':>6}")
    for g, ms in summary["groups"].items():
        print(f"{g:14} {ms:8.2f} {ms / busy:6.1%}")
    print(f"{'top kernels':90} {'group':13} {'ms/step':>8}")
    for name, g, ms in summary["top"]:
        print(f"{name[:90]:90} {g:13} {ms:8.3f}")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "profile.json").write_text(json.dumps(summary, indent=1, default=str))
        prof.export_chrome_trace(str(out / "trace.json"))
        print(f"wrote {out / 'profile.json'} and {out / 'trace.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
