"""serve --url holds a connection per request in flight on one event loop: a closed loop of more clients than the
process may hold connections, or than one event loop drives (http_client.MAX_IN_FLIGHT), is refused before the load,
and an open loop never keeps more than MAX_IN_FLIGHT requests in flight. The file limit is patched: no test opens
thousands of sockets."""

from __future__ import annotations

import resource
import socket
import time

import pytest
from hypothesis import given, settings, strategies as st

from transbench.errors import SpecError
from transbench.scenarios.serve import http_client
from transbench.scenarios.serve.http_client import MAX_IN_FLIGHT, OWN_FILES, payload, run_http_load
from transbench.scenarios.serve.load import LoadPlan
from transbench.scenarios.serve.spec import ServeSpec, check


class FileLimit:
    """resource.getrlimit/setrlimit for RLIMIT_NOFILE as a process with these limits sees them: the soft limit may be
    raised up to the hard one."""

    def __init__(self, monkeypatch, soft: int, hard: int):
        self.soft, self.hard = soft, hard
        real_get, real_set = resource.getrlimit, resource.setrlimit

        def get(which):
            return (self.soft, self.hard) if which == resource.RLIMIT_NOFILE else real_get(which)

        def set_(which, limits):
            if which != resource.RLIMIT_NOFILE:
                return real_set(which, limits)
            soft, hard = limits
            if hard != self.hard or (self.hard != resource.RLIM_INFINITY and soft > self.hard):
                raise ValueError("not allowed to raise maximum limit")
            self.soft = soft
        monkeypatch.setattr(resource, "getrlimit", get)
        monkeypatch.setattr(resource, "setrlimit", set_)


@pytest.fixture(scope="module")
def listening():
    """A URL whose reachability check (the spec's last) passes: the check is not what is tested here."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(http_client, "check_reachable", lambda url: None)
        yield "http://127.0.0.1:9"


def _check(url: str, clients: int):
    return check(ServeSpec(url=url, api="openai-embeddings", served_model="m", concurrency=sorted({1, clients}),
                           duration=1.0, warmup=0.0, request_timeout=5.0, timeout=60.0))


@settings(max_examples=25, deadline=None)
@given(clients=st.integers(1, 1_000_000), soft=st.integers(1, 40_000), above=st.integers(0, 40_000),
       unlimited=st.booleans())
def test_a_closed_loop_is_refused_beyond_the_connections_it_may_hold_or_one_event_loop_drives(
        listening, clients, soft, above, unlimited):
    with pytest.MonkeyPatch.context() as mp:
        hard = resource.RLIM_INFINITY if unlimited else soft + above
        limit = FileLimit(mp, soft, hard)
        # the soft limit raised to the hard one first, as pool_size does (no limit at all: 65,536 asked for)
        held = 65536 - OWN_FILES if unlimited else max(1, soft + above - OWN_FILES)
        most = clients
        if most <= min(held, MAX_IN_FLIGHT):
            spec, _ = _check(listening, clients)
            assert max(spec.concurrency) == most
            return
        with pytest.raises(SpecError) as exc:
            _check(listening, clients)
    said = str(exc.value)
    assert "\n" not in said and f"--concurrency {most:,}" in said
    if most > held:
        assert f"this process may hold {held:,}" in said and "ulimit -n" in said, said
    else:
        assert f"above the {MAX_IN_FLIGHT:,} clients" in said, said
    assert limit.soft == (65536 if unlimited else soft + above)


def test_no_file_limit_at_all_leaves_the_pool_its_load(monkeypatch):
    # an unlimited soft limit read as -1 made a pool of one connection (soft - 128, at least 1)
    FileLimit(monkeypatch, resource.RLIM_INFINITY, resource.RLIM_INFINITY)

    def refused(which, limits):
        raise ValueError("not allowed")
    monkeypatch.setattr(resource, "setrlimit", refused)  # a container that lets no process set its limits
    assert http_client.pool_size(LoadPlan([4], concurrency=500)) == 500
    assert http_client.pool_size(LoadPlan([4], concurrency=MAX_IN_FLIGHT + 1)) == MAX_IN_FLIGHT


def test_an_open_loop_keeps_at_most_its_bound_in_flight_and_the_rest_are_not_sent(monkeypatch):
    # an endpoint that accepts and never answers, against a rate past the bound: every request planned while the
    # bound was in flight waited on the load's one event loop, and a rate of 25,000/s over 1 s with requests of 5 s
    # ran 20 s (7 s with the bound of 10,000)
    monkeypatch.setattr(http_client, "MAX_IN_FLIGHT", 3)
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(64)
        plan = LoadPlan([4], arrivals=[i * 0.01 for i in range(10)], span_s=0.1, warmup_s=0.0)
        start = time.monotonic()
        trace = run_http_load(f"http://127.0.0.1:{srv.getsockname()[1]}", "openai-embeddings",
                              lambda r: payload("openai-embeddings", "m", "x", 0), plan, timeout_s=0.5)
        took = time.monotonic() - start
    assert [r.status for r in trace.requests] == ["timeout"] * 10
    assert trace.peak_in_flight == 3 and trace.unsent == 7 and took < 3, (trace.peak_in_flight, trace.unsent, took)
    assert all(r.error.startswith("no complete answer") for r in trace.requests[:3])
    assert all(r.error == "not sent: 3 requests were in flight, the most the client keeps at once"
               for r in trace.requests[3:])
