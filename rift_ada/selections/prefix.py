"""Prefix selections: the first k positions, fixed (full KV, a sliding window, StreamingLLM's attention sinks).

StreamingLLM: Xiao et al., 2024, "Efficient Streaming Language Models with Attention Sinks" (ICLR):
the first ``sinks`` tokens plus a window of B - sinks recent ones.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

from rift_ada.selections.base import BudgetError, Selection, prefix_positions

if TYPE_CHECKING:
    from rift_ada.cache import BudgetedLayer


@dataclasses.dataclass(frozen=True)
class PrefixSelection(Selection):
    """The first k positions (as they leave the window)."""

    kind = "prefix"

    def select(self, layer: BudgetedLayer, rows: slice, end: int) -> torch.Tensor:
        return prefix_positions(layer, end, rows)


@dataclasses.dataclass(frozen=True)
class FullKV(PrefixSelection):
    """No budget: every stored position (the target's cache, the ``full`` policy)."""

    full = True

    @property
    def window(self) -> int:
        return 0

    @property
    def selected(self) -> int:
        return 1 << 62


@dataclasses.dataclass(frozen=True)
class SlidingWindow(PrefixSelection):
    """The B most recent positions (``swa``; also the built-in sliding-window layers, B = their window)."""

    @property
    def window(self) -> int:
        return self.budget


@dataclasses.dataclass(frozen=True)
class AttentionSinks(PrefixSelection):
    """StreamingLLM: the first ``sinks`` positions plus a window of B - sinks."""

    sinks: int = 4

    @property
    def window(self) -> int:
        return self.budget - self.sinks

    def validate(self) -> None:
        if self.budget <= self.sinks:
            raise BudgetError(f"budget {self.budget} must exceed the {self.sinks} attention sinks")
