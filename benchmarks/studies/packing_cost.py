"""What the fused engine's padding path costs on the host, per call (engine/packing.py make_packing).

    PYTHONPATH=src python3 benchmarks/studies/packing_cost.py

(1) make_packing alone, microseconds a call, for a full and a right-padded mask, its two Triton launches against its
torch ops (max_s 0, EngineOptions.pack_max_s, sends CUDA masks there; the launches are timed past PACK_MAX_TOKENS
too), interleaved over rounds, up to 4,096 rows and 4,096 positions (mask_counts is one program: the large shapes
are what PACK_MAX_TOKENS stands on); (2) the kernels one padded call launches (torch.profiler); (3) the whole
bert-base call (compile_model, fp16, pooler on) with no mask, an all-ones mask and a right-padded one, milliseconds a
call from CUDA events around back-to-back calls (host time included, as a serving process pays it)."""
from __future__ import annotations

import statistics
import time

import torch

from transbench.engine.packing import PACK_MAX_S, make_packing


def masks(B: int, S: int, device) -> dict:
    g = torch.Generator().manual_seed(0)
    lens = torch.randint(S // 2, S + 1, (B,), generator=g)
    lens[0] = S - 5  # at least one padded row, also at batch 1
    padded = (torch.arange(S)[None, :] < lens[:, None]).to(torch.int64)
    return {"full": torch.ones(B, S, dtype=torch.int64, device=device), "padded": padded.to(device)}


def packing_us(m, B, S, max_s, calls=500) -> float:
    max_tokens = 1 << 62 if max_s else 0
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        make_packing(m, B, S, 128, max_s, max_tokens)
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / calls * 1e6


def whole_call_ms(c, ids, mask, calls=200) -> float:
    for _ in range(20):
        c(input_ids=ids, attention_mask=mask)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        c(input_ids=ids, attention_mask=mask)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls


def main() -> None:
    dev = torch.device("cuda")
    for B, S in ((1, 128), (8, 128), (64, 256), (256, 128), (256, 512), (1024, 128), (4096, 128), (16, 4096)):
        ms = masks(B, S, dev)
        for kind, m in ms.items():
            paths = {"triton": PACK_MAX_S, "torch ops": 0}
            res = {p: [] for p in paths}
            for max_s in paths.values():  # compiles, then warms
                packing_us(m, B, S, max_s, calls=50)
            for _ in range(5):
                for p, max_s in paths.items():
                    res[p].append(packing_us(m, B, S, max_s))
            print(f"make_packing {B}x{S} {kind}: " + ", ".join(
                f"{p} {statistics.median(v):.1f} us (range {min(v):.1f}-{max(v):.1f})" for p, v in res.items()))
    m = masks(8, 128, dev)["padded"]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        make_packing(m, 8, 128, 128)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    print(f"kernels and copies of one padded 8x128 make_packing: {len(names)}")
    for n in names:
        print("   ", n[:110])

    from transbench.engine import EngineOptions, compile_model
    from transbench.models import build

    ref = build.resolve("bert-base-uncased")
    model = build.build_model(ref, "base", device="cuda").half()
    # one engine per packing path (EngineOptions.pack_max_s 0: the torch ops), the same routes from the tuner
    paths = {"triton": compile_model(model, dtype=torch.float16, max_batch=8),
             "torch ops": compile_model(model, dtype=torch.float16, max_batch=8, options=EngineOptions(pack_max_s=0))}
    for B, S in ((1, 128), (8, 128)):
        ids = torch.randint(0, ref.shape.vocab, (B, S), device=dev)
        ms = masks(B, S, dev)
        row = {"no mask": None, "all-ones mask": ms["full"], "padded mask": ms["padded"]}
        for c in paths.values():
            for name, mask in row.items():
                c(input_ids=ids, attention_mask=mask)  # tunes and captures this shape first
        times = {(p, name): [] for p in paths for name in row}
        for _ in range(3):  # the two packing paths interleaved
            for p, c in paths.items():
                for name, mask in row.items():
                    times[p, name].append(whole_call_ms(c, ids, mask))
        for p in paths:
            print(f"bert-base fp16 whole call {B}x{S}, packing by {p}: " + ", ".join(
                f"{name} {statistics.median(times[p, name]):.4f} ms" for name in row))


if __name__ == "__main__":
    main()
