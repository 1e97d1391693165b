"""Replay fidelity with fewer arms: the same probe and closed loops, replay reading subsets of the arms.

    .venv/bin/python benchmarks/investigations/fidelity_arms.py runs/fid6-dense \
        --arm-sets 0,32,64,128,256,512 0,16,32,64,128,256,512 0,8,16,24,32,48,64,128,256,512

A finished ``benchmarks/fidelity.py`` run probes every arm once; replay of a sparser age grid is
the same traces without some ``age:N`` arms (``ProbeTraces.with_age_grid``), so the arm grids compare
on identical targets, probes and closed loops. Prints, per arm set and policy, replay AL beside the
closed loop's, the gap and both refresh counts (docs/calibration.md, "Replay fidelity").
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rift_ada.collectors.collect import closed_results
from rift_ada.collectors.trace_io import read_probe_traces
from rift_ada.experiments.fidelity import fidelity_policies, fidelity_rows, read_fidelity_case


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="output directory of benchmarks/fidelity.py")
    parser.add_argument("--arm-sets", nargs="+", required=True, help="comma-separated arm ages, one set per argument")
    args = parser.parse_args(argv)
    case, _ = read_fidelity_case(args.run)
    policies = fidelity_policies(case, json.loads((args.run / "gate.json").read_text()))
    traces = read_probe_traces(args.run / "probe")
    closed = closed_results(args.run / "closed")
    print(f"{args.run}: {case}")
    print(f"{'arm ages':<34} {'policy':<13} {'replay AL':>14} {'closed AL':>10} {'gap':>8} {'refreshes':>14}")
    for arm_set in args.arm_sets:
        subset = traces.with_age_grid([int(x) for x in arm_set.split(",")])
        for row in fidelity_rows(subset, closed, policies, case):
            print(
                f"{arm_set:<34} {row['policy']:<13} {row['replay_al']:>7.3f} ± {row['replay_al_std']:.3f} "
                f"{row['closed_al']:>10.3f} {100 * row['al_gap']:>+7.2f}% "
                f"{row['replay_refreshes']:>6.1f} / {row['closed_refreshes']:<6.0f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
