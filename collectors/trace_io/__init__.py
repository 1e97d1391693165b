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

from rift_ada.collectors.trace_io.manifest import (
    base_manifest,
    package_versions,
    read_manifest,
    targets_problems,
    validate_manifest,
)
from rift_ada.collectors.trace_io.parts import parse_shard, shard_requests
from rift_ada.collectors.trace_io.readers import (
    check_complete,
    manifest_hash,
    read_probe_traces,
    read_tables,
    trace_status,
    write_probe_traces,
)
from rift_ada.collectors.trace_io.schema import (
    COLUMN_TYPES,
    COMMITS_DIR,
    FORMAT,
    IDENTITY_DEFAULTS,
    IDENTITY_FIELDS,
    LEASES_DIR,
    MANIFEST_NAME,
    MODES,
    PARQUET_META_KEY,
    PARTS_DIR,
    READABLE_VERSIONS,
    REQUIRED_COLUMNS,
    REQUIRED_KINDS,
    SORT_KEYS,
    STAGING_DIR,
    TARGETS_IDENTITY,
    VERSION,
    TraceError,
)
from rift_ada.collectors.trace_io.writer import TraceWriter, upgrade_layout

__all__ = [
    "COLUMN_TYPES",
    "COMMITS_DIR",
    "FORMAT",
    "IDENTITY_DEFAULTS",
    "IDENTITY_FIELDS",
    "LEASES_DIR",
    "MANIFEST_NAME",
    "MODES",
    "PARQUET_META_KEY",
    "PARTS_DIR",
    "READABLE_VERSIONS",
    "REQUIRED_COLUMNS",
    "REQUIRED_KINDS",
    "SORT_KEYS",
    "STAGING_DIR",
    "TARGETS_IDENTITY",
    "TraceError",
    "TraceWriter",
    "VERSION",
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
