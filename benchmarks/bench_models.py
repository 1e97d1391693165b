"""Closed-loop tokens/s of the embedded models side by side, at the same batch, ISL and budget.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_models.py --requests 4 --batch 4 --tokens 48 --isl 512
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_models.py --quick    # tiny random llama, 2 x 8 tokens (a test)

Per model, in one process: the same number of embedded prompts built for the ``--isl`` bucket
(0.85-1 x ISL tokens in each model's own tokenizer), greedy target responses, then the
teacher-forced closed loop (RIFT-stat at B, periodic refresh every ``--refresh`` tokens, K = 11)
of all requests in batches of ``--batch``, timed with its prefills. Models run one after the
other, SmolLM2 first; the load average is printed around each, since the machine is shared
(compare the ratio, measured minutes apart, with that in mind).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch


def measure(preset: str, args: argparse.Namespace) -> dict[str, float]:
    from rift_ada.budget import make_policy
    from rift_ada.collectors.datasets import build_embedded_dataset, encode_prompt
    from rift_ada.collectors.targets.generate import ResponseRequest, generate_responses
    from rift_ada.models import load_model, resolve_preset
    from rift_ada.speculative import BatchRequest, PeriodicRefresh, speculative_generate_batch

    model, tokenizer = load_model(resolve_preset(preset).draft)
    dataset = build_embedded_dataset(tokenizer, n_requests=args.requests, isl_buckets=[args.isl], seed=args.seed)
    prompts = [encode_prompt(tokenizer, request.prompt_messages) for request in dataset]
    asks = [ResponseRequest(prompt, args.tokens, args.seed + i) for i, prompt in enumerate(prompts)]
    responses = generate_responses(model, asks)
    policy = make_policy("rift-stat", budget=args.budget)
    requests = [
        BatchRequest(prompt, policy, seed=args.seed + i, refresh_hook=PeriodicRefresh(args.refresh), forced_tokens=r)
        for i, (prompt, r) in enumerate(zip(prompts, responses, strict=True))
    ]
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    results = speculative_generate_batch(model, requests, max_batch=args.batch)
    seconds = time.perf_counter() - start
    tokens = sum(len(result.tokens) for result in results)
    return {
        "tokens_per_s": tokens / seconds,
        "seconds": seconds,
        "mean_al": sum(result.acceptance_length for result in results) / len(results),
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
        "isl": sum(map(len, prompts)) / len(prompts),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--models", default=None, help="presets or local model directories (default: smollm2-135m,gemma3-270m)"
    )
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--isl", type=int, default=512)
    parser.add_argument("--budget", type=int, default=128)
    parser.add_argument("--refresh", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--quick", action="store_true", help="a tiny random llama (unless --models), 2 requests x 8 tokens, ISL 256"
    )
    parser.add_argument("--json", help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.batch, args.tokens, args.isl, args.budget, args.refresh = 2, 2, 8, 256, 64, 4
    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(Path(__file__).parent))
    from _quick import model_or_tiny

    with model_or_tiny(args.models or (None if args.quick else "smollm2-135m,gemma3-270m")) as models:
        measured = {preset: measure(preset, args) for preset in models.split(",")}
    first = next(iter(measured.values()))
    print(
        f"closed loop, {args.requests} requests in batches of {args.batch}, {args.tokens} output tokens, "
        f"ISL bucket {args.isl}, rift-stat B = {args.budget}, periodic:{args.refresh}, {args.threads} thread(s)"
    )
    for preset, row in measured.items():
        print(
            f"  {preset}: {row['tokens_per_s']:.2f} tok/s ({row['seconds']:.1f} s, mean AL {row['mean_al']:.2f}, "
            f"mean ISL {row['isl']:.0f}, load {row['load_before']:.1f} -> {row['load_after']:.1f}), "
            f"{row['tokens_per_s'] / first['tokens_per_s']:.2f}x the first"
        )
    if args.json:
        settings = {key: value for key, value in vars(args).items() if key not in ("json", "quick")}
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"settings": settings, "models": measured}, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
