"""``Request`` (one prompt to run with its stratification labels), its tiers and ``DatasetError``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Tier = Literal["low", "high"]
TIERS: tuple[str, ...] = ("low", "high")
ROLES: frozenset[str] = frozenset({"system", "user", "assistant"})
DEFAULT_ISL_BUCKETS: tuple[int, ...] = (1024, 2048, 4096)


class DatasetError(ValueError):
    """A dataset file or spec that cannot be loaded; the message names the file, line and field."""


@dataclass
class Request:
    """One prompt to run: chat messages plus the labels used to stratify splits and reports."""

    request_id: str
    dataset: str
    category: str
    tier: str
    prompt_messages: list[dict[str, str]]
    isl: int = 0
    max_output_tokens: int | None = None
    reference_response: str | None = None
    isl_bucket: int | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Request:
        return cls(**data)
