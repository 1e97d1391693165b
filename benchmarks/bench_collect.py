"""Collection throughput: a probe of all arms vs one closed-loop policy run, on the same request.

    .venv/bin/python benchmarks/bench_collect.py            # SmolLM2-135M, 1 embedded prompt (~1K ISL), 128 tokens
    .venv/bin/python benchmarks/bench_collect.py --quick    # a tiny random llama, 32 output tokens, 2 repeats (a test)
    .venv/bin/python benchmarks/bench_collect.py --requests 2 --osl 256 --repeats 5

For each request the target response is generated once, greedily, with a plain full-KV cache
(`collectors.targets.generate_response`, EOS suppressed for ``--osl`` tokens). Then, interleaved and
alternating the order every repeat, on the same prompt and response:

- ``probe``: `probe_request(model, prompt, response, policy=make_policy("rift-stat", budget=B))`, the
  default arms (``DEFAULT_ARM_AGES``, ``stat``, ``full``: 11 since 2026-12-01, 9 in the figures recorded
  before), decision stride 8;
- ``closed``: one closed-loop draft/verify run of a single policy,
  `speculative_generate(model, prompt, policy=make_policy("rift-stat", budget=B), forced_tokens=response)`
  (KV self-speculation: the same model with a plain full-KV cache verifies; K = 11; T = 0);
- ``prefill``: one forward of the prompt into a plain cache, to say how much of each run is prefill
  (the probe prefills once, the closed loop twice: draft and target).

Output tokens/s = response tokens / wall seconds of the whole call, medians over repeats and
requests. Target: probe tok/s >= 0.5 x closed tok/s (probing every arm costs at most two closed
runs of one policy). Figures are recorded in docs/performance.md ("Collection").
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


def _timed(job: Callable[[], Any]) -> tuple[float, float, Any]:
    """(wall s, process CPU s, result) of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = job()
    return time.perf_counter() - wall, time.process_time() - cpu, result


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default=None, help="preset or local model directory (default: smollm2-135m)")
    parser.add_argument("--dataset", default="embedded:small")
    parser.add_argument("--isl", type=int, default=1024, help="take requests of this ISL bucket (0: any)")
    parser.add_argument("--requests", type=int, default=1)
    parser.add_argument("--osl", type=int, default=128, help="target response length (tokens)")
    parser.add_argument("--budget", type=int, default=256)
    parser.add_argument("--draft-length", type=int, default=11)
    parser.add_argument("--stride", type=int, default=8, help="probe decision stride")
    parser.add_argument("--repeats", type=int, default=3, help="timed (probe, closed, prefill) triples per request")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1: on a shared 2-core machine two OpenMP threads stall at "
        "every parallel op; 0 = torch's default)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--arm-ages", default=None, help="probe arm ages, comma separated (default: DEFAULT_ARM_AGES)")
    parser.add_argument(
        "--quick", action="store_true", help="a tiny random llama (unless --preset), 32 output tokens, 2 repeats"
    )
    parser.add_argument("--json", help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    if args.quick:
        args.osl, args.repeats = 32, 2
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

    from transformers import DynamicCache

    from rift_ada.budget import make_policy
    from rift_ada.collectors.datasets import encode_prompt, load_dataset
    from rift_ada.collectors.probe import probe_arms, probe_request
    from rift_ada.collectors.probe_traces import DEFAULT_ARM_AGES

    arm_ages = tuple(int(x) for x in args.arm_ages.split(",")) if args.arm_ages else DEFAULT_ARM_AGES
    from rift_ada.collectors.targets.generate import generate_response
    from rift_ada.models import load_model, resolve_preset
    from rift_ada.speculative import forward_tokens, speculative_generate

    model, tokenizer = load_model(resolve_preset(args.preset).draft)
    model.eval()
    requests = load_dataset(args.dataset, tokenizer)
    if args.isl:
        requests = [r for r in requests if r.isl_bucket == args.isl] or requests
    requests = requests[: args.requests]
    policy = make_policy("rift-stat", budget=args.budget)
    eos = getattr(tokenizer, "eos_token_id", None)

    runs: dict[str, dict[str, list[float]]] = {
        name: {"wall": [], "cpu": []} for name in ("probe", "closed", "prefill", "target")
    }
    ratios: list[float] = []
    details = []
    with torch.no_grad():
        for index, request in enumerate(requests):
            prompt = encode_prompt(tokenizer, request.prompt_messages)
            wall, cpu, response = _timed(
                lambda prompt=prompt, index=index: generate_response(
                    model,
                    prompt,
                    max_new_tokens=args.osl,
                    min_new_tokens=args.osl,
                    eos_token_id=eos,
                    seed=args.seed + index,
                )
            )
            runs["target"]["wall"].append(wall / len(response))
            runs["target"]["cpu"].append(cpu / len(response))
            n_out = len(response)

            def probe(prompt: list[int] = prompt, response: list[int] = response) -> Any:
                return probe_request(
                    model, prompt, response, policy=policy, decision_stride=args.stride, arm_ages=arm_ages
                )

            def closed(prompt: list[int] = prompt, response: list[int] = response, index: int = index) -> Any:
                return speculative_generate(
                    model,
                    prompt,
                    policy=policy,
                    draft_length=args.draft_length,
                    seed=args.seed + index,
                    forced_tokens=response,
                )

            def prefill(prompt: list[int] = prompt) -> Any:
                return forward_tokens(model, prompt[:-1], DynamicCache(config=model.config), 0)

            jobs = {"probe": probe, "closed": closed, "prefill": prefill}
            per_request: dict[str, list[float]] = {name: [] for name in jobs}
            results: dict[str, Any] = {}
            for repeat in range(args.repeats):
                order = ["probe", "closed", "prefill"] if repeat % 2 == 0 else ["closed", "probe", "prefill"]
                for name in order:
                    wall, cpu, results[name] = _timed(jobs[name])
                    per_request[name].append(wall)
                    runs[name]["wall"].append(wall)
                    runs[name]["cpu"].append(cpu)
                ratios.append(per_request["closed"][-1] / per_request["probe"][-1])
            closed_result = results["closed"]
            probe_result = results["probe"]
            details.append(
                {
                    "request_id": request.request_id,
                    "isl": len(prompt),
                    "osl": n_out,
                    "closed_al": closed_result.acceptance_length,
                    "closed_rounds": len(closed_result.rounds),
                    "probe_arms": len(probe_result.arms),
                    "probe_strides": int(probe_result.query_drift.shape[1]),
                    "probe_acceptance": {
                        arm: float(np.nanmean(probe_result.outcome[i])) for i, arm in enumerate(probe_result.arms)
                    },
                    "probe_s": per_request["probe"],
                    "closed_s": per_request["closed"],
                    "prefill_s": per_request["prefill"],
                }
            )
    load_after = os.getloadavg()

    n_tokens = statistics.mean(d["osl"] for d in details)
    print(
        f"collection: {args.preset}, {len(details)} request(s) of {args.dataset} "
        f"(ISL {', '.join(str(d['isl']) for d in details)}), response {', '.join(str(d['osl']) for d in details)} "
        f"tokens (greedy target, EOS suppressed), B = {args.budget}, T = 0"
    )
    print(
        f"  torch {torch.__version__}, {torch.get_num_threads()} thread(s), {os.cpu_count()} CPUs, "
        f"load average {load_before[0]:.1f} before / {load_after[0]:.1f} after; {args.repeats} repeats per request, "
        "order alternating"
    )
    arms = probe_arms(arm_ages)
    print(f"  probe: {len(arms)} arms ({', '.join(arms)}), stride {args.stride}; closed: K = {args.draft_length}")
    for detail in details:
        print(
            f"  {detail['request_id']}: closed AL {detail['closed_al']:.2f} over {detail['closed_rounds']} rounds; "
            f"probe {detail['probe_strides']} strides; probe acceptance stat "
            f"{detail['probe_acceptance']['stat']:.3f}, full {detail['probe_acceptance']['full']:.3f}"
        )
    print(f"  {'':<22} {'wall s':>8} {'tok/s':>8} {'CPU s':>8} {'tok/s (CPU)':>12}")
    medians: dict[str, dict[str, float]] = {}
    for name in ("probe", "closed"):
        wall, cpu = _median(runs[name]["wall"]), _median(runs[name]["cpu"])
        medians[name] = {"wall_s": wall, "cpu_s": cpu, "tok_s": n_tokens / wall, "tok_s_cpu": n_tokens / cpu}
        label = f"probe ({len(arms)} arms)" if name == "probe" else "closed (1 policy)"
        print(f"  {label:<22} {wall:8.2f} {n_tokens / wall:8.2f} {cpu:8.2f} {n_tokens / cpu:12.2f}")
    prefill_wall, prefill_cpu = _median(runs["prefill"]["wall"]), _median(runs["prefill"]["cpu"])
    print(f"  {'prompt prefill (once)':<22} {prefill_wall:8.2f} {'':>8} {prefill_cpu:8.2f}")
    target_wall = _median(runs["target"]["wall"])
    print(
        f"  reference: plain greedy decoding with a full KV (target generation) {1 / target_wall:.2f} tok/s "
        "(includes its prefill)"
    )
    ratio = medians["probe"]["tok_s"] / medians["closed"]["tok_s"]
    ratio_cpu = medians["probe"]["tok_s_cpu"] / medians["closed"]["tok_s_cpu"]
    verdict = "ok" if ratio >= 0.5 else "below target"
    print(
        f"  probe tok/s / closed tok/s = {ratio:.2f} (CPU time: {ratio_cpu:.2f}; per repeat "
        f"{min(ratios):.2f}-{max(ratios):.2f}); target >= 0.5: {verdict}"
    )
    print(f"  => probing all {len(arms)} arms costs {1 / ratio:.2f}x one closed-loop policy run (target <= 2x)")
    probe_decode = medians["probe"]["wall_s"] - prefill_wall
    closed_decode = medians["closed"]["wall_s"] - 2 * prefill_wall
    if probe_decode > 0 and closed_decode > 0:
        print(
            "  without prefill (estimate: probe - 1 prefill, closed - 2 prefills): "
            f"probe {n_tokens / probe_decode:.2f} tok/s, closed {n_tokens / closed_decode:.2f} tok/s, "
            f"probe/closed {closed_decode / probe_decode:.2f}"
        )

    if args.json:
        figures = {
            "preset": args.preset,
            "budget": args.budget,
            "threads": torch.get_num_threads(),
            "load_average": [load_before[0], load_after[0]],
            "medians": medians,
            "prefill_wall_s": prefill_wall,
            "target_tok_s": 1 / target_wall,
            "probe_over_closed_tok_s": ratio,
            "probe_over_closed_tok_s_cpu": ratio_cpu,
            "per_repeat_ratios": ratios,
            "requests": details,
        }
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(figures, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
