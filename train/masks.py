"""Compression-driven training masks: which keys each query of a training sample may attend to.

For query position t (keys 0..t visible causally, n = t + 1 of them) of a masked sample:

* ``n_masked = floor(p * n)`` keys are hidden, ``keep = n - n_masked`` stay visible;
* the sliding window keeps the ``r = max(1, floor(rho * keep))`` most recent keys (t - r + 1 .. t);
* the other ``keep - r`` visible keys are the highest-scoring of 0 .. t - r (``scores[t, j]``;
  ties go to the earlier position).

Queries before ``first_masked`` (the prompt: dense prefill at inference) see plain causal attention.
Controls: ``random`` (same counts, scores drawn uniformly at random), ``window`` (the ``keep`` most
recent keys only) and ``none`` (plain causal). See docs/training.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

MASK_KINDS = ("attention", "random", "window", "none")
PAPER_P_VALUES = (0.1, 0.3, 0.5, 0.7, 0.9)
PAPER_P_PROBS = (0.05, 0.10, 0.20, 0.25, 0.40)
_EPS = 1e-9  # floor(p * n) must not lose a whole key to rounding (0.7 * 10 = 6.999...)


def visible_counts(n_keys: torch.Tensor, p: float, rho: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(keep, window) per query for ``n_keys`` causal keys, masked fraction ``p``, window share ``rho``."""
    n = n_keys.to(torch.float64)
    keep = n_keys - torch.floor(p * n + _EPS).to(n_keys.dtype)
    keep = keep.clamp(min=1)
    window = torch.floor(rho * keep.to(torch.float64) + _EPS).to(n_keys.dtype).clamp(min=1)
    return keep, torch.minimum(window, keep)


def compression_mask(scores: torch.Tensor, p: float, rho: float, first_masked: int = 0) -> torch.Tensor:
    """Visibility (L, L), True = attend, for one sample's score matrix ``scores`` (L queries x L keys)."""
    length = scores.shape[-1]
    if scores.shape != (length, length):
        raise ValueError(f"scores must be a square (L, L) matrix, got {tuple(scores.shape)}")
    if not 0.0 <= p < 1.0:
        raise ValueError(f"p (masked fraction) must be in [0, 1), got {p}")
    if not 0.0 < rho <= 1.0:
        raise ValueError(f"rho (sliding-window share) must be in (0, 1], got {rho}")
    device = scores.device
    query = torch.arange(length, device=device)[:, None]
    key = torch.arange(length, device=device)[None, :]
    causal = key <= query
    keep, window = visible_counts(query[:, 0] + 1, p, rho)
    in_window = causal & (key > query - window[:, None])
    candidates = causal & ~in_window
    ranked = scores.to(torch.float64).masked_fill(~candidates, float("-inf"))
    order = torch.sort(-ranked, dim=-1, stable=True).indices  # best first; equal scores: earlier first
    rank = torch.empty_like(order)
    rank.scatter_(-1, order, torch.arange(length, device=device).expand(length, -1).contiguous())
    selected = candidates & (rank < (keep - window)[:, None])
    visible = in_window | selected
    dense_rows = query[:, 0] < first_masked
    return torch.where(dense_rows[:, None], causal, visible)


def window_mask(length: int, p: float, first_masked: int = 0, device: torch.device | str = "cpu") -> torch.Tensor:
    """Sliding-window control: each masked query sees only its ``keep`` most recent keys."""
    return compression_mask(torch.zeros(length, length, device=device), p, 1.0, first_masked)


def sample_p(
    generator: torch.Generator, values: Sequence[float] = PAPER_P_VALUES, probs: Sequence[float] = PAPER_P_PROBS
) -> float:
    """One masked fraction p drawn from the categorical distribution (``values``, ``probs``)."""
    if len(values) != len(probs) or not values:
        raise ValueError(f"p values {list(values)} and probabilities {list(probs)} must pair up")
    weights = torch.tensor(probs, dtype=torch.float64)
    if (weights < 0).any() or float(weights.sum()) <= 0:
        raise ValueError(f"p probabilities must be non-negative with a positive sum, got {list(probs)}")
    return float(values[int(torch.multinomial(weights, 1, generator=generator))])


def sample_mask(
    kind: str,
    scores: torch.Tensor | None,
    length: int,
    p: float,
    rho: float,
    first_masked: int,
    generator: torch.Generator,
) -> torch.Tensor | None:
    """The training mask of one sample (None for ``none``); ``scores`` is needed for ``attention``."""
    if kind == "none":
        return None
    if kind == "attention":
        if scores is None:
            raise ValueError("attention masks need the dense pass's scores")
        return compression_mask(scores, p, rho, first_masked)
    if kind == "random":
        noise = torch.rand(length, length, generator=generator, dtype=torch.float64)
        return compression_mask(noise, p, rho, first_masked)
    if kind == "window":
        return window_mask(length, p, first_masked)
    raise ValueError(f"mask kind must be one of {', '.join(MASK_KINDS)}, got {kind!r}")


def windowed_scores(scores: torch.Tensor, window: int) -> torch.Tensor:
    """Row t becomes the sum of rows t - window + 1 .. t (SnapKV-style observation window per query)."""
    if window < 1:
        raise ValueError(f"score window must be >= 1, got {window}")
    if window == 1:
        return scores
    total = scores.to(torch.float64).cumsum(dim=-2)
    shifted = torch.zeros_like(total)
    shifted[..., window:, :] = total[..., :-window, :]
    return (total - shifted).to(scores.dtype)
