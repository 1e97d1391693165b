"""Atomic files and parts: commit records, roll-forward, reading one part's table, shards."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rift_ada.collectors.trace_io.schema import (
    _COMMIT_PATTERN,
    _KIND_PATTERN,
    _V1_COMMIT_PATTERN,
    COLUMN_TYPES,
    COMMITS_DIR,
    PARTS_DIR,
    REQUIRED_COLUMNS,
    STAGING_DIR,
    VERSION,
    RequestLike,
    TraceError,
)


def _json_bytes(data: Any) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n").encode("utf-8")


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class _Part:
    """One committed part: its commit record and the files it lists."""

    part_id: str
    commit_path: Path
    request_ids: tuple[str, ...]
    files: dict[str, dict[str, Any]]  # kind -> {"file", "rows", "sha256", "bytes"}
    layout: int = VERSION  # 1: every file in parts/; 2: <kind>/<part>.parquet (or still staged)

    @property
    def trace_dir(self) -> Path:
        return self.commit_path.parent.parent

    @property
    def shard_tag(self) -> str:
        return self.part_id.split("-")[0]

    def published_path(self, kind: str) -> Path:
        if self.layout == 1:
            return self.commit_path.parent / self.files[kind]["file"]
        return self.trace_dir / kind / f"{self.part_id}.parquet"

    def staged_path(self, kind: str) -> Path:
        return self.trace_dir / STAGING_DIR / f"{self.part_id}.{kind}.parquet"

    def path(self, kind: str) -> Path:
        """Where the kind's file is now: published, or still staged (a writer killed mid-publish)."""
        published = self.published_path(kind)
        if self.layout == 1 or published.exists():
            return published
        staged = self.staged_path(kind)
        return staged if staged.exists() else published

    def all_paths(self) -> list[Path]:
        """Every file of the part (its commit record last): what to delete to drop it."""
        paths = [self.path(kind) for kind in sorted(self.files)]
        return [*paths, self.commit_path]

    def damaged_file(self, verify: bool = True) -> tuple[Path, str] | None:
        """(path, problem) of the first listed file that is missing, truncated or (``verify``) modified."""
        for kind, info in sorted(self.files.items()):
            path = self.path(kind)
            if not path.is_file():
                return path, "missing"
            if "bytes" in info and path.stat().st_size != info["bytes"]:
                return path, "truncated"
            if verify and info.get("sha256") and _sha256_file(path) != info["sha256"]:
                return path, "modified"
        return None

    def remedy(self) -> str:
        names = ", ".join(str(path) for path in self.all_paths())
        return f"delete the part's files ({names}) and resume the run: its requests are collected again"


def _parse_commit(commit_path: Path, part_id: str, layout: int) -> _Part:
    try:
        record = json.loads(commit_path.read_text(encoding="utf-8"))
        files = {str(kind): dict(info) for kind, info in record["files"].items()}
        request_ids = tuple(str(request_id) for request_id in record["request_ids"])
        for kind, info in files.items():
            name = info.get("file")
            if not _KIND_PATTERN.match(kind) or not isinstance(name, str) or (layout == 1 and "/" in name):
                raise ValueError(f"bad file entry for kind {kind!r}")
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError, ValueError) as error:
        raise TraceError(f"{commit_path}: corrupt commit record ({type(error).__name__}: {error})") from error
    return _Part(part_id, commit_path, request_ids, files, layout)


def _load_parts(trace_dir: Path) -> list[_Part]:
    """Committed parts (both layouts), sorted by part id; names outside the pattern are ignored."""
    parts = []
    for folder, pattern, layout in ((COMMITS_DIR, _COMMIT_PATTERN, 2), (PARTS_DIR, _V1_COMMIT_PATTERN, 1)):
        directory = trace_dir / folder
        if not directory.is_dir():
            continue
        for commit_path in directory.iterdir():
            match = pattern.match(commit_path.name)
            if match and commit_path.is_file():
                parts.append(_parse_commit(commit_path, match.group("part"), layout))
    return sorted(parts, key=lambda part: part.part_id)


def _kind_dirs(trace_dir: Path) -> list[Path]:
    """Table-kind folders of a version-2 directory (lower-case names; ``_``/``.`` folders are not kinds)."""
    if not trace_dir.is_dir():
        return []
    return sorted(path for path in trace_dir.iterdir() if path.is_dir() and _KIND_PATTERN.match(path.name))


def _roll_forward(trace_dir: Path, parts: Sequence[_Part]) -> int:
    """Publish staged files of committed parts (a writer killed after its commit); returns the count."""
    moved = 0
    for part in parts:
        if part.layout != 2:
            continue
        for kind in part.files:
            published, staged = part.published_path(kind), part.staged_path(kind)
            if not published.exists() and staged.exists():
                published.parent.mkdir(exist_ok=True)
                try:
                    os.replace(staged, published)
                    moved += 1
                except FileNotFoundError:  # another writer published it first
                    pass
    return moved


def _read_part_table(part: _Part, kind: str, mode: str, verify: bool) -> pa.Table:
    """Read and check one part file (exists, sha256, Parquet footer, row count, columns)."""
    path = part.path(kind)
    info = part.files[kind]
    try:
        data = path.read_bytes()
    except FileNotFoundError:  # published by a writer between path() and the read: look again
        path = part.path(kind)
        data = path.read_bytes() if path.is_file() else None
    if data is None:
        raise TraceError(f"{path}: part file listed in {part.commit_path.name} is missing; {part.remedy()}")
    if verify and info.get("sha256") and hashlib.sha256(data).hexdigest() != info["sha256"]:
        raise TraceError(
            f"{path}: corrupt part file (truncated or modified: its sha256 differs from "
            f"{part.commit_path.name}); {part.remedy()}"
        )
    try:
        table = pq.read_table(pa.BufferReader(data))
    except (pa.ArrowException, OSError, ValueError) as error:
        raise TraceError(f"{path}: unreadable Parquet part ({error})") from error
    if "rows" in info and table.num_rows != info["rows"]:
        raise TraceError(f"{path}: has {table.num_rows} rows, its commit record says {info['rows']}")
    _check_columns(table, kind, mode, str(path))
    return table


def _check_columns(table: pa.Table, kind: str, mode: str, where: str) -> None:
    required = REQUIRED_COLUMNS.get(mode, {}).get(kind, ("request_id",))
    missing = [name for name in required if name not in table.column_names]
    if missing:
        raise TraceError(f"{where}: table {kind!r} lacks required column(s) {missing}")


def _to_table(kind: str, data: pa.Table | Mapping[str, Any]) -> pa.Table:
    """A table with canonical types for known columns (dicts of arrays/lists are converted)."""
    try:
        table = data if isinstance(data, pa.Table) else pa.table({name: _to_arrow(v) for name, v in data.items()})
    except (pa.ArrowException, TypeError, ValueError) as error:
        raise TraceError(f"table {kind!r}: cannot convert to Arrow ({error})") from error
    columns = []
    for name in table.column_names:
        column = table[name]
        target = COLUMN_TYPES.get(name)
        if target is not None and column.type != target:
            try:
                column = pc.cast(column, target, safe=not pa.types.is_floating(target))
            except (pa.ArrowException, TypeError) as error:
                raise TraceError(f"table {kind!r}: column {name!r} cannot be cast to {target} ({error})") from error
        columns.append(column)
    return pa.table(columns, names=table.column_names)


def _to_arrow(values: Any) -> pa.Array:
    if isinstance(values, pa.Array | pa.ChunkedArray):
        return values
    array = np.asarray(values)
    if array.dtype.kind == "U":
        return pa.array(array.tolist(), type=pa.string())
    if array.dtype.kind == "O":
        return pa.array(array.tolist())
    return pa.array(array)


def parse_shard(shard: str | tuple[int, int] | None) -> tuple[int, int]:
    """``"i/N"``, ``"auto"`` (from the launcher's environment) or ``(i, N)`` (None: ``(0, 1)``); checked."""
    if shard is None:
        return 0, 1
    if isinstance(shard, str) and shard.strip().lower() == "auto":
        from rift_ada.collectors.cluster import ShardEnvError, resolve_shard

        try:
            shard = str(resolve_shard(shard))
        except ShardEnvError as error:
            raise TraceError(str(error)) from None
    if isinstance(shard, str):
        match = re.fullmatch(r"\s*(-?\d+)\s*/\s*(-?\d+)\s*", shard)
        if not match:
            raise TraceError(f"shard {shard!r}: expected 'i/N', e.g. '0/4'")
        index, count = int(match.group(1)), int(match.group(2))
    else:
        try:
            index, count = (int(item) for item in shard)
        except (TypeError, ValueError):
            raise TraceError(f"shard {shard!r}: expected 'i/N' or a pair (i, N)") from None
    if count < 1:
        raise TraceError(f"shard {index}/{count}: the number of shards N must be >= 1")
    if not 0 <= index < count:
        raise TraceError(f"shard {index}/{count}: the shard index must satisfy 0 <= i < N (i = {index}, N = {count})")
    return index, count


def _request_id_of(item: Any) -> str:
    if isinstance(item, str):
        return item
    if isinstance(item, Mapping):
        return str(item["request_id"])
    return str(item.request_id)


def shard_requests(requests: Sequence[RequestLike], shard: str | tuple[int, int] | None) -> list[RequestLike]:
    """The requests of shard ``i`` of ``N``: round-robin over the sorted request ids.

    Deterministic, disjoint and covering for any input order; input order is kept in the result.
    Items may be request ids, mappings with ``request_id`` or objects with ``.request_id``.
    """
    index, count = parse_shard(shard)
    ids = [_request_id_of(item) for item in requests]
    if len(set(ids)) != len(ids):
        duplicates = sorted({request_id for request_id in ids if ids.count(request_id) > 1})
        raise TraceError(f"cannot shard requests with duplicate ids: {duplicates[:5]}")
    rank = {request_id: position for position, request_id in enumerate(sorted(ids))}
    return [item for item, request_id in zip(requests, ids, strict=True) if rank[request_id] % count == index]


