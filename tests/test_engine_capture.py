"""engine.capture: a failed CUDA-graph capture is followed by one that succeeds (the CUDA generator's epilogue),
then its error goes on; a capture that succeeds is left alone. CPU: torch.cuda.graph stands in."""
from contextlib import contextmanager

import pytest

from transbench.engine import capture as cap


def test_a_failed_capture_recaptures_then_raises(monkeypatch):
    calls = []

    @contextmanager
    def graph(g, **kw):
        calls.append(kw)
        yield
    monkeypatch.setattr(cap.torch.cuda, "graph", graph)
    monkeypatch.setattr(cap, "_recapture", lambda: calls.append("recapture"))
    failures = cap.failures
    with cap.capture("g", pool="p"):
        pass
    assert calls == [{"pool": "p"}] and cap.failures == failures
    with pytest.raises(RuntimeError, match="capture invalidated"):
        with cap.capture("g"):
            raise RuntimeError("capture invalidated")
    assert calls == [{"pool": "p"}, {}, "recapture"] and cap.failures == failures + 1



class FakeStreams:
    """torch.cuda's streams and captures faked on the CPU: `used` lists ("warm-up" | "capture", stream) in order, and
    a capture fails while `fail` is set."""

    class Stream:
        def wait_stream(self, other):
            pass

    def __init__(self):
        self.used, self.fail = [], False

    @contextmanager
    def on(self, stream):
        self.used.append(("warm-up", stream))
        yield

    @contextmanager
    def capture(self, graph, stream=None, **kw):
        self.used.append(("capture", stream))
        if self.fail:
            raise RuntimeError("capture invalidated")
        yield

    def streams(self) -> list:
        return [s for _, s in self.used]


@pytest.fixture
def fake(monkeypatch):
    f = FakeStreams()
    cuda = cap.torch.cuda
    for name, value in {"Stream": lambda device=None: FakeStreams.Stream(), "stream": f.on,
                        "current_stream": lambda device=None: FakeStreams.Stream(), "current_device": lambda: 0,
                        "synchronize": lambda device=None: None, "CUDAGraph": object,
                        "graph_pool_handle": lambda: "new pool"}.items():
        monkeypatch.setattr(cuda, name, value)
    monkeypatch.setattr(cuda, "graph", f.capture)  # under engine.capture.capture, which every capture goes through
    monkeypatch.setattr(cap, "_recapture", lambda: None)
    cap.side_stream.cache_clear()
    yield f
    cap.side_stream.cache_clear()


def test_every_graph_cache_warms_up_and_captures_on_the_process_one_stream(fake):
    """capture.side_stream: a stream per GraphCache made the process's first engine its only fast one (on an H100 a
    second engine's capture on a stream of its own cost every graph 6% at bert-base 8 x 128). Two caches warm up and
    capture on one stream; a failed capture moves later captures to a new one."""
    from transbench.engine import graphs

    a, b = graphs.GraphCache(enabled=False), graphs.GraphCache(enabled=False)
    a.device = b.device = 0
    for cache in (a, b):
        cache._graph(lambda: None, (), [])
    first = fake.streams()[0]
    assert len(fake.used) == 4 and all(s is first for s in fake.streams())
    fake.fail = True
    with pytest.raises(RuntimeError, match="capture invalidated"):
        b._graph(lambda: None, (), [])
    assert b.pool == "new pool" and fake.streams()[-1] is first
    fake.fail = False
    a._graph(lambda: None, (), [])
    assert fake.streams()[-1] is fake.streams()[-2] and fake.streams()[-1] is not first


def test_the_cudagraph_backend_warms_up_and_captures_on_the_process_one_stream(fake):
    """The cudagraph backend's cells run in the same worker as fused ones, and its capture on a stream of its own cost
    the fused cell after it the same 6% (H100, benchmarks/results/cell_order_h100_2026-11.md): it warms up and captures
    on side_stream too, and a failed capture moves later ones to a new stream."""
    import torch

    from transbench.backends import cudagraph

    for _ in range(2):
        cudagraph.capture(lambda: None, torch.device("cuda"), warmup=1)
    assert [k for k, _ in fake.used] == ["warm-up", "capture"] * 2
    assert all(s is cap.side_stream(0) for s in fake.streams())
    fake.fail = True
    before = cap.side_stream(0)
    with pytest.raises(RuntimeError, match="capture invalidated"):
        cudagraph.capture(lambda: None, torch.device("cuda"), warmup=1)
    assert cap.side_stream(0) is not before


def quiet_cell(cell, state):
    from transbench.cells import CellResult

    return CellResult("ok", record={"latency_ms": 1.0})


def failing_capture_cell(cell, state):
    with cap.capture("graph"):
        raise RuntimeError("capture invalidated")


def test_a_cell_whose_capture_failed_asks_for_a_fresh_worker(fake):
    """After a failed capture the process captures on a second stream, which cost later fused cells their programmatic
    dependent launch: the worker names `fresh_worker_after` and the sweep replaces it (runner/sweep.py _Lane)."""
    from transbench.runner import worker

    ok = worker.execute(f"{__name__}:quiet_cell", {"device": "cpu"}, {})
    failed = worker.execute(f"{__name__}:failing_capture_cell", {"device": "cpu"}, {})
    again = worker.execute(f"{__name__}:quiet_cell", {"device": "cpu"}, {})
    assert "fresh_worker_after" not in ok.info and "fresh_worker_after" not in again.info
    assert failed.status == "error" and "capture failed" in failed.info["fresh_worker_after"]
