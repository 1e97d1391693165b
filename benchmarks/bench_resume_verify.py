"""Cost of verifying committed parts by sha256 when a collection resumes (TraceWriter start).

Writes a synthetic probe trace directory, then times opening a writer on it (which checks every
committed file) with ``verify=True`` (sha256, the default) and ``verify=False`` (sizes only).

    .venv/bin/python benchmarks/bench_resume_verify.py --requests 880 --osl 512
    .venv/bin/python benchmarks/bench_resume_verify.py --quick    # 8 requests x 128 positions (a test)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from rift_ada.collectors.synthetic import synthetic_traces
from rift_ada.collectors.trace_io import TraceWriter, read_manifest, write_probe_traces


def _open_time(trace_dir: Path, verify: bool, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        with TraceWriter(trace_dir, read_manifest(trace_dir), verify=verify):
            pass
        best = min(best, time.perf_counter() - start)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=880)
    parser.add_argument("--osl", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=1, help="requests per part (collect writes 1)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="8 requests x 128 positions, 1 repeat")
    parser.add_argument("--json", help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.osl, args.repeats = 8, 128, 1
    traces = synthetic_traces(args.requests, args.osl, seed=args.seed)
    with tempfile.TemporaryDirectory() as folder:
        trace_dir = Path(folder) / "t"
        write_probe_traces(trace_dir, traces, batch_size=args.batch_size)
        files = [path for path in trace_dir.rglob("*.parquet")]
        size = sum(path.stat().st_size for path in files)
        sizes_only = _open_time(trace_dir, False, args.repeats)
        sha256 = _open_time(trace_dir, True, args.repeats)
    print(f"{args.requests} requests x {len(traces.arms)} arms x {args.osl} positions: "
          f"{len(files)} part files, {size / 2**20:.1f} MiB (seed {args.seed})")  # fmt: skip
    print(f"writer start, sizes only : {sizes_only:.3f} s")
    print(f"writer start, sha256     : {sha256:.3f} s   ({sha256 / sizes_only:.2f}x, "
          f"{size / 2**20 / max(sha256 - sizes_only, 1e-9):.0f} MiB/s of hashing)")  # fmt: skip
    if args.json:
        figures = {"requests": args.requests, "osl": args.osl, "arms": len(traces.arms), "seed": args.seed,
                   "files": len(files), "bytes": size, "sizes_only_s": sizes_only, "sha256_s": sha256}  # fmt: skip
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(figures, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
