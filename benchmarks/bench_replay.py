"""Replay throughput (policy evaluations per second) and Controller.decide latency.

    .venv/bin/python benchmarks/bench_replay.py            # 100 requests x 4096 positions x 9 arms
    .venv/bin/python benchmarks/bench_replay.py --quick    # 10 x 512, a tiny llama's draft step (a test)
    .venv/bin/python benchmarks/bench_replay.py --temperature 1 --replicas 1 4   # T > 0: study vs confirmation

Single-policy replay steps all requests in lockstep; ``replay_many`` adds one lane per policy, so a
batch of policies (an Optuna batch, a threshold sweep, the periodic baselines) costs little more
than one. Figures are recorded in docs/performance.md ("Replay and controller").
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from rift_ada import Controller
from rift_ada.collectors.synthetic import synthetic_traces
from rift_ada.controller import make_controller_dict
from rift_ada.policies import ScorePolicy, replay_many
from rift_ada.policies.replay import DEFAULT_REPLICAS, _tables, replay
from rift_ada.policy_kinds import Gate, Group, Periodic, Rule

IDENTITY = {"name": "bench", "draft": "synthetic", "target": "synthetic"}


def policies(temperature: float, fitted: ScorePolicy) -> dict[str, list[dict[str, Any]]]:
    """Per family, a batch of 32 variants; the first (a representative setting) is timed alone too."""
    identity = {**IDENTITY, "temperature": temperature}
    intervals = [128] + [i for i in range(32, 800, 24) if i != 128][:31]
    periodic = [make_controller_dict(Periodic(interval).to_json(), **identity) for interval in intervals]
    settings = [(5.1, 1.7)] + [(a, e) for a in np.linspace(4.0, 7.0, 8) for e in (1.0, 1.3, 1.6, 1.9)][:31]
    gates = [
        Gate(
            Group(
                "any",
                (
                    Rule("acceptance", "<=", float(acceptance)),
                    Group("all", (Rule("entropy", ">=", float(entropy)), Rule("query_drift", ">=", 0.02))),
                ),
            )
        )
        for acceptance, entropy in settings
    ]
    gate = [make_controller_dict(policy.to_json(), **identity) for policy in gates]
    offsets = [0.0] + [float(x) for x in np.linspace(-0.5, 1.0, 31)]
    score = [ScorePolicy(fitted.terms, fitted.threshold + d).to_controller_dict(**identity) for d in offsets]
    return {"periodic": periodic, "gate": gate, "score": score}


def time_replay(
    traces: Any, batch: list[dict[str, Any]], repeats: int, replicas: int | None = None
) -> tuple[float, float, Any]:
    """(single-policy evaluations/s, batched evaluations/s, single result); medians over ``repeats`` runs."""
    result = replay(traces, batch[0], replicas=replicas)  # warm-up
    single_s, batch_s = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        result = replay(traces, batch[0], replicas=replicas)
        single_s.append(time.perf_counter() - start)
    for _ in range(max(1, repeats // 2)):
        start = time.perf_counter()
        replay_many(traces, batch, replicas=replicas)
        batch_s.append(time.perf_counter() - start)
    return 1.0 / statistics.median(single_s), len(batch) / statistics.median(batch_s), result


def time_decide(controller: Controller, calls: int, seed: int = 0) -> dict[str, float]:
    """Median wall time of decide (all calls, and calls that make a decision) and record_round, in µs."""
    rng = np.random.default_rng(seed)
    accepted = rng.integers(1, 13, calls).tolist()
    entropies = rng.uniform(0.2, 2.0, (calls, 11)).tolist()
    drifts = rng.uniform(0.0, 0.05, calls).tolist()
    session = controller.new_session()
    clock = time.perf_counter_ns
    decide_ns, deciding_ns, record_ns = [], [], []
    n = 0
    for accepted_len, round_entropies, drift in zip(accepted, entropies, drifts, strict=True):
        n += accepted_len
        start = clock()
        session.record_round(accepted_len, round_entropies)
        record_ns.append(clock() - start)
        session.record_query_drift(drift)
        before = session.decisions
        start = clock()
        session.decide(n)
        elapsed = clock() - start
        decide_ns.append(elapsed)
        if session.decisions > before:
            deciding_ns.append(elapsed)
    return {
        "decide_median_us": statistics.median(decide_ns) / 1000,
        "decide_at_decisions_median_us": statistics.median(deciding_ns) / 1000,
        "record_round_median_us": statistics.median(record_ns) / 1000,
    }


def draft_step_ms(context: int, repeats: int = 15, model_name: str = "smollm2-135m") -> float:
    """Median time of one budgeted draft step (SmolLM2-135M by default) at ``context`` tokens (same machine)."""
    import torch

    from rift_ada.budget import make_policy
    from rift_ada.cache import make_draft_cache
    from rift_ada.models import load_model, resolve_preset

    model, _ = load_model(resolve_preset(model_name).draft)
    cache = make_draft_cache(model, make_policy("rift-stat", budget=256))
    tokens = torch.arange(100, 100 + context)[None] % model.config.vocab_size
    times = []
    with torch.no_grad():
        model(input_ids=tokens, cache=cache, use_cache=True)
        # One step first: the selection is made lazily at the first step after prefill.
        model(input_ids=tokens[:, :1], position_ids=torch.tensor([[context]]), cache=cache, use_cache=True)
        state = cache.snapshot()
        for _ in range(repeats):
            start = time.perf_counter()
            model(input_ids=tokens[:, :1], position_ids=torch.tensor([[context + 1]]), cache=cache, use_cache=True)
            times.append(time.perf_counter() - start)
            cache.restore(state)
    return 1000 * float(np.median(times))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--positions", type=int, default=4096)
    parser.add_argument(
        "--repeats", type=int, default=5, help="single-policy replays timed per family (half as many batches)"
    )
    parser.add_argument("--temperature", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument(
        "--replicas",
        type=int,
        nargs="+",
        default=[DEFAULT_REPLICAS],
        help="sampling replicas timed at T > 0, one table each (the study uses 1, the confirmation the default)",
    )
    parser.add_argument("--decide-calls", type=int, default=50_000)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="10 requests x 512 positions, 2 repeats; the draft step of a tiny random llama (unless --model)",
    )
    parser.add_argument(
        "--model", default=None, help="the draft step's preset or model directory (default: smollm2-135m)"
    )
    parser.add_argument("--json", help="also write the figures to this JSON file")
    parser.add_argument("--context", type=int, default=1024, help="context of the SmolLM2 draft step compared")
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.positions, args.repeats, args.decide_calls = 10, 512, 2, 2_000

    figures: dict[str, Any] = {
        "requests": args.requests,
        "positions": args.positions,
        "arms": 9,
        "replay": {},
    }
    for temperature in args.temperature:
        traces = synthetic_traces(args.requests, args.positions, temperature=temperature, seed=0)
        fitted = ScorePolicy().fit(traces.subset(np.arange(min(20, traces.n_requests))))
        for replicas in args.replicas if temperature > 0 else [1]:
            start = time.perf_counter()
            _tables(traces, replicas)
            setup = time.perf_counter() - start
            shown = f", {replicas} replica{'s' if replicas > 1 else ''}" if temperature > 0 else ""
            print(
                f"T={temperature:g}{shown}: {args.requests} requests x {args.positions} positions x "
                f"{len(traces.arms)} arms; replay tables built once per traces in {setup:.2f} s"
            )
            print(
                f"  {'family':<9} {'single eval/s':>14} {'batched eval/s':>15} {'batch':>6} "
                f"{'mean AL':>8} {'ref/1K':>7}"
            )
            rows = {}
            for family, batch in policies(temperature, fitted).items():
                single, batched, result = time_replay(traces, batch, args.repeats, replicas)
                rows[family] = {
                    "single_eval_per_s": single,
                    "batched_eval_per_s": batched,
                    "batch": len(batch),
                    "mean_al": result.mean_al,
                    "refreshes_per_1k": result.refreshes_per_1k,
                }
                print(
                    f"  {family:<9} {single:>14.1f} {batched:>15.1f} {len(batch):>6} "
                    f"{result.mean_al:>8.3f} {result.refreshes_per_1k:>7.2f}"
                )
            key = f"T={temperature:g}" + (f",replicas={replicas}" if temperature > 0 else "")
            figures["replay"][key] = {"table_setup_s": setup, "replicas": replicas, "families": rows}

    gate = policies(0.0, fitted)["gate"][0]
    decide = time_decide(Controller.from_dict(gate), args.decide_calls)
    figures["controller"] = decide
    print(
        f"Controller (gate, 3 rules): decide median {decide['decide_median_us']:.2f} µs over all calls, "
        f"{decide['decide_at_decisions_median_us']:.2f} µs at decisions; "
        f"record_round (11 entropies) {decide['record_round_median_us']:.2f} µs"
    )
    sys.path.insert(0, str(Path(__file__).parent))
    from _quick import model_or_tiny

    with model_or_tiny(args.model or (None if args.quick else "smollm2-135m")) as model:
        step_ms = draft_step_ms(args.context, model_name=model)
    figures["draft_step_ms"] = step_ms
    print(
        f"{model} budgeted draft step (B = 256, {args.context}-token context): {step_ms:.1f} ms; "
        f"decide / draft step = {decide['decide_median_us'] / (1000 * step_ms):.2e}"
    )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(figures, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
