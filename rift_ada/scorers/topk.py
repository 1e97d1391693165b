"""Top-k selection of positions per KV head, at token or block granularity."""

from __future__ import annotations

import torch

from rift_ada.scorers.block import block_order_topk


def select_topk(scores: torch.Tensor, k: int, n_candidates: int, block_size: int | None = None) -> torch.Tensor:
    """Indices (b, kv, min(k, n_candidates)) of the best candidates among positions [0, n_candidates).

    Indices are returned sorted ascending (keeps original positions in order).
    """
    candidates = scores[..., :n_candidates]
    take = min(k, n_candidates)
    if block_size is not None and block_size > 1:
        chosen = block_order_topk(candidates, take, block_size)
    else:
        chosen = torch.topk(candidates, take, dim=-1, sorted=False).indices
    return torch.sort(chosen, dim=-1).values
