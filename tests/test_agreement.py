"""Task agreement (measure/agreement.py) on hand-built outputs whose agreement is known, and its properties."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from transbench.measure import agreement


def at_angles(*degrees):
    """Unit sentence embeddings in the plane, at these angles: every pair's cosine is known."""
    return torch.tensor([[math.cos(math.radians(a)), math.sin(math.radians(a))] for a in degrees])


# --- argmax agreement ------------------------------------------------------------------------------------

def test_argmax_agreement_is_the_share_of_equal_predictions():
    ref = torch.tensor([[0.1, 2.0, 0.3], [5.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 3.0, 2.0]])
    out = torch.tensor([[0.0, 1.0, 0.5], [0.0, 1.0, 0.5], [0.1, 0.0, 0.9], [0.0, 2.0, 1.0]])  # row 1 changed
    assert agreement.argmax_agreement(out, ref) == 0.75
    assert agreement.argmax_agreement(torch.tensor([1, 0, 2, 2]), ref) == 0.75  # labels are taken as they are
    assert agreement.of_labels(out, ref) == {"argmax_agreement": 0.75, "task_agreement": 0.75}


def test_argmax_agreement_of_nothing_is_none_and_of_other_shapes_an_error():
    assert agreement.argmax_agreement(torch.empty(0, 5), torch.empty(0, 5)) is None
    with pytest.raises(ValueError, match="shape"):
        agreement.argmax_agreement(torch.zeros(3, 4), torch.zeros(2, 4))


# --- sentence embeddings ---------------------------------------------------------------------------------

def test_sentence_embeddings_are_the_mean_over_real_tokens():
    hidden = torch.tensor([[[1.0, 0.0], [3.0, 2.0], [100.0, 100.0]], [[2.0, 2.0], [4.0, 0.0], [0.0, 4.0]]])
    keep = torch.tensor([[1, 1, 0], [1, 1, 1]])
    got = agreement.sentence_embeddings(hidden, keep)
    assert got.dtype == torch.float64 and torch.allclose(got, torch.tensor([[2.0, 1.0], [2.0, 2.0]], dtype=torch.float64))
    assert torch.allclose(agreement.sentence_embeddings(hidden[1:]), got[1:])  # no mask: every token


def test_spearman_of_a_known_reordering():
    """Three sentences, three pairs: fp32's cosines rank (0,1) > (1,2) > (0,2); moving sentence 1 from 30 to 80
    degrees ranks them (1,2) > (0,1) > (0,2). Rank differences 1, 0, -1: rho = 1 - 6 * 2 / (3 * (9 - 1)) = 0.5."""
    ref, out = at_angles(0, 30, 100), at_angles(0, 80, 100)
    assert agreement.similarity_spearman(out, ref) == pytest.approx(0.5)
    assert agreement.similarity_spearman(ref, ref) == pytest.approx(1.0)


def test_spearman_gives_ties_their_mean_rank():
    # fp32's cosines, pairs (0,1), (0,2), (1,2): 0, 1/sqrt 2, 1/sqrt 2 (exactly equal): ranks 1, 2.5, 2.5
    ref = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    out = at_angles(0, 80, 30)  # cosines cos 80, cos 30, cos 50: ranks 1, 3, 2
    want = torch.tensor([1.0, 2.5, 2.5]) - 2
    got = torch.tensor([1.0, 3.0, 2.0]) - 2
    assert agreement.similarity_spearman(out, ref) == pytest.approx(float(want @ got / (want.norm() * got.norm())))


def test_neighbours_count_the_sentences_whose_nearest_one_is_kept():
    ref = at_angles(0, 10, 90, 100)  # pairs: 0-1 and 2-3
    out = at_angles(0, 10, 90, 180)  # 3 now lies nearest 0; 0, 1 and 2 keep theirs
    assert agreement.neighbour_agreement(out, ref) == 0.75
    assert agreement.of_embeddings(out, ref)["task_agreement"] == 0.75


def test_a_tie_in_fp32_lets_either_neighbour_count():
    ref = at_angles(0, 40, 40, 300)  # sentence 0's nearest: 1 and 2, the same sentence given twice
    out = at_angles(0, 39, 41, 300)  # 0 now picks 1, which is as near as 2 in fp32
    assert agreement.neighbour_agreement(out, ref) == 1.0


def test_too_few_sentences_or_no_order_to_keep_is_none():
    two = at_angles(0, 90)
    assert agreement.similarity_spearman(two, two) is None and agreement.neighbour_agreement(two, two) is None
    even = torch.eye(3)  # every pair at cosine 0: nothing to rank
    assert agreement.similarity_spearman(torch.rand(3, 3) + 0.1, even) is None
    ordered = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [0.0, 1.0, 3.0]])
    assert agreement.similarity_spearman(even, ordered) == 0.0  # fp32's order, all lost
    with pytest.raises(ValueError, match="shape"):
        agreement.similarity_spearman(torch.zeros(4, 2), torch.zeros(4, 3))


def test_a_non_finite_output_agrees_on_nothing():
    ref = at_angles(0, 10, 90, 100)
    out = ref.clone()
    out[2, 0] = float("nan")
    assert agreement.similarity_spearman(out, ref) == 0.0 and agreement.neighbour_agreement(out, ref) == 0.0


def test_shortfall_names_the_first_measure_under_its_target():
    assert agreement.shortfall({"argmax_agreement": 0.995, "task_agreement": 0.995}) is None
    assert agreement.shortfall({"similarity_spearman": 0.9548, "neighbour_agreement": 1.0}) == \
        "similarity_spearman 0.9548 under its target 0.99"
    assert agreement.shortfall({"similarity_spearman": None, "neighbour_agreement": 0.95}) == \
        "neighbour_agreement 95.0% under its target 98%"
    assert agreement.shortfall({"argmax_agreement": float("nan")}) is not None
    assert agreement.shortfall({}) is None


# --- properties ------------------------------------------------------------------------------------------

sentences = st.integers(min_value=3, max_value=12)
widths = st.integers(min_value=2, max_value=8)


@st.composite
def embeddings(draw, n: int | None = None, w: int | None = None):
    """Sentence embeddings of small whole numbers (exact cosines), none of them zero."""
    n, w = n or draw(sentences), w or draw(widths)
    values = draw(st.lists(st.integers(min_value=-8, max_value=8), min_size=n * w, max_size=n * w))
    emb = torch.tensor(values, dtype=torch.float64).reshape(n, w)
    emb[:, 0] += (emb.norm(dim=1) == 0).double()
    return emb


@st.composite
def two_sets(draw):
    n, w = draw(sentences), draw(widths)
    return draw(embeddings(n, w)), draw(embeddings(n, w))


@settings(max_examples=60, deadline=None)
@given(emb=embeddings(), powers=st.lists(st.integers(min_value=-4, max_value=4), min_size=12, max_size=12))
def test_identical_answers_agree_fully_at_any_scale_of_each_sentence(emb, powers):
    """Cosines do not see a sentence's length: scaled by powers of two (exact in floating point), nothing moves."""
    scaled = emb * torch.tensor([2.0 ** p for p in powers[: len(emb)]], dtype=torch.float64)[:, None]
    for out in (emb, scaled):
        assert agreement.neighbour_agreement(out, emb) == 1.0
        rho = agreement.similarity_spearman(out, emb)
        assert rho is None or rho == pytest.approx(1.0)


@settings(max_examples=60, deadline=None)
@given(pair=two_sets())
def test_the_measures_stay_in_their_ranges(pair):
    a, b = pair
    share = agreement.neighbour_agreement(a, b)
    assert 0.0 <= share <= 1.0 and share * len(a) == pytest.approx(round(share * len(a)))
    rho = agreement.similarity_spearman(a, b)
    assert rho is None or -1.0 - 1e-12 <= rho <= 1.0 + 1e-12


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.integers(min_value=-20, max_value=20), min_size=4, max_size=60),
       power=st.integers(min_value=-3, max_value=3), shift=st.integers(min_value=-50, max_value=50))
def test_argmax_agreement_ignores_a_positive_scale_and_a_shift_of_the_logits(values, power, shift):
    logits = torch.tensor(values[: len(values) // 4 * 4], dtype=torch.float64).reshape(-1, 4)
    assert agreement.argmax_agreement(logits * 2.0 ** power + shift, logits) == 1.0
    flipped = agreement.argmax_agreement(-logits, logits)
    assert 0.0 <= flipped <= 1.0
