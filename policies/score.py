"""Score policies (the ``score`` kind): replay lanes, search-space suggestion, rendering, and fitting.

score = sum_j weight_j * g_j((signal_j - mean_j) * orientation_j / scale_j); the policy fires when
score >= threshold (the runtime kind :class:`rift_ada.policy_kinds.Score`). g_j is the identity, or
a monotone piecewise-linear map through ``knots`` (clamped outside the first and last knot). A term
whose signal is missing contributes 0.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from rift_ada import policy_kinds
from rift_ada.collectors.probe_traces import ProbeTraces, age_arm
from rift_ada.controller import SIGNAL_NAMES, ControllerError, make_controller_dict
from rift_ada.policies.kernels import score_totals
from rift_ada.policies.kind_tools import KindTools
from rift_ada.policy_kinds import Score

if TYPE_CHECKING:
    from rich.tree import Tree

    from rift_ada.policies.space import SearchSpace, TrialLike

__all__ = ["ScoreLanes", "ScorePolicy", "ScoreTerm", "ScoreTools", "SignalSamples", "counterfactual_samples"]


@dataclasses.dataclass
class ScoreTerm:
    """One signal of a score policy."""

    signal: str
    orientation: int = 1
    mean: float = 0.0
    scale: float = 1.0
    weight: float = 1.0
    knots: list[list[float]] | None = None

    def to_json(self) -> dict[str, Any]:
        term: dict[str, Any] = {
            "signal": self.signal,
            "orientation": int(self.orientation),
            "mean": float(self.mean),
            "scale": float(self.scale),
            "weight": float(self.weight),
        }
        if self.knots is not None:
            term["knots"] = [[float(x), float(y)] for x, y in self.knots]
        return term

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ScoreTerm:
        return cls(
            signal=data["signal"],
            orientation=int(data["orientation"]),
            mean=float(data["mean"]),
            scale=float(data["scale"]),
            weight=float(data["weight"]),
            knots=[list(k) for k in data["knots"]] if "knots" in data else None,
        )


@dataclasses.dataclass
class SignalSamples:
    """Controller signals at the decision points of replayed walks over probe traces, with refresh gains."""

    signals: dict[str, np.ndarray]  # name -> (N,), NaN where unavailable
    gain: np.ndarray  # (N,) mean outcome under age:0 minus under the sample's age, over the horizon
    request: np.ndarray  # (N,) request index
    age: np.ndarray  # (N,) working-set age at the decision
    stride: np.ndarray  # (N,) stride holding the last committed position

    def __len__(self) -> int:
        return len(self.gain)


def _future_means(traces: ProbeTraces, horizon: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean acceptance (``traces.acceptance``) over [n, n + horizon) inside the response, per
    (request, arm, n), and the count."""
    n_req, n_arms, n_pos = traces.outcome.shape
    valid = np.arange(n_pos)[None, None, :] < traces.osl[:, None, None]
    outcome = np.where(valid, np.nan_to_num(traces.acceptance.astype(np.float64), nan=0.0), 0.0)
    zeros = np.zeros((n_req, n_arms, 1))
    sums = np.concatenate([zeros, np.cumsum(outcome, axis=2)], axis=2)
    counts = np.concatenate([zeros, np.cumsum(np.broadcast_to(valid, outcome.shape), axis=2)], axis=2)
    start = np.arange(n_pos + 1)
    stop = np.minimum(start + horizon, n_pos)
    total = np.take(sums, stop, axis=2) - np.take(sums, start, axis=2)
    count = np.take(counts, stop, axis=2) - np.take(counts, start, axis=2)
    with np.errstate(invalid="ignore", divide="ignore"):
        return total / count, count


def counterfactual_samples(
    traces: ProbeTraces,
    *,
    horizon: int = 64,
    min_horizon: int = 16,
    ewma_alpha: float = 0.4,
    ewma_rounds: int = 4,
    seed: int = 0,
) -> SignalSamples:
    """Signals and refresh gains at every decision point of the grids' periodic walks.

    The signals are exactly those a controller sees (replay's signal engine over the walks of
    :func:`rift_ada.policies.walks.walk_controllers`: periodic refresh at each probed age, ages
    interpolated between arms, sampled acceptance at T > 0). The gain of refreshing at a decision
    at position n with working-set age a is the mean outcome over the next ``horizon`` positions
    (at least ``min_horizon`` of them) under ``age:0`` minus the same under age a, interpolated
    linearly between the neighbouring arms as replay does.
    """
    from rift_ada.policies.replay import decision_points
    from rift_ada.policies.walks import walk_controllers

    if age_arm(0) not in traces.arms:
        raise ValueError("traces need an 'age:0' arm to measure refresh gains")
    walks = walk_controllers(traces, ewma_alpha=ewma_alpha, ewma_rounds=ewma_rounds)
    points = decision_points(traces, walks, seed=seed)
    future, future_count = _future_means(traces, horizon)
    grid = traces.age_grid
    grid_arms = np.array([traces.arm_index(age_arm(int(a))) for a in grid])
    age = np.asarray(points.age, dtype=np.int64)
    position = np.asarray(points.position, dtype=np.int64)
    request = np.asarray(points.request, dtype=np.int64)
    lower = np.clip(np.searchsorted(grid, age, side="right") - 1, 0, len(grid) - 1)
    upper = np.minimum(lower + 1, len(grid) - 1)
    span = np.maximum(grid[upper] - grid[lower], 1)
    weight = np.clip((age - grid[lower]) / span, 0.0, 1.0)
    weight = np.where(upper == lower, 0.0, weight)
    fresh = future[request, traces.arm_index(age_arm(0)), position]
    stale = (1.0 - weight) * future[request, grid_arms[lower], position] + weight * future[
        request, grid_arms[upper], position
    ]
    keep = future_count[request, 0, position] >= min_horizon
    d = traces.decision_stride
    return SignalSamples(
        signals={name: np.asarray(points.signals[name])[keep] for name in SIGNAL_NAMES},
        gain=(fresh - stale)[keep],
        request=request[keep],
        age=age[keep],
        stride=((position - 1) // d)[keep],
    )


@dataclasses.dataclass
class ScoreLanes:
    """The numbers of score policies sharing their terms' signals, one column per lane.

    Replay evaluates a batch of such policies (``lanes_per_policy`` lanes each) with one compiled
    loop, :func:`rift_ada.policies.kernels.score_totals`: the controller's sum, term by term. A
    column serves every lane where all policies share it.
    """

    signals: tuple[str, ...]
    params: np.ndarray  # (3 * terms, lanes or 1): mean, orientation / scale, weight per term
    knot_xs: np.ndarray  # (terms, lanes or 1, most knots); knot_counts[j] == 0: term j has none
    knot_ys: np.ndarray
    knot_slopes: np.ndarray
    knot_counts: np.ndarray
    threshold: np.ndarray  # (lanes or 1,)

    @classmethod
    def from_policies(cls, policies: Sequence[Mapping[str, Any]], lanes_per_policy: int) -> ScoreLanes:
        """From validated score policy objects whose terms read the same signals in the same order."""
        terms = [policy["terms"] for policy in policies]
        signals = tuple(term["signal"] for term in terms[0])
        if any(tuple(term["signal"] for term in row) != signals for row in terms):
            raise ValueError("score policies evaluated together must read the same signals in the same order")

        def per_lane(array: np.ndarray) -> np.ndarray:
            """(policies, ...) -> (lanes, ...), or (1, ...) where every policy holds the same numbers."""
            if all(np.array_equal(row, array[0]) for row in array[1:]):
                return array[:1]
            return np.repeat(array, lanes_per_policy, axis=0)

        counts = np.array([len(t.get("knots", ())) for t in terms[0]], dtype=np.int64)
        numbers = np.zeros((len(policies), len(signals), 3))
        knots = np.zeros((3, len(policies), len(signals), max(2, int(counts.max()))))  # xs, ys, slopes
        for p, row in enumerate(terms):
            for j, term in enumerate(row):
                numbers[p, j] = term["mean"], term["orientation"] / term["scale"], term["weight"]
                pairs = term.get("knots", [])
                if len(pairs) != counts[j]:
                    raise ValueError(f"score term {j} ({term['signal']}): policies differ in their number of knots")
                xs, ys = [float(x) for x, _ in pairs], [float(y) for _, y in pairs]
                knots[0, p, j, : len(xs)], knots[1, p, j, : len(ys)] = xs, ys
                knots[2, p, j, : max(0, len(xs) - 1)] = [
                    (ys[i + 1] - ys[i]) / (xs[i + 1] - xs[i]) for i in range(len(xs) - 1)
                ]
        params = np.ascontiguousarray(per_lane(numbers.reshape(len(policies), -1)).T)
        knot_xs, knot_ys, knot_slopes = np.ascontiguousarray(per_lane(knots.swapaxes(0, 1)).transpose(1, 2, 0, 3))
        threshold = per_lane(np.array([float(p["threshold"]) for p in policies]))
        return cls(signals, params, knot_xs, knot_ys, knot_slopes, counts, threshold)

    def keep(self, mask: np.ndarray) -> None:
        """Drop the lanes where ``mask`` is False (columns shared by all lanes stay)."""
        if self.params.shape[1] > 1:
            self.params = np.ascontiguousarray(self.params[:, mask])
        if self.knot_xs.shape[1] > 1:
            self.knot_xs, self.knot_ys, self.knot_slopes = (
                np.ascontiguousarray(a[:, mask]) for a in (self.knot_xs, self.knot_ys, self.knot_slopes)
            )
        if len(self.threshold) > 1:
            self.threshold = self.threshold[mask]

    def totals(self, signals: Mapping[str, np.ndarray], lanes: slice) -> np.ndarray:
        """The score of each lane in ``lanes`` of the ``signals`` arrays (float64, one value per lane)."""
        out = np.empty(lanes.stop - lanes.start)
        score_totals(
            tuple(signals[name] for name in self.signals),
            lanes.start,
            self.params,
            self.knot_xs,
            self.knot_ys,
            self.knot_slopes,
            self.knot_counts,
            out,
        )
        return out

    def fires(self, signals: Mapping[str, np.ndarray], age: np.ndarray, lanes: slice) -> np.ndarray:
        """Whether each lane's score reaches its threshold (``age`` unused: a score reads signals only)."""
        return np.greater_equal(self.totals(signals, lanes), self.threshold)


def _number(value: float) -> str:
    return f"{value:.6g}"


class ScoreTools(KindTools):
    kind = Score
    searched = True

    @staticmethod
    def skeleton(policy: Score) -> tuple:
        return ("score", tuple((t.signal, len(t.knots or ())) for t in policy.terms))

    @staticmethod
    def lanes(policies: Sequence[Score], lanes_per_policy: int) -> ScoreLanes:
        return ScoreLanes.from_policies([policy.to_json() for policy in policies], lanes_per_policy)

    @staticmethod
    def render(policy: Score, tree: Tree) -> None:
        from rich.text import Text

        tree.add(Text.assemble("fires when score >= ", (_number(policy.threshold), "bold")))
        terms = tree.add("score = Σ weight · g(orientation · (signal − mean) / scale)")
        for term in policy.terms:
            sign = "+" if term.orientation > 0 else "−"
            text = Text.assemble(
                (_number(term.weight), "bold"),
                " · ",
                ("g" if term.knots is not None else "", ""),
                f"({sign}({term.signal} − {_number(term.mean)}) / {_number(term.scale)})",
            )
            node = terms.add(text)
            if term.knots is not None:
                node.add("knots " + ", ".join(f"({_number(x)}, {_number(y)})" for x, y in term.knots))

    @staticmethod
    def searchable(space: SearchSpace) -> bool:
        return bool(space.score_terms and space.score_grid)

    @staticmethod
    def suggest(space: SearchSpace, trial: TrialLike) -> dict[str, Any]:
        """The fitted terms with a threshold from the grid of fitted-score percentiles (``score_q``)."""
        q = trial.suggest_int("score_q", 0, len(space.score_grid) - 1)
        return {"kind": "score", "terms": [dict(t) for t in space.score_terms], "threshold": float(space.score_grid[q])}


@dataclasses.dataclass
class ScorePolicy:
    """The fitter of score policies: fire when ``sum_j weight_j * g_j(orientation_j * (signal_j - mean_j) /
    scale_j) >= threshold``; :meth:`fit` learns the terms from probe traces (or signal samples)."""

    terms: list[ScoreTerm] = dataclasses.field(default_factory=lambda: [ScoreTerm("entropy")])
    threshold: float = 0.0

    def __post_init__(self) -> None:
        self.terms = [ScoreTerm.from_json(t) if isinstance(t, Mapping) else t for t in self.terms]
        self.fit_info_: dict[str, Any] = {}
        self.to_kind()

    def to_kind(self) -> Score:
        """The runtime kind (validated: ControllerError naming the field)."""
        terms = [t.to_json() for t in self.terms]
        return Score.from_json({"kind": Score.kind, "terms": terms, "threshold": self.threshold})

    def to_policy_json(self) -> dict[str, Any]:
        """The ``policy`` object of a controller (validated)."""
        return self.to_kind().to_json()

    @classmethod
    def from_policy_json(cls, data: Mapping[str, Any]) -> ScorePolicy:
        """From a ``score`` policy object; ControllerError naming the field when it is not a valid one."""
        policy = policy_kinds.from_json(data)
        if not isinstance(policy, Score):
            raise ControllerError("policy.kind", f"expected {Score.kind!r}, got {policy.kind!r}")
        return cls(terms=[ScoreTerm.from_json(t.to_json()) for t in policy.terms], threshold=policy.threshold)

    def to_controller_dict(self, **identity: Any) -> dict[str, Any]:
        """A validated controller dict of this policy (keyword arguments of ``make_controller_dict``)."""
        return make_controller_dict(self.to_policy_json(), **identity)

    def score_values(self, signals: Mapping[str, Any]) -> np.ndarray:
        """Scores for arrays of signal values (the controller's sum, :class:`ScoreLanes`; NaN = missing)."""
        lanes = ScoreLanes.from_policies([self.to_policy_json()], 1)
        values = {t.signal: np.asarray(signals[t.signal], dtype=np.float64) for t in self.terms}
        shape = np.broadcast_shapes(*(v.shape for v in values.values()))
        flat = {name: np.ascontiguousarray(np.broadcast_to(v, shape)).ravel() for name, v in values.items()}
        return lanes.totals(flat, slice(0, math.prod(shape))).reshape(shape)

    def fit(
        self,
        traces: ProbeTraces | SignalSamples,
        *,
        signals: Sequence[str] | None = None,
        horizon: int = 64,
        threshold: float | None = None,
        threshold_quantile: float = 0.5,
        max_samples: int = 200_000,
        seed: int = 0,
    ) -> ScorePolicy:
        """Fit non-negative weights predicting the gain of refreshing now (NNLS); returns self.

        Each signal is standardised over the samples (``mean``, ``scale`` = std) and oriented by the
        sign of its correlation with the gain; weights come from ``scipy.optimize.nnls`` on the
        centred gain (a free intercept). Knots are not fitted. ``threshold`` defaults to the
        ``threshold_quantile`` of the fitted scores; calibration sweeps it.
        """
        from scipy.optimize import nnls

        samples = (
            traces if isinstance(traces, SignalSamples) else counterfactual_samples(traces, horizon=horizon, seed=seed)
        )
        names = list(signals) if signals is not None else list(SIGNAL_NAMES)
        unknown = [name for name in names if name not in SIGNAL_NAMES]
        if unknown:
            raise ValueError(f"unknown signals {unknown}")
        rng = np.random.default_rng(seed)
        index = np.arange(len(samples))
        if len(index) > max_samples:
            index = np.sort(rng.choice(index, max_samples, replace=False))
        if len(index) < 2:
            raise ValueError("too few samples to fit a score policy")
        gain = samples.gain[index]
        columns, terms, correlations = [], [], {}
        for name in names:
            values = samples.signals[name][index]
            finite = np.isfinite(values)
            if finite.sum() < 2:
                continue
            mean = float(np.mean(values[finite]))
            scale = float(np.std(values[finite]))
            if not scale > 0.0 or not math.isfinite(scale):
                continue
            with np.errstate(invalid="ignore", divide="ignore"):
                corr = float(np.corrcoef(values[finite], gain[finite])[0, 1]) if np.std(gain) > 0 else 0.0
            correlations[name] = corr if math.isfinite(corr) else 0.0
            orientation = -1 if correlations[name] < 0 else 1
            columns.append(np.where(finite, (values - mean) * (orientation / scale), 0.0))
            terms.append(ScoreTerm(name, orientation, mean, scale, 0.0))
        if not terms:
            raise ValueError("no signal varies over the samples; nothing to fit")
        design = np.stack(columns, axis=1)
        centred = gain - gain.mean()
        weights, _ = nnls(design, centred)
        for term, weight in zip(terms, weights, strict=True):
            term.weight = float(weight)
        kept = [t for t in terms if t.weight > 0.0] or terms
        self.terms = kept
        predicted = design @ weights
        residual = float(np.sum((centred - predicted) ** 2))
        total = float(np.sum(centred**2))
        scores = self.score_values({t.signal: samples.signals[t.signal][index] for t in kept})
        self.threshold = float(threshold) if threshold is not None else float(np.quantile(scores, threshold_quantile))
        self.fit_info_ = {
            "n_samples": int(len(index)),
            "r2": 1.0 - residual / total if total > 0 else 0.0,
            "correlations": correlations,
            "weights": {t.signal: t.weight for t in terms},
            "horizon": horizon,
        }
        self.to_kind()
        return self
