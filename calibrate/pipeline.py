"""``calibrate(...)``: probe traces in, a validated controller JSON + report out (the CLI calls this)."""

from __future__ import annotations

import datetime as _dt
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rift_ada.atomic import atomic_write_json, canonical_json
from rift_ada.calibrate.bootstrap import Interval, al_difference_ci, refresh_reduction_ci
from rift_ada.calibrate.export import (
    DEFAULT_CACHE,
    DEFAULT_SCHEDULE,
    DEFAULT_SIGNALS,
    controller_dict,
    export_controller,
    sha256_json,
)
from rift_ada.calibrate.grids import (
    SIGNALS,
    ThresholdGrids,
    check_signal_columns,
    decision_signals,
    percentile_grid,
    threshold_grids,
)
from rift_ada.calibrate.operating_point import OperatingPoint, TrialPoint, select_by_curve, select_operating_point
from rift_ada.calibrate.report import write_report
from rift_ada.calibrate.splits import CalibrationError, Splits, make_splits
from rift_ada.calibrate.study import (
    DEFAULT_INTERVALS,
    SEARCH_REPLICAS,
    PolicyEvaluator,
    StudyTask,
    baseline_labels,
    run_study,
    study_points,
)
from rift_ada.collectors.probe_traces import ProbeTraces
from rift_ada.collectors.trace_io import targets_problems
from rift_ada.policies.replay import DEFAULT_REPLICAS
from rift_ada.policies.space import FAMILIES, SearchSpace
from rift_ada.policy_spec import parse, periodic_label

SCORE_PERCENTILES: tuple[float, ...] = tuple(float(p) for p in np.linspace(2.0, 98.0, 49))
ROLE_CHOSEN, ROLE_REFERENCE, ROLE_MATCHED, ROLE_STAT, ROLE_FULL = (
    "chosen controller",
    "periodic reference",
    "periodic at the controller's refresh rate",
    "RIFT-stat",
    "full KV",
)


class _Progress:
    """Adapts ``progress`` (a callable ``(stage, done, total)`` or a rich ``Progress``) to one call."""

    def __init__(self, hook: Any) -> None:
        self.hook = hook
        self.tasks: dict[str, Any] = {}

    def __call__(self, stage: str, done: int, total: int | None) -> None:
        if self.hook is None:
            return
        if hasattr(self.hook, "add_task") and hasattr(self.hook, "update"):
            if stage not in self.tasks:
                self.tasks[stage] = self.hook.add_task(stage, total=total)
            self.hook.update(self.tasks[stage], completed=done, total=total)
        else:
            self.hook(stage, done, total)


@dataclass
class CalibrationResult:
    """What a calibration produced; every number is also in ``calibration.json``."""

    out_dir: Path
    controller: dict[str, Any]
    controller_path: Path
    calibration_path: Path
    report_path: Path
    calibration: dict[str, Any]
    splits: Splits
    operating_point: OperatingPoint
    study_name: str
    storage: str

    @property
    def split_sizes(self) -> dict[str, int]:
        """Requests per split."""
        return self.splits.sizes

    @property
    def has_gain(self) -> bool:
        """True when the confirmation split confirms a gain over periodic refresh."""
        return bool(self.calibration["confirmation"]["verdict"]["gain"])


def check_traces_match(manifest: dict[str, Any], model_draft: str, model_target: str, temperature: float) -> None:
    """Refuse traces whose manifest draft, target or temperature differ from the requested ones."""
    if not manifest:
        raise CalibrationError("the traces carry no manifest: cannot check draft, target and temperature")
    problems: list[str] = []
    mode = manifest.get("mode")
    if mode is not None and mode != "probe":
        problems.append(f"mode is {mode!r}, calibration needs 'probe' traces")
    for key, wanted in (("draft", model_draft), ("target", model_target)):
        have = manifest.get(key)
        if have is None:
            problems.append(f"manifest has no {key!r}")
        elif str(have) != str(wanted):
            problems.append(f"{key} is {have!r} in the traces but {wanted!r} was requested")
    have_t = manifest.get("temperature")
    if have_t is None:
        problems.append("manifest has no 'temperature'")
    elif not math.isclose(float(have_t), float(temperature), rel_tol=0.0, abs_tol=1e-9):
        problems.append(f"temperature is {float(have_t)} in the traces but {float(temperature)} was requested")
    problems += targets_problems(manifest, model_target, temperature)
    if problems:
        raise CalibrationError("traces do not match the calibration request: " + "; ".join(problems))


def _replay_sampling(traces: ProbeTraces, seed: int, search_replicas: int, confirm_replicas: int) -> dict[str, Any]:
    """How replay sampled acceptance (provenance): exact at T = 0; seeded replicas at T > 0."""
    if traces.temperature <= 0:
        return {"mode": "exact (T = 0)", "replicas": 1}
    return {
        "mode": "acceptance sampled per position",
        "study_replicas": int(search_replicas),
        "confirmation_replicas": int(confirm_replicas),
        "grids_and_score_fit_replicas": DEFAULT_REPLICAS,
        "study_and_confirmation_seed": 0,
        "grids_and_score_fit_seed": int(seed),
    }


def check_probed_ages(traces: ProbeTraces, schedule: dict[str, Any], intervals: Sequence[int]) -> None:
    """Refuse a schedule or periodic baseline whose working sets outgrow the probe arms (replay would)."""
    if len(traces.age_grid) == 0:
        raise CalibrationError("the traces have no 'age:N' arms; calibration needs them")
    oldest = int(traces.age_grid.max())
    longest = int(traces.osl.max()) - 1 if traces.n_requests else 0
    wanted = {"schedule.max_age": int(schedule["max_age"])}
    wanted.update({periodic_label(d): min(int(d), int(schedule["max_age"])) for d in intervals})
    too_old = {name: age for name, age in wanted.items() if min(age, longest) > oldest}
    if too_old:
        shown = ", ".join(f"{name} ({age})" for name, age in too_old.items())
        raise CalibrationError(
            f"working-set ages beyond the probe arms ({int(traces.age_grid.min())}..{oldest}): {shown}; "
            f"probe with arms up to {max(too_old.values())} or lower schedule.max_age / the periodic intervals"
        )


def _fit_score(traces: ProbeTraces, signals: Sequence[str], seed: int = 0) -> Any:
    """ScorePolicy fitted (NNLS on counterfactual refresh gains) on the calibration split."""
    from rift_ada.policies.score import ScorePolicy

    try:
        return ScorePolicy().fit(traces, signals=list(signals), seed=seed)
    except ValueError as exc:
        raise CalibrationError(f"cannot fit the score family on the calibration split: {exc}") from exc


def _score_grid(fitted: Any, traces: ProbeTraces, seed: int = 0) -> tuple[float, ...]:
    """Thresholds over the percentiles of the fitted score at the calibration decision points."""
    values = np.asarray(fitted.score_values(decision_signals(traces, seed=seed)), dtype=np.float64)
    return percentile_grid(values[np.isfinite(values)], SCORE_PERCENTILES)


def _storage_url(storage: str | None, out_dir: Path) -> tuple[str, str]:
    """(URL to open, text for provenance: the default is recorded relative to the run directory)."""
    if storage is None:
        return f"sqlite:///{(out_dir / 'study.db').resolve()}", "sqlite:///study.db (in the run directory)"
    shown = storage
    if "://" in storage and not storage.startswith(("sqlite", "redis")):
        try:
            from sqlalchemy.engine import make_url

            shown = make_url(storage).render_as_string(hide_password=True)
        except Exception:  # only for display
            shown = storage.split("@")[-1]
    return storage, shown


def _macro_by_position(al_by_position: np.ndarray) -> list[float | None]:
    with np.errstate(all="ignore"):
        counts = np.sum(np.isfinite(al_by_position), axis=0)
        means = np.nansum(al_by_position, axis=0) / np.maximum(counts, 1)
    return [float(m) if c > 0 else None for m, c in zip(means, counts, strict=True)]


def _policy_entry(result: Any, role: str, policy: dict[str, Any] | str) -> dict[str, Any]:
    refreshes = np.asarray(result.refreshes, dtype=np.float64)
    committed = np.asarray(result.committed, dtype=np.float64)
    return {
        "role": role,
        "policy": policy,
        "mean_al": float(result.mean_al),
        "refreshes_per_1k": float(result.refreshes_per_1k),
        "replicas": int(result.replicas),
        "refreshes_total": int(round(refreshes.sum())),
        "committed_total": int(round(committed.sum())),
        "al_by_position": _macro_by_position(np.asarray(result.al_by_position, dtype=np.float64)),
        "per_request": {
            "al": [float(x) for x in np.asarray(result.al, dtype=np.float64)],
            "refreshes": [float(x) for x in refreshes],
            "committed": [float(x) for x in committed],
        },
    }


def _matched_rate_baseline(evaluator: PolicyEvaluator, rate: float) -> str:
    """The longest periodic interval that refreshes at least ``rate`` times per 1K on the selection split.

    Periodic refreshes fall (weakly) as the interval grows, so a binary search over
    [1, min(1000 / rate, oldest probed age)] finds it in about ten replays; ``stat`` when the
    controller never refreshes.
    """
    if rate <= 0:
        return "stat"
    traces = evaluator.traces
    # Intervals past the oldest probed arm cannot be replayed (unless no response is that long).
    high = max(1, int(math.floor(1000.0 / rate)))
    if int(traces.osl.max()) - 1 > int(traces.age_grid.max()):
        high = min(high, int(traces.age_grid.max()))
    low = 1
    if evaluator.evaluate(periodic_label(high))[1] >= rate:
        return periodic_label(high)
    while high - low > 1:  # invariant: rate(low) >= target > rate(high)
        mid = (low + high) // 2
        if evaluator.evaluate(periodic_label(mid))[1] >= rate:
            low = mid
        else:
            high = mid
    return periodic_label(low)


def _comparison(
    name: str, ctl: dict[str, Any], base_label: str, base: dict[str, Any], *, seed: int, n_resamples: int
) -> dict[str, Any]:
    ctl_req, base_req = ctl["per_request"], base["per_request"]
    reduction: Interval | None = None
    if sum(base_req["refreshes"]) > 0:
        reduction = refresh_reduction_ci(
            np.asarray(ctl_req["refreshes"]), np.asarray(base_req["refreshes"]), n_resamples=n_resamples, seed=seed
        )
    diff = al_difference_ci(np.asarray(ctl_req["al"]), np.asarray(base_req["al"]), n_resamples=n_resamples, seed=seed)
    return {
        "name": name,
        "baseline": base_label,
        "refresh_reduction": None if reduction is None else _finite_dict(reduction),
        "al_difference": _finite_dict(diff),
    }


def _finite_dict(interval: Interval) -> dict[str, Any]:
    out = interval.to_dict()
    for key in ("estimate", "low", "high"):
        if out[key] is not None and not math.isfinite(out[key]):
            out[key] = None
    return out


DEFAULT_MARGIN = 0.01  # non-inferiority margin: 1% of the reference AL


def verdict(
    comparisons: list[dict[str, Any]],
    reference_label: str,
    *,
    reference_al: float,
    margin: float = DEFAULT_MARGIN,
    chosen_is_reference: bool = False,
    notes: Sequence[str] = (),
    source: str = "replay",
) -> dict[str, Any]:
    """Gain verdict from the two paired-bootstrap comparisons (vs the reference, vs matched rate).

    A gain needs: the refresh-reduction CI vs the reference above 0; AL kept, i.e. the lower CI
    bound of the AL difference vs the reference >= -margin x reference AL (non-inferiority); and
    the AL difference vs periodic at the controller's own rate significantly above 0.
    """
    margin_al = float(margin) * float(reference_al)
    margin_info = {"fraction": float(margin), "al": margin_al, "reference_al": float(reference_al)}
    if chosen_is_reference:
        return {
            "gain": False,
            "source": source,
            "margin": margin_info,
            "text": f"**No gain.** No adaptive trial beat {reference_label} on the selection split at matched "
            f"AL or matched refreshes; the exported controller is the periodic reference itself.",
            "reasons": list(notes),
        }
    vs_ref, vs_rate = comparisons[0], comparisons[1]
    red, d_ref, d_rate = vs_ref["refresh_reduction"], vs_ref["al_difference"], vs_rate["al_difference"]
    reasons: list[str] = []
    saves = bool(red and red["low"] is not None and red["low"] > 0)
    al_kept = bool(d_ref["low"] is not None and d_ref["low"] >= -margin_al)
    beats_curve = bool(d_rate["low"] is not None and d_rate["low"] > 0)
    margin_text = f"margin {100 * margin:g}% of the reference AL = {margin_al:.3f}"
    if not saves:
        reasons.append(f"the refresh-reduction CI vs {reference_label} does not exclude 0")
    if not al_kept:
        reasons.append(
            f"AL is not shown non-inferior to {reference_label}: the CI's lower bound "
            f"{_n(d_ref['low'])} is below -{margin_al:.3f} ({margin_text})"
        )
    if not beats_curve:
        reasons.append(
            f"AL is not significantly above periodic refresh at the controller's own rate ({vs_rate['baseline']}): "
            "the saving is what refreshing less often gives anyway"
        )
    gain = saves and al_kept and beats_curve
    red_text = "–" if red is None else f"{100 * red['estimate']:.1f}% [{100 * (red['low'] or 0):.1f}%, "
    if red is not None:
        red_text += f"{100 * (red['high'] or 0):.1f}%]"
    ci = f"AL difference {d_ref['estimate']:+.3f} [{_n(d_ref['low'])}, {_n(d_ref['high'])}]"
    ci_rate = f"{d_rate['estimate']:+.3f} [{_n(d_rate['low'])}, {_n(d_rate['high'])}]"
    where = "in the closed loop" if source == "closed loop" else "by replay"
    if gain:
        text = (
            f"**Gain confirmed** on the held-out confirmation split ({where}): {red_text} fewer refreshes than "
            f"{reference_label} ({ci}; AL kept: non-inferior with {margin_text}); against {vs_rate['baseline']} "
            f"(as many refreshes or more) the AL difference is {ci_rate}."
        )
    else:
        text = (
            f"**No confirmed gain** over periodic refresh ({where}). Refresh reduction vs {reference_label}: "
            f"{red_text}, {ci}; vs {vs_rate['baseline']}: AL difference {ci_rate}; non-inferiority "
            f"{margin_text}. Why: " + "; ".join(reasons) + "."
        )
    return {"gain": gain, "source": source, "margin": margin_info, "text": text, "reasons": reasons}


def describe_sampler(sampler: Any, *, seed: int, workers: int = 1) -> str:
    """What the study's sampler object is, read from it (class and its settings), for provenance."""
    settings: dict[str, Any] = {}
    for key, attribute in (
        ("n_startup_trials", "_n_startup_trials"),
        ("n_ei_candidates", "_n_ei_candidates"),
        ("group", "_group"),
        ("constant_liar", "_constant_liar"),
    ):
        if hasattr(sampler, attribute):
            settings[key] = getattr(sampler, attribute)
    parzen = getattr(sampler, "_parzen_estimator_parameters", None)
    if parzen is not None and hasattr(parzen, "multivariate"):
        settings["multivariate"] = bool(parzen.multivariate)
    seeds = (
        f"seed {seed} (each new trial's sampler seeded from it and the trial's slot)"
        if workers <= 1
        else f"seeds {seed}..{seed + workers - 1} (one per worker)"
    )
    shown = ", ".join(f"{key}={value}" for key, value in settings.items())
    return f"{type(sampler).__name__}({shown}), {seeds}"


def _n(value: float | None) -> str:
    return "nan" if value is None else f"{value:+.3f}"


def calibrate(
    traces: ProbeTraces,
    out_dir: str | Path,
    *,
    name: str,
    draft: str,
    target: str,
    temperature: float,
    trials: int = 200,
    timeout: float | None = None,
    storage: str | None = None,
    workers: int = 1,
    seed: int = 0,
    split: Sequence[float] = (0.4, 0.3, 0.3),
    reference_interval: int = 128,
    families: Sequence[str] = ("gate", "score"),
    manifest_hash: str | None = None,
    progress: Callable[[str, int, int | None], None] | Any | None = None,
    log: Callable[[str], Any] | None = print,
    signals: Sequence[str] | None = None,
    intervals: Sequence[int] = DEFAULT_INTERVALS,
    study_name: str | None = None,
    position_bin: int = 256,
    n_resamples: int = 9999,
    cache: dict[str, Any] | None = None,
    schedule: dict[str, Any] | None = None,
    margin: float = DEFAULT_MARGIN,
    search_replicas: int = SEARCH_REPLICAS,
    confirm_replicas: int = DEFAULT_REPLICAS,
    objective: str = "matched_al",
    selection_margin: float = 0.02,
) -> CalibrationResult:
    """Calibrate a RIFT-ada controller on probe traces and write it, with a report, into ``out_dir``.

    Splits the requests (calibration / selection / confirmation), builds percentile threshold
    grids and fits the score family on the calibration split, runs a seeded multi-objective Optuna
    study by replay on the selection split (baselines included), picks the matched-AL operating
    point, confirms it with paired-bootstrap CIs on the confirmation split, and writes
    ``controller.json`` (validated, with provenance), ``calibration.json``, ``report.md`` and plots.
    ``trials`` counts searched trials; the baselines are added on top. ``progress`` is a callable
    ``(stage, done, total)`` or a rich ``Progress``; ``log`` gets one-line milestones (split sizes,
    the chosen point, the verdict), ``None`` silences them. ``signals`` restricts the signals the
    search may use (default: all five, ``query_drift`` only when the traces carry it). ``margin``:
    the non-inferiority margin of "AL kept", a fraction of the reference's confirmation AL.
    ``search_replicas`` / ``confirm_replicas``: replay's sampling replicas at T > 0 in the study
    (default 1: every trial sees the same uniforms, so comparisons stay paired and a trial costs a
    quarter) and in the confirmation (default 4, the spread the verdict reads); ignored at T = 0.
    ``objective``: how the operating point is chosen on the selection split: ``matched_al`` (the fewest
    refreshes at the reference's AL) or ``curve`` (the largest AL gain over the periodic curve at the trial's
    own refresh count, ties within ``selection_margin`` AL going to the fewest refreshes; see
    :func:`~rift_ada.calibrate.operating_point.select_by_curve`).
    """
    t0 = time.monotonic()
    report = _Progress(progress)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if traces.manifest:
        check_traces_match(traces.manifest, draft, target, temperature)
    elif not math.isclose(float(traces.temperature), float(temperature), abs_tol=1e-9):
        raise CalibrationError(
            f"temperature is {traces.temperature} in the traces but {float(temperature)} was requested"
        )
    unknown = [f for f in families if f not in FAMILIES]
    if unknown or not families:
        raise CalibrationError(f"families must be a non-empty subset of {list(FAMILIES)}, got {list(families)}")
    if trials < 0:
        raise CalibrationError(f"trials must be non-negative, got {trials}")
    if search_replicas < 1 or confirm_replicas < 1:
        raise CalibrationError(
            f"replicas must be >= 1, got search_replicas={search_replicas}, confirm_replicas={confirm_replicas}"
        )
    if objective not in ("matched_al", "curve"):
        raise CalibrationError(f"objective must be 'matched_al' or 'curve', got {objective!r}")
    if not 0.0 <= margin < 1.0:
        raise CalibrationError(f"margin must be a fraction of the reference AL in [0, 1), got {margin}")
    if signals is None:
        signals = tuple(s for s in SIGNALS if s != "query_drift" or "query_drift" in traces.stride_signals)
    selected_signals = tuple(signals)
    unknown_signals = [s for s in selected_signals if s not in SIGNALS]
    if unknown_signals or not selected_signals:
        raise CalibrationError(f"signals must be a non-empty subset of {list(SIGNALS)}, got {list(signals)}")
    check_signal_columns(traces, selected_signals)
    sched = dict(DEFAULT_SCHEDULE, decision_stride=int(traces.decision_stride))
    if schedule:
        sched.update(schedule)
    baselines = tuple(baseline_labels(intervals, reference_interval))  # refuses non-positive intervals
    check_probed_ages(traces, sched, [*intervals, reference_interval])
    say = log if log is not None else (lambda _msg: None)

    # 1. splits
    splits = make_splits(traces, split, seed=seed)
    report("splits", 1, 1)
    say("splits: " + ", ".join(f"{k} {v}" for k, v in splits.sizes.items()) + f" requests (seed {seed})")
    cal_traces = traces.subset(splits.calibration)
    sel_traces = traces.subset(splits.selection)
    conf_traces = traces.subset(splits.confirmation)

    # 2. grids (and the fitted score) from the calibration split
    grids: ThresholdGrids = threshold_grids(cal_traces, selected_signals, seed=seed)
    score_terms: tuple[dict[str, Any], ...] = ()
    score_grid: tuple[float, ...] = ()
    if "score" in families:
        fitted = _fit_score(cal_traces, selected_signals, seed)
        score_terms = tuple(term.to_json() for term in fitted.terms)
        score_grid = _score_grid(fitted, cal_traces, seed)
    space = SearchSpace(
        grids=dict(grids.values), families=tuple(families), score_terms=score_terms, score_grid=score_grid
    )
    report("grids", 1, 1)

    # 3. the study on the selection split
    manifest_cache = traces.manifest.get("cache") if traces.manifest else None
    if isinstance(manifest_cache, dict):  # the manifest may carry more than the controller's fields
        manifest_cache = {k: v for k, v in manifest_cache.items() if k in DEFAULT_CACHE}
    fields = {
        "name": name,
        "draft": draft,
        "target": target,
        "temperature": float(temperature),
        # The cache the traces were collected with (block_size None = token level), then explicit overrides.
        "cache": {**DEFAULT_CACHE, **(manifest_cache or {}), **(cache or {})},
        "schedule": sched,
        "signals": dict(DEFAULT_SIGNALS),
    }
    storage_url, storage_shown = _storage_url(storage, out)
    study_name = study_name or f"rift-ada-{name}"
    task = StudyTask(
        storage=storage_url,
        study_name=study_name,
        n_trials=int(trials),
        seed=int(seed),
        space=space,
        evaluator=PolicyEvaluator(sel_traces, fields, position_bin=position_bin, replicas=search_replicas),
        baselines=baselines,
        timeout=timeout,
    )
    t_study = time.monotonic()
    study = run_study(task, workers=workers, progress=report)
    study_wall = time.monotonic() - t_study
    points: list[TrialPoint] = study_points(study)
    missing = sorted(set(baselines) - {p.label for p in points if p.baseline})
    if missing:
        raise CalibrationError(f"baseline trial(s) {missing} did not complete (timeout too short?)")
    # One point per baseline label (a shared storage may hold a duplicate enqueued by a racing worker).
    seen: set[str] = set()
    unique_points = []
    for p in points:
        if p.baseline and p.label in seen:
            continue
        seen.add(p.label)
        unique_points.append(p)
    points = unique_points

    # 4. operating point
    reference_label = periodic_label(reference_interval)
    if objective == "curve":
        op = select_by_curve(points, reference_label, selection_margin)
    else:
        op = select_operating_point(points, reference_label)
    periodic_curve = sorted(
        (
            {"interval": parse(p.label).interval, "mean_al": p.al, "refreshes_per_1k": p.refreshes_per_1k}
            for p in points
            if p.baseline and p.family == "periodic"
        ),
        key=lambda c: c["interval"],
    )

    # 5. confirmation
    chosen = op.chosen
    chosen_target: dict[str, Any] | str = chosen.label if chosen.baseline else chosen.policy
    rate_label = _matched_rate_baseline(task.evaluator, chosen.refreshes_per_1k)
    conf_eval = PolicyEvaluator(conf_traces, fields, position_bin=position_bin, replicas=confirm_replicas)
    plan: list[tuple[str, str, dict[str, Any] | str]] = [
        ("chosen", ROLE_CHOSEN, chosen_target),
        (reference_label, ROLE_REFERENCE, reference_label),
        (rate_label, ROLE_MATCHED, rate_label),
        ("stat", ROLE_STAT, "stat"),
        ("full", ROLE_FULL, "full"),
    ]
    unique_plan: dict[str, tuple[str, dict[str, Any] | str]] = {}
    for label, role, target_policy in plan:
        if label in unique_plan:
            unique_plan[label] = (unique_plan[label][0] + f", {role}", unique_plan[label][1])
        else:
            unique_plan[label] = (role, target_policy)
    results = conf_eval.run_many([target_policy for _, target_policy in unique_plan.values()])
    policies: dict[str, dict[str, Any]] = {
        label: _policy_entry(result, role, target_policy)
        for (label, (role, target_policy)), result in zip(unique_plan.items(), results, strict=True)
    }
    edges = [float(e) for e in np.asarray(results[0].position_edges).ravel()]
    report("confirmation", 1, 1)
    comparisons = [
        _comparison(
            "matched AL",
            policies["chosen"],
            reference_label,
            policies[reference_label],
            seed=seed,
            n_resamples=n_resamples,
        ),
        _comparison(
            "matched refreshes",
            policies["chosen"],
            rate_label,
            policies[rate_label],
            seed=seed,
            n_resamples=n_resamples,
        ),
    ]
    decision = verdict(
        comparisons,
        reference_label,
        reference_al=policies[reference_label]["mean_al"],
        margin=margin,
        chosen_is_reference=op.chosen_by == "reference_baseline",
        notes=op.notes,
    )
    say(
        f"chosen: trial {chosen.number} ({chosen.family}, {op.chosen_by.replace('_', ' ')}), "
        f"selection AL {chosen.al:.3f} at {chosen.refreshes_per_1k:.2f} refreshes/1K vs {reference_label} "
        f"AL {op.reference.al:.3f} at {op.reference.refreshes_per_1k:.2f}"
    )
    say("confirmation: " + ("gain confirmed" if decision["gain"] else "no confirmed gain"))
    confirmation = {
        "n_requests": int(len(splits.confirmation)),
        "request_ids": [str(x) for x in conf_traces.requests["request_id"]],
        "seed": int(seed),
        "n_resamples": int(n_resamples),
        "confidence": 0.95,
        "position_edges": edges,
        "policy_order": list(policies),
        "policies": policies,
        "comparisons": comparisons,
        "margin": decision["margin"],
        "verdict": decision,
    }

    # 6. export
    created = _dt.datetime.now(_dt.UTC).replace(microsecond=0).isoformat()
    manifest_json_hash = sha256_json(traces.manifest) if traces.manifest else None
    trace_info = {
        "manifest_hash": manifest_hash,
        "manifest_json_sha256": manifest_json_hash,
        "n_requests": int(traces.n_requests),
        "dataset": traces.manifest.get("dataset") if traces.manifest else None,
        "temperature": float(traces.temperature),
        "decision_stride": int(traces.decision_stride),
        "draft_length": int(traces.draft_length),
    }
    n_complete = len(points)
    provenance = {
        "created": created,
        "tool": "rift-ada calibrate",
        "traces": trace_info,
        "seed": int(seed),
        "splits": splits.to_dict(),
        "study": {
            "name": study_name,
            "storage": storage_shown,
            "trials": int(trials),
            "baselines": list(baselines),
            "complete": n_complete,
            "sampler": describe_sampler(study.sampler, seed=int(seed), workers=int(workers)),
            "objectives": ["mean_al:maximize", "refreshes_per_1k:minimize"],
            "search_space": space.fingerprint(),
        },
        "replay": _replay_sampling(traces, seed, search_replicas, confirm_replicas),
        "signals": list(selected_signals),  # what the search could use (an engine feeds these)
        "reference": reference_label,
        "chosen_trial": {
            "number": chosen.number,
            "label": chosen.label,
            "family": chosen.family,
            "params": chosen.params,
            "chosen_by": op.chosen_by,
            "selection": {"mean_al": chosen.al, "refreshes_per_1k": chosen.refreshes_per_1k},
        },
        "confirmation": {
            "n_requests": confirmation["n_requests"],
            "comparisons": comparisons,
            "margin": decision["margin"],
            "gain": decision["gain"],
            "source": "replay",
        },
    }
    export_policy = chosen.policy if not chosen.baseline else {"kind": "periodic", "interval": int(reference_interval)}
    controller = controller_dict(export_policy, **fields)
    controller["calibration"] = provenance
    report("export", 0, 3)
    controller_path = export_controller(controller, out / "controller.json")

    calibration = {
        "format": "rift-ada.calibration",
        "version": 1,
        "created": created,
        "name": name,
        "draft": draft,
        "target": target,
        "temperature": float(temperature),
        "seed": int(seed),
        "traces": trace_info,
        "splits": dict(splits.to_dict(), assignment=splits.assignment()),
        "signals": list(selected_signals),
        "replay": _replay_sampling(traces, seed, search_replicas, confirm_replicas),
        "grids": grids.to_dict(),
        "space": space.to_dict(),
        "study": {
            "name": study_name,
            "storage": storage_shown,
            "search_trials": int(trials),
            "n_baselines": len(baselines),
            "complete": n_complete,
            "workers": int(workers),
            "timeout": timeout,
            "sampler": provenance["study"]["sampler"],
            "wall_s": study_wall,
        },
        "trials": [p.to_dict() for p in points],
        "periodic_curve": periodic_curve,
        "operating_point": op.to_dict(),
        "confirmation": confirmation,
        "controller": "controller.json",
        "wall_s": time.monotonic() - t0,
    }
    calibration_path = atomic_write_json(out / "calibration.json", calibration)
    report("export", 2, 3)
    # Render from the JSON as written, so the report is exactly what calibration.json gives.
    report_path = write_report(json.loads(canonical_json(calibration)), out)
    report("export", 3, 3)
    return CalibrationResult(
        out_dir=out,
        controller=controller,
        controller_path=controller_path,
        calibration_path=calibration_path,
        report_path=report_path,
        calibration=calibration,
        splits=splits,
        operating_point=op,
        study_name=study_name,
        storage=storage_url,
    )
