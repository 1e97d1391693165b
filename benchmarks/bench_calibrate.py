"""Wall time of a 500-trial calibration on synthetic probe traces (100 requests x 4096 positions).

    .venv/bin/python benchmarks/bench_calibrate.py [--trials 500] [--workers 1] [--storage URL]
    .venv/bin/python benchmarks/bench_calibrate.py --quick    # 16 requests x 256 positions, 4 trials (a test)

Target: <= 60 s on 2 CPU cores. Prints the total and its parts (study, per trial, replay speed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--osl", type=int, default=4096)
    parser.add_argument("--trials", type=int, default=500)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--storage", default=None, help="Optuna storage URL (default: SQLite in the run dir)")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target-s", type=float, default=60.0)
    parser.add_argument("--quick", action="store_true", help="16 requests x 256 positions, 4 trials")
    parser.add_argument("--json", help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.osl, args.trials = 16, 256, 4

    from rift_ada.calibrate.config import CalibrationConfig
    from rift_ada.calibrate.pipeline import calibrate
    from rift_ada.collectors.synthetic import synthetic_traces
    from rift_ada.policies.replay import replay

    traces = synthetic_traces(args.requests, args.osl, temperature=args.temperature, seed=args.seed)
    with tempfile.TemporaryDirectory(prefix="bench-calibrate-") as run_dir:
        start = time.perf_counter()
        config = CalibrationConfig(
            name="bench",
            draft="synthetic",
            target="synthetic",
            temperature=args.temperature,
            trials=args.trials,
            workers=args.workers,
            storage=args.storage,
            seed=args.seed,
        )
        result = calibrate(traces, run_dir, config, log=None)
        wall = time.perf_counter() - start
        study = result.calibration["study"]
        selection = traces.subset(result.splits.selection)
        policy = result.controller
        replay(selection, policy)
        t0 = time.perf_counter()
        reps = 10
        for _ in range(reps):
            replay(selection, policy)
        replay_s = (time.perf_counter() - t0) / reps

    n_complete = study["complete"]
    positions = len(result.splits.selection) * args.osl
    print(
        f"calibrate: {args.requests} requests x {args.osl} positions, {args.trials} trials "
        f"(+{study['n_baselines']} baselines), {args.workers} worker(s), {os.cpu_count()} CPUs"
    )
    print(f"  total wall        {wall:8.1f} s   (target <= {args.target_s:.0f} s)")
    print(
        f"  study             {study['wall_s']:8.1f} s   ({1000 * study['wall_s'] / max(1, n_complete):.1f} ms/trial)"
    )
    print(f"  rest              {wall - study['wall_s']:8.1f} s   (splits, grids, score fit, confirmation, report)")
    print(
        f"  replay (selection split, chosen controller) {1000 * replay_s:.1f} ms "
        f"= {positions / replay_s / 1e6:.2f} M positions/s"
    )
    print(f"  verdict: {'gain' if result.has_gain else 'no gain'}; chosen trial {result.operating_point.chosen.number}")
    if args.json:
        figures = {
            "requests": args.requests, "osl": args.osl, "trials": args.trials, "workers": args.workers,
            "seed": args.seed, "wall_s": wall, "study_s": study["wall_s"], "complete": n_complete,
            "baselines": study["n_baselines"], "replay_s": replay_s, "positions_per_s": positions / replay_s,
            "has_gain": bool(result.has_gain), "chosen_trial": result.operating_point.chosen.number,
        }  # fmt: skip
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(figures, handle, indent=2)
    return 0 if wall <= args.target_s else 1


if __name__ == "__main__":
    sys.exit(main())
