"""The fused server ready in seconds: the packed-token ladder (bounded graphs, stated worst-case padding), the
preparation budget against a fake clock, the order shapes are prepared in, and the progress it reports."""

from collections import Counter

import pytest
import torch

from transbench.engine.packing import make_packing, token_ladder
from transbench.scenarios.serve.measure import even_mask, packed_size, token_counts
from transbench.scenarios.serve.prepare import Step, by_need, run_steps


@pytest.mark.parametrize("B, S", [(32, 512), (16, 256), (8, 384), (1, 512), (3, 100)])
def test_ladder_bounds_padding_and_graphs(B, S):
    step, growth = 128, 1.25
    sizes = token_ladder(B * S, step, growth, S)
    assert sizes == sorted(set(sizes)) and sizes[-1] == B * S
    assert all(s % step == 0 for s in sizes[:-1])
    for lo, hi in zip(sizes, sizes[1:]):  # the stated bound: 1.25x (or one step), and never a width S above
        assert hi <= max(lo * growth, lo + step) and hi - lo <= max(S, step)
    for n in range(1, B * S + 1, 7):  # any real-token count runs with padding under the bound
        tp = sizes[next(i for i, s in enumerate(sizes) if s >= n)]
        assert tp - n < max(n * (growth - 1), step) and tp - n < max(S, step)
    if (B, S) == (32, 512):
        assert len(sizes) == 40  # where every multiple of 128 was 128 graphs


def test_make_packing_rounds_to_the_ladder():
    B, S = 4, 32
    sizes = token_ladder(B * S, 8, 1.25, S)
    for n in range(B, B * S):
        p = make_packing(even_mask(B, S, n), B, S, 8, sizes=sizes)
        assert p.dense or p.tokens in sizes
        if not p.dense:
            assert p.tokens >= n and p.max_len >= p.tokens - n  # the spare rows fit the attention's bound


def test_token_counts_cover_each_reachable_ladder_size():
    B, S = 4, 32
    sizes = token_ladder(B * S, 8, 1.25, S)
    counts = token_counts(B, 20, S, sizes)  # lengths up to 20 of a 32-wide bucket
    reached = {packed_size(n, B, S, sizes) for n in range(B, B * 20 + 1)}
    assert {packed_size(n, B, S, sizes) for n in counts} == reached
    full = token_counts(B, S, S, sizes)  # full rows reachable: the dense batch and the packed one below it
    assert B * S in full and B * S - 1 in full


def test_budget_with_a_fake_clock():
    """Steps run while time is left; one started before the budget ends may finish past it; the rest wait for
    their first use under load, and the account says how many."""
    now = [0.0]
    ran = []

    def step(i):
        def run():
            ran.append(i)
            now[0] += 3.0  # each step takes 3 s of the fake clock
        return Step(f"graph {i}", run)

    said = []
    acc = run_steps([step(i) for i in range(10)], 10.0, "fused shapes", said.append, clock=lambda: now[0])
    assert ran == [0, 1, 2, 3]  # started at 0, 3, 6, 9 s; at 12 s the budget is spent
    assert acc == {"prepared": 4, "total": 10, "left": 6, "tuned": 4, "seconds": 12.0}
    assert said[0].startswith("preparing fused shapes: graph 0 (1 of 10")
    assert "budget of 10 s spent after 4 of 10; 6 left to first use under load" in said[-1]
    now[0] = 0.0
    acc = run_steps([step(i) for i in range(3)], None, "x", clock=lambda: now[0])  # no budget: all
    assert acc["left"] == 0
    now[0] = 0.0
    acc = run_steps([step(i) for i in range(3)], 0.0, "x", clock=lambda: now[0])  # budget 0: all under load
    assert acc["prepared"] == 0 and acc["left"] == 3


def test_tuning_stops_at_the_switch_and_the_rest_is_captured_untuned():
    """With switch_s, the first step started at or after it runs after on_switch (the fused server's tuning
    budget set to 0); the account says how many were tuned; on_switch is not called when every step ran before."""
    now, ran, switched = [0.0], [], []

    def step(i, cost):
        def run():
            ran.append((i, bool(switched)))
            now[0] += cost
        return Step(f"graph {i}", run)

    said = []
    acc = run_steps([step(i, 3.0 if i < 2 else 0.5) for i in range(10)], 10.0, "fused shapes", said.append,
                    clock=lambda: now[0], switch_s=5.0, on_switch=lambda: switched.append(now[0]))
    assert switched == [6.0] and ran[:3] == [(0, False), (1, False), (2, True)]
    assert acc["tuned"] == 2 and acc["prepared"] == 10 and acc["left"] == 0
    assert any("6.0 s spent tuning 2 of 10; the rest captured without tuning" in m for m in said)
    now[0], switched[:] = 0.0, []
    acc = run_steps([step(i, 0.1) for i in range(3)], 10.0, "x", clock=lambda: now[0], switch_s=5.0,
                    on_switch=lambda: switched.append(1))
    assert switched == [] and acc["tuned"] == 3


def test_the_covering_shapes_come_first_once_tuning_stops():
    """first_after_switch runs right after the switch, ahead of the rest; a step whose key already ran (tuned among
    the commonest) is skipped, and the total counts each key once."""
    now, ran = [0.0], []

    def step(k, cost=1.0):
        def run():
            ran.append(k)
            now[0] += cost
        return Step(f"shape {k}", run, key=k)

    steps = [step(k, 3.0) for k in ("a", "b")] + [step(k) for k in ("c", "d", "top1", "e")]
    cover = [step("top2"), step("top1"), step("a")]
    acc = run_steps(steps, 100.0, "x", clock=lambda: now[0], switch_s=5.0, on_switch=lambda: None,
                    first_after_switch=cover)
    assert ran == ["a", "b", "top2", "top1", "c", "d", "e"]
    assert acc == {"prepared": 7, "total": 7, "left": 0, "tuned": 2, "seconds": 11.0}
    now[0], ran[:] = 0.0, []
    acc = run_steps(steps, 7.5, "x", clock=lambda: now[0], switch_s=5.0, first_after_switch=cover)
    assert ran == ["a", "b", "top2", "top1"] and acc["left"] == 3  # the budget ran out on the rest, not the cover


def test_progress_is_throttled_but_says_the_last():
    now = [0.0]

    def run():
        now[0] += 0.5

    said = []
    run_steps([Step(f"s{i}", run) for i in range(10)], None, "w", said.append, clock=lambda: now[0])
    assert len(said) < 10 and "(10 of 10" in said[-1] and "(1 of 10" in said[0]


def test_shapes_by_need():
    """Commonest first within a batch size, batch sizes in turns from the largest."""
    groups = {1: [128, 256], 4: [128, 256, 384, 512]}
    counts = {1: Counter({256: 5}), 4: Counter({384: 9, 256: 2})}
    assert by_need(groups, counts) == [(4, 384), (1, 256), (4, 256), (1, 128), (4, 128), (4, 512)]


def test_engine_ladder_keeps_outputs_on_cpu():
    """The fused engine with a server's ladder gives transformers' outputs (the spare rows are their own
    sequence), and lists its packed sizes."""
    from transformers import BertConfig, BertModel

    from transbench.engine import compile_model

    torch.manual_seed(0)
    m = BertModel(BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                             max_position_embeddings=64, vocab_size=100)).eval()
    ids = torch.randint(1, 100, (3, 19))
    mask = torch.ones(3, 19, dtype=torch.long)
    mask[0, 7:] = 0
    mask[2, 11:] = 0
    with torch.no_grad():
        ref = m(ids, attention_mask=mask).last_hidden_state
    c = compile_model(m, dtype=torch.float32, token_growth=1.25)
    out = c(ids, attention_mask=mask).last_hidden_state
    keep = mask.bool()
    assert torch.allclose(out[keep], ref[keep], atol=1e-4)
    assert c.token_sizes(3, 19)[-1] == 57 and len(c.token_sizes(3, 19)) < 57
    assert compile_model(m, dtype=torch.float32).token_sizes(3, 19) == list(range(1, 58))  # CPU bucket 1
    with pytest.raises(ValueError, match="token_growth"):
        compile_model(m, dtype=torch.float32, token_growth=1.0)


@pytest.mark.parametrize("budget", [None, 0.0])
def test_a_ladder_server_prepares_within_its_budget(extra_backends, budget):
    """A fake of the fused engine's ladder: with time enough every reachable ladder size is prepared before the load
    (none under it); with a budget of 0 none is, and the graphs the load meets are captured under it and counted."""
    from transbench.scenarios.inference.measure import ModelCache
    from transbench.scenarios.serve import lengths as serve_lengths, measure as serve

    extra_backends("serve_backends")
    lengths = serve_lengths.parse("lognormal:12:32", 128).to_dict()
    cell = serve.ServeCell("bert-tiny", "classification", "ladder", "fp32", "rate", rate=300.0, lengths=lengths,
                           max_batch_size=4, max_wait_ms=1.0, duration=1.0, warmup=0.1, device="cpu",
                           prepare_budget=20.0 if budget is None else budget)
    said = []
    r = serve.run(cell, ModelCache(), said.append)
    assert r.status == "ok", r.error
    rec, prep = r.record, r.info["preparation"]
    expected = sum(len(token_counts(b, 32, 32, token_ladder(b * 32, 8, 1.25, 32))) for b in (1, 2, 4))
    assert prep["total"] == expected and rec["shapes_prepared"] + rec["shapes_left"] == expected
    if budget is None:
        assert rec["shapes_left"] == 0 and rec["graphs_captured_under_load"] == 0
        assert "(%d of %d" % (expected, expected) in said[-1]
    else:
        assert rec["shapes_prepared"] == 0 and rec["graphs_captured_under_load"] > 0
        assert "budget of 0 s spent after 0 of" in said[-1]
    assert rec["shapes_prepared_under_load"] == 0  # every batch size's engine was built before the load


def _servers(extra_backends, model: str, task: str, backend: str, lengths: str, max_len: int, budget: float, **kw):
    """A CPU server of a test backend (tests/serve_backends.py), as serve.run builds it: a function that makes one
    (Encoders or Decoders, by task, its gate's reference computed), the lengths and the cell."""
    from transbench import backends
    from transbench.models import build
    from transbench.scenarios.inference.measure import ModelCache, model_for
    from transbench.scenarios.serve import lengths as serve_lengths, measure as serve

    extra_backends("serve_backends")
    dist = serve_lengths.parse(lengths, max_len)
    cell = serve.ServeCell(model, task, backend, "fp32", "rate", rate=300.0, lengths=dist.to_dict(), max_batch_size=4,
                           max_wait_ms=1.0, duration=1.0, warmup=0.1, device="cpu", prepare_budget=budget, **kw)
    b, device, cache = backends.get(backend), torch.device("cpu"), ModelCache()
    loaded = model_for(cache, cell, b, device)
    kind = serve.Decoders if task == "generate" else serve.Encoders

    def make():
        server = kind(loaded, b, cell, build.resolve(model).shape, device)
        server.check(cache)
        return server

    return make, dist, cell


def test_a_short_budget_still_leaves_every_batch_a_captured_graph(extra_backends):
    """With a budget that tunes a few shapes and captures the rest untuned, each batch size's largest shape is
    captured once tuning stops, so no batch the load draws captures under load: each pads into a captured graph
    (the fused server's first max-rate probe captured 5 graphs under load, its p99 2,386 ms)."""
    from types import SimpleNamespace

    from transbench.scenarios.serve import measure as serve

    make, lengths, cell = _servers(extra_backends, "bert-tiny", "classification", "ladder", "lognormal:12:32", 128, 8.0)
    import serve_backends as fake

    server = make()
    fake.CLOCK[0] = 0.0
    prep = server.warm(lengths, cell.prepare_budget, clock=lambda: fake.CLOCK[0])
    assert prep["tuned"] == 2 and 0 < prep["left"]  # 2 tuned (3 s each), then untuned captures until 8 s
    before = server.engine_graphs()
    server.loading = True
    for rows in serve.sampled_batches(lengths, 4, seed=11).values():
        for row in rows[:64]:
            server.serve([SimpleNamespace(length=n) for n in row])
        for n in (1, 2, 3, 4):  # the longest batches a size can draw
            server.serve([SimpleNamespace(length=32)] * (n - 1) + [SimpleNamespace(length=31)])
    assert server.engine_graphs() == before and server.under_load == 0


def test_generators_built_after_the_tuning_share_or_under_load_capture_untuned(extra_backends):
    """A server's generators tune while the first half of its budget lasts; the ones built after it, and any built
    under load, are told to capture on borrowed routes (a tuned capture under load held a gpt2 server's first
    requests for 4.9 s)."""
    from types import SimpleNamespace

    make, lengths, cell = _servers(extra_backends, "gpt2-tiny", "generate", "tuning-gen", "lognormal:24:64", 100, 7.0,
                                   new_tokens=2)
    import serve_backends as fake

    server = make()
    fake.CLOCK[0] = 0.0
    prep = server.warm(lengths, cell.prepare_budget, clock=lambda: fake.CLOCK[0])
    # 3 s each while under 3.5 s (the gate's shape, built before, costs nothing), then 0.5 s each until 7 s
    assert prep["tuned"] == 3 and prep["left"] > 0
    built = [g for key, (g, _, _) in server.gens.items() if key != (server.gate_cell().batch, server.gate_cell().seq)]
    assert [g.budgets for g in built].count([]) == 2 and all(g.budgets == [0] for g in built if g.budgets)
    assert (4, 64) in server.gens  # the largest bucket came first: it holds every batch (serve.holder)
    server.loading = True
    server.serve([SimpleNamespace(length=40, output=0)] * 3)
    assert server.under_load == 0
    fresh = make()
    fresh.warm(lengths, 0.0, clock=lambda: fake.CLOCK[0])  # nothing prepared: the load builds what it meets
    fresh.loading = True
    fresh.serve([SimpleNamespace(length=50, output=0)])  # wider than the gate's generator (4 x 32): built now
    assert fresh.gens[(1, 64)][0].budgets == [0] and fresh.under_load == 1


def test_a_batch_runs_the_smallest_prepared_bucket_that_holds_it():
    from transbench.scenarios.serve.measure import holder

    prepared = {(4, 64, 0.0): 0, (4, 32, 0.0): 0, (32, 512, 0.0): 0, (2, 32, 8.0): 0}  # the last: the gate's
    assert holder(prepared, 4, 64) == (4, 64)  # its own
    assert holder(prepared, 2, 32) == (4, 32)  # the gate's bucket of other lengths is not one
    assert holder(prepared, 1, 64) == (4, 64) and holder(prepared, 8, 64) == (32, 512)
    assert holder({}, 2, 32) == (2, 32) and holder({(1, 32): 0}, 2, 32) == (2, 32)  # none holds it: its own


def test_a_short_budget_leaves_a_graph_backend_no_shape_to_prepare_under_load(extra_backends):
    """A backend of one graph per (batch, width) bucket, its budget spent after the largest bucket and a few more:
    every batch the load draws runs its own bucket or the smallest prepared one that holds it, none is prepared
    under load."""
    from types import SimpleNamespace

    from transbench.scenarios.serve import measure as serve

    make, lengths, cell = _servers(extra_backends, "bert-tiny", "classification", "sleepy", "lognormal:24:96", 128, 4.0)
    server = make()
    now = [0.0]

    def clock():  # each look at the clock a second later: the budget ends after a few buckets
        now[0] += 1.0
        return now[0]

    prep = server.warm(lengths, cell.prepare_budget, clock=clock)
    assert (4, 96, 0.0) in server.prepared and prep["left"] > 0
    server.loading = True
    for rows in serve.sampled_batches(lengths, 4, seed=3).values():
        for row in rows[:16]:
            server.serve([SimpleNamespace(length=n) for n in row])
    assert server.under_load == 0


def test_a_backend_with_nothing_to_capture_runs_each_batch_in_its_own_bucket(extra_backends):
    # sdpa padded every batch under load into the largest prepared bucket: a 5-token request ran 128 columns
    from types import SimpleNamespace

    make, lengths, cell = _servers(extra_backends, "bert-tiny", "classification", "sdpa", "lognormal:24:96", 128, 4.0)
    server = make()
    server.top = 96
    server.entry(4, 96)  # the largest bucket prepared, as a short budget leaves it
    server.loading = True
    inputs, _, _ = server.entry_for(1, 5)
    assert tuple(inputs.input_ids.shape) == (1, 32)  # its own bucket (not the largest, 4 x 96), prepared now
    server.serve([SimpleNamespace(length=5)])
    assert server.under_load >= 1


@pytest.mark.parametrize("budget,untuned", [(1e6, False), (0.0, True)])
def test_the_servers_warm_generators_tune_within_its_budgets_first_half(extra_backends, budget, untuned):
    """`transbench server --warm-lengths`: every listed generator is prepared before it reports healthy, tuned while
    the first half of --prepare-budget lasts and captured on borrowed routes after it; one built for a request
    after that is counted (/metrics) and captures untuned."""
    from transbench.models import build
    from transbench.scenarios.serve.server_model import Job, ModelThread
    from transbench.scenarios.serve.server_spec import ServerSpec

    extra_backends("serve_backends")
    spec = ServerSpec(model="gpt2-tiny", backend="tuning-gen", dtype="fp32", device="cpu", max_batch_size=2,
                      max_length=16, max_tokens=2, warm_lengths=[8, 16], prepare_budget=budget)
    thread = ModelThread(spec, build.resolve("gpt2-tiny"), decoder=True)
    thread._prepare()
    gate = (thread.runner.gate_cell().batch, thread.runner.gate_cell().seq)
    warm = {k: g for k, (g, _, _) in thread.runner.gens.items() if k != gate}
    assert set(warm) == {(1, 8), (2, 8), (1, 16), (2, 16)}
    assert all(g.budgets == ([0] if untuned else []) for g in warm.values())
    tokens = []
    thread._generate([Job([1, 2, 3], lambda kind, value: tokens.append(kind), max_tokens=2)])  # a length not warmed
    assert tokens == ["token", "token", "done"]
    assert thread.runner.gens[(1, 3)][0].budgets == [0] and thread.runner.under_load == 1
