"""T > 0 fidelity of replay for `stat`, paired on the free-running loop's own texts.

    # a fidelity.py --temp 1 run
    .venv/bin/python benchmarks/investigations/fidelity_paired.py runs/fid6-t1 --seeds 0,1,2,3,4,5

Given its committed text, the free-running loop accepts each drafted position independently with
probability min(1, q(x) / p(x)) of the token x there (docs/calibration.md, "Acceptance given the
text"). Replay of `stat` on the loop's own text, sampling that probability (the probe's
``token_acceptance``), should therefore have the loop's AL as its expectation: a pair (loop AL,
replay AL) on one text differs by the acceptance draws only, not by which text was sampled, so a
few texts measure replay's error far more tightly than comparing one replayed target text with
one loop path (docs/calibration.md: ~9 % per path at 6 x 512).

Per seed, the loop runs every request of the run in one batch (free-running rejection sampling,
the run's settings; seed s gives request r the generator seed ``request_seed(s, r)``, so seed 0
is the run's own closed loop). The draft is then teacher-forced once over each request's
committed text under `stat` (a probe with no age arms, target as in the run), and replay walks
that text with ``--replicas`` replicas, sampling ``token_acceptance`` and, for comparison,
``outcome`` (sum min(p, q), what replay sampled before). Prints each seed and, over every
(seed, request) pair, the mean paired difference relative to the loop's mean AL with its
standard error, and beside the spread of the per-seed differences the spread one loop path would
have from its acceptance draws alone (the replay replicas' sd), which it should match. Per-seed
results are saved in RUN/paired.json, so an interrupted run resumes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np


def main(argv: list[str] | None = None) -> int:
    from rift_ada.atomic import atomic_write_json, json_safe
    from rift_ada.collectors.collect import resolve_closed_policy
    from rift_ada.collectors.probe import probe_request
    from rift_ada.experiments.fidelity import reopen_fidelity
    from rift_ada.memory import cap_heap_growth
    from rift_ada.policies.replay import replay

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="output directory of benchmarks/fidelity.py --temp > 0")
    parser.add_argument("--seeds", default="0,1,2,3", help="loop seeds, comma separated")
    parser.add_argument("--replicas", type=int, default=64)
    parser.add_argument(
        "--alone",
        action="store_true",
        help="rerun the saved seeds' loops one request at a time and compare their ALs with the batched ones",
    )
    args = parser.parse_args(argv)
    seeds = [int(x) for x in args.seeds.split(",")]
    cap_heap_growth()  # as the CLI does (rift_ada/memory.py)
    case, _, setup = reopen_fidelity(args.run)
    if case.temperature <= 0:
        raise SystemExit(f"{args.run}: temperature {case.temperature}; the paired check is for T > 0")
    pair, settings = setup.pair, setup.settings
    by_id = {row["request_id"]: row for row in setup.targets}
    stat = resolve_closed_policy("stat", settings)
    saved_path = args.run / "paired.json"
    saved = json.loads(saved_path.read_text()) if saved_path.exists() else {}

    if args.alone:
        targets = [by_id[request.request_id] for request in setup.requests]
        for seed in seeds:
            batched = saved[str(seed)]["loop_al"]
            alone = [
                len(result.tokens) / len(result.rounds)
                for target in targets
                for result in run_free_stat(pair, [target], stat.cache, settings, seed)[1]
            ]
            same = sum(abs(a - b) < 1e-12 for a, b in zip(alone, batched, strict=True))
            print(
                f"seed {seed}: alone {[round(x, 3) for x in alone]}, batched {[round(x, 3) for x in batched]}: "
                f"{same}/{len(alone)} identical",
                flush=True,
            )
        return 0
    for seed in seeds:
        if str(seed) in saved:
            continue
        started = time.monotonic()
        targets = [by_id[request.request_id] for request in setup.requests]
        batch, results = run_free_stat(pair, targets, stat.cache, settings, seed)
        probes = [
            probe_request(
                pair.draft,
                request.prompt_ids,
                result.tokens,
                policy=stat.cache,
                temperature=settings.temperature,
                arm_ages=(),
                decision_stride=settings.decision_stride,
                target_model=pair.target,
            )
            for request, result in zip(batch, results, strict=True)
        ]
        traces = _traces(probes, targets, [len(r.tokens) for r in results], settings)
        given_token = replay(traces, "stat", replicas=args.replicas, seed=seed)
        marginal = replay(dataclasses.replace(traces, token_acceptance=None), "stat", replicas=args.replicas, seed=seed)
        saved[str(seed)] = {
            "request_id": [target["request_id"] for target in targets],
            "loop_al": [len(r.tokens) / len(r.rounds) for r in results],
            "replay_al": [float(x) for x in given_token.al],
            "replay_al_sum_min": [float(x) for x in marginal.al],
            # sd over replicas of one walk's macro mean AL: the acceptance-draw noise of one loop path
            "replay_path_sd": given_token.mean_al_std,
            "seconds": time.monotonic() - started,
        }
        atomic_write_json(saved_path, json_safe(saved))
        row = saved[str(seed)]
        print(
            f"seed {seed}: loop AL {np.mean(row['loop_al']):.3f}, replay on its text {np.mean(row['replay_al']):.3f} "
            f"(token acceptance), {np.mean(row['replay_al_sum_min']):.3f} (sum min(p, q)); "
            f"{row['seconds']:.0f} s",
            flush=True,
        )
    _summary({seed: saved[str(seed)] for seed in seeds}, args.replicas)
    return 0


def run_free_stat(pair, targets: list[dict], cache_policy, settings, seed: int) -> tuple[list, list]:
    """(requests, results) of the free-running loop over ``targets`` (one batch) under ``cache_policy``
    with loop seed ``seed``: request r gets generator seed ``request_seed(seed, r)`` and as many
    tokens as its target response, so seed 0 reproduces a fidelity run's own closed loop."""
    from rift_ada.collectors.collect import request_seed
    from rift_ada.speculative import BatchRequest, speculative_generate_batch

    batch = [
        BatchRequest(
            list(target["prompt_token_ids"]),
            cache_policy,
            max_new_tokens=len(target["response_token_ids"]),
            seed=request_seed(seed, target["request_id"]),
        )
        for target in targets
    ]
    results = speculative_generate_batch(
        pair.draft,
        batch,
        target_model=pair.target,
        draft_length=settings.draft_length,
        temperature=settings.temperature,
    )
    return batch, results


def _traces(probes, targets, lengths, settings):
    """In-memory probe traces of the loop's texts (arms stat and full), NaN padded."""
    from rift_ada.collectors.probe_traces import ProbeTraces

    width = max(lengths)
    arms = probes[0].arms

    def padded(name: str) -> np.ndarray:
        out = np.full((len(probes), len(arms), width), np.nan, dtype=np.float32)
        for index, probe in enumerate(probes):
            values = getattr(probe, name)
            out[index, :, : values.shape[1]] = values
        return out

    requests = {
        "request_id": np.array([t["request_id"] for t in targets]),
        "dataset": np.array([str(t.get("dataset", "")) for t in targets]),
        "category": np.array([str(t.get("category", "")) for t in targets]),
        "tier": np.array([str(t.get("tier", "")) for t in targets]),
        "isl": np.array([len(t["prompt_token_ids"]) for t in targets], dtype=np.int64),
        "osl": np.array(lengths, dtype=np.int64),
    }
    return ProbeTraces(
        requests=requests,
        arms=arms,
        outcome=padded("outcome"),
        entropy=padded("entropy"),
        stride_signals={},
        temperature=settings.temperature,
        draft_length=settings.draft_length,
        decision_stride=settings.decision_stride,
        token_acceptance=padded("token_acceptance"),
    )


def _summary(per_seed: dict[int, dict], replicas: int) -> None:
    loop = np.concatenate([row["loop_al"] for row in per_seed.values()])
    path_sd = [row["replay_path_sd"] for row in per_seed.values() if "replay_path_sd" in row]
    seed_differences = [np.mean(row["replay_al"]) - np.mean(row["loop_al"]) for row in per_seed.values()]
    if path_sd and len(seed_differences) > 1:
        print(
            f"per-seed (replay - loop) of the macro mean AL: sd {np.std(seed_differences, ddof=1):.3f} over seeds; "
            f"one path's acceptance-draw sd given its texts (replay replicas) {np.mean(path_sd):.3f}"
        )
    print(f"over {len(per_seed)} seed(s) x {len(loop) // max(1, len(per_seed))} requests ({replicas} replicas each):")
    for key, label in (("replay_al", "token acceptance"), ("replay_al_sum_min", "sum min(p, q)")):
        replayed = np.concatenate([row[key] for row in per_seed.values()])
        difference = replayed - loop
        se = difference.std(ddof=1) / np.sqrt(len(difference)) if len(difference) > 1 else float("nan")
        print(
            f"  replay ({label}) {replayed.mean():.3f} vs loop {loop.mean():.3f}: "
            f"{100 * difference.mean() / loop.mean():+.2f} % +- {100 * se / loop.mean():.2f} % (se of the paired mean)"
        )


if __name__ == "__main__":
    sys.exit(main())
