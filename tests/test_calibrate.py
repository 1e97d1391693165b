"""Calibration: splits, grids, search space, bootstrap, operating point, and the end-to-end pipeline."""

from __future__ import annotations

import copy
import dataclasses
import json

import numpy as np
import optuna
import pytest

from rift_ada import Controller, policy_kinds
from rift_ada.calibrate.bootstrap import al_difference_ci, refresh_reduction_ci
from rift_ada.calibrate.config import CalibrationConfig, ConfigError
from rift_ada.calibrate.grids import SIGNALS, check_signal_columns, threshold_grids
from rift_ada.calibrate.operating_point import TrialPoint, pareto_front, select_operating_point
from rift_ada.calibrate.pipeline import calibrate, check_traces_match
from rift_ada.calibrate.report import render_markdown
from rift_ada.calibrate.splits import SPLIT_NAMES, CalibrationError, make_splits
from rift_ada.collectors.synthetic import synthetic_traces
from rift_ada.controller import make_controller_dict
from rift_ada.policies.space import SearchSpace


def _config(traces, **settings) -> CalibrationConfig:
    params = {
        "name": "syn",
        "draft": "synthetic",
        "target": "synthetic",
        "temperature": float(traces.temperature),
        "trials": 40,
        "n_resamples": 2000,
    }
    return CalibrationConfig(**{**params, **settings})


def _run(traces, out_dir, *, progress=None, log=None, **settings):
    return calibrate(traces, out_dir, _config(traces, **settings), progress=progress, log=log)


@pytest.fixture(scope="module")
def small_traces():
    return synthetic_traces(40, 1024, seed=3)


@pytest.fixture(scope="module")
def planted_run(tmp_path_factory):
    traces = synthetic_traces(60, 2048, planted="entropy", seed=0)
    # At 60 trials and 18 confirmation requests the confirmed gain is a property of the seed's search, not
    # a certainty: sampler seeds 0-5 confirm it for 2 of 6 (1 among them) with slot-seeded sampling, as with
    # the sampler stream before it (0 and 1 then).
    return _run(traces, tmp_path_factory.mktemp("planted"), trials=60, seed=1)


# -- splits -----------------------------------------------------------------------------------


def test_splits_are_seeded_disjoint_and_stratified():
    traces = synthetic_traces(60, 64, seed=1)
    splits = make_splits(traces, seed=7)
    parts = [set(splits.indices(name).tolist()) for name in SPLIT_NAMES]
    assert sum(len(p) for p in parts) == 60 and len(set().union(*parts)) == 60
    assert splits.sizes == {"calibration": 24, "selection": 18, "confirmation": 18}
    assert make_splits(traces, seed=7).to_dict() == splits.to_dict()
    assert make_splits(traces, seed=8).to_dict() != splits.to_dict()
    categories = np.asarray(traces.requests["category"])
    for name in SPLIT_NAMES:
        assert set(categories[splits.indices(name)]) == set(categories)  # every category in every split
    assignment = splits.assignment()
    assert len(assignment) == 60 and set(assignment.values()) == set(SPLIT_NAMES)


def test_empty_split_is_refused_with_sizes(tmp_path):
    traces = synthetic_traces(2, 64)
    with pytest.raises(CalibrationError, match=r"calibration=1, selection=1, confirmation=0 of 2"):
        make_splits(traces)
    with pytest.raises(CalibrationError, match=r"split came out empty"):
        _run(synthetic_traces(30, 256), tmp_path, split=(0.5, 0.5, 0.0))


# -- grids and signal checks ------------------------------------------------------------------


def test_percentile_grids_cover_every_signal(small_traces):
    grids = threshold_grids(small_traces)
    assert set(grids.values) == set(SIGNALS)
    assert grids.percentiles[0] == 5 and grids.percentiles[-1] == 95
    for values in grids.values.values():
        assert list(values) == sorted(set(values)) and len(values) >= 3
    acceptance = grids.grid("acceptance")
    assert acceptance[0] >= 1.0 and acceptance[-1] <= small_traces.draft_length + 1


@pytest.mark.parametrize(("column", "signal"), [("entropy", "entropy"), ("query_drift", "query_drift")])
def test_nan_in_selected_signal_column_is_refused(tmp_path, column, signal):
    traces = synthetic_traces(30, 512, seed=2)
    if column == "entropy":
        traces.entropy[4, 0, 100] = np.nan
    else:
        traces.stride_signals["query_drift"][4, 1, 10] = np.nan
    with pytest.raises(CalibrationError, match=rf"signal column '{column}'.*synthetic-00004"):
        _run(traces, tmp_path)
    # Not selected: fine.
    others = [s for s in SIGNALS if s not in (signal, "entropy_rise")]
    check_signal_columns(traces, others)


def test_padding_nan_beyond_response_is_not_an_error():
    traces = synthetic_traces(20, 512, vary_length=True, seed=4)
    check_signal_columns(traces, SIGNALS)
    threshold_grids(traces)


def test_trace_manifest_must_match_request(tmp_path):
    manifest = {"mode": "probe", "draft": "d", "target": "t", "temperature": 1.0}
    check_traces_match(manifest, "d", "t", 1.0)
    with pytest.raises(CalibrationError, match=r"draft is 'd' in the traces but 'other' was requested"):
        check_traces_match(manifest, "other", "t", 1.0)
    with pytest.raises(CalibrationError, match=r"target is 't' in the traces but 'x' was requested"):
        check_traces_match(manifest, "d", "x", 1.0)
    with pytest.raises(CalibrationError, match=r"temperature is 1.0 in the traces but 0.0 was requested"):
        check_traces_match(manifest, "d", "t", 0.0)
    with pytest.raises(CalibrationError, match=r"needs 'probe'"):
        check_traces_match(dict(manifest, mode="closed"), "d", "t", 1.0)
    traces = synthetic_traces(30, 256, temperature=0.0)
    with pytest.raises(CalibrationError, match=r"temperature is 0.0 in the traces but 1.0"):
        _run(traces, tmp_path, temperature=1.0)
    with pytest.raises(CalibrationError, match=r"draft is 'synthetic'"):
        _run(traces, tmp_path, draft="Qwen/Qwen3.5-4B")


# -- search space -----------------------------------------------------------------------------


def _space() -> SearchSpace:
    grid = tuple(float(x) for x in np.linspace(0.1, 2.0, 5))
    term = {"signal": "entropy", "orientation": 1, "mean": 1.0, "scale": 0.5, "weight": 1.0}
    return SearchSpace(grids={s: grid for s in SIGNALS}, score_terms=(term,), score_grid=(-1.0, 0.0, 1.0))


@pytest.mark.parametrize(
    "params",
    [
        {
            "family": "gate",
            "gate_rules": 1,
            "gate_rule0_signal": "acceptance",
            "gate_rule0_acceptance_q": 2,
            "gate_drift": "none",
        },
        {
            "family": "gate",
            "gate_rules": 2,
            "gate_combine": "all",
            "gate_rule0_signal": "entropy",
            "gate_rule0_entropy_q": 0,
            "gate_rule1_signal": "acceptance_drop",
            "gate_rule1_acceptance_drop_q": 4,
            "gate_drift": "or",
            "gate_drift_q": 1,
        },
        {
            "family": "gate",
            "gate_rules": 3,
            "gate_combine": "any",
            "gate_rule0_signal": "entropy",
            "gate_rule0_entropy_q": 0,
            "gate_rule1_signal": "entropy_rise",
            "gate_rule1_entropy_rise_q": 1,
            "gate_rule2_signal": "acceptance",
            "gate_rule2_acceptance_q": 3,
            "gate_drift": "and",
            "gate_drift_q": 2,
        },
        {"family": "score", "score_q": 2},
    ],
)
def test_search_space_builds_valid_policies(params):
    family, policy = _space().suggest(optuna.trial.FixedTrial(params))
    assert family == params["family"]
    controller = make_controller_dict(policy, name="x", draft="d", target="t", temperature=0.0)
    Controller.from_dict(controller)
    if family == "gate":
        rules = policy_kinds.from_json(policy).signals()
        assert params["gate_rule0_signal"] in rules
        assert ("query_drift" in rules) == (params["gate_drift"] != "none")
    else:
        assert policy["threshold"] == 1.0


def test_search_space_fingerprint_tracks_grids():
    space = _space()
    other = SearchSpace(
        grids={**space.grids, "entropy": (0.5,)}, score_terms=space.score_terms, score_grid=space.score_grid
    )
    assert space.fingerprint() == _space().fingerprint() != other.fingerprint()


# -- bootstrap and operating point --------------------------------------------------------------


def test_paired_bootstrap_intervals():
    rng = np.random.default_rng(0)
    base = rng.poisson(30, 40).astype(float)
    ctl = np.round(base * 0.5 + rng.normal(0, 2, 40)).clip(0)
    reduction = refresh_reduction_ci(ctl, base, n_resamples=2000, seed=1)
    assert 0.4 < reduction.estimate < 0.6 and reduction.low > 0.3 and reduction.excludes_zero
    assert reduction == refresh_reduction_ci(ctl, base, n_resamples=2000, seed=1)  # seeded
    al = rng.normal(5, 1, 40)
    same = al_difference_ci(al, al.copy(), n_resamples=2000)
    assert same.low == same.high == same.estimate == 0.0 and not same.excludes_zero
    noisy = al_difference_ci(al + rng.normal(0, 0.3, 40), al, n_resamples=2000)
    assert noisy.low < 0 < noisy.high


def _point(number, al, refreshes, label=None, baseline=False):
    return TrialPoint(
        number, label or f"trial:{number}", "periodic" if baseline else "gate", {}, {}, al, refreshes, baseline
    )


def test_operating_point_matched_al_and_refreshes():
    points = [
        _point(0, 5.0, 8.0, "periodic:128", True),
        _point(1, 5.3, 16.0, "periodic:64", True),
        _point(2, 5.05, 3.0),
        _point(3, 4.9, 2.0),
        _point(4, 5.2, 6.0),
        _point(5, 5.01, 5.0),  # dominated by 2? no: more refreshes and lower AL than 2 -> dominated
    ]
    assert [p.number for p in pareto_front([p for p in points if not p.baseline])] == [3, 2, 4]
    op = select_operating_point(points, "periodic:128")
    assert op.matched_al.number == 2 and op.chosen.number == 2 and op.chosen_by == "matched_al"
    assert op.refresh_reduction == pytest.approx(1 - 3.0 / 8.0)
    assert op.matched_refreshes.number == 4 and op.al_gain_at_matched_refreshes == pytest.approx(0.2)


def test_operating_point_says_no_gain_when_nothing_matches():
    points = [_point(0, 5.0, 8.0, "periodic:128", True), _point(1, 4.0, 9.0), _point(2, 4.5, 12.0)]
    op = select_operating_point(points, "periodic:128")
    assert op.matched_al is None and op.matched_refreshes is None and not op.has_gain
    assert op.chosen_by == "reference_baseline" and any("no gain" in note for note in op.notes)


# -- the configuration ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "field", "message"),
    [
        ({"trials": -1}, "trials", "trials must be non-negative"),
        ({"workers": 0}, "workers", "workers must be at least 1"),
        ({"timeout": 0.0}, "timeout", "timeout must be a positive"),
        ({"seed": -1}, "seed", "seed must be non-negative"),
        ({"split": (0.5, 0.5)}, "split", "split fractions must be three"),
        ({"reference_interval": 0}, "reference_interval", "periodic intervals must be positive"),
        ({"intervals": (16, -32)}, "intervals", "periodic intervals must be positive"),
        ({"families": ()}, "families", "families must be a non-empty subset"),
        ({"families": ("gate", "tree")}, "families", "families must be a non-empty subset"),
        ({"signals": ()}, "signals", "signals must be a non-empty subset"),
        ({"signals": ("acceptance", "qurey_drift")}, "signals", "signals must be a non-empty subset"),
        ({"signals": ("entropy", "entropy")}, "signals", "signals name entropy twice"),
        ({"search_replicas": 0}, "search_replicas", "replicas must be >= 1, got search_replicas=0"),
        ({"confirm_replicas": 0}, "confirm_replicas", "replicas must be >= 1, got confirm_replicas=0"),
        ({"objective": "best"}, "objective", "objective must be 'matched_al' or 'curve'"),
        ({"margin": 1.0}, "margin", r"margin must be a fraction of the reference AL in \[0, 1\)"),
    ],
)
def test_config_refuses_bad_settings_naming_the_field(settings, field, message, small_traces):
    with pytest.raises(ConfigError, match=message) as error:
        _config(small_traces, **settings)
    assert error.value.field == field and isinstance(error.value, CalibrationError)


def test_config_is_frozen_checked_on_replace_and_keeps_the_defaults():
    config = CalibrationConfig(name="n", draft="d", target="t", temperature=0.0, split=[0.5, 0.25, 0.25])
    assert config.split == (0.5, 0.25, 0.25)  # sequences become tuples: the checked value cannot change
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.trials = 3  # type: ignore[misc]
    with pytest.raises(ConfigError, match="trials"):
        dataclasses.replace(config, trials=-2)
    cache = {"budget": 64}
    assert CalibrationConfig(name="n", draft="d", target="t", temperature=0.0, cache=cache).cache is not cache
    fields = dataclasses.fields(CalibrationConfig)
    defaults = {f.name: f.default for f in fields if f.default is not dataclasses.MISSING}
    assert defaults == {
        "trials": 200, "timeout": None, "storage": None, "workers": 1, "seed": 0, "split": (0.4, 0.3, 0.3),
        "reference_interval": 128, "families": ("gate", "score"), "manifest_hash": None, "signals": None,
        "intervals": (16, 32, 64, 128, 256, 512), "study_name": None, "position_bin": 256, "n_resamples": 9999,
        "cache": None, "schedule": None, "margin": 0.01, "search_replicas": 1, "confirm_replicas": 4,
        "objective": "matched_al", "selection_margin": 0.02,
    }  # fmt: skip


# -- end to end -------------------------------------------------------------------------------


def _strip_times(obj):
    obj = copy.deepcopy(obj)
    obj["calibration"].pop("created")
    return obj


def test_same_seed_same_controller(tmp_path, small_traces):
    first = _run(small_traces, tmp_path / "a", trials=25, seed=5)
    second = _run(small_traces, tmp_path / "b", trials=25, seed=5)
    a = json.loads(first.controller_path.read_text())
    b = json.loads(second.controller_path.read_text())
    assert a["calibration"]["created"] and _strip_times(a) == _strip_times(b)
    ca = json.loads(first.calibration_path.read_text())
    cb = json.loads(second.calibration_path.read_text())
    for record in (ca, cb):
        for key in ("created", "wall_s"):
            record.pop(key)
        record["study"].pop("wall_s")
    assert ca == cb


def test_planted_signal_is_found_and_confirmed(planted_run):
    result = planted_run
    controller = Controller.load(result.controller_path)
    used = controller.signals_used
    assert used & {"entropy", "entropy_rise"}, used
    vs_reference = result.calibration["confirmation"]["comparisons"][0]
    assert vs_reference["baseline"] == "periodic:128"
    assert vs_reference["refresh_reduction"]["low"] > 0
    assert result.has_gain
    provenance = result.controller["calibration"]
    assert provenance["seed"] == 1 and provenance["study"]["trials"] == 60
    assert provenance["chosen_trial"]["number"] == result.operating_point.chosen.number
    assert provenance["chosen_trial"]["params"]["family"] in ("gate", "score")
    ids = provenance["splits"]["request_ids"]
    assert sorted(sum(ids.values(), [])) == sorted(result.calibration["splits"]["assignment"])
    assert provenance["confirmation"]["comparisons"][0]["refresh_reduction"]["excludes_zero"]


def test_outputs_are_complete_and_report_is_derivable(planted_run):
    out = planted_run.out_dir
    for name in ("controller.json", "calibration.json", "report.md", "pareto.png", "al_by_position.png", "study.db"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "pareto.png").read_bytes()[:4] == b"\x89PNG"
    calibration = json.loads((out / "calibration.json").read_text())
    assert render_markdown(calibration) == (out / "report.md").read_text()
    report = (out / "report.md").read_text()
    assert "Gain confirmed" in report and "periodic:128" in report and "![AL–refresh trade-off](pareto.png)" in report
    policies = calibration["confirmation"]["policies"]
    assert {"chosen", "periodic:128", "stat", "full"} <= set(policies)
    assert {p["role"] for p in policies.values()} >= {"chosen controller", "RIFT-stat", "full KV"}
    assert len(calibration["trials"]) == 60 + 7


def test_no_planted_signal_reports_no_gain(tmp_path):
    traces = synthetic_traces(60, 2048, planted="none", seed=1)
    result = _run(traces, tmp_path, trials=40)
    comparisons = result.calibration["confirmation"]["comparisons"]
    al_vs_rate = comparisons[1]["al_difference"]
    assert al_vs_rate["low"] <= 0 <= al_vs_rate["high"]
    assert not result.has_gain
    assert "no confirmed gain" in result.report_path.read_text().lower()


def test_progress_hook_and_log(tmp_path, small_traces):
    events: list[tuple[str, int, int | None]] = []
    lines: list[str] = []
    result = _run(small_traces, tmp_path, trials=10, progress=lambda *e: events.append(e), log=lines.append)
    stages = [e[0] for e in events]
    assert stages[0] == "splits" and "study" in stages and stages[-1] == "export"
    assert max(e[1] for e in events if e[0] == "study") == 10 + 7
    assert lines[0].startswith("splits: calibration 16, selection 12, confirmation 12")
    assert result.split_sizes == {"calibration": 16, "selection": 12, "confirmation": 12}


def _interval(estimate: float, low: float, high: float) -> dict[str, float]:
    return {"estimate": estimate, "low": low, "high": high}


def test_al_kept_means_non_inferior_within_the_margin() -> None:
    from rift_ada.calibrate.pipeline import verdict

    def comparisons(al_low: float) -> list[dict]:
        return [
            {
                "baseline": "periodic:128",
                "refresh_reduction": _interval(0.4, 0.3, 0.5),
                "al_difference": _interval(0.0, al_low, 0.05),
            },
            {"baseline": "periodic:300", "refresh_reduction": None, "al_difference": _interval(0.2, 0.1, 0.3)},
        ]

    # reference AL 8: a 1% margin is 0.08 AL
    kept = verdict(comparisons(-0.07), "periodic:128", reference_al=8.0)
    assert kept["gain"] and kept["margin"] == {"fraction": 0.01, "al": 0.08, "reference_al": 8.0}
    assert "margin 1% of the reference AL = 0.080" in kept["text"]
    # The CI includes 0 (the old rule called that "AL kept") but reaches below -margin: not kept.
    wide = verdict(comparisons(-0.09), "periodic:128", reference_al=8.0)
    assert not wide["gain"] and any("non-inferior" in reason for reason in wide["reasons"])
    assert verdict(comparisons(-0.09), "periodic:128", reference_al=8.0, margin=0.02)["gain"]
    assert not verdict(comparisons(-0.07), "periodic:128", reference_al=8.0, margin=0.0)["gain"]


def test_gate_space_expresses_the_papers_five_condition_any_gate():
    grids = {s: (0.1, 0.2, 0.3) for s in SIGNALS}
    space = SearchSpace(grids=grids, families=("gate",))
    order = ("acceptance", "entropy", "acceptance_drop", "entropy_rise", "query_drift")
    params = {"family": "gate", "gate_rules": 5, "gate_combine": "any", "gate_drift": "none"}
    for i, signal in enumerate(order):
        params[f"gate_rule{i}_signal"] = signal
        params[f"gate_rule{i}_{signal}_q"] = 1
    family, policy = space.suggest(optuna.trial.FixedTrial(params))
    assert family == "gate"
    assert policy == {
        "kind": "gate",
        "any": [
            {"signal": "acceptance", "op": "<=", "value": 0.2},
            {"signal": "entropy", "op": ">=", "value": 0.2},
            {"signal": "acceptance_drop", "op": ">=", "value": 0.2},
            {"signal": "entropy_rise", "op": ">=", "value": 0.2},
            {"signal": "query_drift", "op": ">=", "value": 0.2},
        ],
    }
    Controller.from_dict(make_controller_dict(policy, name="paper", draft="d", target="t", temperature=0.0))


def test_sampler_provenance_is_read_from_the_sampler(planted_run):
    sampler = planted_run.calibration["study"]["sampler"]
    assert sampler.startswith("TPESampler(") and "constant_liar=False" in sampler and "seed 1 (" in sampler
    assert planted_run.controller["calibration"]["study"]["sampler"] == sampler


def test_schedule_beyond_the_probe_arms_is_refused_before_the_study(tmp_path):
    traces = synthetic_traces(12, 600, seed=2, arm_ages=(0, 32, 64, 128, 256))
    with pytest.raises(CalibrationError, match=r"beyond the probe arms \(0\.\.256\): schedule\.max_age \(768\)"):
        _run(traces, tmp_path)
    assert not (tmp_path / "study.db").exists()


def test_t1_study_searches_with_one_replica_and_confirms_with_the_default(tmp_path, monkeypatch):
    from rift_ada.policies import replay as replay_module
    from rift_ada.policies.replay import DEFAULT_REPLICAS

    traces = synthetic_traces(30, 600, temperature=1.0, seed=4, arm_ages=(0, 32, 64, 128, 256, 512))
    calls: list[tuple[frozenset[str], int | None]] = []
    original = replay_module.replay_many

    def spy(traces_arg, policies, **kwargs):
        calls.append((frozenset(str(x) for x in traces_arg.requests["request_id"]), kwargs.get("replicas")))
        return original(traces_arg, policies, **kwargs)

    monkeypatch.setattr(replay_module, "replay_many", spy)
    result = _run(traces, tmp_path, trials=6, schedule={"max_age": 512}, intervals=(32, 64, 256))
    assignment = result.calibration["splits"]["assignment"]
    selection = frozenset(r for r, split in assignment.items() if split == "selection")
    confirmation = frozenset(r for r, split in assignment.items() if split == "confirmation")
    assert {replicas for ids, replicas in calls if ids == selection} == {1}
    assert {replicas for ids, replicas in calls if ids == confirmation} == {DEFAULT_REPLICAS}
    policies = result.calibration["confirmation"]["policies"]
    assert {entry["replicas"] for entry in policies.values()} == {DEFAULT_REPLICAS}
    replay_info = result.controller["calibration"]["replay"]
    assert replay_info["study_replicas"] == 1 and replay_info["confirmation_replicas"] == DEFAULT_REPLICAS
    assert result.calibration["replay"] == replay_info
    # The chosen trial's selection figures are replay with one replica on the selection split.
    chosen = result.controller["calibration"]["chosen_trial"]
    sel = traces.subset(np.array([i for i, r in enumerate(traces.requests["request_id"]) if str(r) in selection]))
    baselines = result.controller["calibration"]["study"]["baselines"]
    policy = chosen["label"] if chosen["label"] in baselines else result.controller
    again = original(sel, [policy], replicas=1)[0]
    assert again.mean_al == pytest.approx(chosen["selection"]["mean_al"], rel=1e-12)
    with pytest.raises(CalibrationError, match="replicas must be >= 1"):
        _run(traces, tmp_path / "bad", search_replicas=0)


@pytest.mark.parametrize("objective", ["curve", "matched_al"])
def test_poisoned_confirmation_traces_leave_the_controller_unchanged(tmp_path, objective):
    """Confirmation requests never reach the grids, the score fit, the study or the operating point:
    replacing their traces with noise changes the confirmation figures and nothing else."""

    traces = synthetic_traces(40, 1024, planted="entropy", seed=0)
    clean = _run(traces, tmp_path / "clean", trials=25, objective=objective)
    rows = np.asarray(clean.splits.confirmation)
    rng = np.random.default_rng(99)

    def poison(array, scale=1.0):
        array = np.array(array, copy=True)
        part = array[rows]
        if array.dtype.kind == "f":
            array[rows] = np.where(np.isnan(part), part, rng.uniform(0.0, scale, part.shape))
        else:
            array[rows] = rng.integers(0, 2, part.shape)
        return array

    poisoned_traces = dataclasses.replace(
        traces,
        outcome=poison(traces.outcome),
        entropy=poison(traces.entropy, 5.0),
        stride_signals={name: poison(values, 7.0) for name, values in traces.stride_signals.items()},
        token_acceptance=None if traces.token_acceptance is None else poison(traces.token_acceptance),
    )
    poisoned = _run(poisoned_traces, tmp_path / "poisoned", trials=25, objective=objective)
    a, b = (json.loads(result.calibration_path.read_text()) for result in (clean, poisoned))
    assert np.array_equal(clean.splits.confirmation, poisoned.splits.confirmation)
    assert a["confirmation"]["policies"]["chosen"]["mean_al"] != b["confirmation"]["policies"]["chosen"]["mean_al"]
    for key in ("grids", "space", "trials", "operating_point", "periodic_curve"):
        assert a[key] == b[key], key
    policies = [json.loads(result.controller_path.read_text())["policy"] for result in (clean, poisoned)]
    assert policies[0] == policies[1]
