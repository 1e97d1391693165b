"""The distillation objective: lambda_CE * CE(rollout tokens) + lambda_KD * T^2 * KL(teacher_T || student_T)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class LossWeights:
    """Paper J.2 defaults: (lambda_CE, lambda_KD) = (0.25, 0.75), T_KD = 2; ``skew_alpha`` None = plain KL."""

    ce: float = 0.25
    kd: float = 0.75
    temperature: float = 2.0
    skew_alpha: float | None = None

    def __post_init__(self) -> None:
        if self.ce < 0 or self.kd < 0 or self.ce + self.kd <= 0:
            raise ValueError(f"loss weights must be non-negative with a positive sum, got ce={self.ce} kd={self.kd}")
        if self.temperature <= 0:
            raise ValueError(f"KD temperature must be > 0, got {self.temperature}")
        if self.skew_alpha is not None and not 0.0 < self.skew_alpha <= 1.0:
            raise ValueError(f"skew alpha must be in (0, 1], got {self.skew_alpha}")


def kd_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Mean over positions of T^2 * KL(softmax(teacher / T) || softmax(student / T))."""
    student_log = F.log_softmax(student_logits.float() / temperature, dim=-1)
    teacher_log = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
    per_position = (teacher_log.exp() * (teacher_log - student_log)).sum(dim=-1)
    return per_position.mean() * temperature**2


def skewed_teacher(teacher_logits: torch.Tensor, student_logits: torch.Tensor, alpha: float) -> torch.Tensor:
    """Skewed-KL teacher (paper J.4): alpha * teacher + (1 - alpha) * student logits (student detached)."""
    return alpha * teacher_logits.float() + (1.0 - alpha) * student_logits.detach().float()


def distillation_loss(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, labels: torch.Tensor, weights: LossWeights
) -> dict[str, torch.Tensor]:
    """``total``, ``ce`` and ``kd`` over aligned positions: logits (N, V) predict ``labels`` (N,)."""
    teacher = teacher_logits
    if weights.skew_alpha is not None:
        teacher = skewed_teacher(teacher_logits, student_logits, weights.skew_alpha)
    ce = F.cross_entropy(student_logits.float(), labels)
    kd = kd_kl(student_logits, teacher, weights.temperature)
    return {"total": weights.ce * ce + weights.kd * kd, "ce": ce, "kd": kd}
