"""Readers: tables, probe traces, manifest hashes, status and completeness of a trace directory."""

from __future__ import annotations

import hashlib
import re
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rift_ada.collectors.lease import read_lease
from rift_ada.collectors.probe_traces import ProbeTraces
from rift_ada.collectors.trace_io.manifest import base_manifest, read_manifest
from rift_ada.collectors.trace_io.parts import (
    _kind_dirs,
    _load_parts,
    _Part,
    _read_part_table,
    _to_table,
    shard_requests,
)
from rift_ada.collectors.trace_io.schema import (
    _PART_ID_PREFIX,
    COMMITS_DIR,
    LEASES_DIR,
    MANIFEST_NAME,
    PARTS_DIR,
    SORT_KEYS,
    STAGING_DIR,
    VERSION,
    TraceError,
)
from rift_ada.collectors.trace_io.writer import TraceWriter


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
