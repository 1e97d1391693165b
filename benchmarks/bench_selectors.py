"""Scoring time of one refresh per selector, relative to SnapKV (SmolLM2-135M, all 30 layers).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_selectors.py            # 2,048-token context
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_selectors.py --quick    # tiny random llama, 512 tokens (a test)

One prefill per scorer with a RIFT-stat cache (B = 256, rho = 0.5); then, per repeat, ``--new``
new tokens (different ones each repeat, at the same positions: the cache is rolled back first)
are fed untimed and ``cache.refresh()`` is timed (every full-attention layer rescored from its
stored KV and latest 64 queries), the scorers interleaved round by round so a change in machine
load hits each alike. Figures are
recorded in docs/performance.md ("Selectors").
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from rift_ada.budget import make_policy
from rift_ada.cache import make_draft_cache
from rift_ada.models import load_model, resolve_preset
from rift_ada.scorers.registry import SCORER_NAMES


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--budget", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--new", type=int, default=16, help="tokens fed between refreshes (untimed)")
    parser.add_argument("--model", default=None, help="preset or local model directory (default: smollm2-135m)")
    parser.add_argument(
        "--quick", action="store_true", help="a tiny random llama (unless --model), 512-token context, 3 repeats"
    )
    parser.add_argument("--json", help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    if args.quick:
        args.context, args.repeats = 512, 3
    sys.path.insert(0, str(Path(__file__).parent))
    from _quick import model_or_tiny

    with model_or_tiny(args.model or (None if args.quick else "smollm2-135m")) as args.model:
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    torch.set_num_threads(1)
    model, _ = load_model(resolve_preset(args.model).draft)
    tokens = (torch.arange(100, 100 + args.context)[None] * 7919) % model.config.vocab_size
    caches, states = {}, {}
    new_positions = torch.arange(args.context, args.context + args.new)[None]
    with torch.no_grad():
        for name in SCORER_NAMES:
            cache = caches[name] = make_draft_cache(model, make_policy("rift-stat", budget=args.budget, scorer=name))
            model(input_ids=tokens, cache=cache, use_cache=True)
            cache.refresh()  # warm-up (and the lazily made first selection)
            states[name] = cache.snapshot()
        times: dict[str, list[float]] = {name: [] for name in SCORER_NAMES}
        for repeat in range(args.repeats):
            new_tokens = (tokens[:, : args.new] + 31 * (repeat + 1)) % model.config.vocab_size
            for name, cache in caches.items():
                cache.restore(states[name])
                model(input_ids=new_tokens, position_ids=new_positions, cache=cache, use_cache=True)
                start = time.perf_counter()
                cache.refresh()
                times[name].append(time.perf_counter() - start)
    medians = {name: 1000 * statistics.median(values) for name, values in times.items()}
    base = medians["snapkv"]
    print(
        f"{args.model}, {args.context}-token context, B = {args.budget}, one refresh "
        f"({model.config.num_hidden_layers} layers) after "
        f"{args.new} new tokens, median of {args.repeats}, 1 thread"
    )
    print(f"{'scorer':<20} {'ms / refresh':>12} {'x SnapKV':>9}")
    for name, value in medians.items():
        print(f"{name:<20} {value:>12.1f} {value / base:>9.2f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(
                {"context": args.context, "budget": args.budget, "repeats": args.repeats, "refresh_ms": medians},
                handle,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
