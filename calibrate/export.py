"""Controller JSON v1 assembly, validation and export (the writers themselves are in ``rift_ada.atomic``)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

# The writers live in rift_ada.atomic; re-exported here for code written against this module.
from rift_ada.atomic import (
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    canonical_json,
    json_default,
    json_safe,
)
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
    "json_safe",
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


def sha256_json(obj: Any) -> str:
    """SHA-256 of the compact, key-sorted JSON of ``obj``."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=json_default).encode()
    return hashlib.sha256(blob).hexdigest()


def export_controller(controller: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Validate with ``Controller.from_dict``, then write atomically; returns the path."""
    validate_controller(controller)
    return atomic_write_json(path, controller)
