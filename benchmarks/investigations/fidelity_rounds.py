"""Round by round: what the probe arms predict for each closed-loop round vs what the loop did.

    .venv/bin/python benchmarks/investigations/fidelity_rounds.py runs/fid-t0        # a benchmarks/fidelity.py run
    .venv/bin/python benchmarks/investigations/fidelity_rounds.py runs/fid-t0 --closed closed-p8 --collect periodic:8

For every closed-loop round (request, start position n, working-set age a at the round's start)
the probe traces predict the round's AL from the arms around a (the younger probed age g_j <= a,
the older g_{j+1}, and replay's linear mix between them): at T = 0 exactly (1 + leading matches),
at T > 0 as the expectation 1 + sum_m prod_{i<m} alpha_{n+i} over the probe's acceptance
probabilities (teacher-forced on the target's text, so at T > 0 it compares distributions only).
Rounds are grouped by policy and age band; where actual and predicted differ, the band says
whether the error sits right after a refresh or late in a working set's life (docs/calibration.md,
"Replay fidelity").
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from rift_ada.collectors.probe_traces import arm_age
from rift_ada.collectors.trace_io import read_probe_traces, read_tables


def predicted_al(outcome: np.ndarray, start: int, osl: int, k: int, sampled: bool) -> float:
    """AL of a round starting at ``start`` on one arm's outcomes (T = 0: exact; T > 0: expected)."""
    window = np.nan_to_num(outcome[start : start + k].astype(np.float64), nan=0.0)
    if sampled:
        survive = np.concatenate([[1.0], np.cumprod(window)])  # P(at least m drafts accepted), m = 0..k
        al = float(np.sum(survive))
    else:
        misses = np.flatnonzero(window < 0.5)
        al = 1.0 + float(misses[0] if len(misses) else len(window))
    return min(al, float(osl - start))


def collect_more(run: Path, closed: str, specs: list[str]) -> None:
    """Run the closed loop of the run's requests, settings and seeds for more policies, into ``run/closed``."""
    from rift_ada.collectors.collect import collect_closed
    from rift_ada.experiments.fidelity import reopen_fidelity

    case, _, setup = reopen_fidelity(run)
    collect_closed(
        setup.pair.draft,
        setup.requests,
        setup.targets,
        run / closed,
        setup.settings,
        specs,
        target_model=setup.pair.target,
        free_running=case.temperature > 0,
    )


def round_table(run: Path, closed: str = "closed") -> dict[str, dict[str, np.ndarray]]:
    """Per policy: arrays over its rounds (request index, start, age at start, actual and predicted AL)."""
    traces = read_probe_traces(run / "probe")
    sampled = traces.temperature > 0
    table = read_tables(run / closed, kinds=["rounds"])["rounds"]
    columns = {name: table.column(name).to_pylist() for name in ("request_id", "policy", "round", "position", "al")}
    columns["refreshed"] = table.column("refreshed").to_pylist()
    index_of = {str(rid): i for i, rid in enumerate(traces.requests["request_id"])}
    grid = sorted((arm_age(name), i) for i, name in enumerate(traces.arms) if arm_age(name) is not None)
    stat = traces.arms.index("stat")
    k = traces.draft_length
    rows: dict[str, dict[str, list[float]]] = {}
    order = sorted(
        range(len(columns["round"])),
        key=lambda i: (columns["policy"][i], columns["request_id"][i], columns["round"][i]),
    )
    last_refresh: dict[tuple[str, str], int] = {}
    for i in order:
        policy, rid = columns["policy"][i], str(columns["request_id"][i])
        r = index_of[rid]
        n, al = int(columns["position"][i]), int(columns["al"][i])
        age = n - last_refresh.get((policy, rid), 0)
        if policy == "stat":
            younger = older = stat
            weight = 0.0
        else:
            ages = [g for g, _ in grid]
            j = max(0, int(np.searchsorted(ages, age, side="right")) - 1)
            younger = grid[j][1]
            if j + 1 < len(grid):
                older = grid[j + 1][1]
                weight = (age - ages[j]) / (ages[j + 1] - ages[j])
            else:
                older, weight = younger, 0.0
        osl = int(traces.osl[r])
        young_al = predicted_al(traces.outcome[r, younger], n, osl, k, sampled)
        old_al = predicted_al(traces.outcome[r, older], n, osl, k, sampled)
        row = rows.setdefault(policy, {key: [] for key in ("request", "start", "age", "al", "younger", "older", "mix")})
        for key, value in (
            ("request", r),
            ("start", n),
            ("age", age),
            ("al", al),
            ("younger", young_al),
            ("older", old_al),
            ("mix", (1 - weight) * young_al + weight * old_al),
        ):
            row[key].append(value)
        if columns["refreshed"][i]:
            last_refresh[(policy, rid)] = n + al
    return {policy: {key: np.asarray(v, dtype=np.float64) for key, v in row.items()} for policy, row in rows.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="output directory of benchmarks/fidelity.py")
    parser.add_argument("--bands", default="0,16,32,64,128,100000", help="age band edges")
    parser.add_argument("--closed", default="closed", help="closed-loop directory inside the run")
    parser.add_argument("--collect", default="", help="first run these policies (comma separated) into --closed")
    args = parser.parse_args(argv)
    if args.collect:
        collect_more(args.run, args.closed, args.collect.split(","))
    edges = [int(x) for x in args.bands.split(",")]
    for policy, row in round_table(args.run, args.closed).items():
        n = len(row["al"])
        print(
            f"{policy}: {n} rounds, actual mean round AL {row['al'].mean():.3f}, predicted (replay's mix) "
            f"{row['mix'].mean():.3f} ({100 * (row['mix'].mean() / row['al'].mean() - 1):+.1f} %)"
        )
        if policy == "stat":  # one arm, no mix: at T = 0 the prediction is exact where replay is
            differ = np.flatnonzero(row["al"] != row["younger"])
            print(f"  rounds whose AL differs from the stat arm's prediction: {len(differ)} of {n}")
        print(f"  {'age band':<12} {'rounds':>6} {'actual':>7} {'younger':>8} {'older':>7} {'mix':>7} {'mix-act':>8}")
        for low, high in zip(edges[:-1], edges[1:], strict=True):
            band = (row["age"] >= low) & (row["age"] < high)
            if not band.any():
                continue
            actual, mix = row["al"][band].mean(), row["mix"][band].mean()
            print(
                f"  {f'[{low}, {high})':<12} {int(band.sum()):>6} {actual:>7.3f} {row['younger'][band].mean():>8.3f} "
                f"{row['older'][band].mean():>7.3f} {mix:>7.3f} {mix - actual:>+8.3f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
