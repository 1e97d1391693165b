"""End-to-end collection steps the CLI and the demo share: models, dataset, targets, traces."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rift_ada.collectors.collect import (
    CollectionSummary,
    CollectSettings,
    collect_closed,
    collect_probe,
    generate_targets,
)
from rift_ada.collectors.datasets import Request, load_dataset
from rift_ada.collectors.targets_io import read_targets
from rift_ada.models import Preset, load_model, resolve_preset


@dataclass
class LoadedPair:
    """A preset's draft and target, loaded (target None for KV self-speculation)."""

    preset: Preset
    draft: Any
    tokenizer: Any
    target: Any | None

    @property
    def target_for_generation(self) -> Any:
        return self.target if self.target is not None else self.draft


def load_pair(model: str, *, device: str = "cpu", dtype: str | None = None) -> LoadedPair:
    """Load the draft (and, unless self-speculation, the target) of a preset, path or Hub id."""
    preset = resolve_preset(model)
    draft, tokenizer = load_model(preset.draft, device=device, dtype=dtype)
    target = None
    if not preset.self_speculation:
        target, _ = load_model(preset.target_name, device=device, dtype=dtype)
    return LoadedPair(preset, draft, tokenizer, target)


def load_requests(
    dataset: str, tokenizer: Any, *, limit: int | None = None, max_isl: int | None = None
) -> list[Request]:
    """Dataset requests (tokenised, ISL filled), optionally capped in count and input length."""
    requests = load_dataset(dataset, tokenizer)
    if max_isl is not None:
        requests = [request for request in requests if request.isl <= max_isl]
    if limit is not None:
        requests = _spread(requests, limit)
    return requests


def _spread(requests: Sequence[Request], limit: int) -> list[Request]:
    """``limit`` requests taken evenly across the (category-ordered) dataset, keeping tiers mixed."""
    if limit >= len(requests):
        return list(requests)
    step = len(requests) / limit
    return [requests[int(index * step)] for index in range(limit)]


def ensure_targets(
    pair: LoadedPair,
    requests: Sequence[Request],
    path: str | Path,
    *,
    temperature: float,
    seed: int,
    max_new_tokens: int,
    min_new_tokens: int = 0,
    repetition_penalty: float = 1.0,
    on_request: Callable[[str, int], None] | None = None,
    on_token: Callable[[int], None] | None = None,
    batch_size: int = 8,
) -> list[dict[str, Any]]:
    """Target responses for ``requests``: read from ``path`` when it covers them, else generated there."""
    path = Path(path)
    wanted = {request.request_id for request in requests}
    if path.exists():
        rows = read_targets(path)
        if wanted <= {row["request_id"] for row in rows}:
            return [row for row in rows if row["request_id"] in wanted]
    return generate_targets(
        pair.target_for_generation,
        pair.tokenizer,
        requests,
        path,
        target_name=pair.preset.target_name,
        temperature=temperature,
        seed=seed,
        max_new_tokens=max_new_tokens,
        min_new_tokens=min_new_tokens,
        repetition_penalty=repetition_penalty,
        on_request=on_request,
        on_token=on_token,
        batch_size=batch_size,
    )


def run_collection(
    pair: LoadedPair,
    requests: Sequence[Request],
    targets: Sequence[dict[str, Any]],
    out_dir: str | Path,
    settings: CollectSettings,
    *,
    mode: str,
    policies: Sequence[str] = (),
    shard: str | None = None,
    on_request: Callable[[str, int], None] | None = None,
    batch_size: int = 8,
    free_running: bool = False,
    extra_manifest: dict[str, Any] | None = None,
) -> CollectionSummary:
    """Probe or closed-loop collection of ``requests`` into ``out_dir``."""
    if mode == "probe":
        return collect_probe(
            pair.draft,
            requests,
            targets,
            out_dir,
            settings,
            target_model=pair.target,
            shard=shard,
            on_request=on_request,
            extra_manifest=extra_manifest,
        )
    if mode == "closed":
        if not policies:
            raise ValueError("closed mode needs at least one policy (e.g. --policy stat --policy periodic:128)")
        return collect_closed(
            pair.draft,
            requests,
            targets,
            out_dir,
            settings,
            policies,
            target_model=pair.target,
            shard=shard,
            on_request=on_request,
            extra_manifest=extra_manifest,
            free_running=free_running,
            batch_size=batch_size,
        )
    raise ValueError(f"mode must be 'probe' or 'closed', got {mode!r}")
