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
)
from rift_ada.collectors.datasets import Request, load_dataset
from rift_ada.collectors.targets.files import TargetsError, read_targets, targets_differences
from rift_ada.collectors.targets.store import generate_targets_resumable
from rift_ada.collectors.trace_io import parse_shard
from rift_ada.models import Preset, load_model, resolve_preset
from rift_ada.throughput import CLOSED_BATCH, PROBE_BATCH, TARGETS_BATCH


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


def load_pair(
    model: str, *, device: str = "cpu", dtype: str | None = None, device_map: str | None = None
) -> LoadedPair:
    """Load the draft (and, unless self-speculation, the target) of a preset, path or Hub id.

    ``device_map`` (e.g. ``auto``) spreads the target over several GPUs; the draft stays on ``device``.
    """
    preset = resolve_preset(model)
    draft_map = device_map if preset.self_speculation else None
    draft, tokenizer = load_model(preset.draft, device=device, dtype=dtype, device_map=draft_map)
    target = None
    if not preset.self_speculation:
        target, _ = load_model(preset.target_name, device=device, dtype=dtype, device_map=device_map)
    return LoadedPair(preset, draft, tokenizer, target)


def load_requests(
    dataset: str, tokenizer: Any, *, limit: int | None = None, max_isl: int | None = None
) -> list[Request]:
    """Dataset requests (tokenised, ISL filled), optionally capped in count and input length."""
    requests = load_dataset(dataset, tokenizer)
    if max_isl is not None:
        requests = [request for request in requests if request.isl <= max_isl]
    if limit is not None:
        requests = spread_requests(requests, limit)
    return requests


def spread_requests(requests: Sequence[Request], limit: int) -> list[Request]:
    """``limit`` requests taken round-robin over the categories (dataset order within each), so tiers stay mixed."""
    if limit >= len(requests):
        return list(requests)
    by_category: dict[str, list[Request]] = {}
    for request in requests:
        by_category.setdefault(request.category, []).append(request)
    queues = list(by_category.values())
    picked: list[Request] = []
    depth = 0
    while len(picked) < limit:
        for queue in queues:
            if depth < len(queue) and len(picked) < limit:
                picked.append(queue[depth])
        depth += 1
    order = {id(request): index for index, request in enumerate(requests)}
    return sorted(picked, key=lambda request: order[id(request)])


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
    extend: bool = False,
    shard: str | None = None,
    on_request: Callable[[str, int], None] | None = None,
    on_token: Callable[[int], None] | None = None,
    batch_size: int = TARGETS_BATCH,
) -> list[dict[str, Any]]:
    """Target responses for ``requests`` (in request order): read from ``path``, or generated there when absent.

    An existing file is an input and is never overwritten: one whose model, temperature, seed
    (T > 0) or token limits (cap, EOS suppression) differ from the run is refused with every
    difference listed; one that lacks responses for some requests is refused unless ``extend``, which generates only the
    missing ones and appends them (existing rows unchanged). A sharded run (N > 1) needs a
    complete file made beforehand (``rift-ada targets --shard``), so shards never race on it.
    """
    path = Path(path)
    wanted = [request.request_id for request in requests]
    generate = {
        "target_name": pair.preset.target_name,
        "temperature": temperature,
        "seed": seed,
        "max_new_tokens": max_new_tokens,
        "min_new_tokens": min_new_tokens,
        "repetition_penalty": repetition_penalty,
        "on_request": on_request,
        "on_token": on_token,
    }
    sharded = parse_shard(shard)[1] > 1
    keep: list[dict[str, Any]] = []
    if path.exists():
        differences, missing = targets_differences(
            path,
            target_model=pair.preset.target_name,
            temperature=temperature,
            seed=seed,
            max_new_tokens=max_new_tokens,
            request_ids=wanted,
            min_new_tokens=min_new_tokens,
        )
        if missing and not extend:
            more = " ..." if len(missing) > 5 else ""
            differences.append(
                f"no response for {len(missing)} request(s) {missing[:5]}{more} (pass --extend-targets to add them)"
            )
        if differences:
            raise TargetsError(
                f"{path}: targets file does not match this run: {'; '.join(differences)}. The file is left "
                "unchanged: give another --targets path, or run with the file's settings"
            )
        keep = read_targets(path)
        if not missing:
            by_id = {row["request_id"]: row for row in keep}
            return [by_id[request_id] for request_id in wanted]
    if sharded:
        raise TargetsError(
            f"{path}: a sharded collection needs a complete targets file made beforehand, so shards do not race "
            f"on it: run `rift-ada targets --shard i/N --out {path}` (same model, dataset, temperature, seed and "
            "--max-new-tokens) on every shard first"
        )
    model = pair.target_for_generation
    progress = generate_targets_resumable(
        model, pair.tokenizer, requests, path, keep=keep, batch_size=batch_size, **generate
    )
    assert progress.rows is not None  # one unsharded process generates every missing response
    by_id = {row["request_id"]: row for row in progress.rows}
    return [by_id[request_id] for request_id in wanted]


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
    batch_size: int = CLOSED_BATCH,
    probe_batch_size: int = PROBE_BATCH,
    free_running: bool = False,
    extra_manifest: dict[str, Any] | None = None,
    on_tokens: Callable[[int, int], None] | None = None,
) -> CollectionSummary:
    """Probe or closed-loop collection of ``requests`` into ``out_dir``.

    ``batch_size``: closed-loop runs decoded together; ``probe_batch_size``: requests whose arms'
    forwards the probe stacks (defaults: `rift_ada.throughput`, docs/performance.md). The manifest also records
    the run's sorted ``request_ids`` (for per-shard progress and the partial-collection check) and
    ``extra_manifest`` (e.g. ``targets`` provenance); ``on_tokens(tokens, rounds)`` as tokens are committed.
    """
    extra = {"request_ids": sorted(request.request_id for request in requests), **(extra_manifest or {})}
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
            extra_manifest=extra,
            batch_size=probe_batch_size,
            on_tokens=on_tokens,
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
            extra_manifest=extra,
            free_running=free_running,
            batch_size=batch_size,
            on_tokens=on_tokens,
        )
    raise ValueError(f"mode must be 'probe' or 'closed', got {mode!r}")
