"""The selection interface: how a budget B splits into a window and a selection, and how the selection is chosen.

A selection object holds the hyperparameters it reads (dataclass fields, copied from a
`rift_ada.budget.CachePolicy` by `Selection.from_policy`) and no per-layer state: the tensors
(stored KV, query buffer, H2O's accumulated scores) live in the `rift_ada.cache.BudgetedLayer`
that calls it.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar, Self

import torch

if TYPE_CHECKING:
    from rift_ada.attention import PendingAttention
    from rift_ada.cache import BudgetedLayer


class BudgetError(ValueError):
    """A cache policy or budget that cannot work (names the field)."""


@dataclasses.dataclass(frozen=True)
class Selection(ABC):
    """Per KV head, a selection of at most ``selected`` positions plus a window of the ``window`` most recent
    ones (a query at position p sees the window (p - r, p]), so the working set is min(B, length) positions.

    Class flags say what the layer does for it: ``kind`` is `CachePolicy.selection`; ``full``: no budget
    (attend to everything); ``prefill_scored``: chosen by a prefill scorer and rescored on refresh;
    ``observes_attention``: reads every step's attention probabilities (`observe`); ``absorbs_prefix``:
    while unfilled, it keeps the positions that leave the window."""

    budget: int

    kind: ClassVar[str]
    full: ClassVar[bool] = False
    prefill_scored: ClassVar[bool] = False
    observes_attention: ClassVar[bool] = False
    absorbs_prefix: ClassVar[bool] = True

    @classmethod
    def from_policy(cls, policy: Any) -> Self:
        """The selection of ``policy`` (a `CachePolicy`): its fields of the same names."""
        return cls(**{field.name: getattr(policy, field.name) for field in dataclasses.fields(cls)})

    @property
    @abstractmethod
    def window(self) -> int:
        """r: positions of the sliding window (including the query itself)."""

    @property
    def selected(self) -> int:
        """k: positions chosen outside the window."""
        return self.budget - self.window

    def validate(self) -> None:  # noqa: B027 (an optional hook: most selections add no check)
        """Checks of this selection's own split (the policy's common fields are checked before); BudgetError."""

    @abstractmethod
    def select(self, layer: BudgetedLayer, rows: slice, end: int) -> torch.Tensor:
        """(rows, kv, m) sorted positions among [0, end) (those outside the window) for ``layer``'s ``rows``."""

    def on_prefill(self, layer: BudgetedLayer, query: torch.Tensor) -> None:  # noqa: B027 (optional hook)
        """Called once with the prefill's post-RoPE queries (b, h, n, d), before the first selection."""

    def observe(self, layer: BudgetedLayer, probs: torch.Tensor, pending: PendingAttention) -> None:  # noqa: B027
        """A decode forward's attention probabilities (b, kv, g, q, L) over ``pending``'s working set
        (only for ``observes_attention``)."""


def prefix_positions(layer: BudgetedLayer, end: int, rows: slice = slice(None)) -> torch.Tensor:
    """The first min(k, end) positions for every KV head of ``rows`` (an unfilled or prefix selection)."""
    batch, n_kv = layer.keys[rows].shape[:2]
    count = min(layer.capacity, end)
    return torch.arange(count, device=layer.keys.device).expand(batch, n_kv, count).contiguous()
