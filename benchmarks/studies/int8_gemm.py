"""Would an int8 engine path keep fp8's GEMM speed? (e4m3 misses the accuracy targets, int8 with a scale per
128-deep slice of K meets them in emulation: docs/engine.md, "Accuracy").

One Triton GEMM, Y = (X W^T) * scales in fp16, over four operand recipes at bert-base and bert-large's large-batch
shapes, against torch._scaled_mm (e4m3, row-wise scales: the engine's fp8 cuBLAS route) and torch._int_mm:
  e4m3 row     e4m3 operands, one scale per row of X and per row of W (what the engine's fp8 GEMM does)
  int8 row     int8 operands, the same scales, int32 accumulation
  e4m3 group   e4m3, one X scale per (row, 128 columns): each K step's fp32 product scaled before it is summed
  int8 group   int8, likewise (the recipe that met the MiniLM target in emulation)
Each is checked against an fp64 product of the unquantized operands (rel_err: what the format costs on Gaussian
data, and on data with outlier channels, where one scale per row must stretch over the outliers) and timed with
CUDA events (triton.testing.do_bench: median, warm-up first). Random operands, never zeros.
  PYTHONPATH=src python benchmarks/studies/int8_gemm.py [--quick]
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl
import triton.testing
from triton.tools.tensor_descriptor import TensorDescriptor

GROUP_K = 128  # one activation scale per this many columns of X: the group the emulation measured
# (BM, BN, stages, warps); BK is GROUP_K, the 128-byte rows wgmma reads. The engine's fp8 tiles (gemm.FP8_CONFIGS)
CONFIGS = [(128, 256, 4, 8), (128, 256, 3, 8), (128, 128, 4, 8), (256, 128, 3, 8)]
SHAPES = {"bert-base": [(32768, 2304, 768), (32768, 768, 768), (32768, 3072, 768), (32768, 768, 3072)],
          "bert-large": [(49152, 3072, 1024), (49152, 1024, 1024), (49152, 4096, 1024), (49152, 1024, 4096)]}


@triton.jit
def _gemm(x_desc, w_desc, y_desc, XS, WS, M, N, K, INT8: tl.constexpr, GROUPED: tl.constexpr, BM: tl.constexpr,
          BN: tl.constexpr, BK: tl.constexpr):
    # Grouped tile order (8 row blocks a group), as the engine's GEMM: neighbours share X rows in L2.
    pid = tl.program_id(0)
    n_m, n_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    per_group = 8 * n_n
    first_m = (pid // per_group) * 8
    size_m = min(n_m - first_m, 8)
    om = (first_m + (pid % per_group) % size_m) * BM
    on = ((pid % per_group) // size_m) * BN
    rows, cols = om + tl.arange(0, BM), on + tl.arange(0, BN)
    n_k = tl.cdiv(K, BK)
    if GROUPED:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(n_k):
            a = x_desc.load([om, k * BK])
            b = w_desc.load([on, k * BK])
            if INT8:
                part = tl.dot(a, b.T, out_dtype=tl.int32).to(tl.float32)
            else:
                part = tl.dot(a, b.T)
            acc += part * tl.load(XS + rows * n_k + k, mask=rows < M, other=0.0)[:, None]
    else:
        if INT8:
            iacc = tl.zeros((BM, BN), dtype=tl.int32)
            for k in range(n_k):
                iacc = tl.dot(x_desc.load([om, k * BK]), w_desc.load([on, k * BK]).T, iacc, out_dtype=tl.int32)
            acc = iacc.to(tl.float32)
        else:
            acc = tl.zeros((BM, BN), dtype=tl.float32)
            for k in range(n_k):
                acc = tl.dot(x_desc.load([om, k * BK]), w_desc.load([on, k * BK]).T, acc)
        acc = acc * tl.load(XS + rows, mask=rows < M, other=0.0)[:, None]
    acc = acc * tl.load(WS + cols, mask=cols < N, other=0.0)[None, :]
    y_desc.store([om, on], acc.to(tl.float16))


def quantize(t: torch.Tensor, int8: bool, group: int | None):
    """(data, fp32 scales) with each row's (or each row's group of `group` columns') max-abs at the format's top."""
    top = 127.0 if int8 else 448.0
    x = t.float()
    g = x.view(x.shape[0], -1, group) if group else x.unsqueeze(1)
    scale = (g.abs().amax(dim=-1, keepdim=True) / top).clamp(min=1e-12)
    q = g / scale
    q = q.round().clamp(-127, 127).to(torch.int8) if int8 else q.to(torch.float8_e4m3fn)
    return q.view_as(x), scale.view(x.shape[0], -1).contiguous()


def run(x_q, xs, w_q, ws, int8, grouped, cfg, y=None):
    (M, K), N = x_q.shape, w_q.shape[0]
    bm, bn, stages, warps = cfg
    y = torch.empty(M, N, device=x_q.device, dtype=torch.float16) if y is None else y
    _gemm[(triton.cdiv(M, bm) * triton.cdiv(N, bn),)](
        TensorDescriptor.from_tensor(x_q, [bm, GROUP_K]), TensorDescriptor.from_tensor(w_q, [bn, GROUP_K]),
        TensorDescriptor.from_tensor(y, [bm, bn]), xs, ws, M, N, K, INT8=int8, GROUPED=grouped, BM=bm, BN=bn,
        BK=GROUP_K, num_stages=stages, num_warps=warps)
    return y


def bench(fn) -> tuple[float, float]:
    """(median, IQR) ms: triton's do_bench (CUDA events, warm-up first, L2 flushed before each call)."""
    q1, median, q3 = triton.testing.do_bench(fn, warmup=25, rep=100, quantiles=[0.25, 0.5, 0.75])
    return median, q3 - q1


def rel(y, ref) -> float:
    return ((y.double() - ref).norm() / ref.norm()).item()


def operands(M, N, K, outliers: bool, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(M, K, device="cuda", generator=g)
    if outliers:  # a few channels 20x the rest, as LayerNorm outputs of trained encoders carry (docs/engine.md)
        x[:, torch.randperm(K, device="cuda", generator=g)[: max(1, K // 128)]] *= 20.0
    w = torch.randn(N, K, device="cuda", generator=g) * K**-0.5
    return x, w


@torch.inference_mode()
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="one shape of each model, two tile configs")
    a = ap.parse_args(argv)
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__, flush=True)
    configs = CONFIGS[:2] if a.quick else CONFIGS
    recipes = [("e4m3 row", False, False), ("int8 row", True, False), ("e4m3 group", False, True),
               ("int8 group", True, True)]
    # Accuracy on a shape small enough for an fp64 reference, fresh operands for each recipe's data kind.
    print("\n## rel_err against fp64 of the unquantized operands (4096 x 768 x 768)")
    for outliers in (False, True):
        x, w = operands(4096, 768, 768, outliers, seed=1 + outliers)
        ref = x.double() @ w.double().T
        line = []
        for label, int8, grouped in recipes:
            xq, xs = quantize(x, int8, GROUP_K if grouped else None)
            wq, ws = quantize(w, int8, None)
            y = torch.full((4096, 768), float("nan"), device="cuda", dtype=torch.float16)  # poisoned
            run(xq, xs, wq, ws.flatten().contiguous(), int8, grouped, configs[0], y)
            assert torch.isfinite(y).all(), f"{label}: an output was not written"
            line.append(f"{label} {rel(y, ref):.3e}")
        print(f"  {'outlier channels' if outliers else 'Gaussian':17s} " + "  ".join(line), flush=True)

    print("\n## ms (IQR) and TFLOPS, best tile config per recipe")
    rows = []
    for model, shapes in SHAPES.items():
        for M, N, K in shapes[:1] + shapes[3:] if a.quick else shapes:
            x, w = operands(M, N, K, False, seed=M + N + K)
            tf = 2 * M * N * K / 1e9
            results = {}
            x8, xs8 = quantize(x, False, None)
            w8, ws8 = quantize(w, False, None)
            results["_scaled_mm e4m3 row"] = bench(lambda: torch._scaled_mm(
                x8, w8.T, scale_a=xs8, scale_b=ws8.view(1, -1), out_dtype=torch.float16))
            xi, _ = quantize(x, True, None)
            wi, _ = quantize(w, True, None)
            try:
                results["_int_mm int8 (int32 out)"] = bench(lambda: torch._int_mm(xi, wi.T))
            except RuntimeError as e:
                print(f"  _int_mm: {str(e)[:100]}")
            xh, wh = x.half(), w.half()
            results["cuBLAS fp16"] = bench(lambda: xh @ wh.T)
            for label, int8, grouped in recipes:
                xq, xs = quantize(x, int8, GROUP_K if grouped else None)
                wq, ws = quantize(w, int8, None)
                ws = ws.flatten().contiguous()
                best = None
                for cfg in configs:
                    try:
                        t = bench(lambda: run(xq, xs, wq, ws, int8, grouped, cfg))
                    except Exception as e:  # noqa: BLE001 - a config this GPU refuses (shared memory) is reported
                        print(f"  {label} {cfg}: {type(e).__name__} {str(e)[:80]}")
                        continue
                    if best is None or t[0] < best[0][0]:
                        best = (t, cfg)
                if best:
                    results[f"triton {label}"] = (*best[0], "x".join(map(str, best[1])))
            for kind, (ms, iqr, *cfg) in results.items():
                rows.append((model, kind, ms))
                print(f"  {model:10s} {M}x{N}x{K:<5d} {kind + ' ' + ''.join(cfg):40s} {ms:7.4f} ({iqr:.4f}) ms "
                      f"{tf / ms:7.1f} TFLOPS", flush=True)
    print("\n## per model: the four GEMMs of one layer, summed (ms)")
    for model in SHAPES:
        for kind in dict.fromkeys(r[1] for r in rows if r[0] == model):
            ms = [r[2] for r in rows if r[0] == model and r[1] == kind]
            print(f"  {model:10s} {kind:40s} {sum(ms):7.4f} ms over {len(ms)} GEMMs")


if __name__ == "__main__":
    main()
