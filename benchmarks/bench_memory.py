"""Peak RSS and wall time of one probe, with glibc's default malloc and with `cap_heap_growth`.

    .venv/bin/python benchmarks/bench_memory.py                 # 1,000-token prompt, 400 tokens, 6 age arms
    .venv/bin/python benchmarks/bench_memory.py --tokens 128    # quicker
    .venv/bin/python benchmarks/bench_memory.py --quick         # tiny random llama, 128 + 24 tokens (a test)

Each variant runs in its own child process (malloc settings are per process and a peak RSS
only grows), one after the other: `probe_request` on SmolLM2-135M, rift-stat B = 256, T = 0,
over synthetic token ids (the heap's behaviour does not depend on the text). Prints wall time
and peak RSS of each and their ratios. Figures: docs/performance.md ("Memory").
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path


def _child(args: argparse.Namespace) -> None:
    import torch

    from rift_ada.memory import cap_heap_growth

    capped = cap_heap_growth() if args.child == "capped" else False
    torch.set_num_threads(args.threads)
    from rift_ada.budget import make_policy
    from rift_ada.collectors.pipeline import load_pair
    from rift_ada.collectors.probe import probe_request

    model = load_pair(args.model).draft
    prompt = list(range(100, 100 + args.isl))
    response = list(range(2000, 2000 + args.tokens))
    started = time.perf_counter()
    probe_request(model, prompt, response, policy=make_policy("rift-stat", budget=args.budget), arm_ages=args.arm_ages)
    wall = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # kB -> GB
    print(json.dumps({"variant": args.child, "capped": capped, "wall_s": wall, "peak_rss_gb": peak}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--isl", type=int, default=1000)
    parser.add_argument("--tokens", type=int, default=400)
    parser.add_argument("--budget", type=int, default=256)
    parser.add_argument(
        "--arm-ages", type=lambda text: tuple(int(x) for x in text.split(",")), default=(0, 16, 32, 64, 128, 256)
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default=None, help="preset or local model directory (default: smollm2-135m)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a tiny random llama (unless --model), ISL 128, B = 64, 24 tokens, arms 0,8,16",
    )
    parser.add_argument("--json", help="also write the figures to this JSON file")
    parser.add_argument("--child", choices=["default", "capped"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args)
        return 0
    if args.quick:
        args.isl, args.tokens, args.budget, args.arm_ages, args.threads = 128, 24, 64, (0, 8, 16), 1
    sys.path.insert(0, str(Path(__file__).parent))
    from _quick import model_or_tiny

    results = {}
    with model_or_tiny(args.model or (None if args.quick else "smollm2-135m")) as model:
        for variant in ("default", "capped"):
            command = [sys.executable, __file__, "--child", variant, "--isl", str(args.isl),
                       "--tokens", str(args.tokens), "--budget", str(args.budget),
                       "--arm-ages", ",".join(map(str, args.arm_ages)), "--threads", str(args.threads),
                       "--model", model]  # fmt: skip
            output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            results[variant] = json.loads(output.strip().splitlines()[-1])
            row = results[variant]
            print(f"{variant:>8}: wall {row['wall_s']:.1f} s, peak RSS {row['peak_rss_gb']:.2f} GB")
    default, capped = results["default"], results["capped"]
    wall = capped["wall_s"] / default["wall_s"]
    rss = capped["peak_rss_gb"] / default["peak_rss_gb"]
    print(
        f"probe of {args.tokens} tokens after {args.isl} prompt tokens, arms {list(args.arm_ages)}, "
        f"{args.threads} thread(s): capped / default wall {wall:.2f}, peak RSS {rss:.2f}"
    )
    if args.json:
        figures = {"isl": args.isl, "tokens": args.tokens, "budget": args.budget, "arm_ages": list(args.arm_ages),
                   "threads": args.threads, "variants": results, "wall_ratio": wall, "rss_ratio": rss}  # fmt: skip
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(figures, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
