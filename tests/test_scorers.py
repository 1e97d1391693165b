"""SnapKV and block scores against a from-scratch computation with explicit loops."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rift_ada.scorers import SnapKVScorer, block_order_topk, select_topk
from rift_ada.scorers.block import block_scores


def _reference_snapkv(queries, keys, query_positions, scaling, kernel):
    queries, keys = queries.double().numpy(), keys.double().numpy()
    batch, n_heads, n_queries, _ = queries.shape
    n_kv, n_keys = keys.shape[1], keys.shape[2]
    group = n_heads // n_kv
    out = np.zeros((batch, n_kv, n_keys))
    for b in range(batch):
        for head in range(n_heads):
            kv = head // group
            summed = np.zeros(n_keys)
            for qi in range(n_queries):
                position = int(query_positions[qi])
                logits = [float(queries[b, head, qi] @ keys[b, kv, j]) * scaling for j in range(position + 1)]
                top = max(logits)
                weights = [math.exp(x - top) for x in logits]
                total = sum(weights)
                for j, weight in enumerate(weights):
                    summed[j] += weight / total
            out[b, kv] += summed / group
    pooled = np.zeros_like(out)
    half = kernel // 2
    for j in range(n_keys):
        pooled[..., j] = out[..., max(0, j - half) : j + half + 1].max(-1)
    return pooled


@pytest.mark.parametrize("kernel", [1, 7])
def test_snapkv_scores_equal_from_scratch(kernel):
    generator = torch.Generator().manual_seed(0)
    queries = torch.randn(1, 4, 6, 8, generator=generator)
    keys = torch.randn(1, 2, 30, 8, generator=generator)
    positions = torch.arange(24, 30)
    scorer = SnapKVScorer(obs_window=6, pool_kernel=kernel)
    got = scorer.pool(scorer.attention_mass(queries, keys, positions, scaling=8**-0.5))
    expected = _reference_snapkv(queries, keys, positions, 8**-0.5, kernel)
    np.testing.assert_allclose(got.double().numpy(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("sinks", [None, torch.tensor([0.5, -1.0, 2.0, 0.0])])
def test_snapkv_window_mass_is_the_sum_of_its_blocks_masses(sinks):
    """The probe sums a window's mass from blocks scored when their queries arrived (fewer keys)."""
    generator = torch.Generator().manual_seed(1)
    queries = torch.randn(1, 4, 12, 8, generator=generator)
    keys = torch.randn(1, 2, 40, 8, generator=generator)
    positions = torch.arange(28, 40)
    scorer = SnapKVScorer(obs_window=12)

    def mass(part: slice, end: int) -> torch.Tensor:
        return scorer.attention_mass(queries[:, :, part], keys[:, :, :end], positions[part], 8**-0.5, sinks)

    whole = mass(slice(None), 40)
    summed = torch.zeros_like(whole)
    for first in range(0, 12, 4):  # each block against the keys stored when it arrived
        end = int(positions[first + 3]) + 1
        summed[..., :end] += mass(slice(first, first + 4), end)
    torch.testing.assert_close(summed, whole)
    assert not torch.allclose(summed - mass(slice(0, 4), 40), whole)  # every block counts


def test_topk_selects_best_candidates_sorted():
    scores = torch.tensor([[[0.1, 0.9, 0.3, 0.8, 0.05, 0.99, 0.7]]])
    chosen = select_topk(scores, k=3, n_candidates=5)
    assert chosen.tolist() == [[[1, 2, 3]]]  # position 5 is not a candidate


def test_block_scores_and_block_selection_from_scratch():
    generator = torch.Generator().manual_seed(1)
    scores = torch.rand(1, 3, 45, generator=generator)
    block = 8
    means = block_scores(scores, block)
    for head in range(3):
        for index in range(means.shape[-1]):
            chunk = scores[0, head, index * block : (index + 1) * block]
            assert math.isclose(float(means[0, head, index]), float(chunk.mean()), rel_tol=1e-6)
    k = 20
    chosen = block_order_topk(scores, k, block)
    for head in range(3):
        ranked = sorted(range(means.shape[-1]), key=lambda i: -float(means[0, head, i]))
        expected = []
        for index in ranked:
            members = sorted(
                range(index * block, min(45, (index + 1) * block)), key=lambda j: -float(scores[0, head, j])
            )
            expected.extend(members)
        assert sorted(chosen[0, head].tolist()) == sorted(expected[:k])


def test_block_selection_takes_whole_blocks():
    scores = torch.zeros(1, 1, 32)
    scores[0, 0, 8:16] = 1.0
    scores[0, 0, 24:32] = 0.5
    chosen = select_topk(scores, k=16, n_candidates=32, block_size=8)
    assert chosen[0, 0].tolist() == list(range(8, 16)) + list(range(24, 32))


def _reference_lowest_first(row: list[float], k: int) -> list[int]:
    """Best k positions by (score descending, position ascending), returned in position order."""
    return sorted(sorted(range(len(row)), key=lambda j: (-row[j], j))[:k])


def test_topk_ties_keep_the_lowest_positions():
    # Max-pooling copies peaks to their neighbours: long runs of exactly equal scores at the cut.
    generator = torch.Generator().manual_seed(3)
    levels = torch.tensor([0.0, 0.25, 0.5, 1.0])
    scores = levels[torch.randint(0, 4, (2, 3, 200), generator=generator)]
    for k in (1, 17, 64, 150):
        chosen = select_topk(scores, k=k, n_candidates=180)
        for b in range(2):
            for head in range(3):
                expected = _reference_lowest_first(scores[b, head, :180].tolist(), k)
                assert chosen[b, head].tolist() == expected
    flat = torch.ones(1, 1, 50)
    assert select_topk(flat, k=5, n_candidates=50).tolist() == [[[0, 1, 2, 3, 4]]]


def test_block_selection_ties_take_the_lower_block_first():
    scores = torch.ones(1, 1, 64)  # every block ties
    chosen = select_topk(scores, k=20, n_candidates=64, block_size=8)
    assert chosen.tolist() == [[list(range(20))]]
