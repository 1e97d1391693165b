"""Probe time side by side: an earlier ``collectors/probe.py`` vs the current one, interleaved.

    git show a53ea1a:collectors/probe.py > /tmp/probe_before.py
    .venv/bin/python benchmarks/compare_probe.py --before /tmp/probe_before.py                 # 1 x 256 tokens
    .venv/bin/python benchmarks/compare_probe.py --before /tmp/probe_before.py --osl 128 512   # several lengths
    .venv/bin/python benchmarks/compare_probe.py --quick    # the current probe against itself, tiny llama (a test)

SmolLM2-135M, embedded prompts of the 1K ISL bucket, each with its greedy response of ``--osl``
tokens (EOS suppressed), generated once. Both versions probe the same request with the default
arms at B = 256, alternating which goes first; the best of ``--repeats`` wall times is kept. The
two results are compared array for array: identical, or the largest difference, which must stay
below ``--tolerance`` (else the script exits 1), so a speed-up never comes from probing something
else. (A batched forward's rows can differ in the last bits with the batch's size, and the probe
runs as many rows as the response has arms that can refresh.)
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from compare_replay import load_module  # noqa: E402


def largest_difference(a: object, b: object) -> float:
    """Largest absolute difference between the arrays of two ProbeResults (NaN where NaN; inf if
    their shapes, NaN patterns or other fields differ)."""
    largest = 0.0
    for name, value in vars(a).items():
        other = getattr(b, name)
        if not isinstance(value, np.ndarray):
            if value != other:
                return float("inf")
            continue
        if value.shape != other.shape or not np.array_equal(np.isnan(value), np.isnan(other)):
            return float("inf")
        finite = ~np.isnan(value)
        if finite.any():
            largest = max(largest, float(np.max(np.abs(value[finite] - other[finite]))))
    return largest


def time_shares(job: object) -> dict[str, float]:
    """Seconds of one call under cProfile, and of its rescoring and model forwards within it."""
    profile = cProfile.Profile()
    profile.runcall(job)
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    shares = {"total": 0.0, "rescoring": 0.0, "forwards": 0.0}
    for (filename, _, function), (_, _, _, cumulative, _) in stats.items():
        if function == "probe_request":
            shares["total"] = max(shares["total"], cumulative)
        elif function == "compute_selection" and filename.endswith("cache.py"):
            shares["rescoring"] += cumulative
        elif function == "_forward" and "probe" in filename:
            shares["forwards"] += cumulative
    return shares


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="an earlier collectors/probe.py (--quick: the current one)")
    parser.add_argument("--osl", type=int, nargs="+", default=[256], help="response lengths (tokens)")
    parser.add_argument("--requests", type=int, default=1, help="prompts per response length")
    parser.add_argument("--budget", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0: torch's default)")
    parser.add_argument("--tolerance", type=float, default=1e-5, help="largest difference allowed between results")
    parser.add_argument(
        "--profile", action="store_true", help="also profile one probe of each: time in rescoring and in forwards"
    )
    parser.add_argument("--model", default=None, help="preset or local model directory (default: smollm2-135m)")
    parser.add_argument(
        "--quick", action="store_true", help="a tiny random llama (unless --model), 16 tokens, 2 repeats, B = 64"
    )
    parser.add_argument("--json", help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    if args.quick:
        args.osl, args.requests, args.repeats, args.budget = [16], 1, 2, 64
        args.before = args.before or str(Path(__file__).resolve().parent.parent / "collectors" / "probe.py")
    elif args.before is None:
        parser.error("--before is required (an earlier collectors/probe.py)")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    from _quick import model_or_tiny

    with model_or_tiny(args.model or (None if args.quick else "smollm2-135m")) as model:
        rows = compare(args, model)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"model": model, "budget": args.budget, "tolerance": args.tolerance, "rows": rows}, handle,
                      indent=2)  # fmt: skip
    return 0 if all(row["difference"] <= args.tolerance for row in rows) else 1


def compare(args: argparse.Namespace, model_name: str) -> list[dict[str, object]]:
    """Per response length and request: both versions' best wall times and their results' largest difference."""

    from rift_ada.budget import make_policy
    from rift_ada.collectors import probe as current
    from rift_ada.collectors.datasets import encode_prompt, load_dataset
    from rift_ada.collectors.targets.generate import generate_response
    from rift_ada.memory import cap_heap_growth
    from rift_ada.models import load_model, resolve_preset

    cap_heap_growth()
    before = load_module("probe_before", args.before)
    model, tokenizer = load_model(resolve_preset(model_name).draft)
    requests = [r for r in load_dataset("embedded:small", tokenizer) if r.isl_bucket == 1024][: args.requests]
    policy = make_policy("rift-stat", budget=args.budget)
    eos = getattr(tokenizer, "eos_token_id", None)
    load = os.getloadavg()[0]
    print(f"{model_name}, B = {args.budget}, {torch.get_num_threads()} thread(s), load average {load:.1f} before")
    rows: list[dict[str, object]] = []
    with torch.no_grad():
        for osl in args.osl:
            for index, request in enumerate(requests):
                prompt = encode_prompt(tokenizer, request.prompt_messages)
                response = generate_response(
                    model, prompt, max_new_tokens=osl, min_new_tokens=osl, eos_token_id=eos, seed=index
                )
                times: dict[str, list[float]] = {"before": [], "now": []}
                results: dict[str, object] = {}
                for repeat in range(args.repeats):
                    order = ("before", "now") if repeat % 2 == 0 else ("now", "before")
                    for name in order:
                        module = before if name == "before" else current
                        start = time.perf_counter()
                        results[name] = module.probe_request(model, prompt, response, policy=policy)
                        times[name].append(time.perf_counter() - start)
                difference = largest_difference(results["before"], results["now"])
                shown = "identical" if difference == 0 else f"differ by at most {difference:.1e}"
                best_before, best_now = min(times["before"]), min(times["now"])
                print(
                    f"{request.request_id}: ISL {len(prompt)}, {len(response)} tokens, "
                    f"{len(results['now'].arms)} arms: before {best_before:6.1f} s  now {best_now:6.1f} s  "
                    f"now/before time {best_now / best_before:4.2f}  speed-up {best_before / best_now:4.2f}x  "
                    f"results {shown}{'' if difference <= args.tolerance else ' (OVER THE TOLERANCE)'}",
                    flush=True,
                )
                rows.append(
                    {
                        "request": request.request_id, "isl": len(prompt), "tokens": len(response),
                        "arms": len(results["now"].arms), "before_s": best_before, "now_s": best_now,
                        "difference": difference,
                    }
                )  # fmt: skip
                if args.profile:
                    for name, module in (("before", before), ("now", current)):
                        shares = time_shares(
                            lambda module=module, prompt=prompt, response=response: module.probe_request(
                                model, prompt, response, policy=policy
                            )
                        )
                        total = shares["total"]
                        print(
                            f"  {name} under cProfile: {total:.1f} s, rescoring {shares['rescoring']:.1f} s "
                            f"({shares['rescoring'] / total:.0%}), forwards {shares['forwards']:.1f} s "
                            f"({shares['forwards'] / total:.0%})",
                            flush=True,
                        )
    return rows


if __name__ == "__main__":
    sys.exit(main())
