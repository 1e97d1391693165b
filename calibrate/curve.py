"""The paper's estimand: the controller's point against the periodic AL-refresh curve (model-free).

The periodic curve is RIFT-stat (0 refreshes) plus periodic refresh at several intervals Δ, each a
point (refreshes / 1K committed tokens, macro AL) over the same requests as the controller. The
curve between points is **linear in refreshes / 1K on the monotone hull** (AL made non-decreasing
in refreshes by a running maximum from the sparsest point up, so a denser Δ never reads lower than
a sparser one; this is also what makes the curve invertible). Two readings of the gap
(paper Fig. 6, E.3):

- ``al_gain``: controller AL − curve AL at the controller's refreshes / 1K (AL gain at matched
  refreshes). Undefined (NaN) when the controller refreshes more often than the densest Δ.
- ``refresh_reduction``: 1 − controller refreshes / the curve's refreshes at the controller's AL
  (refresh reduction at matched AL). When the curve never reaches the controller's AL the densest
  Δ's refreshes are used (the reduction is then a lower bound, flagged); clipped to [−1, 1] (−1:
  the curve reaches the controller's AL with no refresh at all while the controller refreshes).

:func:`curve_gap_ci` is a paired bootstrap over requests that recomputes the whole curve in every
resample (BCa, :func:`rift_ada.calibrate.bootstrap.paired_bootstrap`). :func:`decide` turns the
AL-gain interval into one of three outcomes under a :class:`Preregistration` written before the
confirmation ran, on the periodic Δs :func:`curve_intervals` brackets the controller's rate with;
:func:`power` gives the requests a decision would need from the measured spread.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from scipy import stats

from rift_ada.calibrate.bootstrap import Interval, paired_bootstrap
from rift_ada.policy_spec import periodic_label

INTERPOLATION = (
    "linear in refreshes/1K between neighbouring points (RIFT-stat at 0, then each periodic Δ), on the monotone "
    "hull (AL made non-decreasing in refreshes by a running maximum)"
)
# The paper's effects (rift-paper-text.txt §4.4 and E.3): up to +0.122 AL at the same refresh count (Fig. 6,
# T = 1); refresh reduction at matched AL 53.5 % (T = 0, Fig. 16c) and 51.1 % (T = 1, Fig. 6; "2.03x").
PAPER_AL_GAIN = 0.122
PAPER_REFRESH_REDUCTION = {0.0: 0.535, 1.0: 0.511}
OUTCOMES = ("confirmed", "refuted on this workload", "underpowered")
POWER = 0.8
# Below this many confirmation requests no outcome but underpowered is given: a bootstrap over 2-7 requests has
# few distinct resamples (a CI of [0, 0] from two identical requests would otherwise "refute"), and the
# measured coverage of its 95% CI is 91% at 8 requests (docs/calibration.md, 5c).
MIN_REQUESTS = 8


@dataclass(frozen=True)
class PolicyTotals:
    """Per-request totals of one policy, the requests in the same order for every policy of a comparison."""

    label: str
    al: np.ndarray
    refreshes: np.ndarray
    committed: np.ndarray

    def __post_init__(self) -> None:
        for name in ("al", "refreshes", "committed"):
            object.__setattr__(self, name, np.asarray(getattr(self, name), dtype=np.float64))
        if not (self.al.shape == self.refreshes.shape == self.committed.shape) or self.al.ndim != 1:
            raise ValueError(f"{self.label}: al, refreshes and committed must be 1-D arrays of one length")

    @classmethod
    def from_dict(cls, label: str, data: Mapping[str, Any]) -> PolicyTotals:
        return cls(label, data["al"], data["refreshes"], data["committed"])


@dataclass(frozen=True)
class CurvePoint:
    label: str
    refreshes_per_1k: float
    mean_al: float


@dataclass(frozen=True)
class CurveGap:
    """The controller against the periodic curve on one set of requests, with bootstrap CIs."""

    controller: CurvePoint
    curve: list[CurvePoint]
    al_gain: Interval
    refresh_reduction: Interval
    al_gain_se: float  # bootstrap standard error of al_gain
    n_requests: int
    controller_beyond_densest: bool  # the controller refreshes more than the densest Δ: al_gain undefined
    curve_below_controller: bool  # the curve never reaches the controller's AL: refresh_reduction a lower bound
    interpolation: str = INTERPOLATION

    @property
    def refresh_factor(self) -> float | None:
        """How many times fewer refreshes than the curve at matched AL (paper: 2.03x)."""
        reduction = self.refresh_reduction.estimate
        return None if not math.isfinite(reduction) or reduction >= 1 else 1.0 / (1.0 - reduction)

    def to_dict(self) -> dict[str, Any]:
        return {
            "controller": asdict(self.controller),
            "curve": [asdict(point) for point in self.curve],
            "al_gain": self.al_gain.to_dict(),
            "refresh_reduction": self.refresh_reduction.to_dict(),
            "refresh_factor": self.refresh_factor,
            "al_gain_se": self.al_gain_se,
            "n_requests": self.n_requests,
            "controller_beyond_densest": self.controller_beyond_densest,
            "curve_below_controller": self.curve_below_controller,
            "interpolation": self.interpolation,
        }


def _readings(ctl: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Both readings per resample. ``ctl``: (..., 3, n) al/refreshes/committed; ``points``: (..., P, 3, n).

    Returns (..., 2): al_gain, refresh_reduction."""
    ctl_al = ctl[..., 0, :].mean(axis=-1)
    ctl_x = 1000.0 * ctl[..., 1, :].sum(axis=-1) / ctl[..., 2, :].sum(axis=-1)
    ys = points[..., 0, :].mean(axis=-1)  # (..., P)
    xs = 1000.0 * points[..., 1, :].sum(axis=-1) / points[..., 2, :].sum(axis=-1)
    order = np.argsort(xs, axis=-1, kind="stable")
    xs = np.take_along_axis(xs, order, axis=-1)
    ys = np.maximum.accumulate(np.take_along_axis(ys, order, axis=-1), axis=-1)  # the monotone hull
    gain = np.full(ctl_al.shape, np.nan)
    x_at = np.where(ctl_al <= ys[..., 0], xs[..., 0], xs[..., -1])  # below the sparsest point / above the top
    for j in range(xs.shape[-1] - 1):
        x0, x1, y0, y1 = xs[..., j], xs[..., j + 1], ys[..., j], ys[..., j + 1]
        with np.errstate(divide="ignore", invalid="ignore"):
            inside = (ctl_x >= x0) & (ctl_x <= x1)
            y_at = np.where(x1 > x0, y0 + (ctl_x - x0) / (x1 - x0) * (y1 - y0), np.maximum(y0, y1))
            gain = np.where(inside & np.isnan(gain), ctl_al - y_at, gain)
            rising = (ctl_al > y0) & (ctl_al <= y1)
            x_cross = np.where(y1 > y0, x0 + (ctl_al - y0) / (y1 - y0) * (x1 - x0), x0)
            x_at = np.where(rising, x_cross, x_at)
    with np.errstate(divide="ignore", invalid="ignore"):
        reduction = np.where(x_at > 0, 1.0 - ctl_x / x_at, np.where(ctl_x > 0, -1.0, 0.0))
    return np.stack([gain, np.clip(reduction, -1.0, 1.0)], axis=-1)


def _stack(controller: PolicyTotals, curve: Sequence[PolicyTotals]) -> tuple[np.ndarray, np.ndarray]:
    n = len(controller.al)
    if not curve:
        raise ValueError("the periodic curve needs at least one point")
    for policy in curve:
        if len(policy.al) != n:
            raise ValueError(f"{policy.label}: {len(policy.al)} requests, the controller has {n} (pair them)")
    ctl = np.stack([controller.al, controller.refreshes, controller.committed])
    points = np.stack([np.stack([p.al, p.refreshes, p.committed]) for p in curve])
    return ctl, points


def curve_gap_ci(
    controller: PolicyTotals,
    curve: Sequence[PolicyTotals],
    *,
    n_resamples: int = 4999,
    confidence: float = 0.95,
    seed: int = 0,
) -> CurveGap:
    """Both readings of the controller's gap to the periodic curve, with paired-bootstrap (BCa) CIs.

    ``curve``: RIFT-stat and the periodic Δs, each over the controller's requests in the same order."""
    ctl, points = _stack(controller, curve)
    n = ctl.shape[-1]

    def statistic(index: np.ndarray) -> np.ndarray:  # index: (B, m) rows of requests -> (B, 2)
        return _readings(np.moveaxis(ctl[:, index], 0, 1), np.moveaxis(points[:, :, index], 2, 0))

    intervals, spread = paired_bootstrap(statistic, n, n_resamples=n_resamples, confidence=confidence, seed=seed)
    full = _readings(ctl, points)
    xs = 1000.0 * points[:, 1].sum(axis=-1) / points[:, 2].sum(axis=-1)
    ctl_x = 1000.0 * ctl[1].sum() / ctl[2].sum()
    top = float(np.max(points[:, 0].mean(axis=-1)))
    return CurveGap(
        controller=CurvePoint(controller.label, float(ctl_x), float(ctl[0].mean())),
        curve=sorted(
            (CurvePoint(p.label, float(x), float(np.mean(p.al))) for p, x in zip(curve, xs, strict=True)),
            key=lambda point: point.refreshes_per_1k,
        ),
        al_gain=intervals[0],
        refresh_reduction=intervals[1],
        al_gain_se=float(spread[0]),
        n_requests=n,
        controller_beyond_densest=bool(not math.isfinite(full[0])),
        curve_below_controller=bool(ctl[0].mean() > top),
    )


def curve_intervals(rate_per_1k: float, longest: int, *, shortest: int = 8, per_side: int = 2) -> list[int]:
    """Periodic intervals bracketing a refresh rate: ``per_side`` denser and sparser ones from the doubling
    ladder ``shortest``, 2 x ``shortest``, ... up to ``longest`` (plus ``longest`` itself), more on one side
    when the other runs out, so that 2 x ``per_side`` intervals run whenever the ladder has them."""
    ladder = []
    step = shortest
    while step < longest:
        ladder.append(step)
        step *= 2
    ladder.append(longest)
    matched = 1000.0 / rate_per_1k if rate_per_1k > 0 else float("inf")
    denser = [d for d in ladder if d <= matched]
    sparser = [d for d in ladder if d > matched]
    take_dense = min(len(denser), max(per_side, 2 * per_side - len(sparser)))
    take_sparse = min(len(sparser), 2 * per_side - take_dense)
    return sorted(denser[len(denser) - take_dense :] + sparser[:take_sparse])


@dataclass(frozen=True)
class Preregistration:
    """What decides, fixed before the confirmation runs (written into bench.json first)."""

    rule: str
    primary: str
    paper_al_gain: float
    paper_refresh_reduction: float
    confidence: float
    selection_margin: float
    confirmation_requests: int
    curve_policies: list[str]
    interpolation: str
    n_resamples: int
    seed: int
    min_requests: int = MIN_REQUESTS
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


RULE = (
    "Primary reading: the AL gain of the frozen controller over the periodic curve at the controller's refresh count "
    "(closed loop, confirmation requests only), 95% paired-bootstrap BCa CI over requests. confirmed: the CI's lower "
    "end > 0; refuted on this workload: the CI's upper end < the paper's effect; underpowered: neither (the requests "
    "needed are printed), and always underpowered with fewer than 8 confirmation requests. A CI that is both above 0 "
    "and below the paper's effect reads confirmed (smaller than the paper's)."
)


def preregister(
    temperature: float,
    confirmation_requests: int,
    curve_policies: Sequence[str],
    *,
    selection_margin: float,
    n_resamples: int,
    seed: int,
    confidence: float = 0.95,
    extra: Mapping[str, Any] | None = None,
) -> Preregistration:
    """The pre-registration of one cell's confirmation."""
    nearest = min(PAPER_REFRESH_REDUCTION, key=lambda t: abs(t - float(temperature)))
    return Preregistration(
        rule=RULE,
        primary="al_gain_at_matched_refreshes",
        paper_al_gain=PAPER_AL_GAIN,
        paper_refresh_reduction=PAPER_REFRESH_REDUCTION[nearest],
        confidence=float(confidence),
        selection_margin=float(selection_margin),
        confirmation_requests=int(confirmation_requests),
        curve_policies=list(curve_policies),
        interpolation=INTERPOLATION,
        n_resamples=int(n_resamples),
        seed=int(seed),
        extra=dict(extra or {}),
    )


@dataclass(frozen=True)
class Power:
    """From the measured spread: the minimum detectable gap and the requests a decision needs."""

    n_requests: int
    sd_per_request: float  # bootstrap SE x sqrt(n)
    minimum_detectable_gap: float  # at 80% power, two-sided 95%, at this n
    requests_for_paper_effect: int | None  # 80% power to confirm a gap the size of the paper's effect
    requests_to_decide: int | None  # CI narrower than the paper's effect: some outcome other than underpowered

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def power(se: float, n_requests: int, effect: float, confidence: float = 0.95) -> Power:
    z = float(stats.norm.ppf(0.5 + confidence / 2))
    z_power = float(stats.norm.ppf(POWER))
    sd = float(se) * math.sqrt(n_requests)
    mdg = (z + z_power) * float(se)
    if not math.isfinite(sd) or effect <= 0:
        return Power(n_requests, sd, mdg, None, None)
    return Power(
        n_requests=n_requests,
        sd_per_request=sd,
        minimum_detectable_gap=mdg,
        requests_for_paper_effect=max(2, math.ceil(((z + z_power) * sd / effect) ** 2)),
        requests_to_decide=max(2, math.ceil((2 * z * sd / effect) ** 2)),
    )


@dataclass(frozen=True)
class CurveVerdict:
    outcome: str
    text: str
    gap: CurveGap
    power: Power
    preregistration: Preregistration

    @property
    def decided(self) -> bool:
        return self.outcome != "underpowered"

    def to_dict(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "decided": self.decided,
            "text": self.text,
            "gap": self.gap.to_dict(),
            "power": self.power.to_dict(),
            "preregistration": self.preregistration.to_dict(),
        }


def decide(gap: CurveGap, preregistration: Preregistration) -> CurveVerdict:
    """Apply the pre-registered rule to the AL-gain interval: confirmed, refuted on this workload, or underpowered."""
    interval, effect = gap.al_gain, preregistration.paper_al_gain
    need = power(gap.al_gain_se, gap.n_requests, effect, preregistration.confidence)
    ci = f"{interval.estimate:+.3f} AL [{interval.low:+.3f}, {interval.high:+.3f}]"
    reduction = gap.refresh_reduction
    second = (
        f"refresh reduction at matched AL {100 * reduction.estimate:+.1f}% [{100 * reduction.low:+.1f}%, "
        f"{100 * reduction.high:+.1f}%] (paper: {100 * preregistration.paper_refresh_reduction:.1f}%)"
    )
    if gap.curve_below_controller:
        second += ", a lower bound: the periodic curve never reaches the controller's AL"
    too_few = gap.n_requests < preregistration.min_requests
    if too_few and not gap.controller_beyond_densest:
        outcome = "underpowered"
        floor = preregistration.min_requests
        detect, decide_n = max(need.requests_for_paper_effect or 0, floor), max(need.requests_to_decide or 0, floor)
        text = (
            f"**Underpowered.** {gap.n_requests} confirmation requests, fewer than the pre-registered minimum of "
            f"{preregistration.min_requests}: no outcome is decided at this size (AL gain at the controller's refresh "
            f"count {ci}). From this spread (per-request SD {need.sd_per_request:.3f}, itself rough at this size) "
            f"{detect} confirmation requests would detect the paper's effect with 80% power and {decide_n} would "
            "make the CI narrower than it."
        )
    elif gap.controller_beyond_densest or not (math.isfinite(interval.low) and math.isfinite(interval.high)):
        outcome = "underpowered"
        text = (
            "**Underpowered.** The AL gain at matched refreshes is undefined: the controller refreshes more often "
            "than the densest periodic interval run, so the curve does not bracket it."
        )
    elif interval.low > 0:
        outcome = "confirmed"
        size = " (smaller than the paper's)" if interval.high < effect else ""
        text = f"**Confirmed{size}.** AL gain over the periodic curve at the controller's refresh count {ci}."
    elif interval.high < effect:
        outcome = "refuted on this workload"
        text = (
            f"**Refuted on this workload.** AL gain at the controller's refresh count {ci}: the CI's upper end is "
            f"below the paper's +{effect:.3f} AL."
        )
    else:
        outcome = "underpowered"
        text = (
            f"**Underpowered.** AL gain at the controller's refresh count {ci} includes both 0 and the paper's "
            f"+{effect:.3f}. Minimum detectable gap at 80% power with these {gap.n_requests} requests: "
            f"{need.minimum_detectable_gap:.3f} AL (per-request SD {need.sd_per_request:.3f}); "
            f"{need.requests_for_paper_effect} confirmation requests would detect the paper's effect with 80% "
            f"power, {need.requests_to_decide} would make the CI narrower than it (every outcome decides)."
        )
    return CurveVerdict(outcome, f"{text} Also: {second}.", gap, need, preregistration)


def synthetic_requests(
    n: int,
    intervals: Sequence[int],
    gap: float,
    *,
    rng: np.random.Generator,
    output_tokens: int = 512,
    sd: float = 0.3,
) -> tuple[PolicyTotals, list[PolicyTotals]]:
    """Synthetic per-request results whose controller sits ``gap`` AL above a known concave curve.

    A request has its own base AL (shared by its policies, as in a paired run); periodic Δ refreshes
    ``output_tokens // Δ`` times and gains 1.2 x (1 − e^(−x / 20)) AL at x refreshes / 1K; the controller
    refreshes at about the rate of the middle Δ with its own noise of SD ``sd``."""
    base = 6.0 + rng.normal(0.0, 0.6, n)
    committed = np.full(n, float(output_tokens))

    def lift(per_1k: np.ndarray) -> np.ndarray:
        return 1.2 * (1.0 - np.exp(-per_1k / 20.0))

    curve = [PolicyTotals("stat", base + rng.normal(0, sd / 2, n), np.zeros(n), committed)]
    for interval in intervals:
        refreshes = np.full(n, float(output_tokens // interval))
        curve.append(
            PolicyTotals(
                periodic_label(interval),
                base + lift(1000 * refreshes / committed) + rng.normal(0, sd / 2, n),
                refreshes,
                committed,
            )
        )
    middle = sorted(intervals)[len(intervals) // 2]
    refreshes = rng.poisson(output_tokens / middle * 0.7, n).astype(float)
    al = base + lift(1000 * refreshes / committed) + gap + rng.normal(0, sd, n)
    return PolicyTotals("controller", al, refreshes, committed), curve


def population_gap(intervals: Sequence[int], gap: float, *, seed: int = 12345, n: int = 200_000) -> tuple[float, float]:
    """The two readings on a very large synthetic sample: the true values the CIs should cover."""
    controller, curve = synthetic_requests(n, intervals, gap, rng=np.random.default_rng(seed))
    ctl, points = _stack(controller, curve)
    gain, reduction = _readings(ctl, points)
    return float(gain), float(reduction)


def coverage(
    n: int,
    gap: float,
    *,
    intervals: Sequence[int] = (32, 64, 128, 256),
    reps: int = 200,
    n_resamples: int = 999,
    seed: int = 0,
) -> dict[str, float]:
    """Share of ``reps`` synthetic runs of ``n`` requests whose 95% CIs cover the true readings."""
    truth = population_gap(intervals, gap)
    rng = np.random.default_rng(seed)
    hits = np.zeros(2)
    for rep in range(reps):
        controller, curve = synthetic_requests(n, intervals, gap, rng=rng)
        result = curve_gap_ci(controller, curve, n_resamples=n_resamples, seed=seed + rep)
        for k, interval in enumerate((result.al_gain, result.refresh_reduction)):
            hits[k] += interval.low <= truth[k] <= interval.high
    return {
        "n": n,
        "gap": gap,
        "reps": reps,
        "al_gain": hits[0] / reps,
        "refresh_reduction": hits[1] / reps,
        "true_al_gain": truth[0],
        "true_refresh_reduction": truth[1],
    }
