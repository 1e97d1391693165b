"""What a prefill scorer may read: one layer's stored KV, its latest queries and the model parts it needs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

import torch

from rift_ada.scorers.rope import RopeRotation


@dataclass
class ScoreInputs:
    """One scoring of one full-attention layer (batch rows ``b``, KV heads ``kv``, ``n`` stored positions).

    ``queries`` are the latest ``w`` queries as the attention saw them (post-RoPE), at
    ``query_positions``; ``next_position`` is where the next query lands (the stored length).
    ``selected`` is k, the positions the selection keeps among the ``candidates`` outside the window. ``window_mass``
    returns the SnapKV attention mass of the query window, (b, kv, group, n), computed (and, in
    the probe, reused block by block) by the layer.
    """

    keys: torch.Tensor  # (b, kv, n, d) post-RoPE
    values: torch.Tensor  # (b, kv, n, dv)
    queries: torch.Tensor  # (b, h, w, d) post-RoPE
    query_positions: torch.Tensor  # (w,)
    next_position: int
    scaling: float
    selected: int
    candidates: int  # positions [0, candidates) lie outside the window: the selection's choice
    window_mass: Callable[[], torch.Tensor]
    sinks: torch.Tensor | None = None  # GPT-OSS per-head sink logits
    rope: RopeRotation | None = None  # None: the layer has no rotary embedding (Nemotron-H)
    output_weight: torch.Tensor | None = None  # o_proj weight (hidden, h * dv)

    @cached_property
    def pre_rope_queries(self) -> torch.Tensor:
        """(b, h, w, d) float queries with their rotary embedding undone."""
        queries = self.queries.float()
        if self.rope is None:
            return queries
        return self.rope.rotate(queries, self.query_positions, inverse=True)

    @property
    def group(self) -> int:
        return self.queries.shape[1] // self.keys.shape[1]


class Scorer(Protocol):
    """A prefill scorer: per-KV-head scores of every stored position, higher = keep."""

    def score(self, inputs: ScoreInputs) -> torch.Tensor:
        """(b, kv, n) scores."""
        ...


def keep_first(scores: torch.Tensor, count: int) -> torch.Tensor:
    """``scores`` with its first ``count`` positions raised above every other (attention sinks kept)."""
    if count <= 0:
        return scores
    top = scores.amax(dim=-1, keepdim=True)
    scores = scores.clone()
    scores[..., :count] = (top + 1).expand(*scores.shape[:-1], min(count, scores.shape[-1]))
    return scores
