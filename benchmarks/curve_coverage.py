"""Coverage of the curve gap's 95% paired-bootstrap (BCa) CIs on synthetic per-request results.

    .venv/bin/python benchmarks/curve_coverage.py --sizes 8,16,32,64 --gaps 0,0.15 --reps 400 --resamples 1999
    .venv/bin/python benchmarks/curve_coverage.py --quick    # 8 requests, 20 runs, 199 resamples (a test)

Prints one line per (size, gap): the share of runs whose CI covers the true reading (computed on
200 000 synthetic requests) for the AL gain at matched refreshes and the refresh reduction at matched AL.
"""

from __future__ import annotations

import argparse
import json
import sys

from rift_ada.calibrate.curve import coverage


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8,16,32,64")
    parser.add_argument("--gaps", default="0,0.15")
    parser.add_argument("--reps", type=int, default=400)
    parser.add_argument("--resamples", type=int, default=1999)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="8 requests, gaps 0 and 0.15, 20 runs, 199 resamples")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.reps, args.resamples = "8", 20, 199
    rows = []
    for n in (int(x) for x in args.sizes.split(",")):
        for gap in (float(x) for x in args.gaps.split(",")):
            result = coverage(n, gap, reps=args.reps, n_resamples=args.resamples, seed=args.seed)
            print(json.dumps(result), flush=True)
            rows.append(result)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"seed": args.seed, "resamples": args.resamples, "rows": rows}, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
