"""Does the probe's token_acceptance predict the free-running loop's own accept/reject decisions?

    # after fidelity_free_text.py on the run
    .venv/bin/python benchmarks/investigations/fidelity_token_check.py runs/fid6-t1
    # reruns loop seed 2 first
    .venv/bin/python benchmarks/investigations/fidelity_token_check.py runs/fid6-t1 --seed 2

Reads the run's free-running `stat` loop (its closed traces' rounds, seed 0) and that loop's
committed texts (``probe-loop-text/loop.json``, written by benchmarks/investigations/fidelity_free_text.py),
probes each text with `stat` only (no age arms), and compares, over every draft the loop verified
(the accepted ones and the first rejected one of each round but a request's last), the accepted
count with the sum of the probe's min(1, q(x) / p(x)) and of its sum min(p, q): overall and among
drafts whose token the draft found unlikely (c < 0.5), where the two predictions part.
``--seed S`` instead reruns the free-running `stat` loop with loop seed S
(``fidelity_paired.run_free_stat``, as `fidelity_paired.py` does) and checks that loop; it also
prints each request's counts.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from rift_ada.collectors.collect import resolve_closed_policy
    from rift_ada.collectors.probe import probe_request
    from rift_ada.experiments.fidelity import reopen_fidelity
    from rift_ada.memory import cap_heap_growth

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a benchmarks/fidelity.py --temp > 0 run with probe-loop-text/loop.json")
    parser.add_argument("--seed", type=int, default=None, help="rerun the free-running stat loop with this seed")
    args = parser.parse_args(argv)
    cap_heap_growth()  # as the CLI does (rift_ada/memory.py)
    _, _, setup = reopen_fidelity(args.run)
    settings = setup.settings
    stat = resolve_closed_policy("stat", settings)
    loops = _loop_rounds(args.run, setup, stat, args.seed)
    totals = {"all": [0, 0, 0.0, 0.0, 0.0], "c < 0.5": [0, 0, 0.0, 0.0, 0.0]}  # drafts, accepted, sum c, var, sum a
    for request_id, prompt_ids, text, rounds in loops:
        probe = probe_request(
            setup.pair.draft,
            prompt_ids,
            text,
            policy=stat.cache,
            temperature=settings.temperature,
            arm_ages=(),
            decision_stride=settings.decision_stride,
            target_model=setup.pair.target,
        )
        arm = probe.arms.index("stat")
        given, alpha = probe.token_acceptance[arm].astype(float), probe.outcome[arm].astype(float)
        mine = [0, 0, 0.0, 0.0, 0.0]
        for position, accepted in rounds[:-1]:  # the last round's count is cut to the output limit
            for step in range(min(accepted + 1, settings.draft_length)):
                j = position + step
                for total in [totals["all"], mine] + ([totals["c < 0.5"]] if given[j] < 0.5 else []):
                    total[0] += 1
                    total[1] += step < accepted
                    total[2] += given[j]
                    total[3] += given[j] * (1 - given[j])
                    total[4] += alpha[j]
        if args.seed is not None:
            _print_counts(request_id, *mine)
    for key, counts in totals.items():
        _print_counts(key, *counts)
    return 0


def _print_counts(key: str, drafts: int, accepted: int, given_sum: float, variance: float, alpha_sum: float) -> None:
    print(
        f"{key:<9} drafts {drafts:5d}  accepted {accepted:5d}  sum c {given_sum:8.1f} "
        f"(z {(accepted - given_sum) / variance**0.5:+.2f})  sum min(p, q) {alpha_sum:8.1f}",
        flush=True,
    )


LoopRounds = list[tuple[str, list[int], list[int], list[tuple[int, int]]]]


def _loop_rounds(run: Path, setup, stat, seed: int | None) -> LoopRounds:
    """(request id, prompt, committed text, [(position, accepted) per round]) of the free-running stat loop."""
    from rift_ada.collectors.trace_io import read_tables

    if seed is not None:
        from fidelity_paired import run_free_stat  # benchmarks/ (the script's own directory)

        by_id = {row["request_id"]: row for row in setup.targets}
        targets = [by_id[request.request_id] for request in setup.requests]
        batch, results = run_free_stat(setup.pair, targets, stat.cache, setup.settings, seed)
        return [
            (target["request_id"], request.prompt_ids, result.tokens, [(r.position, r.accepted) for r in result.rounds])
            for target, request, result in zip(targets, batch, results, strict=True)
        ]
    loop = json.loads((run / "probe-loop-text" / "loop.json").read_text())
    rounds = read_tables(run / "closed", ["rounds"])["rounds"].to_pydict()
    out = []
    for row in loop["rows"]:
        mine = [
            (rounds["position"][i], rounds["accepted"][i])
            for i, rid in enumerate(rounds["request_id"])
            if rid == row["request_id"] and rounds["policy"][i] == "stat"
        ]
        out.append((row["request_id"], list(row["prompt_token_ids"]), list(row["response_token_ids"]), mine))
    return out


if __name__ == "__main__":
    sys.exit(main())
