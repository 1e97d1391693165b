"""The trace format's constants: version, folders, required kinds and columns, Arrow types, sort keys."""

from __future__ import annotations

import re
from typing import Any, TypeVar

import pyarrow as pa

from rift_ada.collectors.probe_traces import REQUEST_COLUMNS

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


