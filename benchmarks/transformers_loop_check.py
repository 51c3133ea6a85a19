"""A `transbench run` cell against a plain CUDA-event loop over a transformers model this script builds itself.

    PYTHONPATH=src python3 benchmarks/transformers_loop_check.py --model bert-large-uncased --task mlm \
        --backend sdpa --dtype fp16 --point 32x384 --point 8x384

plain_loop_check.py times the callable transbench prepared; this check shares nothing with transbench's timing
path. For each point it runs `python -m transbench run` for one cell (its JSON record under --out), then builds
the preset's model with transformers (`AutoModel*.from_config`, the attention implementation named by --backend:
eager or sdpa), feeds it token ids as transbench does where nothing is padded (no attention mask:
scenarios/inputs.py make_inputs), and times back-to-back calls between two CUDA events after 10 warm-up calls:
5 rounds of about a second each, their median. Prints both medians, their ratio, and the cell's `host_ms`: where
that is near the median the cell is host-bound, and both loops time the host's Python, which moves from run to run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from engine_first_process import batch_by_seq

TASKS = {"base": "AutoModel", "mlm": "AutoModelForMaskedLM", "causal-lm": "AutoModelForCausalLM",
         "classification": "AutoModelForSequenceClassification"}
DTYPES = ("fp16", "bf16", "fp32")


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="bert-base-uncased", help="a preset (`transbench models`)")
    p.add_argument("--task", default="base", choices=sorted(TASKS))
    p.add_argument("--backend", default="sdpa", choices=("eager", "sdpa"))
    p.add_argument("--dtype", default="fp16", choices=DTYPES)
    p.add_argument("--point", type=batch_by_seq, action="append", default=None, help="BATCHxSEQ, repeatable")
    p.add_argument("--out", default=None, help="folder for the cells' store and records (default: a temporary one)")
    args = p.parse_args(argv)
    from transbench.models.presets import PRESETS

    if args.model not in PRESETS:
        p.error(f"--model must be a preset ({', '.join(sorted(PRESETS))}); got {args.model!r}")
    args.point = args.point or [(8, 128)]
    return args


def plain_ms(model, ids, torch) -> tuple[float, float, float]:
    """Median, min and max ms a call over 5 rounds of back-to-back calls between two CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(10):
        model(input_ids=ids)
    start.record()
    model(input_ids=ids)
    end.record()
    end.synchronize()
    calls = max(10, min(500, int(1000 / max(start.elapsed_time(end), 0.01))))  # about a second a round
    rounds = []
    for _ in range(5):
        start.record()
        for _ in range(calls):
            model(input_ids=ids)
        end.record()
        end.synchronize()
        rounds.append(start.elapsed_time(end) / calls)
    return statistics.median(rounds), min(rounds), max(rounds)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    import torch
    import transformers

    if not torch.cuda.is_available():
        print("error: needs a CUDA GPU", file=sys.stderr)
        return 2
    from transbench.models.build import preset_config
    from transbench.models.presets import PRESETS

    out = Path(args.out or tempfile.mkdtemp(prefix="transformers_loop_"))
    out.mkdir(parents=True, exist_ok=True)
    # fp32 cells run without TF32 (docs/run.md), so the plain loop does too
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    cfg = preset_config(PRESETS[args.model])
    model = getattr(transformers, TASKS[args.task]).from_config(cfg, attn_implementation=args.backend, dtype=dtype)
    model = model.cuda().eval()
    for batch, seq in args.point:
        record = out / f"{args.model}_{batch}x{seq}.json"
        cmd = [sys.executable, "-m", "transbench", "run", "--model", args.model, "--task", args.task, "--backend",
               args.backend, "--dtype", args.dtype, "--batch", str(batch), "--seq", str(seq),
               "--db", str(out / "cells.db"), "--json", str(record)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            print(f"{batch}x{seq}: transbench exited {done.returncode}: {done.stderr.strip()[-400:]}")
            continue
        cell = json.loads(record.read_text())["cells"][0]
        if cell["status"] != "ok":
            print(f"{batch}x{seq}: the cell is {cell['status']}: {cell.get('error')}")
            continue
        ids = torch.randint(5, cfg.vocab_size - 1, (batch, seq), device="cuda")
        with torch.inference_mode():
            mine, low, high = plain_ms(model, ids, torch)
        print(f"{args.model} {args.task} {args.backend} {args.dtype} {batch}x{seq}: transbench "
              f"{cell['latency_ms']:.4f} ms (n {cell['n_samples']}, IQR {cell['latency_iqr_ms']:.3f}, "
              f"host {cell['host_ms']:.3f}, {cell['sm_clock_mhz']} MHz) plain loop {mine:.4f} "
              f"({low:.4f}-{high:.4f}) ratio {cell['latency_ms'] / mine:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
