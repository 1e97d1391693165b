"""SnapKV scores (Li et al., 2024, "SnapKV: LLM Knows What You are Looking for Before Generation")."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rift_ada.scorers.inputs import ScoreInputs


@dataclass
class SnapKVScorer:
    """Attention of the last ``obs_window`` queries to every earlier key, pooled per KV head.

    Steps: causal softmax of each window query over all keys up to its own position (an optional
    per-head sink logit joins the normaliser, as in GPT-OSS), sum over the window queries, mean over
    the query heads of each KV group (GQA), then a 1-D max-pool of width ``pool_kernel``.
    Queries must already carry their own RoPE positions (they are stored post-RoPE).
    """

    obs_window: int = 64
    pool_kernel: int = 7

    def attention_mass(
        self,
        queries: torch.Tensor,
        keys: torch.Tensor,
        query_positions: torch.Tensor,
        scaling: float,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """queries (b, h, w, d), keys (b, kv, n, d), query_positions (w,) -> the queries' causal
        attention summed over the queries, per query head: (b, kv, group, n); :meth:`pool` makes the
        scores.

        A query's attention row depends only on the keys up to its own position, so the mass of a
        window is the sum of the masses of any split of its queries (how the probe reuses it).
        """
        return self.attention_probs(queries, keys, query_positions, scaling, sinks).sum(dim=3)

    def attention_probs(
        self,
        queries: torch.Tensor,
        keys: torch.Tensor,
        query_positions: torch.Tensor,
        scaling: float,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`attention_mass` before the sum over the queries: (b, kv, group, w, n) float32 causal probabilities."""
        batch, n_heads, n_queries, head_dim = queries.shape
        n_kv = keys.shape[1]
        group = n_heads // n_kv
        grouped = queries.reshape(batch, n_kv, group, n_queries, head_dim).float()
        logits = torch.einsum("bkgqd,bknd->bkgqn", grouped, keys.float()).mul_(scaling)  # in place: no second copy
        # Only keys after the first window query can be in any window query's future: mask that
        # tail in place instead of building and applying a mask over all n keys.
        query_positions = query_positions.to(keys.device)
        start = max(0, int(query_positions.min()) + 1)
        if start < keys.shape[2]:
            tail_positions = torch.arange(start, keys.shape[2], device=keys.device)
            future = tail_positions[None, :] > query_positions[:, None]
            logits[..., start:].masked_fill_(future, float("-inf"))
        if sinks is not None:
            sink = sinks.float().reshape(1, n_kv, group, 1, 1).expand(batch, -1, -1, n_queries, 1)
            probs = torch.softmax(torch.cat([logits, sink], dim=-1), dim=-1)[..., :-1]
        else:
            probs = torch.softmax(logits, dim=-1)
        return probs

    def pool(self, mass: torch.Tensor) -> torch.Tensor:
        """(b, kv, group, n) attention mass -> scores (b, kv, n): mean over the group, then max-pool."""
        batch, n_kv = mass.shape[:2]
        summed = mass.mean(dim=2)  # (b, kv, n)
        if self.pool_kernel > 1:
            summed = F.max_pool1d(
                summed.reshape(batch * n_kv, 1, -1), self.pool_kernel, stride=1, padding=self.pool_kernel // 2
            ).reshape(batch, n_kv, -1)
        return summed

    def score(self, inputs: ScoreInputs) -> torch.Tensor:
        """(b, kv, n) scores from the layer's window mass (`attention_mass` of its query window)."""
        return self.pool(inputs.window_mass())
