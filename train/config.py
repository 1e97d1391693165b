"""Settings of a compressibility-training run (every field is a `rift-ada train` flag)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from rift_ada.train.losses import LossWeights
from rift_ada.train.masks import MASK_KINDS, PAPER_P_PROBS, PAPER_P_VALUES

# Fields that define what is trained; a checkpoint only resumes a run whose identity matches.
IDENTITY_FIELDS = (
    "model",
    "dataset",
    "n_requests",
    "isl_buckets",
    "eval_fraction",
    "rollout_temperature",
    "rollout_max_new_tokens",
    "max_length",
    "seed",
    "steps",
    "batch_size",
    "learning_rate",
    "warmup_steps",
    "schedule",
    "lora",
    "lora_rank",
    "lora_alpha",
    "lora_targets",
    "mask",
    "rho",
    "p_values",
    "p_probs",
    "score_window",
    "loss",
)


@dataclass
class TrainConfig:
    """A compressibility-training run; defaults follow the paper's appendix J.2 where it says."""

    model: str = "smollm2-135m"
    dataset: str = "embedded"
    n_requests: int | None = None  # embedded dataset only: how many prompts to build
    isl_buckets: tuple[int, ...] | None = None  # embedded dataset only
    eval_fraction: float = 0.25  # held out (never trained on) for `rift-ada train-eval`
    rollout_temperature: float = 1.0  # paper: teacher responses generated at T = 1
    rollout_max_new_tokens: int = 256
    rollout_min_new_tokens: int = 0
    repetition_penalty: float = 1.0
    max_length: int = 2048  # tokens per training sequence (prompt + response, response cut first)
    seed: int = 0
    steps: int = 100
    batch_size: int = 8  # samples per optimizer step (micro-batches of 1, gradients accumulated)
    learning_rate: float = 1e-4
    warmup_steps: int = 0
    schedule: str = "cosine"  # or "constant"
    max_grad_norm: float = 1.0
    lora: bool = True
    lora_rank: int = 16
    lora_alpha: float | None = None  # None: 2 * rank
    lora_targets: str = "all-linear"
    mask: str = "attention"
    rho: float = 0.25
    p_values: tuple[float, ...] = PAPER_P_VALUES
    p_probs: tuple[float, ...] = PAPER_P_PROBS
    score_window: int = 1
    loss: LossWeights = field(default_factory=LossWeights)
    device: str = "cpu"
    dtype: str | None = None
    checkpoint_every: int = 25
    log_every: int = 1

    def __post_init__(self) -> None:
        if self.mask not in MASK_KINDS:
            raise ValueError(f"mask must be one of {', '.join(MASK_KINDS)}, got {self.mask!r}")
        if not 0.0 < self.rho <= 1.0:
            raise ValueError(f"rho must be in (0, 1], got {self.rho}")
        if len(self.p_values) != len(self.p_probs) or not self.p_values:
            raise ValueError(f"p_values {self.p_values} and p_probs {self.p_probs} must have the same length")
        if any(not 0.0 <= p < 1.0 for p in self.p_values):
            raise ValueError(f"p_values must lie in [0, 1), got {self.p_values}")
        if any(w < 0 for w in self.p_probs) or sum(self.p_probs) <= 0:
            raise ValueError(f"p_probs must be non-negative with a positive sum, got {self.p_probs}")
        if not 0.0 < self.eval_fraction < 1.0:
            raise ValueError(f"eval_fraction must be in (0, 1), got {self.eval_fraction}")
        for name in ("steps", "batch_size", "lora_rank", "max_length", "rollout_max_new_tokens", "score_window"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.schedule not in ("cosine", "constant"):
            raise ValueError(f"schedule must be 'cosine' or 'constant', got {self.schedule!r}")
        if self.learning_rate <= 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def identity(self) -> dict[str, Any]:
        data = self.to_dict()
        return {name: data[name] for name in IDENTITY_FIELDS}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        values = {key: value for key, value in data.items() if key in known}
        if isinstance(values.get("loss"), dict):
            values["loss"] = LossWeights(**values["loss"])
        for name in ("isl_buckets", "p_values", "p_probs"):
            if values.get(name) is not None:
                values[name] = tuple(values[name])
        return cls(**values)
