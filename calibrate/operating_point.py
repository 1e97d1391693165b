"""Pick the operating point on the AL-refresh trade-off: matched AL and matched refreshes, or the curve gap."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np


@dataclass(frozen=True)
class TrialPoint:
    """One evaluated policy: a study trial or a baseline, with its replay objectives."""

    number: int
    label: str
    family: str
    policy: dict[str, Any]
    params: dict[str, Any]
    al: float
    refreshes_per_1k: float
    baseline: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "label": self.label,
            "family": self.family,
            "baseline": self.baseline,
            "params": self.params,
            "policy": self.policy,
            "mean_al": self.al,
            "refreshes_per_1k": self.refreshes_per_1k,
        }


@dataclass
class OperatingPoint:
    """Outcome of the selection: the chosen trial and the two matched comparisons."""

    reference: TrialPoint
    pareto: list[TrialPoint]
    matched_al: TrialPoint | None
    matched_refreshes: TrialPoint | None
    chosen: TrialPoint
    chosen_by: str
    notes: list[str] = field(default_factory=list)
    selection_gap: dict[str, Any] | None = None  # the chosen point's curve readings on the selection split

    @property
    def refresh_reduction(self) -> float | None:
        """1 - refreshes(matched-AL point) / refreshes(reference), on the selection split."""
        if self.matched_al is None or self.reference.refreshes_per_1k <= 0:
            return None
        return 1.0 - self.matched_al.refreshes_per_1k / self.reference.refreshes_per_1k

    @property
    def al_gain_at_matched_refreshes(self) -> float | None:
        """AL(best trial with refreshes <= reference) - AL(reference), on the selection split."""
        if self.matched_refreshes is None:
            return None
        return self.matched_refreshes.al - self.reference.al

    @property
    def has_gain(self) -> bool:
        """True when some adaptive trial beats the reference at matched AL or matched refreshes."""
        reduction = self.refresh_reduction
        gain = self.al_gain_at_matched_refreshes
        return bool((reduction is not None and reduction > 0) or (gain is not None and gain > 0))

    def to_dict(self) -> dict[str, Any]:
        return {
            "reference": self.reference.to_dict(),
            "pareto_trials": [p.number for p in self.pareto],
            "matched_al": None if self.matched_al is None else self.matched_al.to_dict(),
            "matched_refreshes": None if self.matched_refreshes is None else self.matched_refreshes.to_dict(),
            "refresh_reduction_at_matched_al": self.refresh_reduction,
            "al_gain_at_matched_refreshes": self.al_gain_at_matched_refreshes,
            "has_gain": self.has_gain,
            "chosen": self.chosen.to_dict(),
            "chosen_by": self.chosen_by,
            "notes": list(self.notes),
            "selection_gap": self.selection_gap,
        }


def pareto_front(points: Sequence[TrialPoint]) -> list[TrialPoint]:
    """Points not dominated in (max AL, min refreshes), sorted by refreshes then AL."""
    ordered = sorted(points, key=lambda p: (p.refreshes_per_1k, -p.al, p.number))
    front: list[TrialPoint] = []
    best_al = float("-inf")
    for point in ordered:
        if point.al > best_al:
            front.append(point)
            best_al = point.al
    return front


def select_operating_point(points: Sequence[TrialPoint], reference_label: str) -> OperatingPoint:
    """Matched AL: the Pareto trial with the fewest refreshes whose AL >= the reference baseline's.

    Matched refreshes: the best-AL trial whose refreshes <= the reference's. Only non-baseline
    trials compete. The chosen controller is the matched-AL point when it refreshes less than the
    reference, else the matched-refresh point when it gains AL, else the reference itself (and the
    notes say that no adaptive policy beat it).
    """
    references = [p for p in points if p.baseline and p.label == reference_label]
    if not references:
        raise ValueError(f"reference baseline {reference_label!r} was not evaluated")
    reference = references[0]
    candidates = [p for p in points if not p.baseline]
    front = pareto_front(candidates)
    notes: list[str] = []

    matched_al = next((p for p in front if p.al >= reference.al), None)
    if matched_al is None:
        notes.append(f"no trial reaches the AL of {reference_label} ({reference.al:.4f}): no matched-AL point")

    cheaper = [p for p in candidates if p.refreshes_per_1k <= reference.refreshes_per_1k]
    matched_refreshes = max(cheaper, key=lambda p: (p.al, -p.refreshes_per_1k, -p.number)) if cheaper else None
    if matched_refreshes is None:
        notes.append(f"no trial refreshes at most as often as {reference_label}: no matched-refresh point")
    elif matched_refreshes.al <= reference.al:
        notes.append(
            f"no AL gain at matched refreshes: best trial {matched_refreshes.number} reaches "
            f"{matched_refreshes.al:.4f} vs {reference.al:.4f}"
        )

    if matched_al is not None and matched_al.refreshes_per_1k < reference.refreshes_per_1k:
        chosen, chosen_by = matched_al, "matched_al"
    elif matched_refreshes is not None and matched_refreshes.al > reference.al:
        chosen, chosen_by = matched_refreshes, "matched_refreshes"
    else:
        chosen, chosen_by = reference, "reference_baseline"
        notes.append(f"no gain: no adaptive trial beats {reference_label}; exporting the periodic reference")
    return OperatingPoint(
        reference=reference,
        pareto=front,
        matched_al=matched_al,
        matched_refreshes=matched_refreshes,
        chosen=chosen,
        chosen_by=chosen_by,
        notes=notes,
    )


def curve_readings(point: TrialPoint, curve: Sequence[TrialPoint]) -> tuple[float, float]:
    """(AL gain at the point's refreshes, refresh reduction at its AL) against the periodic ``curve``
    (:mod:`rift_ada.calibrate.curve`'s readings, on aggregate figures)."""
    from rift_ada.calibrate.curve import _readings

    def row(p: TrialPoint) -> np.ndarray:
        return np.array([[p.al], [p.refreshes_per_1k], [1000.0]])

    gain, reduction = _readings(row(point), np.stack([row(p) for p in curve]))
    return float(gain), float(reduction)


def select_by_curve(points: Sequence[TrialPoint], reference_label: str, margin: float) -> OperatingPoint:
    """The adaptive trial with the largest AL gain over the periodic curve at its own refresh count.

    The curve is RIFT-stat and every periodic baseline (selection split). Against the winner's curse:
    trials within ``margin`` AL of the best gain are taken as tied (their differences are below what the
    selection split resolves) and the one refreshing least among them is chosen; the confirmation then
    measures it afresh. Trials refreshing more often than the densest baseline have no reading and are
    skipped. The matched-AL / matched-refresh fields are kept as :func:`select_operating_point` gives them.
    """
    base = select_operating_point(points, reference_label)
    curve = [p for p in points if p.baseline and (p.family == "periodic" or p.label == "stat")]
    readings = []
    for point in points:
        if point.baseline:
            continue
        gain, reduction = curve_readings(point, curve)
        if math.isfinite(gain):
            readings.append((point, gain, reduction))
    if not readings:
        return replace(base, notes=[*base.notes, "no adaptive trial lies inside the periodic curve's range"])
    best = max(gain for _, gain, _ in readings)
    tied = [item for item in readings if item[1] >= best - margin]
    chosen, gain, reduction = min(tied, key=lambda item: (item[0].refreshes_per_1k, -item[1], item[0].number))
    notes = [n for n in base.notes if not n.startswith("no gain:")]
    notes.append(
        f"chosen by the curve gap: trial {chosen.number}, AL gain {gain:+.4f} at its refresh count on the selection "
        f"split (best {best:+.4f}; {len(tied)} trial(s) within the margin {margin:g} AL, the fewest refreshes taken)"
    )
    return replace(
        base,
        chosen=chosen,
        chosen_by="curve_gap",
        notes=notes,
        selection_gap={"al_gain": gain, "refresh_reduction": reduction, "best_al_gain": best, "margin": margin,
                       "n_tied": len(tied)},
    )
