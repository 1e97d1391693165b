"""Block-level selection for paged serving (RIFT, §4.1 "Block-Level RIFT-stat")."""

from __future__ import annotations

import torch


def block_scores(scores: torch.Tensor, block_size: int) -> torch.Tensor:
    """Mean score of each block of ``block_size`` contiguous positions (last block may be partial)."""
    n_positions = scores.shape[-1]
    n_blocks = -(-n_positions // block_size)
    padded = torch.nn.functional.pad(scores, (0, n_blocks * block_size - n_positions))
    sums = padded.reshape(*scores.shape[:-1], n_blocks, block_size).sum(-1)
    counts = torch.full((n_blocks,), float(block_size), device=scores.device)
    counts[-1] = n_positions - (n_blocks - 1) * block_size
    return sums / counts


def block_order_topk(scores: torch.Tensor, k: int, block_size: int) -> torch.Tensor:
    """Choose k positions by whole blocks in order of block score.

    Blocks are ranked by mean score (equal scores: the lower block first); their positions are taken
    block after block, so every chosen block is complete except possibly the last, which contributes
    its highest-scoring positions (equal scores: the lowest position first).
    """
    n_positions = scores.shape[-1]
    ranks_of_blocks = torch.argsort(
        torch.argsort(block_scores(scores, block_size), dim=-1, descending=True, stable=True), dim=-1
    )
    block_of_position = torch.arange(n_positions, device=scores.device) // block_size
    position_block_rank = ranks_of_blocks[..., block_of_position]
    by_score = torch.argsort(scores, dim=-1, descending=True, stable=True)
    rank_in_score_order = torch.gather(position_block_rank, -1, by_score)
    by_block = torch.argsort(rank_in_score_order, dim=-1, stable=True)
    order = torch.gather(by_score, -1, by_block)
    return order[..., :k]
