"""H2O heavy hitters (Zhang et al., 2023, "H2O: Heavy-Hitter Oracle for Efficient Generative Inference"):
every key accumulates the attention it receives (prefill and each decode step, `rift_ada.scorers.h2o`);
a position leaving the window competes with the selection, and the lowest-scoring one is evicted for good."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

from rift_ada.scorers.h2o import H2OScorer
from rift_ada.scorers.topk import topk_lowest_first
from rift_ada.selections.scored import ScoredSelection

if TYPE_CHECKING:
    from rift_ada.attention import PendingAttention
    from rift_ada.cache import BudgetedLayer


@dataclasses.dataclass(frozen=True)
class H2O(ScoredSelection):
    """Top-k of the accumulated attention (``layer.heavy_scores``, (b, kv, capacity)), updated every step."""

    kind = "h2o"
    observes_attention = True
    absorbs_prefix = False  # the selection grows by eviction, not as a prefix

    def scores(self, layer: BudgetedLayer, rows: slice, end: int) -> torch.Tensor:
        return layer.heavy_scores[rows, :, : layer.length]

    def on_prefill(self, layer: BudgetedLayer, query: torch.Tensor) -> None:
        batch, n_kv = query.shape[0], layer.keys.shape[1]
        layer.heavy_scores = torch.zeros(batch, n_kv, layer.keys.shape[2], device=query.device)
        layer.heavy_scores[:, :, : layer.length] = H2OScorer().prefill_scores(
            query, layer.stored_keys(), layer.scaling, layer.sinks
        )

    def observe(self, layer: BudgetedLayer, probs: torch.Tensor, pending: PendingAttention) -> None:
        """Credit the step's attention to the positions it landed on, then let the positions leaving the
        window compete with the heavy hitters; losers are gone for good."""
        H2OScorer.accumulate(layer.heavy_scores, probs, pending.key_positions)
        end = max(0, layer.length - layer.window + 1)
        start = max(0, pending.first_position - layer.window + 1)
        if end <= start:
            return
        selection = layer.selection
        leaving = torch.arange(start, end, device=layer.keys.device).expand(*selection.shape[:2], -1)
        candidates = torch.cat([selection, leaving], -1)
        if candidates.shape[-1] <= layer.capacity:
            layer.selection = candidates
            return
        scores = layer.heavy_scores.gather(2, candidates)
        keep = topk_lowest_first(scores, layer.capacity)
        layer.selection = torch.sort(candidates.gather(2, keep), dim=-1).values
