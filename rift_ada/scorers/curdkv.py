"""CurDKV leverage scores (Sengupta et al., 2025, "Value-Guided KV Compression for LLMs via
Approximated CUR Decomposition")."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rift_ada.scorers.inputs import ScoreInputs, keep_first

LEVERAGE_TYPES = ("key", "value", "kv_avg", "kv_product")


@dataclass
class CurDKVScorer:
    """Approximate row leverage of each position's key and value: no queries needed.

    k2 = ||k||^2 and v2 = ||v||^2 per position (with ``random_rank`` > 0, of k G and v G for a
    seeded Gaussian G of that many columns, scaled 1/sqrt(rank)); with ``local_window`` > 0 each
    is normalised to sum 1 within consecutive windows of that many positions; combined by
    ``leverage_type`` (default the product), normalised to sum 1 per head. The first
    ``n_sink`` positions are always kept.
    """

    leverage_type: str = "kv_product"
    local_window: int = 16
    random_rank: int = 0
    seed: int = 0
    n_sink: int = 4

    def __post_init__(self) -> None:
        if self.leverage_type not in LEVERAGE_TYPES:
            raise ValueError(f"leverage_type must be one of {', '.join(LEVERAGE_TYPES)}, got {self.leverage_type!r}")

    def _local(self, squared: torch.Tensor) -> torch.Tensor:
        window = self.local_window
        if window <= 0:
            return squared
        n = squared.shape[-1]
        padded = torch.nn.functional.pad(squared, (0, (-n) % window)).reshape(*squared.shape[:-1], -1, window)
        normalised = padded / padded.sum(-1, keepdim=True).clamp_min(torch.finfo(squared.dtype).tiny)
        return normalised.reshape(*squared.shape[:-1], -1)[..., :n]

    def score(self, inputs: ScoreInputs) -> torch.Tensor:
        keys, values = inputs.keys.float(), inputs.values.float()
        if self.random_rank > 0:
            generator = torch.Generator().manual_seed(self.seed)
            key_map = torch.randn(keys.shape[-1], self.random_rank, generator=generator) / self.random_rank**0.5
            value_map = torch.randn(values.shape[-1], self.random_rank, generator=generator) / self.random_rank**0.5
            keys, values = keys @ key_map.to(keys.device), values @ value_map.to(values.device)
        k2 = self._local(keys.square().sum(-1))
        v2 = self._local(values.square().sum(-1))
        scores = {"key": k2, "value": v2, "kv_avg": (k2 + v2) / 2, "kv_product": k2 * v2}[self.leverage_type]
        scores = scores / scores.sum(-1, keepdim=True).clamp_min(torch.finfo(scores.dtype).tiny)
        return keep_first(scores, self.n_sink)
