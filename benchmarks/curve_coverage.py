"""Coverage of the curve gap's 95% paired-bootstrap (BCa) CIs on synthetic per-request results.

    .venv/bin/python benchmarks/curve_coverage.py --sizes 8,16,32,64 --gaps 0,0.15 --reps 400 --resamples 1999

Prints one line per (size, gap): the share of runs whose CI covers the true reading (computed on
200 000 synthetic requests) for the AL gain at matched refreshes and the refresh reduction at matched AL.
"""

from __future__ import annotations

import argparse
import json

from rift_ada.calibrate.curve import coverage


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8,16,32,64")
    parser.add_argument("--gaps", default="0,0.15")
    parser.add_argument("--reps", type=int, default=400)
    parser.add_argument("--resamples", type=int, default=1999)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for n in (int(x) for x in args.sizes.split(",")):
        for gap in (float(x) for x in args.gaps.split(",")):
            result = coverage(n, gap, reps=args.reps, n_resamples=args.resamples, seed=args.seed)
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
