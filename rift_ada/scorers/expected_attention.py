"""Expected Attention scores (Devoto et al., 2025, "Expected Attention: KV Cache Compression by
Estimating Attention from Future Queries Distribution")."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rift_ada.scorers.inputs import ScoreInputs, keep_first


@dataclass
class ExpectedAttentionScorer:
    """Attention a Gaussian model of the future queries is expected to pay each key.

    From the pre-RoPE queries of the window (those at positions >= ``n_sink``): mean mu and
    covariance S per query head. With R the RoPE rotation averaged over the next
    ``n_future_positions`` positions, mu' = R mu and S' = R S R^T; for a key k (post-RoPE) the
    expected unnormalised attention is exp(s mu'.k + s^2 k^T S' k / 2) (s: the attention scaling),
    a softmax over the stored keys past the sinks, averaged over each KV group's query heads,
    then times (score + ``epsilon``) * ||v||_2 (``use_vnorm``). The first ``n_sink`` positions
    are always kept. Unlike kvpress, the statistics come from the layer's query window (the
    queries a rescoring has), not from every prompt query.
    """

    n_future_positions: int = 512
    n_sink: int = 4
    use_covariance: bool = True
    use_vnorm: bool = True
    epsilon: float = 0.0

    def query_statistics(self, inputs: ScoreInputs) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Mean (b, h, d) and covariance (b, h, d, d) of the window's pre-RoPE queries, moved to the future."""
        queries = inputs.pre_rope_queries
        keep = inputs.query_positions.to(queries.device) >= self.n_sink
        if bool(keep.any()):
            queries = queries[:, :, keep]
        mean = queries.mean(dim=2)
        covariance = None
        if self.use_covariance:
            centred = queries - mean[:, :, None]
            covariance = torch.einsum("bhqi,bhqj->bhij", centred, centred) / queries.shape[2]
        if inputs.rope is not None:
            future = torch.arange(inputs.next_position, inputs.next_position + self.n_future_positions)
            rotation = inputs.rope.mean_rotation(future, queries.shape[-1], queries.device)
            mean = mean @ rotation.T
            if covariance is not None:
                covariance = rotation @ covariance @ rotation.T
        return mean, covariance

    def score(self, inputs: ScoreInputs) -> torch.Tensor:
        keys = inputs.keys.float()
        batch, n_kv, n_keys, _ = keys.shape
        mean, covariance = self.query_statistics(inputs)
        group = inputs.group
        grouped_mean = mean.reshape(batch, n_kv, group, -1)
        logits = torch.einsum("bkgd,bknd->bkgn", grouped_mean, keys) * inputs.scaling
        if covariance is not None:
            grouped_cov = covariance.reshape(batch, n_kv, group, *covariance.shape[-2:])
            quadratic = torch.einsum("bknd,bkgde,bkne->bkgn", keys, grouped_cov, keys)
            logits = logits + quadratic * (inputs.scaling**2 / 2)
        start = min(self.n_sink, n_keys - 1)
        probs = torch.zeros_like(logits)
        probs[..., start:] = torch.softmax(logits[..., start:], dim=-1)
        scores = probs.mean(dim=2)
        if self.use_vnorm:
            scores = (scores + self.epsilon) * inputs.values.float().norm(dim=-1)
        return keep_first(scores, self.n_sink)
