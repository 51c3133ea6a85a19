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
