"""Does the probe's token_acceptance predict the free-running loop's own accept/reject decisions?

    .venv/bin/python benchmarks/fidelity_token_check.py runs/fid6-t1      # after fidelity_free_text.py on the run

Reads the run's free-running `stat` loop (its closed traces' rounds, seed 0) and that loop's
committed texts (``probe-loop-text/loop.json``, written by benchmarks/fidelity_free_text.py),
probes each text with `stat` only (no age arms), and compares, over every draft the loop verified
(the accepted ones and the first rejected one of each round but a request's last), the accepted
count with the sum of the probe's min(1, q(x) / p(x)) and of its sum min(p, q): overall and among
drafts whose token the draft found unlikely (c < 0.5), where the two predictions part.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from rift_ada.calibrate.fidelity import reopen_fidelity
    from rift_ada.collectors.collect import resolve_closed_policy
    from rift_ada.collectors.probe import probe_request
    from rift_ada.collectors.trace_io import read_tables
    from rift_ada.memory import cap_heap_growth

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a benchmarks/fidelity.py --temp > 0 run with probe-loop-text/loop.json")
    args = parser.parse_args(argv)
    cap_heap_growth()  # as the CLI does (rift_ada/memory.py)
    _, _, setup = reopen_fidelity(args.run)
    settings = setup.settings
    stat = resolve_closed_policy("stat", settings)
    loop = json.loads((args.run / "probe-loop-text" / "loop.json").read_text())
    rounds = read_tables(args.run / "closed", ["rounds"])["rounds"].to_pydict()
    totals = {"all": [0, 0, 0.0, 0.0, 0.0], "c < 0.5": [0, 0, 0.0, 0.0, 0.0]}  # drafts, accepted, sum c, var, sum a
    for row in loop["rows"]:
        probe = probe_request(
            setup.pair.draft,
            list(row["prompt_token_ids"]),
            list(row["response_token_ids"]),
            policy=stat.cache,
            temperature=settings.temperature,
            arm_ages=(),
            decision_stride=settings.decision_stride,
            target_model=setup.pair.target,
        )
        arm = probe.arms.index("stat")
        given, alpha = probe.token_acceptance[arm].astype(float), probe.outcome[arm].astype(float)
        mine = [
            i
            for i, rid in enumerate(rounds["request_id"])
            if rid == row["request_id"] and rounds["policy"][i] == "stat"
        ]
        for i in mine[:-1]:  # the last round's count is cut to the output limit
            position, accepted = rounds["position"][i], rounds["accepted"][i]
            for step in range(min(accepted + 1, settings.draft_length)):
                j = position + step
                for key in ("all", "c < 0.5") if given[j] < 0.5 else ("all",):
                    total = totals[key]
                    total[0] += 1
                    total[1] += step < accepted
                    total[2] += given[j]
                    total[3] += given[j] * (1 - given[j])
                    total[4] += alpha[j]
    for key, (drafts, accepted, given_sum, variance, alpha_sum) in totals.items():
        print(
            f"{key:<9} drafts {drafts:5d}  accepted {accepted:5d}  sum c {given_sum:8.1f} "
            f"(z {(accepted - given_sum) / variance**0.5:+.2f})  sum min(p, q) {alpha_sum:8.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
