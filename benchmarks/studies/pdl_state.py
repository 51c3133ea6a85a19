"""Which step of a second `run` cell slows the first cell's captured graph? (CUDA, fused backend.) Prepares one cell
as scenarios.inference.measure.run does, then replays its graph alone (order_latency.replay_ms) after each step that a
second cell of the same shape takes, in order, printing the replay time after each (--own-stream: the second engine
captures on a stream of its own, as every engine did before capture.side_stream). --bisect and --capture take
smaller steps.

    PYTHONPATH=src python3 benchmarks/studies/pdl_state.py --model bert-base-uncased --dtype fp16 --batch 8 --seq 128

Run `transbench tune` for the shape (and 1 x 128, which --capture shape adds) first, so that nothing tunes."""
from __future__ import annotations

import argparse
import gc
import time

import torch

from order_latency import compiled_of, replay_ms
from transbench import backends
from transbench.cells import Cell
from transbench.engine.capture import side_stream
from transbench.measure import device as dev
from transbench.measure import memory, timer
from transbench.scenarios.inference import measure as inference


def bisect(first, say) -> None:
    """Steps a second engine's first call takes, one at a time, least first."""
    compiled = compiled_of(first.fn)
    graphs = compiled.engine.graphs
    side = torch.cuda.Stream()
    say("a new stream")
    with torch.cuda.stream(side):
        torch.ones(1, device="cuda").add_(1)
    torch.cuda.synchronize()
    say("a kernel on it")
    graphs.enabled = False
    first.fn()
    torch.cuda.synchronize()
    say("an eager forward, default stream")
    with torch.cuda.stream(side):
        first.fn()
    torch.cuda.synchronize()
    say("an eager forward, new stream")
    graphs.enabled = True
    g, x = torch.cuda.CUDAGraph(), torch.ones(1, device="cuda")
    with torch.cuda.graph(g, pool=torch.cuda.graph_pool_handle(), stream=torch.cuda.Stream()):
        x.add_(1)
    g.replay()
    torch.cuda.synchronize()
    say("a one-kernel capture")
    graphs.release()
    first.fn()
    torch.cuda.synchronize()
    say("the first engine captured again")


def capture_one(first, how: str, say) -> None:
    """One more capture beside the first engine's graph: a one-kernel graph on the engine's capture stream and pool
    or on new ones (how: same, new-stream, new-pool, new), or a second shape (1 x 128) in the engine's own
    GraphCache (shape);
    then that graph dropped."""
    compiled = compiled_of(first.fn)
    graphs = compiled.engine.graphs
    if how == "shape":
        h = torch.randn(1, 128, compiled.engine.dims.hidden, device="cuda", dtype=torch.float16)  # tuned: no races
        compiled.encode(h)
        torch.cuda.synchronize()
        say("a second shape in its cache")
        graphs.entries.popitem(last=True)
        gc.collect()
        say("that shape dropped")
        return
    stream = side_stream(graphs.device) if how in ("same", "new-pool") else torch.cuda.Stream()
    pool = graphs.pool if how in ("same", "new-stream") else torch.cuda.graph_pool_handle()
    g, x = torch.cuda.CUDAGraph(), torch.ones(1, device="cuda")
    with torch.cuda.graph(g, pool=pool, stream=stream):
        x.add_(1)
    torch.cuda.synchronize()
    say(f"a one-kernel capture ({how})")
    g.replay()
    torch.cuda.synchronize()
    say("its replay")
    del g
    gc.collect()
    say("it dropped")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="bert-base-uncased")
    ap.add_argument("--dtype", default="fp16")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--bisect", action="store_true", help="the steps of a second engine's first call, one by one")
    ap.add_argument("--capture", choices=["same", "new-stream", "new-pool", "new", "shape"],
                    help="one more capture beside the first graph (capture_one)")
    ap.add_argument("--own-stream", action="store_true",
                    help="the second engine captures on a new stream (each GraphCache's own, as before "
                         "capture.side_stream)")
    a = ap.parse_args()
    device = torch.device("cuda")
    cell = Cell(model=a.model, task="base", backend="fused", dtype=a.dtype, batch=a.batch, seq=a.seq, device="cuda",
                embeddings=False, min_time=1.0)
    backend, cache = backends.get("fused"), inference.ModelCache()

    def prepare():
        inputs = inference.cell_inputs(cell, inference.build.resolve(cell.model).shape)
        inference.reference(cache, cell, inputs, device)
        model = inference.model_for(cache, cell, backend, device)
        inputs = inputs.to(device)
        inference.encoders_only(model, inputs, "bert")
        prepared = backend.prepare(model, inputs, cell)
        prepared.fn()
        torch.cuda.synchronize()
        return prepared

    first = prepare()
    say = lambda step: print(f"after {step:<34} first graph {replay_ms(first.fn):.4f} ms", flush=True)  # noqa: E731
    say("its first call")
    if a.bisect:
        bisect(first, say)
        return
    if a.capture:
        capture_one(first, a.capture, say)
        return
    inference.settle(first, device)
    say("settle")
    timer.sample(first.fn, device, timer.TimerConfig(3, 1.0, 10))
    say("the sampler")
    memory.snapshot(device), dev.gpu_info(device)
    say("memory.snapshot, gpu_info")
    time.sleep(2)
    say("2 s idle")
    torch.cuda.empty_cache()
    say("empty_cache")
    if a.own_stream:  # as before capture.side_stream: each engine warmed up and captured on a stream of its own
        side_stream.cache_clear()
    second = prepare()
    say("a second engine's first call")
    print(f"{'':<40} second graph {replay_ms(second.fn):.4f} ms")
    inference.settle(second, device)
    say("its settle")
    print(f"{'':<40} second graph {replay_ms(second.fn):.4f} ms")
    second.release()
    del second
    dev.free_memory(device)
    say("the second released and freed")


if __name__ == "__main__":
    main()
