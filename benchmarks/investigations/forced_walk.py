"""Is the teacher-forced T > 0 `stat` loop the probe's walk? Decision by decision, and its seed spread.

    # after fidelity_forced.py on the run
    .venv/bin/python benchmarks/investigations/forced_walk.py runs/fid6-t1c --simulate 60

Teacher-forced at T > 0, the loop draws one uniform per verified draft from the request's generator
(seeded ``request_seed(seed, request)``) and accepts the draft at the text's token x when it is
below min(1, q(x) / p(x)). Replay models that walk with the probe's ``token_acceptance``. This walks
the probe's `stat` arm with the loop's own generators and compares each request's AL with the
loop's (RUN/forced/seed-s, written by ``fidelity_forced.py``): equal ALs mean equal decisions. Then
it walks ``--simulate`` seeds to give the spread the loop's macro mean AL has over seeds (acceptance
draws only: the texts are fixed), beside what independent requests would give.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch


def walk(acceptance: np.ndarray, length: int, seed: int, draft_length: int) -> float:
    """AL of the teacher-forced loop's walk over one text with generator seed ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    position = rounds = 0
    while position < length:
        accepted = 0
        for step in range(min(draft_length, length - position)):
            if float(torch.rand((), generator=generator)) >= acceptance[position + step]:
                break
            accepted += 1
        position += accepted + 1
        rounds += 1
    return min(position, length) / rounds


def main(argv: list[str] | None = None) -> int:
    from rift_ada.collectors.collect import closed_results, request_seed
    from rift_ada.collectors.trace_io import read_probe_traces

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a benchmarks/fidelity.py --temp > 0 run after fidelity_forced.py")
    parser.add_argument("--simulate", type=int, default=60, help="seeds to walk for the spread")
    args = parser.parse_args(argv)
    traces = read_probe_traces(args.run / "probe")
    if traces.token_acceptance is None:
        raise SystemExit(f"{args.run}/probe: no token_acceptance column (T = 0, or probed before 2026-11-30)")
    arm = traces.arms.index("stat")
    ids = [str(x) for x in traces.requests["request_id"]]
    acceptance = traces.acceptance[:, arm].astype(np.float64)

    def walks(seed: int) -> np.ndarray:
        return np.array(
            [
                walk(acceptance[r], int(traces.osl[r]), request_seed(seed, rid), traces.draft_length)
                for r, rid in enumerate(ids)
            ]
        )

    seeds = sorted(int(path.name.split("-")[1]) for path in (args.run / "forced").glob("seed-*"))
    same = total = 0
    for seed in seeds:
        loop = closed_results(args.run / "forced" / f"seed-{seed}")["stat"]
        order = [list(map(str, loop["request_id"])).index(rid) for rid in ids]
        loop_al = np.asarray(loop["al"], dtype=np.float64)[order]
        walked = walks(seed)
        same += int(np.sum(np.abs(walked - loop_al) < 1e-9))
        total += len(ids)
        print(f"seed {seed}: loop {np.round(loop_al, 3).tolist()}  walk {np.round(walked, 3).tolist()}", flush=True)
    print(f"requests whose walk gives the loop's AL: {same}/{total}")
    simulated = np.stack([walks(seed) for seed in range(args.simulate)])
    per_request = float(np.sqrt(simulated.var(axis=0, ddof=1).mean()))
    print(
        f"over {args.simulate} walked seeds: per-request AL sd {per_request:.3f}; sd of the macro mean AL "
        f"{simulated.mean(axis=1).std(ddof=1):.3f} (independent requests: {per_request / np.sqrt(len(ids)):.3f}); "
        f"mean AL {simulated.mean():.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
