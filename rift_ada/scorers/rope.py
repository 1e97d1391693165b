"""A model's rotary embedding as a linear map of vectors at given positions (for scorers that move
queries to future positions or back to the pre-RoPE space)."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import torch


@dataclass
class RopeRotation:
    """``embedding`` (the model's ``*RotaryEmbedding`` module: positions -> cos, sin) applied with
    ``apply`` (the modeling file's ``apply_rotary_pos_emb``), so partial rotary (Qwen3.5), YaRN's
    attention scaling (GPT-OSS) and either channel layout are the model's own."""

    embedding: torch.nn.Module
    apply: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    layer_type: str | None = None  # Gemma3: one embedding serves several layer types (full / sliding)
    _mean_cache: dict[tuple[int, tuple[int, ...], str], torch.Tensor] = field(default_factory=dict, repr=False)

    @property
    def attention_scaling(self) -> float:
        prefix = "" if self.layer_type is None else f"{self.layer_type}_"
        return float(getattr(self.embedding, f"{prefix}attention_scaling", 1.0) or 1.0)

    def cos_sin(self, positions: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        extra = () if self.layer_type is None else (self.layer_type,)
        cos, sin = self.embedding(like, positions.to(like.device)[None], *extra)
        return cos.float(), sin.float()

    def rotate(self, vectors: torch.Tensor, positions: torch.Tensor, inverse: bool = False) -> torch.Tensor:
        """``vectors`` (b, h, n, d) rotated to ``positions`` (n,), or (``inverse``) back from them."""
        vectors = vectors.float()
        cos, sin = self.cos_sin(positions, vectors)
        if inverse:  # the rotation times s (YaRN's attention scaling): its inverse is R^T / s^2
            scale = self.attention_scaling**2
            cos, sin = cos / scale, -sin / scale
        rotated, _ = self.apply(vectors, vectors, cos, sin)
        return rotated

    def mean_rotation(self, positions: torch.Tensor, head_dim: int, device: torch.device) -> torch.Tensor:
        """(d, d) matrix M = mean over ``positions`` of R_p, so M @ x is x's average rotation."""
        key = (head_dim, tuple(int(p) for p in positions.tolist()), str(device))
        cached = self._mean_cache.get(key)
        if cached is not None:
            return cached
        basis = torch.eye(head_dim, device=device)[None, :, None, :].expand(1, head_dim, len(positions), head_dim)
        rotated = self.rotate(basis.contiguous(), positions.to(device))  # [0, i, p] = R_p e_i
        matrix = rotated.mean(2)[0].T.contiguous()  # column i = mean_p R_p e_i
        self._mean_cache.clear()  # one entry: every layer of a refresh asks for the same positions
        self._mean_cache[key] = matrix
        return matrix

    def pairs(self, head_dim: int, device: torch.device) -> torch.Tensor:
        """(d,) partner channel of each channel in its rotation plane (itself: not rotated)."""
        rotation = self.rotate(torch.eye(head_dim, device=device)[None, :, None, :], torch.tensor([1], device=device))
        mixing = rotation[0, :, 0, :].abs()  # [i, j]: how much e_i lands on channel j
        mixing.fill_diagonal_(0)
        partner = mixing.argmax(-1)
        unrotated = mixing.amax(-1) <= 1e-6
        return torch.where(unrotated, torch.arange(head_dim, device=device), partner)


def find_rope(model: torch.nn.Module, attention: torch.nn.Module) -> RopeRotation | None:
    """The rotary embedding ``attention`` (one attention module of ``model``) is given; None if it has none."""
    apply = getattr(sys.modules[type(attention).__module__], "apply_rotary_pos_emb", None)
    if apply is None:
        return None
    for module in model.modules():
        if type(module).__name__.endswith("RotaryEmbedding"):
            layer_type = None
            if "layer_type" in inspect.signature(module.forward).parameters:
                types = getattr(attention.config, "layer_types", None) or []
                index = getattr(attention, "layer_idx", None)
                layer_type = types[index] if index is not None and index < len(types) else "full_attention"
            return RopeRotation(module, apply, layer_type)
    return None
