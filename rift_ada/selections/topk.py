"""Prefill-scored top-k (RIFT-stat; RIFT-dyn and RIFT-ada rescore it on refresh): the layer's prefill scorer
(`rift_ada.scorers.registry`: SnapKV, Expected Attention, CriticalKV, CurDKV, TriAttention) scores the stored
positions from the latest ``obs_window`` queries; the window is a share ``sw_ratio`` of the budget."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

from rift_ada.selections.scored import ScoredSelection

if TYPE_CHECKING:
    from rift_ada.cache import BudgetedLayer


@dataclasses.dataclass(frozen=True)
class PrefillTopK(ScoredSelection):
    """Top-k of the prefill scorer's scores, chosen after the prefill and again at every refresh."""

    kind = "snapkv"
    prefill_scored = True

    def scores(self, layer: BudgetedLayer, rows: slice, end: int) -> torch.Tensor:
        return layer.scorer.score(layer.score_inputs(rows, end))
