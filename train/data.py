"""Training data: dataset requests split into train / held-out, target rollouts, training sequences."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rift_ada.collectors.datasets import Request, load_dataset


@dataclass(frozen=True)
class Sample:
    """One training sequence: prompt + target response, the response cut to fit ``max_length``."""

    request_id: str
    input_ids: list[int]
    prompt_length: int

    @property
    def response_length(self) -> int:
        return len(self.input_ids) - self.prompt_length


def load_training_requests(
    spec: str, tokenizer: Any, *, n_requests: int | None = None, isl_buckets: Sequence[int] | None = None
) -> list[Request]:
    """Dataset requests; ``n_requests``/``isl_buckets`` shape the embedded set (refused for others)."""
    options: dict[str, Any] = {}
    if n_requests is not None:
        options["n_requests"] = n_requests
    if isl_buckets is not None:
        options["isl_buckets"] = tuple(isl_buckets)
    if options and not spec.startswith("embedded"):
        raise ValueError(f"dataset {spec!r}: --n-requests/--isl-buckets only apply to the embedded dataset")
    return load_dataset(spec, tokenizer, **options)


def split_requests(requests: Sequence[Request], eval_fraction: float, seed: int) -> tuple[list[Request], list[Request]]:
    """(train, held-out): a seeded permutation, ``round(eval_fraction * n)`` (at least 1) held out."""
    if len(requests) < 2:
        raise ValueError(f"need at least 2 requests to hold some out for evaluation, got {len(requests)}")
    order = torch.randperm(len(requests), generator=torch.Generator().manual_seed(seed)).tolist()
    n_eval = min(len(requests) - 1, max(1, round(eval_fraction * len(requests))))
    held = set(order[:n_eval])
    train = [request for index, request in enumerate(requests) if index not in held]
    evaluation = [request for index, request in enumerate(requests) if index in held]
    return train, evaluation


def make_samples(rows: Sequence[dict[str, Any]], max_length: int, min_response: int = 8) -> list[Sample]:
    """Training sequences from targets rows; rows whose prompt leaves < ``min_response`` tokens are dropped."""
    samples = []
    for row in rows:
        prompt, response = list(row["prompt_token_ids"]), list(row["response_token_ids"])
        room = max_length - len(prompt)
        if room < min(min_response, len(response)) or not response:
            continue
        samples.append(Sample(row["request_id"], prompt + response[:room], len(prompt)))
    if not samples:
        raise ValueError(
            f"no training sample fits --max-length {max_length} (prompts are longer); raise it or use shorter prompts"
        )
    return samples


def sample_order(n_samples: int, seed: int, index: int) -> int:
    """Which sample the ``index``-th draw uses: a fresh seeded permutation per epoch (resumable)."""
    epoch, offset = divmod(index, n_samples)
    permutation = torch.randperm(n_samples, generator=torch.Generator().manual_seed(seed * 7919 + epoch))
    return int(permutation[offset])
