"""Replay throughput side by side: an earlier ``policies/replay.py`` vs the current one, interleaved.

    git show c98ee1e:policies/replay.py > /tmp/replay_before.py
    .venv/bin/python benchmarks/compare_replay.py --before /tmp/replay_before.py            # 100 x 4096
    .venv/bin/python benchmarks/compare_replay.py --before /tmp/replay_before.py --quick    # 20 x 1024
    .venv/bin/python benchmarks/compare_replay.py --quick    # the current replay against itself (a test)

A replay that uses the signal engine (``policies/signals.py``, from 195edf9 on) is compared with
its own engine: ``git show REV:policies/signals.py > /tmp/signals_before.py`` and
``--before-signals /tmp/signals_before.py``.

Both versions replay the same batches of 32 policies per family (as ``bench_replay.py``) on the
same synthetic traces; runs alternate before / now so that machine load hits both alike, and the
best of ``--repeats`` is kept. Prints batched evaluations per second and the ratio now / before.
At T > 0 an evaluation now includes its sampling replicas (default 4).
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from bench_replay import policies  # noqa: E402

from rift_ada.collectors.synthetic import synthetic_traces  # noqa: E402
from rift_ada.policies import ScorePolicy  # noqa: E402
from rift_ada.policies import replay as current  # noqa: E402


def load_module(name: str, path: str) -> object:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"{path}: cannot load")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_before(path: str, signals_path: str | None = None) -> object:
    """The earlier replay; with ``signals_path``, importing its signal engine from that file."""
    if signals_path is None:
        return load_module("replay_before", path)
    engine_name = "rift_ada.policies.signals"
    current_engine = sys.modules[engine_name]
    sys.modules[engine_name] = load_module("signals_before", signals_path)
    try:
        return load_module("replay_before", path)
    finally:
        sys.modules[engine_name] = current_engine


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="an earlier policies/replay.py (--quick: the current one)")
    parser.add_argument("--before-signals", help="the earlier policies/signals.py that --before imports")
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--positions", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="20 requests x 1024 positions")
    parser.add_argument("--json", help="also write the figures to this JSON file")
    parser.add_argument("--replicas", type=int, default=None, help="sampling replicas now at T > 0 (default 4)")
    parser.add_argument("--temperature", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument(
        "--rounds", action="store_true", help="also print the rounds each version walks (slowest lane, all lanes)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.positions = 20, 1024
        args.before = args.before or str(Path(__file__).resolve().parent.parent / "policies" / "replay.py")
    elif args.before is None:
        parser.error("--before is required (an earlier policies/replay.py)")
    rows = []
    before = load_before(args.before, args.before_signals)
    # An earlier replay that samples replicas at T > 0 runs with the same count as now.
    takes_replicas = "replicas" in inspect.signature(before.replay_many).parameters
    before_options = {"replicas": args.replicas} if takes_replicas else {}
    for temperature in args.temperature:
        traces = synthetic_traces(args.requests, args.positions, temperature=temperature, seed=0)
        fitted = ScorePolicy().fit(traces.subset(np.arange(min(20, args.requests))))
        before._tables(traces)
        current._tables(traces)
        for family, batch in policies(temperature, fitted).items():
            times: dict[str, list[float]] = {"before": [], "now": []}
            for _ in range(args.repeats):
                start = time.perf_counter()
                before.replay_many(traces, batch, **before_options)
                times["before"].append(time.perf_counter() - start)
                start = time.perf_counter()
                current.replay_many(traces, batch, replicas=args.replicas)
                times["now"].append(time.perf_counter() - start)
            rate_before, rate_now = (len(batch) / min(times[key]) for key in ("before", "now"))
            if args.rounds:  # the work: lockstep iterations (the slowest lane's rounds) and lane-rounds
                for key, results in (
                    ("before", before.replay_many(traces, batch, **before_options)),
                    ("now", current.replay_many(traces, batch, replicas=args.replicas)),
                ):
                    rounds = np.concatenate([np.atleast_1d(result.rounds) for result in results])
                    print(
                        f"T={temperature:g} {family:<9} {key:<6} rounds: slowest lane {int(rounds.max()):,}, "
                        f"all {int(rounds.sum()):,}"
                    )
            print(
                f"T={temperature:g} {family:<9} batched eval/s before {rate_before:7.1f}  now {rate_now:7.1f}  "
                f"now/before {rate_now / rate_before:5.2f}",
                flush=True,
            )
            rows.append({"temperature": temperature, "family": family, "before_eval_per_s": rate_before,
                         "now_eval_per_s": rate_now})  # fmt: skip
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"requests": args.requests, "positions": args.positions, "rows": rows}, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
