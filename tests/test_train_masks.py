"""Compression-driven training masks, checked against a from-scratch per-query computation."""

from __future__ import annotations

import math

import pytest
import torch

from rift_ada.train.masks import (
    PAPER_P_PROBS,
    PAPER_P_VALUES,
    compression_mask,
    sample_mask,
    sample_p,
    window_mask,
    windowed_scores,
)


def _expected_visible(scores: list[list[float]], t: int, p: float, rho: float, first_masked: int) -> set[int]:
    """Keys query t sees, computed directly from the definition in docs/training.md."""
    n = t + 1
    if t < first_masked:
        return set(range(n))
    keep = max(1, n - math.floor(p * n + 1e-9))
    window = min(keep, max(1, math.floor(rho * keep + 1e-9)))
    recent = set(range(t - window + 1, t + 1))
    older = sorted(range(0, t - window + 1), key=lambda j: (-scores[t][j], j))
    return recent | set(older[: keep - window])


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5, 0.7, 0.9, 0.0])
@pytest.mark.parametrize("rho", [0.25, 0.5, 1.0])
@pytest.mark.parametrize("first_masked", [0, 7])
def test_attention_mask_matches_from_scratch_computation(p, rho, first_masked):
    length = 23
    generator = torch.Generator().manual_seed(int(p * 100) + int(rho * 10) + first_masked)
    # Integer scores make ties common, so the tie rule (earlier position first) is exercised too.
    scores = torch.randint(0, 4, (length, length), generator=generator).float()
    mask = compression_mask(scores, p, rho, first_masked)
    rows = scores.tolist()
    for t in range(length):
        visible = set(torch.nonzero(mask[t]).flatten().tolist())
        assert visible == _expected_visible(rows, t, p, rho, first_masked), (t, p, rho)


def test_mask_is_causal_keeps_the_window_and_hides_a_fraction_p():
    length, p, rho = 64, 0.7, 0.25
    scores = torch.rand(length, length, generator=torch.Generator().manual_seed(3))
    mask = compression_mask(scores, p, rho)
    assert not torch.triu(mask, diagonal=1).any()  # causal
    for t in range(length):
        n = t + 1
        keep = max(1, n - math.floor(p * n + 1e-9))
        window = max(1, math.floor(rho * keep + 1e-9))
        assert int(mask[t].sum()) == keep
        assert mask[t, t - window + 1 : t + 1].all()  # the sliding window is always visible


def test_highest_scoring_older_keys_are_the_ones_kept():
    length = 10
    scores = torch.zeros(length, length)
    scores[:, 2] = 5.0  # one key every query loves
    scores[:, 5] = 3.0
    mask = compression_mask(scores, p=0.5, rho=0.5)
    # Query 9: n = 10, keep = 5, window = 2 (keys 8, 9), selected = 3 best of 0..7: 2, 5, then 0 (tie -> earliest).
    assert torch.nonzero(mask[9]).flatten().tolist() == [0, 2, 5, 8, 9]


def test_controls_window_random_and_none():
    length, p = 30, 0.5
    window = window_mask(length, p)
    for t in range(length):
        keep = max(1, (t + 1) - math.floor(p * (t + 1) + 1e-9))
        assert torch.nonzero(window[t]).flatten().tolist() == list(range(t - keep + 1, t + 1))
    generator = torch.Generator().manual_seed(0)
    random_mask = sample_mask("random", None, length, p, 0.25, 0, generator)
    assert not torch.triu(random_mask, diagonal=1).any()
    assert random_mask.sum(dim=1).tolist() == window.sum(dim=1).tolist()  # same counts, other positions
    assert not torch.equal(random_mask, window)
    assert sample_mask("none", None, length, p, 0.25, 0, generator) is None
    with pytest.raises(ValueError, match="scores"):
        sample_mask("attention", None, length, p, 0.25, 0, generator)
    with pytest.raises(ValueError, match="mask kind"):
        sample_mask("bogus", None, length, p, 0.25, 0, generator)


def test_bad_p_and_rho_are_refused():
    scores = torch.zeros(4, 4)
    with pytest.raises(ValueError, match="p "):
        compression_mask(scores, 1.0, 0.25)
    with pytest.raises(ValueError, match="rho"):
        compression_mask(scores, 0.5, 0.0)
    with pytest.raises(ValueError, match="square"):
        compression_mask(torch.zeros(3, 4), 0.5, 0.25)


def test_p_follows_the_paper_categorical_distribution():
    generator = torch.Generator().manual_seed(0)
    draws = [sample_p(generator) for _ in range(4000)]
    for value, prob in zip(PAPER_P_VALUES, PAPER_P_PROBS, strict=True):
        share = draws.count(value) / len(draws)
        assert abs(share - prob) < 0.03, (value, share, prob)


def test_windowed_scores_sum_the_last_queries():
    scores = torch.rand(12, 12, generator=torch.Generator().manual_seed(1))
    summed = windowed_scores(scores, 4)
    for t in range(12):
        expected = scores[max(0, t - 3) : t + 1].sum(dim=0)
        torch.testing.assert_close(summed[t], expected)
    assert windowed_scores(scores, 1) is scores
