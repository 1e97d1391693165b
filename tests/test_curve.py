"""The curve gap (controller vs the periodic AL-refresh curve), its paired bootstrap, the verdict and power."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from rift_ada.calibrate.bootstrap import paired_bootstrap
from rift_ada.calibrate.curve import (
    PAPER_AL_GAIN,
    PolicyTotals,
    coverage,
    curve_gap_ci,
    decide,
    population_gap,
    power,
    preregister,
    synthetic_requests,
)

INTERVALS = (32, 64, 128, 256)


def _prereg(n: int):
    return preregister(
        1.0, n, ["stat", *[f"periodic:{d}" for d in INTERVALS]], selection_margin=0.02, n_resamples=1999, seed=0
    )


def _scalar_readings(controller: PolicyTotals, curve: list[PolicyTotals]) -> tuple[float, float]:
    """From scratch: points, running-max hull, np.interp both ways (an independent reference)."""
    points = sorted((1000 * p.refreshes.sum() / p.committed.sum(), p.al.mean()) for p in curve)
    xs = np.array([x for x, _ in points])
    ys = np.maximum.accumulate(np.array([y for _, y in points]))
    ctl_x = 1000 * controller.refreshes.sum() / controller.committed.sum()
    ctl_y = controller.al.mean()
    gain = ctl_y - np.interp(ctl_x, xs, ys) if xs[0] <= ctl_x <= xs[-1] else float("nan")
    if ctl_y <= ys[0]:
        x_at = xs[0]
    elif ctl_y > ys[-1]:
        x_at = xs[-1]
    else:
        j = int(np.argmax(ys >= ctl_y))  # the first hull point reaching the controller's AL
        x_at = xs[j - 1] + (ctl_y - ys[j - 1]) / (ys[j] - ys[j - 1]) * (xs[j] - xs[j - 1])
    reduction = (1 - ctl_x / x_at) if x_at > 0 else (-1.0 if ctl_x > 0 else 0.0)
    return float(gain), float(np.clip(reduction, -1, 1))


@pytest.mark.parametrize("seed", range(6))
def test_readings_match_a_scalar_reference(seed):
    rng = np.random.default_rng(seed)
    controller, curve = synthetic_requests(12, INTERVALS, rng.normal(0, 0.3), rng=rng, sd=0.8)
    result = curve_gap_ci(controller, curve, n_resamples=50)
    gain, reduction = _scalar_readings(controller, curve)
    assert result.al_gain.estimate == pytest.approx(gain, abs=1e-12)
    assert result.refresh_reduction.estimate == pytest.approx(reduction, abs=1e-12)


@pytest.mark.parametrize(
    ("gap", "outcome"), [(0.0, "refuted on this workload"), (0.35, "confirmed"), (-0.25, "refuted on this workload")]
)
def test_a_known_gap_is_recovered_and_the_verdict_names_it(gap, outcome):
    n = 300
    controller, curve = synthetic_requests(n, INTERVALS, gap, rng=np.random.default_rng(7))
    result = curve_gap_ci(controller, curve, n_resamples=1999, seed=1)
    truth, _ = population_gap(INTERVALS, gap)
    assert abs(truth - gap) < 0.03  # the synthetic controller sits `gap` above the curve
    assert result.al_gain.estimate == pytest.approx(truth, abs=3.5 * result.al_gain_se)
    assert result.al_gain.low <= truth <= result.al_gain.high
    verdict = decide(result, _prereg(n))
    assert verdict.outcome == outcome
    if gap > 0:
        assert result.refresh_reduction.low > 0  # above the curve: fewer refreshes at matched AL too
    if gap < 0:
        assert result.refresh_reduction.high < 0


def test_a_small_run_is_underpowered_and_says_how_many_requests_it_needs():
    n = 6
    controller, curve = synthetic_requests(n, INTERVALS, 0.05, rng=np.random.default_rng(3))
    result = curve_gap_ci(controller, curve, n_resamples=1999)
    verdict = decide(result, _prereg(n))
    assert verdict.outcome == "underpowered" and not verdict.decided
    need = verdict.power
    assert need.requests_for_paper_effect > n and need.requests_to_decide > need.requests_for_paper_effect
    assert f"{need.requests_for_paper_effect} confirmation requests" in verdict.text
    assert need.minimum_detectable_gap > PAPER_AL_GAIN
    # At the printed size the minimum detectable gap is the paper's effect (the same spread assumed).
    scaled = power(
        need.sd_per_request / np.sqrt(need.requests_for_paper_effect), need.requests_for_paper_effect, PAPER_AL_GAIN
    )
    assert scaled.minimum_detectable_gap <= PAPER_AL_GAIN * 1.01


def test_a_controller_denser_than_every_interval_has_no_al_gain_reading():
    rng = np.random.default_rng(0)
    controller, curve = synthetic_requests(10, (128, 256), 0.0, rng=rng)
    dense = PolicyTotals("controller", controller.al, controller.committed / 16, controller.committed)
    verdict = decide(curve_gap_ci(dense, curve, n_resamples=200), _prereg(10))
    assert verdict.gap.controller_beyond_densest and verdict.outcome == "underpowered"
    assert "does not bracket" in verdict.text


def test_bca_matches_scipy_on_a_mean_difference():
    rng = np.random.default_rng(5)
    a, b = rng.normal(1.0, 1.0, 25), rng.normal(0.6, 1.0, 25)

    def statistic(index):
        return (a[index].mean(axis=-1) - b[index].mean(axis=-1))[:, None]

    (ours,), _ = paired_bootstrap(statistic, 25, n_resamples=20000, seed=0)
    theirs = stats.bootstrap(
        (a, b),
        lambda x, y, axis=-1: x.mean(axis) - y.mean(axis),
        paired=True,
        n_resamples=20000,
        method="BCa",
        rng=np.random.default_rng(1),
    ).confidence_interval
    assert ours.method == "BCa"
    assert ours.low == pytest.approx(theirs.low, abs=0.03) and ours.high == pytest.approx(theirs.high, abs=0.03)


def test_coverage_on_synthetic_data_is_near_nominal():
    """A cheap version of the coverage check recorded in docs/calibration.md (400 runs per size there)."""
    result = coverage(16, 0.15, reps=60, n_resamples=499, seed=3)
    assert result["al_gain"] >= 0.85


def test_curve_intervals_bracket_the_controllers_rate():
    from rift_ada.calibrate.curve import curve_intervals

    assert curve_intervals(1000 / 100, 512) == [32, 64, 128, 256]  # two denser than Δ = 100, two sparser
    assert curve_intervals(1000 / 600, 512) == [64, 128, 256, 512]  # the sparse side runs out at 512
    assert curve_intervals(0.0, 512) == [64, 128, 256, 512]  # a controller that never refreshes
    assert curve_intervals(1000 / 6, 512) == [8, 16, 32, 64]  # the dense side runs out at 8


def test_the_operating_point_by_the_curve_gap_takes_the_fewest_refreshes_among_ties():
    from rift_ada.calibrate.operating_point import TrialPoint, curve_readings, select_by_curve

    def point(number, al, rate, label=None, family="gate"):
        baseline = label is not None
        return TrialPoint(number, label or f"trial:{number}", "periodic" if label and label != "stat" else family,
                          {}, {}, al, rate, baseline)  # fmt: skip

    curve = [point(0, 6.0, 0.0, "stat"), point(1, 6.5, 10.0, "periodic:100"), point(2, 7.0, 30.0, "periodic:33")]
    trials = [point(10, 6.75, 10.0), point(11, 6.80, 20.0), point(12, 6.64, 8.0), point(13, 7.5, 40.0)]
    gain, reduction = curve_readings(trials[0], curve)
    assert gain == pytest.approx(0.25) and reduction == pytest.approx(1 - 10 / 20)  # the curve reaches 6.75 at 20/1K
    op = select_by_curve([*curve, *trials], "periodic:100", margin=0.02)
    # gains: 10 -> +0.25, 11 -> +0.05, 12 -> +0.24 at fewer refreshes (within 0.02 of the best: tied),
    # 13 -> none (beyond the densest Δ).
    assert op.chosen.number == 12 and op.chosen_by == "curve_gap"
    assert op.selection_gap["al_gain"] == pytest.approx(6.64 - 6.4) and op.selection_gap["n_tied"] == 2
    assert select_by_curve([*curve, *trials], "periodic:100", margin=0.0).chosen.number == 10


def test_an_undefined_reading_is_stored_as_null_and_rendered():
    from rift_ada.calibrate.export import json_safe
    from rift_ada.experiments.bench_report import _curve_section

    controller, curve = synthetic_requests(10, (128, 256), 0.0, rng=np.random.default_rng(0))
    dense = PolicyTotals("controller", controller.al, controller.committed / 16, controller.committed)
    stored = json_safe(decide(curve_gap_ci(dense, curve, n_resamples=200), _prereg(10)).to_dict())
    assert stored["gap"]["al_gain"]["estimate"] is None
    text = "\n".join(_curve_section({"curve": stored}))
    assert "AL gain at the controller's refresh count: –" in text and "does not bracket" in text


def test_fewer_requests_than_the_preregistered_minimum_never_decide():
    controller, curve = synthetic_requests(4, INTERVALS, 1.0, rng=np.random.default_rng(2), sd=0.05)
    gap = curve_gap_ci(controller, curve, n_resamples=999)
    assert gap.al_gain.low > 0  # the interval alone would read confirmed
    verdict = decide(gap, _prereg(4))
    assert verdict.outcome == "underpowered" and "fewer than the pre-registered minimum of 8" in verdict.text


def test_a_refresh_reduction_on_a_curve_that_refreshing_does_not_raise_is_called_no_adaptive_gain():
    """Greedy Gemma3 (docs/results-gemma3-T0.md): every periodic Δ at or below RIFT-stat's AL, so a controller
    that never refreshes reads a ~98% refresh reduction; the report must say that is not an adaptive gain."""
    from rift_ada.experiments.bench_report import _findings, flat_curve_note

    def cell(periodic_al: float) -> dict:
        curve = [{"label": "stat", "refreshes_per_1k": 0.0, "mean_al": 8.5},
                 {"label": "periodic:64", "refreshes_per_1k": 10.8, "mean_al": periodic_al},
                 {"label": "periodic:16", "refreshes_per_1k": 43.2, "mean_al": periodic_al - 0.1}]  # fmt: skip
        reduction = {"estimate": 0.983, "low": 0.95, "high": 1.0}
        gap = {"curve": curve, "refresh_reduction": reduction, "refresh_factor": 58.0, "curve_below_controller": True}
        return {"table": {}, "tag": "T0 B128", "reference": "periodic:64",
                "curve": {"gap": gap, "outcome": "refuted on this workload"}}  # fmt: skip

    flat, rising = cell(8.49), cell(8.9)
    assert "not an adaptive gain" in flat_curve_note(flat["curve"]["gap"])
    assert "periodic:64 8.490 against 8.500" in flat_curve_note(flat["curve"]["gap"])
    assert flat_curve_note(rising["curve"]["gap"]) is None
    assert "not an adaptive gain" in "\n".join(_findings(flat))
    assert "not an adaptive gain" not in "\n".join(_findings(rising))
