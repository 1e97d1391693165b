"""Draft decode step at a long context: budgeted cache vs full cache, and the cost of one refresh.

    .venv/bin/python benchmarks/bench_draft_step.py            # SmolLM2-135M, 4,096-token context, B = 256
    .venv/bin/python benchmarks/bench_draft_step.py --quick    # a tiny random llama, 1,024-token context (a test)
    .venv/bin/python benchmarks/bench_draft_step.py --profile  # also: torch.profiler top ops per variant

One draft step = one forward of one token (`rift_ada.speculative.forward_tokens`, as in the draft loop)
through the model with its cache. Variants, measured side by side (interleaved step by step, the
same token at the same position every time, the cache restored to the same state after each step):

- ``budgeted``: `make_draft_cache(model, make_policy("rift-stat", budget=B))` (SnapKV selection +
  window, fused attention over the B-position working set);
- ``full``: `make_draft_cache(model, make_policy("full"))` (the same BudgetedLayer storage, full
  attention);
- ``plain``: `transformers.DynamicCache(config=model.config)` (what the target uses; grows by
  `torch.cat`, so every step copies the stored KV);
- ``floor``: the budgeted cache at the smallest budget a scored policy allows (B = obs_window), so
  its attention costs next to nothing: floor / full is the lowest budgeted / full ratio any budget
  (or any cheaper gather) can reach for this model on this machine.

``refresh`` = one `BudgetedCache.refresh()` on the budgeted cache (SnapKV rescoring of every stored
position with the last ``obs_window`` = 64 queries, in every layer), interleaved with the steps.
Figures are recorded in docs/performance.md ("Draft step").
Torch runs on 1 thread by default (``--threads 0``: torch's default), because on a shared 2-core
machine a second OpenMP thread stalls every parallel op whenever another process runs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

DELTAS = (16, 64, 128, 768)


def context_tokens(tokenizer: Any, length: int) -> list[int]:
    """``length`` + 2 token ids: the embedded:small prompts, concatenated (repeated if too short)."""
    from rift_ada.collectors.datasets import encode_prompt, load_dataset

    text: list[int] = []
    for request in load_dataset("embedded:small", tokenizer):
        text.extend(encode_prompt(tokenizer, request.prompt_messages))
    if not text:
        raise SystemExit("embedded:small gave no prompt tokens")
    while len(text) < length + 2:
        text = text + text
    return text[: length + 2]


class Variant:
    """A cache prefilled with the context plus one decoded token; ``step`` times one more token."""

    def __init__(self, name: str, model: Any, cache: Any, tokens: list[int], length: int):
        from rift_ada.speculative import forward_tokens

        self.name, self.model, self.cache = name, model, cache
        self._forward = forward_tokens
        start = time.perf_counter()
        forward_tokens(model, tokens[:length], cache, 0)
        self.prefill_s = time.perf_counter() - start
        # One decode step after the prefill: a budgeted cache makes its selection here.
        forward_tokens(model, [tokens[length]], cache, length)
        self.length = length + 1
        self.token = tokens[length + 1]
        self.state = cache.snapshot() if hasattr(cache, "restore") else None
        self.times: list[float] = []  # wall seconds per step
        self.cpu_times: list[float] = []  # process CPU seconds per step
        self.logits: torch.Tensor | None = None

    def reset(self) -> None:
        if self.state is not None:
            self.cache.restore(self.state)
        else:
            self.cache.crop(self.length - self.cache.get_seq_length())  # negative: tokens to drop

    def step(self) -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        logits = self._forward(self.model, [self.token], self.cache, self.length)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        self.reset()
        self.logits = logits
        self.times.append(wall)
        self.cpu_times.append(cpu)
        return wall, cpu


def time_refresh(variant: Variant) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    variant.cache.refresh()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    variant.reset()  # back to the prefill selection, so every step sees the same working set
    return wall, cpu


def profile(variants: list[Variant], refresh_of: Variant | None, steps: int, rows: int) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    jobs: list[tuple[str, Callable[[], Any]]] = [(v.name, v.step) for v in variants]
    if refresh_of is not None:
        jobs.append(("refresh", lambda: time_refresh(refresh_of)))
    for name, job in jobs:
        job()  # warm
        count = 1 if name == "refresh" else steps
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(count):
                job()
        print(f"\n--- profile: {name} ({count} call(s)), top {rows} ops by self CPU time ---")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _iqr(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return (values[0], values[0]) if values else (float("nan"), float("nan"))
    q1, _, q3 = statistics.quantiles(values, n=4)
    return q1, q3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default=None, help="preset or local model directory (default: smollm2-135m)")
    parser.add_argument("--context", type=int, default=4096, help="prefilled context length (tokens)")
    parser.add_argument("--budget", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (medians are over all samples)")
    parser.add_argument("--steps", type=int, default=20, help="steps per variant per round")
    parser.add_argument("--refreshes", type=int, default=4, help="refreshes per round")
    parser.add_argument("--no-plain", action="store_true", help="skip the plain DynamicCache variant")
    parser.add_argument("--no-floor", action="store_true", help="skip the floor variant (B = obs_window)")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1: on a shared 2-core machine two OpenMP threads stall at "
        "every parallel op; 0 = torch's default)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default=None, help="model dtype (float32 default on CPU, bfloat16, float16)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a tiny random llama (unless --preset), 1,024-token context, 3 rounds x 8 steps, 2 refreshes",
    )
    parser.add_argument("--profile", action="store_true", help="print torch.profiler tables per variant")
    parser.add_argument("--profile-steps", type=int, default=10)
    parser.add_argument("--json", help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    if args.quick:
        args.context, args.rounds, args.steps, args.refreshes = 1024, 3, 8, 2
    sys.path.insert(0, str(Path(__file__).parent))
    from _quick import model_or_tiny

    with model_or_tiny(args.preset or (None if args.quick else "smollm2-135m")) as args.preset:
        return _run(args)


def _run(args: argparse.Namespace) -> int:

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    load_before = os.getloadavg()

    from rift_ada.budget import make_policy
    from rift_ada.cache import make_draft_cache
    from rift_ada.models import load_model, resolve_preset

    start = time.perf_counter()
    model, tokenizer = load_model(resolve_preset(args.preset).draft, dtype=args.dtype)
    model.eval()
    load_s = time.perf_counter() - start
    tokens = context_tokens(tokenizer, args.context)
    policy = make_policy("rift-stat", budget=args.budget)

    with torch.no_grad():
        budgeted = Variant("budgeted", model, make_draft_cache(model, policy), tokens, args.context)
        full = Variant("full", model, make_draft_cache(model, make_policy("full")), tokens, args.context)
        variants = [budgeted, full]
        if not args.no_plain:
            from transformers import DynamicCache

            variants.append(Variant("plain", model, DynamicCache(config=model.config), tokens, args.context))
        if not args.no_floor:
            smallest = make_policy("rift-stat", budget=policy.obs_window)
            variants.append(Variant("floor", model, make_draft_cache(model, smallest), tokens, args.context))
        for variant in variants:  # warm-up, not recorded
            variant.step()
            variant.times.clear()
            variant.cpu_times.clear()
        time_refresh(budgeted)
        refresh_wall: list[float] = []
        refresh_cpu: list[float] = []
        round_ratios: dict[str, list[float]] = {"wall": [], "cpu": []}
        every = max(1, args.steps // max(1, args.refreshes))
        for round_index in range(args.rounds):
            mark = len(budgeted.times)
            order = variants if round_index % 2 == 0 else variants[::-1]
            for step in range(args.steps):
                for variant in order:
                    variant.step()
                if args.refreshes and step % every == 0 and step // every < args.refreshes:
                    wall, cpu = time_refresh(budgeted)
                    refresh_wall.append(wall)
                    refresh_cpu.append(cpu)
            round_ratios["wall"].append(_median(budgeted.times[mark:]) / _median(full.times[mark:]))
            round_ratios["cpu"].append(_median(budgeted.cpu_times[mark:]) / _median(full.cpu_times[mark:]))
        top = {v.name: int(v.logits[-1].argmax()) for v in variants}
    load_after = os.getloadavg()

    clocks = {
        "wall": ({v.name: _median(v.times) for v in variants}, _median(refresh_wall)),
        "cpu": ({v.name: _median(v.cpu_times) for v in variants}, _median(refresh_cpu)),
    }
    layer = budgeted.cache.budgeted_layers[0]
    config = model.config
    print(
        f"draft step: {args.preset} ({config.num_hidden_layers} layers, {config.num_attention_heads} heads / "
        f"{config.num_key_value_heads} KV heads), context {budgeted.length} tokens, B = {args.budget} "
        f"(k = {layer.capacity} selected + r = {layer.window} window), obs_window = {policy.obs_window}"
    )
    print(
        f"  torch {torch.__version__}, {model.dtype}, {torch.get_num_threads()} thread(s), {os.cpu_count()} CPUs, "
        f"load average {load_before[0]:.1f} before / {load_after[0]:.1f} after"
    )
    print(
        f"  model load {load_s:.1f} s; prefill of {args.context} tokens (wall): "
        + ", ".join(f"{v.name} {v.prefill_s:.1f} s" for v in variants)
    )
    print(
        f"  {args.rounds} rounds x {args.steps} steps per variant, interleaved ({len(budgeted.times)} samples each), "
        f"{len(refresh_wall)} refreshes; medians (IQR) in ms:"
    )
    print(f"  {'':<16} {'wall':>22} {'CPU (process)':>24}")
    rows = [(f"{v.name} step", v.times, v.cpu_times) for v in variants]
    rows.append(("refresh", refresh_wall, refresh_cpu))
    for name, wall_times, cpu_times in rows:
        cells = []
        for values in (wall_times, cpu_times):
            q1, q3 = _iqr(values)
            cells.append(f"{1000 * _median(values):8.2f} ({1000 * q1:.1f}-{1000 * q3:.1f})")
        print(f"  {name:<16} {cells[0]:>22} {cells[1]:>24}")
    figures: dict[str, Any] = {}
    for clock, (medians, refresh) in clocks.items():
        ratio = medians["budgeted"] / medians["full"]
        spread = round_ratios[clock]
        verdict = "ok" if ratio <= 0.6 else "above goal"
        print(
            f"  [{clock}] budgeted / full step {ratio:.3f} (goal <= 0.6: {verdict}; per round "
            f"{min(spread):.3f}-{max(spread):.3f})"
            + (
                f"; budgeted / plain {medians['budgeted'] / medians['plain']:.3f}; "
                f"full / plain {medians['full'] / medians['plain']:.3f}"
                if "plain" in medians
                else ""
            )
        )
        if "floor" in medians:
            floor = medians["floor"] / medians["full"]
            print(
                f"  [{clock}] floor (B = {policy.obs_window}) / full step {floor:.3f}: no budget goes below this "
                f"here ({'the 0.6 goal is within reach' if floor <= 0.6 else 'the 0.6 goal is out of reach'})"
            )
        overhead = {delta: refresh / (delta * medians["budgeted"]) for delta in DELTAS}
        print(
            f"  [{clock}] refresh / budgeted step {refresh / medians['budgeted']:.2f}x; overhead per token "
            "refresh / (delta x step): "
            + ", ".join(f"delta={delta} {100 * value:.2f} %" for delta, value in overhead.items())
            + " (paper: 0.1-6 %)"
        )
        figures[clock] = {
            "step_median_s": medians,
            "refresh_median_s": refresh,
            "budgeted_over_full": ratio,
            "round_ratios": spread,
            "refresh_over_step": refresh / medians["budgeted"],
            "refresh_overhead_per_token": {str(delta): value for delta, value in overhead.items()},
        }
        if "floor" in medians:
            figures[clock]["floor_over_full"] = medians["floor"] / medians["full"]
    print("  next-token argmax: " + ", ".join(f"{name} {token}" for name, token in top.items()))

    if args.profile:
        with torch.no_grad():
            profile(variants, budgeted, args.profile_steps, rows=18)

    if args.json:
        figures.update(
            {
                "preset": args.preset,
                "context": budgeted.length,
                "budget": args.budget,
                "threads": torch.get_num_threads(),
                "load_average": [load_before[0], load_after[0]],
                "samples_wall_s": {v.name: v.times for v in variants},
                "samples_cpu_s": {v.name: v.cpu_times for v in variants},
                "refresh_wall_s": refresh_wall,
                "refresh_cpu_s": refresh_cpu,
                "prefill_s": {v.name: v.prefill_s for v in variants},
            }
        )
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(figures, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
