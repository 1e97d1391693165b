"""Replay vs closed-loop fidelity on the embedded SmolLM2-135M (KV self-speculation).

    .venv/bin/python benchmarks/fidelity.py --out runs/fidelity-T0 --requests 6 --tokens 512 --temp 0
    .venv/bin/python benchmarks/fidelity.py --out runs/fidelity-T1 --requests 6 --tokens 512 --temp 1

Prints, per policy (stat, periodic, a gate controller), replay AL (T > 0: mean and spread over
seeded replicas) beside the closed-loop AL (T > 0: free-running rejection sampling) and both
refresh counts. Figures are recorded in docs/calibration.md ("Replay fidelity").
"""

from __future__ import annotations

import argparse
import time

from rift_ada.calibrate.fidelity import FidelityCase, measure_fidelity
from rift_ada.memory import cap_heap_growth


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--requests", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--budget", type=int, default=256)
    parser.add_argument("--temp", type=float, default=0.0)
    parser.add_argument("--periodic", default="64", help="periodic intervals, comma separated")
    parser.add_argument("--arm-ages", default="0,32,64,128,256,512")
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    cap_heap_growth()  # as the CLI does (rift_ada/memory.py)
    case = FidelityCase(
        n_requests=args.requests,
        output_tokens=args.tokens,
        budget=args.budget,
        temperature=args.temp,
        periodic=tuple(int(x) for x in args.periodic.split(",")),
        arm_ages=tuple(int(x) for x in args.arm_ages.split(",")),
        replicas=args.replicas,
        seed=args.seed,
    )
    started = time.monotonic()
    rows = measure_fidelity(args.out, case)
    header = ("policy", "replay AL", "closed AL", "gap", "replay ref", "closed ref")
    print(f"{case}\n{header[0]:<14} {header[1]:>16} {header[2]:>10} {header[3]:>7} {header[4]:>11} {header[5]:>11}")
    for row in rows:
        replay_al = f"{row['replay_al']:.3f} ± {row['replay_al_std']:.3f}"
        print(
            f"{row['policy']:<14} {replay_al:>16} {row['closed_al']:>10.3f} {100 * row['al_gap']:>+6.2f}% "
            f"{row['replay_refreshes']:>11.1f} {row['closed_refreshes']:>11.1f}"
        )
    print(f"wall {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
