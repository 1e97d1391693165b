"""Top-k selection of positions per KV head, at token or block granularity.

Ties are broken by a fixed rule, the lowest position first among equal scores (a stable
descending sort), so a selection is the same on any device and with any top-k kernel. Exact
ties are common: max-pooling copies a peak to its neighbours.
"""

from __future__ import annotations

import torch

from rift_ada.scorers.block import block_order_topk


def topk_lowest_first(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the ``k`` largest scores along the last dim; equal scores: lowest index first."""
    return torch.argsort(scores, dim=-1, descending=True, stable=True)[..., :k]


def select_topk(scores: torch.Tensor, k: int, n_candidates: int, block_size: int | None = None) -> torch.Tensor:
    """Indices (b, kv, min(k, n_candidates)) of the best candidates among positions [0, n_candidates).

    Indices are returned sorted ascending (keeps original positions in order).
    """
    candidates = scores[..., :n_candidates]
    take = min(k, n_candidates)
    if block_size is not None and block_size > 1:
        chosen = block_order_topk(candidates, take, block_size)
    else:
        chosen = topk_lowest_first(candidates, take)
    return torch.sort(chosen, dim=-1).values
