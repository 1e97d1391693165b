"""T > 0: is replay's gap to the free-running loop about the text, or about how rounds fall on it?

    .venv/bin/python benchmarks/fidelity_free_text.py runs/fid-t1      # a benchmarks/fidelity.py --temp 1 run

Reruns the free-running `stat` loop of the run (same seeds, so the same text and rounds as its
closed loop), probes the loop's *own* committed text (instead of the target's sampled response)
and compares, on the same requests:

1. the loop's AL;
2. replay of `stat` on the target's text (the run's fidelity.json);
3. replay of `stat` on the loop's own text (acceptance sampled per position, ``--replicas``);
4. the expected AL of each loop round from the probe's acceptance probabilities on the loop's
   text, taken at the positions where the loop's rounds actually started.

(2) vs (3) isolates the text; (3) vs (4) isolates where rounds start (replay starts a round after
an independent Bernoulli failure; the loop starts one after a token drawn from the residual
max(p - q, 0), a token the draft found unlikely); (4) vs (1) is the sampling noise of the loop.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def main(argv: list[str] | None = None) -> int:
    from benchmarks.fidelity_rounds import predicted_al
    from rift_ada.calibrate.fidelity import reopen_fidelity
    from rift_ada.collectors.collect import request_seed, resolve_closed_policy
    from rift_ada.collectors.pipeline import run_collection
    from rift_ada.collectors.trace_io import read_probe_traces
    from rift_ada.policies.replay import replay
    from rift_ada.speculative import speculative_generate

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="output directory of benchmarks/fidelity.py --temp > 0")
    parser.add_argument("--replicas", type=int, default=64)
    args = parser.parse_args(argv)
    case, record, setup = reopen_fidelity(args.run)
    rows = {row["policy"]: row for row in record["rows"]}
    pair, requests, settings, targets = setup.pair, setup.requests, setup.settings, setup.targets
    by_id = {row["request_id"]: row for row in targets}
    stat = resolve_closed_policy("stat", settings)
    loop_rows, starts, loop_al = [], {}, {}
    for request in requests:
        target = by_id[request.request_id]
        result = speculative_generate(
            pair.draft,
            list(target["prompt_token_ids"]),
            policy=stat.cache,
            target_model=pair.target,
            max_new_tokens=len(target["response_token_ids"]),
            draft_length=settings.draft_length,
            temperature=settings.temperature,
            seed=request_seed(settings.seed, request.request_id),
        )
        loop_rows.append({**target, "response_token_ids": list(result.tokens)})
        starts[request.request_id] = [(r.position, r.al) for r in result.rounds]
        loop_al[request.request_id] = len(result.tokens) / len(result.rounds)
    out = args.run / "probe-loop-text"
    if not (out / "manifest.json").exists():
        run_collection(pair, requests, loop_rows, out, settings, mode="probe")
    traces = read_probe_traces(out)
    replayed = replay(traces, "stat", replicas=args.replicas, seed=case.seed)
    arm = traces.arms.index("stat")
    expected_at_loop_starts, actual_rounds = [], []
    for r, rid in enumerate(traces.requests["request_id"]):
        for position, al in starts[str(rid)]:
            expected_at_loop_starts.append(
                predicted_al(traces.outcome[r, arm], position, int(traces.osl[r]), traces.draft_length, True)
            )
            actual_rounds.append(al)
    ids = [str(x) for x in traces.requests["request_id"]]
    loop_mean = float(np.mean([loop_al[rid] for rid in ids]))
    figures = {
        "loop_al": loop_mean,
        "closed_al_in_run": rows["stat"]["closed_al"],
        "replay_on_target_text": rows["stat"]["replay_al"],
        "replay_on_loop_text": replayed.mean_al,
        "replay_on_loop_text_std": replayed.mean_al_std,
        "loop_mean_round_al": float(np.mean(actual_rounds)),
        "expected_round_al_at_loop_starts": float(np.mean(expected_at_loop_starts)),
        "mean_alpha_target_text": float(np.nanmean(read_probe_traces(args.run / "probe").outcome[:, arm])),
        "mean_alpha_loop_text": float(np.nanmean(traces.outcome[:, arm])),
    }
    for key, value in figures.items():
        print(f"{key:<34} {value:.3f}")
    (args.run / "free_text.json").write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
