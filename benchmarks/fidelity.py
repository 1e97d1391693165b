"""Replay vs closed-loop fidelity on the embedded SmolLM2-135M (KV self-speculation).

    .venv/bin/python benchmarks/fidelity.py --out runs/fidelity-T0 --requests 6 --tokens 512 --temp 0
    .venv/bin/python benchmarks/fidelity.py --out runs/fidelity-T1 --requests 6 --tokens 512 --temp 1
    .venv/bin/python benchmarks/fidelity.py --quick    # a tiny random llama, 2 x 32 tokens, a temporary --out (a test)

Prints, per policy (stat, periodic, a gate controller), replay AL (T > 0: mean and spread over
seeded replicas) beside the closed-loop AL (T > 0: free-running rejection sampling) and both
refresh counts. Figures are recorded in docs/calibration.md ("Replay fidelity").
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from rift_ada.experiments.fidelity import FidelityCase, measure_fidelity
from rift_ada.memory import cap_heap_growth

sys.path.insert(0, str(Path(__file__).parent))
from _quick import model_or_tiny, out_or_temporary  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="run directory (required unless --quick: a temporary one)")
    parser.add_argument("--requests", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--budget", type=int, default=256)
    parser.add_argument("--temp", type=float, default=0.0)
    parser.add_argument("--periodic", default="64", help="periodic intervals, comma separated")
    parser.add_argument("--arm-ages", default="0,32,64,128,256,512")
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default=None, help="preset or local model directory (default: smollm2-135m)")
    parser.add_argument("--dtype", default=None, help="model dtype (default: the loader's, float32 on the CPU)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a tiny random llama (unless --model), 2 requests x 32 tokens, B = 64, arms 0,16,32, periodic 16",
    )
    parser.add_argument("--json", help="also write the rows to this JSON file (the run has them in fidelity.json)")
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.tokens, args.budget, args.arm_ages = 2, 32, 64, "0,16,32"
        args.periodic, args.replicas = "16", 2
    elif args.out is None:
        parser.error("--out is required")
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
        dtype=args.dtype,
    )
    started = time.monotonic()
    model_name = args.model or (None if args.quick else "smollm2-135m")
    with model_or_tiny(model_name) as model, out_or_temporary(args.out) as out:
        rows = measure_fidelity(out, case, model=model)
    header = ("policy", "replay AL", "closed AL", "gap", "replay ref", "closed ref")
    print(f"{case}\n{header[0]:<14} {header[1]:>16} {header[2]:>10} {header[3]:>7} {header[4]:>11} {header[5]:>11}")
    for row in rows:
        replay_al = f"{row['replay_al']:.3f} ± {row['replay_al_std']:.3f}"
        print(
            f"{row['policy']:<14} {replay_al:>16} {row['closed_al']:>10.3f} {100 * row['al_gap']:>+6.2f}% "
            f"{row['replay_refreshes']:>11.1f} {row['closed_refreshes']:>11.1f}"
        )
    print(f"wall {time.monotonic() - started:.0f} s")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"case": case.__dict__, "rows": rows}, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
