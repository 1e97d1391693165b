"""T > 0 fidelity of replay for every policy of a fidelity run, paired on the target's texts.

    .venv/bin/python benchmarks/fidelity_forced.py runs/fid6-t1c --seeds 0,1,2,3   # a fidelity.py --temp 1 run
    .venv/bin/python benchmarks/fidelity_forced.py --quick   # on a fresh `fidelity.py --quick --temp 1` run (a test)

A free-running loop commits its own text, so the fidelity run's T > 0 row compares replay on
one target text with one loop path on another text: the text-to-text spread (about 9 % per path at
6 x 512) swamps replay's error. Given the committed text, the free-running loop accepts each
drafted position independently with probability min(1, q(x) / p(x)) (docs/notes/2026-11-29-replay-fidelity.md,
"Acceptance given the text"), and the teacher-forced loop at T > 0 accepts with exactly that
probability (tests/test_speculative.py, both loops). On a text sampled from the target the
teacher-forced loop is therefore distributed as the free-running one, and it runs every policy on
the same text that replay walks: the comparison is paired per text without probing new texts
(`fidelity_paired.py` does that for `stat` only, one full probe per loop text).

Per seed s, `collect --mode closed` runs the run's policies (stat, periodic, the gate) teacher-
forced on the run's target responses with collection seed s (request r's acceptance draws come
from ``request_seed(s, r)``); its parts go to RUN/forced/seed-s, so an interrupted run resumes.
Replay walks the run's probe traces with ``--replicas`` replicas. Prints, per policy, replay's
mean AL beside the loop's (mean over seeds), the relative gap with its standard error (the loop's
acceptance-draw spread within each request over the seeds, and replay's over its replicas), and
both refresh counts; the figures are saved in RUN/forced.json (with ``--arm-ages``, replay reads only those arms of
the probe and the figures go to RUN/forced-arms-<ages>.json; the loops resume).

``--free-seeds`` also runs the same policies free-running (RUN/free/seed-s; the run's own seed
reuses RUN/closed) and prints, per pair of policies, what a confirmation would resample in each
mode: the sd over requests of the per-request AL differences and the paired-bootstrap 95 % CI
half-width of their mean (``al_difference_ci``), averaged over the seeds.
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
    from rift_ada.collectors.collect import closed_results, collect_closed
    from rift_ada.collectors.trace_io import read_probe_traces
    from rift_ada.experiments.fidelity import reopen_fidelity
    from rift_ada.memory import cap_heap_growth
    from rift_ada.policies.replay import replay_many
    from rift_ada.policy_spec import periodic_label

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "run", type=Path, nargs="?", help="output directory of benchmarks/fidelity.py --temp > 0 (--quick: a new one)"
    )
    parser.add_argument("--seeds", default="0,1,2,3", help="collection seeds of the teacher-forced loop")
    parser.add_argument("--replicas", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--free-seeds", default="", help="also run free-running loops with these seeds")
    parser.add_argument(
        "--arm-ages", default="", help="replay only these probed age arms (comma separated; default: all of them)"
    )
    parser.add_argument("--model", default=None, help="--quick without a run: the model of its fidelity run")
    parser.add_argument("--json", type=Path, help="also write the figures (as in RUN/forced.json) to this file")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="seeds 0,1, 4 replicas, free-running seed 0; without a run, first a `fidelity.py --quick --temp 1` run",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.replicas, args.free_seeds = "0,1", 4, "0"
        if args.run is None:
            sys.path.insert(0, str(Path(__file__).parent))
            import fidelity
            from _quick import model_or_tiny, out_or_temporary

            with model_or_tiny(args.model) as model, out_or_temporary(None) as folder:
                run = folder / "fidelity-T1"  # the run records its model: it must outlive the run's reopening
                fidelity.main(["--quick", "--temp", "1", "--out", str(run), "--model", model])
                return main([str(run), *(argv if argv is not None else sys.argv[1:])])
    elif args.run is None:
        parser.error("the run directory is required")
    seeds = [int(x) for x in args.seeds.split(",")]
    free_seeds = [int(x) for x in args.free_seeds.split(",") if x]
    case, record, setup = reopen_fidelity(args.run)
    if case.temperature <= 0:
        raise SystemExit(f"{args.run}: temperature {case.temperature}; at T = 0 the fidelity run is already paired")
    gate_path = args.run / "gate.json"
    specs = ["stat", *(periodic_label(interval) for interval in case.periodic), str(gate_path)]
    labels = ["stat", *(periodic_label(interval) for interval in case.periodic), "gate"]
    cap_heap_growth()  # as the CLI does (rift_ada/memory.py)

    def run_loops(seed: int, free_running: bool) -> dict[str, dict[str, np.ndarray]]:
        started = time.monotonic()
        if free_running and seed == case.seed:
            out = args.run / "closed"  # the fidelity run's own free-running loop
        else:
            out = args.run / ("free" if free_running else "forced") / f"seed-{seed}"
        summary = collect_closed(
            setup.pair.draft,
            setup.requests,
            setup.targets,
            out,
            dataclasses.replace(setup.settings, seed=seed),
            specs,
            target_model=setup.pair.target,
            batch_size=args.batch_size,
            free_running=free_running,
        )
        results = closed_results(out)
        means = ", ".join(f"{label} {np.mean(results[label]['al']):.3f}" for label in labels)
        print(
            f"{'free-running' if free_running else 'teacher-forced'} seed {seed}: {summary.collected} request(s) run, "
            f"{summary.skipped} resumed; loop AL {means}; {time.monotonic() - started:.0f} s",
            flush=True,
        )
        return results

    loops = {seed: run_loops(seed, free_running=False) for seed in seeds}
    free_loops = {seed: run_loops(seed, free_running=True) for seed in free_seeds}

    traces = read_probe_traces(args.run / "probe")
    arm_ages = [int(x) for x in args.arm_ages.split(",") if x]
    if arm_ages:  # the same loops, replay reading fewer arms ("Which arm grid", docs/notes/)
        traces = traces.with_age_grid(arm_ages)
    gate = json.loads(gate_path.read_text())
    replays = replay_many(traces, ["stat", *specs[1:-1], gate], replicas=args.replicas, seed=case.seed)
    rows = [
        _row(label, replayed, [loops[seed][label] for seed in seeds], args.replicas)
        for label, replayed in zip(labels, replays, strict=True)
    ]
    print(
        f"{case}\nteacher-forced loop on the target texts, seeds {seeds}; replay {args.replicas} replicas, "
        f"arms {', '.join(a for a in traces.arms)}"
    )
    print(f"{'policy':<14} {'replay AL':>10} {'loop AL':>10} {'gap':>8} {'se':>7} {'replay ref':>11} {'loop ref':>9}")
    for row in rows:
        print(
            f"{row['policy']:<14} {row['replay_al']:>10.3f} {row['loop_al']:>10.3f} {100 * row['al_gap']:>+7.2f}% "
            f"{100 * row['al_gap_se']:>6.2f}% {row['replay_refreshes']:>11.1f} {row['loop_refreshes']:>9.1f}"
        )
    spreads = _pair_spreads(labels, {"teacher-forced": loops, "free-running": free_loops}) if free_loops else []
    if spreads:
        print("per-request AL differences between policies (what a confirmation resamples), mean over seeds:")
        print(f"{'pair':<26} {'mode':<15} {'seeds':>5} {'mean diff':>10} {'sd':>7} {'CI half-width':>14}")
        for row in spreads:
            print(
                f"{row['pair']:<26} {row['mode']:<15} {row['seeds']:>5} {row['mean_difference']:>+10.3f} "
                f"{row['sd']:>7.3f} {row['ci_half_width']:>14.3f}"
            )
    figures = json_safe(
        {
            "case": case.__dict__,
            "model": record["model"],
            "seeds": seeds,
            "free_seeds": free_seeds,
            "replicas": args.replicas,
            "arms": list(traces.arms),
            "rows": rows,
            "pair_spreads": spreads,
        }
    )
    atomic_write_json(
        args.run / ("forced-arms-" + "-".join(map(str, arm_ages)) + ".json" if arm_ages else "forced.json"), figures
    )
    if args.json:
        atomic_write_json(args.json, figures)
    return 0


def _pair_spreads(labels: list[str], modes: dict[str, dict[int, dict[str, dict[str, np.ndarray]]]]) -> list[dict]:
    """Per pair of policies and mode: the per-request AL differences' sd and bootstrap CI half-width."""
    from rift_ada.calibrate.bootstrap import al_difference_ci

    rows = []
    for first, label_a in enumerate(labels):
        for label_b in labels[first + 1 :]:
            for mode, loops in modes.items():
                sds, widths, means = [], [], []
                for seed, loop in loops.items():
                    order = np.argsort(np.asarray(loop[label_a]["request_id"]).astype(str))
                    other = np.argsort(np.asarray(loop[label_b]["request_id"]).astype(str))
                    al_a = np.asarray(loop[label_a]["al"], dtype=np.float64)[order]
                    al_b = np.asarray(loop[label_b]["al"], dtype=np.float64)[other]
                    interval = al_difference_ci(al_a, al_b, n_resamples=2000, seed=seed)
                    sds.append(float(np.std(al_a - al_b, ddof=1)))
                    widths.append((interval.high - interval.low) / 2)
                    means.append(float(np.mean(al_a - al_b)))
                rows.append(
                    {
                        "pair": f"{label_a} - {label_b}",
                        "mode": mode,
                        "seeds": len(loops),
                        "mean_difference": float(np.mean(means)),
                        "sd": float(np.mean(sds)),
                        "ci_half_width": float(np.mean(widths)),
                    }
                )
    return rows


def _row(label: str, replayed, loops: list[dict[str, np.ndarray]], replicas: int) -> dict:
    """Replay against the loop's mean over seeds, on the same requests (replay's order)."""
    order = [[list(map(str, loop["request_id"])).index(str(rid)) for rid in replayed.request_ids] for loop in loops]
    pairs = list(zip(loops, order, strict=True))
    loop_al = np.stack([np.asarray(loop["al"], dtype=np.float64)[index] for loop, index in pairs])
    refreshes = [float(np.sum(np.asarray(loop["refreshes"])[index])) for loop, index in pairs]
    loop_mean = float(loop_al.mean())
    # Var of the loop's macro mean: its within-request spread over seeds (the texts are fixed).
    within = float(loop_al.var(axis=0, ddof=1).mean()) if len(loops) > 1 else float("nan")
    loop_var = within / loop_al.size
    replay_var = replayed.mean_al_std**2 / replicas
    return {
        "policy": label,
        "replay_al": replayed.mean_al,
        "loop_al": loop_mean,
        "loop_al_by_seed": loop_al.mean(axis=1).tolist(),
        "al_gap": (replayed.mean_al - loop_mean) / loop_mean,
        "al_gap_se": float(np.sqrt(loop_var + replay_var)) / loop_mean,
        "replay_refreshes": float(np.sum(replayed.refreshes)),
        "loop_refreshes": float(np.mean(refreshes)),
        "loop_refreshes_by_seed": refreshes,
    }


if __name__ == "__main__":
    sys.exit(main())
