"""T > 0: is replay's gap to the free-running loop about the text, or about how rounds fall on it?

    # a benchmarks/fidelity.py --temp 1 run
    .venv/bin/python benchmarks/investigations/fidelity_free_text.py runs/fid-t1

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
max(p - q, 0), a token the draft found unlikely). Last, a calibration check: every draft the loop
verified (accepted ones and the first rejected one) is a Bernoulli trial whose probability, given
the committed prefix, should be the probe's alpha at that position on the loop's text; the sum of
those alphas is compared with the accepted count, for the first draft step and the later ones.
``--loop-seeds`` instead reruns only the loop with other seeds (all requests in one batch): the
spread of one sample path, and per seed (and pooled) every verified draft against its sum
min(p, q), by where it sits in a round (first draft after a rejection, after a fully accepted
round, later drafts). Each count is split into the draw (is the drafted token x distributed as q:
sum of r(x) = min(1, p(x)/q(x)) against sum min(p, q)) and the test (is the uniform uniform:
accepted against sum r(x)), with Kolmogorov-Smirnov p-values of the uniforms and of x's
randomised PIT under q.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch


def main(argv: list[str] | None = None) -> int:
    from fidelity_paired import run_free_stat  # benchmarks/ (the script's own directory)
    from fidelity_rounds import predicted_al

    from rift_ada import speculative
    from rift_ada.atomic import atomic_write_json, json_safe
    from rift_ada.collectors.collect import resolve_closed_policy
    from rift_ada.collectors.pipeline import run_collection
    from rift_ada.collectors.trace_io import read_probe_traces
    from rift_ada.experiments.fidelity import reopen_fidelity
    from rift_ada.memory import cap_heap_growth
    from rift_ada.policies.replay import replay

    cap_heap_growth()  # as the CLI does: without it a 6 x 512 run grew past 23 GB (docs/performance.md)

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="output directory of benchmarks/fidelity.py --temp > 0")
    parser.add_argument("--replicas", type=int, default=64)
    parser.add_argument(
        "--loop-seeds",
        default="",
        help="only rerun the free-running stat loop with these seeds (comma separated): mean AL per seed vs replay",
    )
    args = parser.parse_args(argv)
    case, record, setup = reopen_fidelity(args.run)
    rows = {row["policy"]: row for row in record["rows"]}
    pair, requests, settings, targets = setup.pair, setup.requests, setup.settings, setup.targets
    by_id = {row["request_id"]: row for row in targets}
    stat = resolve_closed_policy("stat", settings)

    if args.loop_seeds:
        return _loop_seeds(args, requests, by_id, stat, pair, settings, rows["stat"])
    loop_rows, starts, loop_al = [], {}, {}
    # The loop's own acceptance probability at every draft it verified: sum min(p, q) of the very
    # distributions its rejection test used (recorded around speculative._verify).
    loop_alpha: dict[str, dict[int, float]] = {}
    verify = speculative._verify
    current: dict[int, float] = {}

    committed: dict[int, int] = {}  # per request (its generator): output tokens before the round

    def recording_verify(drafted, draft_dists, target_logits, temperature, generator):
        offset = committed.get(id(generator), 0)
        for index, dist in enumerate(draft_dists):
            target = speculative._probs(target_logits[index], temperature)
            current[offset + index] = float(torch.minimum(target, dist).sum())
        accepted, token = verify(drafted, draft_dists, target_logits, temperature, generator)
        committed[id(generator)] = offset + accepted + 1
        return accepted, token

    out = args.run / "probe-loop-text"
    saved = out / "loop.json"  # the loop's results, so an interrupted run resumes at the probe
    if saved.exists():
        loop = json.loads(saved.read_text())
        loop_rows, loop_al = loop["rows"], loop["al"]
        starts = {rid: [tuple(s) for s in value] for rid, value in loop["starts"].items()}
        loop_alpha = {rid: {int(k): v for k, v in value.items()} for rid, value in loop["alpha"].items()}
    else:
        speculative._verify = recording_verify
        for request in requests:
            current = loop_alpha.setdefault(request.request_id, {})
            committed.clear()  # one request a run: a freed generator's id may come back
            target = by_id[request.request_id]
            (result,) = run_free_stat(pair, [target], stat.cache, settings, settings.seed)[1]
            loop_rows.append({**target, "response_token_ids": list(result.tokens)})
            starts[request.request_id] = [(r.position, r.al) for r in result.rounds]
            loop_al[request.request_id] = len(result.tokens) / len(result.rounds)
        speculative._verify = verify
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_json(saved, json_safe({"rows": loop_rows, "al": loop_al, "starts": starts, "alpha": loop_alpha}))
    run_collection(pair, requests, loop_rows, out, settings, mode="probe")  # resumes; no-op when complete
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
    # Calibration of the probe's acceptance probabilities in the loop: every drafted position the
    # loop verified (its accepted drafts and the first rejected one) is a Bernoulli trial whose
    # probability, given the committed prefix, is the probe's alpha on the loop's own text.
    by_step: dict[int, list[tuple[float, int]]] = {}
    paired: list[tuple[float, float]] = []  # (probe alpha, loop alpha) at every verified draft
    for r, rid in enumerate(traces.requests["request_id"]):
        alpha = np.nan_to_num(traces.outcome[r, arm].astype(np.float64), nan=0.0)
        for position, al in starts[str(rid)]:
            for step in range(min(al, traces.draft_length)):  # drafts tested: accepted + the rejected one
                if position + step < int(traces.osl[r]):
                    by_step.setdefault(step, []).append((float(alpha[position + step]), int(step < al - 1)))
                    paired.append((float(alpha[position + step]), loop_alpha[str(rid)][position + step]))
    trials = [trial for step in sorted(by_step) for trial in by_step[step]]
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
    figures["tested_positions"] = float(len(trials))
    figures["sum_alpha_tested"] = float(sum(a for a, _ in trials))
    figures["accepted_tested"] = float(sum(x for _, x in trials))
    first = by_step.get(0, [])
    figures["first_step_mean_alpha"] = float(np.mean([a for a, _ in first])) if first else float("nan")
    figures["first_step_accept_rate"] = float(np.mean([x for _, x in first])) if first else float("nan")
    later = [trial for step in sorted(by_step) if step > 0 for trial in by_step[step]]
    figures["later_steps_mean_alpha"] = float(np.mean([a for a, _ in later])) if later else float("nan")
    figures["later_steps_accept_rate"] = float(np.mean([x for _, x in later])) if later else float("nan")
    probe_alpha, own_alpha = np.array(paired).T
    figures["loop_own_alpha_mean"] = float(own_alpha.mean())
    figures["probe_alpha_same_positions"] = float(probe_alpha.mean())
    figures["max_abs_alpha_difference"] = float(np.max(np.abs(probe_alpha - own_alpha)))
    for key, value in figures.items():
        print(f"{key:<34} {value:.3f}")
    (args.run / "free_text.json").write_text(json.dumps(figures, indent=2))
    return 0


def _loop_seeds(args, requests, by_id, stat, pair, settings, replayed: dict) -> int:
    """Rerun the free-running `stat` loop with other seeds (all requests in one batch): mean AL per
    seed, and every verified draft's outcome against sum min(p, q) of the distributions its test
    used, by where the draft sits (a round's first draft after a rejection, after a fully accepted
    round, at a request's start; the later drafts of a round)."""
    from fidelity_paired import run_free_stat
    from scipy import stats

    from rift_ada import speculative

    verify = speculative._verify
    per_seed = []
    pooled: dict[str, list[list[float]]] = {}  # kind -> trials over every seed
    noise = np.random.default_rng(0)  # the randomised PIT's own draws (never the loop's generators)
    for seed in (int(x) for x in args.loop_seeds.split(",")):
        # kind -> trials [alpha, r(x), Var_{x~q} r, accepted, u, PIT of x under q]
        trials: dict[str, list[list[float]]] = {}
        rejected_last: dict[int, bool] = {}  # per request (its generator): did its last round end in a rejection?

        def recording_verify(
            drafted,
            draft_dists,
            target_logits,
            temperature,
            generator,
            trials=trials,
            rejected_last=rejected_last,
        ):
            # The uniforms _verify draws first (one per tested draft), read from a copy of its generator.
            replica = torch.Generator(device=generator.device)
            replica.set_state(generator.get_state())
            accepted, token = verify(drafted, draft_dists, target_logits, temperature, generator)
            before = rejected_last.get(id(generator))
            for index in range(min(accepted + 1, len(drafted))):  # the accepted drafts and the rejected one
                target = speculative._probs(target_logits[index], temperature).double()
                draft = draft_dists[index].double()
                ratio = torch.clamp(target / draft, max=1.0).nan_to_num(0.0)  # r(x) = min(1, p/q)
                alpha = float(torch.minimum(target, draft).sum())
                x = drafted[index]
                below = float(draft[:x].sum())
                kind = "later" if index else {None: "start", True: "after_rejection", False: "after_full"}[before]
                trials.setdefault(kind, []).append(
                    [
                        alpha,
                        float(ratio[x]),
                        float((draft * ratio**2).sum()) - alpha**2,
                        float(index < accepted),
                        float(torch.rand((), generator=replica)),
                        below + float(noise.random()) * float(draft[x]),
                    ]
                )
            rejected_last[id(generator)] = accepted < len(drafted)
            return accepted, token

        speculative._verify = recording_verify
        try:
            _, results = run_free_stat(
                pair, [by_id[request.request_id] for request in requests], stat.cache, settings, seed
            )
        finally:
            speculative._verify = verify
        per_seed.append(float(np.mean([len(r.tokens) / len(r.rounds) for r in results])))
        print(f"seed {seed}: free-running stat mean AL {per_seed[-1]:.3f}", flush=True)
        _print_trials(trials, stats)
        for kind, rows in trials.items():
            pooled.setdefault(kind, []).extend(rows)
    if len(per_seed) > 1:
        print(f"pooled over seeds {args.loop_seeds}:")
        _print_trials(pooled, stats)
    spread = float(np.std(per_seed, ddof=1)) if len(per_seed) > 1 else 0.0
    print(
        f"over {len(per_seed)} seeds: {np.mean(per_seed):.3f} +- {spread:.3f} (sd), "
        f"+- {spread / np.sqrt(len(per_seed)):.3f} (se); replay on the target text "
        f"{replayed['replay_al']:.3f} +- {replayed['replay_al_std']:.3f} (sd over replicas)"
    )
    return 0


def _print_trials(trials: dict[str, list[list[float]]], stats) -> None:
    """Per kind of draft: accepted vs sum alpha, split into the draw (is x ~ q: sum r(x) vs sum alpha)
    and the test (is the uniform uniform: accepted vs sum r(x)), with KS p-values of u and of x's PIT."""
    for kind in ("start", "after_rejection", "after_full", "later"):
        if kind not in trials:
            continue
        alpha, ratio, ratio_var, accepted, uniform, pit = np.array(trials[kind]).T
        z_all = (accepted.sum() - alpha.sum()) / np.sqrt((alpha * (1 - alpha)).sum())
        z_draw = (ratio.sum() - alpha.sum()) / np.sqrt(max(ratio_var.sum(), 1e-12))
        z_test = (accepted.sum() - ratio.sum()) / np.sqrt(max((ratio * (1 - ratio)).sum(), 1e-12))
        mismatched = int(((uniform < ratio) != (accepted > 0)).sum())  # the copied uniforms must be the test's
        print(
            f"  {kind:<16} drafts {len(alpha):5d}  accepted {int(accepted.sum()):6d}  sum alpha {alpha.sum():8.1f}"
            f"  z {z_all:+.2f} | sum r(x) {ratio.sum():8.1f} z_draw {z_draw:+.2f} z_test {z_test:+.2f}"
            f" | KS p: u {stats.kstest(uniform, 'uniform').pvalue:.3f} PIT {stats.kstest(pit, 'uniform').pvalue:.3f}"
            f" | u vs outcome mismatches {mismatched}",
            flush=True,
        )


if __name__ == "__main__":
    sys.exit(main())
