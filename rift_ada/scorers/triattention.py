"""TriAttention scores (Mao et al., 2026, "TriAttention: Efficient Long Reasoning with Trigonometric KV
Compression")."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rift_ada.scorers.inputs import ScoreInputs


@dataclass
class TriAttentionScorer:
    """Key importance from the pre-RoPE query centre and Q/K norms, no attention matrix needed.

    Pre-RoPE queries concentrate around a centre c (per query head; here the mean of the layer's
    query window). Split into RoPE's rotation planes f, the logit of a future query at offset
    Delta from a key is about sum_f |c_f| |k_f| cos(omega_f Delta + phase), a trigonometric series
    in the distance: its value, averaged over the offsets 1, 2, 4, ..., 2^``max_offset_log2``, is
    s (R c) . k with R the RoPE rotation averaged over those future positions and k the stored
    (post-RoPE) key. The part of the queries off the centre adds the norm term
    s sum_f (E|q_f| - |E q_f|) |k_f|. Per query head the score is their sum; with ``normalize``
    each head's scores are standardised over the positions before the mean over its KV group.
    Without RoPE (Nemotron-H) R is the identity and every channel is its own plane.

    Our reading of the paper's method (its text is not in this repository): the query centre is
    re-estimated from the latest queries at every rescoring instead of calibrated offline.
    """

    max_offset_log2: int = 16
    normalize: bool = True

    def offsets(self) -> torch.Tensor:
        return 2 ** torch.arange(self.max_offset_log2 + 1)

    def head_scores(self, inputs: ScoreInputs) -> torch.Tensor:
        """(b, h, n) trigonometric-series plus norm score of every stored key, per query head."""
        queries = inputs.pre_rope_queries
        keys = inputs.keys.float()
        batch, n_kv, n_keys, head_dim = keys.shape
        group = inputs.group
        centre = queries.mean(dim=2)  # (b, h, d)
        if inputs.rope is not None:
            future = inputs.next_position - 1 + self.offsets()
            centre_future = centre @ inputs.rope.mean_rotation(future, head_dim, queries.device).T
            partner = inputs.rope.pairs(head_dim, queries.device)
        else:
            centre_future = centre
            partner = torch.arange(head_dim, device=queries.device)
        grouped = centre_future.reshape(batch, n_kv, group, head_dim)
        trig = torch.einsum("bkgd,bknd->bkgn", grouped, keys)
        rotated = partner != torch.arange(head_dim, device=queries.device)
        weight = torch.where(rotated, 0.5, 1.0)  # a plane of two channels is counted from both

        def plane_norms(x: torch.Tensor) -> torch.Tensor:
            return (x.square() + x[..., partner].square() * rotated).sqrt()

        spread = plane_norms(queries).mean(dim=2) - plane_norms(centre)  # E|q_f| - |E q_f|, (b, h, d)
        spread = (spread * weight).reshape(batch, n_kv, group, head_dim)
        norm = torch.einsum("bkgd,bknd->bkgn", spread, plane_norms(keys))
        return ((trig + norm) * inputs.scaling).reshape(batch, n_kv * group, n_keys)

    def score(self, inputs: ScoreInputs) -> torch.Tensor:
        scores = self.head_scores(inputs)
        batch, n_heads, n_keys = scores.shape
        if self.normalize and n_keys > 1:
            scores = (scores - scores.mean(-1, keepdim=True)) / scores.std(-1, keepdim=True).clamp_min(1e-12)
        n_kv = inputs.keys.shape[1]
        return scores.reshape(batch, n_kv, n_heads // n_kv, n_keys).mean(dim=2)
