"""H2O heavy-hitter scores (Zhang et al., 2023, "H2O: Heavy-Hitter Oracle for Efficient Generative Inference")."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class H2OScorer:
    """Accumulated attention each key has received from all queries so far, per KV head.

    ``prefill_scores`` computes the column sums of the causal prefill attention in query chunks
    (so memory stays O(chunk x n)); decode steps add their own attention with ``accumulate``.
    """

    chunk: int = 256

    def prefill_scores(
        self, queries: torch.Tensor, keys: torch.Tensor, scaling: float, sinks: torch.Tensor | None = None
    ) -> torch.Tensor:
        """queries (b, h, n, d) at positions 0..n-1, keys (b, kv, n, d) -> accumulated (b, kv, n)."""
        batch, n_heads, n_queries, head_dim = queries.shape
        n_kv = keys.shape[1]
        group = n_heads // n_kv
        grouped = queries.reshape(batch, n_kv, group, n_queries, head_dim).float()
        keys = keys.float()
        total = torch.zeros(batch, n_kv, keys.shape[2], device=keys.device)
        key_positions = torch.arange(keys.shape[2], device=keys.device)
        for start in range(0, n_queries, self.chunk):
            stop = min(n_queries, start + self.chunk)
            logits = torch.einsum("bkgqd,bknd->bkgqn", grouped[:, :, :, start:stop], keys) * scaling
            query_positions = torch.arange(start, stop, device=keys.device)
            logits = logits.masked_fill(key_positions[None, :] > query_positions[:, None], float("-inf"))
            if sinks is not None:
                sink = sinks.float().reshape(1, n_kv, group, 1, 1).expand(batch, -1, -1, stop - start, 1)
                probs = torch.softmax(torch.cat([logits, sink], dim=-1), dim=-1)[..., :-1]
            else:
                probs = torch.softmax(logits, dim=-1)
            total += probs.sum(dim=3).mean(dim=2)
        return total

    @staticmethod
    def accumulate(total: torch.Tensor, probs: torch.Tensor, key_index: torch.Tensor) -> None:
        """Add grouped probs (b, kv, g, q, L) received by keys at positions key_index (b, kv, L) in place."""
        total.scatter_add_(-1, key_index, probs.float().sum(dim=3).mean(dim=2))
