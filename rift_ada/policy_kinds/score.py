"""``score``: fire when sum_j weight_j * g_j(orientation_j * (signal_j - mean_j) / scale_j) >= threshold.

g_j is the identity, or a monotone piecewise-linear map through the term's ``knots`` (clamped outside
the first and last knot). A term whose signal is missing contributes 0.
"""

from __future__ import annotations

import numbers
from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from rift_ada.policy_kinds.base import PolicyKind
from rift_ada.validation import (
    SIGNAL_INDEX,
    ControllerError,
    FiresFn,
    _describe,
    _is_bool,
    _join,
    _number,
    _object,
    _signal,
)

__all__ = ["Score", "Term", "knot_transform"]


def knot_transform(knots: Sequence[Sequence[float]]) -> Callable[[float], float]:
    """Monotone piecewise-linear map through ``knots``; constant (clamped) outside the first/last knot.

    Inside segment i (xs[i] <= z < xs[i+1]) the value is ``ys[i] + slopes[i] * (z - xs[i])`` with
    ``slopes[i] = (ys[i+1] - ys[i]) / (xs[i+1] - xs[i])``; replay evaluates the same expression.
    """
    xs = [float(x) for x, _ in knots]
    ys = [float(y) for _, y in knots]
    slopes = [(ys[i + 1] - ys[i]) / (xs[i + 1] - xs[i]) for i in range(len(xs) - 1)]
    x_first, x_last, y_first, y_last = xs[0], xs[-1], ys[0], ys[-1]

    def transform(z: float) -> float:
        if z <= x_first:
            return y_first
        if z >= x_last:
            return y_last
        if z != z:
            return z
        i = bisect_right(xs, z) - 1
        return ys[i] + slopes[i] * (z - xs[i])

    return transform


def _knots(value: Any, path: str) -> tuple[tuple[float, float], ...]:
    if not isinstance(value, (list, tuple)):
        raise ControllerError(path, f"expected a list of [x, y] pairs, got {_describe(value)}")
    if len(value) < 2:
        raise ControllerError(path, "needs at least 2 knots")
    knots: list[tuple[float, float]] = []
    for index, pair in enumerate(value):
        item_path = f"{path}[{index}]"
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise ControllerError(item_path, "expected an [x, y] pair")
        x = _number(pair[0], f"{item_path}[0]")
        y = _number(pair[1], f"{item_path}[1]")
        if knots and x <= knots[-1][0]:
            raise ControllerError(f"{item_path}[0]", "knot x values must be strictly increasing")
        if knots and y < knots[-1][1]:
            raise ControllerError(f"{item_path}[1]", "knot y values must be non-decreasing (monotone)")
        knots.append((x, y))
    return tuple(knots)


@dataclass(frozen=True)
class Term:
    """One oriented, standardised signal of a score (``knots``: the optional monotone map g)."""

    signal: str
    orientation: int
    mean: float
    scale: float
    weight: float
    knots: tuple[tuple[float, float], ...] | None = None

    @classmethod
    def from_json(cls, value: Any, path: str) -> Term:
        obj = _object(value, path, ("signal", "orientation", "mean", "scale", "weight"), ("knots",))
        orientation = obj["orientation"]
        if _is_bool(orientation) or not isinstance(orientation, numbers.Real) or orientation not in (1, -1):
            raise ControllerError(_join(path, "orientation"), "must be +1 or -1")
        scale = _number(obj["scale"], _join(path, "scale"))
        if scale <= 0.0:
            raise ControllerError(_join(path, "scale"), f"must be > 0, got {scale}")
        weight = _number(obj["weight"], _join(path, "weight"))
        if weight < 0.0:
            raise ControllerError(_join(path, "weight"), f"must be >= 0, got {weight}")
        signal = _signal(obj["signal"], _join(path, "signal"))
        mean = _number(obj["mean"], _join(path, "mean"))
        knots = _knots(obj["knots"], _join(path, "knots")) if "knots" in obj else None
        return cls(signal, int(orientation), mean, scale, weight, knots)

    def to_json(self) -> dict[str, Any]:
        term: dict[str, Any] = {
            "signal": self.signal,
            "orientation": self.orientation,
            "mean": self.mean,
            "scale": self.scale,
            "weight": self.weight,
        }
        if self.knots is not None:
            term["knots"] = [[x, y] for x, y in self.knots]
        return term


@dataclass(frozen=True)
class Score(PolicyKind):
    """Fire when the weighted sum of the ``terms`` reaches ``threshold``."""

    terms: tuple[Term, ...]
    threshold: float
    kind: ClassVar[str] = "score"

    @classmethod
    def from_json(cls, value: Mapping[str, Any], path: str = "policy") -> Score:
        obj = _object(value, path, ("kind", "terms", "threshold"))
        terms = obj["terms"]
        terms_path = _join(path, "terms")
        if not isinstance(terms, (list, tuple)):
            raise ControllerError(terms_path, f"expected a list of terms, got {_describe(terms)}")
        if not terms:
            raise ControllerError(terms_path, "must not be empty")
        parsed = tuple(Term.from_json(term, f"{terms_path}[{i}]") for i, term in enumerate(terms))
        return cls._checked(parsed, _number(obj["threshold"], _join(path, "threshold")))

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "terms": [term.to_json() for term in self.terms], "threshold": self.threshold}

    def signals(self) -> frozenset[str]:
        return frozenset(term.signal for term in self.terms)

    def compile(self) -> FiresFn:
        terms = []
        for term in self.terms:
            factor = term.orientation / term.scale
            transform = knot_transform(term.knots) if term.knots is not None else None
            terms.append((SIGNAL_INDEX[term.signal], term.mean, factor, term.weight, transform))
        threshold = self.threshold

        def fires(s: list[float], age: int) -> bool:
            total = 0.0
            for index, mean, factor, weight, transform in terms:
                value = s[index]
                if value != value:  # missing signal: the term contributes 0
                    continue
                z = (value - mean) * factor
                if transform is not None:
                    z = transform(z)
                total += weight * z
            return total >= threshold

        return fires
