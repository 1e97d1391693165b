"""Controller JSON v1 assembly, validation and atomic writes."""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any

from rift_ada.atomic import atomic_write_bytes, atomic_write_text
from rift_ada.controller import DEFAULT_CACHE, DEFAULT_SCHEDULE, DEFAULT_SIGNALS, make_controller_dict

__all__ = [
    "DEFAULT_CACHE",
    "DEFAULT_SCHEDULE",
    "DEFAULT_SIGNALS",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "canonical_json",
    "controller_dict",
    "export_controller",
    "sha256_json",
    "validate_controller",
]


def controller_dict(
    policy: dict[str, Any],
    *,
    name: str,
    draft: str,
    target: str,
    temperature: float,
    cache: dict[str, Any] | None = None,
    schedule: dict[str, Any] | None = None,
    signals: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Validated controller JSON v1 dict around ``policy`` (``rift_ada.controller.make_controller_dict``)."""
    return make_controller_dict(
        policy,
        name=name,
        draft=draft,
        target=target,
        temperature=float(temperature),
        cache=dict(cache if cache is not None else DEFAULT_CACHE),
        schedule=dict(schedule if schedule is not None else DEFAULT_SCHEDULE),
        signals=dict(signals if signals is not None else DEFAULT_SIGNALS),
    )


def validate_controller(controller: dict[str, Any]) -> Any:
    """Load ``controller`` with ``rift_ada.Controller.from_dict`` (raises ``ControllerError``)."""
    from rift_ada import Controller

    return Controller.from_dict(controller)


def canonical_json(obj: Any) -> str:
    """Indented, key-sorted JSON with a trailing newline (stable across runs)."""
    return json.dumps(obj, indent=2, sort_keys=True, allow_nan=False, default=_json_default) + "\n"


def json_safe(obj: Any) -> Any:
    """``obj`` with numpy values as Python ones and NaN / infinity as None (strict JSON has neither)."""
    if isinstance(obj, dict):
        return {key: json_safe(value) for key, value in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(value) for value in obj]
    if hasattr(obj, "tolist") and not isinstance(obj, str):
        return json_safe(obj.tolist())
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if hasattr(obj, "item"):
        return obj.item()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def sha256_json(obj: Any) -> str:
    """SHA-256 of the compact, key-sorted JSON of ``obj``."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=_json_default).encode()
    return hashlib.sha256(blob).hexdigest()


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> Path:
    """Atomic write of :func:`canonical_json` ``obj``."""
    return atomic_write_text(path, canonical_json(obj))


def export_controller(controller: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Validate with ``Controller.from_dict``, then write atomically; returns the path."""
    validate_controller(controller)
    return atomic_write_json(path, controller)
