"""Trace directories: ``manifest.json`` plus committed Parquet parts (layout in ``docs/traces.md``).

::

    TRACE_DIR/
      manifest.json                          identity and provenance of the collection
      requests/s0of1-000001-1a2b3c4d5e6f.parquet
      positions/s0of1-000001-1a2b3c4d5e6f.parquet     one folder per table kind: plain tools read
      strides/s0of1-000001-1a2b3c4d5e6f.parquet       ``TRACE_DIR/<kind>/*.parquet``
      _commits/s0of1-000001-1a2b3c4d5e6f.json         commit record: request ids, files, sha256
      _staging/                                       files being written (never read as data)
      _leases/s0of1.lock                              one writer per shard (flock + holder)

A *part* holds every table kind for one batch of complete requests. Its files are written into
``_staging/``, then the commit record is written (the commit point), then each file is renamed
into its kind's folder. So every file a plain tool sees in ``<kind>/`` belongs to a committed
part; a writer killed before the commit leaves only staged files (removed when its shard
resumes); one killed after the commit is rolled forward by the next writer of any shard.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
import re
import sys
import uuid
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rift_ada.atomic import atomic_write_bytes
from rift_ada.collectors.lease import LeaseHeldError, ShardLease, describe_holder, read_lease
from rift_ada.collectors.probe_traces import REQUEST_COLUMNS, ProbeTraces, arm_age

FORMAT = "rift-ada.traces"
VERSION = 2
READABLE_VERSIONS: tuple[int, ...] = (1, 2)  # 1: every file in one parts/ folder (read-only)
MODES: tuple[str, ...] = ("probe", "closed")
MANIFEST_NAME = "manifest.json"
PARTS_DIR = "parts"  # version-1 layout
COMMITS_DIR = "_commits"
STAGING_DIR = "_staging"
LEASES_DIR = "_leases"
PARQUET_META_KEY = b"rift_ada.traces"
TARGETS_IDENTITY: tuple[str, ...] = ("sha256", "target_model", "temperature", "seed", "max_new_tokens")
IDENTITY_FIELDS: tuple[str, ...] = (
    "format", "version", "mode", "draft", "target", "temperature", "draft_length", "cache",
    "decision_stride", "arms", "dataset", "seed", "free_running",
)  # fmt: skip
# Identity fields that older manifests lack, read as this value (closed runs were teacher-forced).
IDENTITY_DEFAULTS: dict[str, Any] = {"free_running": False}
REQUIRED_KINDS: dict[str, tuple[str, ...]] = {
    "probe": ("requests", "positions", "strides"),
    "closed": ("requests", "rounds"),
}
REQUIRED_COLUMNS: dict[str, dict[str, tuple[str, ...]]] = {
    "probe": {
        "requests": REQUEST_COLUMNS,
        "positions": ("request_id", "arm", "position", "outcome", "entropy"),
        "strides": ("request_id", "arm", "stride", "query_drift", "retained_mass"),
    },
    "closed": {
        "requests": REQUEST_COLUMNS,
        "rounds": ("request_id", "round", "position", "accepted", "al", "entropy_mean", "age", "refreshed"),
        "strides": ("request_id", "stride", "refreshed", "age", "retained_mass"),
    },
}
# Canonical Arrow types of the known columns (other columns keep the type they were given).
COLUMN_TYPES: dict[str, pa.DataType] = {
    "request_id": pa.string(), "dataset": pa.string(), "category": pa.string(), "tier": pa.string(),
    "arm": pa.string(), "isl": pa.int64(), "osl": pa.int64(), "position": pa.int32(),
    "stride": pa.int32(), "round": pa.int32(), "accepted": pa.int32(), "age": pa.int32(),
    "outcome": pa.float32(), "entropy": pa.float32(), "query_drift": pa.float32(),
    "retained_mass": pa.float32(), "al": pa.float32(), "entropy_mean": pa.float32(),
    "refreshed": pa.bool_(), "token_acceptance": pa.float32(),
}  # fmt: skip
SORT_KEYS: dict[str, tuple[str, ...]] = {
    "positions": ("arm", "position"),
    "strides": ("arm", "stride"),
    "rounds": ("round",),
}
_KIND_PATTERN = re.compile(r"^[a-z][a-z0-9_]*$")
_PART_ID = r"s\d+of\d+-\d{6}-[0-9a-f]{12}"
_PART_ID_PREFIX = re.compile(rf"^(?P<part>{_PART_ID})\.")
_COMMIT_PATTERN = re.compile(rf"^(?P<part>{_PART_ID})\.json$")
_V1_COMMIT_PATTERN = re.compile(rf"^(?P<part>{_PART_ID})\.commit\.json$")
_PUBLISHED_PATTERN = re.compile(rf"^(?P<part>{_PART_ID})\.parquet$")

RequestLike = TypeVar("RequestLike")


class TraceError(ValueError):
    """A trace directory that cannot be written or read; the message names the file and field."""


# --------------------------------------------------------------------------------------------
# Manifest
# --------------------------------------------------------------------------------------------


def _jsonable(value: Any, where: str) -> Any:
    """``value`` with tuples, numpy scalars/arrays and paths turned into plain JSON types."""
    if isinstance(value, Mapping):
        return {str(key): _jsonable(item, f"{where}.{key}") for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(item, where) for item in value]
    if isinstance(value, np.ndarray):
        return [_jsonable(item, where) for item in value.tolist()]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, float) and not np.isfinite(value):
        raise TraceError(f"manifest field {where!r} is not finite: {value!r}")
    if value is None or isinstance(value, str | int | float | bool):
        return value
    raise TraceError(f"manifest field {where!r} is not JSON-serialisable: {type(value).__name__}")


def package_versions() -> dict[str, str | None]:
    """Versions of the packages that shape a collection (None where not installed)."""
    from importlib import metadata

    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in ("rift-ada", "torch", "transformers", "numpy", "pyarrow"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def base_manifest(**fields: Any) -> dict[str, Any]:
    """A manifest with ``format``, ``version``, ``created``, package ``versions`` and ``command_line``.

    ``fields`` (mode, draft, target, temperature, seed, draft_length, cache, decision_stride, arms,
    dataset, n_requests, ...) are added on top and may override the defaults.
    """
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "versions": package_versions(),
        "command_line": list(sys.argv),
    }
    manifest.update(fields)
    return _jsonable(manifest, "manifest")


def _positive_int(manifest: Mapping[str, Any], name: str, where: str) -> None:
    value = manifest.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TraceError(f"{where}: field {name!r} must be a positive integer, got {value!r}")


def validate_manifest(manifest: Mapping[str, Any], where: str = "manifest") -> None:
    """Check the fields every reader relies on; raise :class:`TraceError` naming the field."""
    if not isinstance(manifest, Mapping):
        raise TraceError(f"{where}: expected a JSON object")
    if manifest.get("format") != FORMAT:
        raise TraceError(f"{where}: field 'format' is {manifest.get('format')!r}, expected {FORMAT!r}")
    if manifest.get("version") not in READABLE_VERSIONS:
        raise TraceError(
            f"{where}: field 'version' is {manifest.get('version')!r}, expected one of {list(READABLE_VERSIONS)}"
        )
    mode = manifest.get("mode")
    if mode not in MODES:
        raise TraceError(f"{where}: field 'mode' is {mode!r}, expected one of {list(MODES)}")
    temperature = manifest.get("temperature")
    if isinstance(temperature, bool) or not isinstance(temperature, int | float) or temperature < 0:
        raise TraceError(f"{where}: field 'temperature' must be a number >= 0, got {temperature!r}")
    _positive_int(manifest, "draft_length", where)
    if mode == "probe":
        _positive_int(manifest, "decision_stride", where)
        arms = manifest.get("arms")
        if not isinstance(arms, list | tuple) or not arms or not all(isinstance(arm, str) for arm in arms):
            raise TraceError(f"{where}: field 'arms' must be a non-empty list of arm names, got {arms!r}")
        if len(set(arms)) != len(arms):
            raise TraceError(f"{where}: field 'arms' has duplicates: {list(arms)}")
        for arm in arms:
            try:
                arm_age(arm)
            except ValueError as error:
                raise TraceError(f"{where}: field 'arms': {error}") from error


def read_manifest(trace_dir: str | Path) -> dict[str, Any]:
    """The validated ``manifest.json`` of a trace directory."""
    path = Path(trace_dir) / MANIFEST_NAME
    if not path.is_file():
        raise TraceError(f"{path}: manifest not found (is {Path(trace_dir)} a trace directory?)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise TraceError(f"{path}: invalid JSON ({error})") from error
    validate_manifest(manifest, str(path))
    return manifest


def _manifest_differences(existing: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    differences = []
    for name in IDENTITY_FIELDS:
        default = IDENTITY_DEFAULTS.get(name)
        old_value, new_value = existing.get(name, default), new.get(name, default)
        if old_value != new_value:
            differences.append(f"{name}: existing {json.dumps(old_value)} != new {json.dumps(new_value)}")
    old_targets, new_targets = existing.get("targets"), new.get("targets")
    if isinstance(old_targets, Mapping) and isinstance(new_targets, Mapping):
        for name in TARGETS_IDENTITY:
            old_value, new_value = old_targets.get(name), new_targets.get(name)
            if old_value != new_value:
                differences.append(f"targets.{name}: existing {json.dumps(old_value)} != new {json.dumps(new_value)}")
    return differences


def targets_problems(manifest: Mapping[str, Any], target: str, temperature: float) -> list[str]:
    """Why the manifest's ``targets`` (if recorded) were not made by ``target`` at ``temperature``."""
    targets = manifest.get("targets")
    if not isinstance(targets, Mapping):
        return []
    problems = []
    model = targets.get("target_model")
    if model is not None and str(model) not in (str(target), "external"):
        problems.append(f"targets.target_model is {model!r} in the traces but {target!r} was requested")
    have = targets.get("temperature")
    if have is not None and float(have) != float(temperature):
        problems.append(f"targets.temperature is {float(have)} in the traces but {float(temperature)} was requested")
    return problems


# --------------------------------------------------------------------------------------------
# Atomic files and parts
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# Writer
# --------------------------------------------------------------------------------------------


class TraceWriter:
    """Writes one shard's parts into a trace directory; resumes when the manifest identity agrees.

    ``writer.completed_request_ids()`` lists requests already committed (by any shard), so a
    re-run can skip them; ``writer.write_requests(tables)`` commits one batch of complete requests.
    The writer holds the shard's lease (``_leases/s{i}of{N}.lock``) until :meth:`close` (or
    process exit): a second writer of the same shard is refused with the holder named.
    Opening verifies every committed file (size and, with ``verify``, sha256).
    """

    def __init__(
        self,
        out_dir: str | Path,
        manifest: Mapping[str, Any],
        *,
        shard: str | tuple[int, int] | None = None,
        compression: str = "zstd",
        cleanup: bool = True,
        verify: bool = True,
    ) -> None:
        self.trace_dir = Path(out_dir)
        self.shard = parse_shard(shard)
        self.compression = compression
        self.verify = verify
        self._lease: ShardLease | None = None
        new_manifest = _jsonable(dict(manifest), "manifest")
        validate_manifest(new_manifest, "manifest given to TraceWriter")
        new_manifest["version"] = VERSION  # a writer always writes the current layout
        self.mode: str = new_manifest["mode"]
        if (self.trace_dir / PARTS_DIR).is_dir():
            raise TraceError(
                f"{self.trace_dir}: version-1 layout (a '{PARTS_DIR}/' folder): it can still be read, but new "
                f"parts go into the version-2 layout; upgrade it in place with `rift-ada status {self.trace_dir} "
                "--upgrade` (or `trace_io.upgrade_layout(dir)`), or collect into a new directory"
            )
        self.trace_dir.mkdir(parents=True, exist_ok=True)
        for folder in (STAGING_DIR, COMMITS_DIR):
            (self.trace_dir / folder).mkdir(exist_ok=True)
        manifest_path = self.trace_dir / MANIFEST_NAME
        if manifest_path.exists():
            existing = read_manifest(self.trace_dir)
            differences = _manifest_differences(existing, new_manifest)
            if differences:
                raise TraceError(
                    f"{manifest_path}: the directory holds traces collected with different settings "
                    f"({'; '.join(differences)}); use another output directory or the same settings"
                )
            self.manifest: dict[str, Any] = existing
        else:
            atomic_write_bytes(manifest_path, _json_bytes(new_manifest))
            self.manifest = new_manifest
        try:
            self._lease = ShardLease.acquire(self.trace_dir / LEASES_DIR, self.shard_tag)
        except LeaseHeldError as error:
            raise TraceError(str(error)) from None
        try:
            self._refuse_other_shard_counts()
            self.took_over = self._lease.took_over
            parts = _load_parts(self.trace_dir)
            _roll_forward(self.trace_dir, parts)
            if cleanup:
                self._remove_own_orphans(parts)
            self._sequence = self._last_sequence()
            self._completed = self.completed_request_ids()
        except BaseException:
            self.close()
            raise

    @property
    def shard_tag(self) -> str:
        return f"s{self.shard[0]}of{self.shard[1]}"

    def close(self) -> None:
        """Release the shard's lease (idempotent); the writer cannot write afterwards."""
        if self._lease is not None:
            self._lease.release()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _refuse_other_shard_counts(self) -> None:
        """Live writers with another shard count N would collect overlapping requests: refuse."""
        for path in sorted((self.trace_dir / LEASES_DIR).glob("s*of*.lock")):
            match = re.fullmatch(r"s(\d+)of(\d+)", path.stem)
            if match is None or int(match.group(2)) == self.shard[1]:
                continue
            lease = read_lease(path)
            if lease["held"]:
                raise TraceError(
                    f"{path}: shard {path.stem} is being written now ({describe_holder(lease['holder'])}) with "
                    f"{match.group(2)} shards, this writer uses {self.shard[1]}: concurrent writers of one "
                    "directory must use the same shard count (their requests would overlap)"
                )

    def _last_sequence(self) -> int:
        tag = f"{self.shard_tag}-"
        names = [path.name for path in (self.trace_dir / COMMITS_DIR).iterdir() if path.name.startswith(tag)]
        names += [path.name for path in (self.trace_dir / STAGING_DIR).iterdir() if path.name.startswith(tag)]
        return max((int(name.split("-")[1]) for name in names if _PART_ID_PREFIX.match(name)), default=0)

    def _remove_own_orphans(self, parts: Sequence[_Part]) -> None:
        """Delete this shard's uncommitted files (staged, temporary, or published without a commit)."""
        tag = f"{self.shard_tag}-"
        committed = {part.part_id for part in parts}
        candidates = list((self.trace_dir / STAGING_DIR).iterdir())
        for folder in (COMMITS_DIR, *(path.name for path in _kind_dirs(self.trace_dir))):
            candidates += [path for path in (self.trace_dir / folder).iterdir() if path.name.startswith(f".{tag}")]
        for kind_dir in _kind_dirs(self.trace_dir):
            candidates += [path for path in kind_dir.glob(f"{tag}*.parquet") if _PUBLISHED_PATTERN.match(path.name)]
        for path in candidates:
            name = path.name.lstrip(".")
            match = _PART_ID_PREFIX.match(name)
            if not name.startswith(tag) or not match:
                continue
            if ".tmp-" in name or match.group("part") not in committed:
                path.unlink(missing_ok=True)

    def completed_request_ids(self) -> set[str]:
        """Ids of requests in committed parts (any shard), each part's files checked.

        A committed part with a missing, truncated or (``verify``) modified file is refused rather
        than collected again (that would commit its requests twice): the error names the file and
        the way out.
        """
        completed: set[str] = set()
        for part in _load_parts(self.trace_dir):
            damaged = part.damaged_file(verify=self.verify)
            if damaged is not None:
                path, problem = damaged
                what = "missing or truncated" if problem != "modified" else "modified (sha256 differs from its record)"
                raise TraceError(f"{path}: {what} file of committed part {part.part_id}; {part.remedy()}")
            completed.update(part.request_ids)
        return completed

    def write_requests(self, tables: Mapping[str, pa.Table | Mapping[str, Any]]) -> str | None:
        """Commit one part holding every table kind for a batch of complete requests.

        Returns the part id, or None when the batch has no requests. Required kinds: probe mode
        ``requests``, ``positions``, ``strides``; closed mode ``requests``, ``rounds``.
        """
        if self._lease is None or not self._lease.held:
            raise TraceError(f"{self.trace_dir}: writer of shard {self.shard_tag} is closed")
        missing_kinds = [kind for kind in REQUIRED_KINDS[self.mode] if kind not in tables]
        if missing_kinds:
            raise TraceError(f"{self.mode} traces need table kind(s) {missing_kinds}; got {sorted(tables)}")
        arrow_tables: dict[str, pa.Table] = {}
        for kind, data in tables.items():
            if not _KIND_PATTERN.match(kind):
                raise TraceError(f"table kind {kind!r}: use lower-case letters, digits and '_'")
            table = _to_table(kind, data)
            _check_columns(table, kind, self.mode, f"table {kind!r}")
            if table["request_id"].null_count:
                raise TraceError(f"table {kind!r}: column 'request_id' has nulls")
            arrow_tables[kind] = table
        request_ids = [str(value) for value in arrow_tables["requests"]["request_id"].to_pylist()]
        if not request_ids:
            return None
        if len(set(request_ids)) != len(request_ids):
            raise TraceError("table 'requests': duplicate request ids in one batch")
        already = sorted(set(request_ids) & self._completed)
        if already:
            raise TraceError(f"requests already committed in {self.trace_dir}: {already[:5]}")
        known = pa.array(request_ids, type=pa.string())
        for kind, table in arrow_tables.items():
            if not pc.all(pc.is_in(table["request_id"], value_set=known)).as_py():
                raise TraceError(f"table {kind!r}: has rows for request ids missing from table 'requests'")
        if self.mode == "probe":
            arms = pa.array(self.manifest["arms"], type=pa.string())
            for kind in ("positions", "strides"):
                unknown = pc.invert(pc.is_in(arrow_tables[kind]["arm"], value_set=arms))
                if pc.any(unknown).as_py():
                    bad = pc.unique(pc.filter(arrow_tables[kind]["arm"], unknown)).to_pylist()
                    raise TraceError(f"table {kind!r}: arms {bad} are not in the manifest's 'arms'")

        self._sequence += 1
        part_id = f"{self.shard_tag}-{self._sequence:06d}-{uuid.uuid4().hex[:12]}"
        staging = self.trace_dir / STAGING_DIR
        files: dict[str, dict[str, Any]] = {}
        for kind, table in arrow_tables.items():
            data = _parquet_bytes(table, kind, self.mode, self.compression)
            atomic_write_bytes(staging / f"{part_id}.{kind}.parquet", data)
            files[kind] = {
                "file": f"{kind}/{part_id}.parquet",
                "rows": table.num_rows,
                "bytes": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
            }
        record = {
            "format": FORMAT,
            "version": VERSION,
            "part_id": part_id,
            "shard": list(self.shard),
            "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "request_ids": sorted(request_ids),
            "files": files,
        }
        atomic_write_bytes(self.trace_dir / COMMITS_DIR / f"{part_id}.json", _json_bytes(record))  # the commit point
        part = _Part(part_id, self.trace_dir / COMMITS_DIR / f"{part_id}.json", tuple(request_ids), files)
        _roll_forward(self.trace_dir, [part])
        self._completed.update(request_ids)
        return part_id


def _parquet_bytes(table: pa.Table, kind: str, mode: str, compression: str) -> bytes:
    """The table as Parquet, with format, version, kind and mode in its key-value metadata."""
    meta = {"format": FORMAT, "version": VERSION, "kind": kind, "mode": mode}
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), PARQUET_META_KEY: json.dumps(meta)})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression=compression)
    return sink.getvalue().to_pybytes()


def upgrade_layout(trace_dir: str | Path) -> int:
    """Move a version-1 directory (``parts/``) into the version-2 layout in place; returns the parts moved.

    Each committed part's files go to ``<kind>/<part>.parquet`` (bytes unchanged, so the recorded
    sha256 still holds), its commit record to ``_commits/``; uncommitted files are deleted; the
    manifest's ``version`` becomes 2. Run it while no writer is active.
    """
    trace_dir = Path(trace_dir)
    manifest = read_manifest(trace_dir)
    parts_dir = trace_dir / PARTS_DIR
    if not parts_dir.is_dir():
        raise TraceError(f"{trace_dir}: no '{PARTS_DIR}/' folder: already in the version-{VERSION} layout")
    (trace_dir / COMMITS_DIR).mkdir(exist_ok=True)
    (trace_dir / STAGING_DIR).mkdir(exist_ok=True)
    moved = 0
    for part in [part for part in _load_parts(trace_dir) if part.layout == 1]:
        damaged = part.damaged_file(verify=True)
        if damaged is not None:
            raise TraceError(f"{damaged[0]}: {damaged[1]} file of committed part {part.part_id}; fix it first")
        files = {}
        for kind, info in part.files.items():
            target = trace_dir / kind / f"{part.part_id}.parquet"
            target.parent.mkdir(exist_ok=True)
            os.replace(part.path(kind), target)
            files[kind] = {**info, "file": f"{kind}/{part.part_id}.parquet"}
        record = json.loads(part.commit_path.read_text(encoding="utf-8"))
        record.update(files=files, format=FORMAT, version=VERSION)
        atomic_write_bytes(trace_dir / COMMITS_DIR / f"{part.part_id}.json", _json_bytes(record))
        part.commit_path.unlink()
        moved += 1
    if any(parts_dir.iterdir()):  # uncommitted or stray files: kept aside, out of every reader's way
        parts_dir.rename(trace_dir / f"_v1-leftovers-{uuid.uuid4().hex[:8]}")
    else:
        parts_dir.rmdir()
    atomic_write_bytes(trace_dir / MANIFEST_NAME, _json_bytes({**manifest, "version": VERSION}))
    return moved


# --------------------------------------------------------------------------------------------
# Readers
# --------------------------------------------------------------------------------------------


def _committed_parts(trace_dir: Path) -> list[_Part]:
    parts = _load_parts(trace_dir)
    owner: dict[str, str] = {}
    for part in parts:
        for request_id in part.request_ids:
            if request_id in owner:
                raise TraceError(
                    f"{trace_dir}: request {request_id!r} is committed twice (parts {owner[request_id]} and "
                    f"{part.part_id}); were two runs given overlapping shards? delete one part's files"
                )
            owner[request_id] = part.part_id
    return parts


def read_tables(
    trace_dir: str | Path, kinds: Iterable[str] | None = None, *, verify: bool = True, sort: bool = True
) -> dict[str, pa.Table]:
    """Every committed table kind, concatenated over parts (rows sorted by request id and keys).

    ``verify`` checks each file's sha256 against its commit record. Uncommitted parts are ignored.
    """
    trace_dir = Path(trace_dir)
    manifest = read_manifest(trace_dir)
    wanted = set(kinds) if kinds is not None else None
    pieces: dict[str, list[pa.Table]] = {}
    for part in _committed_parts(trace_dir):
        for kind in sorted(part.files):
            if wanted is None or kind in wanted:
                pieces.setdefault(kind, []).append(_read_part_table(part, kind, manifest["mode"], verify))
    tables: dict[str, pa.Table] = {}
    for kind, items in pieces.items():
        try:
            table = pa.concat_tables(items, promote_options="default")
        except pa.ArrowException as error:
            raise TraceError(f"{trace_dir}: parts of table {kind!r} have incompatible schemas ({error})") from error
        if sort and table.num_rows:
            keys = [("request_id", "ascending")]
            keys += [(name, "ascending") for name in SORT_KEYS.get(kind, ()) if name in table.column_names]
            table = table.take(pc.sort_indices(table, sort_keys=keys))
        tables[kind] = table
    return tables


def _column_to_numpy(column: pa.ChunkedArray) -> np.ndarray:
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        if column.null_count == 0:
            return np.asarray(column.to_pylist(), dtype=str)
        return np.asarray(column.to_pylist(), dtype=object)
    if pa.types.is_integer(column.type) and column.null_count == 0:
        return column.to_numpy().astype(np.int64)
    return column.to_numpy()


def _index_of(values: pa.ChunkedArray, universe: pa.Array, what: str, where: str) -> np.ndarray:
    indices = pc.index_in(values, value_set=universe)
    if indices.null_count:
        unknown = pc.unique(pc.filter(values, pc.is_null(indices))).to_pylist()
        raise TraceError(f"{where}: {what} {unknown[:5]} not found")
    return indices.to_numpy().astype(np.int64)


def _pivot(
    table: pa.Table,
    key: str,
    value_columns: Sequence[str],
    request_ids: pa.Array,
    arms: pa.Array,
    length: int,
    where: str,
) -> dict[str, np.ndarray]:
    """Long rows (request_id, arm, key, values...) -> (R, A, length) float32 arrays, NaN padded."""
    shape = (len(request_ids), len(arms), length)
    arrays = {name: np.full(shape, np.nan, dtype=np.float32) for name in value_columns}
    if table.num_rows == 0:
        return arrays
    request_index = _index_of(table["request_id"], request_ids, "request ids", where)
    arm_index = _index_of(table["arm"], arms, "arms (not in the manifest's 'arms')", where)
    key_index = table[key].to_numpy().astype(np.int64)
    if key_index.min() < 0:
        raise TraceError(f"{where}: column {key!r} has negative values")
    for name in value_columns:
        values = pc.cast(table[name], pa.float32()).to_numpy(zero_copy_only=False)
        arrays[name][request_index, arm_index, key_index] = values
    return arrays


def read_probe_traces(trace_dir: str | Path, *, verify: bool = True) -> ProbeTraces:
    """Probe traces as padded (R, A, P) arrays: requests sorted by id, arms in manifest order.

    P is the largest of: the longest OSL, the last recorded position + 1, the manifest's optional
    ``max_positions``. Missing entries are NaN. The manifest is attached.
    """
    trace_dir = Path(trace_dir)
    manifest = read_manifest(trace_dir)
    if manifest["mode"] != "probe":
        raise TraceError(f"{trace_dir / MANIFEST_NAME}: field 'mode' is {manifest['mode']!r}; expected 'probe'")
    tables = read_tables(trace_dir, ("requests", "positions", "strides"), verify=verify, sort=False)
    if "requests" not in tables:
        raise TraceError(f"{trace_dir}: no committed parts (no complete requests yet)")
    for kind in ("positions", "strides"):
        if kind not in tables:
            raise TraceError(f"{trace_dir}: committed parts lack table {kind!r}")
    requests_table = tables["requests"].sort_by("request_id")
    request_ids = requests_table["request_id"].combine_chunks()
    arms = tuple(manifest["arms"])
    arm_array = pa.array(arms, type=pa.string())
    stride = int(manifest["decision_stride"])
    osl = requests_table["osl"].to_numpy().astype(np.int64)
    positions, strides = tables["positions"], tables["strides"]
    length = max(int(osl.max(initial=0)), int(manifest.get("max_positions") or 0))
    if positions.num_rows:
        length = max(length, int(pc.max(positions["position"]).as_py()) + 1)
    if strides.num_rows:
        length = max(length, int(pc.max(strides["stride"]).as_py()) * stride + 1)
    n_strides = -(-length // stride)
    position_columns = ("outcome", "entropy") + (
        ("token_acceptance",) if "token_acceptance" in positions.column_names else ()
    )
    per_position = _pivot(positions, "position", position_columns, request_ids, arm_array, length, str(trace_dir))
    token_acceptance = per_position.get("token_acceptance")
    if token_acceptance is not None:
        inside = (np.arange(length)[None, :] < osl[:, None])[:, None, :]
        if np.isnan(np.where(inside, token_acceptance, 0.0)).any():
            warnings.warn(
                f"{trace_dir}: column 'token_acceptance' is missing for some requests (parts written before "
                "it existed); replay samples 'outcome' (sum min(p, q)) for every request",
                stacklevel=2,
            )
            token_acceptance = None
    signal_names = [name for name in strides.column_names if name not in ("request_id", "arm", "stride")]
    stride_signals = _pivot(strides, "stride", signal_names, request_ids, arm_array, n_strides, str(trace_dir))
    requests = {name: _column_to_numpy(requests_table[name]) for name in requests_table.column_names}
    requests["osl"] = osl
    requests["isl"] = requests_table["isl"].to_numpy().astype(np.int64)
    return ProbeTraces(
        requests=requests,
        arms=arms,
        outcome=per_position["outcome"],
        entropy=per_position["entropy"],
        stride_signals=stride_signals,
        temperature=float(manifest["temperature"]),
        draft_length=int(manifest["draft_length"]),
        decision_stride=stride,
        manifest=manifest,
        token_acceptance=token_acceptance,
    )


def _probe_tables(traces: ProbeTraces, indices: np.ndarray) -> dict[str, pa.Table]:
    """Long-format tables for the requests at ``indices``: positions < OSL, strides < ceil(OSL / d)."""
    stride = traces.decision_stride
    n_positions = traces.outcome.shape[2]
    n_strides = -(-n_positions // stride)
    ids = pa.array([str(value) for value in np.asarray(traces.requests["request_id"])[indices]], type=pa.string())
    arms = pa.array(traces.arms, type=pa.string())
    osl = np.minimum(traces.osl[indices], n_positions)
    requests = {name: np.asarray(values)[indices] for name, values in traces.requests.items()}
    requests["request_id"] = np.asarray([str(value) for value in requests["request_id"]], dtype=object)
    tables: dict[str, pa.Table] = {"requests": _to_table("requests", requests)}

    valid = np.arange(n_positions)[None, :] < osl[:, None]
    r, a, p = np.nonzero(np.broadcast_to(valid[:, None, :], (len(indices), len(traces.arms), n_positions)))
    outcome, entropy = traces.outcome[indices], traces.entropy[indices]
    tables["positions"] = pa.table(
        {
            "request_id": pc.take(ids, pa.array(r)),
            "arm": pc.take(arms, pa.array(a)),
            "position": pa.array(p.astype(np.int32)),
            "outcome": pa.array(outcome[r, a, p].astype(np.float32)),
            "entropy": pa.array(entropy[r, a, p].astype(np.float32)),
        }
    )
    if traces.token_acceptance is not None:
        values = traces.token_acceptance[indices][r, a, p].astype(np.float32)
        tables["positions"] = tables["positions"].append_column("token_acceptance", pa.array(values))
    stride_valid = np.arange(n_strides)[None, :] < (-(-osl // stride))[:, None]
    r, a, s = np.nonzero(np.broadcast_to(stride_valid[:, None, :], (len(indices), len(traces.arms), n_strides)))
    columns: dict[str, Any] = {
        "request_id": pc.take(ids, pa.array(r)),
        "arm": pc.take(arms, pa.array(a)),
        "stride": pa.array(s.astype(np.int32)),
    }
    for name, values in traces.stride_signals.items():
        columns[name] = pa.array(values[indices][r, a, s].astype(np.float32))
    for name in ("query_drift", "retained_mass"):
        columns.setdefault(name, pa.array(np.full(len(r), np.nan, dtype=np.float32)))
    tables["strides"] = pa.table(columns)
    return tables


def write_probe_traces(
    trace_dir: str | Path,
    traces: ProbeTraces,
    manifest: Mapping[str, Any] | None = None,
    *,
    shard: str | tuple[int, int] | None = None,
    batch_size: int = 64,
) -> Path:
    """Write in-memory probe traces (e.g. synthetic ones) as a trace directory; skips committed requests.

    The manifest defaults to ``traces.manifest``; format and provenance fields it lacks are added
    with :func:`base_manifest`, and ``arms``, ``temperature``, ``draft_length``, ``decision_stride``
    and ``max_positions`` are taken from ``traces`` (a conflicting value raises).
    """
    fields = dict(manifest if manifest is not None else traces.manifest)
    full = base_manifest(**fields)
    from_traces = {
        "mode": "probe",
        "arms": list(traces.arms),
        "temperature": float(traces.temperature),
        "draft_length": int(traces.draft_length),
        "decision_stride": int(traces.decision_stride),
    }
    for name, value in from_traces.items():
        if full.get(name) is not None and full[name] != value:
            raise TraceError(f"manifest field {name!r} is {full[name]!r} but the traces have {value!r}")
        full[name] = value
    full["max_positions"] = max(int(full.get("max_positions") or 0), int(traces.outcome.shape[2]))
    full.setdefault("n_requests", traces.n_requests)
    with TraceWriter(trace_dir, full, shard=shard) as writer:
        done = writer.completed_request_ids()
        ids = [str(value) for value in traces.requests["request_id"]]
        todo = np.array([index for index, request_id in enumerate(ids) if request_id not in done], dtype=np.int64)
        for start in range(0, len(todo), max(1, batch_size)):
            writer.write_requests(_probe_tables(traces, todo[start : start + batch_size]))
    return Path(trace_dir)


def manifest_hash(trace_dir: str | Path) -> str:
    """sha256 (hex) over ``manifest.json`` and the sorted sha256s of every committed part file."""
    trace_dir = Path(trace_dir)
    read_manifest(trace_dir)
    digest = hashlib.sha256((trace_dir / MANIFEST_NAME).read_bytes())
    file_hashes = []
    for part in _committed_parts(trace_dir):
        for kind in part.files:
            path = part.path(kind)
            try:
                file_hashes.append(hashlib.sha256(path.read_bytes()).hexdigest())
            except FileNotFoundError:
                raise TraceError(f"{path}: part file listed in {part.commit_path.name} is missing") from None
    for file_hash in sorted(file_hashes):
        digest.update(file_hash.encode("ascii"))
    return digest.hexdigest()


def _uncommitted_and_stray(trace_dir: Path, parts: Sequence[_Part]) -> tuple[list[str], list[str]]:
    """(uncommitted part files a killed writer left, stray files readers ignore), paths relative to the dir."""
    committed = {part.part_id for part in parts}
    listed = {part.path(kind) for part in parts for kind in part.files} | {part.commit_path for part in parts}
    uncommitted, stray = [], []
    folders = [trace_dir / STAGING_DIR, trace_dir / COMMITS_DIR, trace_dir / PARTS_DIR, *_kind_dirs(trace_dir)]
    for folder in folders:
        if not folder.is_dir():
            continue
        for path in sorted(folder.iterdir()):
            if path in listed:
                continue
            name = path.name.lstrip(".")
            match = _PART_ID_PREFIX.match(name)
            relative = str(path.relative_to(trace_dir))
            if match and (".tmp-" in name or match.group("part") not in committed):
                uncommitted.append(relative)
            else:
                stray.append(relative)
    return uncommitted, stray


def trace_status(trace_dir: str | Path) -> dict[str, Any]:
    """Progress of a collection: committed parts and requests (in all and per shard), leases, leftovers.

    ``shards`` has one entry per shard seen (in commit records or leases): ``shard`` ("i/N"),
    ``parts``, ``committed`` requests, ``expected`` requests (when the manifest lists
    ``request_ids``, else None) and ``writer`` (holder of a live lease, else None).
    ``uncommitted_files`` are a killed writer's leftovers (ignored by readers, removed when the
    shard resumes); ``stray_files`` are other files in the trace folders, ignored by name.
    """
    trace_dir = Path(trace_dir)
    manifest = read_manifest(trace_dir)
    parts = _load_parts(trace_dir)
    uncommitted, stray = _uncommitted_and_stray(trace_dir, parts)
    request_ids = manifest.get("request_ids")
    committed_ids = {request_id for part in parts for request_id in part.request_ids}
    shards: dict[str, dict[str, Any]] = {}

    def entry(tag: str) -> dict[str, Any]:
        if tag not in shards:
            index, count = (int(value) for value in tag[1:].split("of"))
            expected = None
            if isinstance(request_ids, list):
                mine = shard_requests([str(value) for value in request_ids], (index, count))
                expected = len(mine)
            shards[tag] = {"shard": f"{index}/{count}", "parts": 0, "committed": 0, "expected": expected}
            shards[tag]["writer"] = None
        return shards[tag]

    for part in parts:
        row = entry(part.shard_tag)
        row["parts"] += 1
        row["committed"] += len(part.request_ids)
    leases = trace_dir / LEASES_DIR
    if leases.is_dir():
        for path in sorted(leases.glob("s*of*.lock")):
            if re.fullmatch(r"s\d+of\d+", path.stem):
                lease = read_lease(path)
                if lease["held"]:
                    entry(path.stem)["writer"] = lease["holder"] or {}
    missing = sorted(set(map(str, request_ids)) - committed_ids) if isinstance(request_ids, list) else None
    return {
        "mode": manifest["mode"],
        "layout_version": 1 if (trace_dir / PARTS_DIR).is_dir() else VERSION,
        "n_requests_expected": manifest.get("n_requests"),
        "n_parts": len(parts),
        "n_requests_committed": len(committed_ids),
        "missing_request_ids": missing,
        "shards": sorted(shards.values(), key=lambda row: tuple(int(v) for v in row["shard"].split("/"))[::-1]),
        "uncommitted_files": uncommitted,
        "stray_files": stray,
    }


def check_complete(trace_dir: str | Path, *, allow_partial: bool = False) -> dict[str, Any]:
    """Refuse a partial collection (fewer committed requests than the manifest's ``n_requests``).

    Returns :func:`trace_status`; with ``allow_partial`` a partial collection is returned too
    (``status["partial"]`` says so) for the caller to report.
    """
    status = trace_status(trace_dir)
    expected, committed = status["n_requests_expected"], status["n_requests_committed"]
    status["partial"] = isinstance(expected, int) and committed < expected
    if status["partial"] and not allow_partial:
        missing = status["missing_request_ids"]
        example = f" (missing e.g. {missing[:5]})" if missing else ""
        raise TraceError(
            f"{trace_dir}: partial collection: {committed} of {expected} requests committed{example}; "
            "finish it by re-running the collection (all shards), or pass --allow-partial to use it anyway"
        )
    return status


__all__ = [
    "FORMAT",
    "IDENTITY_FIELDS",
    "REQUIRED_COLUMNS",
    "TraceError",
    "TraceWriter",
    "base_manifest",
    "check_complete",
    "manifest_hash",
    "package_versions",
    "parse_shard",
    "read_manifest",
    "read_probe_traces",
    "read_tables",
    "shard_requests",
    "targets_problems",
    "trace_status",
    "upgrade_layout",
    "validate_manifest",
    "write_probe_traces",
]
