"""The manifest of a trace directory: building, validating, reading and comparing it."""

from __future__ import annotations

import datetime as _dt
import json
import platform
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rift_ada.collectors.probe_traces import arm_age
from rift_ada.collectors.trace_io.schema import (
    FORMAT,
    IDENTITY_DEFAULTS,
    IDENTITY_FIELDS,
    MANIFEST_NAME,
    MODES,
    READABLE_VERSIONS,
    TARGETS_IDENTITY,
    VERSION,
    TraceError,
)


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


