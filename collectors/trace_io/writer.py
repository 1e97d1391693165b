"""``TraceWriter``: appends complete requests as committed parts (the commit protocol of ``__init__``)."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rift_ada.atomic import atomic_write_bytes
from rift_ada.collectors.lease import LeaseHeldError, ShardLease, describe_holder, read_lease
from rift_ada.collectors.trace_io.manifest import _jsonable, _manifest_differences, read_manifest, validate_manifest
from rift_ada.collectors.trace_io.parts import (
    _check_columns,
    _json_bytes,
    _kind_dirs,
    _load_parts,
    _Part,
    _roll_forward,
    _to_table,
    parse_shard,
)
from rift_ada.collectors.trace_io.schema import (
    _KIND_PATTERN,
    _PART_ID_PREFIX,
    _PUBLISHED_PATTERN,
    COMMITS_DIR,
    FORMAT,
    LEASES_DIR,
    MANIFEST_NAME,
    PARQUET_META_KEY,
    PARTS_DIR,
    REQUIRED_KINDS,
    STAGING_DIR,
    VERSION,
    TraceError,
)


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
            # min_count=0: an empty table (a response shorter than one stride has no strides) passes, not null
            if not pc.all(pc.is_in(table["request_id"], value_set=known), min_count=0).as_py():
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


