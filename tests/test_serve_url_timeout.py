"""serve --url prepares nothing, so --prepare-budget (in-process serving's) does not bound its --timeout."""

from __future__ import annotations

import socket

from transbench.scenarios.serve.spec import ServeSpec, check


def test_an_endpoint_load_within_its_timeout_is_not_refused_for_the_preparation_budget():
    with socket.socket() as srv:  # an endpoint that accepts connections: the reachability check is the last one
        srv.bind(("127.0.0.1", 0))
        srv.listen(8)
        url = f"http://127.0.0.1:{srv.getsockname()[1]}"
        # The default --prepare-budget, 20 s, refused --timeout 10 for a load of 2.5 s at most.
        spec, _ = check(ServeSpec(url=url, api="openai-embeddings", served_model="m", rates=[50.0], duration=1.0,
                                  warmup=0.5, request_timeout=1.0, timeout=10.0))
    assert spec.timeout == 10.0


def test_an_endpoint_probe_window_is_not_cut_by_the_preparation_budget_and_the_budget_is_refused():
    from transbench.errors import SpecError
    from transbench.scenarios.serve.spec import cell

    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(8)
        url = f"http://127.0.0.1:{srv.getsockname()[1]}"
        base = dict(url=url, api="openai-embeddings", served_model="m", find_max_rate=True, slo_ms=100.0,
                    duration=1.0, warmup=0.5, request_timeout=1.0, timeout=100.0)
        spec, lengths = check(ServeSpec(**base))
        # The default 20 s of preparation, which an endpoint never spends here, was taken from each probe's window
        assert cell(spec, lengths, "http", "rate", 10.0).window_limit == 100.0 - 1.0 - 30.0
        # ... and the last request's --request-timeout was not: a low rate's window and its last request's timeout
        # outlasted --timeout (200 s: a window of 140 s, requests of 60 s)
        spec, lengths = check(ServeSpec(**{**base, "request_timeout": 60.0, "timeout": 200.0}))
        probe = cell(spec, lengths, "http", "rate", 1.0)
        assert probe.window_limit + spec.request_timeout <= spec.timeout - 30.0
        # --prepare-budget 50 cut it to 10 s: an in-process setting, refused as --max-batch-size is
        try:
            check(ServeSpec(**base, prepare_budget=50.0))
        except SpecError as exc:
            assert "--prepare-budget" in str(exc) and "\n" not in str(exc)
        else:
            raise AssertionError("--prepare-budget with --url was taken")


def test_an_endpoint_trace_leaves_its_last_request_its_request_timeout(tmp_path):
    import json

    import pytest

    from transbench.errors import SpecError

    f = tmp_path / "t.jsonl"  # 100 s of requests
    f.write_text("".join(json.dumps({"timestamp": t, "input_length": 4, "output_length": 2}) + "\n"
                         for t in (0, 50_000, 100_000)))
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(8)
        base = dict(url=f"http://127.0.0.1:{srv.getsockname()[1]}", api="openai-embeddings", served_model="m",
                    trace=str(f), warmup=0.0, timeout=150.0)
        with pytest.raises(SpecError, match="beside --request-timeout 60 s"):  # 100 + 60 past 150: taken
            check(ServeSpec(**base))
        spec, _ = check(ServeSpec(**base, request_timeout=40.0))
    assert spec.trace == str(f)


def test_an_endpoint_trace_is_not_refused_for_the_duration_it_may_not_be_given(tmp_path):
    # a 3-s trace with --request-timeout 40 under --timeout 50 was refused as "--warmup + --duration +
    # --request-timeout is 50 s": the default --duration of 10 s, which --trace refuses to be given
    f = tmp_path / "t.jsonl"
    f.write_text('{"timestamp": 0, "input_length": 4, "output_length": 2}\n'
                 '{"timestamp": 3000, "input_length": 4, "output_length": 2}\n')
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(8)
        spec, _ = check(ServeSpec(url=f"http://127.0.0.1:{srv.getsockname()[1]}", api="openai-embeddings",
                                  served_model="m", trace=str(f), warmup=0.0, request_timeout=40.0, timeout=50.0))
    assert spec.timeout == 50.0
