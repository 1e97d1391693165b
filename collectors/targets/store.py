"""Resumable, shardable target generation: one small Parquet per request, merged when all are there.

``generate_targets_resumable(..., shard="i/N")`` writes each finished response at once to
``<out>.parts/<request>.parquet`` (atomically: ``collect.generate_target_rows`` then
``files.write_targets``), skips the ones already there, and, once every request of the run
has a response (from any shard), writes the single targets file ``<out>`` and removes the parts
folder. Request k of the run is sampled with seed ``seed + k`` whichever shard runs it, so
sharded, resumed and one-shot runs give the same rows. ``<out>.parts/settings.json`` pins the
generation settings: resuming with others is refused.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rift_ada.atomic import atomic_write_text
from rift_ada.collectors.datasets import Request
from rift_ada.collectors.lease import LeaseHeldError, ShardLease
from rift_ada.collectors.targets.files import TargetsError, read_targets, response_end, write_targets
from rift_ada.collectors.trace_io import parse_shard, shard_requests
from rift_ada.throughput import TARGETS_BATCH

SETTINGS_NAME = "settings.json"


def parts_dir_of(out_path: str | Path) -> Path:
    """The folder of per-request parts beside a targets file."""
    out_path = Path(out_path)
    return out_path.with_name(f"{out_path.name}.parts")


def _part_path(parts_dir: Path, request_id: str) -> Path:
    return parts_dir / f"{hashlib.sha256(request_id.encode('utf-8')).hexdigest()[:24]}.parquet"


@dataclass
class TargetsProgress:
    """What a (shard's) targets run did; ``rows`` is set once the merged file exists."""

    out_path: str
    n_mine: int
    skipped: int
    generated: int
    complete: bool
    rows: list[dict[str, Any]] | None = None


def generation_meta(
    target_name: str, temperature: float, seed: int, max_new_tokens: int, min_new_tokens: int, repetition_penalty: float
) -> dict[str, Any]:
    """The settings recorded in a targets file's metadata (and compared before reuse)."""
    meta: dict[str, Any] = {
        "target_model": target_name,
        "temperature": float(temperature),
        "seed": int(seed),
        "max_new_tokens": int(max_new_tokens),
        "min_new_tokens": int(min_new_tokens),
        "response_end": response_end(int(min_new_tokens), int(max_new_tokens)),
    }
    if repetition_penalty != 1.0:
        meta["repetition_penalty"] = float(repetition_penalty)
    return meta


def _check_settings(parts_dir: Path, meta: dict[str, Any]) -> None:
    path = parts_dir / SETTINGS_NAME
    if not path.exists():
        atomic_write_text(path, json.dumps(meta, sort_keys=True))
        return
    existing = json.loads(path.read_text())
    differences = [
        f"{key}: existing {existing.get(key)!r} != new {meta.get(key)!r}"
        for key in sorted(set(existing) | set(meta))
        if existing.get(key) != meta.get(key)
    ]
    if differences:
        raise TargetsError(
            f"{path}: unfinished targets run with other settings ({'; '.join(differences)}); "
            "use the same settings or delete that folder"
        )


def generate_targets_resumable(
    target_model: Any,
    tokenizer: Any,
    requests: Sequence[Request],
    out_path: str | Path,
    *,
    target_name: str,
    temperature: float = 0.0,
    seed: int = 0,
    max_new_tokens: int = 512,
    min_new_tokens: int = 0,
    repetition_penalty: float = 1.0,
    shard: str | tuple[int, int] | None = None,
    keep: Sequence[dict[str, Any]] = (),
    on_request: Callable[[str, int], None] | None = None,
    on_token: Callable[[int], None] | None = None,
    batch_size: int = TARGETS_BATCH,
) -> TargetsProgress:
    """Generate this shard's missing responses, ``batch_size`` at a time; merge when the run is complete.

    Request k of ``requests`` is sampled with seed + k whatever the shard or batch, so sharded,
    batched and one-shot runs give the same rows.

    ``keep``: rows already accepted (e.g. an existing targets file being extended); they are
    neither regenerated nor changed and go into the merged file first.
    """
    from rift_ada.collectors.collect import generate_target_rows

    out_path = Path(out_path)
    parts_dir = parts_dir_of(out_path)
    parts_dir.mkdir(parents=True, exist_ok=True)
    meta = generation_meta(target_name, temperature, seed, max_new_tokens, min_new_tokens, repetition_penalty)
    _check_settings(parts_dir, meta)
    kept = {row["request_id"] for row in keep}
    index_of = {request.request_id: index for index, request in enumerate(requests)}
    mine = [request for request in shard_requests(list(requests), shard) if request.request_id not in kept]
    index, count = parse_shard(shard)
    try:
        lease = ShardLease.acquire(parts_dir / "_leases", f"s{index}of{count}")
    except LeaseHeldError as error:
        raise TargetsError(str(error)) from None
    todo = [request for request in mine if not _part_path(parts_dir, request.request_id).exists()]
    skipped, generated = len(mine) - len(todo), 0
    try:
        for first in range(0, len(todo), batch_size):  # each batch's parts land before the next starts
            chunk = todo[first : first + batch_size]
            rows = generate_target_rows(
                target_model,
                tokenizer,
                chunk,
                [seed + index_of[request.request_id] for request in chunk],
                target_name=target_name,
                temperature=temperature,
                max_new_tokens=max_new_tokens,
                min_new_tokens=min_new_tokens,
                repetition_penalty=repetition_penalty,
                on_request=on_request,
                on_token=on_token,
                batch_size=batch_size,
            )
            for request, row in zip(chunk, rows, strict=True):
                part_meta = {"target_model": target_name, "temperature": temperature, "seed": row["seed"]}
                if repetition_penalty != 1.0:
                    part_meta["repetition_penalty"] = repetition_penalty
                write_targets(_part_path(parts_dir, request.request_id), [row], part_meta)
                generated += 1
    finally:
        lease.release()
    progress = TargetsProgress(str(out_path), len(mine), skipped, generated, complete=False)
    rows = merge_if_complete(requests, out_path, meta, keep)
    if rows is not None:
        progress.complete, progress.rows = True, rows
    return progress


def merge_if_complete(
    requests: Sequence[Request], out_path: Path, meta: dict[str, Any], keep: Sequence[dict[str, Any]] = ()
) -> list[dict[str, Any]] | None:
    """Write ``out_path`` (rows in request order) once every request has a part; else None."""
    parts_dir = parts_dir_of(out_path)
    kept = {row["request_id"]: row for row in keep}
    rows: list[dict[str, Any]] = []
    for request in requests:
        if request.request_id in kept:
            rows.append(kept[request.request_id])
            continue
        part = _part_path(parts_dir, request.request_id)
        if not part.exists():
            return None
        rows.extend(read_targets(part))
    extra = [row for request_id, row in kept.items() if request_id not in {r.request_id for r in requests}]
    write_targets(out_path, [*rows, *extra], meta)
    shutil.rmtree(parts_dir, ignore_errors=True)
    return rows


__all__ = ["TargetsProgress", "generate_targets_resumable", "generation_meta", "merge_if_complete", "parts_dir_of"]
