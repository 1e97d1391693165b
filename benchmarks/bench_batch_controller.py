"""Batched controller API: time per request of one `BatchSessions.step` for 256 concurrent requests.

Every timed step is a decision step (each request commits one decision stride of tokens), so the
figure is the cost of record_round + decide per request per stride. Side by side: the same work
done by hand with one `Session` per request. Prints medians over repeats.

    .venv/bin/python benchmarks/bench_batch_controller.py [--requests 256] [--steps 200] [--seed 0]
"""

from __future__ import annotations

import argparse
import random
import statistics
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


def bench(n_requests: int, n_steps: int, seed: int, with_drift: bool) -> tuple[float, float, int]:
    """(median µs per request batched, by hand, refreshes) over ``n_steps`` decision steps."""
    controller = Controller.load(CONTROLLER)
    stride = controller.decision_stride
    ids = [f"req-{i}" for i in range(n_requests)]
    batch = BatchSessions(controller)
    for rid in ids:
        batch.start(rid)
    sessions = [controller.new_session() for _ in ids]
    batched, by_hand = [], []
    refreshes = 0
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
            session.decide(n_committed[i])
        by_hand.append(time.perf_counter() - start)
    scale = 1e6 / n_requests
    return statistics.median(batched) * scale, statistics.median(by_hand) * scale, refreshes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"controller {CONTROLLER.name}, {args.requests} requests, {args.steps} decision steps, seed {args.seed}")
    print(f"{'inputs':<34}{'batched µs/req':>16}{'by hand µs/req':>16}{'ratio':>8}{'refreshes':>11}")
    for with_drift in (False, True):
        batched, by_hand, refreshes = bench(args.requests, args.steps, args.seed, with_drift)
        label = "AL + entropies + drift" if with_drift else "AL + entropies"
        print(f"{label:<34}{batched:>16.3f}{by_hand:>16.3f}{batched / by_hand:>8.2f}{refreshes:>11}")


if __name__ == "__main__":
    main()
