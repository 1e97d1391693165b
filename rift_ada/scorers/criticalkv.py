"""CriticalKV scores (Feng et al., 2026, "Identify Critical KV Cache in LLM Inference from an Output
Perturbation Perspective")."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rift_ada.scorers.inputs import ScoreInputs
from rift_ada.scorers.snapkv import SnapKVScorer


@dataclass
class CriticalKVScorer:
    """Attention scores reweighted by how much each value can move the layer's output.

    Stage 1 keeps the ``first_stage_ratio`` share of the k selected positions with the best
    ``base`` (SnapKV) scores among the candidates (outside the window). Stage 2 scores every
    position by (score + ``epsilon``) times ||v W_o^h||_1, the L1 norm of its value through query
    head h's slice of the output projection, averaged over each KV group's query heads; the
    stage-1 positions are raised above all others. The base score is the window's attention mass
    divided by its number of queries (a mean attention weight, as in kvpress), which sets the
    scale ``epsilon`` acts on. Without an output projection
    (``inputs.output_weight`` None) stage 2 uses ||v||_1.
    """

    base: SnapKVScorer = field(default_factory=SnapKVScorer)
    epsilon: float = 1e-4
    first_stage_ratio: float = 0.5
    # the values and norms of the last scoring: stored positions keep their values between
    # refreshes, so only the positions whose values changed (new, or rewritten after a rollback)
    # are projected again
    _kept: tuple[torch.Tensor, torch.Tensor] | None = field(default=None, init=False, repr=False, compare=False)

    def _norms(self, values: torch.Tensor, output_weight: torch.Tensor | None, group: int) -> torch.Tensor:
        kept = self._kept
        start = 0
        if kept is not None and kept[0].shape[:2] == values.shape[:2] and kept[0].device == values.device:
            common = min(kept[0].shape[2], values.shape[2])
            same = (kept[0][:, :, :common] == values[:, :, :common]).all(-1).all(1).all(0)  # (common,)
            start = common if bool(same.all()) else int(torch.argmin(same.int()))
        if start == 0:
            norms = self.projected_norm(values, output_weight, group)
        else:
            fresh = self.projected_norm(values[:, :, start:], output_weight, group)
            norms = torch.cat([kept[1][:, :, :start], fresh], 2)
        self._kept = (values.clone(), norms)
        return norms

    @staticmethod
    def projected_norm(values: torch.Tensor, output_weight: torch.Tensor | None, group: int) -> torch.Tensor:
        """(b, kv, n, dv) values -> (b, kv, n): mean over each group's heads of ||v W_o^h||_1."""
        values = values.float()
        if output_weight is None:
            return values.abs().sum(-1)
        batch, n_kv, n_keys, value_dim = values.shape
        per_head = output_weight.float().T.reshape(n_kv, group, value_dim, -1)  # (kv, g, dv, hidden)
        total = values.new_zeros(batch, n_kv, n_keys)
        for member in range(group):  # one query head of every group at a time: O(b kv n hidden) memory
            projected = torch.einsum("bknd,kdh->bknh", values, per_head[:, member])
            total += projected.abs().sum(-1)
        return total / group

    def score(self, inputs: ScoreInputs) -> torch.Tensor:
        scores = self.base.score(inputs) / inputs.queries.shape[2]  # the window's mean attention: epsilon's scale
        first = int(inputs.selected * self.first_stage_ratio)
        reweighted = (scores + self.epsilon) * self._norms(inputs.values, inputs.output_weight, inputs.group)
        if first > 0:
            top = torch.argsort(scores[..., : inputs.candidates], dim=-1, descending=True, stable=True)[..., :first]
            raised = reweighted.amax(-1, keepdim=True) + 1
            reweighted = reweighted.scatter(-1, top, raised.expand(*top.shape[:-1], top.shape[-1]))
        return reweighted
