"""A training cell's step time against a plain PyTorch training loop written without transbench's trainer.

    PYTHONPATH=src python3 benchmarks/plain_loop_train.py --model bert-large-uncased --task mlm --seq 128 \
        --batch 32 --dtype bf16 --optim adamw-fused

For each round, in one process: (a) transbench's training cell as `train` runs it (scenarios/training/loop.py run:
its Trainer, its sampler, the median of its timed steps), and (b) a loop as a user writes it: the same model class
built with the same random weights (models/build.py build_model, the only part shared), `torch.optim.AdamW`, autocast
to the dtype (fp16 with a GradScaler), `loss.backward()`, `step()`, `zero_grad()`, CUDA events around each step,
the median. The batch is drawn the same way: random ids, and for MLM 15% of positions masked and scored. The
cell's options are the defaults of `train` (no compile, the head on every position, the model's dropout). Prints
both medians, their ratio and the SM clock of each. A ratio far from 1 means the trainer's step does work a plain
loop does not, or its clock reads something other than the step."""

from __future__ import annotations

import argparse
import statistics
import sys


def plain_steps_ms(model, optimizer, batch: dict, dtype, warmup: int, steps: int) -> list[float]:
    import torch

    scaler = torch.amp.GradScaler("cuda") if dtype == torch.float16 else None  # fp16's loss scaling, as users do
    times = []
    for i in range(warmup + steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        with torch.autocast("cuda", dtype=dtype):
            loss = model(**batch).loss
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        optimizer.zero_grad(set_to_none=True)
        end.record()
        end.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(end))
    return times


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="bert-base-uncased")
    p.add_argument("--task", default="mlm", choices=("mlm", "causal-lm"))
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    p.add_argument("--optim", default="adamw-fused", choices=("adamw", "adamw-foreach", "adamw-fused"))
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args(argv)
    import torch

    from transbench.measure.context import Monitor
    from transbench.models import build
    from transbench.scenarios.training import loop
    from transbench.scenarios.training.cell import TrainCell

    if not torch.cuda.is_available():  # one line and exit 2, as the other plain-loop checks
        print("error: needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda", 0)
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    cell = TrainCell(args.model, args.task, "sdpa", args.dtype, args.optim, args.batch, args.seq, device="cuda",
                     steps=args.steps, warmup_steps=3)
    ref = build.resolve(args.model)
    print(f"{torch.cuda.get_device_name(0)}; torch {torch.__version__}; {args.model} {args.task} {args.dtype} "
          f"b{args.batch} s{args.seq} {args.optim}, {args.steps} timed steps a round")
    rows = []
    for r in range(args.rounds):
        with Monitor(device) as mon:
            result = loop.run(cell, device=device)
        tb_ms = statistics.median(result.samples_ms)
        tb_clock = mon.context.summary()["sm_clock_mhz"]
        torch.cuda.empty_cache()

        model = build.build_model(ref, args.task, attn="sdpa", device="cuda", seed=cell.seed)
        model.train().requires_grad_(True)
        kw = {"fused": True} if args.optim == "adamw-fused" else {"foreach": args.optim == "adamw-foreach"}
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, **kw)
        g = torch.Generator().manual_seed(r)
        ids = torch.randint(1, ref.shape.vocab - 1, (args.batch, args.seq), generator=g)
        if args.task == "mlm":
            chosen = torch.rand(ids.shape, generator=g) < 0.15
            labels = ids.masked_fill(~chosen, -100)
            ids = ids.masked_fill(chosen, 103)
        else:
            labels = ids.clone()
        batch = {"input_ids": ids.to(device), "labels": labels.to(device)}
        if ref.shape.decoder:
            batch["use_cache"] = False
        with Monitor(device) as mon:
            plain = plain_steps_ms(model, optimizer, batch, half, warmup=3, steps=args.steps)
        plain_ms = statistics.median(plain)
        plain_clock = mon.context.summary()["sm_clock_mhz"]
        del model, optimizer, batch
        torch.cuda.empty_cache()
        rows.append((tb_ms, plain_ms))
        print(f"round {r + 1}: transbench {tb_ms:.3f} ms ({tb_clock} MHz)  plain loop {plain_ms:.3f} ms "
              f"(min {min(plain):.3f}, max {max(plain):.3f}; {plain_clock} MHz)  ratio {tb_ms / plain_ms:.3f}")
    tb, pl = statistics.median(a for a, _ in rows), statistics.median(b for _, b in rows)
    print(f"| {args.model} {args.task} {args.dtype} b{args.batch} s{args.seq} | {tb:.3f} | {pl:.3f} | {tb / pl:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
