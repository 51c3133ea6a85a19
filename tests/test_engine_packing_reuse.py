"""A server under load pads a batch up to a captured graph rather than capture one (engine/packing.py
reuse_sizes): the sizes a call may then run, and the captured sizes the engine reads from its graph keys."""

from __future__ import annotations

import bisect

import pytest
from hypothesis import given
from hypothesis import strategies as st

from transbench.engine.packing import reuse_sizes, token_ladder

LADDER = token_ladder(32 * 512, 128, 1.25, 512)


@pytest.mark.parametrize("captured, n, runs", [
    ({1920, 4352}, 1000, 1920),      # under the smallest captured: pads up to it
    ({1920, 4352}, 1921, 4352),      # between two captured: the next captured
    ({1920, 4352}, 5000, None),      # above every captured: the ladder's own size (a capture)
    (set(), 1000, None),             # nothing captured: the whole ladder
    ({999}, 1000, None),             # a size not on the ladder is not one of its graphs
])
def test_a_call_runs_the_smallest_captured_size_that_holds_it(captured, n, runs):
    sizes = reuse_sizes(LADDER, captured)
    got = sizes[bisect.bisect_left(sizes, n)]
    assert got == (runs if runs is not None else LADDER[bisect.bisect_left(LADDER, n)])


@given(st.sets(st.sampled_from(LADDER)), st.integers(1, 32 * 512))
def test_every_call_still_has_a_size_and_never_a_smaller_one(captured, n):
    sizes = reuse_sizes(LADDER, captured)
    assert sizes == sorted(set(sizes)) and sizes[-1] == LADDER[-1] and set(sizes) <= set(LADDER)
    got = sizes[bisect.bisect_left(sizes, n)]
    assert got >= n and got >= LADDER[bisect.bisect_left(LADDER, n)]
    if any(c >= n for c in captured):
        assert got == min(c for c in captured if c >= n)


def test_the_engine_reads_its_captured_sizes_from_the_forward_keys():
    from types import SimpleNamespace

    from transbench.engine.base import EngineBase

    fake = SimpleNamespace(graphs=SimpleNamespace(entries={("fwd", 32, 512, False, 1792, False, True, True): 0,
                                                           ("fwd", 32, 512, True, 16384, False, True, True): 0,
                                                           ("fwd", 16, 512, False, 896, False, True, True): 0,
                                                           ("dec", 32, 512, False, 2048): 0}))
    assert EngineBase.captured_sizes(fake, 32, 512) == {1792}


def test_the_sizes_are_worked_out_again_only_when_the_graphs_change():
    from types import SimpleNamespace

    from transbench.engine.base import EngineBase

    key = ("fwd", 32, 512, False, 1920, False, True, True)
    fake = SimpleNamespace(graphs=SimpleNamespace(entries={key: 0}, captures=1), _reused={})
    fake.captured_sizes = lambda B, S: EngineBase.captured_sizes(fake, B, S)
    first = EngineBase._reuse(fake, 32, 512, LADDER)
    assert first[0] == 1920 and EngineBase._reuse(fake, 32, 512, LADDER) is first  # no change: the same list
    fake.graphs.entries[key[:4] + (1536,) + key[5:]] = 0  # a capture under load
    fake.graphs.captures = 2
    assert EngineBase._reuse(fake, 32, 512, LADDER)[:2] == [1536, 1920]
