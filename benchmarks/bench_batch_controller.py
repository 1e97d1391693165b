"""Batched controller API: time per request of one `BatchSessions.step` for 256 concurrent requests.

Every timed step is a decision step (each request commits one decision stride of tokens), so the
figure is the cost of record_round + decide per request per stride. Side by side: the same work
done by hand with one `Session` per request. Prints medians over repeats.

    .venv/bin/python benchmarks/bench_batch_controller.py [--requests 256] [--steps 200] [--seed 0]
    .venv/bin/python benchmarks/bench_batch_controller.py --quick    # 16 requests x 20 steps (a test runs it)
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

from rift_ada.batch import BatchSessions
from rift_ada.controller import Controller

CONTROLLER = Path(__file__).resolve().parent.parent / "data" / "controllers" / "smollm2-135m-T0.example.json"


def _inputs(n_requests: int, n_steps: int, seed: int) -> list[tuple[list[int], list[list[float]], list[float]]]:
    rng = random.Random(seed)
    steps = []
    for _ in range(n_steps):
        accepted = [rng.randint(0, 11) for _ in range(n_requests)]
        entropies = [[round(rng.uniform(0.0, 3.0), 4) for _ in range(min(11, a + 1))] for a in accepted]
        drifts = [rng.uniform(0.0, 0.2) for _ in range(n_requests)]
        steps.append(([a + 1 for a in accepted], entropies, drifts))
    return steps


def bench(n_requests: int, n_steps: int, seed: int, with_drift: bool) -> tuple[float, float, int, int]:
    """(median µs per request batched, by hand, refreshes batched, by hand) over ``n_steps`` decision steps."""
    controller = Controller.load(CONTROLLER)
    stride = controller.decision_stride
    ids = [f"req-{i}" for i in range(n_requests)]
    batch = BatchSessions(controller)
    for rid in ids:
        batch.start(rid)
    sessions = [controller.new_session() for _ in ids]
    batched, by_hand = [], []
    refreshes = by_hand_refreshes = 0
    for index, (lens, entropies, drifts) in enumerate(_inputs(n_requests, n_steps, seed)):
        n_committed = [stride * (index + 1)] * n_requests
        drift_arg = drifts if with_drift else None
        start = time.perf_counter()
        refreshed = batch.step(ids, lens, n_committed, entropies, drift_arg)
        batched.append(time.perf_counter() - start)
        refreshes += len(refreshed)
        start = time.perf_counter()
        for i, session in enumerate(sessions):
            session.record_round(lens[i], entropies[i])
            if with_drift:
                session.record_query_drift(drifts[i])
            by_hand_refreshes += session.decide(n_committed[i])
        by_hand.append(time.perf_counter() - start)
    scale = 1e6 / n_requests
    return statistics.median(batched) * scale, statistics.median(by_hand) * scale, refreshes, by_hand_refreshes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="16 requests x 20 decision steps")
    parser.add_argument("--json", help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.steps = 16, 20
    print(f"controller {CONTROLLER.name}, {args.requests} requests, {args.steps} decision steps, seed {args.seed}")
    print(f"{'inputs':<34}{'batched µs/req':>16}{'by hand µs/req':>16}{'ratio':>8}{'refreshes':>11}")
    rows = {}
    for with_drift in (False, True):
        batched, by_hand, refreshes, by_hand_refreshes = bench(args.requests, args.steps, args.seed, with_drift)
        label = "AL + entropies + drift" if with_drift else "AL + entropies"
        print(f"{label:<34}{batched:>16.3f}{by_hand:>16.3f}{batched / by_hand:>8.2f}{refreshes:>11}")
        if refreshes != by_hand_refreshes:
            print(f"  MISMATCH: {by_hand_refreshes} refreshes by hand", file=sys.stderr)
        rows[label] = {
            "batched_us": batched, "by_hand_us": by_hand, "refreshes": refreshes, "by_hand_refreshes": by_hand_refreshes
        }  # fmt: skip
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            figures = {"requests": args.requests, "steps": args.steps, "seed": args.seed, "rows": rows}
            json.dump(figures, handle, indent=2)
    return 0 if all(row["refreshes"] == row["by_hand_refreshes"] for row in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
