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
    with cap.capture("g", pool="p"):
        pass
    assert calls == [{"pool": "p"}]
    with pytest.raises(RuntimeError, match="capture invalidated"):
        with cap.capture("g"):
            raise RuntimeError("capture invalidated")
    assert calls == [{"pool": "p"}, {}, "recapture"]


def test_every_graph_cache_warms_up_and_captures_on_the_process_one_stream(monkeypatch):
    """capture.side_stream: a stream per GraphCache made the process's first engine its only fast one (on an H100 a
    second engine's capture on a stream of its own cost every graph 6% at bert-base 8 x 128). Two caches warm up and
    capture on one stream; a failed capture moves later captures to a new one."""
    from transbench.engine import graphs

    class Stream:
        def wait_stream(self, other):
            pass

    used = []

    @contextmanager
    def on(stream):
        used.append(stream)
        yield

    @contextmanager
    def fake_capture(graph, pool=None, stream=None):
        used.append(stream)
        if pool == "fails":
            raise RuntimeError("capture invalidated")
        yield

    monkeypatch.setattr(cap.torch.cuda, "Stream", lambda device=None: Stream())
    monkeypatch.setattr(graphs.torch.cuda, "stream", on)
    monkeypatch.setattr(graphs.torch.cuda, "current_stream", Stream)
    monkeypatch.setattr(graphs.torch.cuda, "CUDAGraph", object)
    monkeypatch.setattr(graphs.torch.cuda, "graph_pool_handle", lambda: "new pool")
    monkeypatch.setattr(graphs, "capture", fake_capture)
    cap.side_stream.cache_clear()
    try:
        a, b = graphs.GraphCache(enabled=False), graphs.GraphCache(enabled=False)
        a.device = b.device = 0
        for cache in (a, b):
            cache._graph(lambda: None, (), [])
        assert len(used) == 4 and all(s is used[0] for s in used)
        b.pool = "fails"
        with pytest.raises(RuntimeError, match="capture invalidated"):
            b._graph(lambda: None, (), [])
        assert b.pool == "new pool" and used[-1] is used[0]
        a._graph(lambda: None, (), [])
        assert used[-1] is used[-2] and used[-1] is not used[0]
    finally:
        cap.side_stream.cache_clear()
