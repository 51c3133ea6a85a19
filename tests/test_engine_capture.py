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
