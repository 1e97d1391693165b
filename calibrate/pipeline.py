"""``calibrate(traces, out_dir, config)``: probe traces in, a validated controller JSON + report out.

The CLI calls it. It runs one stage function after another, each returning a small typed result:
:func:`check_inputs`, :func:`split_traces`, :func:`fit_space`, :func:`run_search`,
:func:`choose_operating_point`, :func:`confirm_by_replay`, then :func:`write_outputs`.
"""

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
from rift_ada.calibrate.config import DEFAULT_MARGIN, CalibrationConfig
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
    PolicyEvaluator,
    StudyTask,
    baseline_labels,
    run_study,
    study_points,
)
from rift_ada.collectors.probe_traces import ProbeTraces
from rift_ada.collectors.trace_io import targets_problems
from rift_ada.policies.replay import DEFAULT_REPLICAS
from rift_ada.policies.space import SearchSpace
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
    config: CalibrationConfig

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


@dataclass(frozen=True)
class Inputs:
    """What the traces settle: the signals searched, the schedule, the baselines and the controller's fields."""

    signals: tuple[str, ...]
    baselines: tuple[str, ...]
    reference_label: str
    fields: dict[str, Any]  # controller fields: name, draft, target, temperature, cache, schedule, signals


def check_inputs(traces: ProbeTraces, config: CalibrationConfig) -> Inputs:
    """Refuse traces that do not fit ``config`` (manifest, signal columns, probed ages); resolve the defaults."""
    if traces.manifest:
        check_traces_match(traces.manifest, config.draft, config.target, config.temperature)
    elif not math.isclose(float(traces.temperature), float(config.temperature), abs_tol=1e-9):
        raise CalibrationError(
            f"temperature is {traces.temperature} in the traces but {float(config.temperature)} was requested"
        )
    signals = config.signals
    if signals is None:
        signals = tuple(s for s in SIGNALS if s != "query_drift" or "query_drift" in traces.stride_signals)
    check_signal_columns(traces, signals)
    schedule = dict(DEFAULT_SCHEDULE, decision_stride=int(traces.decision_stride))
    if config.schedule:
        schedule.update(config.schedule)
    baselines = tuple(baseline_labels(config.intervals, config.reference_interval))
    check_probed_ages(traces, schedule, [*config.intervals, config.reference_interval])
    manifest_cache = traces.manifest.get("cache") if traces.manifest else None
    if isinstance(manifest_cache, dict):  # the manifest may carry more than the controller's fields
        manifest_cache = {k: v for k, v in manifest_cache.items() if k in DEFAULT_CACHE}
    fields = {
        "name": config.name,
        "draft": config.draft,
        "target": config.target,
        "temperature": float(config.temperature),
        # The cache the traces were collected with (block_size None = token level), then explicit overrides.
        "cache": {**DEFAULT_CACHE, **(manifest_cache or {}), **(config.cache or {})},
        "schedule": schedule,
        "signals": dict(DEFAULT_SIGNALS),
    }
    return Inputs(signals, baselines, periodic_label(config.reference_interval), fields)


@dataclass(frozen=True)
class SplitTraces:
    """The seeded splits and the traces of each."""

    splits: Splits
    calibration: ProbeTraces
    selection: ProbeTraces
    confirmation: ProbeTraces


def split_traces(traces: ProbeTraces, config: CalibrationConfig) -> SplitTraces:
    """Calibration / selection / confirmation requests, seeded and stratified (:func:`make_splits`)."""
    splits = make_splits(traces, config.split, seed=config.seed)
    return SplitTraces(
        splits, traces.subset(splits.calibration), traces.subset(splits.selection), traces.subset(splits.confirmation)
    )


@dataclass(frozen=True)
class FittedSpace:
    """Threshold grids from the calibration split and the search space built on them (score family fitted)."""

    grids: ThresholdGrids
    space: SearchSpace


def fit_space(calibration: ProbeTraces, signals: Sequence[str], config: CalibrationConfig) -> FittedSpace:
    """Percentile grids of ``signals`` on the calibration split, and the fitted score when it is searched."""
    grids = threshold_grids(calibration, signals, seed=config.seed)
    score_terms: tuple[dict[str, Any], ...] = ()
    score_grid: tuple[float, ...] = ()
    if "score" in config.families:
        fitted = _fit_score(calibration, signals, config.seed)
        score_terms = tuple(term.to_json() for term in fitted.terms)
        score_grid = _score_grid(fitted, calibration, config.seed)
    space = SearchSpace(
        grids=dict(grids.values), families=tuple(config.families), score_terms=score_terms, score_grid=score_grid
    )
    return FittedSpace(grids, space)


@dataclass(frozen=True)
class SearchOutcome:
    """The study on the selection split: its trials (one per baseline label), where it lives, what ran it."""

    points: list[TrialPoint]
    evaluator: PolicyEvaluator  # the selection split's (the matched-rate search reuses it)
    study_name: str
    storage_url: str
    storage_shown: str
    sampler: str
    wall_s: float


def run_search(
    selection: ProbeTraces,
    out: Path,
    config: CalibrationConfig,
    inputs: Inputs,
    space: SearchSpace,
    progress: Callable[[str, int, int | None], None],
) -> SearchOutcome:
    """Run the seeded multi-objective study by replay on the selection split, baselines included."""
    storage_url, storage_shown = _storage_url(config.storage, out)
    study_name = config.study_name or f"rift-ada-{config.name}"
    task = StudyTask(
        storage=storage_url,
        study_name=study_name,
        n_trials=int(config.trials),
        seed=int(config.seed),
        space=space,
        evaluator=PolicyEvaluator(
            selection, inputs.fields, position_bin=config.position_bin, replicas=config.search_replicas
        ),
        baselines=inputs.baselines,
        timeout=config.timeout,
    )
    started = time.monotonic()
    study = run_study(task, workers=config.workers, progress=progress)
    wall_s = time.monotonic() - started
    points = study_points(study)
    missing = sorted(set(inputs.baselines) - {p.label for p in points if p.baseline})
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
    sampler = describe_sampler(study.sampler, seed=int(config.seed), workers=int(config.workers))
    return SearchOutcome(unique_points, task.evaluator, study_name, storage_url, storage_shown, sampler, wall_s)


@dataclass(frozen=True)
class Choice:
    """The operating point chosen on the selection split, and the periodic curve it was chosen against."""

    point: OperatingPoint
    periodic_curve: list[dict[str, Any]]


def choose_operating_point(points: Sequence[TrialPoint], reference_label: str, config: CalibrationConfig) -> Choice:
    """Matched AL (:func:`select_operating_point`) or the curve objective (:func:`select_by_curve`)."""
    if config.objective == "curve":
        op = select_by_curve(points, reference_label, config.selection_margin)
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
    return Choice(op, periodic_curve)


@dataclass(frozen=True)
class Confirmation:
    """The held-out replay of the chosen controller and its baselines: the JSON record and its verdict."""

    record: dict[str, Any]  # calibration.json's "confirmation"
    comparisons: list[dict[str, Any]]
    verdict: dict[str, Any]


def confirm_by_replay(
    split: SplitTraces, search: SearchOutcome, op: OperatingPoint, inputs: Inputs, config: CalibrationConfig
) -> Confirmation:
    """Replay the chosen controller, the reference, periodic at its rate, stat and full on the confirmation
    split; paired-bootstrap comparisons and the gain verdict."""
    chosen, reference_label = op.chosen, inputs.reference_label
    chosen_target: dict[str, Any] | str = chosen.label if chosen.baseline else chosen.policy
    rate_label = _matched_rate_baseline(search.evaluator, chosen.refreshes_per_1k)
    conf_eval = PolicyEvaluator(
        split.confirmation, inputs.fields, position_bin=config.position_bin, replicas=config.confirm_replicas
    )
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
    comparisons = [
        _comparison(name, policies["chosen"], label, policies[label], seed=config.seed, n_resamples=config.n_resamples)
        for name, label in (("matched AL", reference_label), ("matched refreshes", rate_label))
    ]
    decision = verdict(
        comparisons,
        reference_label,
        reference_al=policies[reference_label]["mean_al"],
        margin=config.margin,
        chosen_is_reference=op.chosen_by == "reference_baseline",
        notes=op.notes,
    )
    record = {
        "n_requests": int(len(split.splits.confirmation)),
        "request_ids": [str(x) for x in split.confirmation.requests["request_id"]],
        "seed": int(config.seed),
        "n_resamples": int(config.n_resamples),
        "confidence": 0.95,
        "position_edges": edges,
        "policy_order": list(policies),
        "policies": policies,
        "comparisons": comparisons,
        "margin": decision["margin"],
        "verdict": decision,
    }
    return Confirmation(record, comparisons, decision)


@dataclass(frozen=True)
class Stages:
    """Every stage's result, what the export reads."""

    config: CalibrationConfig
    inputs: Inputs
    split: SplitTraces
    fitted: FittedSpace
    search: SearchOutcome
    choice: Choice
    confirmation: Confirmation


def _trace_info(traces: ProbeTraces, config: CalibrationConfig) -> dict[str, Any]:
    return {
        "manifest_hash": config.manifest_hash,
        "manifest_json_sha256": sha256_json(traces.manifest) if traces.manifest else None,
        "n_requests": int(traces.n_requests),
        "dataset": traces.manifest.get("dataset") if traces.manifest else None,
        "temperature": float(traces.temperature),
        "decision_stride": int(traces.decision_stride),
        "draft_length": int(traces.draft_length),
    }


def controller_record(traces: ProbeTraces, stages: Stages, created: str) -> dict[str, Any]:
    """The controller JSON: the chosen policy (the reference when no trial won) with its provenance."""
    config, search, op, decision = stages.config, stages.search, stages.choice.point, stages.confirmation.verdict
    chosen = op.chosen
    provenance = {
        "created": created,
        "tool": "rift-ada calibrate",
        "traces": _trace_info(traces, config),
        "seed": int(config.seed),
        "splits": stages.split.splits.to_dict(),
        "study": {
            "name": search.study_name,
            "storage": search.storage_shown,
            "trials": int(config.trials),
            "baselines": list(stages.inputs.baselines),
            "complete": len(search.points),
            "sampler": search.sampler,
            "objectives": ["mean_al:maximize", "refreshes_per_1k:minimize"],
            "search_space": stages.fitted.space.fingerprint(),
        },
        "replay": _replay_sampling(traces, config.seed, config.search_replicas, config.confirm_replicas),
        "signals": list(stages.inputs.signals),  # what the search could use (an engine feeds these)
        "reference": stages.inputs.reference_label,
        "chosen_trial": {
            "number": chosen.number,
            "label": chosen.label,
            "family": chosen.family,
            "params": chosen.params,
            "chosen_by": op.chosen_by,
            "selection": {"mean_al": chosen.al, "refreshes_per_1k": chosen.refreshes_per_1k},
        },
        "confirmation": {
            "n_requests": stages.confirmation.record["n_requests"],
            "comparisons": stages.confirmation.comparisons,
            "margin": decision["margin"],
            "gain": decision["gain"],
            "source": "replay",
        },
    }
    export_policy = (
        chosen.policy if not chosen.baseline else {"kind": "periodic", "interval": int(config.reference_interval)}
    )
    controller = controller_dict(export_policy, **stages.inputs.fields)
    controller["calibration"] = provenance
    return controller


def calibration_record(traces: ProbeTraces, stages: Stages, created: str, wall_s: float) -> dict[str, Any]:
    """``calibration.json``: every stage's figures (the report is rendered from it)."""
    config, search, fitted = stages.config, stages.search, stages.fitted
    return {
        "format": "rift-ada.calibration",
        "version": 1,
        "created": created,
        "name": config.name,
        "draft": config.draft,
        "target": config.target,
        "temperature": float(config.temperature),
        "seed": int(config.seed),
        "traces": _trace_info(traces, config),
        "splits": dict(stages.split.splits.to_dict(), assignment=stages.split.splits.assignment()),
        "signals": list(stages.inputs.signals),
        "replay": _replay_sampling(traces, config.seed, config.search_replicas, config.confirm_replicas),
        "grids": fitted.grids.to_dict(),
        "space": fitted.space.to_dict(),
        "study": {
            "name": search.study_name,
            "storage": search.storage_shown,
            "search_trials": int(config.trials),
            "n_baselines": len(stages.inputs.baselines),
            "complete": len(search.points),
            "workers": int(config.workers),
            "timeout": config.timeout,
            "sampler": search.sampler,
            "wall_s": search.wall_s,
        },
        "trials": [p.to_dict() for p in search.points],
        "periodic_curve": stages.choice.periodic_curve,
        "operating_point": stages.choice.point.to_dict(),
        "confirmation": stages.confirmation.record,
        "controller": "controller.json",
        "wall_s": wall_s,
    }


@dataclass(frozen=True)
class Written:
    """The files a calibration wrote and the two records in them."""

    controller: dict[str, Any]
    controller_path: Path
    calibration: dict[str, Any]
    calibration_path: Path
    report_path: Path


def write_outputs(
    traces: ProbeTraces,
    out: Path,
    stages: Stages,
    *,
    started: float,
    progress: Callable[[str, int, int | None], None],
) -> Written:
    """Write ``controller.json`` (validated), ``calibration.json``, then ``report.md`` and plots rendered from it.

    ``started``: the calibration's ``time.monotonic()`` at its start (``calibration.json``'s ``wall_s``).
    """
    created = _dt.datetime.now(_dt.UTC).replace(microsecond=0).isoformat()
    controller = controller_record(traces, stages, created)
    progress("export", 0, 3)
    controller_path = export_controller(controller, out / "controller.json")
    calibration = calibration_record(traces, stages, created, time.monotonic() - started)
    calibration_path = atomic_write_json(out / "calibration.json", calibration)
    progress("export", 2, 3)
    # Render from the JSON as written, so the report is exactly what calibration.json gives.
    report_path = write_report(json.loads(canonical_json(calibration)), out)
    progress("export", 3, 3)
    return Written(controller, controller_path, calibration, calibration_path, report_path)


def calibrate(
    traces: ProbeTraces,
    out_dir: str | Path,
    config: CalibrationConfig,
    *,
    progress: Callable[[str, int, int | None], None] | Any | None = None,
    log: Callable[[str], Any] | None = print,
) -> CalibrationResult:
    """Calibrate a RIFT-ada controller on probe traces and write it, with a report, into ``out_dir``.

    Splits the requests (calibration / selection / confirmation), builds percentile threshold
    grids and fits the score family on the calibration split, runs a seeded multi-objective Optuna
    study by replay on the selection split (baselines included), picks the operating point
    (``config.objective``), confirms it with paired-bootstrap CIs on the confirmation split, and writes
    ``controller.json`` (validated, with provenance), ``calibration.json``, ``report.md`` and plots.
    ``config`` holds every setting (:class:`~rift_ada.calibrate.config.CalibrationConfig`).
    ``progress`` is a callable ``(stage, done, total)`` or a rich ``Progress``; ``log`` gets one-line
    milestones (split sizes, the chosen point, the verdict), ``None`` silences them.
    """
    started = time.monotonic()
    report = _Progress(progress)
    say = log if log is not None else (lambda _msg: None)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    inputs = check_inputs(traces, config)

    split = split_traces(traces, config)
    report("splits", 1, 1)
    say("splits: " + ", ".join(f"{k} {v}" for k, v in split.splits.sizes.items()) + f" requests (seed {config.seed})")
    fitted = fit_space(split.calibration, inputs.signals, config)
    report("grids", 1, 1)
    search = run_search(split.selection, out, config, inputs, fitted.space, report)
    choice = choose_operating_point(search.points, inputs.reference_label, config)
    confirmation = confirm_by_replay(split, search, choice.point, inputs, config)
    report("confirmation", 1, 1)
    op, chosen = choice.point, choice.point.chosen
    say(
        f"chosen: trial {chosen.number} ({chosen.family}, {op.chosen_by.replace('_', ' ')}), "
        f"selection AL {chosen.al:.3f} at {chosen.refreshes_per_1k:.2f} refreshes/1K vs {inputs.reference_label} "
        f"AL {op.reference.al:.3f} at {op.reference.refreshes_per_1k:.2f}"
    )
    say("confirmation: " + ("gain confirmed" if confirmation.verdict["gain"] else "no confirmed gain"))

    stages = Stages(config, inputs, split, fitted, search, choice, confirmation)
    written = write_outputs(traces, out, stages, started=started, progress=report)
    return CalibrationResult(
        out_dir=out,
        controller=written.controller,
        controller_path=written.controller_path,
        calibration_path=written.calibration_path,
        report_path=written.report_path,
        calibration=written.calibration,
        splits=split.splits,
        operating_point=op,
        study_name=search.study_name,
        storage=search.storage_url,
        config=config,
    )
