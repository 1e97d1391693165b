"""Compare two `rift-ada bench`/`demo` run directories by content: every trace table (parquet parts of a
folder concatenated and sorted, so part names and nonces do not count) and every JSON file with its
timestamps, hashes of manifests, paths and wall times left out. Prints one line per table and file.

    .venv/bin/python benchmarks/investigations/compare_run_dirs.py /tmp/demo-old /tmp/demo-new
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import polars as pl

VOLATILE = {
    "created",
    "manifest_hash",
    "manifest_json_sha256",
    "wall_s",
    "wall_total_s",
    "sha256",
    "started",
    "source_commit",
}


def _table(folder: Path) -> pl.DataFrame:
    frame = pl.concat([pl.read_parquet(part) for part in sorted(folder.glob("*.parquet"))], how="diagonal_relaxed")
    return frame.sort([c for c, t in frame.schema.items() if t in (pl.Utf8, pl.Int64, pl.Int32, pl.Float64)])


def _normalised(value: Any, roots: tuple[str, str]) -> Any:
    if isinstance(value, dict):
        return {k: _normalised(v, roots) for k, v in value.items() if k not in VOLATILE and "timings" not in k}
    if isinstance(value, list):
        return [_normalised(v, roots) for v in value]
    if isinstance(value, str):
        return value.replace(roots[0], "RUN").replace(roots[1], "RUN")
    return value


def main(old: Path, new: Path) -> int:
    roots, differ, total = (str(old), str(new)), 0, 0
    for folder in sorted(p for p in old.rglob("*") if p.is_dir() and any(p.glob("*.parquet"))):
        total += 1
        same = _table(folder).equals(_table(new / folder.relative_to(old)))
        differ += not same
        print(("same " if same else "DIFF ") + str(folder.relative_to(old)))
    for path in sorted(old.rglob("*.json")):
        if "_commits" in path.parts:  # commit records name their parts
            continue
        total += 1
        other = new / path.relative_to(old)
        same = other.exists() and _normalised(json.loads(path.read_text()), roots) == _normalised(
            json.loads(other.read_text()), roots
        )
        differ += not same
        print(("same " if same else "DIFF ") + str(path.relative_to(old)))
    print(f"{total - differ} of {total} identical")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main(Path(sys.argv[1]), Path(sys.argv[2])))
