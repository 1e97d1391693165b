"""Scored selections: the k highest-scoring positions outside the window, per KV head (token or block top-k)."""

from __future__ import annotations

import dataclasses
from abc import abstractmethod
from typing import TYPE_CHECKING

import torch

from rift_ada.scorers.topk import select_topk
from rift_ada.selections.base import BudgetError, Selection, prefix_positions

if TYPE_CHECKING:
    from rift_ada.cache import BudgetedLayer


@dataclasses.dataclass(frozen=True)
class ScoredSelection(Selection):
    """Top-k of ``scores`` (blocks of ``block_size`` positions when set: `rift_ada.scorers.topk`), with a
    window of max(1, sw_ratio * B); while every candidate fits, the selection is all of them."""

    sw_ratio: float = 0.5
    obs_window: int = 64
    block_size: int | None = None

    @property
    def window(self) -> int:
        return max(1, int(self.sw_ratio * self.budget))

    def validate(self) -> None:
        if self.budget < self.obs_window:
            raise BudgetError(
                f"budget {self.budget} is smaller than the observation window obs_window={self.obs_window}: "
                "scored policies need B >= w"
            )

    @abstractmethod
    def scores(self, layer: BudgetedLayer, rows: slice, end: int) -> torch.Tensor:
        """(rows, kv, n >= end) scores of the stored positions (higher: kept)."""

    def select(self, layer: BudgetedLayer, rows: slice, end: int) -> torch.Tensor:
        if end <= layer.capacity:
            return prefix_positions(layer, end, rows)
        return select_topk(self.scores(layer, rows, end), layer.capacity, end, self.block_size)
